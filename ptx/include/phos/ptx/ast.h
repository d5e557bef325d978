// SPDX-License-Identifier: Apache-2.0
// Typed abstract syntax tree of a PTX module: what the parser builds, the printer
// writes back, the vgpu engine executes and the instrumenter rewrites.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "phos/ptx/spellings.h"

namespace phos::ptx {

// ---------------------------------------------------------------------------
// Enumerations. Each is generated from the one spelling table in spellings.h so
// the parser, the printer and consumers can never disagree on a name. Value 0 is
// always kNone ("not given").
// ---------------------------------------------------------------------------

#define PHOS_PTX_ENUM_ENTRY(id, text) id,

enum class Opcode : uint16_t { kNone, PHOS_PTX_OPCODES(PHOS_PTX_ENUM_ENTRY) kCount };

// Scalar and packed types (.b32, .f16x2, .pred, ...).
enum class Type : uint8_t { kNone, PHOS_PTX_TYPES(PHOS_PTX_ENUM_ENTRY) kCount };

// State spaces (.global, .shared::cta, ...). kNone on a memory instruction means
// generic addressing.
enum class StateSpace : uint8_t { kNone, PHOS_PTX_SPACES(PHOS_PTX_ENUM_ENTRY) kCount };

// Rounding modifiers, floating (.rn) and to-integer (.rni).
enum class Rounding : uint8_t { kNone, PHOS_PTX_ROUNDINGS(PHOS_PTX_ENUM_ENTRY) kCount };

// Comparison operators of setp/set/slct (.lt, .ltu, .lo, .num, ...).
enum class CmpOp : uint8_t { kNone, PHOS_PTX_CMPOPS(PHOS_PTX_ENUM_ENTRY) kCount };

// Boolean combine of setp/set (.and/.or/.xor).
enum class BoolOp : uint8_t { kNone, PHOS_PTX_BOOLOPS(PHOS_PTX_ENUM_ENTRY) kCount };

// Operation of atom/red/redux/multimem (.add, .cas, .exch, ...).
enum class AtomOp : uint8_t { kNone, PHOS_PTX_ATOMOPS(PHOS_PTX_ENUM_ENTRY) kCount };

// Cache operators of ld/st/prefetch (.ca, .cg, .cs, .lu, .cv, .wb, .wt).
enum class CacheOp : uint8_t { kNone, PHOS_PTX_CACHEOPS(PHOS_PTX_ENUM_ENTRY) kCount };

// Memory-ordering semantics (.relaxed, .acquire, .volatile, .weak, ...).
enum class MemSem : uint8_t { kNone, PHOS_PTX_SEMS(PHOS_PTX_ENUM_ENTRY) kCount };

// Memory scopes (.cta, .cluster, .gpu, .sys).
enum class Scope : uint8_t { kNone, PHOS_PTX_SCOPES(PHOS_PTX_ENUM_ENTRY) kCount };

// Every other modifier (.sat, .ftz, .approx, .wide, .lo, .sync, .down, .nc, ...).
enum class Flag : uint16_t { kNone, PHOS_PTX_FLAGS(PHOS_PTX_ENUM_ENTRY) kCount };

#undef PHOS_PTX_ENUM_ENTRY

// .shared in any of its spellings (.shared, .shared::cta, .shared::cluster).
inline bool isSharedSpace(StateSpace s) {
  return s == StateSpace::kShared || s == StateSpace::kSharedCta || s == StateSpace::kSharedCluster;
}
// .param in any of its spellings (.param, .param::entry, .param::func).
inline bool isParamSpace(StateSpace s) {
  return s == StateSpace::kParam || s == StateSpace::kParamEntry || s == StateSpace::kParamFunc;
}

// Spelling without the leading dot ("add", "f16x2", "shared::cta"); "" for kNone.
std::string_view name(Opcode v);
std::string_view name(Type v);
std::string_view name(StateSpace v);
std::string_view name(Rounding v);
std::string_view name(CmpOp v);
std::string_view name(BoolOp v);
std::string_view name(AtomOp v);
std::string_view name(CacheOp v);
std::string_view name(MemSem v);
std::string_view name(Scope v);
std::string_view name(Flag v);

// Size in bytes of one element of `t` (.pred: 1, .f16x2: 4, kNone: 0).
uint32_t typeSize(Type t);
bool isFloatType(Type t);   // f16, f16x2, bf16, bf16x2, tf32, f32, f64, fp8 kinds
bool isSignedType(Type t);  // s8..s64
bool isBitType(Type t);     // b8..b128

// ---------------------------------------------------------------------------
// Instruction modifiers
// ---------------------------------------------------------------------------

// One dotted modifier as written, tagged by what it is. The ordered list of these
// is what the printer writes, so a parsed instruction prints back exactly.
struct Mod {
  enum class Kind : uint8_t {
    kType, kSpace, kRounding, kCmp, kBool, kAtom, kVector, kCache, kSem, kScope, kFlag
  };
  Kind kind = Kind::kFlag;
  uint16_t value = 0;  // the enum of `kind`; for kVector the width (2, 4, 8)

