// SPDX-License-Identifier: Apache-2.0
// AST -> executable form: scoped names resolved to slots and offsets, nested blocks
// flattened, labels resolved, and reconvergence points from post-dominators.
#include "lower.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "phos/instrument/check_function.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "postdom.h"

namespace phos::vgpu::engine::detail {
namespace {

using ptx::OperandKind;
using ptx::StateSpace;

uint32_t alignUp(uint32_t v, uint32_t a) { return a ? (v + a - 1) / a * a : v; }

// Whether `f` is PhOS's range check, as place_twins writes it, to the letter:
// its calls then run natively (Inst::Builtin::kPhosCheck), with the same
// effects as its body. PHOS_VGPU_INTERPRET_CHECK=1 (read when a module is
// loaded) interprets it instead, as a GPU runs it: the instruction counts a
// GPU would see, and the reference of the native path's tests.
bool isPhosCheck(const ptx::Function& f) {
  if (f.name != instrument::kCheckFunctionName || !f.hasBody) return false;
  if (const char* interpret = std::getenv("PHOS_VGPU_INTERPRET_CHECK");
      interpret != nullptr && *interpret != '\0' && std::string_view(interpret) != "0") {
    return false;
  }
  static const std::string canonical = [] {
    std::string text = ".version 7.0\n.target sm_80\n.address_size 64\n";
    text += instrument::kCheckFunctionText;
    auto m = ptx::parseModule(text, "<phos check function>");
    if (!m.isOk()) return std::string();
    for (const ptx::ModuleItem& item : m->items) {
      if (const auto* g = std::get_if<ptx::Function>(&item)) return ptx::print(*g);
    }
    return std::string();
  }();
  return !canonical.empty() && ptx::print(f) == canonical;
}

uint32_t declAlign(const ptx::VarDecl& d) {
  if (d.align) return d.align;
  uint32_t a = ptx::typeSize(d.type) * d.vectorWidth;
  return a ? a : 1;
}

struct Sym {
  enum class Kind { kReg, kKernelParam, kFrameParam, kLocal, kShared, kDynShared, kGlobal };
  Kind kind = Kind::kReg;
  uint64_t value = 0;
  bool predicate = false;  // a .pred register
};

struct SpecialName {
  std::string_view name;
  Special special;
};
constexpr SpecialName kSpecials[] = {
    {"%tid", Special::kTid}, {"%ntid", Special::kNtid}, {"%ctaid", Special::kCtaid},
    {"%nctaid", Special::kNctaid}, {"%laneid", Special::kLaneid},
    {"%warpid", Special::kWarpid}, {"%nwarpid", Special::kNwarpid},
    {"%smid", Special::kSmid}, {"%nsmid", Special::kNsmid}, {"%gridid", Special::kGridid},
    {"%clock", Special::kClock}, {"%clock_hi", Special::kClockHi},
    {"%clock64", Special::kClock64}, {"%globaltimer", Special::kGlobaltimer},
    {"%globaltimer_lo", Special::kGlobaltimerLo},
    {"%globaltimer_hi", Special::kGlobaltimerHi},
    {"%lanemask_eq", Special::kLanemaskEq}, {"%lanemask_le", Special::kLanemaskLe},
    {"%lanemask_lt", Special::kLanemaskLt}, {"%lanemask_ge", Special::kLanemaskGe},
    {"%lanemask_gt", Special::kLanemaskGt},
    {"%dynamic_smem_size", Special::kDynamicSmemSize},
    {"%total_smem_size", Special::kTotalSmemSize},
    {"%aggr_smem_size", Special::kAggrSmemSize},
    {"%cluster_ctaid", Special::kClusterCtaid}, {"%cluster_nctaid", Special::kClusterNctaid},
    {"%cluster_ctarank", Special::kClusterCtarank},
    {"%cluster_nctarank", Special::kClusterNctarank},
    {"%is_explicit_cluster", Special::kIsExplicitCluster},
    {"%clusterid", Special::kClusterid}, {"%nclusterid", Special::kNclusterid},
    {"%reserved_smem_offset_begin", Special::kReservedSmemBegin},
    {"%reserved_smem_offset_end", Special::kReservedSmemEnd},
    {"%reserved_smem_offset_cap", Special::kReservedSmemCap},
    {"%reserved_smem_offset_0", Special::kReservedSmem0},
    {"%reserved_smem_offset_1", Special::kReservedSmem1},
};

// Operands every executed form of an opcode has at least; fewer would make the
// interpreter read past the operand list, so such PTX is refused at load.
size_t minOperands(ptx::Opcode op, const ptx::Modifiers& m) {
  using ptx::Opcode;
  switch (op) {
    case Opcode::kActivemask: return 1;
    case Opcode::kVote: return 2;
    case Opcode::kMov: case Opcode::kNot: case Opcode::kCnot: case Opcode::kAbs:
    case Opcode::kNeg: case Opcode::kPopc: case Opcode::kClz: case Opcode::kBrev:
    case Opcode::kBfind: case Opcode::kCvta: case Opcode::kIsspacep: case Opcode::kTestp:
    case Opcode::kRcp: case Opcode::kSqrt: case Opcode::kRsqrt: case Opcode::kSin:
    case Opcode::kCos: case Opcode::kLg2: case Opcode::kEx2: case Opcode::kTanh:
    case Opcode::kLd: case Opcode::kLdu: case Opcode::kSt: case Opcode::kElect:
      return 2;
    case Opcode::kCvt: {
      // Two f32 sources packed into one register: d, a, b.
      const ptx::Type d = m.type();
      const bool packed = d == ptx::Type::kF16x2 || d == ptx::Type::kBF16x2 || d == ptx::Type::kE4M3x2 ||
                          d == ptx::Type::kE5M2x2;
      return packed && m.lastType() == ptx::Type::kF32 ? 3 : 2;
    }
    case Opcode::kAdd: case Opcode::kSub: case Opcode::kMul: case Opcode::kDiv:
    case Opcode::kRem: case Opcode::kMin: case Opcode::kMax: case Opcode::kAnd:
    case Opcode::kOr: case Opcode::kXor: case Opcode::kShl: case Opcode::kShr:
    case Opcode::kAddc: case Opcode::kSubc: case Opcode::kMul24: case Opcode::kCopysign:
    case Opcode::kSetp: case Opcode::kSet: case Opcode::kMatch:
    case Opcode::kRedux: case Opcode::kBmsk: case Opcode::kSzext:
      return 3;
    case Opcode::kRed: return m.atomOp == ptx::AtomOp::kCas ? 3 : 2;
    case Opcode::kAtom: return m.atomOp == ptx::AtomOp::kCas ? 4 : 3;
    case Opcode::kMad: case Opcode::kMadc: case Opcode::kMad24: case Opcode::kFma:
    case Opcode::kSelp: case Opcode::kSlct: case Opcode::kBfe: case Opcode::kPrmt:
    case Opcode::kShf: case Opcode::kSad: case Opcode::kDp4a: case Opcode::kDp2a: case Opcode::kFns:
      return 4;
    case Opcode::kShfl:
      return 4;
    case Opcode::kBfi: case Opcode::kLop3:
      return 5;
    default:
      return 0;
  }
}

// The cvt forms the interpreter executes: between scalar integer and float
// types; two f32 into f16x2/bf16x2; f32 pairs or f16x2 into fp8 pairs and fp8
// pairs into f16x2; f32 into tf32. Not: fp6/fp4/ue8m0, stochastic rounding (.rs).
bool cvtSupported(const ptx::Modifiers& m) {
  using ptx::Type;
  auto scalar = [](Type t) {
    switch (t) {
      case Type::kU8: case Type::kU16: case Type::kU32: case Type::kU64:
      case Type::kS8: case Type::kS16: case Type::kS32: case Type::kS64:
      case Type::kB8: case Type::kB16: case Type::kB32: case Type::kB64:
      case Type::kF16: case Type::kBF16: case Type::kF32: case Type::kF64:
        return true;
      default:
        return false;
    }
  };
  auto fp8x2 = [](Type t) { return t == Type::kE4M3x2 || t == Type::kE5M2x2; };
  const Type d = m.type(), a = m.lastType();
  if (m.rounding == ptx::Rounding::kRs) return false;
  return (scalar(d) && scalar(a)) || ((d == Type::kF16x2 || d == Type::kBF16x2) && a == Type::kF32) ||
         (fp8x2(d) && (a == Type::kF32 || a == Type::kF16x2)) || (d == Type::kF16x2 && fp8x2(a)) ||
         (d == Type::kTF32 && a == Type::kF32 &&
          (m.rounding == ptx::Rounding::kRna || m.rounding == ptx::Rounding::kRn || m.rounding == ptx::Rounding::kRz));
}

class FunctionLowering {
 public:
  FunctionLowering(const ptx::Function& fn, Function& out,
                   const std::unordered_map<std::string, Sym>& moduleSyms,
                   const std::unordered_map<std::string, int32_t>& functionIndex,
                   const std::vector<const ptx::Function*>& functions)
      : fn_(fn), out_(out), moduleSyms_(moduleSyms), functionIndex_(functionIndex),
        functions_(functions) {}

