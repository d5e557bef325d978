// SPDX-License-Identifier: Apache-2.0
// Pass 2: puts a range check in front of every global (or generic) store, atomic and
// reduction of each twin, and of every load in restore mode.
#include <string>
#include <utility>
#include <vector>

#include "passes.h"
#include "phos/ptx/resolve.h"

namespace phos::instrument::passes {

namespace {

using ptx::Flag;
using ptx::Instruction;
using ptx::Mod;
using ptx::Opcode;
using ptx::Operand;
using ptx::OperandKind;
using ptx::StateSpace;

enum class Space { kOther, kGlobal, kGeneric };

Space spaceOf(StateSpace s) {
  if (s == StateSpace::kNone) return Space::kGeneric;
  if (s == StateSpace::kGlobal) return Space::kGlobal;
  return Space::kOther;
}

Access checked(ViolationKind kind, size_t addressOperand, Space space, uint32_t size) {
  Access a;
  a.cls = Access::Class::kChecked;
  a.kind = kind;
  a.addressOperand = addressOperand;
  a.generic = space == Space::kGeneric;
  a.size = size;
  return a;
}

Access unchecked() {
  Access a;
  a.cls = Access::Class::kUnchecked;
  return a;
}

uint32_t accessBytes(const Instruction& inst) {
  return inst.m.vectorWidth * ptx::typeSize(inst.m.type());
}

bool isAddress(const Instruction& inst, size_t i) {
  return i < inst.operands.size() && inst.operands[i].kind == OperandKind::kAddress;
}

// cp.async{.bulk}: the first space written is the destination, the second the
// source ("cp.async.ca.shared.global [dst], [src], cp-size").
Access classifyAsyncCopy(const Instruction& inst, TwinMode mode) {
  Space dst = spaceOf(inst.m.space);
  Space src = spaceOf(inst.m.space2);
  bool writesGlobal = dst == Space::kGlobal;
  bool readsGlobal = src == Space::kGlobal && mode == TwinMode::kRestore;
  if (!writesGlobal && !readsGlobal) return {};
  if (inst.m.has(Flag::kAsync) && isAddress(inst, 0) && isAddress(inst, 1) &&
      inst.operands.size() >= 3 &&
      (inst.operands[2].kind == OperandKind::kImmInt ||
       inst.operands[2].kind == OperandKind::kRegister) &&
      !(writesGlobal && readsGlobal)) {
    Access a = writesGlobal ? checked(ViolationKind::kStore, 0, Space::kGlobal, 0)
                            : checked(ViolationKind::kLoad, 1, Space::kGlobal, 0);
    if (inst.operands[2].kind == OperandKind::kImmInt) {
      a.size = static_cast<uint32_t>(inst.operands[2].value);
    } else {
      a.sizeOperand = 2;
    }
    return a;
  }
  return unchecked();
}

// wmma.load.{a,b,c} / wmma.store.d: the fragment's matrix shape, by the shape
// flag and the fragment (a: m x k, b: k x n, c and d: m x n). Other shapes
// (sub-byte, tf32, f64) are left unchecked.
Access classifyMatrixAccess(const Instruction& inst, TwinMode mode) {
  Space s = spaceOf(inst.m.space);
  bool store = inst.m.has(Flag::kStore);
  bool load = inst.m.has(Flag::kLoad);
  if (s == Space::kOther || (!store && !load)) return {};
  if (load && mode != TwinMode::kRestore) return {};
  uint32_t m = 0, n = 0, k = 0;
  if (inst.m.has(Flag::kM16n16k16)) {
    m = 16, n = 16, k = 16;
  } else if (inst.m.has(Flag::kM8n32k16)) {
    m = 8, n = 32, k = 16;
  } else if (inst.m.has(Flag::kM32n8k16)) {
    m = 32, n = 8, k = 16;
  }
  uint32_t rows = 0, cols = 0;
  if (inst.m.has(Flag::kA)) {
    rows = m, cols = k;
  } else if (inst.m.has(Flag::kB)) {
    rows = k, cols = n;
  } else if (inst.m.has(Flag::kC) || inst.m.has(Flag::kD)) {
    rows = m, cols = n;
  }
  uint32_t element = ptx::typeSize(inst.m.type());
  size_t address = store ? 0 : 1;
  bool rowMajor = inst.m.has(Flag::kRow);
  if (rows == 0 || element == 0 || element > 4 || (!rowMajor && !inst.m.has(Flag::kCol)) ||
      !isAddress(inst, address) || inst.operands.size() < 3 ||
      (inst.operands[2].kind != OperandKind::kImmInt &&
       inst.operands[2].kind != OperandKind::kRegister)) {
    return unchecked();
  }
  Access a = checked(store ? ViolationKind::kStore : ViolationKind::kLoad, address, s, 0);
  a.strideOperand = 2;
  a.major = rowMajor ? rows : cols;
  a.minor = rowMajor ? cols : rows;
  a.elementBytes = element;
  return a;
}

}  // namespace

Access classifyAccess(const Instruction& inst, TwinMode mode) {
  bool restore = mode == TwinMode::kRestore;
  switch (inst.opcode) {
    case Opcode::kSt: {
      Space s = spaceOf(inst.m.space);
      if (s == Space::kOther) return {};
      if (!isAddress(inst, 0)) return unchecked();
      return checked(ViolationKind::kStore, 0, s, accessBytes(inst));
    }
    case Opcode::kLd:
    case Opcode::kLdu: {
      Space s = spaceOf(inst.m.space);
      if (!restore || s == Space::kOther) return {};
      if (!isAddress(inst, 1)) return unchecked();
      return checked(ViolationKind::kLoad, 1, s, accessBytes(inst));
    }
    case Opcode::kAtom:
    case Opcode::kRed: {
      Space s = spaceOf(inst.m.space);
      if (s == Space::kOther) return {};
      size_t addr = inst.opcode == Opcode::kAtom ? 1 : 0;
      if (!isAddress(inst, addr)) return unchecked();
      return checked(ViolationKind::kAtomic, addr, s, accessBytes(inst));
    }
    case Opcode::kCp:
      return classifyAsyncCopy(inst, mode);
    case Opcode::kWmma:
      return classifyMatrixAccess(inst, mode);
    case Opcode::kMultimem:
    case Opcode::kSust:
    case Opcode::kSured:
    case Opcode::kTensormap:
    case Opcode::kDiscard:
      // Multicast objects, surfaces and tensor maps are not plain address ranges;
      // discard leaves the line undefined, which is as good as a write.
      return unchecked();
    case Opcode::kSuld:
    case Opcode::kTex:
    case Opcode::kTld4:
      return restore ? unchecked() : Access{};
    default:
      return {};
  }
}

namespace check_accesses {
namespace {

// Builds the instructions that check one access, to be placed in front of it.
class SiteBuilder {
 public:
  SiteBuilder(const TwinContext& context, const TwinFunction& twin,
              const ptx::ResolvedFunction& resolved)
      : context_(context), twin_(twin), resolved_(resolved) {}

