// SPDX-License-Identifier: Apache-2.0
// PTX use analysis: which words of a kernel's parameter buffer form addresses of
// global memory, and whether the kernel reads or writes through them.
//
// A taint analysis, flow-insensitive per function (each register, local-memory
// slot and call parameter holds the union of everything ever assigned to it), run
// to a fixpoint. Flow-insensitivity only over-approximates, which is the safe
// direction: a missed write breaks a checkpoint, an extra one costs a copy.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "internal/declaration.h"
#include "phos/instrument/signature.h"
#include "phos/ptx/params.h"
#include "phos/ptx/resolve.h"

namespace phos::instrument {
namespace {

using ptx::Function;
using ptx::Instruction;
using ptx::Opcode;
using ptx::Operand;
using ptx::OperandKind;
using ptx::StateSpace;

// An offset into a local frame that is not a known constant.
constexpr int64_t kAnyOffset = std::numeric_limits<int64_t>::min();
// More distinct offsets than this into one frame from one register: give up on
// offsets (keeps loops that walk a local array from growing the set forever).
constexpr size_t kMaxOffsetsPerFrame = 16;
// Deeper call chains are treated like calls to unknown code (recursion whose
// arguments change at every level would otherwise never end).
constexpr size_t kMaxCallDepth = 24;

// What a value may be derived from.
struct Taint {
  std::set<uint32_t> words;    // indices into the kernel's pointer words
  std::set<uint32_t> globals;  // module variables, by interned index
  // (frame, offset): a local-memory address. A frame is one .local variable of one
  // analysed (function, arguments) pair; recursive activations share it, which
  // only unions what they store.
  std::set<std::pair<uint32_t, int64_t>> locals;
  bool unknown = false;     // may be a pointer from memory or unknown code
  bool partial = false;     // a narrow value read from memory: an index, or half a pointer
  bool shared = false;      // an address in the shared window: never global memory
  bool paramSpace = false;  // the address of a parameter (cvta.param, mov of a param)

  bool empty() const {
    return words.empty() && globals.empty() && locals.empty() && !unknown && !partial &&
           !shared && !paramSpace;
  }
  // Whether the value can name a global buffer the analysis knows of.
  bool named() const { return !words.empty() || !globals.empty(); }

  // Adds `o`; whether anything changed. Widening may replace offsets by
  // kAnyOffset, so locals are compared as sets, not by size.
  bool merge(const Taint& o) {
    size_t before = words.size() + globals.size();
    bool flagsBefore[4] = {unknown, partial, shared, paramSpace};
    words.insert(o.words.begin(), o.words.end());
    globals.insert(o.globals.begin(), o.globals.end());
    bool localsChanged = false;
    if (!o.locals.empty()) {
      std::set<std::pair<uint32_t, int64_t>> localsBefore = locals;
      locals.insert(o.locals.begin(), o.locals.end());
      widen();
      localsChanged = locals != localsBefore;
    }
    unknown |= o.unknown;
    partial |= o.partial;
    shared |= o.shared;
    paramSpace |= o.paramSpace;
    return localsChanged || before != words.size() + globals.size() ||
           flagsBefore[0] != unknown || flagsBefore[1] != partial ||
           flagsBefore[2] != shared || flagsBefore[3] != paramSpace;
  }

  // Collapses a frame with too many offsets, or with kAnyOffset among others, to
  // kAnyOffset alone.
  void widen() {
    std::map<uint32_t, size_t> counts;
    std::set<uint32_t> any;
    for (const auto& [f, o] : locals) {
      ++counts[f];
      if (o == kAnyOffset) any.insert(f);
    }
    for (const auto& [f, n] : counts) {
      if (n > kMaxOffsetsPerFrame) any.insert(f);
    }
    bool collapse = false;
    for (uint32_t f : any) collapse |= counts[f] > 1;
    if (!collapse) return;
    std::set<std::pair<uint32_t, int64_t>> out;
    for (const auto& [f, o] : locals) out.emplace(f, any.count(f) ? kAnyOffset : o);
    locals = std::move(out);
  }

  // The value plus a constant: local offsets move with it.
  Taint shifted(int64_t delta) const {
    Taint t = *this;
    t.locals.clear();
    for (const auto& [f, o] : locals) {
      t.locals.emplace(f, o == kAnyOffset ? kAnyOffset : o + delta);
    }
    return t;
  }
  // The value combined with something unknown: local offsets are lost.
  Taint anyOffset() const {
    Taint t = *this;
    t.locals.clear();
    for (const auto& [f, o] : locals) t.locals.emplace(f, kAnyOffset);
    return t;
  }

  friend bool operator==(const Taint&, const Taint&) = default;
  friend bool operator<(const Taint& a, const Taint& b) {
    return std::tie(a.words, a.globals, a.locals, a.unknown, a.partial, a.shared,
                    a.paramSpace) < std::tie(b.words, b.globals, b.locals, b.unknown,
                                             b.partial, b.shared, b.paramSpace);
  }
};

// A pointer-capable word of the kernel's parameter buffer.
struct WordRef {
  uint32_t param = 0;
  uint32_t offset = 0;  // in the buffer
};

// What the kernel (with every function it calls) does; only ever grows.
struct Effects {
  std::vector<Access> wordAccess;
  std::vector<bool> wordEscapes;
  std::map<uint32_t, Access> globalAccess;
  Access indirect = Access::kNone;
};

struct Slot {
  uint32_t size = 0;
  Taint taint;
};

// The state of one analysis of one function with one set of argument taints.
struct FunctionFacts {
  std::unordered_map<std::string, Taint> regs;
  std::map<const ptx::VarDecl*, Taint> paramSlots;  // .param variables of call sequences
  std::set<uint32_t> ownFrames;  // the local variables this function declares
  std::vector<Taint> returns;
  bool changed = false;
};

class KernelAnalysis {
 public:
  KernelAnalysis(const ptx::Module& module, const Function& kernel,
                 std::vector<WordRef> words, const ptx::ParamLayout& layout,
                 std::unordered_map<const Function*, std::unique_ptr<ptx::ResolvedFunction>>& resolved,
                 std::vector<std::string>& globalNames,
                 std::map<std::string, uint32_t, std::less<>>& globalIds)
      : module_(module),
        kernel_(kernel),
        words_(std::move(words)),
        layout_(layout),
        resolved_(resolved),
        globalNames_(globalNames),
        globalIds_(globalIds) {
    effects_.wordAccess.assign(words_.size(), Access::kNone);
    effects_.wordEscapes.assign(words_.size(), false);
  }