  Status run() {
    scopes_.emplace_back();
    if (fn_.isEntry) {
      uint32_t offset = 0;
      for (const ptx::VarDecl& p : fn_.params) {
        offset = alignUp(offset, declAlign(p));
        scopes_.back()[p.name] = {Sym::Kind::kKernelParam, offset};
        offset += static_cast<uint32_t>(p.byteSize());
      }
    } else {
      for (const ptx::VarDecl& p : fn_.params) {
        uint32_t off = allocParam(p);
        out_.formalOffsets.push_back(off);
        out_.formalSizes.push_back(static_cast<uint32_t>(p.byteSize()));
        scopes_.back()[p.name] = {Sym::Kind::kFrameParam, off};
      }
      for (const ptx::VarDecl& p : fn_.returnParams) {
        uint32_t off = allocParam(p);
        out_.returnOffsets.push_back(off);
        out_.returnSizes.push_back(static_cast<uint32_t>(p.byteSize()));
        scopes_.back()[p.name] = {Sym::Kind::kFrameParam, off};
      }
    }
    RETURN_IF_ERROR(walk(fn_.body, /*newScope=*/false));
    // Falling off the end returns.
    Inst ret;
    ret.op = ptx::Opcode::kRet;
    out_.code.push_back(std::move(ret));
    RETURN_IF_ERROR(resolveBranches());
    out_.regCount = nextReg_;
    out_.localBytes = alignUp(localBytes_, 16);
    out_.paramBytes = alignUp(paramBytes_, 8);
    return Status::ok();
  }

  uint32_t scopedSharedBytes() const { return sharedBytes_; }
  void setSharedBase(uint32_t base) { sharedBase_ = base; }

 private:
  uint32_t allocParam(const ptx::VarDecl& p) {
    paramBytes_ = alignUp(paramBytes_, declAlign(p));
    uint32_t off = paramBytes_;
    paramBytes_ += static_cast<uint32_t>(std::max<uint64_t>(p.byteSize(), 1));
    return off;
  }

  const Sym* lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return &found->second;
    }
    auto found = moduleSyms_.find(name);
    return found == moduleSyms_.end() ? nullptr : &found->second;
  }

  Status declare(const ptx::VarDecl& d) {
    auto& scope = scopes_.back();
    switch (d.space) {
      case StateSpace::kReg:
        if (d.vectorWidth != 1) {
          return makeError(Code::kNotSupported, "vector register {} is not supported", d.name);
        }
        if (d.rangeCount) {
          for (uint32_t i = 0; i < d.rangeCount; ++i) {
            scope[d.name + std::to_string(i)] = {Sym::Kind::kReg, nextReg_++, d.type == ptx::Type::kPred};
          }
        } else {
          scope[d.name] = {Sym::Kind::kReg, nextReg_++, d.type == ptx::Type::kPred};
        }
        return Status::ok();
      case StateSpace::kLocal:
        localBytes_ = alignUp(localBytes_, declAlign(d));
        scope[d.name] = {Sym::Kind::kLocal, localBytes_};
        localBytes_ += static_cast<uint32_t>(d.byteSize());
        return Status::ok();
      case StateSpace::kParam: case StateSpace::kParamFunc: case StateSpace::kParamEntry:
        scope[d.name] = {Sym::Kind::kFrameParam, allocParam(d)};
        return Status::ok();
      case StateSpace::kShared: case StateSpace::kSharedCta: case StateSpace::kSharedCluster:
        if (d.byteSize() == 0) {
          scope[d.name] = {Sym::Kind::kDynShared, 0};
          return Status::ok();
        }
        sharedBytes_ = alignUp(sharedBytes_, declAlign(d));
        scope[d.name] = {Sym::Kind::kShared, sharedBase_ + sharedBytes_};
        sharedBytes_ += static_cast<uint32_t>(d.byteSize());
        return Status::ok();
      default:
        return makeError(Code::kNotSupported, "line {}: .{} variable {} inside a function",
                         d.line, ptx::name(d.space), d.name);
    }
  }

