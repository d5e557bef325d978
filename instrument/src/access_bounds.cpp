// SPDX-License-Identifier: Apache-2.0
// Access bounds (access_bounds.h): the address of each global access as an
// interval over the launch's parameters and dimensions.
//
// The abstract value of a register is an integer interval (exact arithmetic,
// checked against the width of every operation: a result that may wrap is
// unbounded) and where the value may come from: pointer words of the
// parameter buffer, module variables, addresses of the local or shared
// windows, or something opaque (a 64-bit value read from memory). An operand
// is the hull of the definitions of its register that reach it (reaching
// definitions over the kernel's branches), each cut by the condition of the
// branch edge nearest the use that compares the register. A definition that
// reaches itself is unbounded, except a loop's induction variable that only
// grows and is capped where the loop branches back; so is a path from the
// entry with no definition. Where a value comes from is kept per register
// over all its definitions, without regard to order.
#include "phos/instrument/access_bounds.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "passes/passes.h"
#include "phos/ptx/params.h"
#include "phos/ptx/resolve.h"

namespace phos::instrument {
namespace {

using ptx::Instruction;
using ptx::Opcode;
using ptx::Operand;
using ptx::OperandKind;
using ptx::Type;
// Exact arithmetic on 64-bit values and their products (GCC and Clang have it).
__extension__ typedef __int128 Wide;

// A 128-bit interval holds any product of two 64-bit values; beyond
// this, a chain of operations gives up rather than risk overflowing it.
constexpr Wide kLimit = Wide{1} << 100;

// Where a value may come from.
struct Source {
  std::set<uint32_t> words;  // parameter-buffer offsets of the pointer words it derives from
  bool global = false;       // derives from a module variable's address
  bool opaque = false;       // may be an address from somewhere else (memory, unmodelled)
  bool window = false;       // derives from an address of the local or shared window

  bool merge(const Source& o) {  // whether anything changed
    const size_t before = words.size();
    const bool g = global, q = opaque, w = window;
    words.insert(o.words.begin(), o.words.end());
    global |= o.global;
    opaque |= o.opaque;
    window |= o.window;
    return words.size() != before || g != global || q != opaque || w != window;
  }
};

struct Value : Source {
  bool bounded = false;
  Wide lo = 0, hi = 0;  // inclusive, when bounded