  Status run() {
    ASSIGN_OR_RETURN(const ptx::ResolvedFunction* rf, resolve(kernel_));
    std::vector<Taint> noArgs;
    // First to a fixpoint of every taint, then again recording what the
    // converged taints say (memoized callees are re-swept once for that).
    recording_ = false;
    Result<std::vector<Taint>> r = analyzeFunction(*rf, noArgs, 0);
    if (!r.isOk()) return r.status();
    recording_ = true;
    r = analyzeFunction(*rf, noArgs, 0);
    if (!r.isOk()) return r.status();
    return Status::ok();
  }

  const Effects& effects() const { return effects_; }

 private:
  // --- Effects ----------------------------------------------------------------

  // Effects are only recorded in the last sweep, over the converged state: an
  // address whose taint is still incomplete in an early sweep would otherwise
  // read as indirect (no name yet) although it is not.
  void addAccess(Access& a, Access b) {
    if (recording_) a = a | b;
  }

  // A global/generic memory access at an address with taint `t`.
  void touchMemory(const Taint& t, Access a) {
    for (uint32_t w : t.words) addAccess(effects_.wordAccess[w], a);
    for (uint32_t g : t.globals) addAccess(effects_.globalAccess[g], a);
    if (t.unknown || !t.named()) {
      if (trace_ && recording_) {
        std::fprintf(stderr,
                     "phos signatures: %s: indirect %s at line %u (address: %zu words, %zu "
                     "globals, %zu locals%s%s)\n",
                     kernel_.name.c_str(), std::string(name(a)).c_str(),
                     current_ ? current_->line : 0, t.words.size(), t.globals.size(),
                     t.locals.size(), t.unknown ? ", from memory" : "",
                     t.shared ? ", shared" : "");
      }
      addAccess(effects_.indirect, a);
    }
  }

  // The value reaches memory or code the analysis does not follow.
  void escape(const Taint& t) {
    if (recording_) {
      for (uint32_t w : t.words) effects_.wordEscapes[w] = true;
    }
    for (uint32_t g : t.globals) addAccess(effects_.globalAccess[g], Access::kReadWrite);
    for (const auto& [frame, offset] : t.locals) {
      (void)offset;
      // A frame's address got away: whatever it holds escapes with it, and
      // anything may be written there.
      if (escapedFrames_.insert(frame).second) ++storeVersion_;
      if (clobbered_.insert(frame).second) ++storeVersion_;
    }
  }

  // --- Names ----------------------------------------------------------------

  Result<const ptx::ResolvedFunction*> resolve(const Function& fn) {
    auto it = resolved_.find(&fn);
    if (it != resolved_.end()) return it->second.get();
    Result<ptx::ResolvedFunction> r = ptx::ResolvedFunction::build(fn, &module_);
    if (!r.isOk()) {
      return std::move(r).status().withContext("use analysis of " + fn.name);
    }
    auto owned = std::make_unique<ptx::ResolvedFunction>(std::move(r).value());
    const ptx::ResolvedFunction* p = owned.get();
    resolved_.emplace(&fn, std::move(owned));
    return p;
  }

  uint32_t globalId(std::string_view name) {
    auto it = globalIds_.find(name);
    if (it != globalIds_.end()) return it->second;
    uint32_t id = static_cast<uint32_t>(globalNames_.size());
    globalNames_.emplace_back(name);
    globalIds_.emplace(std::string(name), id);
    return id;
  }

  uint32_t frameId(FunctionFacts& f, uint64_t instance, const std::string& name) {
    auto key = std::make_pair(instance, name);
    auto it = frameIds_.find(key);
    uint32_t id = 0;
    if (it != frameIds_.end()) {
      id = it->second;
    } else {
      id = nextFrame_++;
      frameIds_.emplace(std::move(key), id);
    }
    if (f.ownFrames.insert(id).second) f.changed = true;
    return id;
  }

  // --- One function -----------------------------------------------------------

  struct Context {
    const ptx::ResolvedFunction& rf;
    const std::vector<Taint>& args;
    FunctionFacts& f;
    uint64_t instance;
    uint32_t scope = 0;
  };

  Result<std::vector<Taint>> analyzeFunction(const ptx::ResolvedFunction& rf,
                                             const std::vector<Taint>& args, uint64_t instance) {
    FunctionFacts facts;
    facts.returns.resize(rf.function().returnParams.size());
    Context cx{rf, args, facts, instance};
    // Flow-insensitive: sweep every instruction until nothing grows, here or in
    // local memory (which callees share). Each sweep only adds to finite sets.
    // Then, when recording, one more sweep over the converged state.
    bool record = recording_;
    recording_ = false;
    do {
      RETURN_IF_ERROR(sweep(cx));
    } while (facts.changed);
    if (record) {
      recording_ = true;
      RETURN_IF_ERROR(sweep(cx));
    }
    recording_ = record;
    return facts.returns;
  }

  Status sweep(Context& cx) {
    cx.f.changed = false;
    uint64_t version = storeVersion_;
    for (const ptx::FlatInstruction& fi : cx.rf.instructions()) {
      cx.scope = fi.scope;
      current_ = fi.inst;
      RETURN_IF_ERROR(step(cx, *fi.inst));
    }
    // Contents of an escaped frame escape too; done here because they grow.
    for (uint32_t frame : std::set<uint32_t>(escapedFrames_)) {
      for (auto& [off, slot] : frames_[frame]) escape(slot.taint);
    }
    cx.f.changed |= version != storeVersion_;
    return Status::ok();
  }

  void setReg(Context& cx, const std::string& name, const Taint& t) {
    if (name.empty() || ptx::specialRegister(name)) return;
    cx.f.changed |= cx.f.regs[name].merge(t);
  }

  // The register an operand names, if it is one (inline asm declares registers
  // without the '%' sigil; those parse as symbols).
  std::optional<std::string> registerName(const Context& cx, const Operand& o) {
    if (o.kind == OperandKind::kRegister) return o.name;
    if (o.kind == OperandKind::kSymbol || (o.kind == OperandKind::kAddress && o.addressIsSymbol)) {
      const ptx::VarDecl* d = cx.rf.findDecl(o.name, cx.scope);
      if (d && d->space == StateSpace::kReg) return o.name;
    }
    return std::nullopt;
  }