  // Appends the check of `inst` (instruction `index` of the original) to `out`.
  // Returns false when the access cannot reach global memory at all.
  Result<bool> build(const Instruction& inst, const Access& access, uint32_t index,
                     std::vector<ptx::Statement>& out) {
    const Operand& addr = inst.operands[access.addressOperand];
    uint32_t flags = static_cast<uint32_t>(access.kind);
    uint32_t need = access.kind == ViolationKind::kLoad ? 1u : 2u;
    // An atomic or reduction reads the old value: while restoring, the buffer
    // must already be there as well as writable.
    if (access.kind == ViolationKind::kAtomic && context_.options.mode == TwinMode::kRestore) {
      need = 3;
    }
    flags |= need << kFlagNeedShift;
    const std::string reg(kAddressReg);
    Operand addressArg = Operand::reg(reg);

    if (addr.name.empty()) {
      // [immediate]: an absolute address in the instruction's space.
      emit(out, ptx::makeInstruction(Opcode::kMov, {Mod::of(ptx::Type::kU64)},
                                     {Operand::reg(reg), Operand::imm(addr.value)}));
      flags |= access.generic ? kFlagGeneric : kFlagGlobalSpace;
    } else if (addr.addressIsSymbol) {
      // [variable+offset]: mov gives the address within the variable's own state
      // space, so only .global variables are of interest, as .global addresses.
      ASSIGN_OR_RETURN(StateSpace space, symbolSpace(addr.name, index, inst));
      if (space != StateSpace::kGlobal) return false;
      emit(out, ptx::makeInstruction(Opcode::kMov, {Mod::of(ptx::Type::kU64)},
                                     {Operand::reg(reg), Operand::symbol(addr.name)}));
      addOffset(out, addr.value);
      flags |= kFlagGlobalSpace;
    } else {
      const ptx::VarDecl* decl =
          resolved_.findDecl(addr.name, resolved_.instructions()[index].scope);
      if (!decl) {
        return makeError(Code::kInvalidArgument,
                         "function '{}' line {}: address register "
                         "'{}' is not declared",
                         twin_.original->name, inst.line, addr.name);
      }
      if (ptx::typeSize(decl->type) == 8) {
        if (addr.value == 0) {
          addressArg = Operand::reg(addr.name);  // the base register as it is
        } else {
          emit(out, ptx::makeInstruction(
                        Opcode::kAdd, {Mod::of(ptx::Type::kS64)},
                        {Operand::reg(reg), Operand::reg(addr.name), Operand::imm(addr.value)}));
        }
      } else if (ptx::typeSize(decl->type) == 4) {
        emit(out, ptx::makeInstruction(Opcode::kCvt,
                                       {Mod::of(ptx::Type::kU64), Mod::of(ptx::Type::kU32)},
                                       {Operand::reg(reg), Operand::reg(addr.name)}));
        addOffset(out, addr.value);
      } else {
        return makeError(Code::kInvalidArgument,
                         "function '{}' line {}: address register "
                         "'{}' is neither 32 nor 64 bits wide",
                         twin_.original->name, inst.line, addr.name);
      }
      flags |= access.generic ? kFlagGeneric : kFlagGlobalSpace;
    }

    Operand size = access.sizeOperand >= 0 ? inst.operands[static_cast<size_t>(access.sizeOperand)]
                                           : Operand::imm(access.size);
    if (access.strideOperand >= 0) {
      const Operand& stride = inst.operands[static_cast<size_t>(access.strideOperand)];
      uint32_t lineBytes = (access.major - 1) * access.elementBytes;
      uint32_t lastLine = access.minor * access.elementBytes;
      if (stride.kind == OperandKind::kImmInt) {
        size = Operand::imm(static_cast<int64_t>(stride.value) * lineBytes + lastLine);
      } else {
        emit(out, ptx::makeInstruction(Opcode::kMad, {Mod::of(Flag::kLo), Mod::of(ptx::Type::kU32)},
                                       {Operand::reg(std::string(kSizeReg)), stride,
                                        Operand::imm(lineBytes), Operand::imm(lastLine)}));
        size = Operand::reg(std::string(kSizeReg));
      }
    }
    std::vector<Operand> args = {std::move(addressArg),
                                 size,
                                 Operand::imm(flags),
                                 Operand::imm(index),
                                 Operand::imm(twin_.functionIndex),
                                 Operand::reg(std::string(kRangesReg)),
                                 Operand::reg(std::string(kRangeCountReg)),
                                 Operand::reg(std::string(kReportReg))};
    // A guarded access is checked only when it happens; call.uni promises that all
    // active lanes call, which a guard can break.
    std::vector<Mod> mods;
    if (!inst.guard.present()) mods.push_back(Mod::of(Flag::kUni));
    emit(out, ptx::makeInstruction(
                  Opcode::kCall, std::move(mods),
                  {Operand::symbol(std::string(kCheckFunction)), Operand::list(std::move(args))},
                  inst.guard));
    return true;
  }