  Status walk(const std::vector<ptx::Statement>& body, bool newScope) {
    if (newScope) scopes_.emplace_back();
    // Declarations are visible to the whole block in PTX, even before the statement.
    for (const ptx::Statement& s : body) {
      if (const auto* d = std::get_if<ptx::VarDecl>(&s.value)) RETURN_IF_ERROR(declare(*d));
    }
    for (const ptx::Statement& s : body) {
      if (const auto* inst = std::get_if<ptx::Instruction>(&s.value)) {
        RETURN_IF_ERROR(lowerInstruction(*inst));
      } else if (const auto* label = std::get_if<ptx::Label>(&s.value)) {
        labels_[label->name] = static_cast<uint32_t>(out_.code.size());
        leaders_.push_back(static_cast<uint32_t>(out_.code.size()));
      } else if (const auto* block = std::get_if<ptx::Block>(&s.value)) {
        RETURN_IF_ERROR(walk(block->statements, /*newScope=*/true));
      }
    }
    if (newScope) scopes_.pop_back();
    return Status::ok();
  }

  Result<Opnd> lowerOperand(const ptx::Operand& o, const ptx::Instruction& inst) {
    Opnd r;
    switch (o.kind) {
      case OperandKind::kNone:
        return r;
      case OperandKind::kSink:
        r.kind = OpndKind::kSink;
        return r;
      case OperandKind::kImmInt:
        r.kind = OpndKind::kImm;
        r.imm = static_cast<uint64_t>(o.value);
        return r;
      case OperandKind::kImmFloat:
        r.kind = OpndKind::kImm;
        r.imm = o.floatBits;
        // A 32-bit float literal given to an f64 operation is not legal PTX; a 64-bit
        // literal given to an f32 operation is rounded, as ptxas does.
        if (o.floatWidth == 64 && inst.m.type() == ptx::Type::kF32) {
          double d;
          std::memcpy(&d, &o.floatBits, 8);
          float f = static_cast<float>(d);
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          r.imm = bits;
        }
        return r;
      case OperandKind::kRegister: {
        r.negated = o.negated;
        if (const Sym* s = lookup(o.name); s && s->kind == Sym::Kind::kReg) {
          if (o.component) {
            return makeError(Code::kNotSupported, "line {}: vector register component {}.{}",
                             inst.line, o.name, o.component);
          }
          r.kind = OpndKind::kReg;
          r.reg = static_cast<uint32_t>(s->value);
          return r;
        }
        for (const SpecialName& sp : kSpecials) {
          if (sp.name == o.name) {
            r.kind = OpndKind::kSpecial;
            r.special = sp.special;
            r.component = o.component == 'y' ? 1 : o.component == 'z' ? 2 : 0;
            return r;
          }
        }
        // %envreg0..%envreg31: read-only registers the driver sets per launch.
        if (std::string_view name = o.name; name.starts_with("%envreg") && name.size() > 7 && name.size() <= 9) {
          unsigned index = 0;
          auto [end, ec] = std::from_chars(name.data() + 7, name.data() + name.size(), index);
          if (ec == std::errc() && end == name.data() + name.size() && index < 32 && (name.size() == 8 || name[7] != '0')) {
            r.kind = OpndKind::kSpecial;
            r.special = Special::kEnvreg;
            r.imm = index;
            return r;
          }
        }
        if (const Sym* s = lookup(o.name)) return symbolValue(*s, 0);
        return makeError(Code::kInvalidArgument, "line {}: undeclared register {}", inst.line,
                         o.name);
      }
      case OperandKind::kSymbol: {
        if (const Sym* s = lookup(o.name)) return symbolValue(*s, o.value);
        if (auto f = functionIndex_.find(o.name); f != functionIndex_.end()) {
          r.kind = OpndKind::kImm;
          r.imm = kFunctionWindow + static_cast<uint64_t>(f->second) * 16;
          return r;
        }
        return makeError(Code::kInvalidArgument, "line {}: undeclared symbol {}", inst.line,
                         o.name);
      }
      case OperandKind::kAddress: {
        r.kind = OpndKind::kAddr;
        r.imm = static_cast<uint64_t>(o.value);
        for (const ptx::Operand& e : o.elements) {  // [tex, {coordinates}]
          ASSIGN_OR_RETURN(Opnd le, lowerOperand(e, inst));
          r.elems.push_back(std::move(le));
        }
        if (o.name.empty()) {
          r.base = AddrBase::kAbsolute;
          return r;
        }
        const Sym* s = lookup(o.name);
        if (!s) {
          return makeError(Code::kInvalidArgument, "line {}: undeclared address base {}",
                           inst.line, o.name);
        }
        switch (s->kind) {
          case Sym::Kind::kReg: r.base = AddrBase::kRegister; r.reg = static_cast<uint32_t>(s->value); break;
          case Sym::Kind::kKernelParam: r.base = AddrBase::kKernelParam; r.imm += s->value; break;
          case Sym::Kind::kFrameParam: r.base = AddrBase::kFrameParam; r.imm += s->value; break;
          case Sym::Kind::kLocal: r.base = AddrBase::kLocalVar; r.imm += s->value; break;
          case Sym::Kind::kDynShared: r.base = AddrBase::kDynShared; break;
          case Sym::Kind::kShared: case Sym::Kind::kGlobal:
            r.base = AddrBase::kAbsolute; r.imm += s->value; break;
        }
        return r;
      }
      case OperandKind::kVector: case OperandKind::kList: case OperandKind::kPredPair: {
        r.kind = OpndKind::kVec;
        for (const ptx::Operand& e : o.elements) {
          ASSIGN_OR_RETURN(Opnd le, lowerOperand(e, inst));
          r.elems.push_back(std::move(le));
        }
        return r;
      }
    }
    return makeError(Code::kNotSupported, "line {}: operand kind", inst.line);
  }

  static Opnd symbolValue(const Sym& s, int64_t offset) {
    Opnd r;
    uint64_t off = static_cast<uint64_t>(offset);
    switch (s.kind) {
      case Sym::Kind::kReg: r.kind = OpndKind::kReg; r.reg = static_cast<uint32_t>(s.value); break;
      case Sym::Kind::kKernelParam: case Sym::Kind::kShared: case Sym::Kind::kGlobal:
        r.kind = OpndKind::kImm; r.imm = s.value + off; break;
      case Sym::Kind::kFrameParam: r.kind = OpndKind::kFrameParamAddr; r.imm = s.value + off; break;
      case Sym::Kind::kLocal: r.kind = OpndKind::kLocalAddr; r.imm = s.value + off; break;
      case Sym::Kind::kDynShared: r.kind = OpndKind::kDynSharedAddr; r.imm = off; break;
    }
    return r;
  }