  static Value constant(Wide v) {
    Value x;
    x.bounded = true;
    x.lo = x.hi = v;
    return x;
  }
  void unbound() { bounded = false; }
  void take(const Source& o) { merge(o); }  // where `o` comes from, into this
};

// Whether [lo, hi] lies in the range of a `bits`-wide integer of that signedness.
bool fits(Wide lo, Wide hi, uint32_t bits, bool isSigned) {
  const Wide min = isSigned ? -(Wide{1} << (bits - 1)) : 0;
  const Wide max = isSigned ? (Wide{1} << (bits - 1)) - 1 : (Wide{1} << bits) - 1;
  return lo >= min && hi <= max;
}

bool integerType(Type t) {
  const uint32_t size = ptx::typeSize(t);
  return !ptx::isFloatType(t) && t != Type::kPred && size >= 1 && size <= 8;
}

// `v` read as an integer of type `t`: the same bits reinterpreted when the
// interval lies wholly on one side of the sign boundary; unbounded otherwise.
Value as(Value v, Type t) {
  if (!v.bounded) return v;
  if (!integerType(t)) {
    v.unbound();
    return v;
  }
  const uint32_t bits = ptx::typeSize(t) * 8;
  const bool isSigned = ptx::isSignedType(t);
  if (fits(v.lo, v.hi, bits, isSigned)) return v;
  const Wide span = Wide{1} << bits;
  if (isSigned && fits(v.lo, v.hi, bits, false) && v.lo >= span / 2) {
    v.lo -= span;
    v.hi -= span;
  } else if (!isSigned && fits(v.lo, v.hi, bits, true) && v.hi < 0) {
    v.lo += span;
    v.hi += span;
  } else {
    v.unbound();
  }
  return v;
}

// A result of width `bits`: kept when it cannot have wrapped.
Value result(Value v, uint32_t bits) {
  if (bits == 0 || bits > 64) {
    v.unbound();
    return v;
  }
  if (v.bounded && !(fits(v.lo, v.hi, bits, false) || fits(v.lo, v.hi, bits, true))) v.unbound();
  if (v.bounded && (v.lo < -kLimit || v.hi > kLimit)) v.unbound();
  return v;
}

Value hull(const Value& a, const Value& b) {
  Value r;
  r.take(a);
  r.take(b);
  if (a.bounded && b.bounded) {
    r.bounded = true;
    r.lo = std::min(a.lo, b.lo);
    r.hi = std::max(a.hi, b.hi);
  }
  return r;
}

Wide bitCeil(Wide v) {  // the least 2^k - 1 >= v, for v >= 0
  Wide m = 0;
  while (m < v) m = m * 2 + 1;
  return m;
}

enum AccessKind : uint8_t { kRead = 1, kWrite = 2 };

struct MemoryAccess {
  uint32_t at = 0;  // the instruction
  Operand address;
  uint32_t size = 0;
  uint8_t kinds = 0;  // AccessKind bits
};

void addRange(std::vector<Buffer>& ranges, uint64_t begin, uint64_t end) {
  if (begin < end) ranges.push_back({begin, end - begin});
}

void coalesce(std::vector<Buffer>& v) {
  std::sort(v.begin(), v.end(), [](const Buffer& a, const Buffer& b) { return a.base < b.base; });
  std::vector<Buffer> out;
  for (const Buffer& b : v) {
    if (!out.empty() && b.base <= out.back().base + out.back().size) {
      out.back().size = std::max(out.back().base + out.back().size, b.base + b.size) - out.back().base;
    } else {
      out.push_back(b);
    }
  }
  v = std::move(out);
}

// What a conditional branch says on one of its edges: `a cmp b` as `setp`
// compared them right before the branch (`holds`), or its negation.
struct EdgeFact {
  uint32_t setp = 0;
  ptx::CmpOp cmp = ptx::CmpOp::kNone;
  Type type = Type::kNone;
  Operand a, b;
  bool holds = true;
};

// A definition that reaches a use (-1: the entry, none), and the branch
// edge nearest the use that bounds the register on that way (-1: none).
struct ReachingDef {
  int32_t def = -1;
  int32_t fact = -1;
  friend bool operator<(const ReachingDef& x, const ReachingDef& y) {
    return x.def != y.def ? x.def < y.def : x.fact < y.fact;
  }
  friend bool operator==(const ReachingDef&, const ReachingDef&) = default;
};

}  // namespace

struct AccessBounds::Program {
  // Why no read (no write) can be narrowed; empty when some can.
  std::string whyReads, whyWrites;
  // The definitions the addresses depend on, by index in the flattened body
  // (ResolvedFunction's order).
  std::unordered_map<uint32_t, Instruction> definitions;
  // The definitions of register `r` that may reach instruction `i` (-1: a path
  // from the entry with none), for the registers the accesses' addresses use,
  // transitively.
  std::map<std::pair<uint32_t, std::string>, std::vector<ReachingDef>> reaching;
  std::vector<EdgeFact> facts;
  // Where each register's value may come from, over all its definitions.
  std::unordered_map<std::string, Source> sources;
  std::map<std::string, uint32_t, std::less<>> paramOffsets;  // kernel parameter name -> offset
  std::set<std::string, std::less<>> variables;                 // .global/.const variables of the module
  std::set<std::string, std::less<>> windowVariables;           // .local/.shared variables
  std::vector<std::string> globals;                             // of the signature
  std::vector<MemoryAccess> accesses;
};

namespace {

bool isSpecial(const Operand& o) { return ptx::specialRegister(o.name).has_value(); }

// Where in the launch's parameter buffer `ld.param` reads, when it reads one
// scalar of the kernel's own parameters; nullopt for anything else.
std::optional<uint64_t> paramOffset(const Instruction& inst, const AccessBounds::Program& program) {
  if (inst.opcode != Opcode::kLd || !ptx::isParamSpace(inst.m.space) || inst.operands.size() != 2 ||
      inst.m.vectorWidth != 1) {
    return std::nullopt;
  }
  const Operand& a = inst.operands[1];
  auto param = program.paramOffsets.find(a.name);
  if (a.kind != OperandKind::kAddress || !a.addressIsSymbol || param == program.paramOffsets.end() || a.value < 0) {
    return std::nullopt;
  }
  return uint64_t{param->second} + static_cast<uint64_t>(a.value);
}

// The registers (not special ones) an operand reads.
void registersOf(const Operand& o, std::vector<std::string>& out) {
  if (o.kind == OperandKind::kRegister && !isSpecial(o)) out.push_back(o.name);
  if (o.kind == OperandKind::kAddress && !o.addressIsSymbol && !o.name.empty()) out.push_back(o.name);
  if (o.kind == OperandKind::kVector || o.kind == OperandKind::kList) {
    for (const Operand& e : o.elements) registersOf(e, out);
  }
}

// One launch's evaluation: every definition at most once.
class Evaluator {
 public:
  Evaluator(const AccessBounds::Program& program, std::span<const std::byte> params, const LaunchShape& shape)
      : program_(program), params_(params), shape_(shape) {}

  Value address(const MemoryAccess& m) {
    const Operand& op = m.address;
    if (op.kind != OperandKind::kAddress) return opaque();
    Value base;
    if (op.name.empty()) {
      base = Value::constant(0);  // an absolute address: derived from nothing
    } else if (op.addressIsSymbol) {
      base = symbol(op.name);
    } else {
      base = as(use(m.at, op.name), Type::kU64);
    }
    if (base.bounded) {
      base.lo += op.value;
      base.hi += op.value;
    }
    return result(base, 64);
  }

  std::optional<uint64_t> word(uint32_t offset) const {
    if (uint64_t{offset} + 8 > params_.size()) return std::nullopt;
    uint64_t v = 0;
    std::memcpy(&v, params_.data() + offset, 8);
    return v;
  }

 private:
  static Value opaque() {
    Value v;
    v.opaque = true;
    return v;
  }

  Value symbol(std::string_view name) const {
    Value v;
    if (program_.variables.count(name) != 0) {
      v.global = true;
    } else if (program_.windowVariables.count(name) != 0) {
      v.window = true;
    } else {
      v.opaque = true;  // a parameter's address, a function
    }
    return v;
  }

  Value special(const Operand& op) const {
    const int axis = op.component == 'y' ? 1 : op.component == 'z' ? 2 : op.component == 'x' ? 0 : -1;
    auto range = [](Wide lo, Wide hi) {
      Value v = Value::constant(lo);
      v.hi = hi;
      return v;
    };
    if (axis >= 0) {
      if (op.name == "%tid") return range(0, Wide{shape_.block[axis]} - 1);
      if (op.name == "%ntid") return Value::constant(shape_.block[axis]);
      if (op.name == "%ctaid") return range(0, Wide{shape_.grid[axis]} - 1);
      if (op.name == "%nctaid") return Value::constant(shape_.grid[axis]);
    }
    if (op.name == "%laneid") return range(0, 31);
    return Value{};  // a counter, a clock, an id: unbounded, and no address
  }