 private:
  static void emit(std::vector<ptx::Statement>& out, Instruction inst) {
    out.push_back(ptx::Statement{std::move(inst)});
  }

  void addOffset(std::vector<ptx::Statement>& out, int64_t offset) {
    if (offset == 0) return;
    const std::string reg(kAddressReg);
    emit(out, ptx::makeInstruction(Opcode::kAdd, {Mod::of(ptx::Type::kS64)},
                                   {Operand::reg(reg), Operand::reg(reg), Operand::imm(offset)}));
  }

  Result<StateSpace> symbolSpace(const std::string& name, uint32_t index,
                                 const Instruction& inst) const {
    if (const ptx::VarDecl* d = resolved_.findDecl(name, resolved_.instructions()[index].scope)) {
      return d->space;
    }
    if (const ptx::VarDecl* v = context_.original->findVariable(name)) return v->space;
    return makeError(Code::kInvalidArgument,
                     "function '{}' line {}: address '{}' names no "
                     "variable",
                     twin_.original->name, inst.line, name);
  }

  const TwinContext& context_;
  const TwinFunction& twin_;
  const ptx::ResolvedFunction& resolved_;
};

struct Walker {
  TwinContext& context;
  TwinFunction& twin;
  const ptx::ResolvedFunction& resolved;
  SiteBuilder builder;
  uint32_t index = 0;