  static Mod of(Type v) { return {Kind::kType, static_cast<uint16_t>(v)}; }
  static Mod of(StateSpace v) { return {Kind::kSpace, static_cast<uint16_t>(v)}; }
  static Mod of(Rounding v) { return {Kind::kRounding, static_cast<uint16_t>(v)}; }
  static Mod of(CmpOp v) { return {Kind::kCmp, static_cast<uint16_t>(v)}; }
  static Mod of(BoolOp v) { return {Kind::kBool, static_cast<uint16_t>(v)}; }
  static Mod of(AtomOp v) { return {Kind::kAtom, static_cast<uint16_t>(v)}; }
  static Mod of(CacheOp v) { return {Kind::kCache, static_cast<uint16_t>(v)}; }
  static Mod of(MemSem v) { return {Kind::kSem, static_cast<uint16_t>(v)}; }
  static Mod of(Scope v) { return {Kind::kScope, static_cast<uint16_t>(v)}; }
  static Mod of(Flag v) { return {Kind::kFlag, static_cast<uint16_t>(v)}; }
  static Mod vector(uint8_t width) { return {Kind::kVector, width}; }

  friend bool operator==(const Mod&, const Mod&) = default;
};

// Spelling of a modifier without the leading dot ("v4", "global", "rn").
std::string modName(const Mod& m);

// The modifiers decoded into fields, for consumers that branch on them. Always
// derived from Instruction::mods by decodeModifiers(); never edited on its own.
struct Modifiers {
  // Types in the order written: one for most instructions; cvt is {dst, src};
  // mma/wmma list up to four.
  std::array<Type, 4> types{};
  uint8_t typeCount = 0;
  StateSpace space = StateSpace::kNone;   // first space written
  StateSpace space2 = StateSpace::kNone;  // second (cp.async.ca.shared.global: global)
  Rounding rounding = Rounding::kNone;
  CmpOp cmp = CmpOp::kNone;
  BoolOp boolOp = BoolOp::kNone;
  AtomOp atomOp = AtomOp::kNone;
  CacheOp cacheOp = CacheOp::kNone;
  MemSem sem = MemSem::kNone;
  Scope scope = Scope::kNone;
  uint8_t vectorWidth = 1;  // .v2 -> 2, .v4 -> 4; 1 when not a vector access
  std::bitset<static_cast<size_t>(Flag::kCount)> flags;

  // The first type written (the operation type of add.s32, the dst of cvt).
  Type type() const { return typeCount ? types[0] : Type::kNone; }
  // The last type written (the source type of cvt and mul.wide's operand type).
  Type lastType() const { return typeCount ? types[typeCount - 1] : Type::kNone; }
  bool has(Flag f) const { return flags.test(static_cast<size_t>(f)); }