  // Register `name` as instruction `at` reads it: the hull of the definitions
  // reaching it, with where it may come from over all its definitions.
  Value use(uint32_t at, const std::string& name, int32_t except = -1) {
    Value v;
    // A register asked for again while its value is being found (two
    // registers each capped by a branch that compares it with the other,
    // around a loop: refine asks for one to bound the other), or a chain of
    // such questions deeper than kMaxUses: unbounded, as a definition that
    // depends on itself is. Without this a kernel of the differential
    // tester's (seed 50248) recursed until phosd's worker ran out of stack.
    const auto key = std::pair<uint32_t, std::string>(at, name);
    const bool asked = uses_.size() < kMaxUses && uses_.insert(key).second;
    auto reach = asked ? program_.reaching.find(key) : program_.reaching.end();
    if (asked && reach != program_.reaching.end()) {
      bool first = true;
      for (const ReachingDef& r : reach->second) {
        if (r.def == except && except >= 0) continue;
        Value one = r.def < 0 ? Value{} : definition(static_cast<uint32_t>(r.def));
        if (r.fact >= 0) {
          std::optional<Value> refined = refine(one, name, program_.facts[r.fact]);
          if (!refined) continue;  // no value gets this way
          one = *refined;
        }
        v = first ? one : hull(v, one);
        first = false;
        if (!v.bounded) break;
      }
      if (first) v = Value{};  // no way at all: unbounded rather than empty
    }
    if (asked) uses_.erase(key);
    static_cast<Source&>(v) = {};
    if (auto it = program_.sources.find(name); it != program_.sources.end()) v.take(it->second);
    return v;
  }

  // `v`, the value of register `name`, on an edge where `fact` holds; nullopt
  // when no value of `v` satisfies it. Only bounded values are refined.
  std::optional<Value> refine(Value v, const std::string& name, const EdgeFact& fact) {
    const bool subjectA = fact.a.kind == OperandKind::kRegister && fact.a.name == name;
    const Operand& other = subjectA ? fact.b : fact.a;
    v = as(v, fact.type);
    if (!v.bounded) return v;
    const Value b = operand(fact.setp, other, fact.type);
    if (!b.bounded) return v;
    // The relation of the subject to the other operand, on this edge.
    ptx::CmpOp cmp = fact.cmp;
    switch (cmp) {
      case ptx::CmpOp::kLo: cmp = ptx::CmpOp::kLt; break;
      case ptx::CmpOp::kLs: cmp = ptx::CmpOp::kLe; break;
      case ptx::CmpOp::kHi: cmp = ptx::CmpOp::kGt; break;
      case ptx::CmpOp::kHs: cmp = ptx::CmpOp::kGe; break;
      default: break;
    }
    if (!fact.holds) {
      switch (cmp) {
        case ptx::CmpOp::kLt: cmp = ptx::CmpOp::kGe; break;
        case ptx::CmpOp::kLe: cmp = ptx::CmpOp::kGt; break;
        case ptx::CmpOp::kGt: cmp = ptx::CmpOp::kLe; break;
        case ptx::CmpOp::kGe: cmp = ptx::CmpOp::kLt; break;
        case ptx::CmpOp::kEq: cmp = ptx::CmpOp::kNe; break;
        case ptx::CmpOp::kNe: cmp = ptx::CmpOp::kEq; break;
        default: return v;
      }
    }
    if (!subjectA) {  // b cmp subject, turned around
      switch (cmp) {
        case ptx::CmpOp::kLt: cmp = ptx::CmpOp::kGt; break;
        case ptx::CmpOp::kLe: cmp = ptx::CmpOp::kGe; break;
        case ptx::CmpOp::kGt: cmp = ptx::CmpOp::kLt; break;
        case ptx::CmpOp::kGe: cmp = ptx::CmpOp::kLe; break;
        default: break;
      }
    }
    switch (cmp) {
      case ptx::CmpOp::kLt: v.hi = std::min(v.hi, b.hi - 1); break;
      case ptx::CmpOp::kLe: v.hi = std::min(v.hi, b.hi); break;
      case ptx::CmpOp::kGt: v.lo = std::max(v.lo, b.lo + 1); break;
      case ptx::CmpOp::kGe: v.lo = std::max(v.lo, b.lo); break;
      case ptx::CmpOp::kEq:
        v.lo = std::max(v.lo, b.lo);
        v.hi = std::min(v.hi, b.hi);
        break;
      default: break;
    }
    if (v.lo > v.hi) return std::nullopt;
    return v;
  }

