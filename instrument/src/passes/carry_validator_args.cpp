// SPDX-License-Identifier: Apache-2.0
// Pass 3: calls inside twins go to the callee's twin with the validator values
// appended; calls that cannot be followed are counted and their kernels listed.
#include <array>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "passes.h"

namespace phos::instrument::passes {

const ptx::Operand* callTarget(const ptx::Instruction& call) {
  size_t i = 0;
  if (i < call.operands.size() && call.operands[i].kind == ptx::OperandKind::kList) ++i;
  return i < call.operands.size() ? &call.operands[i] : nullptr;
}

bool isKnownSafeExternal(std::string_view name) {
  // The CUDA runtime's device-side printf and assert: they write only the printf
  // FIFO and the trap state, never an application allocation.
  static constexpr std::array<std::string_view, 2> kSafe = {"vprintf", "__assertfail"};
  for (std::string_view s : kSafe) {
    if (name == s) return true;
  }
  return false;
}

namespace carry_validator_args {
namespace {

using ptx::Instruction;
using ptx::Operand;
using ptx::OperandKind;

void carry(Instruction& call, std::string_view suffix) {
  size_t target = call.operands[0].kind == OperandKind::kList ? 1 : 0;
  call.operands[target].name = twinName(call.operands[target].name, suffix);
  std::vector<Operand> extra = {Operand::reg(std::string(kRangesReg)),
                                Operand::reg(std::string(kRangeCountReg)),
                                Operand::reg(std::string(kReportReg))};
  size_t args = target + 1;
  if (args < call.operands.size() && call.operands[args].kind == OperandKind::kList) {
    for (Operand& o : extra) call.operands[args].elements.push_back(std::move(o));
  } else {
    call.operands.insert(call.operands.begin() + static_cast<std::ptrdiff_t>(args),
                         Operand::list(std::move(extra)));
  }
}

}  // namespace

Status run(TwinContext& context) {
  std::unordered_set<std::string> defined;
  for (const ptx::ModuleItem& item : context.original->items) {
    if (const auto* f = std::get_if<ptx::Function>(&item); f && f->hasBody) {
      defined.insert(f->name);
    }
  }

  std::unordered_map<std::string, size_t> byOriginal;
  for (size_t i = 0; i < context.twins.size(); ++i) {
    TwinFunction& twin = context.twins[i];
    byOriginal[twin.original->name] = i;
    Status status;
    forEachInstruction(twin.twin.body, [&](Instruction& inst) {
      if (inst.opcode != ptx::Opcode::kCall || !status.isOk()) return;
      const Operand* target = callTarget(inst);
      if (!target) {
        status = makeError(Code::kInvalidArgument,
                           "function '{}' line {}: call without a "
                           "target",
                           twin.original->name, inst.line);
        return;
      }
      if (target->kind != OperandKind::kSymbol) {
        ++twin.uncheckedCalls;  // through a function pointer
        return;
      }
      if (target->name == kCheckFunction) return;
      if (context.twinned.count(target->name)) {
        twin.callees.push_back(target->name);
        carry(inst, context.suffix);
      } else if (!defined.count(target->name) && !isKnownSafeExternal(target->name)) {
        ++twin.uncheckedCalls;  // extern (-rdc) or otherwise bodiless here
      }
      // A defined callee without a twin touches no global memory: it stays as is.
    });
    RETURN_IF_ERROR(status);
    context.stats.uncheckedCalls += twin.uncheckedCalls;
  }

  // A kernel is listed when anything it can reach stays unchecked.
  for (const TwinFunction& twin : context.twins) {
    if (!twin.original->isEntry) continue;
    std::vector<size_t> work = {byOriginal.at(twin.original->name)};
    std::unordered_set<size_t> seen(work.begin(), work.end());
    bool unchecked = false;
    while (!work.empty() && !unchecked) {
      const TwinFunction& t = context.twins[work.back()];
      work.pop_back();
      unchecked = t.uncheckedCalls > 0 || t.uncheckedAccesses > 0;
      for (const std::string& callee : t.callees) {
        size_t c = byOriginal.at(callee);
        if (seen.insert(c).second) work.push_back(c);
      }
    }
    if (unchecked) context.stats.kernelsWithUncheckedCalls.push_back(twin.original->name);
  }
  for (const TwinFunction& twin : context.twins) {
    context.stats.uncheckedAccesses += twin.uncheckedAccesses;
  }
  return Status::ok();
}

}  // namespace carry_validator_args
}  // namespace phos::instrument::passes