  void setDest(Context& cx, const Operand& o, const Taint& t) {
    switch (o.kind) {
      case OperandKind::kRegister:
        setReg(cx, o.name, t);
        break;
      case OperandKind::kVector:
      case OperandKind::kPredPair:
        for (const Operand& e : o.elements) setDest(cx, e, t);
        break;
      case OperandKind::kSymbol:
        if (auto r = registerName(cx, o)) setReg(cx, *r, t);
        break;
      default:
        break;
    }
  }

  Taint regTaint(Context& cx, const std::string& name) {
    if (ptx::specialRegister(name)) return {};
    auto it = cx.f.regs.find(name);
    return it == cx.f.regs.end() ? Taint{} : it->second;
  }

  // The taint of a symbol used as a value or an address base (`mov %rd, g`, `[g+4]`).
  Taint symbolTaint(Context& cx, const std::string& name, int64_t offset) {
    Taint t;
    const ptx::VarDecl* d = cx.rf.findDecl(name, cx.scope);
    if (!d) d = module_.findVariable(name);
    if (!d) {
      // A function or label address: an integer as far as memory goes.
      if (module_.findFunction(name)) return t;
      t.unknown = true;
      return t;
    }
    switch (d->space) {
      case StateSpace::kReg:
        return regTaint(cx, name).shifted(offset);
      case StateSpace::kGlobal:
      case StateSpace::kConst:
        t.globals.insert(globalId(name));
        return t;
      case StateSpace::kLocal:
        t.locals.emplace(frameId(cx.f, cx.instance, name), offset);
        return t;
      case StateSpace::kParam:
      case StateSpace::kParamEntry:
      case StateSpace::kParamFunc:
        t.paramSpace = true;
        return t;
      default:
        if (isSharedSpace(d->space)) {
          t.shared = true;
          return t;
        }
        t.unknown = true;
        return t;
    }
  }

  Taint operandTaint(Context& cx, const Operand& o) {
    switch (o.kind) {
      case OperandKind::kRegister:
        return regTaint(cx, o.name);
      case OperandKind::kSymbol:
        return symbolTaint(cx, o.name, o.value);
      case OperandKind::kAddress:
        if (o.name.empty()) return {};  // [imm]: an absolute address
        if (o.addressIsSymbol) return symbolTaint(cx, o.name, o.value);
        return regTaint(cx, o.name).shifted(o.value);
      case OperandKind::kVector:
      case OperandKind::kList:
      case OperandKind::kPredPair: {
        Taint t;
        for (const Operand& e : o.elements) t.merge(operandTaint(cx, e));
        return t;
      }
      default:
        return {};
    }
  }

  // What a load from global/shared/const memory yields: nothing the analysis can
  // name. A full-width value may be a pointer; a narrower one is an index, or
  // half a pointer that only becomes one when two halves are combined.
  Taint loadedValue(uint32_t elemSize) const {
    Taint t;
    uint32_t pointerSize = module_.addressSize == 32 ? 4 : 8;
    if (elemSize >= pointerSize || elemSize == 0) t.unknown = true;
    else t.partial = true;
    return t;
  }

  // --- Local memory (the spill slots of -G code) ----------------------------

  Taint loadLocal(Context& cx, const Taint& addr, uint32_t size, bool anyLocal) {
    Taint out;
    auto readFrame = [&](uint32_t frame, int64_t off) {
      if (clobbered_.count(frame)) out.unknown = true;
      auto it = frames_.find(frame);
      if (it == frames_.end()) return;
      for (const auto& [o, slot] : it->second) {
        bool overlaps = off == kAnyOffset || o == kAnyOffset ||
                        (o < off + static_cast<int64_t>(size) &&
                         off < o + static_cast<int64_t>(slot.size));
        if (overlaps) out.merge(slot.taint);
      }
    };
    for (const auto& [frame, off] : addr.locals) readFrame(frame, off);
    if (anyLocal) {
      // .local access at an address we cannot place: any of our frames.
      for (uint32_t frame : cx.f.ownFrames) readFrame(frame, kAnyOffset);
      out.unknown = true;
    }
    return out;
  }

  void storeLocal(Context& cx, const Taint& addr, uint32_t size, const Taint& value,
                  bool anyLocal) {
    auto writeFrame = [&](uint32_t frame, int64_t off) {
      Slot& s = frames_[frame][off];
      if (s.size < size) {
        s.size = size;
        ++storeVersion_;
      }
      if (s.taint.merge(value)) ++storeVersion_;
    };
    for (const auto& [frame, off] : addr.locals) writeFrame(frame, off);
    if (anyLocal) {
      if (cx.f.ownFrames.empty()) escape(value);
      for (uint32_t frame : std::set<uint32_t>(cx.f.ownFrames)) writeFrame(frame, kAnyOffset);
    }
  }

  // --- Parameters -------------------------------------------------------------

  // Index of `d` among the function's parameters (or return parameters).
  static std::optional<size_t> indexIn(const std::vector<ptx::VarDecl>& list,
                                       const ptx::VarDecl* d) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (&list[i] == d || list[i].name == d->name) return i;
    }
    return std::nullopt;
  }

  Taint kernelParamTaint(size_t param, int64_t off, uint32_t size) {
    Taint t;
    const ptx::ParamInfo& p = layout_.params[param];
    int64_t begin = static_cast<int64_t>(p.offset) + off;
    int64_t end = begin + size;
    for (size_t w = 0; w < words_.size(); ++w) {
      int64_t wb = words_[w].offset;
      if (wb < end && begin < wb + 8) t.words.insert(static_cast<uint32_t>(w));
    }
    return t;
  }

  Taint allParams(Context& cx) {
    Taint t;
    if (cx.rf.function().isEntry) {
      for (size_t w = 0; w < words_.size(); ++w) t.words.insert(static_cast<uint32_t>(w));
    } else {
      for (const Taint& a : cx.args) t.merge(a);
    }
    for (const auto& [d, s] : cx.f.paramSlots) t.merge(s);
    return t;
  }

