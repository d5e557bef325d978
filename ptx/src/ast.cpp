// SPDX-License-Identifier: Apache-2.0
// Names, sizes and modifier decoding for the PTX AST enums.
#include "phos/ptx/ast.h"

#include <fmt/format.h>

namespace phos::ptx {
namespace {

#define PHOS_PTX_NAME_ENTRY(id, text) text,

constexpr std::string_view kOpcodeNames[] = {"", PHOS_PTX_OPCODES(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kTypeNames[] = {"", PHOS_PTX_TYPES(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kSpaceNames[] = {"", PHOS_PTX_SPACES(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kRoundingNames[] = {"", PHOS_PTX_ROUNDINGS(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kCmpNames[] = {"", PHOS_PTX_CMPOPS(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kBoolNames[] = {"", PHOS_PTX_BOOLOPS(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kAtomNames[] = {"", PHOS_PTX_ATOMOPS(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kCacheNames[] = {"", PHOS_PTX_CACHEOPS(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kSemNames[] = {"", PHOS_PTX_SEMS(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kScopeNames[] = {"", PHOS_PTX_SCOPES(PHOS_PTX_NAME_ENTRY)};
constexpr std::string_view kFlagNames[] = {"", PHOS_PTX_FLAGS(PHOS_PTX_NAME_ENTRY)};

#undef PHOS_PTX_NAME_ENTRY

template <typename E, size_t N>
std::string_view lookup(const std::string_view (&table)[N], E v) {
  auto i = static_cast<size_t>(v);
  return i < N ? table[i] : std::string_view("?");
}

}  // namespace

std::string_view name(Opcode v) { return lookup(kOpcodeNames, v); }
std::string_view name(Type v) { return lookup(kTypeNames, v); }
std::string_view name(StateSpace v) { return lookup(kSpaceNames, v); }
std::string_view name(Rounding v) { return lookup(kRoundingNames, v); }
std::string_view name(CmpOp v) { return lookup(kCmpNames, v); }
std::string_view name(BoolOp v) { return lookup(kBoolNames, v); }
std::string_view name(AtomOp v) { return lookup(kAtomNames, v); }
std::string_view name(CacheOp v) { return lookup(kCacheNames, v); }
std::string_view name(MemSem v) { return lookup(kSemNames, v); }
std::string_view name(Scope v) { return lookup(kScopeNames, v); }
std::string_view name(Flag v) { return lookup(kFlagNames, v); }

std::string_view name(Linkage v) {
  switch (v) {
    case Linkage::kNone: return "";
    case Linkage::kVisible: return "visible";
    case Linkage::kExtern: return "extern";
    case Linkage::kWeak: return "weak";
    case Linkage::kCommon: return "common";
  }
  return "?";
}

std::string_view name(FunctionAttribute::Kind k) {
  using K = FunctionAttribute::Kind;
  switch (k) {
    case K::kMaxNtid: return "maxntid";
    case K::kReqNtid: return "reqntid";
    case K::kMinNctaPerSm: return "minnctapersm";
    case K::kMaxNctaPerSm: return "maxnctapersm";
    case K::kMaxNreg: return "maxnreg";
    case K::kNoReturn: return "noreturn";
    case K::kMaxClusterRank: return "maxclusterrank";
    case K::kReqNctaPerCluster: return "reqnctapercluster";
    case K::kExplicitCluster: return "explicitcluster";
    case K::kBlocksAreClusters: return "blocksareclusters";
  }
  return "?";
}

uint32_t typeSize(Type t) {
  switch (t) {
    case Type::kNone: return 0;
    case Type::kB8: case Type::kU8: case Type::kS8: case Type::kPred:
    case Type::kE4M3: case Type::kE5M2: case Type::kE2M1x2: case Type::kB1:
    case Type::kU4: case Type::kS4:
      return 1;
    case Type::kB16: case Type::kU16: case Type::kS16: case Type::kF16: case Type::kBF16:
    case Type::kE4M3x2: case Type::kE5M2x2: case Type::kE2M3x2: case Type::kE3M2x2:
    case Type::kUE8M0x2:
      return 2;
    case Type::kB32: case Type::kU32: case Type::kS32: case Type::kF32: case Type::kF16x2:
    case Type::kBF16x2: case Type::kTF32: case Type::kU16x2: case Type::kS16x2:
      return 4;
    case Type::kB64: case Type::kU64: case Type::kS64: case Type::kF64: case Type::kF32x2:
      return 8;
    case Type::kB128:
      return 16;
    case Type::kCount: break;
  }
  return 0;
}

bool isFloatType(Type t) {
  switch (t) {
    case Type::kF16: case Type::kF16x2: case Type::kF32: case Type::kF64: case Type::kBF16:
    case Type::kBF16x2: case Type::kTF32: case Type::kE4M3: case Type::kE5M2:
    case Type::kE4M3x2: case Type::kE5M2x2: case Type::kE2M1x2: case Type::kE2M3x2:
    case Type::kE3M2x2: case Type::kUE8M0x2: case Type::kF32x2:
      return true;
    default:
      return false;
  }
}

bool isSignedType(Type t) {
  return t == Type::kS8 || t == Type::kS16 || t == Type::kS32 || t == Type::kS64 ||
         t == Type::kS4 || t == Type::kS16x2;
}

bool isBitType(Type t) {
  return t == Type::kB8 || t == Type::kB16 || t == Type::kB32 || t == Type::kB64 ||
         t == Type::kB128 || t == Type::kB1;
}

std::string modName(const Mod& m) {
  switch (m.kind) {
    case Mod::Kind::kType: return std::string(name(static_cast<Type>(m.value)));
    case Mod::Kind::kSpace: return std::string(name(static_cast<StateSpace>(m.value)));
    case Mod::Kind::kRounding: return std::string(name(static_cast<Rounding>(m.value)));
    case Mod::Kind::kCmp: return std::string(name(static_cast<CmpOp>(m.value)));
    case Mod::Kind::kBool: return std::string(name(static_cast<BoolOp>(m.value)));
    case Mod::Kind::kAtom: return std::string(name(static_cast<AtomOp>(m.value)));
    case Mod::Kind::kVector: return fmt::format("v{}", m.value);
    case Mod::Kind::kCache: return std::string(name(static_cast<CacheOp>(m.value)));
    case Mod::Kind::kSem: return std::string(name(static_cast<MemSem>(m.value)));
    case Mod::Kind::kScope: return std::string(name(static_cast<Scope>(m.value)));
    case Mod::Kind::kFlag: return std::string(name(static_cast<Flag>(m.value)));
  }
  return "?";
}

Modifiers decodeModifiers(Opcode /*op*/, const std::vector<Mod>& mods) {
  Modifiers d;
  for (const Mod& m : mods) {
    switch (m.kind) {
      case Mod::Kind::kType:
        if (d.typeCount < d.types.size()) d.types[d.typeCount++] = static_cast<Type>(m.value);
        break;
      case Mod::Kind::kSpace:
        if (d.space == StateSpace::kNone) {
          d.space = static_cast<StateSpace>(m.value);
        } else {
          d.space2 = static_cast<StateSpace>(m.value);
        }
        break;
      case Mod::Kind::kRounding: d.rounding = static_cast<Rounding>(m.value); break;
      case Mod::Kind::kCmp: d.cmp = static_cast<CmpOp>(m.value); break;
      case Mod::Kind::kBool: d.boolOp = static_cast<BoolOp>(m.value); break;
      case Mod::Kind::kAtom: d.atomOp = static_cast<AtomOp>(m.value); break;
      case Mod::Kind::kVector: d.vectorWidth = static_cast<uint8_t>(m.value); break;
      case Mod::Kind::kCache: d.cacheOp = static_cast<CacheOp>(m.value); break;
      case Mod::Kind::kSem: d.sem = static_cast<MemSem>(m.value); break;
      case Mod::Kind::kScope: d.scope = static_cast<Scope>(m.value); break;
      case Mod::Kind::kFlag:
        if (m.value < d.flags.size()) d.flags.set(m.value);
        break;
    }
  }
  return d;
}

Instruction makeInstruction(Opcode op, std::vector<Mod> mods, std::vector<Operand> operands,
                            Guard guard) {
  Instruction inst;
  inst.guard = std::move(guard);
  inst.opcode = op;
  inst.m = decodeModifiers(op, mods);
  inst.mods = std::move(mods);
  inst.operands = std::move(operands);
  return inst;
}

uint64_t VarDecl::byteSize() const {
  uint64_t n = uint64_t{typeSize(type)} * vectorWidth;
  for (uint64_t d : dims) n *= d;
  return n;
}

const Function* Module::findFunction(std::string_view fname) const {
  for (const ModuleItem& item : items) {
    if (const auto* f = std::get_if<Function>(&item); f && f->name == fname) return f;
  }
  return nullptr;
}

const VarDecl* Module::findVariable(std::string_view vname) const {
  for (const ModuleItem& item : items) {
    if (const auto* v = std::get_if<VarDecl>(&item); v && v->name == vname) return v;
  }
  return nullptr;
}

Function* Module::findFunction(std::string_view fname) {
  for (ModuleItem& item : items) {
    if (auto* f = std::get_if<Function>(&item); f && f->name == fname) return f;
  }
  return nullptr;
}

}  // namespace phos::ptx