  // `add r, r, step` with step >= 0 (a loop's induction variable), in
  // definition `d`: r starts from its other definitions and only grows, and
  // the branch that loops back bounds it from above. Unbounded unless every
  // way around the loop passes such a branch.
  Value induction(uint32_t d, const Instruction& inst, Type t) {
    const std::string& r = inst.operands[1].name;
    const Value step = operand(d, inst.operands[2], t);
    auto reach = program_.reaching.find(std::pair<uint32_t, std::string>(d, r));
    if (!step.bounded || step.lo < 0 || reach == program_.reaching.end()) return Value{};
    const Value start = as(use(d, r, static_cast<int32_t>(d)), t);
    if (!start.bounded || start.lo < 0) return Value{};
    Wide top = start.hi;
    for (const ReachingDef& rd : reach->second) {
      if (rd.def != static_cast<int32_t>(d)) continue;
      if (rd.fact < 0) return Value{};  // around the loop with no bound
      // Every value around the loop is at least start.lo (no wrap, checked
      // below), so the branch's bound is what caps it.
      const EdgeFact& fact = program_.facts[rd.fact];
      if (!integerType(fact.type)) return Value{};
      const uint32_t width = ptx::typeSize(fact.type) * 8;
      const Wide typeMax = ptx::isSignedType(fact.type) ? (Wide{1} << (width - 1)) - 1 : (Wide{1} << width) - 1;
      if (start.lo > typeMax) return Value{};
      Value around = Value::constant(start.lo);
      around.hi = typeMax;
      std::optional<Value> capped = refine(around, r, fact);
      if (!capped) continue;
      if (!capped->bounded || capped->hi >= typeMax) return Value{};
      top = std::max(top, capped->hi);
    }
    // No value may reach the sign bit of the add's width: past it the same
    // bits compare as negative in a signed test, and the index would not only
    // grow.
    const uint32_t bits = ptx::typeSize(t) * 8;
    if (bits == 0 || bits > 64 || top + step.hi >= (Wide{1} << (bits - 1))) return Value{};
    Value v = Value::constant(start.lo + step.lo);
    v.hi = top + step.hi;
    return result(v, bits);
  }

  Value operand(uint32_t at, const Operand& op, Type t) {
    switch (op.kind) {
      case OperandKind::kImmInt:
        return as(Value::constant(static_cast<Wide>(op.value)), t);
      case OperandKind::kRegister:
        if (isSpecial(op)) return as(special(op), t);
        return as(use(at, op.name), t);
      case OperandKind::kSymbol:
        return symbol(op.name);
      case OperandKind::kVector: {
        Value v;  // packed pieces: no interval
        for (const Operand& e : op.elements) v.take(operand(at, e, Type::kB32));
        return v;
      }
      default:
        return opaque();
    }
  }

  // The value definition `d` gives its destination, over all its executions:
  // unbounded if it depends on itself.
  Value definition(uint32_t d) {
    if (auto it = memo_.find(d); it != memo_.end()) return it->second;
    auto inst = program_.definitions.find(d);
    if (inst == program_.definitions.end() || !active_.insert(d).second) return Value{};
    Value v = define(d, inst->second);
    active_.erase(d);
    memo_.emplace(d, v);
    return v;
  }

