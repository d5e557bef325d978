// SPDX-License-Identifier: Apache-2.0
// Pass 5: assembles the twin module, loaded beside the original: what the twins
// need of the original (per-CTA and per-thread variables, source files, the
// functions they reach), the check function, prototypes of the twin .funcs, then
// the twins themselves.
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "passes.h"
#include "phos/instrument/check_function.h"
#include "phos/ptx/parser.h"

namespace phos::instrument::passes::place_twins {
namespace {

// The check function (phos/instrument/check_function.h), parsed.
Result<ptx::Function> checkFunction() {
  std::string text = ".version 7.0\n.target sm_80\n.address_size 64\n";
  text += kCheckFunctionText;
  ASSIGN_OR_RETURN(ptx::Module m, ptx::parseModule(text, "<phos check function>"));
  for (ptx::ModuleItem& item : m.items) {
    if (auto* f = std::get_if<ptx::Function>(&item)) return std::move(*f);
  }
  return makeError(Code::kInternal, "the check function text defines no function");
}


// Adds the names `operand` refers to: call targets, function addresses,
// variables (also as [address] bases) and those inside lists and vectors.
void collectNames(const ptx::Operand& operand, std::unordered_set<std::string>& names) {
  if (operand.kind == ptx::OperandKind::kSymbol ||
      (operand.kind == ptx::OperandKind::kAddress && operand.addressIsSymbol)) {
    names.insert(operand.name);
  }
  for (const ptx::Operand& e : operand.elements) collectNames(e, names);
}

// Adds every identifier of a directive kept as text: `.calltargets f, g;` names
// functions the twin module must define too.
void collectNames(const ptx::RawDirective& raw, std::unordered_set<std::string>& names) {
  auto isNameChar = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
  };
  std::string current;
  for (char c : raw.text + ' ') {
    if (isNameChar(c)) {
      current += c;
    } else if (!current.empty()) {
      names.insert(current);
      current.clear();
    }
  }
}

void collectNames(const std::vector<ptx::Statement>& body, std::unordered_set<std::string>& names) {
  for (const ptx::Statement& s : body) {
    if (const auto* inst = std::get_if<ptx::Instruction>(&s.value)) {
      for (const ptx::Operand& o : inst->operands) collectNames(o, names);
    } else if (const auto* block = std::get_if<ptx::Block>(&s.value)) {
      collectNames(block->statements, names);
    } else if (const auto* raw = std::get_if<ptx::RawDirective>(&s.value)) {
      collectNames(*raw, names);
    }
  }
}

// The original functions the twins reach, directly or through the original
// functions they reach: calls to .funcs that need no twin, function addresses.
std::unordered_set<std::string> originalsReached(const TwinContext& context) {
  std::unordered_map<std::string, const ptx::Function*> functions;
  for (const ptx::ModuleItem& item : context.original->items) {
    const auto* f = std::get_if<ptx::Function>(&item);
    if (f && (f->hasBody || !functions.count(f->name))) functions[f->name] = f;
  }
  std::unordered_set<std::string> names;
  for (const TwinFunction& t : context.twins) collectNames(t.twin.body, names);
  std::unordered_set<std::string> reached;
  std::vector<std::string> pending(names.begin(), names.end());
  while (!pending.empty()) {
    std::string name = std::move(pending.back());
    pending.pop_back();
    auto it = functions.find(name);
    if (it == functions.end() || !reached.insert(name).second) continue;
    std::unordered_set<std::string> more;
    collectNames(it->second->body, more);
    pending.insert(pending.end(), more.begin(), more.end());
  }
  return reached;
}

// The debug sections stay with the original (they name its variables), so the
// .loc directives of the twin module lose what points into them.
void dropDebugReferences(std::vector<ptx::Statement>& body) {
  for (ptx::Statement& s : body) {
    if (auto* loc = std::get_if<ptx::LocDirective>(&s.value)) {
      loc->functionName.reset();
      loc->inlinedAt.reset();
    } else if (auto* block = std::get_if<ptx::Block>(&s.value)) {
      dropDebugReferences(block->statements);
    }
  }
}

// Whether a module-scope item of the original goes into the twin module
// (functions aside): variables that are per CTA or per thread anyway, and what
// .loc directives and pragmas need. .global and .const variables stay in the
// original, which the twins reach through the address table (share_globals);
// debug sections and .alias directives name what the twin module lacks.
bool keptBeside(const ptx::ModuleItem& item) {
  if (const auto* v = std::get_if<ptx::VarDecl>(&item)) {
    return v->space != ptx::StateSpace::kGlobal && v->space != ptx::StateSpace::kConst;
  }
  return std::holds_alternative<ptx::FileDirective>(item) || std::holds_alternative<ptx::PragmaDirective>(item);
}

}  // namespace

Status run(TwinContext& context) {
  const ptx::Module& original = *context.original;
  ptx::Module& out = context.output;
  out.versionMajor = original.versionMajor;
  out.versionMinor = original.versionMinor;
  // The debug sections stay with the original (they name its variables), and
  // ptxas refuses `.target debug` without them: the twins are not debugged.
  out.target = original.target;
  std::erase(out.target, std::string("debug"));
  out.addressSize = original.addressSize;
  out.items.clear();

  // In source order, so that declarations still come before their uses.
  const std::unordered_set<std::string> reached = originalsReached(context);
  for (const ptx::ModuleItem& item : original.items) {
    if (const auto* f = std::get_if<ptx::Function>(&item)) {
      if (!reached.count(f->name)) continue;
      ptx::Function copy = *f;
      dropDebugReferences(copy.body);
      out.items.emplace_back(std::move(copy));
    } else if (keptBeside(item)) {
      out.items.push_back(item);
    }
  }

  if (context.usesCheckFunction) {
    ASSIGN_OR_RETURN(ptx::Function check, checkFunction());
    out.items.emplace_back(std::move(check));
  }
  for (TwinFunction& t : context.twins) dropDebugReferences(t.twin.body);
  // Twins may call twins defined further down (and themselves): declare them all
  // first, as nvcc does for recursion.
  for (const TwinFunction& t : context.twins) {
    if (t.twin.isEntry) continue;
    ptx::Function prototype = t.twin;
    prototype.hasBody = false;
    prototype.body.clear();
    out.items.emplace_back(std::move(prototype));
  }
  for (TwinFunction& t : context.twins) {
    if (!t.twin.isEntry) out.items.emplace_back(std::move(t.twin));
  }
  for (TwinFunction& t : context.twins) {
    if (t.twin.isEntry) out.items.emplace_back(std::move(t.twin));
  }
  return Status::ok();
}

}  // namespace phos::instrument::passes::place_twins