  // mbarrier: one operation on an 8-byte object in shared memory, named by its
  // first modifier (arrive and arrive_drop may add .expect_tx or .noComplete).
  // A form the interpreter could not run is refused here, naming it.
  static Status checkMbarrier(const ptx::Instruction& in, const Inst& inst) {
    using ptx::Flag;
    const ptx::Modifiers& m = in.m;
    const bool arrive = m.has(Flag::kArrive) || m.has(Flag::kArriveDrop);
    const bool wait = m.has(Flag::kTestWait) || m.has(Flag::kTryWait);
    const int operations = int{m.has(Flag::kInit)} + int{m.has(Flag::kInval)} + int{arrive} + int{wait} +
                           int{m.has(Flag::kPendingCount)} + int{m.has(Flag::kCompleteTx)} +
                           int{m.has(Flag::kExpectTx) && !arrive};
    auto refuse = [&](std::string_view why) {
      return makeError(Code::kInvalidArgument, "line {}: {}: {}", in.line, spelledForm(in), why);
    };
    if (operations != 1 || (m.has(Flag::kArrive) && m.has(Flag::kArriveDrop)) ||
        (m.has(Flag::kParity) && !wait) || (m.has(Flag::kNoComplete) && !arrive)) {
      return refuse("not an mbarrier operation of the PTX ISA");
    }
    if (m.space != ptx::StateSpace::kNone && !ptx::isSharedSpace(m.space)) {
      return refuse("an mbarrier object lives in shared memory");
    }
    const auto& ops = inst.ops;
    auto value = [&](size_t i) {
      return i < ops.size() && (ops[i].kind == OpndKind::kReg || ops[i].kind == OpndKind::kImm);
    };
    auto address = [&](size_t i) { return i < ops.size() && ops[i].kind == OpndKind::kAddr; };
    if (m.has(Flag::kPendingCount)) {
      return ops.size() == 2 && ops[0].kind == OpndKind::kReg && value(1) ? Status::ok()
                                                                          : refuse("needs count, state");
    }
    if (m.has(Flag::kInval)) return ops.size() == 1 && address(0) ? Status::ok() : refuse("needs [addr]");
    if (!arrive && !wait) {  // init, expect_tx, complete_tx
      return ops.size() == 2 && address(0) && value(1) ? Status::ok() : refuse("needs [addr] and a count");
    }
    const bool sinkOrReg = !ops.empty() && (ops[0].kind == OpndKind::kReg || ops[0].kind == OpndKind::kSink);
    if (arrive) {
      const bool needsCount = m.has(Flag::kNoComplete) || m.has(Flag::kExpectTx);
      const bool ok = sinkOrReg && address(1) && (ops.size() == 2 ? !needsCount : ops.size() == 3 && value(2));
      return ok ? Status::ok() : refuse("needs state (or _), [addr] and the count its form takes");
    }
    const bool ok = !ops.empty() && ops[0].kind == OpndKind::kReg && address(1) && value(2) &&
                    (ops.size() == 3 || (ops.size() == 4 && m.has(Flag::kTryWait) && value(3)));
    return ok ? Status::ok() : refuse("needs waitComplete, [addr] and a state or phase parity");
  }

  // cp.async.bulk (sm_90) without tensor maps: global or the CTA's shared
  // memory into shared memory, completing bytes on an mbarrier
  // (.mbarrier::complete_tx::bytes), and shared memory into global
  // (.bulk_group, with commit_group and wait_group{.read}). Other forms
  // (.multicast::cluster, ...) fault when executed.
  static Status lowerBulkCopy(const ptx::Instruction& in, Inst& inst) {
    using ptx::Flag;
    if (in.m.has(Flag::kCommitGroup)) return Status::ok();
    if (in.m.has(Flag::kWaitGroup)) {
      if (in.operands.size() == 1 && in.operands[0].kind == OperandKind::kImmInt) return Status::ok();
      return makeError(Code::kInvalidArgument, "line {}: {} needs the number of groups", in.line, spelledForm(in));
    }
    const bool toShared = (in.m.space == StateSpace::kSharedCluster || in.m.space == StateSpace::kSharedCta) &&
                          (in.m.space2 == StateSpace::kGlobal || in.m.space2 == StateSpace::kSharedCta) &&
                          in.m.has(Flag::kMbarrierCompleteTxBytes);
    const bool toGlobal = in.m.space == StateSpace::kGlobal && in.m.space2 == StateSpace::kSharedCta &&
                          in.m.has(Flag::kBulkGroup);
    if (!toShared && !toGlobal) {
      inst.unsupported = true;
      return Status::ok();
    }
    const auto& ops = inst.ops;
    const size_t base = toShared ? 4 : 3;  // [dst], [src], size{, [mbar]}; then an optional cache policy
    const bool hint = in.m.has(Flag::kL2CacheHint);
    const bool ok = ops.size() == base + (hint ? 1 : 0) && ops[0].kind == OpndKind::kAddr &&
                    ops[1].kind == OpndKind::kAddr && (ops[2].kind == OpndKind::kReg || ops[2].kind == OpndKind::kImm) &&
                    (!toShared || ops[3].kind == OpndKind::kAddr);
    if (!ok) {
      return makeError(Code::kInvalidArgument, "line {}: {} needs [dst], [src], size{}{}", in.line, spelledForm(in),
                       toShared ? " and [mbar]" : "", hint ? " and a cache policy" : "");
    }
    return Status::ok();
  }

  // cp.async: the copy of 4, 8 or 16 bytes from global into shared memory
  // (sm_80), cp.async.commit_group / wait_group / wait_all, and
  // cp.async.mbarrier.arrive. Bulk and tensor copies and cp.reduce fault when
  // executed.
  Status lowerAsyncCopy(const ptx::Instruction& in, Inst& inst) {
    bool other = false;
    for (const ptx::Mod& mod : in.mods) {
      const std::string name = ptx::modName(mod);
      other = other || name == "reduce" || name == "tensor";
    }
    if (in.m.has(ptx::Flag::kAsync) && in.m.has(ptx::Flag::kBulk) && !other) return lowerBulkCopy(in, inst);
    other = other || in.m.has(ptx::Flag::kBulk);
    const bool mbarrier = in.m.has(ptx::Flag::kMbarrier);
    // cp.async.mbarrier.arrive{.noinc}{.shared{::cta}}.b64 [addr]: an arrive-on
    // the mbarrier once this thread's earlier cp.async copies are done.
    if (in.m.has(ptx::Flag::kAsync) && mbarrier && !other && in.m.has(ptx::Flag::kArrive)) {
      const bool shared = in.m.space == StateSpace::kNone || in.m.space == StateSpace::kShared ||
                          in.m.space == StateSpace::kSharedCta;
      if (!shared || in.operands.size() != 1 || in.operands[0].kind != OperandKind::kAddress) {
        return makeError(Code::kInvalidArgument, "line {}: {} needs [addr] of an mbarrier in shared memory", in.line,
                         spelledForm(in));
      }
      return Status::ok();
    }
    if (!in.m.has(ptx::Flag::kAsync) || other || mbarrier) {
      inst.unsupported = true;
      return Status::ok();
    }
    if (in.m.has(ptx::Flag::kCommitGroup) || in.m.has(ptx::Flag::kWaitGroup) || in.m.has(ptx::Flag::kWaitAll)) {
      return Status::ok();
    }
    const bool toShared = in.m.space == StateSpace::kShared || in.m.space == StateSpace::kSharedCta ||
                          in.m.space == StateSpace::kSharedCluster;
    if (!toShared || in.m.space2 != StateSpace::kGlobal) {
      inst.unsupported = true;
      return Status::ok();
    }
    const auto& ops = in.operands;
    if (ops.size() < 3 || ops[0].kind != OperandKind::kAddress || ops[1].kind != OperandKind::kAddress ||
        ops[2].kind != OperandKind::kImmInt || (ops[2].value != 4 && ops[2].value != 8 && ops[2].value != 16)) {
      return makeError(Code::kInvalidArgument, "line {}: {} needs [dst], [src] and a cp-size of 4, 8 or 16", in.line,
                       spelledForm(in));
    }
    if (ops.size() >= 4 && ops[3].kind == OperandKind::kRegister) {
      const Sym* s = lookup(ops[3].name);
      inst.ignoreSrc = s != nullptr && s->predicate;
    }
    return Status::ok();
  }