  Value define(uint32_t at, const Instruction& inst) {
    const Type t = inst.m.type();
    const uint32_t bits = ptx::typeSize(t) * 8;
    const auto& ops = inst.operands;
    auto arg = [&](size_t i, Type type) { return i < ops.size() ? operand(at, ops[i], type) : opaque(); };
    if (inst.opcode == Opcode::kLd) return load(inst);
    // A vector destination (an unpacking mov, a vector load) is not one
    // value; nor is anything not modelled here.
    if (ops.empty() || ops[0].kind != OperandKind::kRegister) return Value{};
    if (!integerType(t) && inst.opcode != Opcode::kCvt && inst.opcode != Opcode::kCvta) return Value{};
    switch (inst.opcode) {
      case Opcode::kMov:
        return ops.size() == 2 ? as(arg(1, t), t) : Value{};
      case Opcode::kCvta: {
        // Global and generic addresses of global memory are the same numbers.
        if (inst.m.space != ptx::StateSpace::kGlobal || ops.size() != 2) return Value{};
        return as(arg(1, Type::kU64), Type::kU64);
      }
      case Opcode::kCvt: {
        const Type to = inst.m.type(), from = inst.m.lastType();
        if (!integerType(to) || !integerType(from) || ops.size() != 2) return Value{};
        Value v = arg(1, from);
        if (v.bounded && !fits(v.lo, v.hi, ptx::typeSize(to) * 8, ptx::isSignedType(to))) v.unbound();
        return v;
      }
      case Opcode::kAdd:
      case Opcode::kSub: {
        if (inst.m.has(ptx::Flag::kSat) || ops.size() != 3) return Value{};
        if (inst.opcode == Opcode::kAdd && ops[1].kind == OperandKind::kRegister && ops[1].name == ops[0].name &&
            !isSpecial(ops[1])) {
          return induction(at, inst, t);
        }
        Value a = arg(1, t), b = arg(2, t);
        Value r;
        if (a.bounded && b.bounded) {
          r.bounded = true;
          r.lo = inst.opcode == Opcode::kAdd ? a.lo + b.lo : a.lo - b.hi;
          r.hi = inst.opcode == Opcode::kAdd ? a.hi + b.hi : a.hi - b.lo;
        }
        return result(r, bits);
      }
      case Opcode::kMul:
      case Opcode::kMad: {
        const bool wide = inst.m.has(ptx::Flag::kWide);
        if (!(wide || inst.m.has(ptx::Flag::kLo)) || ops.size() != (inst.opcode == Opcode::kMul ? 3u : 4u)) {
          return Value{};
        }
        Value a = arg(1, t), b = arg(2, t);
        Value r;
        if (a.bounded && b.bounded) {
          const Wide c[] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
          r.bounded = true;
          r.lo = *std::min_element(std::begin(c), std::end(c));
          r.hi = *std::max_element(std::begin(c), std::end(c));
        }
        const uint32_t width = wide ? bits * 2 : bits;
        if (inst.opcode == Opcode::kMad) {
          // The addend has the result's width and signedness.
          Type addend = t;
          if (wide) addend = ptx::isSignedType(t) ? (width == 64 ? Type::kS64 : Type::kS32)
                                                  : (width == 64 ? Type::kU64 : Type::kU32);
          Value c = arg(3, addend);
          if (r.bounded && c.bounded) {
            r.lo += c.lo;
            r.hi += c.hi;
          } else {
            r.unbound();
          }
        }
        return result(r, width);
      }
      case Opcode::kShl:
      case Opcode::kShr: {
        if (ops.size() != 3) return Value{};
        Value a = arg(1, t), s = arg(2, Type::kU32);
        Value r;
        if (a.bounded && s.bounded && s.lo == s.hi && s.lo >= 0 && s.lo < bits) {
          const Wide scale = Wide{1} << static_cast<int>(s.lo);
          r.bounded = true;
          if (inst.opcode == Opcode::kShl) {
            r.lo = a.lo * scale;
            r.hi = a.hi * scale;
          } else {
            // Arithmetic (signed) or logical shift: division rounding down.
            auto floorDiv = [&](Wide x) { return x >= 0 ? x / scale : -((-x + scale - 1) / scale); };
            r.lo = floorDiv(a.lo);
            r.hi = floorDiv(a.hi);
          }
        }
        return result(r, bits);
      }
      case Opcode::kAnd:
      case Opcode::kOr:
      case Opcode::kXor:
      case Opcode::kMin:
      case Opcode::kMax:
      case Opcode::kRem:
      case Opcode::kDiv: {
        if (ops.size() != 3) return Value{};
        Value a = arg(1, t), b = arg(2, t);
        Value r;
        if (!a.bounded || !b.bounded) return r;
        const bool nonNegative = a.lo >= 0 && b.lo >= 0;
        r.bounded = true;
        switch (inst.opcode) {
          case Opcode::kAnd:
            r.bounded = nonNegative;
            r.lo = 0;
            r.hi = std::min(a.hi, b.hi);
            break;
          case Opcode::kOr:
          case Opcode::kXor:
            r.bounded = nonNegative;
            r.lo = inst.opcode == Opcode::kOr ? std::max(a.lo, b.lo) : 0;
            r.hi = bitCeil(std::max(a.hi, b.hi));
            break;
          case Opcode::kMin:
            r.lo = std::min(a.lo, b.lo);
            r.hi = std::min(a.hi, b.hi);
            break;
          case Opcode::kMax:
            r.lo = std::max(a.lo, b.lo);
            r.hi = std::max(a.hi, b.hi);
            break;
          case Opcode::kRem:
            r.bounded = a.lo >= 0 && b.lo > 0;
            r.lo = 0;
            r.hi = std::min(a.hi, b.hi - 1);
            break;
          default:  // kDiv
            r.bounded = a.lo >= 0 && b.lo > 0;
            if (r.bounded) {
              r.lo = a.lo / b.hi;
              r.hi = a.hi / b.lo;
            }
            break;
        }
        return result(r, bits);
      }
      case Opcode::kSelp:
        return ops.size() == 4 ? hull(arg(1, t), arg(2, t)) : Value{};
      default:
        return Value{};
    }
  }

  // ld.param of the kernel's own parameter: its value at this launch. Any
  // other load: unbounded.
  Value load(const Instruction& inst) const {
    const Type t = inst.m.type();
    const uint32_t size = ptx::typeSize(t);
    const std::optional<uint64_t> at = paramOffset(inst, program_);
    if (!at || !integerType(t) || *at + size > params_.size()) return Value{};
    uint64_t raw = 0;
    std::memcpy(&raw, params_.data() + *at, size);
    Wide v = raw;
    if (ptx::isSignedType(t) && size < 8 && (raw >> (size * 8 - 1)) != 0) v -= Wide{1} << (size * 8);
    if (ptx::isSignedType(t) && size == 8) v = static_cast<int64_t>(raw);
    return Value::constant(v);
  }