  Taint loadParam(Context& cx, const Operand& addr, uint32_t size) {
    const Function& fn = cx.rf.function();
    if (addr.kind != OperandKind::kAddress || !addr.addressIsSymbol) return allParams(cx);
    const ptx::VarDecl* d = cx.rf.findDecl(addr.name, cx.scope);
    if (!d) return allParams(cx);
    if (auto i = indexIn(fn.params, d)) {
      if (fn.isEntry) return kernelParamTaint(*i, addr.value, size);
      if (*i < cx.args.size()) return cx.args[*i];
      Taint t;
      t.unknown = true;
      return t;
    }
    if (auto i = indexIn(fn.returnParams, d)) return cx.f.returns[*i];
    return cx.f.paramSlots[d];
  }

  void storeParam(Context& cx, const Operand& addr, const Taint& value) {
    const Function& fn = cx.rf.function();
    const ptx::VarDecl* d = addr.kind == OperandKind::kAddress && addr.addressIsSymbol
                                ? cx.rf.findDecl(addr.name, cx.scope)
                                : nullptr;
    if (!d) {
      escape(value);
      return;
    }
    if (auto i = indexIn(fn.returnParams, d)) {
      cx.f.changed |= cx.f.returns[*i].merge(value);
      return;
    }
    if (indexIn(fn.params, d)) {
      // Writing one's own incoming parameter is not something compilers emit;
      // losing track of the value is the safe reading.
      escape(value);
      return;
    }
    cx.f.changed |= cx.f.paramSlots[d].merge(value);
  }

  // --- Memory instructions --------------------------------------------------

  // A load or store of `elemSize`-byte elements at `addrOp`, in `space`.
  // Returns the loaded value for loads.
  Taint memoryOp(Context& cx, StateSpace space, const Operand& addrOp, Access access,
                 uint32_t elemSize, uint32_t count, const Operand* valueOp) {
    Taint addr = operandTaint(cx, addrOp);
    Taint loaded;
    bool trackedStore = false;
    uint32_t bytes = elemSize * std::max<uint32_t>(count, 1);

    if (isParamSpace(space)) {
      if (reads(access)) loaded.merge(loadParam(cx, addrOp, bytes));
      if (writes(access) && valueOp) storeParam(cx, addrOp, operandTaint(cx, *valueOp));
      return loaded;
    }
    if (isSharedSpace(space)) {
      if (reads(access)) loaded.merge(loadedValue(elemSize));
    } else if (space == StateSpace::kConst) {
      // __constant__ variables are module globals the checkpoint saves too.
      for (uint32_t g : addr.globals) addAccess(effects_.globalAccess[g], Access::kRead);
      for (uint32_t w : addr.words) addAccess(effects_.wordAccess[w], Access::kRead);
      if (!addr.named()) addAccess(effects_.indirect, Access::kRead);
      if (reads(access)) loaded.merge(loadedValue(elemSize));
    } else if (space == StateSpace::kLocal) {
      trackedStore = true;
      bool anyLocal = addr.locals.empty();
      if (reads(access)) {
        loaded.merge(elementwiseLocalLoad(cx, addr, elemSize, count, anyLocal));
      }
      if (writes(access) && valueOp) {
        elementwiseLocalStore(cx, addr, elemSize, *valueOp, anyLocal);
      }
      return loaded;
    } else {
      // Global, or generic: a generic address derived from a local or shared
      // window is not global memory; anything else may be.
      bool generic = space == StateSpace::kNone;
      bool local = generic && !addr.locals.empty();
      // A narrow value from memory added to a local/shared base is an index.
      bool global = !generic || addr.named() || addr.unknown ||
                    (!local && !addr.shared && !addr.paramSpace);
      if (global) {
        touchMemory(addr, access);
        if (reads(access)) loaded.merge(loadedValue(elemSize));
      }
      if (local) {
        trackedStore = !global;
        if (reads(access)) loaded.merge(elementwiseLocalLoad(cx, addr, elemSize, count, false));
        if (writes(access) && valueOp) elementwiseLocalStore(cx, addr, elemSize, *valueOp, false);
      }
      if (generic && addr.paramSpace && reads(access)) loaded.merge(allParams(cx));
      if (generic && addr.shared && reads(access)) loaded.merge(loadedValue(elemSize));
    }
    if (writes(access) && valueOp && !trackedStore) escape(operandTaint(cx, *valueOp));
    return loaded;
  }

  Taint elementwiseLocalLoad(Context& cx, const Taint& addr, uint32_t elemSize, uint32_t count,
                             bool anyLocal) {
    Taint out;
    for (uint32_t i = 0; i < std::max<uint32_t>(count, 1); ++i) {
      out.merge(loadLocal(cx, addr.shifted(int64_t{i} * elemSize), elemSize, anyLocal));
    }
    return out;
  }

  void elementwiseLocalStore(Context& cx, const Taint& addr, uint32_t elemSize,
                             const Operand& valueOp, bool anyLocal) {
    if (valueOp.kind == OperandKind::kVector) {
      for (size_t i = 0; i < valueOp.elements.size(); ++i) {
        storeLocal(cx, addr.shifted(static_cast<int64_t>(i * elemSize)), elemSize,
                   operandTaint(cx, valueOp.elements[i]), anyLocal);
      }
      return;
    }
    storeLocal(cx, addr, elemSize, operandTaint(cx, valueOp), anyLocal);
  }

  // Loads whose vector destination gets one element per slot: a spilled 64-bit
  // pointer reloaded as two halves keeps its words in both.
  void loadInto(Context& cx, const Instruction& in, StateSpace space, const Operand& dst,
                const Operand& addrOp) {
    uint32_t elemSize = ptx::typeSize(in.m.type());
    if (dst.kind == OperandKind::kVector) {
      Taint addr = operandTaint(cx, addrOp);
      bool localOnly =
          space == StateSpace::kLocal ||
          (space == StateSpace::kNone && !addr.locals.empty() && !addr.named() &&
           !addr.unknown && !addr.partial);
      if (localOnly) {
        for (size_t i = 0; i < dst.elements.size(); ++i) {
          Operand shiftedAddr = addrOp;
          shiftedAddr.value += static_cast<int64_t>(i * elemSize);
          Taint t = memoryOp(cx, space, shiftedAddr, Access::kRead, elemSize, 1, nullptr);
          setDest(cx, dst.elements[i], t);
        }
        return;
      }
    }
    uint32_t count = dst.kind == OperandKind::kVector
                         ? static_cast<uint32_t>(dst.elements.size())
                         : 1;
    Taint t = memoryOp(cx, space, addrOp, Access::kRead, elemSize, count, nullptr);
    setDest(cx, dst, t);
  }