  friend bool operator==(const Modifiers&, const Modifiers&) = default;
};

// ---------------------------------------------------------------------------
// Operands
// ---------------------------------------------------------------------------

enum class OperandKind : uint8_t {
  kNone,
  kRegister,  // %r1, %tid.x (name "%tid", component 'x'), !%p1 (negated)
  kImmInt,    // 42, -1, 0xFF; the value as a 64-bit pattern
  kImmFloat,  // 0f3F800000 (32-bit) or 0d3FF0000000000000 / 1.5 (64-bit)
  kSymbol,    // label, variable, function, param name; optional +offset; generic(sym)
  kAddress,   // [base], [base+imm], [imm]: base is a register or a symbol; texture and
              // surface forms ([tex, {x, y}], [tex, sampler, {x}]) list the rest in elements
  kVector,    // {a, b, c, d}: elements may be registers, immediates or sinks
  kList,      // (a, b): the argument/return lists of call
  kPredPair,  // %p|%q: setp's second destination, shfl's lane-valid predicate
  kSink,      // _
};

struct Operand {
  OperandKind kind = OperandKind::kNone;
  // Register or symbol name with its sigil ("%r1", "$L__BB0_2", "param0").
  // For kAddress, the base name ("" for an absolute [imm] address).
  std::string name;
  // kImmInt: the value. kAddress / kSymbol: the byte offset added to the base.
  int64_t value = 0;
  // kImmFloat: the IEEE bits (low 32 bits used when floatWidth is 32).
  uint64_t floatBits = 0;
  uint8_t floatWidth = 0;  // 32 or 64 for kImmFloat
  // kRegister: vector component of a special or vector register: 'x','y','z','w',
  // or 0. (%tid.x, %ntid.y, %v1.z)
  char component = 0;
  bool negated = false;         // kRegister: !%p
  bool addressIsSymbol = false; // kAddress: base is a variable/param, not a register
  bool generic = false;         // kSymbol: generic(sym) in an initializer
  std::vector<Operand> elements;  // kVector / kList / kPredPair

  static Operand reg(std::string n, char comp = 0) {
    Operand o; o.kind = OperandKind::kRegister; o.name = std::move(n); o.component = comp;
    return o;
  }
  static Operand imm(int64_t v) {
    Operand o; o.kind = OperandKind::kImmInt; o.value = v; return o;
  }
  static Operand f32(uint32_t bits) {
    Operand o; o.kind = OperandKind::kImmFloat; o.floatBits = bits; o.floatWidth = 32;
    return o;
  }
  static Operand f64(uint64_t bits) {
    Operand o; o.kind = OperandKind::kImmFloat; o.floatBits = bits; o.floatWidth = 64;
    return o;
  }
  static Operand symbol(std::string n, int64_t offset = 0) {
    Operand o; o.kind = OperandKind::kSymbol; o.name = std::move(n); o.value = offset;
    return o;
  }
  // [%rd1+offset]
  static Operand addrReg(std::string base, int64_t offset = 0) {
    Operand o; o.kind = OperandKind::kAddress; o.name = std::move(base); o.value = offset;
    return o;
  }
  // [param_0+offset], [shared_var]
  static Operand addrSymbol(std::string base, int64_t offset = 0) {
    Operand o = addrReg(std::move(base), offset); o.addressIsSymbol = true; return o;
  }
  static Operand vector(std::vector<Operand> elems) {
    Operand o; o.kind = OperandKind::kVector; o.elements = std::move(elems); return o;
  }
  static Operand list(std::vector<Operand> elems) {
    Operand o; o.kind = OperandKind::kList; o.elements = std::move(elems); return o;
  }
  static Operand sink() { Operand o; o.kind = OperandKind::kSink; return o; }

  friend bool operator==(const Operand&, const Operand&) = default;
};

// @%p or @!%p in front of an instruction. Empty `reg`: unguarded.
struct Guard {
  std::string reg;
  bool negated = false;
  bool present() const { return !reg.empty(); }
  friend bool operator==(const Guard&, const Guard&) = default;
};

struct Instruction {
  Guard guard;
  Opcode opcode = Opcode::kNone;
  std::vector<Mod> mods;  // as written; the source of truth for printing
  Modifiers m;            // decoded from `mods` (see decodeModifiers)
  std::vector<Operand> operands;
  uint32_t line = 0;      // source line, 0 for built instructions; not compared