  Status lowerInstruction(const ptx::Instruction& in) {
    Inst inst;
    inst.op = in.opcode;
    inst.m = in.m;
    inst.type = in.m.type();
    inst.type2 = in.m.lastType();
    inst.source = &in;
    if (in.guard.present()) {
      const Sym* s = lookup(in.guard.reg);
      if (!s || s->kind != Sym::Kind::kReg) {
        return makeError(Code::kInvalidArgument, "line {}: undeclared guard predicate {}",
                         in.line, in.guard.reg);
      }
      inst.guard = static_cast<int32_t>(s->value);
      inst.guardNegated = in.guard.negated;
    }
    const uint32_t pc = static_cast<uint32_t>(out_.code.size());
    switch (in.opcode) {
      case ptx::Opcode::kBra: {
        if (in.operands.empty() || in.operands.back().kind != OperandKind::kSymbol) {
          return makeError(Code::kNotSupported, "line {}: bra without a label", in.line);
        }
        branchLabels_.emplace_back(pc, in.operands.back().name);
        leaders_.push_back(pc + 1);
        out_.code.push_back(std::move(inst));
        return Status::ok();
      }
      case ptx::Opcode::kCall:
        RETURN_IF_ERROR(lowerCall(in, inst));
        out_.code.push_back(std::move(inst));
        return Status::ok();
      case ptx::Opcode::kRet: case ptx::Opcode::kExit: case ptx::Opcode::kTrap:
        leaders_.push_back(pc + 1);
        break;
      case ptx::Opcode::kBrx:
        return makeError(Code::kNotSupported, "line {}: brx.idx is not supported", in.line);
      default:
        break;
    }
    for (const ptx::Operand& o : in.operands) {
      ASSIGN_OR_RETURN(Opnd lo, lowerOperand(o, in));
      inst.ops.push_back(std::move(lo));
    }
    if (in.opcode == ptx::Opcode::kMbarrier) RETURN_IF_ERROR(checkMbarrier(in, inst));
    if (in.opcode == ptx::Opcode::kCp) RETURN_IF_ERROR(lowerAsyncCopy(in, inst));
    if (in.opcode == ptx::Opcode::kCvt && !cvtSupported(in.m)) inst.unsupported = true;
    if (isTextureOpcode(in.opcode)) RETURN_IF_ERROR(checkTextureForm(in, inst));
    // 128-bit loads and stores would need 128-bit registers, which the
    // interpreter does not have: faulting is better than moving half.
    if ((in.opcode == ptx::Opcode::kLd || in.opcode == ptx::Opcode::kLdu || in.opcode == ptx::Opcode::kSt) &&
        in.m.type() == ptx::Type::kB128) {
      inst.unsupported = true;
    }
    if (inst.ops.size() < minOperands(in.opcode, in.m)) {
      return makeError(Code::kInvalidArgument, "line {}: {} needs at least {} operands",
                       in.line, ptx::name(in.opcode), minOperands(in.opcode, in.m));
    }
    // Vector operands must have as many elements as the access is wide.
    if (in.opcode == ptx::Opcode::kLd || in.opcode == ptx::Opcode::kLdu ||
        in.opcode == ptx::Opcode::kSt) {
      const Opnd& v = inst.ops[in.opcode == ptx::Opcode::kSt ? 1 : 0];
      size_t want = in.m.vectorWidth;
      if ((want > 1) != (v.kind == OpndKind::kVec) ||
          (v.kind == OpndKind::kVec && v.elems.size() != want) ||
          inst.ops[in.opcode == ptx::Opcode::kSt ? 0 : 1].kind != OpndKind::kAddr) {
        return makeError(Code::kInvalidArgument, "line {}: malformed {} operands", in.line,
                         ptx::name(in.opcode));
      }
    }
    if (in.opcode == ptx::Opcode::kMov) {
      for (const Opnd& o : inst.ops) {
        if (o.kind == OpndKind::kVec && o.elems.empty()) {
          return makeError(Code::kInvalidArgument, "line {}: empty vector in mov", in.line);
        }
      }
    }
    if ((in.opcode == ptx::Opcode::kAtom || in.opcode == ptx::Opcode::kRed) &&
        inst.ops[in.opcode == ptx::Opcode::kRed ? 0 : 1].kind != OpndKind::kAddr) {
      return makeError(Code::kInvalidArgument, "line {}: {} without an address", in.line,
                       ptx::name(in.opcode));
    }
    out_.code.push_back(std::move(inst));
    return Status::ok();
  }