  // --- Calls ------------------------------------------------------------------

  struct CallShape {
    const Operand* rets = nullptr;
    const Operand* target = nullptr;
    const Operand* args = nullptr;
  };
  static CallShape callShape(const Instruction& in) {
    CallShape c;
    size_t i = 0;
    const auto& ops = in.operands;
    if (i < ops.size() && ops[i].kind == OperandKind::kList) c.rets = &ops[i++];
    if (i < ops.size()) c.target = &ops[i++];
    if (i < ops.size() && ops[i].kind == OperandKind::kList) c.args = &ops[i++];
    return c;
  }

  Taint argumentTaint(Context& cx, const Operand& a) {
    if (a.kind == OperandKind::kSymbol) {
      const ptx::VarDecl* d = cx.rf.findDecl(a.name, cx.scope);
      if (d && isParamSpace(d->space)) {
        const Function& fn = cx.rf.function();
        if (auto i = indexIn(fn.params, d)) {
          if (fn.isEntry) return kernelParamTaint(*i, 0, layout_.params[*i].size);
          return *i < cx.args.size() ? cx.args[*i] : Taint{};
        }
        return cx.f.paramSlots[d];
      }
    }
    return operandTaint(cx, a);
  }

  void setReturn(Context& cx, const Operand& r, const Taint& t) {
    if (r.kind == OperandKind::kSymbol) {
      const ptx::VarDecl* d = cx.rf.findDecl(r.name, cx.scope);
      if (d && isParamSpace(d->space)) {
        cx.f.changed |= cx.f.paramSlots[d].merge(t);
        return;
      }
    }
    setDest(cx, r, t);
  }

  // Reads through `t` when it names something (the strings of printf/assert).
  void readsThrough(const Taint& t) {
    if (t.named() || t.unknown) touchMemory(t, Access::kRead);
  }

  // A callee without a body or an indirect call: what it gets escapes, it may
  // touch memory nobody can name, and what it returns is unknown.
  void unknownCall(const std::string& callee, const std::vector<Taint>& args,
                   std::vector<Taint>& rets) {
    for (Taint& r : rets) r.unknown = true;
    if (callee == "vprintf") {
      // vprintf(format, args): reads the format and the packed argument buffer
      // (a %s argument is dereferenced); writes nothing.
      if (!args.empty()) readsThrough(args[0]);
      if (args.size() > 1) {
        const Taint& buf = args[1];
        for (const auto& [frame, off] : buf.locals) {
          // The argument buffer starts at `off`; other locals of the frame are
          // not printed.
          for (const auto& [o, slot] : frames_[frame]) {
            if (off == kAnyOffset || o == kAnyOffset || o >= off) readsThrough(slot.taint);
          }
        }
        Taint nonLocal = buf;
        nonLocal.locals.clear();
        readsThrough(nonLocal);
      }
      return;
    }
    if (callee == "malloc") return;  // a fresh heap block: returned as unknown
    if (callee == "__assertfail" || callee == "__assert_fail") {
      for (const Taint& a : args) readsThrough(a);
      return;
    }
    if (callee == "free") {
      for (const Taint& a : args) {
        for (uint32_t w : a.words) addAccess(effects_.wordAccess[w], Access::kWrite);
      }
      return;
    }
    for (const Taint& a : args) escape(a);
    if (trace_ && recording_) {
      std::fprintf(stderr, "phos signatures: %s: calls %s (no body) at line %u\n",
                   kernel_.name.c_str(), callee.empty() ? "through a register" : callee.c_str(),
                   current_ ? current_->line : 0);
    }
    addAccess(effects_.indirect, Access::kReadWrite);
  }

  // The function with a body named `name` (a module may declare it first and
  // define it later), else its declaration.
  const Function* definition(std::string_view name) const {
    const Function* decl = nullptr;
    for (const ptx::ModuleItem& item : module_.items) {
      const auto* f = std::get_if<Function>(&item);
      if (!f || f->name != name) continue;
      if (f->hasBody) return f;
      decl = f;
    }
    return decl;
  }

  Status call(Context& cx, const Instruction& in) {
    CallShape shape = callShape(in);
    std::vector<Taint> args;
    if (shape.args) {
      for (const Operand& a : shape.args->elements) args.push_back(argumentTaint(cx, a));
    }
    size_t retCount = shape.rets ? shape.rets->elements.size() : 0;
    std::vector<Taint> rets(retCount);

    const Function* callee = nullptr;
    std::string calleeName;
    if (shape.target && shape.target->kind == OperandKind::kSymbol) {
      calleeName = shape.target->name;
      callee = definition(calleeName);
    }
    bool known = (!callee || !callee->hasBody) && (calleeName == "vprintf" || calleeName == "malloc" || calleeName == "free" ||
                 calleeName == "__assertfail" || calleeName == "__assert_fail");
    if (callee && callee->hasBody && callStack_.size() < kMaxCallDepth && !known) {
      // Local addresses handed down need nothing here: callees read and write
      // the same frame store.
      ASSIGN_OR_RETURN(std::vector<Taint> r, analyzeCall(*callee, args));
      for (size_t i = 0; i < rets.size() && i < r.size(); ++i) rets[i] = r[i];
    } else {
      unknownCall(callee && callee->hasBody ? std::string() : calleeName, args, rets);
    }
    for (size_t i = 0; i < retCount; ++i) setReturn(cx, shape.rets->elements[i], rets[i]);
    return Status::ok();
  }