  friend bool operator==(const Instruction& a, const Instruction& b) {
    return a.guard == b.guard && a.opcode == b.opcode && a.mods == b.mods &&
           a.operands == b.operands;
  }
};

// Derives the decoded fields from the ordered modifier list.
Modifiers decodeModifiers(Opcode op, const std::vector<Mod>& mods);

// Builds an instruction with consistent decoded modifiers (for the instrumenter).
Instruction makeInstruction(Opcode op, std::vector<Mod> mods, std::vector<Operand> operands,
                            Guard guard = {});

// ---------------------------------------------------------------------------
// Declarations
// ---------------------------------------------------------------------------

enum class Linkage : uint8_t { kNone, kVisible, kExtern, kWeak, kCommon };
std::string_view name(Linkage v);

// A variable, parameter or register declaration:
//   .global .align 4 .u32 g_counter;
//   .param .align 8 .b8 k_param_0[24]
//   .reg .b32 %r<12>;          (name "%r", rangeCount 12: %r0..%r11)
//   .global .align 1 .b8 $str[10] = {104, 105, ...};
//   .param .u64 .ptr .global .align 8 p   (kernel pointer-parameter attributes)
//   .global .attribute(.managed) .align 4 .u32 counter;   (a __managed__ variable)
struct VarDecl {
  StateSpace space = StateSpace::kNone;
  Linkage linkage = Linkage::kNone;
  uint32_t align = 0;        // .align N; 0 when not given
  uint8_t vectorWidth = 1;   // .v2 / .v4 declarations
  Type type = Type::kNone;
  std::string name;
  uint32_t rangeCount = 0;   // %r<N>: N > 0 declares name0..name(N-1)
  // Array dimensions; 0 is an unsized dimension ([] in .extern .shared dyn[]).
  std::vector<uint64_t> dims;
  // Scalar immediate/symbol, or kVector (nested for multi-dimensional arrays).
  std::optional<Operand> init;
  // .ptr attributes of a kernel parameter.
  bool isPtr = false;
  StateSpace ptrSpace = StateSpace::kNone;
  uint32_t ptrAlign = 0;
  // .attribute(.managed): a .global variable in unified memory, which the
  // host may use too (cuLibraryGetManaged).
  bool managed = false;
  uint32_t line = 0;  // not compared

  // Total bytes of the declared object (element size x vector x dims); 0 if unsized.
  uint64_t byteSize() const;

