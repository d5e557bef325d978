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
#include "phos/ptx/parser.h"

namespace phos::instrument::passes::place_twins {
namespace {

// The range check every instrumented access calls. Arguments: the address, the
// size in bytes, flags (kFlag*), the instruction and function indices for the
// report, then the validator values. A binary search finds the last RangeEntry
// beginning at or before the address; the access is allowed when that entry and
// the entries right after it cover [address, address + size) without a gap and
// all grant the needed access bits. Otherwise the violation is appended to the
// report (ReportHeader then ReportEntry[capacity], see twin.h).
// No linkage directive: the function stays local to the module, so several -rdc
// modules can each carry one.
constexpr std::string_view kCheckFunctionText = R"(
.func __phos_check(
	.param .b64 __phos_check_address,
	.param .b32 __phos_check_size,
	.param .b32 __phos_check_flags,
	.param .b32 __phos_check_instruction,
	.param .b32 __phos_check_function,
	.param .b64 __phos_check_ranges,
	.param .b32 __phos_check_range_count,
	.param .b64 __phos_check_report
)
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<16>;
	.reg .b64 	%rd<16>;

	ld.param.b64 	%rd1, [__phos_check_address];
	ld.param.b32 	%r1, [__phos_check_size];
	ld.param.b32 	%r2, [__phos_check_flags];
	ld.param.b32 	%r3, [__phos_check_instruction];
	ld.param.b32 	%r4, [__phos_check_function];
	ld.param.b64 	%rd2, [__phos_check_ranges];
	ld.param.b32 	%r5, [__phos_check_range_count];
	ld.param.b64 	%rd3, [__phos_check_report];
	and.b32 	%r6, %r2, 256;
	setp.ne.b32 	%p1, %r6, 0;
	@%p1 cvta.global.u64 	%rd1, %rd1;
	and.b32 	%r6, %r2, 512;
	setp.eq.b32 	%p1, %r6, 0;
	@%p1 bra 	$__phos_is_global;
	isspacep.global 	%p2, %rd1;
	@!%p2 bra 	$__phos_done;
$__phos_is_global:
	and.b32 	%r7, %r2, 15;
	shr.u32 	%r8, %r2, 4;
	and.b32 	%r8, %r8, 3;
	cvt.u64.u32 	%rd4, %r1;
	add.s64 	%rd5, %rd1, %rd4;
	cvta.to.global.u64 	%rd6, %rd2;
	mov.b32 	%r9, 0;
	mov.b32 	%r10, %r5;
$__phos_search:
	setp.ge.u32 	%p1, %r9, %r10;
	@%p1 bra 	$__phos_found;
	add.s32 	%r11, %r9, %r10;
	shr.u32 	%r11, %r11, 1;
	mul.wide.u32 	%rd7, %r11, 24;
	add.s64 	%rd8, %rd6, %rd7;
	ld.global.u64 	%rd9, [%rd8];
	setp.gt.u64 	%p1, %rd9, %rd1;
	add.s32 	%r12, %r11, 1;
	selp.b32 	%r10, %r11, %r10, %p1;
	selp.b32 	%r9, %r9, %r12, %p1;
	bra 	$__phos_search;
$__phos_found:
	setp.eq.u32 	%p1, %r9, 0;
	@%p1 bra 	$__phos_violation;
	add.s32 	%r11, %r9, -1;
	mov.b64 	%rd10, %rd1;
$__phos_cover:
	mul.wide.u32 	%rd7, %r11, 24;
	add.s64 	%rd8, %rd6, %rd7;
	ld.global.u64 	%rd9, [%rd8];
	ld.global.u64 	%rd11, [%rd8+8];
	ld.global.u32 	%r13, [%rd8+16];
	setp.gt.u64 	%p1, %rd9, %rd10;
	@%p1 bra 	$__phos_violation;
	setp.le.u64 	%p1, %rd11, %rd10;
	@%p1 bra 	$__phos_violation;
	and.b32 	%r14, %r13, %r8;
	setp.ne.b32 	%p1, %r14, %r8;
	@%p1 bra 	$__phos_violation;
	setp.ge.u64 	%p1, %rd11, %rd5;
	@%p1 bra 	$__phos_done;
	mov.b64 	%rd10, %rd11;
	add.s32 	%r11, %r11, 1;
	setp.ge.u32 	%p1, %r11, %r5;
	@%p1 bra 	$__phos_violation;
	bra 	$__phos_cover;
$__phos_violation:
	cvta.to.global.u64 	%rd12, %rd3;
	atom.global.add.u32 	%r15, [%rd12], 1;
	ld.global.u32 	%r6, [%rd12+4];
	setp.ge.u32 	%p1, %r15, %r6;
	@%p1 bra 	$__phos_done;
	mul.wide.u32 	%rd13, %r15, 24;
	add.s64 	%rd14, %rd12, %rd13;
	st.global.u64 	[%rd14+8], %rd1;
	st.global.u32 	[%rd14+16], %r3;
	st.global.u32 	[%rd14+20], %r7;
	st.global.u32 	[%rd14+24], %r4;
	st.global.u32 	[%rd14+28], %r1;
$__phos_done:
	ret;
}
)";

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