  const AccessBounds::Program& program_;
  std::span<const std::byte> params_;
  LaunchShape shape_;
  std::unordered_map<uint32_t, Value> memo_;
  std::set<uint32_t> active_;
  // The registers use() is finding the value of, by instruction.
  static constexpr size_t kMaxUses = 256;
  std::set<std::pair<uint32_t, std::string>> uses_;
};

// The registers an instruction writes: its first operand (PTX puts every
// destination first), with the elements of a vector or predicate pair.
void destinations(const Instruction& inst, std::vector<std::string>& out) {
  if (inst.operands.empty()) return;
  const Operand& d = inst.operands[0];
  if (d.kind == OperandKind::kRegister) out.push_back(d.name);
  if (d.kind == OperandKind::kVector || d.kind == OperandKind::kPredPair || d.kind == OperandKind::kList) {
    for (const Operand& e : d.elements) {
      if (e.kind == OperandKind::kRegister) out.push_back(e.name);
    }
  }
}

bool modelled(Opcode op) {
  switch (op) {
    case Opcode::kMov: case Opcode::kCvt: case Opcode::kAdd: case Opcode::kSub: case Opcode::kMul:
    case Opcode::kMad: case Opcode::kShl: case Opcode::kShr: case Opcode::kAnd: case Opcode::kOr:
    case Opcode::kXor: case Opcode::kMin: case Opcode::kMax: case Opcode::kRem: case Opcode::kDiv:
    case Opcode::kSelp:
      return true;
    default:
      return false;
  }
}

// Where the destinations of `inst` may come from, given the sources known so
// far: the union of its operands', except for loads (a pointer word of the
// parameters; a wide value from memory is opaque), cvta of the local and
// shared windows, scaled values (below), and operations not modelled with a
// result wide enough to be a pointer.
Source sourceOf(const Instruction& inst, const AccessBounds::Program& program) {
  Source s;
  const Type t = inst.m.type();
  if (inst.opcode == Opcode::kLd) {
    if (const std::optional<uint64_t> at = paramOffset(inst, program)) {
      if (ptx::typeSize(t) == 8 && *at % 8 == 0) s.words.insert(static_cast<uint32_t>(*at));
    } else {
      s.opaque = ptx::typeSize(t) >= 8;  // narrower values are indices at most
    }
    return s;
  }
  if (inst.opcode == Opcode::kCvta && inst.m.space != ptx::StateSpace::kGlobal) {
    const bool window = !inst.m.has(ptx::Flag::kTo) &&
                        (inst.m.space == ptx::StateSpace::kLocal || ptx::isSharedSpace(inst.m.space));
    s.window = window;
    s.opaque = !window;
    return s;
  }
  std::function<void(const Operand&)> add = [&](const Operand& o) {
    if (o.kind == OperandKind::kRegister) {
      if (auto it = program.sources.find(o.name); it != program.sources.end()) s.merge(it->second);
    } else if (o.kind == OperandKind::kSymbol) {
      if (program.variables.count(o.name) != 0) {
        s.global = true;
      } else if (program.windowVariables.count(o.name) != 0) {
        s.window = true;
      } else {
        s.opaque = true;
      }
    } else if (o.kind == OperandKind::kVector) {
      for (const Operand& e : o.elements) add(e);
    }
  };
  // A product, quotient or shift is a scaled index, never an address: an
  // element size times a stride or an index read from memory (an embedding's
  // row number) does not make the address it is added to come from there.
  // mad's addend is the base it is added to.
  size_t first = 1;
  switch (inst.opcode) {
    case Opcode::kMul: case Opcode::kShl: case Opcode::kShr: case Opcode::kDiv: case Opcode::kRem:
      first = inst.operands.size();
      break;
    case Opcode::kMad:
      first = 3;
      break;
    default:
      break;
  }
  for (size_t i = first; i < inst.operands.size(); ++i) add(inst.operands[i]);
  if (inst.opcode != Opcode::kCvta && !modelled(inst.opcode) && ptx::typeSize(t) >= 8) s.opaque = true;
  return s;
}

// Reaching definitions, asked per (instruction, register) by walking the
// branches backwards from the instruction until a definition of the register
// that always executes. On the way, the first conditional branch edge whose
// condition names the register (nearest the use, with no definition of it in
// between) is noted with each definition found beyond it.
class Reaching {
 public:
  Reaching(const std::vector<Instruction>& instructions, const std::vector<ptx::FlatInstruction>& flat,
           std::vector<EdgeFact>& facts)
      : instructions_(instructions), predecessors_(instructions.size()) {
    const size_t n = instructions.size();
    for (size_t i = 0; i < n; ++i) {
      const Instruction& inst = instructions[i];
      const bool guarded = inst.guard.present();
      bool fallsThrough = true;
      if (inst.opcode == Opcode::kBra) {
        const int32_t target = flat[i].target;
        // The condition and its negation, when setp computed it right before.
        int32_t taken = -1, notTaken = -1;
        if (guarded && i > 0 && target != static_cast<int32_t>(i + 1)) {
          const Instruction& setp = instructions[i - 1];
          if (setp.opcode == Opcode::kSetp && !setp.guard.present() && setp.operands.size() == 3 &&
              setp.operands[0].kind == OperandKind::kRegister && setp.operands[0].name == inst.guard.reg &&
              setp.m.boolOp == ptx::BoolOp::kNone && integerType(setp.m.type())) {
            EdgeFact f{static_cast<uint32_t>(i - 1), setp.m.cmp, setp.m.type(), setp.operands[1], setp.operands[2],
                       !inst.guard.negated};
            taken = static_cast<int32_t>(facts.size());
            facts.push_back(f);
            f.holds = !f.holds;
            notTaken = static_cast<int32_t>(facts.size());
            facts.push_back(f);
          }
        }
        if (target >= 0 && static_cast<size_t>(target) < n) {
          predecessors_[target].push_back({static_cast<uint32_t>(i), taken});
        }
        if (guarded && i + 1 < n) predecessors_[i + 1].push_back({static_cast<uint32_t>(i), notTaken});
        fallsThrough = false;
      } else if (inst.opcode == Opcode::kRet || inst.opcode == Opcode::kExit || inst.opcode == Opcode::kTrap) {
        fallsThrough = guarded;
      }
      if (fallsThrough && i + 1 < n) predecessors_[i + 1].push_back({static_cast<uint32_t>(i), -1});
      std::vector<std::string> written;
      destinations(inst, written);
      for (std::string& r : written) defines_[r].push_back(static_cast<uint32_t>(i));
    }
  }