  // tex, tld4, txq, suld, sust, suq: malformed operands are refused; forms
  // the interpreter does not run (docs/vgpu.md) fault when they run.
  static bool isTextureOpcode(ptx::Opcode op) {
    using ptx::Opcode;
    return op == Opcode::kTex || op == Opcode::kTld4 || op == Opcode::kTxq || op == Opcode::kSuld ||
           op == Opcode::kSust || op == Opcode::kSuq || op == Opcode::kSured ||
           op == Opcode::kIstypep;
  }
  Status checkTextureForm(const ptx::Instruction& in, Inst& inst) {
    using ptx::Flag;
    using ptx::Opcode;
    const auto& m = in.m;
    auto malformed = [&]() {
      return makeError(Code::kInvalidArgument, "line {}: malformed {} operands", in.line,
                       ptx::name(in.opcode));
    };
    const int dims = m.has(Flag::kGeom1d)   ? 1
                     : m.has(Flag::kGeom2d) ? 2
                     : m.has(Flag::kGeom3d) ? 3
                                            : 0;
    const bool otherGeometry = m.has(Flag::kGeomA1d) || m.has(Flag::kGeomA2d) ||
                               m.has(Flag::kGeomCube) || m.has(Flag::kGeomAcube) ||
                               m.has(Flag::kGeom2dms) || m.has(Flag::kGeomA2dms);
    // The object's handle in a 64-bit register: unified mode with texture and
    // surface objects (module-scope .texref/.surfref variables are not run).
    auto objectInRegister = [&](const Opnd& a) {
      return a.kind == OpndKind::kAddr && a.base == AddrBase::kRegister;
    };
    auto coordinates = [&](const Opnd& a) -> const Opnd* {
      if (a.kind != OpndKind::kAddr || a.elems.empty()) return nullptr;
      const Opnd& c = a.elems.back();
      return c.kind == OpndKind::kVec ? &c : nullptr;
    };
    switch (in.opcode) {
      case Opcode::kTex:
      case Opcode::kTld4: {
        if (inst.ops.size() < 2 || inst.ops[0].kind != OpndKind::kVec ||
            inst.ops[0].elems.size() != 4) {
          return malformed();
        }
        const Opnd* c = coordinates(inst.ops[1]);
        if (c == nullptr) return malformed();
        const bool gatherComponent = in.opcode == Opcode::kTex || m.has(Flag::kR) ||
                                     m.has(Flag::kG) || m.has(Flag::kB) || m.has(Flag::kA);
        if (dims == 0 || otherGeometry || m.has(Flag::kLevel) || m.has(Flag::kGrad) ||
            inst.ops.size() != 2 || inst.ops[1].elems.size() != 1 ||
            !objectInRegister(inst.ops[1]) || !gatherComponent ||
            (in.opcode == Opcode::kTld4 && dims != 2) ||
            c->elems.size() < static_cast<size_t>(dims == 3 ? 4 : dims)) {
          inst.unsupported = true;
        }
        return Status::ok();
      }
      case Opcode::kSuld:
      case Opcode::kSust: {
        const bool load = in.opcode == Opcode::kSuld;
        if (inst.ops.size() < 2) return malformed();
        const Opnd& a = inst.ops[load ? 1 : 0];
        const Opnd& v = inst.ops[load ? 0 : 1];
        const Opnd* c = coordinates(a);
        if (c == nullptr) return malformed();
        const size_t width = m.vectorWidth;
        // One value is written {%r1} (as nvcc does) or %r1.
        if (v.kind == OpndKind::kVec ? v.elems.size() != width : width != 1) return malformed();
        const ptx::Type t = m.type();
        const bool binaryType = t == ptx::Type::kB8 || t == ptx::Type::kB16 ||
                                t == ptx::Type::kB32 || t == ptx::Type::kB64;
        if (!m.has(Flag::kB) || dims == 0 || otherGeometry || !binaryType || a.elems.size() != 1 ||
            !objectInRegister(a) || c->elems.size() < static_cast<size_t>(dims == 3 ? 4 : dims)) {
          inst.unsupported = true;  // .p (formatted) accesses and layered surfaces
        }
        return Status::ok();
      }
      case Opcode::kTxq:
      case Opcode::kSuq: {
        if (inst.ops.size() != 2 || inst.ops[0].kind != OpndKind::kReg) return malformed();
        const bool query =
            m.has(Flag::kWidth) || m.has(Flag::kHeight) || m.has(Flag::kDepth) ||
            (in.opcode == Opcode::kTxq &&
             (m.has(Flag::kNormalizedCoords) || m.has(Flag::kFilterMode) ||
              m.has(Flag::kAddrMode0) || m.has(Flag::kAddrMode1) || m.has(Flag::kAddrMode2)));
        if (!query || m.has(Flag::kLevel) || !objectInRegister(inst.ops[1]) ||
            !inst.ops[1].elems.empty()) {
          inst.unsupported = true;
        }
        return Status::ok();
      }
      case Opcode::kIstypep: {
        const bool kind = m.has(Flag::kTexref) || m.has(Flag::kSamplerref) || m.has(Flag::kSurfref);
        if (!kind || inst.ops.size() != 2 || inst.ops[0].kind != OpndKind::kReg) return malformed();
        return Status::ok();
      }
      default:
        inst.unsupported = true;  // sured
        return Status::ok();
    }
  }

  // call{.uni} (ret), f, (args);  call f, (args);  call (ret), %rd, (args), proto;
  Status lowerCall(const ptx::Instruction& in, Inst& inst) {
    const auto& ops = in.operands;
    size_t i = 0;
    Opnd rets;
    rets.kind = OpndKind::kVec;
    if (i < ops.size() && ops[i].kind == OperandKind::kList) {
      ASSIGN_OR_RETURN(rets, lowerOperand(ops[i], in));
      ++i;
    }
    if (i >= ops.size()) return makeError(Code::kInvalidArgument, "line {}: call without target", in.line);
    const ptx::Operand& target = ops[i++];
    Opnd args;
    args.kind = OpndKind::kVec;
    if (i < ops.size() && ops[i].kind == OperandKind::kList) {
      ASSIGN_OR_RETURN(args, lowerOperand(ops[i], in));
      ++i;
    }
    Opnd callee;
    if (target.kind == OperandKind::kSymbol &&
        functionIndex_.count(target.name) && !lookup(target.name)) {
      int32_t index = functionIndex_.at(target.name);
      inst.callee = index;
      const ptx::Function* f = functions_[static_cast<size_t>(index)];
      if (!f->hasBody) {
        if (f->name == "vprintf") {
          inst.builtin = Inst::Builtin::kVprintf;
          if (args.elems.empty()) {
            return makeError(Code::kInvalidArgument, "line {}: vprintf without a format",
                             in.line);
          }
        } else if (f->name == "__assertfail") {
          inst.builtin = Inst::Builtin::kAssertFail;
        } else if (f->name == "malloc") {
          inst.builtin = Inst::Builtin::kMalloc;
        } else if (f->name == "free") {
          inst.builtin = Inst::Builtin::kFree;
        } else {
          return makeError(Code::kNotSupported, "line {}: call to external function {}",
                           in.line, f->name);
        }
      } else if (f->name == instrument::kCheckFunctionName && args.elems.size() == 8 && rets.elems.empty()) {
        auto known = isPhosCheck_.try_emplace(index, false);
        if (known.second) known.first->second = isPhosCheck(*f);
        if (known.first->second) inst.builtin = Inst::Builtin::kPhosCheck;
      }
      callee.kind = OpndKind::kImm;
      callee.imm = static_cast<uint64_t>(index);
    } else {
      ASSIGN_OR_RETURN(callee, lowerOperand(target, in));
    }
    inst.ops.push_back(std::move(rets));
    inst.ops.push_back(std::move(callee));
    inst.ops.push_back(std::move(args));
    return Status::ok();
  }