  // Memoized per (function, argument taints); a recursive call sees the summary
  // computed so far and the outer analysis reruns until that summary is stable.
  Result<std::vector<Taint>> analyzeCall(const Function& fn, const std::vector<Taint>& args) {
    auto key = std::make_pair(&fn, args);
    auto it = memo_.find(key);
    if (it != memo_.end()) {
      if (it->second.inProgress) {
        it->second.usedEarly = true;
        return it->second.returns;
      }
      // Computed before local memory last grew: what it loads may have changed.
      // When recording, each callee is swept once more for its effects.
      bool needRecord = recording_ && !it->second.recorded;
      if (it->second.version == storeVersion_ && !needRecord) return it->second.returns;
    } else {
      memo_[key] = Summary{false, false, std::vector<Taint>(fn.returnParams.size()), 0,
                           nextInstance_++, false};
    }
    ASSIGN_OR_RETURN(const ptx::ResolvedFunction* rf, resolve(fn));
    memo_[key].inProgress = true;
    uint64_t instance = memo_[key].instance;
    callStack_.push_back(&fn);
    for (;;) {
      memo_[key].usedEarly = false;
      Result<std::vector<Taint>> r = analyzeFunction(*rf, args, instance);
      if (!r.isOk()) {
        callStack_.pop_back();
        return r.status();
      }
      Summary& s = memo_[key];
      bool grew = false;
      for (size_t i = 0; i < s.returns.size() && i < r->size(); ++i) {
        grew |= s.returns[i].merge((*r)[i]);
      }
      if (!s.usedEarly || !grew) break;
    }
    callStack_.pop_back();
    memo_[key].inProgress = false;
    memo_[key].version = storeVersion_;
    if (recording_) memo_[key].recorded = true;
    return memo_[key].returns;
  }

  // --- The transfer function --------------------------------------------------

  static bool hasMod(const Instruction& in, std::string_view mod) {
    for (const ptx::Mod& m : in.mods) {
      if (ptx::modName(m) == mod) return true;
    }
    return false;
  }

  Status step(Context& cx, const Instruction& in) {
    const auto& ops = in.operands;
    const StateSpace space = in.m.space;
    switch (in.opcode) {
      case Opcode::kLd:
      case Opcode::kLdu:
        if (ops.size() >= 2) loadInto(cx, in, space, ops[0], ops[1]);
        return Status::ok();
      case Opcode::kSt:
        if (ops.size() >= 2) {
          uint32_t count = ops[1].kind == OperandKind::kVector
                               ? static_cast<uint32_t>(ops[1].elements.size())
                               : 1;
          memoryOp(cx, space, ops[0], Access::kWrite, ptx::typeSize(in.m.type()), count,
                   &ops[1]);
        }
        return Status::ok();
      case Opcode::kAtom: {
        if (ops.size() < 2) return Status::ok();
        // atom d, [a], b (, c): the old value comes back, b/c are stored.
        Taint old = memoryOp(cx, space, ops[1], Access::kReadWrite, ptx::typeSize(in.m.type()),
                             1, nullptr);
        for (size_t i = 2; i < ops.size(); ++i) escape(operandTaint(cx, ops[i]));
        setDest(cx, ops[0], old);
        return Status::ok();
      }
      case Opcode::kRed:
        if (ops.empty()) return Status::ok();
        memoryOp(cx, space, ops[0], Access::kReadWrite, ptx::typeSize(in.m.type()), 1, nullptr);
        for (size_t i = 1; i < ops.size(); ++i) escape(operandTaint(cx, ops[i]));
        return Status::ok();
      case Opcode::kPrefetch:
      case Opcode::kPrefetchu:
      case Opcode::kApplypriority:
        return Status::ok();  // hints: no data moves
      case Opcode::kDiscard:
        // "the cache line's contents become undefined": as good as a write.
        if (!ops.empty()) memoryOp(cx, space, ops[0], Access::kWrite, 1, 1, nullptr);
        return Status::ok();
      case Opcode::kCp:
        return copyAsync(cx, in);
      case Opcode::kCall:
        return call(cx, in);
      case Opcode::kTex:
      case Opcode::kTld4:
      case Opcode::kSuld:
        // Texture/surface handles name CUarrays, not allocations speculation sees.
        addAccess(effects_.indirect, Access::kRead);
        if (!ops.empty()) setDest(cx, ops[0], loadedValue(4));
        return Status::ok();
      case Opcode::kSust:
      case Opcode::kSured:
        addAccess(effects_.indirect, in.opcode == Opcode::kSust ? Access::kWrite
                                                                : Access::kReadWrite);
        for (const Operand& o : ops) escape(operandTaint(cx, o));
        return Status::ok();
      case Opcode::kMov:
      case Opcode::kCvta:
      case Opcode::kCvt:
        if (ops.size() >= 2) setDest(cx, ops[0], moveTaint(cx, in, ops[0], ops[1]));
        return Status::ok();
      case Opcode::kSetp:
      case Opcode::kSet:
      case Opcode::kVote:
      case Opcode::kActivemask:
      case Opcode::kIsspacep:
      case Opcode::kIstypep:
      case Opcode::kTestp:
        return Status::ok();  // a predicate or a 0/1 flag cannot carry an address
      case Opcode::kAlloca:
      case Opcode::kStacksave:
        if (!ops.empty()) {
          Taint t;
          t.locals.emplace(frameId(cx.f, cx.instance, "%alloca"), kAnyOffset);
          setDest(cx, ops[0], t);
        }
        return Status::ok();
      case Opcode::kBra:
      case Opcode::kBrx:
      case Opcode::kRet:
      case Opcode::kExit:
      case Opcode::kTrap:
      case Opcode::kBar:
      case Opcode::kBarrier:
      case Opcode::kMembar:
      case Opcode::kFence:
      case Opcode::kNanosleep:
      case Opcode::kGriddepcontrol:
      case Opcode::kPmevent:
      case Opcode::kSetmaxnreg:
      case Opcode::kStackrestore:
      case Opcode::kBrkpt:
        return Status::ok();
      default:
        return arithmetic(cx, in);
    }
  }

  Taint moveTaint(Context& cx, const Instruction& in, const Operand& dst, const Operand& src) {
    if (dst.kind == OperandKind::kVector) {
      // Unpacking: each half carries the whole value's origin.
      return operandTaint(cx, src);
    }
    Taint t = operandTaint(cx, src);
    if (src.kind == OperandKind::kVector) {
      // Packing halves read from memory rebuilds a pointer.
      if (t.partial) t.unknown = true;
      t = t.anyOffset();
    }
    if (in.opcode == Opcode::kCvta && isSharedSpace(in.m.space) && !hasMod(in, "to")) {
      t.shared = true;
    }
    return t;
  }