  friend bool operator==(const VarDecl& a, const VarDecl& b) {
    return a.space == b.space && a.linkage == b.linkage && a.align == b.align &&
           a.vectorWidth == b.vectorWidth && a.type == b.type && a.name == b.name &&
           a.rangeCount == b.rangeCount && a.dims == b.dims && a.init == b.init &&
           a.isPtr == b.isPtr && a.ptrSpace == b.ptrSpace && a.ptrAlign == b.ptrAlign &&
           a.managed == b.managed;
  }
};

// ---------------------------------------------------------------------------
// Directives that may appear among statements
// ---------------------------------------------------------------------------

// .loc file line column [, function_name sym[+off], inlined_at file line column]
struct LocDirective {
  uint32_t file = 0;
  uint32_t line = 0;
  uint32_t column = 0;
  std::optional<Operand> functionName;  // kSymbol
  struct InlinedAt {
    uint32_t file = 0, line = 0, column = 0;
    friend bool operator==(const InlinedAt&, const InlinedAt&) = default;
  };
  std::optional<InlinedAt> inlinedAt;
  friend bool operator==(const LocDirective&, const LocDirective&) = default;
};

// .pragma "nounroll";  (one or more strings, stored without quotes)
struct PragmaDirective {
  std::vector<std::string> values;
  friend bool operator==(const PragmaDirective&, const PragmaDirective&) = default;
};

// A directive whose semantics nothing in PhOS needs (.callprototype, .branchtargets,
// .calltargets, ...), kept as its text up to and including the ';'.
struct RawDirective {
  std::string text;
  friend bool operator==(const RawDirective&, const RawDirective&) = default;
};

struct Label {
  std::string name;
  friend bool operator==(const Label&, const Label&) = default;
};

// ---------------------------------------------------------------------------
// Statements and functions
// ---------------------------------------------------------------------------

struct Statement;

// { ... }: a nested scope with its own declarations (call sequences, inline asm).
struct Block {
  std::vector<Statement> statements;
  friend bool operator==(const Block&, const Block&);
};

struct Statement {
  std::variant<Instruction, Label, Block, VarDecl, LocDirective, PragmaDirective,
               RawDirective>
      value;
  friend bool operator==(const Statement&, const Statement&) = default;
};

inline bool operator==(const Block& a, const Block& b) { return a.statements == b.statements; }

// Performance-tuning directives of a function: .maxntid 256, 1, 1; .reqntid;
// .minnctapersm; .maxnreg; .noreturn; .maxclusterrank; .reqnctapercluster; ...
struct FunctionAttribute {
  enum class Kind : uint8_t {
    kMaxNtid, kReqNtid, kMinNctaPerSm, kMaxNctaPerSm, kMaxNreg, kNoReturn,
    kMaxClusterRank, kReqNctaPerCluster, kExplicitCluster, kBlocksAreClusters
  };
  Kind kind = Kind::kMaxNtid;
  std::vector<uint32_t> values;
  friend bool operator==(const FunctionAttribute&, const FunctionAttribute&) = default;
};
std::string_view name(FunctionAttribute::Kind k);

// .entry (kernel) or .func (device function); a declaration without body when
// hasBody is false (.extern .func vprintf(...);).
struct Function {
  bool isEntry = false;
  Linkage linkage = Linkage::kNone;
  std::string name;
  std::vector<VarDecl> returnParams;  // .func only
  std::vector<VarDecl> params;
  std::vector<FunctionAttribute> attributes;
  bool hasBody = true;
  std::vector<Statement> body;
  uint32_t line = 0;  // not compared

  friend bool operator==(const Function& a, const Function& b) {
    return a.isEntry == b.isEntry && a.linkage == b.linkage && a.name == b.name &&
           a.returnParams == b.returnParams && a.params == b.params &&
           a.attributes == b.attributes && a.hasBody == b.hasBody && a.body == b.body;
  }
};

// ---------------------------------------------------------------------------
// Module-level items
// ---------------------------------------------------------------------------

// .file 1 "path" [, timestamp, size]
struct FileDirective {
  uint32_t index = 0;
  std::string path;  // unescaped contents of the string
  std::optional<uint64_t> timestamp;
  std::optional<uint64_t> size;
  friend bool operator==(const FileDirective&, const FileDirective&) = default;
};

// .section .debug_info { .b32 2022  .b8 2, 0  .b64 $L__func_begin0  $L__info_string0: }
// Kept as data items: DWARF is opaque to PhOS but must print back validly.
struct SectionItem {
  std::optional<std::string> label;  // "$L__info_string0:" when set; data otherwise
  Type type = Type::kNone;           // .b8 / .b16 / .b32 / .b64
  std::vector<Operand> values;       // kImmInt or kSymbol (with offset)
  friend bool operator==(const SectionItem&, const SectionItem&) = default;
};

struct SectionDirective {
  std::string name;  // ".debug_info"
  std::vector<SectionItem> items;
  friend bool operator==(const SectionDirective&, const SectionDirective&) = default;
};

using ModuleItem =
    std::variant<Function, VarDecl, FileDirective, SectionDirective, PragmaDirective,
                 RawDirective>;

struct Module {
  uint32_t versionMajor = 0;
  uint32_t versionMinor = 0;
  std::vector<std::string> target;  // {"sm_80"} or {"sm_80", "debug"}
  uint32_t addressSize = 64;
  std::vector<ModuleItem> items;    // in source order

  // Lookup helpers; nullptr when absent.
  const Function* findFunction(std::string_view name) const;
  Function* findFunction(std::string_view name);
  // A module-scope variable (.global, .const, .shared, ...) by name.
  const VarDecl* findVariable(std::string_view name) const;

  friend bool operator==(const Module&, const Module&) = default;
};

}  // namespace phos::ptx