  Status resolveBranches() {
    for (auto& [pc, label] : branchLabels_) {
      auto it = labels_.find(label);
      if (it == labels_.end()) {
        return makeError(Code::kInvalidArgument, "in {}: branch to undefined label {}",
                         fn_.name, label);
      }
      out_.code[pc].target = it->second;
    }
    // Basic blocks and their successors; exit node = block count.
    const uint32_t n = static_cast<uint32_t>(out_.code.size());
    std::vector<bool> isLeader(n + 1, false);
    isLeader[0] = true;
    for (uint32_t l : leaders_) if (l <= n) isLeader[l] = true;
    for (const auto& [pc, label] : branchLabels_) isLeader[out_.code[pc].target] = true;
    std::vector<uint32_t> blockOf(n + 1, 0);
    std::vector<uint32_t> blockStart;
    for (uint32_t pc = 0; pc < n; ++pc) {
      if (isLeader[pc]) blockStart.push_back(pc);
      blockOf[pc] = static_cast<uint32_t>(blockStart.size() - 1);
    }
    const uint32_t blocks = static_cast<uint32_t>(blockStart.size());
    const uint32_t exitBlock = blocks;
    std::vector<std::vector<uint32_t>> succ(blocks);
    for (uint32_t b = 0; b < blocks; ++b) {
      uint32_t end = b + 1 < blocks ? blockStart[b + 1] : n;
      const Inst& last = out_.code[end - 1];
      auto fallthrough = [&] { succ[b].push_back(end < n ? blockOf[end] : exitBlock); };
      switch (last.op) {
        case ptx::Opcode::kBra:
          succ[b].push_back(blockOf[last.target]);
          if (last.guard >= 0) fallthrough();
          break;
        case ptx::Opcode::kRet: case ptx::Opcode::kExit: case ptx::Opcode::kTrap:
          if (last.guard >= 0) fallthrough(); else succ[b].push_back(exitBlock);
          break;
        default:
          fallthrough();
      }
    }
    std::vector<uint32_t> ipdom = immediatePostDominators(succ);
    for (uint32_t b = 0; b < blocks; ++b) {
      uint32_t end = b + 1 < blocks ? blockStart[b + 1] : n;
      Inst& last = out_.code[end - 1];
      if (last.op == ptx::Opcode::kBra) {
        last.rpc = ipdom[b] == exitBlock ? n : blockStart[ipdom[b]];
      }
    }
    return Status::ok();
  }

  const ptx::Function& fn_;
  Function& out_;
  const std::unordered_map<std::string, Sym>& moduleSyms_;
  const std::unordered_map<std::string, int32_t>& functionIndex_;
  const std::vector<const ptx::Function*>& functions_;
  std::map<int32_t, bool> isPhosCheck_;  // by function index: printed once per function lowered
  std::vector<std::unordered_map<std::string, Sym>> scopes_;
  std::unordered_map<std::string, uint32_t> labels_;
  std::vector<std::pair<uint32_t, std::string>> branchLabels_;
  std::vector<uint32_t> leaders_;
  uint32_t nextReg_ = 0;
  uint32_t localBytes_ = 0;
  uint32_t paramBytes_ = 0;
  uint32_t sharedBytes_ = 0;
  uint32_t sharedBase_ = 0;
};

// ---- mul and add contracted into fma, as ptxas does -----------------------------
// The PTX ISA lets the code generator turn a mul.f32/f64 and an add or sub
// without rounding modifiers into one fused multiply-add, and ptxas does: the
// hardware then rounds once where the PTX, read literally, rounds twice. nvcc
// writes fma.rn itself for most of C++'s a * b + c, but leaves some (`w -= lr
// * g`) as mul and sub, whose result on an H200 is the fused one. vgpu
// contracts the same pairs: a mul whose result only that add or sub reads,
// later in the same block (a validator twin's range checks do not end one),
// with nothing between touching its registers.
bool mentions(const Opnd& o, uint32_t reg) {
  switch (o.kind) {
    case OpndKind::kReg:
      return o.reg == reg;
    case OpndKind::kAddr:
      return o.base == AddrBase::kRegister && o.reg == reg;
    case OpndKind::kVec:
      return std::any_of(o.elems.begin(), o.elems.end(),
                         [&](const Opnd& e) { return mentions(e, reg); });
    default:
      return false;
  }
}

bool mentions(const Inst& in, uint32_t reg) {
  if (in.guard >= 0 && static_cast<uint32_t>(in.guard) == reg) return true;
  return std::any_of(in.ops.begin(), in.ops.end(), [&](const Opnd& o) { return mentions(o, reg); });
}

// A mul, add or sub that the code generator may fuse: f32 or f64, no rounding
// modifier, no saturation, unguarded, registers or immediates.
bool contractible(const Inst& in) {
  if (in.op != ptx::Opcode::kMul && in.op != ptx::Opcode::kAdd && in.op != ptx::Opcode::kSub) {
    return false;
  }
  if (in.type != ptx::Type::kF32 && in.type != ptx::Type::kF64) return false;
  if (in.m.rounding != ptx::Rounding::kNone || in.m.has(ptx::Flag::kSat) || in.guard >= 0 ||
      in.ops.size() != 3 || in.ops[0].kind != OpndKind::kReg) {
    return false;
  }
  return std::all_of(in.ops.begin() + 1, in.ops.end(), [](const Opnd& o) {
    return o.kind == OpndKind::kReg || o.kind == OpndKind::kImm;
  });
}

// Adds `delta` to the count of each register `in` reads (every operand but a
// register destination, and the guard).
void countReads(const Inst& in, std::vector<int>& reads, int delta) {
  auto count = [&](auto&& self, const Opnd& o) -> void {
    if (o.kind == OpndKind::kReg || (o.kind == OpndKind::kAddr && o.base == AddrBase::kRegister)) {
      if (o.reg >= reads.size()) reads.resize(o.reg + 1, 0);
      reads[o.reg] += delta;
    }
    for (const Opnd& e : o.elems) self(self, e);
  };
  for (size_t i = 0; i < in.ops.size(); ++i) {
    if (i == 0 && in.ops[0].kind == OpndKind::kReg) continue;
    count(count, in.ops[i]);
  }
  if (in.guard >= 0) {
    Opnd g;
    g.kind = OpndKind::kReg;
    g.reg = static_cast<uint32_t>(in.guard);
    count(count, g);
  }
}