  // cp.async / cp.async.bulk / cp.reduce.async.bulk: [dst], [src] in the first
  // and second state space written.
  Status copyAsync(Context& cx, const Instruction& in) {
    std::vector<const Operand*> addrs;
    for (const Operand& o : in.operands) {
      if (o.kind == OperandKind::kAddress) addrs.push_back(&o);
    }
    bool tensor = hasMod(in, "tensor");
    bool reduce = hasMod(in, "reduce");
    StateSpace dstSpace = in.m.space;
    StateSpace srcSpace = in.m.space2;
    if (addrs.empty() || hasMod(in, "prefetch")) return Status::ok();  // no data lands
    Access dstAccess = reduce ? Access::kReadWrite : Access::kWrite;
    if (tensor) {
      // The global side is described by a tensor map: its buffer cannot be named.
      if (dstSpace == StateSpace::kGlobal) addAccess(effects_.indirect, dstAccess);
      if (srcSpace == StateSpace::kGlobal) addAccess(effects_.indirect, Access::kRead);
      for (const Operand* a : addrs) {
        Taint t = operandTaint(cx, *a);
        if (t.named()) touchMemory(t, Access::kRead);  // the tensor map itself
      }
      return Status::ok();
    }
    if (dstSpace == StateSpace::kGlobal || dstSpace == StateSpace::kNone) {
      memoryOp(cx, StateSpace::kGlobal, *addrs[0], dstAccess, 1, 1, nullptr);
    }
    if (addrs.size() > 1 && (srcSpace == StateSpace::kGlobal || srcSpace == StateSpace::kNone)) {
      memoryOp(cx, StateSpace::kGlobal, *addrs[1], Access::kRead, 1, 1, nullptr);
    }
    return Status::ok();
  }

  Status arithmetic(Context& cx, const Instruction& in) {
    const auto& ops = in.operands;
    if (ops.empty()) return Status::ok();
    bool hasAddress = false;
    for (const Operand& o : ops) hasAddress |= o.kind == OperandKind::kAddress;
    if (hasAddress) return unmodelledMemory(cx, in);

    bool destFirst = ops[0].kind == OperandKind::kRegister ||
                     ops[0].kind == OperandKind::kVector ||
                     ops[0].kind == OperandKind::kPredPair || registerName(cx, ops[0]);
    if (!destFirst) return Status::ok();
    Taint t;
    std::optional<int64_t> imm;
    size_t nonImm = 0;
    for (size_t i = 1; i < ops.size(); ++i) {
      Taint s = operandTaint(cx, ops[i]);
      if (ops[i].kind == OperandKind::kImmInt) imm = ops[i].value;
      else if (!s.empty()) ++nonImm;
      t.merge(s);
    }
    // Local offsets survive only `add x, imm` / `sub x, imm`.
    bool addImm = (in.opcode == Opcode::kAdd || in.opcode == Opcode::kSub) && ops.size() == 3 &&
                  imm && nonImm <= 1;
    if (addImm && !t.locals.empty()) {
      t = t.shifted(in.opcode == Opcode::kSub ? -*imm : *imm);
    } else {
      t = t.anyOffset();
    }
    // A narrow loaded value shifted or scaled into the upper half, or packed with
    // another, may form a pointer: from then on it is treated as one from memory.
    // (Two narrow values merely added are not: numba's index arithmetic adds an
    // index to its own sign mask.)
    if (t.partial) {
      switch (in.opcode) {
        case Opcode::kShl:
        case Opcode::kShf:
          if (!imm || *imm >= 32) t.unknown = true;
          break;
        case Opcode::kMul:
        case Opcode::kMad:
          if (imm && (*imm >= (int64_t{1} << 32) || *imm < 0)) t.unknown = true;
          break;
        case Opcode::kBfi:
        case Opcode::kPrmt:
        case Opcode::kMovmatrix:
          t.unknown = true;
          break;
        default:
          break;
      }
    }
    // A remainder by a bound that is not itself from memory, or a mask to the low
    // 32 bits, of a value from memory is an index (numba's
    // `bins[data[i] % bins.size]`), not a pointer; it only becomes one again
    // through the rules above (a half shifted up, packed). A quotient is not
    // trusted: x / 1 is x.
    bool remainder = in.opcode == Opcode::kRem;
    if (t.unknown && ops.size() == 3 && (remainder || in.opcode == Opcode::kAnd)) {
      const Operand& rhs = ops[2];
      Taint lhsTaint = operandTaint(cx, ops[1]);
      Taint rhsTaint = operandTaint(cx, rhs);
      bool smallImm = rhs.kind == OperandKind::kImmInt && rhs.value >= 0 &&
                      rhs.value < (int64_t{1} << 32);
      bool bounded = remainder
                         ? smallImm || (rhs.kind == OperandKind::kRegister && !rhsTaint.unknown)
                         : smallImm;
      if (bounded && lhsTaint.unknown) {
        lhsTaint.unknown = false;
        lhsTaint.partial = true;
        lhsTaint.merge(rhsTaint);
        t = lhsTaint.anyOffset();
      }
    }
    // Floating-point arithmetic turns no pointer into another pointer: its result
    // names nothing (used as an address it reads as indirect, which is safe), so a
    // computed float stored to memory does not make every input word escape.
    bool selects = in.opcode == Opcode::kSelp || in.opcode == Opcode::kSlct ||
                   in.opcode == Opcode::kShfl || in.opcode == Opcode::kPrmt;
    if (ptx::isFloatType(in.m.type()) && !selects) t = Taint{};
    setDest(cx, ops[0], t);
    return Status::ok();
  }

