// SPDX-License-Identifier: Apache-2.0
// Pass 1: chooses the functions that need a twin, copies them under the twin name
// and appends the three validator parameters.
#include <string>
#include <unordered_map>
#include <vector>

#include "passes.h"

namespace phos::instrument::passes::clone_twins {
namespace {

using ptx::Function;
using ptx::Instruction;
using ptx::Opcode;
using ptx::OperandKind;

// What the body of one original function needs, before the call graph is
// followed.
struct FunctionFacts {
  bool accesses = false;             // a checked or uncheckable global/generic access
  bool cannotFollowCall = false;     // a call through a pointer or to a bodiless function
  std::vector<std::string> callees;  // called functions that have a body here
};

// Finds names the passes would add; rerunning the generator on its own output, or
// a user name that starts with the prefix, must fail instead of clashing.
Status checkNoReservedNames(const Function& f) {
  if (hasReservedPrefix(f.name) || isTwinName(f.name)) {
    return makeError(Code::kInvalidArgument,
                     "function '{}' (line {}) uses a name reserved for validator twins", f.name,
                     f.line);
  }
  for (const ptx::VarDecl& p : f.params) {
    if (hasReservedPrefix(p.name)) {
      return makeError(Code::kInvalidArgument,
                       "function '{}': parameter '{}' (line {}) "
                       "uses the reserved prefix __phos",
                       f.name, p.name, p.line);
    }
  }
  Status status;
  auto scan = [&](auto& self, const std::vector<ptx::Statement>& body) -> void {
    for (const ptx::Statement& s : body) {
      if (!status.isOk()) return;
      if (const auto* d = std::get_if<ptx::VarDecl>(&s.value); d && hasReservedPrefix(d->name)) {
        status = makeError(Code::kInvalidArgument,
                           "function '{}': '{}' (line {}) uses the "
                           "reserved prefix __phos",
                           f.name, d->name, d->line);
      } else if (const auto* l = std::get_if<ptx::Label>(&s.value);
                 l && hasReservedPrefix(l->name)) {
        status = makeError(Code::kInvalidArgument,
                           "function '{}': label '{}' uses the "
                           "reserved prefix __phos",
                           f.name, l->name);
      } else if (const auto* b = std::get_if<ptx::Block>(&s.value)) {
        self(self, b->statements);
      }
    }
  };
  scan(scan, f.body);
  return status;
}

FunctionFacts factsOf(const Function& f, TwinMode mode,
                      const std::unordered_map<std::string, const Function*>& definitions) {
  FunctionFacts facts;
  forEachInstruction(f.body, [&](const Instruction& inst) {
    if (classifyAccess(inst, mode).cls != Access::Class::kNone) facts.accesses = true;
    if (inst.opcode != Opcode::kCall) return;
    const ptx::Operand* target = callTarget(inst);
    if (!target || target->kind != OperandKind::kSymbol) {
      facts.cannotFollowCall = true;
      return;
    }
    if (definitions.count(target->name)) {
      facts.callees.push_back(target->name);
    } else if (!isKnownSafeExternal(target->name)) {
      facts.cannotFollowCall = true;
    }
  });
  return facts;
}

}  // namespace

Status run(TwinContext& context) {
  const ptx::Module& module = *context.original;
  // Function indices count every function item (declarations too) in source order;
  // definitions win over forward declarations of the same name.
  std::unordered_map<std::string, const Function*> definitions;
  std::vector<std::pair<const Function*, uint32_t>> ordered;
  uint32_t index = 0;
  for (const ptx::ModuleItem& item : module.items) {
    const auto* f = std::get_if<Function>(&item);
    if (!f) continue;
    RETURN_IF_ERROR(checkNoReservedNames(*f));
    if (f->hasBody) {
      definitions[f->name] = f;
      ordered.emplace_back(f, index);
    }
    ++index;
  }

  // A .func needs a twin when it (transitively) checks something or loses track
  // of what it calls; entries always get one.
  std::unordered_map<std::string, FunctionFacts> facts;
  std::unordered_map<std::string, bool> needs;
  for (const auto& [f, i] : ordered) {
    FunctionFacts ff = factsOf(*f, context.options.mode, definitions);
    needs[f->name] = f->isEntry || ff.accesses || ff.cannotFollowCall;
    facts.emplace(f->name, std::move(ff));
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& [f, i] : ordered) {
      if (needs[f->name]) continue;
      for (const std::string& callee : facts[f->name].callees) {
        if (needs[callee]) {
          needs[f->name] = true;
          changed = true;
          break;
        }
      }
    }
  }

  for (const auto& [f, i] : ordered) {
    if (!needs[f->name]) continue;
    TwinFunction t;
    t.original = f;
    t.functionIndex = i;
    t.twin = *f;
    t.twin.name = twinName(f->name, context.suffix);
    t.twin.params.push_back(makeDecl(ptx::StateSpace::kParam, kRangesParam, ptx::Type::kU64));
    t.twin.params.push_back(makeDecl(ptx::StateSpace::kParam, kRangeCountParam, ptx::Type::kU32));
    t.twin.params.push_back(makeDecl(ptx::StateSpace::kParam, kReportParam, ptx::Type::kU64));
    if (f->isEntry) {
      ++context.stats.kernels;
    } else {
      ++context.stats.functions;
      context.twinned.insert(f->name);
    }
    context.twins.push_back(std::move(t));
  }
  return Status::ok();
}

}  // namespace phos::instrument::passes::clone_twins