void contractMulAdd(Function& fn) {
  std::vector<Inst>& code = fn.code;
  const size_t n = code.size();
  std::vector<int> reads(fn.regCount, 0);
  for (const Inst& in : code) countReads(in, reads, 1);
  std::vector<bool> leader(n + 1, false);
  for (size_t pc = 0; pc < n; ++pc) {
    const ptx::Opcode op = code[pc].op;
    if (op == ptx::Opcode::kBra && code[pc].target <= n) leader[code[pc].target] = true;
    // PhOS's range check (a twin's) is transparent: the twin must compute
    // what its original computes, and the check touches no float register.
    const bool check = op == ptx::Opcode::kCall && code[pc].builtin == Inst::Builtin::kPhosCheck;
    if ((op == ptx::Opcode::kBra || op == ptx::Opcode::kCall || op == ptx::Opcode::kRet ||
         op == ptx::Opcode::kExit || op == ptx::Opcode::kTrap) &&
        !check) {
      leader[pc + 1] = true;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    Inst& mul = code[i];
    if (mul.op != ptx::Opcode::kMul || !contractible(mul)) continue;
    const uint32_t d = mul.ops[0].reg;
    // The first instruction after the mul that mentions d, in its block.
    size_t j = i + 1;
    while (j < n && !leader[j] && !mentions(code[j], d)) ++j;
    if (j >= n || leader[j]) continue;
    Inst& add = code[j];
    if ((add.op != ptx::Opcode::kAdd && add.op != ptx::Opcode::kSub) || !contractible(add) ||
        add.type != mul.type || add.m.has(ptx::Flag::kFtz) != mul.m.has(ptx::Flag::kFtz) ||
        add.ops[0].reg == d) {
      continue;
    }
    const bool first = add.ops[1].kind == OpndKind::kReg && add.ops[1].reg == d;
    const bool second = add.ops[2].kind == OpndKind::kReg && add.ops[2].reg == d;
    if (first == second) continue;
    const Opnd other = add.ops[first ? 2 : 1];
    // What the mul read must be unchanged at the add (the fma reads it there);
    // a*b - c reads c at the mul (below), so c too.
    bool untouched = true;
    const bool negateAddend = add.op == ptx::Opcode::kSub && first;
    const Opnd* sources[] = {&mul.ops[1], &mul.ops[2], negateAddend ? &other : &mul.ops[1]};
    for (size_t k = i + 1; k < j && untouched; ++k) {
      for (const Opnd* o : sources) {
        if (o->kind == OpndKind::kReg && mentions(code[k], o->reg)) untouched = false;
      }
    }
    if (!untouched) continue;
    // d read nowhere else: written elsewhere (as a destination) at most.
    if (d >= reads.size() || reads[d] != 1) continue;
    countReads(mul, reads, -1);
    countReads(add, reads, -1);
    // add: fma(a, b, c). c - a*b: the mul becomes d = -a, then fma(d, b, c).
    // a*b - c: d = -c, then fma(a, b, d). neg is exact, and RN is symmetric.
    Inst fma = add;
    fma.op = ptx::Opcode::kFma;
    fma.m.rounding = ptx::Rounding::kRn;
    const Opnd dest = mul.ops[0];
    if (add.op == ptx::Opcode::kAdd) {
      fma.ops = {add.ops[0], mul.ops[1], mul.ops[2], other};
    } else {
      Inst neg = mul;
      neg.op = ptx::Opcode::kNeg;
      neg.ops = {dest, second ? mul.ops[1] : other};
      fma.ops = second ? std::vector<Opnd>{add.ops[0], dest, mul.ops[2], other}
                       : std::vector<Opnd>{add.ops[0], mul.ops[1], mul.ops[2], dest};
      mul = std::move(neg);
    }
    add = std::move(fma);
    countReads(mul, reads, 1);
    countReads(add, reads, 1);
  }
}

}  // namespace

Result<std::unique_ptr<ExecModule>> lowerModule(
    std::shared_ptr<const ptx::Module> module,
    const std::unordered_map<std::string, uint64_t>& globalAddresses) {
  auto code = std::make_unique<ExecModule>();
  std::unordered_map<std::string, Sym> moduleSyms;
  std::unordered_map<std::string, int32_t> functionIndex;
  std::vector<const ptx::Function*> functions;
  uint32_t shared = 0;
  for (const ptx::ModuleItem& item : module->items) {
    if (const auto* f = std::get_if<ptx::Function>(&item)) {
      auto it = functionIndex.find(f->name);
      if (it != functionIndex.end()) {
        // A declaration followed by its definition: keep the definition.
        if (f->hasBody) functions[static_cast<size_t>(it->second)] = f;
        continue;
      }
      functionIndex[f->name] = static_cast<int32_t>(functions.size());
      functions.push_back(f);
    } else if (const auto* d = std::get_if<ptx::VarDecl>(&item)) {
      if (d->space == StateSpace::kGlobal || d->space == StateSpace::kConst) {
        auto it = globalAddresses.find(d->name);
        if (it == globalAddresses.end()) {
          return makeError(Code::kInternal, "global {} was not allocated", d->name);
        }
        moduleSyms[d->name] = {Sym::Kind::kGlobal, it->second};
      } else if (ptx::isSharedSpace(d->space)) {
        if (d->byteSize() == 0) {
          moduleSyms[d->name] = {Sym::Kind::kDynShared, 0};
        } else {
          shared = alignUp(shared, declAlign(*d));
          moduleSyms[d->name] = {Sym::Kind::kShared, shared};
          shared += static_cast<uint32_t>(d->byteSize());
        }
      } else if (!ptx::isParamSpace(d->space)) {
        return makeError(Code::kNotSupported, "line {}: module-scope .{} variable {}",
                         d->line, ptx::name(d->space), d->name);
      }
    }
  }
  // .func-scope shared variables share the module area; kernel-scope ones start
  // after it and may overlap between kernels (one kernel runs per launch).
  code->functions.resize(functions.size());
  std::vector<FunctionLowering> lowerings;
  lowerings.reserve(functions.size());
  for (size_t i = 0; i < functions.size(); ++i) {
    lowerings.emplace_back(*functions[i], code->functions[i], moduleSyms, functionIndex,
                           functions);
  }
  // First the .funcs (their shared goes into the module area), then the kernels.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < functions.size(); ++i) {
      const ptx::Function& f = *functions[i];
      Function& out = code->functions[i];
      if (f.isEntry != (pass == 1)) continue;
      out.name = f.name;
      out.isEntry = f.isEntry;
      out.hasBody = f.hasBody;
      if (!f.hasBody) continue;
      lowerings[i].setSharedBase(pass == 0 ? shared : code->moduleSharedBytes);
      RETURN_IF_ERROR_CTX(lowerings[i].run(), fmt::format("in function {}", f.name));
      contractMulAdd(out);
      if (pass == 0) {
        shared += lowerings[i].scopedSharedBytes();
      } else {
        out.scopedSharedBytes = lowerings[i].scopedSharedBytes();
      }
    }
    if (pass == 0) code->moduleSharedBytes = alignUp(shared, 16);
  }
  code->module = std::move(module);
  return code;
}

}  // namespace phos::vgpu::engine::detail