  // A memory instruction the analysis has no rule for (wmma, ldmatrix, mbarrier,
  // multimem, tensormap, ...): its addresses are read and written, its other
  // operands escape, and what it returns is unknown.
  Status unmodelledMemory(Context& cx, const Instruction& in) {
    const auto& ops = in.operands;
    bool destFirst = ops[0].kind != OperandKind::kAddress &&
                     (ops[0].kind == OperandKind::kRegister ||
                      ops[0].kind == OperandKind::kVector ||
                      ops[0].kind == OperandKind::kPredPair);
    Access access = Access::kReadWrite;
    if (in.opcode == Opcode::kWmma || in.opcode == Opcode::kLdmatrix) {
      access = hasMod(in, "store") ? Access::kWrite : Access::kRead;
    }
    if (in.opcode == Opcode::kMultimem) addAccess(effects_.indirect, access);
    for (size_t i = destFirst ? 1 : 0; i < ops.size(); ++i) {
      if (ops[i].kind == OperandKind::kAddress) {
        memoryOp(cx, in.m.space, ops[i], access, ptx::typeSize(in.m.type()), 1, nullptr);
      } else if (writes(access)) {
        escape(operandTaint(cx, ops[i]));
      }
    }
    if (destFirst) {
      Taint t;
      t.unknown = true;
      setDest(cx, ops[0], t);
    }
    return Status::ok();
  }

  struct Summary {
    bool inProgress = false;
    bool usedEarly = false;
    std::vector<Taint> returns;
    uint64_t version = 0;   // storeVersion_ when last computed
    uint64_t instance = 0;  // names its frames
    bool recorded = false;  // its effects were recorded over converged taints
  };

  const ptx::Module& module_;
  const Function& kernel_;
  std::vector<WordRef> words_;
  const ptx::ParamLayout& layout_;
  std::unordered_map<const Function*, std::unique_ptr<ptx::ResolvedFunction>>& resolved_;
  std::vector<std::string>& globalNames_;
  std::map<std::string, uint32_t, std::less<>>& globalIds_;
  Effects effects_;
  // PHOS_SIGNATURE_TRACE=1: say which instruction made a kernel indirect.
  bool trace_ = std::getenv("PHOS_SIGNATURE_TRACE") != nullptr;
  bool recording_ = false;
  const Instruction* current_ = nullptr;
  std::map<std::pair<const Function*, std::vector<Taint>>, Summary> memo_;
  std::vector<const Function*> callStack_;
  std::map<std::pair<uint64_t, std::string>, uint32_t> frameIds_;
  uint32_t nextFrame_ = 0;
  uint64_t nextInstance_ = 1;  // 0 is the kernel
  // Local memory of every frame, shared by callers and callees (-G code passes
  // the addresses of locals to device functions all the time).
  std::map<uint32_t, std::map<int64_t, Slot>> frames_;
  std::set<uint32_t> clobbered_;      // unknown code may have written these frames
  std::set<uint32_t> escapedFrames_;  // their contents reached unknown code
  uint64_t storeVersion_ = 0;         // grows whenever any of the above grows
};

// The pointer-capable words of each parameter: 8-byte integer scalars and .ptr
// parameters, and every 8-byte-aligned word inside a byte array (a struct).
std::vector<WordRef> pointerWords(const Function& kernel, const ptx::ParamLayout& layout) {
  std::vector<WordRef> out;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ptx::ParamInfo& p = layout.params[i];
    const ptx::VarDecl& d = kernel.params[i];
    bool aggregate = !d.dims.empty() ||
                     (d.vectorWidth > 1 && ptx::typeSize(d.type) == 8 && !ptx::isFloatType(d.type));
    if (p.mayBePointer && !aggregate) {
      out.push_back({static_cast<uint32_t>(i), p.offset});
      continue;
    }
    if (!aggregate) continue;
    uint64_t first = (uint64_t{p.offset} + 7) / 8 * 8;
    for (uint64_t o = first; o + 8 <= uint64_t{p.offset} + p.size; o += 8) {
      out.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(o)});
    }
  }
  return out;
}

}  // namespace

Result<std::vector<KernelSignature>> analyzeModule(const ptx::Module& module) {
  std::vector<KernelSignature> out;
  std::unordered_map<const Function*, std::unique_ptr<ptx::ResolvedFunction>> resolved;
  std::vector<std::string> globalNames;
  std::map<std::string, uint32_t, std::less<>> globalIds;
  for (const ptx::ModuleItem& item : module.items) {
    const auto* kernel = std::get_if<Function>(&item);
    if (!kernel || !kernel->isEntry) continue;
    if (!kernel->hasBody) {
      return makeError(Code::kInvalidArgument, "kernel {} has no body", kernel->name);
    }
    ASSIGN_OR_RETURN(ptx::ParamLayout layout, ptx::computeParamLayout(*kernel));
    std::vector<WordRef> words = pointerWords(*kernel, layout);
    KernelAnalysis analysis(module, *kernel, words, layout, resolved, globalNames, globalIds);
    RETURN_IF_ERROR(analysis.run());
    const Effects& e = analysis.effects();

    KernelSignature sig;
    sig.name = kernel->name;
    sig.demangled = demangle(kernel->name).value_or("");
    sig.paramBytes = layout.totalSize;
    sig.sources = kFromPtx;
    size_t w = 0;
    for (const ptx::ParamInfo& p : layout.params) {
      ParamSignature ps;
      ps.ordinal = p.ordinal;
      ps.name = p.name;
      ps.offset = p.offset;
      ps.size = p.size;
      for (; w < words.size() && words[w].param == p.ordinal; ++w) {
        PointerWord pw;
        pw.offset = words[w].offset;
        pw.observed = e.wordAccess[w];
        pw.escapes = e.wordEscapes[w];
        pw.access = detail::effectiveAccess(pw.observed, pw.escapes, false);
        ps.words.push_back(std::move(pw));
      }
      sig.params.push_back(std::move(ps));
    }
    for (const auto& [g, a] : e.globalAccess) sig.globals.push_back({globalNames[g], a});
    std::sort(sig.globals.begin(), sig.globals.end(),
              [](const GlobalUse& a, const GlobalUse& b) { return a.name < b.name; });
    sig.indirect = e.indirect;

    if (!sig.demangled.empty()) {
      // The C++ parameter types: a pointer to const is only read. Kernels whose
      // C++ parameters do not map one to one onto PTX parameters (numba's arrays)
      // keep the PTX facts alone.
      if (auto declared = detail::declarationFromDemangled(sig.name, sig.demangled)) {
        if (declared->params.size() == sig.params.size()) {
          // A C++ pointer without a pointer word in the PTX (a 32-bit module) is
          // not worth failing the analysis over: the PTX facts stand alone.
          (void)detail::applyDeclaredTypes(sig, *declared, kFromMangledName);
        }
      }
    }
    out.push_back(std::move(sig));
  }
  return out;
}

}  // namespace phos::instrument