  // The definitions of `reg` reaching instruction `at`, each with the fact
  // bounding it on its way. Counts the instructions it visits in `steps`.
  std::vector<ReachingDef> of(uint32_t at, const std::string& reg, const std::vector<EdgeFact>& facts,
                              size_t& steps) const {
    auto defs = defines_.find(reg);
    if (defs == defines_.end()) return {{-1, -1}};
    auto names = [&](int32_t fact) {
      if (fact < 0) return false;
      const EdgeFact& f = facts[fact];
      return (f.a.kind == OperandKind::kRegister && f.a.name == reg) ||
             (f.b.kind == OperandKind::kRegister && f.b.name == reg);
    };
    std::set<ReachingDef> found;
    std::set<std::pair<uint32_t, int32_t>> seen;
    std::vector<std::pair<uint32_t, int32_t>> stack;  // (instruction, fact so far)
    auto enter = [&](uint32_t i, int32_t fact) {
      for (const auto& [p, edge] : predecessors_[i]) stack.emplace_back(p, fact >= 0 ? fact : names(edge) ? edge : -1);
    };
    if (at == 0) found.insert({-1, -1});
    enter(at, -1);
    while (!stack.empty()) {
      const auto [i, fact] = stack.back();
      stack.pop_back();
      if (!seen.emplace(i, fact).second) continue;
      ++steps;
      if (std::binary_search(defs->second.begin(), defs->second.end(), i)) {
        found.insert({static_cast<int32_t>(i), fact});
        if (!instructions_[i].guard.present()) continue;  // it always writes the register
      }
      if (i == 0) found.insert({-1, fact});
      enter(i, fact);
    }
    return {found.begin(), found.end()};
  }

 private:
  const std::vector<Instruction>& instructions_;
  std::vector<std::vector<std::pair<uint32_t, int32_t>>> predecessors_;  // (instruction, fact of the edge)
  std::unordered_map<std::string, std::vector<uint32_t>> defines_;       // sorted instruction indices
};

// Work the reaching-definitions walk may do for one kernel before it gives up.
constexpr size_t kMaxSteps = size_t{1} << 22;

}  // namespace

AccessBounds::AccessBounds(std::unique_ptr<Program> program) : program_(std::move(program)) {}
AccessBounds::~AccessBounds() = default;

bool AccessBounds::useful() const { return program_->whyReads.empty() || program_->whyWrites.empty(); }

std::string AccessBounds::why() const {
  const Program& p = *program_;
  if (p.whyReads == p.whyWrites) return p.whyReads;
  std::string why;
  if (!p.whyReads.empty()) why = "reads: " + p.whyReads;
  if (!p.whyWrites.empty()) why += (why.empty() ? "writes: " : "; writes: ") + p.whyWrites;
  return why;
}

std::shared_ptr<const AccessBounds> AccessBounds::analyze(const ptx::Module& module, const ptx::Function& kernel,
                                                          const KernelSignature& signature) {
  auto program = std::make_unique<Program>();
  auto done = [&](std::string why) {
    program->whyReads = program->whyWrites = std::move(why);
    program->accesses.clear();
    program->reaching.clear();
    return std::shared_ptr<const AccessBounds>(new AccessBounds(std::move(program)));
  };
  Result<ptx::ResolvedFunction> resolved = ptx::ResolvedFunction::build(kernel, &module);
  if (!resolved.isOk()) return done("the kernel does not resolve: " + resolved.status().message());
  Result<ptx::ParamLayout> layout = ptx::computeParamLayout(kernel);
  if (!layout.isOk()) return done("no parameter layout: " + layout.status().message());
  for (const ptx::ParamInfo& p : layout->params) program->paramOffsets.emplace(p.name, p.offset);
  auto declare = [&](const ptx::VarDecl& v) {
    if (v.space == ptx::StateSpace::kGlobal || v.space == ptx::StateSpace::kConst) program->variables.insert(v.name);
    if (v.space == ptx::StateSpace::kLocal || ptx::isSharedSpace(v.space)) program->windowVariables.insert(v.name);
  };
  for (const ptx::ModuleItem& item : module.items) {
    if (const auto* v = std::get_if<ptx::VarDecl>(&item)) declare(*v);
  }
  for (const ptx::ScopeInfo& scope : resolved->scopes()) {
    for (const ptx::VarDecl* v : scope.decls) declare(*v);
  }
  for (const GlobalUse& g : signature.globals) program->globals.push_back(g.name);

  const auto& flat = resolved->instructions();
  std::vector<Instruction> body;
  for (uint32_t i = 0; i < flat.size(); ++i) {
    const Instruction& inst = *flat[i].inst;
    body.push_back(inst);
    if (inst.opcode == Opcode::kCall) return done("it calls a function");
    if (inst.opcode == Opcode::kBrx) return done("an indirect branch");
    // Restore mode classifies loads as well as stores and atomics.
    const passes::Access access = passes::classifyAccess(inst, TwinMode::kRestore);
    if (access.cls == passes::Access::Class::kUnchecked) {
      const std::string why = "an access the range check cannot describe (" + std::string(ptx::name(inst.opcode)) + ")";
      if (program->whyReads.empty()) program->whyReads = why;
      const bool writes = passes::classifyAccess(inst, TwinMode::kCheckpoint).cls == passes::Access::Class::kUnchecked;
      if (writes && program->whyWrites.empty()) program->whyWrites = why;
    }
    if (access.cls == passes::Access::Class::kChecked) {
      MemoryAccess m;
      m.at = i;
      m.address = inst.operands[access.addressOperand];
      m.kinds = access.kind == ViolationKind::kLoad    ? kRead
                : access.kind == ViolationKind::kStore ? kWrite
                                                       : kRead | kWrite;
      // A size held in a register, or a matrix: unbounded (size 0 marks it).
      m.size = access.sizeOperand < 0 && access.strideOperand < 0 ? access.size : 0;
      program->accesses.push_back(std::move(m));
    }
  }
  if (program->accesses.empty() && program->whyReads.empty() && program->whyWrites.empty()) {
    return done("no global access");
  }

  // Where values come from: sources only grow, within a finite set, so this ends.
  std::vector<std::pair<const Instruction*, std::vector<std::string>>> defining;
  for (const Instruction& inst : body) {
    std::vector<std::string> written;
    destinations(inst, written);
    if (!written.empty()) defining.emplace_back(&inst, std::move(written));
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& [inst, names] : defining) {
      const Source s = sourceOf(*inst, *program);
      for (const std::string& r : names) changed = program->sources[r].merge(s) || changed;
    }
  }