  Status rewrite(std::vector<ptx::Statement>& body) {
    std::vector<ptx::Statement> out;
    out.reserve(body.size());
    for (ptx::Statement& s : body) {
      if (auto* block = std::get_if<ptx::Block>(&s.value)) {
        RETURN_IF_ERROR(rewrite(block->statements));
      } else if (auto* inst = std::get_if<Instruction>(&s.value)) {
        RETURN_IF_ERROR(instrument(*inst, out));
        ++index;
      }
      out.push_back(std::move(s));
    }
    body = std::move(out);
    return Status::ok();
  }

  Status instrument(const Instruction& inst, std::vector<ptx::Statement>& out) {
    const auto& flat = resolved.instructions();
    if (index >= flat.size() || flat[index].inst->opcode != inst.opcode) {
      return makeError(Code::kInternal,
                       "function '{}': twin body diverged from the "
                       "original at instruction {}",
                       twin.original->name, index);
    }
    Access access = classifyAccess(inst, context.options.mode);
    if (access.cls == Access::Class::kUnchecked) {
      ++twin.uncheckedAccesses;
      return Status::ok();
    }
    if (access.cls != Access::Class::kChecked) return Status::ok();
    ASSIGN_OR_RETURN(bool emitted, builder.build(inst, access, index, out));
    if (!emitted) return Status::ok();
    context.usesCheckFunction = true;
    if (access.kind == ViolationKind::kLoad) {
      ++context.stats.checkedLoads;
    } else {
      ++context.stats.checkedStores;
    }
    return Status::ok();
  }
};

}  // namespace

Status run(TwinContext& context) {
  for (TwinFunction& twin : context.twins) {
    ASSIGN_OR_RETURN(ptx::ResolvedFunction resolved,
                     ptx::ResolvedFunction::build(*twin.original, context.original));
    Walker walker{context, twin, resolved, SiteBuilder(context, twin, resolved)};
    RETURN_IF_ERROR(walker.rewrite(twin.twin.body));
  }
  return Status::ok();
}

}  // namespace check_accesses
}  // namespace phos::instrument::passes