  // Reaching definitions of every register the addresses use, transitively.
  const Reaching reaching(body, flat, program->facts);
  std::vector<std::pair<uint32_t, std::string>> work;
  for (const MemoryAccess& m : program->accesses) {
    std::vector<std::string> regs;
    registersOf(m.address, regs);
    for (std::string& r : regs) work.emplace_back(m.at, std::move(r));
  }
  size_t steps = 0;
  while (!work.empty()) {
    auto [at, reg] = std::move(work.back());
    work.pop_back();
    if (program->reaching.count(std::pair<uint32_t, std::string>(at, reg)) != 0) continue;
    std::vector<ReachingDef> defs = reaching.of(at, reg, program->facts, steps);
    if (steps > kMaxSteps) return done("too large to follow");
    for (const ReachingDef& r : defs) {
      if (r.fact >= 0) {
        // The bound a branch compares the register with, where it compares.
        const EdgeFact& f = program->facts[r.fact];
        std::vector<std::string> regs;
        registersOf(f.a, regs);
        registersOf(f.b, regs);
        for (std::string& other : regs) {
          if (other != reg) work.emplace_back(f.setp, std::move(other));
        }
      }
      if (r.def < 0 || !program->definitions.emplace(static_cast<uint32_t>(r.def), body[r.def]).second) continue;
      const Instruction& inst = body[r.def];
      std::vector<std::string> regs;
      for (size_t k = 1; k < inst.operands.size(); ++k) registersOf(inst.operands[k], regs);
      for (std::string& other : regs) work.emplace_back(static_cast<uint32_t>(r.def), std::move(other));
    }
    program->reaching.emplace(std::pair<uint32_t, std::string>(at, std::move(reg)), std::move(defs));
  }
  return std::shared_ptr<const AccessBounds>(new AccessBounds(std::move(program)));
}

void AccessBounds::narrow(LaunchAccessSet& set, std::span<const std::byte> params, const LaunchShape& shape,
                          const BufferLookup& buffers, const GlobalLookup& globals) const {
  const Program& p = *program_;
  if (!useful() || !buffers) return;
  Evaluator eval(p, params, shape);
  struct Reach {
    bool all = false;
    std::set<uint64_t> whole;                          // buffers by base
    std::map<uint64_t, std::vector<Buffer>> ranges;  // by buffer base
  } reach[2];                                          // reads, writes
  reach[0].all = !p.whyReads.empty();
  reach[1].all = !p.whyWrites.empty();
  for (const MemoryAccess& m : p.accesses) {
    const Value a = eval.address(m);
    // An address only of the local or shared window is no global memory.
    if (a.window && a.words.empty() && !a.global && !a.opaque) continue;
    for (int k = 0; k < 2; ++k) {
      if ((m.kinds & (k == 0 ? kRead : kWrite)) == 0) continue;
      Reach& r = reach[k];
      if (a.opaque || (a.words.empty() && !a.global)) {
        r.all = true;  // an address from nowhere speculation can name
        continue;
      }
      auto bufferOf = [&](uint32_t w) -> std::optional<Buffer> {
        std::optional<uint64_t> value = eval.word(w);
        return value ? buffers(*value) : std::nullopt;
      };
      if (a.bounded && m.size != 0 && !a.global && !a.window && a.words.size() == 1) {
        if (std::optional<Buffer> b = bufferOf(*a.words.begin())) {
          // Clipped to the buffer: a thread of the last block past the end of
          // the data is one the kernel's own bounds check stops.
          const Wide begin = std::max<Wide>(a.lo, b->base);
          const Wide end = std::min<Wide>(a.hi + m.size, Wide{b->base} + b->size);
          auto& list = r.ranges[b->base];
          if (begin < end) addRange(list, static_cast<uint64_t>(begin), static_cast<uint64_t>(end));
        }
        continue;
      }
      for (uint32_t w : a.words) {
        if (std::optional<Buffer> b = bufferOf(w)) r.whole.insert(b->base);
      }
    }
  }
  std::set<uint64_t> variables;
  if (globals) {
    for (const std::string& name : p.globals) {
      if (std::optional<Buffer> b = globals(name)) variables.insert(b->base);
    }
  }
  for (int k = 0; k < 2; ++k) {
    Reach& r = reach[k];
    std::vector<Buffer>& list = k == 0 ? set.reads : set.writes;
    if (r.all) continue;
    std::vector<Buffer> narrowed;
    for (const Buffer& b : list) {
      auto it = r.ranges.find(b.base);
      if (it == r.ranges.end() || r.whole.count(b.base) != 0 || variables.count(b.base) != 0) {
        narrowed.push_back(b);  // reached some other way, or not seen: whole
        continue;
      }
      coalesce(it->second);
      for (const Buffer& part : it->second) narrowed.push_back(part);
    }
    std::sort(narrowed.begin(), narrowed.end(), [](const Buffer& a, const Buffer& b) {
      return a.base != b.base ? a.base < b.base : a.size < b.size;
    });
    narrowed.erase(std::unique(narrowed.begin(), narrowed.end()), narrowed.end());
    list = std::move(narrowed);
  }
}

}  // namespace phos::instrument
