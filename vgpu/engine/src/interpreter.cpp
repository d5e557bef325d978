// SPDX-License-Identifier: Apache-2.0
// The SIMT interpreter: CTAs over worker threads, warps stepped round-robin inside a
// CTA, divergence on an IPDOM stack, PTX-exact arithmetic and checked memory.
#include "interpreter.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "device_printf.h"
#include "float_ops.h"
#include "opcode_coverage.h"
#include "phos/instrument/check_function.h"
#include "phos/instrument/twin.h"
#include "phos/ptx/printer.h"
#include "texture_sampling.h"

namespace phos::vgpu::engine::detail {
namespace {

using ptx::Opcode;
using ptx::Type;
using ptx::Flag;
using ptx::StateSpace;

__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 UInt128;

constexpr uint32_t kFullMask = 0xffffffffu;
constexpr int kBarriers = 16;
constexpr uint32_t kMaxCallDepth = 4096;
constexpr uint32_t kMaxLocalBytesPerThread = 1u << 20;
constexpr int kQuantum = 2048;  // instructions a warp runs before the next one gets a turn
// Rounds in a row in which every warp that ran only waited on an mbarrier phase
// and no mbarrier changed: the block cannot progress (a GPU would hang).
constexpr uint32_t kMbarrierIdleRounds = 1u << 16;

// An mbarrier object: 8 bytes of shared memory whose layout the ISA leaves
// opaque. vgpu's: bits 0-20 the pending arrival count, 21-41 the expected
// arrival count, 42-62 the tx-count (two's complement), bit 63 the phase
// parity. The state an arrive returns is the object as it was before it.
struct Mbarrier {
  static constexpr uint32_t kMaxCount = (1u << 20) - 1;  // counts and tx-counts: at most 2^20 - 1
  uint32_t pending = 0;
  uint32_t expected = 0;
  int32_t tx = 0;
  uint32_t phase = 0;

  static Mbarrier decode(uint64_t v) {
    Mbarrier b;
    b.pending = static_cast<uint32_t>(v & 0x1fffff);
    b.expected = static_cast<uint32_t>((v >> 21) & 0x1fffff);
    const auto tx = static_cast<uint32_t>((v >> 42) & 0x1fffff);
    b.tx = (tx & 0x100000) ? static_cast<int32_t>(tx) - (1 << 21) : static_cast<int32_t>(tx);
    b.phase = static_cast<uint32_t>(v >> 63);
    return b;
  }
  uint64_t encode() const {
    return uint64_t{pending} | (uint64_t{expected} << 21) | ((uint64_t(static_cast<uint32_t>(tx)) & 0x1fffff) << 42) |
           (uint64_t{phase} << 63);
  }
  // The current phase completes once every arrival and every transaction
  // byte it expects has come: the next phase starts with the expected count.
  void completeIfDone() {
    if (pending != 0 || tx != 0) return;
    phase ^= 1;
    pending = expected;
  }
};

// Per-type properties as tables: the interpreter asks them for every lane.
struct TypeTables {
  std::array<uint8_t, static_cast<size_t>(Type::kCount)> size{};
  std::array<bool, static_cast<size_t>(Type::kCount)> isSigned{};
  std::array<bool, static_cast<size_t>(Type::kCount)> isFloat{};
  TypeTables() {
    for (size_t i = 0; i < size.size(); ++i) {
      Type t = static_cast<Type>(i);
      size[i] = static_cast<uint8_t>(ptx::typeSize(t));
      isSigned[i] = ptx::isSignedType(t);
      isFloat[i] = ptx::isFloatType(t);
    }
  }
};
const TypeTables kTypes;
inline unsigned tsize(Type t) { return kTypes.size[static_cast<size_t>(t)]; }
inline bool tsigned(Type t) { return kTypes.isSigned[static_cast<size_t>(t)]; }
inline bool tfloat(Type t) { return kTypes.isFloat[static_cast<size_t>(t)]; }

// Fixed-size accesses: a variable-length memcpy into a register-sized temporary
// costs a store-forwarding stall on every lane.
inline uint64_t loadBytes(const uint8_t* p, unsigned n) {
  switch (n) {
    case 1: return *p;
    case 2: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    default: { uint64_t v; std::memcpy(&v, p, 8); return v; }
  }
}
// A whole access of `n` bytes (a scalar or a vector) as one access of the
// host when it is naturally aligned and 2, 4, 8 or 16 bytes: another thread
// never sees half of it, as on a GPU. CUB's decoupled look-back packs a
// tile's status and value into one 8-byte ld/st.relaxed.gpu.v2.u32 and
// relies on that; element by element, a reader saw a new status with an old
// value and Thrust's scans came out wrong about once in a few hundred runs.
inline void loadWhole(uint8_t* out, const uint8_t* p, unsigned n) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  switch ((at & (n - 1)) == 0 ? n : 0) {
    case 2: {
      uint16_t v = __atomic_load_n(reinterpret_cast<const uint16_t*>(p), __ATOMIC_RELAXED);
      std::memcpy(out, &v, 2);
      return;
    }
    case 4: {
      uint32_t v = __atomic_load_n(reinterpret_cast<const uint32_t*>(p), __ATOMIC_RELAXED);
      std::memcpy(out, &v, 4);
      return;
    }
    case 8: {
      uint64_t v = __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_RELAXED);
      std::memcpy(out, &v, 8);
      return;
    }
    case 16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                       _mm_load_si128(reinterpret_cast<const __m128i*>(p)));
      return;
    default:
      std::memcpy(out, p, n);
  }
}
inline void storeWhole(uint8_t* p, const uint8_t* in, unsigned n) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  switch ((at & (n - 1)) == 0 ? n : 0) {
    case 2: {
      uint16_t v;
      std::memcpy(&v, in, 2);
      __atomic_store_n(reinterpret_cast<uint16_t*>(p), v, __ATOMIC_RELAXED);
      return;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, in, 4);
      __atomic_store_n(reinterpret_cast<uint32_t*>(p), v, __ATOMIC_RELAXED);
      return;
    }
    case 8: {
      uint64_t v;
      std::memcpy(&v, in, 8);
      __atomic_store_n(reinterpret_cast<uint64_t*>(p), v, __ATOMIC_RELAXED);
      return;
    }
    case 16:
      _mm_store_si128(reinterpret_cast<__m128i*>(p),
                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
      return;
    default:
      std::memcpy(p, in, n);
  }
}
inline void storeBytes(uint8_t* p, uint64_t v, unsigned n) {
  switch (n) {
    case 1: *p = static_cast<uint8_t>(v); break;
    case 2: { uint16_t x = static_cast<uint16_t>(v); std::memcpy(p, &x, 2); break; }
    case 4: { uint32_t x = static_cast<uint32_t>(v); std::memcpy(p, &x, 4); break; }
    default: std::memcpy(p, &v, 8);
  }
}

inline uint64_t truncBytes(uint64_t v, unsigned bytes) {
  return bytes >= 8 ? v : v & ((uint64_t{1} << (bytes * 8)) - 1);
}
inline int64_t sext(uint64_t v, unsigned bytes) {
  if (bytes >= 8) return static_cast<int64_t>(v);
  unsigned shift = 64 - bytes * 8;
  return static_cast<int64_t>(v << shift) >> shift;
}

// State shared by every worker of one launch.
struct LaunchState {
  const KernelLaunch* launch = nullptr;
  const Function* kernel = nullptr;
  uint32_t staticShared = 0;
  uint32_t dynamicBase = 0;
  uint32_t sharedBytes = 0;
  uint32_t reservedBase = 0;
  uint64_t totalBlocks = 0;
  std::atomic<uint64_t> nextBlock{0};
  std::atomic<bool> stop{false};
  std::mutex faultMutex;
  Status fault;
  std::mutex printfMutex;
  std::mutex recordMutex;
  std::vector<ByteRange> reads;   // raw, merged at the end of the launch
  std::vector<ByteRange> writes;
  std::atomic<uint64_t> warpInstructions{0};
  std::atomic<uint64_t> laneInstructions{0};
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  // A cooperative grid's sync workspace, zero at the launch's start: what
  // %envreg1 (high half) and %envreg2 (low half) point to, as NVIDIA's driver
  // provides it for cooperative groups' grid.sync() (its barrier word is at
  // offset 4). Global memory for the launch's instructions.
  alignas(16) std::array<uint32_t, 4> gridWorkspace{};

  uint64_t workspace() const { return reinterpret_cast<uint64_t>(gridWorkspace.data()); }

  void setFault(Status s) {
    std::lock_guard lock(faultMutex);
    if (fault.isOk()) fault = std::move(s);
    stop = true;
  }
};

struct Entry {
  uint32_t pc;
  uint32_t rpc;
  uint32_t mask;
};

struct Frame {
  const Function* fn = nullptr;
  std::vector<Entry> stack;
  uint32_t returned = 0;
  uint32_t callMask = 0;
  std::vector<uint64_t> regs;
  std::vector<uint8_t> params;  // lane-major: lane * fn->paramBytes + offset
  uint32_t localBase = 0;
  const Inst* callInst = nullptr;
};

enum class WarpState : uint8_t { kRunning, kBarrier, kDone };

struct Warp {
  uint32_t index = 0;
  uint32_t liveMask = 0;  // lanes that exist in the CTA
  uint32_t exited = 0;
  WarpState state = WarpState::kRunning;
  std::vector<Frame> frames;  // frames[0..depth) are live; the rest are reused storage
  uint32_t depth = 0;
  uint32_t carry = 0;  // CC.CF per lane
  std::array<std::array<uint32_t, kWarpSize>, 3> tid{};
  std::array<std::vector<uint8_t>, kWarpSize> local;
  uint32_t localSize = 0;
  uint64_t clock = 0;
  // A pending bar.red: where its result goes when the barrier completes.
  const Inst* barrierInst = nullptr;
  uint32_t barrierMask = 0;
  // The cluster barrier's phase when the warp last arrived on it.
  uint64_t clusterPhase = 0;
};

// barrier.cluster: split arrive and wait. A phase completes once every
// non-exited thread of the cluster (here: of the CTA) has arrived; a wait
// returns once the phase its warp arrived in has completed.
struct ClusterBarrier {
  uint32_t arrived = 0;
  uint64_t phase = 0;
  std::vector<uint32_t> waiting;  // warps blocked in barrier.cluster.wait
};

struct BarrierState {
  uint32_t arrived = 0;
  uint32_t expected = 0;  // 0: every live thread of the CTA
  std::vector<uint32_t> waiting;
  uint32_t popc = 0;
  bool allTrue = true;
  bool anyTrue = false;
};

enum class Step { kContinue, kBlocked, kStop };

class BlockRunner {
 public:
  BlockRunner(LaunchState& state, uint32_t workerId)
      : s_(state), l_(*state.launch), code_(*state.launch->code), workerId_(workerId),
        recording_(state.launch->record != nullptr) {}

  void run() {
    for (;;) {
      if (s_.stop) return;
      uint64_t b = s_.nextBlock.fetch_add(1);
      if (b >= s_.totalBlocks) return;
      Status st = runBlock(b);
      if (!st.isOk()) {
        s_.setFault(std::move(st));
        return;
      }
    }
    (void)workerId_;
  }

  ~BlockRunner() {
    s_.warpInstructions += warpInstructions_;
    s_.laneInstructions += laneInstructions_;
    if (recording_) {
      std::lock_guard lock(s_.recordMutex);
      s_.reads.insert(s_.reads.end(), reads_.begin(), reads_.end());
      s_.writes.insert(s_.writes.end(), writes_.begin(), writes_.end());
    }
  }

 private:
  // ---------------------------------------------------------------- block
  // Runs the block `b` (in grid order) to its end.
  Status runBlock(uint64_t b) {
    RETURN_IF_ERROR(beginBlock(b));
    for (;;) {
      bool done = false;
      RETURN_IF_ERROR(runRound(done));
      if (done) return Status::ok();
    }
  }

 public:
  // A cooperative grid runs its blocks together, a round of each in turn.
  Status beginBlock(uint64_t b) {
    const Dim3& g = l_.config.grid;
    ctaid_ = {static_cast<uint32_t>(b % g.x), static_cast<uint32_t>((b / g.x) % g.y),
              static_cast<uint32_t>(b / (uint64_t{g.x} * g.y))};
    return beginBlock();
  }

  // One round: each running warp runs for a quantum, then barriers release.
  // `done` once every warp has exited (or the launch stops).
  Status runRound(bool& done) {
    done = false;
    bool anyRunning = false;
    bool anyWorked = false;
    mbarrierChanged_ = false;
    for (uint32_t wi = 0; wi < nwarps_; ++wi) {
      Warp& w = warps_[wi];
      if (w.state != WarpState::kRunning) continue;
      anyRunning = true;
      waitYielded_ = false;
      if (runWarp(w) == Step::kStop) return fault_;
      anyWorked = anyWorked || !waitYielded_;
      if (s_.stop) {
        done = true;
        return Status::ok();
      }
    }
    bool released = releaseBarriers();
    RETURN_IF_ERROR(checkProgress(anyRunning && !anyWorked && !mbarrierChanged_ && !released));
    bool allDone = true;
    for (uint32_t wi = 0; wi < nwarps_; ++wi) {
      if (warps_[wi].state != WarpState::kDone) allDone = false;
    }
    if (allDone) {
      done = true;
      return Status::ok();
    }
    if (!anyRunning && !released) {
      bool anyRunnable = false;
      for (uint32_t wi = 0; wi < nwarps_; ++wi) {
        if (warps_[wi].state == WarpState::kRunning) anyRunnable = true;
      }
      if (!anyRunnable) {
        return kernelFaultStatus(
            KernelFault::kLaunchFailed,
            fmt::format("barrier deadlock in {}, block ({},{},{}): every live warp waits "
                        "at a barrier that cannot complete",
                        s_.kernel->name, ctaid_[0], ctaid_[1], ctaid_[2]));
      }
    }
    return Status::ok();
  }

 private:
  Status beginBlock() {
    const Dim3& bd = l_.config.block;
    const uint32_t threads = bd.x * bd.y * bd.z;
    const uint32_t nwarps = (threads + kWarpSize - 1) / kWarpSize;
    shared_.assign(s_.sharedBytes, 0);
    reserved_.fill(0);
    if (warps_.size() < nwarps) warps_.resize(nwarps);
    barriers_ = {};
    clusterBarrier_ = ClusterBarrier{};
    liveThreads_ = threads;
    for (uint32_t wi = 0; wi < nwarps; ++wi) {
      Warp& w = warps_[wi];
      w.index = wi;
      uint32_t first = wi * kWarpSize;
      uint32_t count = std::min<uint32_t>(kWarpSize, threads - first);
      w.liveMask = count == kWarpSize ? kFullMask : (1u << count) - 1;
      w.exited = 0;
      w.state = WarpState::kRunning;
      w.depth = 0;
      w.carry = 0;
      w.clock = 0;
      w.barrierInst = nullptr;
      w.clusterPhase = 0;
      for (uint32_t lane = 0; lane < kWarpSize; ++lane) {
        uint32_t t = first + lane;
        w.tid[0][lane] = t % bd.x;
        w.tid[1][lane] = (t / bd.x) % bd.y;
        w.tid[2][lane] = t / (bd.x * bd.y);
      }
      w.localSize = 0;
      if (!pushFrame(w, *s_.kernel, w.liveMask, 0, nullptr)) return fault_;
    }
    nwarps_ = nwarps;
    idleRounds_ = 0;
    return Status::ok();
  }

  // `idle`: every warp that ran this round only waited on an mbarrier phase,
  // and nothing changed that could complete one. Many such rounds in a row
  // are a deadlock.
  Status checkProgress(bool idle) {
    if (!idle) {
      idleRounds_ = 0;
      return Status::ok();
    }
    if (++idleRounds_ < kMbarrierIdleRounds) return Status::ok();
    return kernelFaultStatus(KernelFault::kLaunchFailed,
                             fmt::format("mbarrier deadlock in {}, block ({},{},{}): every running warp waits on an "
                                         "mbarrier phase that no warp can complete",
                                         s_.kernel->name, ctaid_[0], ctaid_[1], ctaid_[2]));
  }

  bool releaseBarriers() {
    bool released = releaseClusterBarrier();
    for (int b = 0; b < kBarriers; ++b) {
      BarrierState& bar = barriers_[static_cast<size_t>(b)];
      if (bar.arrived == 0) continue;
      uint32_t expected = bar.expected ? bar.expected : liveThreads_;
      if (bar.arrived < expected) continue;
      for (uint32_t wi : bar.waiting) {
        Warp& w = warps_[wi];
        if (w.barrierInst) writeBarrierResult(w, bar);
        w.barrierInst = nullptr;
        w.state = WarpState::kRunning;
      }
      bar = BarrierState{};
      released = true;
    }
    return released;
  }

  void writeBarrierResult(Warp& w, const BarrierState& bar) {
    const Inst& in = *w.barrierInst;
    Frame& f = w.frames[w.depth - 1];
    uint64_t v;
    if (in.m.has(Flag::kPopc)) {
      v = bar.popc;
    } else if (in.m.atomOp == ptx::AtomOp::kAnd) {
      v = bar.allTrue;
    } else {
      v = bar.anyTrue;
    }
    for (uint32_t m = w.barrierMask; m; m &= m - 1) {
      writeReg(f, in.ops[0], std::countr_zero(m), v);
    }
  }

  // ---------------------------------------------------------------- frames
  bool pushFrame(Warp& w, const Function& fn, uint32_t mask, uint32_t localBase,
                 const Inst* callInst) {
    if (w.depth >= kMaxCallDepth) {
      fault_ = kernelFaultStatus(KernelFault::kLaunchFailed,
                                 fmt::format("call depth exceeds {} calling {}",
                                             kMaxCallDepth, fn.name));
      return false;
    }
    uint32_t needLocal = localBase + fn.localBytes;
    if (needLocal > kMaxLocalBytesPerThread) {
      fault_ = kernelFaultStatus(KernelFault::kLaunchFailed,
                                 fmt::format("local memory stack overflow calling {} "
                                             "({} bytes per thread)", fn.name, needLocal));
      return false;
    }
    if (needLocal > w.localSize) {
      for (auto& lane : w.local) lane.resize(needLocal);
      w.localSize = needLocal;
    }
    if (w.frames.size() <= w.depth) w.frames.resize(w.depth + 1);
    Frame& f = w.frames[w.depth++];
    f.fn = &fn;
    f.stack.clear();
    f.stack.push_back({0, static_cast<uint32_t>(fn.code.size()), mask});
    f.returned = 0;
    f.callMask = mask;
    f.regs.assign(static_cast<size_t>(fn.regCount) * kWarpSize, 0);
    f.params.assign(static_cast<size_t>(fn.paramBytes) * kWarpSize, 0);
    f.localBase = localBase;
    f.callInst = callInst;
    return true;
  }

  // Called when the top frame's reconvergence stack is empty.
  void popFrame(Warp& w) {
    Frame& callee = w.frames[w.depth - 1];
    if (w.depth == 1) {
      w.depth = 0;
      w.state = WarpState::kDone;
      uint32_t newlyExited = w.liveMask & ~w.exited;
      liveThreads_ -= static_cast<uint32_t>(std::popcount(newlyExited));
      w.exited = w.liveMask;
      return;
    }
    Frame& caller = w.frames[w.depth - 2];
    const Inst& call = *callee.callInst;
    const Function& fn = *callee.fn;
    uint32_t lanes = callee.callMask & ~w.exited;
    const Opnd& rets = call.ops[0];
    for (size_t i = 0; i < rets.elems.size() && i < fn.returnOffsets.size(); ++i) {
      const Opnd& dst = rets.elems[i];
      uint32_t size = fn.returnSizes[i];
      for (uint32_t m = lanes; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        const uint8_t* src = &callee.params[static_cast<size_t>(lane) * fn.paramBytes +
                                            fn.returnOffsets[i]];
        if (dst.kind == OpndKind::kFrameParamAddr) {
          std::memcpy(&caller.params[static_cast<size_t>(lane) * caller.fn->paramBytes + dst.imm],
                      src, size);
        } else if (dst.kind == OpndKind::kReg) {
          uint64_t v = 0;
          std::memcpy(&v, src, std::min<uint32_t>(size, 8));
          caller.regs[dst.reg * kWarpSize + static_cast<uint32_t>(lane)] = v;
        }
      }
    }
    --w.depth;
  }

  // ---------------------------------------------------------------- operands
  uint64_t special(const Warp& w, const Frame& f, const Opnd& o, int lane) const {
    const Dim3& bd = l_.config.block;
    const Dim3& gd = l_.config.grid;
    auto pick = [&](const Dim3& d) {
      return o.component == 0 ? d.x : o.component == 1 ? d.y : d.z;
    };
    uint32_t bit = 1u << lane;
    switch (o.special) {
      case Special::kTid: return w.tid[o.component][static_cast<size_t>(lane)];
      case Special::kNtid: return pick(bd);
      case Special::kCtaid: return ctaid_[o.component];
      case Special::kNctaid: return pick(gd);
      case Special::kLaneid: return static_cast<uint32_t>(lane);
      case Special::kWarpid: return w.index;
      case Special::kNwarpid: return 64;
      case Special::kSmid: return workerId_;
      case Special::kNsmid: return l_.workers;
      case Special::kGridid: return 1;
      case Special::kClock: return static_cast<uint32_t>(w.clock);
      case Special::kClockHi: return static_cast<uint32_t>(w.clock >> 32);
      case Special::kClock64: return w.clock;
      case Special::kGlobaltimer: case Special::kGlobaltimerLo: case Special::kGlobaltimerHi: {
        uint64_t ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::system_clock::now().time_since_epoch()).count());
        if (o.special == Special::kGlobaltimerLo) return static_cast<uint32_t>(ns);
        if (o.special == Special::kGlobaltimerHi) return ns >> 32;
        return ns;
      }
      case Special::kLanemaskEq: return bit;
      case Special::kLanemaskLe: return (bit - 1) | bit;
      case Special::kLanemaskLt: return bit - 1;
      case Special::kLanemaskGe: return ~(bit - 1);
      case Special::kLanemaskGt: return ~((bit - 1) | bit);
      case Special::kDynamicSmemSize: return l_.config.dynamicSharedBytes;
      case Special::kTotalSmemSize: case Special::kAggrSmemSize: return s_.sharedBytes;
      case Special::kClusterCtaid: return 0;
      case Special::kClusterNctaid: return 1;
      case Special::kClusterCtarank: return 0;
      case Special::kClusterNctarank: return 1;
      case Special::kIsExplicitCluster: return 0;
      case Special::kClusterid: return ctaid_[o.component];
      case Special::kNclusterid: return pick(gd);
      case Special::kReservedSmemBegin: case Special::kReservedSmem0: return s_.reservedBase;
      case Special::kReservedSmem1: return s_.reservedBase + kReservedSharedBytes / 2;
      case Special::kReservedSmemEnd: return s_.reservedBase + kReservedSharedBytes;
      case Special::kReservedSmemCap: return kReservedSharedBytes;
      case Special::kEnvreg:
        if (!l_.config.cooperative) return 0;
        if (o.imm == 1) return s_.workspace() >> 32;
        if (o.imm == 2) return s_.workspace() & 0xffffffffu;
        return 0;
    }
    (void)f;
    return 0;
  }

  uint64_t read(const Warp& w, const Frame& f, const Opnd& o, int lane) const {
    switch (o.kind) {
      case OpndKind::kReg: {
        uint64_t v = f.regs[o.reg * kWarpSize + static_cast<uint32_t>(lane)];
        return o.negated ? (v ^ 1) : v;
      }
      case OpndKind::kImm: return o.imm;
      case OpndKind::kSpecial: return special(w, f, o, lane);
      case OpndKind::kLocalAddr: return f.localBase + o.imm;
      case OpndKind::kDynSharedAddr: return s_.dynamicBase + o.imm;
      case OpndKind::kFrameParamAddr: return o.imm;
      default: return 0;
    }
  }

  static void writeReg(Frame& f, const Opnd& o, int lane, uint64_t v) {
    if (o.kind == OpndKind::kReg) f.regs[o.reg * kWarpSize + static_cast<uint32_t>(lane)] = v;
  }

  uint32_t predMask(const Frame& f, uint32_t reg, bool negated, uint32_t mask) const {
    uint32_t r = 0;
    const uint64_t* p = &f.regs[reg * kWarpSize];
    for (uint32_t m = mask; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      if ((p[lane] & 1) != static_cast<uint64_t>(negated)) r |= 1u << lane;
    }
    return r;
  }

  // ---------------------------------------------------------------- faults
  std::string where(const Warp& w, int lane) const {
    const Frame& f = w.frames[w.depth - 1];
    return fmt::format("in {}, thread ({},{},{}) of block ({},{},{})", f.fn->name,
                       w.tid[0][static_cast<size_t>(lane)], w.tid[1][static_cast<size_t>(lane)],
                       w.tid[2][static_cast<size_t>(lane)], ctaid_[0], ctaid_[1], ctaid_[2]);
  }
  Step raise(KernelFault kind, const Warp& w, const Inst& in, int lane, std::string what) {
    std::string text = in.source ? ptx::print(*in.source) : std::string(ptx::name(in.op));
    if (!text.empty() && text.back() == ';') text.pop_back();
    uint32_t line = in.source ? in.source->line : 0;
    fault_ = kernelFaultStatus(kind, fmt::format("{} ({}{}) {}", what, text,
                                                 line ? fmt::format(", line {}", line) : "",
                                                 where(w, lane)));
    return Step::kStop;
  }

  // ---------------------------------------------------------------- memory
  void recordAccess(uint64_t addr, uint64_t size, bool read, bool write) {
    if (read) appendRange(reads_, addr, size);
    if (write) appendRange(writes_, addr, size);
  }
  static void appendRange(std::vector<ByteRange>& v, uint64_t addr, uint64_t size) {
    if (!v.empty() && v.back().end == addr) {
      v.back().end += size;  // consecutive lanes usually touch consecutive bytes
    } else {
      v.push_back({addr, addr + size});
    }
  }

  // Resolves `size` bytes at `addr` in `space` for one lane to a host pointer;
  // nullptr after recording a fault.
  uint8_t* resolve(Warp& w, Frame& f, const Inst& in, StateSpace space, AddrBase base,
                   uint64_t addr, uint32_t size, uint32_t align, int lane, bool write) {
    if (align > 1 && (addr & (align - 1)) != 0) {
      raise(KernelFault::kMisalignedAddress, w, in, lane,
            fmt::format("misaligned {}-byte access to {:#x}", size, addr));
      return nullptr;
    }
    auto illegal = [&](const char* what) -> uint8_t* {
      raise(KernelFault::kIllegalAddress, w, in, lane,
            fmt::format("illegal {} {}-byte {} at {:#x}", what, size, write ? "write" : "read",
                        addr));
      return nullptr;
    };
    if (base == AddrBase::kKernelParam ||
        (isParamSpace(space) && base != AddrBase::kFrameParam && f.fn->isEntry)) {
      if (write || addr + size > l_.params.size() || addr + size < addr) return illegal("param");
      return const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(l_.params.data())) + addr;
    }
    if (base == AddrBase::kFrameParam || isParamSpace(space)) {
      if (addr + size > f.fn->paramBytes || addr + size < addr) return illegal("param");
      return &f.params[static_cast<size_t>(lane) * f.fn->paramBytes + addr];
    }
    if (space == StateSpace::kNone) {
      if (addr - kSharedWindow < kWindowSize) {
        space = StateSpace::kShared;
        addr -= kSharedWindow;
      } else if (addr - kLocalWindow < kWindowSize) {
        space = StateSpace::kLocal;
        addr -= kLocalWindow;
      } else {
        space = StateSpace::kGlobal;
      }
    }
    if (isSharedSpace(space)) {
      if (addr - kReservedSharedOffset < kReservedSharedBytes &&
          addr + size <= kReservedSharedOffset + kReservedSharedBytes) {
        return reserved_.data() + (addr - kReservedSharedOffset);
      }
      if (addr + size > shared_.size() || addr + size < addr) return illegal("shared");
      return shared_.data() + addr;
    }
    if (space == StateSpace::kLocal) {
      if (addr + size > w.localSize || addr + size < addr) return illegal("local");
      return w.local[static_cast<size_t>(lane)].data() + addr;
    }
    // Global and constant: the context's mappings, and a cooperative grid's workspace.
    if (l_.config.cooperative && addr - s_.workspace() < sizeof(s_.gridWorkspace) &&
        addr + size <= s_.workspace() + sizeof(s_.gridWorkspace)) {
      return reinterpret_cast<uint8_t*>(addr);
    }
    if (!l_.context.memory->isAccessible(addr, size)) return illegal("global");
    if (recording_) {
      bool atomic = in.op == Opcode::kAtom || in.op == Opcode::kRed;
      recordAccess(addr, size, !write || atomic, write);
    }
    return reinterpret_cast<uint8_t*>(addr);
  }

  uint64_t effectiveAddress(const Warp& w, const Frame& f, const Opnd& o, int lane) const {
    switch (o.base) {
      case AddrBase::kRegister: return f.regs[o.reg * kWarpSize + static_cast<uint32_t>(lane)] + o.imm;
      case AddrBase::kAbsolute: case AddrBase::kKernelParam: case AddrBase::kFrameParam:
        return o.imm;
      case AddrBase::kLocalVar: return f.localBase + o.imm;
      case AddrBase::kDynShared: return s_.dynamicBase + o.imm;
    }
    (void)w;
    return o.imm;
  }

  // ---------------------------------------------------------------- execution
  Step runWarp(Warp& w) {
    for (int budget = kQuantum; budget > 0; --budget) {
      if (w.depth == 0) {
        w.state = WarpState::kDone;
        return Step::kContinue;
      }
      Frame& f = w.frames[w.depth - 1];
      if (f.stack.empty()) {
        popFrame(w);
        continue;
      }
      Entry& e = f.stack.back();
      uint32_t mask = e.mask & ~f.returned & ~w.exited;
      if (mask == 0 || e.pc == e.rpc) {
        f.stack.pop_back();
        continue;
      }
      if (e.pc >= f.fn->code.size()) {  // fell off the end: returns
        f.returned |= mask;
        continue;
      }
      const Inst& in = f.fn->code[e.pc];
      uint32_t exec = mask;
      if (in.guard >= 0) exec = predMask(f, static_cast<uint32_t>(in.guard), in.guardNegated, mask);
      ++warpInstructions_;
      laneInstructions_ += static_cast<uint64_t>(std::popcount(exec));
      ++w.clock;
      Step st = execute(w, f, in, mask, exec);
      if (st != Step::kContinue) return st;
      if (w.state != WarpState::kRunning) return Step::kContinue;
    }
    return Step::kContinue;
  }

  // `mask`: lanes at this pc; `exec`: those whose guard holds. Advances the pc.
  Step execute(Warp& w, Frame& f, const Inst& in, uint32_t mask, uint32_t exec) {
    Entry& e = f.stack.back();
    switch (in.op) {
      case Opcode::kBra: {
        uint32_t taken = exec;
        if (taken == mask) {
          e.pc = in.target;
        } else if (taken == 0) {
          ++e.pc;
        } else {
          uint32_t next = e.pc + 1;
          e.pc = in.rpc;
          f.stack.push_back({next, in.rpc, mask & ~taken});
          f.stack.push_back({in.target, in.rpc, taken});
        }
        return Step::kContinue;
      }
      case Opcode::kRet:
        f.returned |= exec;
        ++e.pc;
        return Step::kContinue;
      case Opcode::kExit: {
        uint32_t newly = exec & ~w.exited;
        w.exited |= exec;
        liveThreads_ -= static_cast<uint32_t>(std::popcount(newly));
        ++e.pc;
        return Step::kContinue;
      }
      case Opcode::kTrap:
        // A GPU reports a trap as an unspecified launch failure.
        if (exec) return raise(KernelFault::kLaunchFailed, w, in, std::countr_zero(exec), "trap");
        ++e.pc;
        return Step::kContinue;
      case Opcode::kBrkpt:
      case Opcode::kMembar: case Opcode::kFence: case Opcode::kPrefetch:
      case Opcode::kPrefetchu: case Opcode::kNanosleep: case Opcode::kPmevent:
      case Opcode::kApplypriority: case Opcode::kDiscard: case Opcode::kCreatepolicy:
        ++e.pc;
        return Step::kContinue;
      case Opcode::kGriddepcontrol:
        // Programmatic dependent launch. `.wait` waits until the prerequisite
        // grids have completed and their memory operations are visible; vgpu
        // starts a launch only once everything before it in its stream has
        // completed, so they have. `.launch_dependents` lets dependents be
        // scheduled early, which the ISA leaves optional ("There is no
        // guarantee that the dependent will launch before the completion of
        // the current grid"). Both are therefore exact as no-ops.
        ++e.pc;
        return Step::kContinue;
      case Opcode::kCall:
        return executeCall(w, f, in, exec);
      case Opcode::kBar: case Opcode::kBarrier:
        return executeBarrier(w, f, in, exec);
      default:
        break;
    }
    ++e.pc;
    if (exec == 0) return Step::kContinue;
    switch (in.op) {
      case Opcode::kLd: case Opcode::kLdu: return executeLoad(w, f, in, exec);
      case Opcode::kSt: return executeStore(w, f, in, exec);
      case Opcode::kCp: return executeAsyncCopy(w, f, in, exec);
      case Opcode::kMbarrier: return executeMbarrier(w, f, in, exec);
      case Opcode::kWmma: return executeWmma(w, f, in, mask, exec);
      case Opcode::kLdmatrix: return executeLdmatrix(w, f, in, mask, exec);
      case Opcode::kStmatrix: return executeStmatrix(w, f, in, mask, exec);
      case Opcode::kMovmatrix: return executeMovmatrix(w, f, in, mask, exec);
      case Opcode::kMma: return executeMmaSync(w, f, in, mask, exec);
      case Opcode::kAtom: case Opcode::kRed: return executeAtomic(w, f, in, exec);
      case Opcode::kTex:
      case Opcode::kTld4:
        return executeTexture(w, f, in, exec);
      case Opcode::kSuld:
      case Opcode::kSust:
        return executeSurface(w, f, in, exec);
      case Opcode::kTxq:
      case Opcode::kSuq:
        return executeTextureQuery(w, f, in, exec);
      case Opcode::kIstypep:
        // Unified mode: a texture object is its own sampler too.
        for (uint32_t m = exec; m; m &= m - 1) {
          const int lane = std::countr_zero(m);
          const uint64_t handle = read(w, f, in.ops[1], lane);
          const bool surface = in.m.has(Flag::kSurfref);
          writeReg(f, in.ops[0], lane, textureObject(handle, surface) != nullptr ? 1 : 0);
        }
        return Step::kContinue;
      case Opcode::kSured:
        return raise(KernelFault::kIllegalInstruction, w, in, std::countr_zero(exec),
                     fmt::format("unsupported instruction sured: {}", coverageOf(in.op).note));
      case Opcode::kShfl: return executeShfl(w, f, in, exec);
      case Opcode::kVote: return executeVote(w, f, in, exec);
      case Opcode::kMatch: return executeMatch(w, f, in, exec);
      case Opcode::kRedux: return executeRedux(w, f, in, exec);
      case Opcode::kActivemask:
        for (uint32_t m = exec; m; m &= m - 1) writeReg(f, in.ops[0], std::countr_zero(m), exec);
        return Step::kContinue;
      case Opcode::kElect: {
        uint32_t members = static_cast<uint32_t>(read(w, f, in.ops[1], std::countr_zero(exec)));
        uint32_t leader = static_cast<uint32_t>(std::countr_zero(exec & members));
        for (uint32_t m = exec; m; m &= m - 1) {
          int lane = std::countr_zero(m);
          const Opnd& d = in.ops[0];
          if (d.kind == OpndKind::kVec) {
            writeReg(f, d.elems[0], lane, leader);
            if (d.elems.size() > 1) writeReg(f, d.elems[1], lane, static_cast<uint32_t>(lane) == leader);
          } else {
            writeReg(f, d, lane, static_cast<uint32_t>(lane) == leader);
          }
        }
        return Step::kContinue;
      }
      case Opcode::kMov: return executeMov(w, f, in, exec);
      case Opcode::kSetp: return executeSetp(w, f, in, exec);
      case Opcode::kCvt: return executeCvt(w, f, in, exec);
      case Opcode::kCvta: {
        bool to = in.m.has(Flag::kTo);
        StateSpace sp = in.m.space;
        uint64_t window = isSharedSpace(sp) ? kSharedWindow
                          : sp == StateSpace::kLocal ? kLocalWindow : 0;
        unsigned bytes = tsize(in.type);
        for (uint32_t m = exec; m; m &= m - 1) {
          int lane = std::countr_zero(m);
          uint64_t a = read(w, f, in.ops[1], lane);
          uint64_t r = to ? a - window : a + window;
          writeReg(f, in.ops[0], lane, truncBytes(r, bytes));
        }
        return Step::kContinue;
      }
      case Opcode::kTestp: {
        // testp.op.type p, a: a property of an f32 or f64 value. "As a
        // special case, positive and negative zero are considered normal
        // numbers" (the ISA), so .normal holds for zeros too.
        for (uint32_t m = exec; m; m &= m - 1) {
          int lane = std::countr_zero(m);
          const uint64_t a = read(w, f, in.ops[1], lane);
          const int cls = in.type == Type::kF64 ? std::fpclassify(asF64(a)) : std::fpclassify(asF32(a));
          const bool r = in.m.has(Flag::kFinite)       ? cls != FP_INFINITE && cls != FP_NAN
                         : in.m.has(Flag::kInfinite)   ? cls == FP_INFINITE
                         : in.m.has(Flag::kNumber)     ? cls != FP_NAN
                         : in.m.has(Flag::kNotanumber) ? cls == FP_NAN
                         : in.m.has(Flag::kNormal)     ? cls == FP_NORMAL || cls == FP_ZERO
                                                       : cls == FP_SUBNORMAL;
          writeReg(f, in.ops[0], lane, r);
        }
        return Step::kContinue;
      }
      case Opcode::kIsspacep: {
        StateSpace sp = in.m.space;
        for (uint32_t m = exec; m; m &= m - 1) {
          int lane = std::countr_zero(m);
          uint64_t a = read(w, f, in.ops[1], lane);
          bool shared = a - kSharedWindow < kWindowSize;
          bool local = a - kLocalWindow < kWindowSize;
          bool r = isSharedSpace(sp) ? shared
                   : sp == StateSpace::kLocal ? local
                   : (sp == StateSpace::kGlobal || sp == StateSpace::kConst) ? (!shared && !local)
                   : false;
          writeReg(f, in.ops[0], lane, r);
        }
        return Step::kContinue;
      }
      default:
        break;
    }
    if (tfloat(in.type) && in.op != Opcode::kSelp && in.op != Opcode::kSlct &&
        in.op != Opcode::kSet) {
      return executeFloat(w, f, in, exec);
    }
    return executeInteger(w, f, in, exec);
  }

  // ---------------------------------------------------------------- calls
  Step executeCall(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    Entry& e = f.stack.back();
    ++e.pc;
    if (exec == 0) return Step::kContinue;
    const Opnd& target = in.ops[1];
    const Opnd& args = in.ops[2];
    int32_t callee = in.callee;
    if (callee < 0) {
      // Indirect call through a function address; every calling lane must agree.
      int lane0 = std::countr_zero(exec);
      uint64_t addr = read(w, f, target, lane0);
      for (uint32_t m = exec; m; m &= m - 1) {
        if (read(w, f, target, std::countr_zero(m)) != addr) {
          return raise(KernelFault::kLaunchFailed, w, in, lane0,
                       "divergent indirect call targets are not supported");
        }
      }
      uint64_t index = (addr - kFunctionWindow) / 16;
      if (addr < kFunctionWindow || (addr - kFunctionWindow) % 16 ||
          index >= code_.functions.size()) {
        return raise(KernelFault::kIllegalAddress, w, in, lane0,
                     fmt::format("indirect call to {:#x}, not a function", addr));
      }
      callee = static_cast<int32_t>(index);
    }
    if (in.builtin != Inst::Builtin::kNone) return executeBuiltin(w, f, in, exec);
    const Function& fn = code_.functions[static_cast<size_t>(callee)];
    if (!fn.hasBody) {
      return raise(KernelFault::kIllegalInstruction, w, in, std::countr_zero(exec),
                   fmt::format("call to {} which has no body", fn.name));
    }
    uint32_t callerIndex = w.depth - 1;
    if (!pushFrame(w, fn, exec, f.localBase + f.fn->localBytes, &in)) return Step::kStop;
    // pushFrame may reallocate the frame vector: re-fetch both frames.
    Frame& caller = w.frames[callerIndex];
    Frame& callee_ = w.frames[w.depth - 1];
    for (size_t i = 0; i < args.elems.size() && i < fn.formalOffsets.size(); ++i) {
      const Opnd& a = args.elems[i];
      uint32_t size = fn.formalSizes[i];
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        uint8_t* dst = &callee_.params[static_cast<size_t>(lane) * fn.paramBytes + fn.formalOffsets[i]];
        if (a.kind == OpndKind::kFrameParamAddr) {
          std::memcpy(dst, &caller.params[static_cast<size_t>(lane) * caller.fn->paramBytes + a.imm],
                      size);
        } else {
          uint64_t v = read(w, caller, a, lane);
          std::memcpy(dst, &v, std::min<uint32_t>(size, 8));
        }
      }
    }
    return Step::kContinue;
  }

  // Reads the bytes of call argument i of one lane (param symbol or value).
  uint64_t callArg(const Warp& w, const Frame& f, const Inst& in, size_t i, int lane) const {
    const Opnd& a = in.ops[2].elems[i];
    if (a.kind == OpndKind::kFrameParamAddr) {
      uint64_t v = 0;
      if (a.imm < f.fn->paramBytes) {
        std::memcpy(&v, &f.params[static_cast<size_t>(lane) * f.fn->paramBytes + a.imm],
                    std::min<uint64_t>(8, f.fn->paramBytes - a.imm));
      }
      return v;
    }
    return read(w, f, a, lane);
  }

  void setCallResult(Frame& f, const Inst& in, int lane, uint64_t v, uint32_t size) {
    if (in.ops[0].elems.empty()) return;
    const Opnd& r = in.ops[0].elems[0];
    if (r.kind == OpndKind::kFrameParamAddr) {
      std::memcpy(&f.params[static_cast<size_t>(lane) * f.fn->paramBytes + r.imm], &v, size);
    } else {
      writeReg(f, r, lane, v);
    }
  }

  Step executeBuiltin(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    switch (in.builtin) {
      case Inst::Builtin::kVprintf: {
        for (uint32_t m = exec; m; m &= m - 1) {
          int lane = std::countr_zero(m);
          uint64_t fmtAddr = callArg(w, f, in, 0, lane);
          uint64_t argsAddr = in.ops[2].elems.size() > 1 ? callArg(w, f, in, 1, lane) : 0;
          DeviceReader reader = [&](uint64_t addr, void* out, size_t n) {
            uint8_t* p = resolveQuiet(w, addr, n, lane);
            if (!p) return false;
            std::memcpy(out, p, n);
            return true;
          };
          Result<FormattedPrintf> r = formatDevicePrintf(fmtAddr, argsAddr, reader);
          if (!r.isOk()) {
            return raise(KernelFault::kIllegalAddress, w, in, lane, r.status().message());
          }
          {
            std::lock_guard lock(s_.printfMutex);
            l_.context.printf->write(r->text);
          }
          setCallResult(f, in, lane, static_cast<uint32_t>(r->arguments), 4);
        }
        return Step::kContinue;
      }
      case Inst::Builtin::kAssertFail: {
        // Each thread that fails the assertion says so, as NVIDIA's driver
        // prints it: to stderr, naming its block and thread.
        auto str = [&](size_t i, int lane) -> std::string {
          if (in.ops[2].elems.size() <= i) return {};
          uint64_t a = callArg(w, f, in, i, lane);
          std::string text;
          for (size_t k = 0; k < 4096; ++k) {
            const uint8_t* p = resolveQuiet(w, a + k, 1, lane);
            if (p == nullptr || *p == 0) break;
            text.push_back(static_cast<char>(*p));
          }
          return text;
        };
        std::string all, first;
        for (uint32_t m = exec; m; m &= m - 1) {
          const int lane = std::countr_zero(m);
          const auto lineNo =
              static_cast<uint32_t>(in.ops[2].elems.size() > 2 ? callArg(w, f, in, 2, lane) : 0);
          const auto t = static_cast<size_t>(lane);
          std::string msg =
              fmt::format("{}:{}: {}: block: [{},{},{}], thread: [{},{},{}] Assertion `{}` failed.",
                          str(1, lane), lineNo, str(3, lane), ctaid_[0], ctaid_[1], ctaid_[2],
                          w.tid[0][t], w.tid[1][t], w.tid[2][t], str(0, lane));
          if (first.empty()) first = msg;
          all += msg + "\n";
        }
        {
          std::lock_guard lock(s_.printfMutex);
          l_.context.printf->writeError(all);
        }
        return raise(KernelFault::kAssert, w, in, std::countr_zero(exec),
                     "device-side assert: " + first);
      }
      case Inst::Builtin::kMalloc:
        // The device heap is not modelled: malloc returns NULL, as when it is exhausted.
        for (uint32_t m = exec; m; m &= m - 1) setCallResult(f, in, std::countr_zero(m), 0, 8);
        return Step::kContinue;
      case Inst::Builtin::kPhosCheck:
        for (uint32_t m = exec; m; m &= m - 1) {
          if (!phosCheck(w, f, in, std::countr_zero(m))) return Step::kStop;
        }
        return Step::kContinue;
      case Inst::Builtin::kFree:
      case Inst::Builtin::kNone:
        return Step::kContinue;
    }
    return Step::kContinue;
  }

  // One lane's call to PhOS's range check, with the effects of its body
  // (phos/instrument/check_function.h) in the same order: the same loads of
  // the range table, the same atomic on the report's count and the same
  // stores of its entry, each resolved as that body's ld/atom/st would be (a
  // fault names the call). vgpu's cvta.global and cvta.to.global are the
  // identity, and isspacep.global is "neither shared nor local".
  bool phosCheck(Warp& w, Frame& f, const Inst& in, int lane) {
    auto u32 = [&](size_t i) { return static_cast<uint32_t>(callArg(w, f, in, i, lane)); };
    uint64_t address = callArg(w, f, in, 0, lane);
    const uint32_t size = u32(1), flags = u32(2), instruction = u32(3), function = u32(4);
    const uint64_t ranges = callArg(w, f, in, 5, lane);
    const uint32_t count = u32(6);
    const uint64_t report = callArg(w, f, in, 7, lane);
    if ((flags & instrument::kCheckFlagGeneric) != 0 &&
        (address - kSharedWindow < kWindowSize || address - kLocalWindow < kWindowSize)) {
      return true;  // not a global address: unchecked
    }
    // When the whole table is readable (and aligned, and no access is being
    // recorded), every load the body makes of it would resolve: they are
    // read directly, without a mapping lookup each.
    const uint64_t tableBytes = uint64_t{count} * sizeof(instrument::RangeEntry);
    const bool tableReadable = !recording_ && ranges % 8 == 0 && ranges + tableBytes >= ranges &&
                               (count == 0 || l_.context.memory->isAccessible(ranges, tableBytes));
    auto load = [&](uint64_t at, uint32_t bytes, uint64_t& value) {
      if (tableReadable && at >= ranges && at + bytes <= ranges + tableBytes) {
        value = 0;
        std::memcpy(&value, reinterpret_cast<const void*>(at), bytes);
        return true;
      }
      const uint8_t* p = resolve(w, f, in, StateSpace::kGlobal, AddrBase::kRegister, at, bytes, bytes, lane, false);
      if (p == nullptr) return false;
      value = 0;
      std::memcpy(&value, p, bytes);
      return true;
    };
    auto store = [&](uint64_t at, uint32_t bytes, uint64_t value) {
      uint8_t* p = resolve(w, f, in, StateSpace::kGlobal, AddrBase::kRegister, at, bytes, bytes, lane, true);
      if (p == nullptr) return false;
      std::memcpy(p, &value, bytes);
      return true;
    };
    const uint32_t kind = flags & instrument::kCheckFlagKindMask;
    const uint32_t need = (flags >> instrument::kCheckFlagNeedShift) & 3;
    const uint64_t end = address + size;
    auto entry = [&](uint32_t i) { return ranges + uint64_t{i} * sizeof(instrument::RangeEntry); };
    // The last entry beginning at or before the address.
    uint32_t lo = 0, hi = count;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) >> 1;
      uint64_t begin = 0;
      if (!load(entry(mid), 8, begin)) return false;
      if (begin > address) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    bool allowed = false;
    if (lo != 0) {
      uint64_t covered = address;
      for (uint32_t i = lo - 1;;) {
        uint64_t begin = 0, rangeEnd = 0, access = 0;
        if (!load(entry(i), 8, begin) || !load(entry(i) + 8, 8, rangeEnd) || !load(entry(i) + 16, 4, access)) {
          return false;
        }
        if (begin > covered || rangeEnd <= covered || (access & need) != need) break;
        if (rangeEnd >= end) {
          allowed = true;
          break;
        }
        covered = rangeEnd;
        if (++i >= count) break;
      }
    }
    if (allowed) return true;
    // atom.global.add.u32 on the count; the entry only below the capacity.
    uint8_t* counter = resolve(w, f, in, StateSpace::kGlobal, AddrBase::kRegister, report, 4, 4, lane, true);
    if (counter == nullptr) return false;
    if (recording_) recordAccess(report, 4, true, false);
    const uint32_t old = atomicRmw<uint32_t>(counter, ptx::AtomOp::kAdd, Type::kU32, 1, 0);
    uint64_t capacity = 0;
    if (!load(report + 4, 4, capacity)) return false;
    if (old >= capacity) return true;
    const uint64_t at = report + uint64_t{old} * sizeof(instrument::ReportEntry);
    return store(at + 8, 8, address) && store(at + 16, 4, instruction) && store(at + 20, 4, kind) &&
           store(at + 24, 4, function) && store(at + 28, 4, size);
  }

  // Generic-address resolution without raising a fault (printf arguments).
  uint8_t* resolveQuiet(Warp& w, uint64_t addr, size_t n, int lane) {
    if (addr - kSharedWindow < kWindowSize) {
      uint64_t off = addr - kSharedWindow;
      if (off - kReservedSharedOffset < kReservedSharedBytes &&
          off + n <= kReservedSharedOffset + kReservedSharedBytes) {
        return reserved_.data() + (off - kReservedSharedOffset);
      }
      return off + n <= shared_.size() ? shared_.data() + off : nullptr;
    }
    if (addr - kLocalWindow < kWindowSize) {
      uint64_t off = addr - kLocalWindow;
      return off + n <= w.localSize ? w.local[static_cast<size_t>(lane)].data() + off : nullptr;
    }
    return l_.context.memory->isAccessible(addr, n) ? reinterpret_cast<uint8_t*>(addr) : nullptr;
  }

  // ---------------------------------------------------------------- barriers
  // barrier.cluster.arrive / .wait (any .sem, .aligned). Launches have no
  // clusters of more than one CTA, so the cluster is the CTA.
  Step executeClusterBarrier(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    ++f.stack.back().pc;
    if (exec == 0) return Step::kContinue;
    if (in.m.has(Flag::kArrive)) {
      clusterBarrier_.arrived += static_cast<uint32_t>(std::popcount(exec));
      w.clusterPhase = clusterBarrier_.phase;
      releaseClusterBarrier();
      return Step::kContinue;
    }
    if (clusterBarrier_.phase > w.clusterPhase) return Step::kContinue;  // its phase has completed
    clusterBarrier_.waiting.push_back(w.index);
    w.state = WarpState::kBarrier;
    return Step::kBlocked;
  }

  // Completes the cluster barrier's phase once every non-exited thread has
  // arrived (threads that exit meanwhile are not waited for).
  bool releaseClusterBarrier() {
    ClusterBarrier& bar = clusterBarrier_;
    if (bar.arrived == 0 || bar.arrived < liveThreads_) return false;
    ++bar.phase;
    bar.arrived = 0;
    for (uint32_t wi : bar.waiting) warps_[wi].state = WarpState::kRunning;
    bar.waiting.clear();
    return true;
  }

  Step executeBarrier(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.m.scope == ptx::Scope::kCluster) return executeClusterBarrier(w, f, in, exec);
    Entry& e = f.stack.back();
    ++e.pc;
    if (in.m.has(Flag::kWarp)) return Step::kContinue;  // bar.warp.sync: lanes are in step
    if (exec == 0) return Step::kContinue;
    bool isRed = in.m.has(Flag::kRed);
    bool arriveOnly = in.m.has(Flag::kArrive);
    size_t first = isRed ? 1 : 0;
    int lane0 = std::countr_zero(exec);
    uint32_t id = in.ops.size() > first ? static_cast<uint32_t>(read(w, f, in.ops[first], lane0)) : 0;
    if (id >= kBarriers) {
      return raise(KernelFault::kIllegalInstruction, w, in, lane0,
                   fmt::format("barrier id {} out of range", id));
    }
    uint32_t count = 0;
    size_t countIndex = first + 1;
    bool hasCount = in.ops.size() > countIndex + (isRed ? 1 : 0);
    if (hasCount) count = static_cast<uint32_t>(read(w, f, in.ops[countIndex], lane0));
    BarrierState& bar = barriers_[id];
    if (hasCount) bar.expected = count;
    bar.arrived += static_cast<uint32_t>(std::popcount(exec));
    if (isRed) {
      const Opnd& c = in.ops.back();
      for (uint32_t m = exec; m; m &= m - 1) {
        bool v = read(w, f, c, std::countr_zero(m)) & 1;
        bar.popc += v;
        bar.allTrue = bar.allTrue && v;
        bar.anyTrue = bar.anyTrue || v;
      }
    }
    if (arriveOnly) return Step::kContinue;
    bar.waiting.push_back(w.index);
    w.state = WarpState::kBarrier;
    if (isRed) {
      w.barrierInst = &in;
      w.barrierMask = exec;
    }
    return Step::kBlocked;
  }

  // ---------------------------------------------------------------- mbarrier
  // The mbarrier object an mbarrier instruction's lane names, or null after
  // raising the fault (a bad address, or one outside shared memory).
  uint8_t* mbarrierObject(Warp& w, Frame& f, const Inst& in, const Opnd& addr, int lane, bool write) {
    const uint64_t a = effectiveAddress(w, f, addr, lane);
    uint8_t* p = resolve(w, f, in, in.m.space, addr.base, a, 8, 8, lane, write);
    if (!p) return nullptr;
    const bool inShared = (p >= shared_.data() && p < shared_.data() + shared_.size()) ||
                          (p >= reserved_.data() && p < reserved_.data() + reserved_.size());
    if (inShared) return p;
    raise(KernelFault::kIllegalAddress, w, in, lane, fmt::format("the mbarrier object at {:#x} is not in shared memory", a));
    return nullptr;
  }

  static Mbarrier loadMbarrier(const uint8_t* p) {
    uint64_t word = 0;
    std::memcpy(&word, p, 8);
    return Mbarrier::decode(word);
  }
  void storeMbarrier(uint8_t* p, const Mbarrier& b) {
    const uint64_t word = b.encode();
    std::memcpy(p, &word, 8);
    mbarrierChanged_ = true;
  }
  // A tx-count past what the object holds (2^20 - 1 either way) is undefined.
  Step txCountOverflow(const Warp& w, const Inst& in, int lane, int32_t tx) {
    return raise(KernelFault::kIllegalInstruction, w, in, lane,
                 fmt::format("the mbarrier's tx-count would be {}, beyond the 2^20 - 1 it holds", tx));
  }

  // cp.async.bulk: `size` bytes (a multiple of 16, both addresses 16-byte
  // aligned) copied when issued; into shared memory the copy then completes
  // that many bytes of the mbarrier's current phase, as the ISA's complete-tx
  // on the copy's completion does. Out to global memory there is nothing to
  // wait for: commit_group and wait_group hold already.
  Step executeBulkCopy(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    const bool toShared = in.m.has(Flag::kMbarrierCompleteTxBytes);
    for (uint32_t m = exec; m; m &= m - 1) {
      const int lane = std::countr_zero(m);
      const uint64_t size = read(w, f, in.ops[2], lane) & 0xffffffffu;
      if (size % 16 != 0) {
        return raise(KernelFault::kMisalignedAddress, w, in, lane,
                     fmt::format("a bulk copy of {} bytes, not a multiple of 16", size));
      }
      if (toShared && size > Mbarrier::kMaxCount) {
        return raise(KernelFault::kIllegalInstruction, w, in, lane,
                     fmt::format("a bulk copy of {} bytes, more than an mbarrier's tx-count can hold", size));
      }
      const Opnd& dst = in.ops[0];
      const Opnd& src = in.ops[1];
      const auto n = static_cast<uint32_t>(size);
      const uint8_t* from = resolve(w, f, in, in.m.space2, src.base, effectiveAddress(w, f, src, lane), n, 16, lane, false);
      if (!from) return Step::kStop;
      uint8_t* to = resolve(w, f, in, in.m.space, dst.base, effectiveAddress(w, f, dst, lane), n, 16, lane, true);
      if (!to) return Step::kStop;
      std::memmove(to, from, n);
      if (!toShared) continue;
      uint8_t* p = mbarrierObject(w, f, in, in.ops[3], lane, true);
      if (!p) return Step::kStop;
      Mbarrier b = loadMbarrier(p);
      b.tx -= static_cast<int32_t>(size);
      if (b.tx < -static_cast<int32_t>(Mbarrier::kMaxCount)) return txCountOverflow(w, in, lane, b.tx);
      b.completeIfDone();
      storeMbarrier(p, b);
    }
    return Step::kContinue;
  }

  // cp.async.mbarrier.arrive: an arrive-on the mbarrier once the thread's
  // earlier cp.async copies complete. Those are complete when issued, so the
  // arrive happens now. Without .noinc the pending count is first raised by
  // one, which the arrive takes back: the object is unchanged.
  Step executeAsyncCopyArrive(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    for (uint32_t m = exec; m; m &= m - 1) {
      const int lane = std::countr_zero(m);
      uint8_t* p = mbarrierObject(w, f, in, in.ops[0], lane, true);
      if (!p) return Step::kStop;
      if (!in.m.has(Flag::kNoinc)) continue;
      Mbarrier b = loadMbarrier(p);
      if (b.pending == 0) {
        return raise(KernelFault::kIllegalInstruction, w, in, lane, "an arrive on an mbarrier phase that expects none");
      }
      --b.pending;
      b.completeIfDone();
      storeMbarrier(p, b);
    }
    return Step::kContinue;
  }

  // The lanes' operations apply one after the other, in lane order. Memory
  // needs no fences here (vgpu's threads see every store at once), so the
  // .release/.acquire semantics and the scopes hold as written. A wait whose
  // phase has not completed ends the warp's turn, letting the warps that will
  // arrive run. Undefined behaviour the ISA names (counts out of range, an
  // arrive past the pending count, a .noComplete arrive that completes the
  // phase) faults instead of running on.
  Step executeMbarrier(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.m.has(Flag::kPendingCount)) {
      for (uint32_t m = exec; m; m &= m - 1) {
        const int lane = std::countr_zero(m);
        writeReg(f, in.ops[0], lane, Mbarrier::decode(read(w, f, in.ops[1], lane)).pending);
      }
      return Step::kContinue;
    }
    const bool arrive = in.m.has(Flag::kArrive) || in.m.has(Flag::kArriveDrop);
    const bool wait = in.m.has(Flag::kTestWait) || in.m.has(Flag::kTryWait);
    const Opnd& addr = in.ops[arrive || wait ? 1 : 0];
    bool incomplete = false;
    for (uint32_t m = exec; m; m &= m - 1) {
      const int lane = std::countr_zero(m);
      uint8_t* p = mbarrierObject(w, f, in, addr, lane, !wait);
      if (!p) return Step::kStop;
      const Mbarrier before = loadMbarrier(p);
      if (wait) {
        const uint64_t v = read(w, f, in.ops[2], lane);
        const uint32_t awaited = in.m.has(Flag::kParity) ? static_cast<uint32_t>(v & 1) : Mbarrier::decode(v).phase;
        const bool complete = before.phase != awaited;  // the awaited phase is the current one until it completes
        writeReg(f, in.ops[0], lane, complete);
        incomplete = incomplete || !complete;
        continue;
      }
      Mbarrier b = before;
      const Step st = arrive ? mbarrierArrive(w, f, in, lane, b) : mbarrierSet(w, f, in, lane, b);
      if (st != Step::kContinue) return st;
      if (arrive) writeReg(f, in.ops[0], lane, before.encode());
      storeMbarrier(p, b);
    }
    if (!incomplete) return Step::kContinue;
    waitYielded_ = true;
    return Step::kBlocked;
  }

  // Operand `i` of an mbarrier instruction as a count the ISA allows (at
  // least `least`, at most 2^20 - 1); nullopt after raising the fault.
  std::optional<uint32_t> mbarrierCount(Warp& w, Frame& f, const Inst& in, size_t i, int lane, uint32_t least) {
    const uint64_t v = read(w, f, in.ops[i], lane) & 0xffffffffu;
    if (v >= least && v <= Mbarrier::kMaxCount) return static_cast<uint32_t>(v);
    raise(KernelFault::kIllegalInstruction, w, in, lane, fmt::format("count {} is outside the range the ISA allows", v));
    return std::nullopt;
  }

  // init, inval, expect_tx, complete_tx.
  Step mbarrierSet(Warp& w, Frame& f, const Inst& in, int lane, Mbarrier& b) {
    if (in.m.has(Flag::kInval)) {
      b = Mbarrier{};
      return Step::kContinue;
    }
    auto n = mbarrierCount(w, f, in, 1, lane, in.m.has(Flag::kInit) ? 1 : 0);
    if (!n) return Step::kStop;
    if (in.m.has(Flag::kInit)) {
      b = Mbarrier{*n, *n, 0, 0};
      return Step::kContinue;
    }
    b.tx += in.m.has(Flag::kCompleteTx) ? -static_cast<int32_t>(*n) : static_cast<int32_t>(*n);
    if (std::abs(b.tx) > static_cast<int32_t>(Mbarrier::kMaxCount)) return txCountOverflow(w, in, lane, b.tx);
    if (in.m.has(Flag::kCompleteTx)) b.completeIfDone();
    return Step::kContinue;
  }

  // arrive and arrive_drop, with a count or .expect_tx's bytes.
  Step mbarrierArrive(Warp& w, Frame& f, const Inst& in, int lane, Mbarrier& b) {
    uint32_t arrivals = 1;
    if (in.m.has(Flag::kExpectTx)) {
      auto n = mbarrierCount(w, f, in, 2, lane, 0);
      if (!n) return Step::kStop;
      b.tx += static_cast<int32_t>(*n);
      if (b.tx > static_cast<int32_t>(Mbarrier::kMaxCount)) return txCountOverflow(w, in, lane, b.tx);
    } else if (in.ops.size() > 2) {
      auto n = mbarrierCount(w, f, in, 2, lane, 1);
      if (!n) return Step::kStop;
      arrivals = *n;
    }
    if (arrivals > b.pending || (in.m.has(Flag::kArriveDrop) && arrivals > b.expected)) {
      return raise(KernelFault::kIllegalInstruction, w, in, lane,
                   fmt::format("{} arrivals on an mbarrier phase that expects {} more", arrivals, b.pending));
    }
    b.pending -= arrivals;
    if (in.m.has(Flag::kArriveDrop)) b.expected -= arrivals;
    if (in.m.has(Flag::kNoComplete) && b.pending == 0 && b.tx == 0) {
      return raise(KernelFault::kIllegalInstruction, w, in, lane, "a .noComplete arrive completed the mbarrier's phase");
    }
    b.completeIfDone();
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- moves
  Step executeMov(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    const Opnd& d = in.ops[0];
    const Opnd& a = in.ops[1];
    unsigned bytes = tsize(in.type);
    if (in.type == Type::kPred) bytes = 1;
    if (a.kind == OpndKind::kVec) {  // pack
      unsigned part = bytes / static_cast<unsigned>(a.elems.size());
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        uint64_t v = 0;
        for (size_t i = 0; i < a.elems.size(); ++i) {
          v |= truncBytes(read(w, f, a.elems[i], lane), part) << (part * 8 * i);
        }
        writeReg(f, d, lane, v);
      }
      return Step::kContinue;
    }
    if (d.kind == OpndKind::kVec) {  // unpack
      unsigned part = bytes / static_cast<unsigned>(d.elems.size());
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        uint64_t v = read(w, f, a, lane);
        for (size_t i = 0; i < d.elems.size(); ++i) {
          writeReg(f, d.elems[i], lane, truncBytes(v >> (part * 8 * i), part));
        }
      }
      return Step::kContinue;
    }
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint64_t v = read(w, f, a, lane);
      writeReg(f, d, lane, in.type == Type::kPred ? (v & 1) : truncBytes(v, bytes));
    }
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- loads/stores
  // Global accesses of a warp usually fall in one allocation: one check of the
  // whole range replaces a check per lane when it succeeds.
  bool warpRangeAccessible(const Warp& w, const Frame& f, const Inst& in, const Opnd& a,
                           uint32_t exec, unsigned total) const {
    StateSpace sp = in.m.space;
    if (a.base != AddrBase::kRegister && a.base != AddrBase::kAbsolute) return false;
    if (sp != StateSpace::kGlobal && sp != StateSpace::kNone && sp != StateSpace::kConst) {
      return false;
    }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t m = exec; m; m &= m - 1) {
      uint64_t addr = effectiveAddress(w, f, a, std::countr_zero(m));
      if (addr & (total - 1)) return false;  // let the per-lane path report it
      lo = std::min(lo, addr);
      hi = std::max(hi, addr);
    }
    if (hi - lo > (1u << 20)) return false;
    if (hi >= kSharedWindow) return false;  // generic shared/local windows
    if (hi + total < hi) return false;
    return l_.context.memory->isAccessible(lo, hi + total - lo);
  }

  Step executeLoad(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.unsupported) return exec ? unsupportedForm(w, in, exec) : Step::kContinue;
    const Opnd& d = in.ops[0];
    const Opnd& a = in.ops[1];
    unsigned elem = tsize(in.type);
    unsigned n = in.m.vectorWidth;
    unsigned total = elem * n;
    bool sign = tsigned(in.type);
    if (total <= 16 && warpRangeAccessible(w, f, in, a, exec, total)) {
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        const uint8_t* p = reinterpret_cast<const uint8_t*>(effectiveAddress(w, f, a, lane));
        if (recording_) recordAccess(reinterpret_cast<uint64_t>(p), total, true, false);
        alignas(16) uint8_t whole[16];
        loadWhole(whole, p, total);
        for (unsigned i = 0; i < n; ++i) {
          uint64_t v = loadBytes(whole + i * elem, elem);
          if (sign) v = static_cast<uint64_t>(sext(v, elem));
          writeReg(f, d.kind == OpndKind::kVec ? d.elems[i] : d, lane, v);
        }
      }
      return Step::kContinue;
    }
    if (isSharedSpace(in.m.space) && a.base != AddrBase::kFrameParam &&
        a.base != AddrBase::kKernelParam && a.base != AddrBase::kLocalVar) {
      // Shared fast path: validate every lane first, so a fault is still reported
      // by the checked path below with nothing loaded.
      std::array<uint32_t, kWarpSize> offsets;
      bool ok = true;
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        uint64_t addr = effectiveAddress(w, f, a, lane);
        ok = ok && (addr & (total - 1)) == 0 && addr + total <= shared_.size();
        offsets[static_cast<size_t>(lane)] = static_cast<uint32_t>(addr);
      }
      if (ok) {
        for (uint32_t m = exec; m; m &= m - 1) {
          int lane = std::countr_zero(m);
          const uint8_t* p = shared_.data() + offsets[static_cast<size_t>(lane)];
          for (unsigned i = 0; i < n; ++i) {
            uint64_t v = loadBytes(p + i * elem, elem);
            if (sign) v = static_cast<uint64_t>(sext(v, elem));
            writeReg(f, d.kind == OpndKind::kVec ? d.elems[i] : d, lane, v);
          }
        }
        return Step::kContinue;
      }
    }
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint64_t addr = effectiveAddress(w, f, a, lane);
      uint8_t* p = resolve(w, f, in, in.m.space, a.base, addr, total, total, lane, false);
      if (!p) return Step::kStop;
      alignas(16) uint8_t whole[16];
      if (total <= 16) loadWhole(whole, p, total);
      for (unsigned i = 0; i < n; ++i) {
        uint64_t v = loadBytes((total <= 16 ? whole : p) + i * elem, elem);
        if (sign) v = static_cast<uint64_t>(sext(v, elem));
        const Opnd& dst = d.kind == OpndKind::kVec ? d.elems[i] : d;
        writeReg(f, dst, lane, v);
      }
    }
    return Step::kContinue;
  }

  Step executeStore(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.unsupported) return exec ? unsupportedForm(w, in, exec) : Step::kContinue;
    const Opnd& a = in.ops[0];
    const Opnd& v = in.ops[1];
    unsigned elem = tsize(in.type);
    unsigned n = in.m.vectorWidth;
    unsigned total = elem * n;
    if (total <= 16 && warpRangeAccessible(w, f, in, a, exec, total)) {
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        uint8_t* p = reinterpret_cast<uint8_t*>(effectiveAddress(w, f, a, lane));
        if (recording_) recordAccess(reinterpret_cast<uint64_t>(p), total, false, true);
        alignas(16) uint8_t whole[16];
        for (unsigned i = 0; i < n; ++i) {
          uint64_t x = read(w, f, v.kind == OpndKind::kVec ? v.elems[i] : v, lane);
          storeBytes(whole + i * elem, x, elem);
        }
        storeWhole(p, whole, total);
      }
      return Step::kContinue;
    }
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint64_t addr = effectiveAddress(w, f, a, lane);
      uint8_t* p = resolve(w, f, in, in.m.space, a.base, addr, total, total, lane, true);
      if (!p) return Step::kStop;
      alignas(16) uint8_t whole[16];
      uint8_t* into = total <= 16 ? whole : p;
      for (unsigned i = 0; i < n; ++i) {
        const Opnd& src = v.kind == OpndKind::kVec ? v.elems[i] : v;
        uint64_t x = read(w, f, src, lane);
        storeBytes(into + i * elem, x, elem);
      }
      if (total <= 16) storeWhole(p, whole, total);
    }
    return Step::kContinue;
  }

  // cp.async.{ca,cg}.shared.global [dst], [src], cp-size{, src-size | ignore-src}.
  // The copy is done at once: one of the orders an asynchronous copy allows,
  // since its bytes are promised only after cp.async.wait_group/wait_all (and
  // to other threads after a barrier), so commit_group and the waits have
  // nothing left to wait for. Bytes past src-size, all of them when ignore-src
  // holds, are written as zeros; only src-size bytes are read.
  Step executeAsyncCopy(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.unsupported) return exec ? unsupportedForm(w, in, exec) : Step::kContinue;
    if (in.m.has(Flag::kCommitGroup) || in.m.has(Flag::kWaitGroup) || in.m.has(Flag::kWaitAll)) {
      return Step::kContinue;
    }
    if (in.m.has(Flag::kArrive)) return executeAsyncCopyArrive(w, f, in, exec);
    if (in.m.has(Flag::kBulk)) return executeBulkCopy(w, f, in, exec);
    const Opnd& dst = in.ops[0];
    const Opnd& src = in.ops[1];
    const auto size = static_cast<uint32_t>(in.ops[2].imm);
    for (uint32_t m = exec; m; m &= m - 1) {
      const int lane = std::countr_zero(m);
      uint32_t srcBytes = size;
      if (in.ops.size() > 3) {
        const uint64_t v = read(w, f, in.ops[3], lane);
        srcBytes = in.ignoreSrc ? ((v & 1) ? 0 : size) : static_cast<uint32_t>(std::min<uint64_t>(v & 0xffffffffu, size));
      }
      uint8_t bytes[16] = {};
      if (srcBytes > 0) {
        const uint8_t* s = resolve(w, f, in, in.m.space2, src.base, effectiveAddress(w, f, src, lane), srcBytes, size,
                                   lane, false);
        if (!s) return Step::kStop;
        std::memcpy(bytes, s, srcBytes);
      }
      uint8_t* d = resolve(w, f, in, in.m.space, dst.base, effectiveAddress(w, f, dst, lane), size, size, lane, true);
      if (!d) return Step::kStop;
      std::memcpy(d, bytes, size);
    }
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- wmma
  // Warp matrix operations: wmma.load.{a,b,c}, wmma.store.d, wmma.mma. The ISA
  // leaves how a fragment's elements are spread over the warp unspecified, and
  // programs may only load, store, multiply, fill and operate element-wise on
  // fragments. vgpu's distribution: element e of the fragment's matrix in
  // row-major order (whatever the layout in memory) is slot e % N of lane e / N,
  // with N = elements / 32; registers hold slots in order, packed types low
  // part first; slots past N (where a GPU keeps copies) read as zero. mma
  // gathers the warp's fragments and computes d = c + sum over k of a * b in k
  // order: f16, bf16 and tf32 products are exact in f32 and each addition
  // rounds once in f32 (a GPU's tensor cores may round differently in the last
  // bits); f64 by fused multiply-adds; integers exactly (.satfinite clamps).
  struct WmmaMatrix {
    uint32_t rows = 0, cols = 0;
    Type type = Type::kNone;
    unsigned bits = 0;     // of an element in a register
    unsigned perReg = 1;   // elements per register
    unsigned memBytes = 0; // of an element in memory
    uint32_t perLane() const { return rows * cols / kWarpSize; }
  };

  static bool wmmaElement(Type t, WmmaMatrix& x) {
    x.type = t;
    switch (t) {
      case Type::kF16: case Type::kBF16: x.bits = 16; x.perReg = 2; x.memBytes = 2; return true;
      case Type::kS8: case Type::kU8: x.bits = 8; x.perReg = 4; x.memBytes = 1; return true;
      case Type::kTF32: case Type::kF32: case Type::kS32: x.bits = 32; x.perReg = 1; x.memBytes = 4; return true;
      case Type::kF64: x.bits = 64; x.perReg = 1; x.memBytes = 8; return true;
      default: return false;
    }
  }

  // The shape and the matrix `which` ('a', 'b', 'c' or 'd') of element type t.
  static bool wmmaMatrix(const Inst& in, char which, Type t, WmmaMatrix& x) {
    uint32_t m = 0, n = 0, k = 0;
    if (in.m.has(Flag::kM16n16k16)) m = 16, n = 16, k = 16;
    else if (in.m.has(Flag::kM32n8k16)) m = 32, n = 8, k = 16;
    else if (in.m.has(Flag::kM8n32k16)) m = 8, n = 32, k = 16;
    else if (in.m.has(Flag::kM16n16k8)) m = 16, n = 16, k = 8;
    else if (in.m.has(Flag::kM8n8k4)) m = 8, n = 8, k = 4;
    else return false;
    x.rows = which == 'a' ? m : which == 'b' ? k : m;
    x.cols = which == 'a' ? k : n;
    return wmmaElement(t, x);
  }

  static double wmmaValue(const WmmaMatrix& x, uint64_t v) {
    switch (x.type) {
      case Type::kF16: return f16ToDouble(static_cast<uint16_t>(v));
      case Type::kBF16: return bf16ToDouble(static_cast<uint16_t>(v));
      case Type::kTF32: return asF32(v & 0xffffe000u);  // the tensor cores read 10 fraction bits
      case Type::kF32: return asF32(v);
      case Type::kF64: return asF64(v);
      case Type::kS8: return static_cast<int8_t>(v);
      case Type::kU8: return static_cast<uint8_t>(v);
      case Type::kS32: return static_cast<int32_t>(v);
      default: return 0;
    }
  }

  // The registers of `vec` for `lane`, and its slot `s`.
  uint64_t wmmaSlot(const Warp& w, const Frame& f, const Opnd& vec, const WmmaMatrix& x, int lane, uint32_t s) const {
    const uint64_t reg = read(w, f, vec.elems[s / x.perReg], lane);
    return x.bits == 64 ? reg : (reg >> ((s % x.perReg) * x.bits)) & ((uint64_t{1} << x.bits) - 1);
  }
  static void wmmaStoreSlots(Frame& f, const Opnd& vec, const WmmaMatrix& x, int lane, const std::vector<uint64_t>& slots) {
    for (size_t r = 0; r < vec.elems.size(); ++r) {
      uint64_t v = 0;
      for (unsigned p = 0; p < x.perReg; ++p) {
        const size_t s = r * x.perReg + p;
        const uint64_t part = s < slots.size() ? slots[s] : 0;
        v |= x.bits == 64 ? part : part << (p * x.bits);
      }
      writeReg(f, vec.elems[r], lane, v);
    }
  }

  Step executeWmma(Warp& w, Frame& f, const Inst& in, uint32_t mask, uint32_t exec) {
    auto unsupported = [&](const std::string& why) {
      return raise(KernelFault::kIllegalInstruction, w, in, std::countr_zero(exec | 1u),
                   fmt::format("unsupported wmma: {}", why));
    };
    if (exec == 0) return Step::kContinue;
    // .sync.aligned: the whole warp executes it together.
    if (exec != mask || std::popcount(exec) != static_cast<int>(kWarpSize)) {
      return raise(KernelFault::kIllegalInstruction, w, in, std::countr_zero(exec),
                   "wmma executed by part of a warp (it needs all 32 threads, converged)");
    }
    const bool load = in.m.has(Flag::kLoad), store = in.m.has(Flag::kStore);
    if (load || store) {
      const char which = in.m.has(Flag::kA) ? 'a' : in.m.has(Flag::kB) ? 'b' : in.m.has(Flag::kC) ? 'c' : 'd';
      WmmaMatrix x;
      if (!wmmaMatrix(in, which, in.type, x)) return unsupported(fmt::format("shape or type {}", ptx::name(in.type)));
      const Opnd& vec = load ? in.ops[0] : in.ops[1];
      const Opnd& addr = load ? in.ops[1] : in.ops[0];
      if (vec.kind != OpndKind::kVec || vec.elems.size() * x.perReg < x.perLane()) {
        return unsupported(fmt::format("a fragment of {} elements per thread needs {} registers", x.perLane(),
                                       (x.perLane() + x.perReg - 1) / x.perReg));
      }
      const bool rowMajor = in.m.has(Flag::kRow);
      const uint32_t n = x.perLane();
      for (uint32_t m = exec; m; m &= m - 1) {
        const int lane = std::countr_zero(m);
        const uint64_t base = effectiveAddress(w, f, addr, lane);
        const uint64_t ldm = in.ops.size() > 2 ? read(w, f, in.ops[2], lane) & 0xffffffffu : (rowMajor ? x.cols : x.rows);
        std::vector<uint64_t> slots(vec.elems.size() * x.perReg, 0);
        for (uint32_t s = 0; s < n; ++s) {
          const uint32_t e = static_cast<uint32_t>(lane) * n + s, r = e / x.cols, c = e % x.cols;
          const uint64_t at = base + (rowMajor ? r * ldm + c : c * ldm + r) * x.memBytes;
          uint8_t* p = resolve(w, f, in, in.m.space, addr.base, at, x.memBytes, x.memBytes, lane, store);
          if (!p) return Step::kStop;
          if (load) slots[s] = loadBytes(p, x.memBytes);
          else storeBytes(p, wmmaSlot(w, f, vec, x, lane, s), x.memBytes);
        }
        if (load) wmmaStoreSlots(f, vec, x, lane, slots);
      }
      return Step::kContinue;
    }
    // wmma.mma.sync.aligned.alayout.blayout.shape.dtype.ctype d, a, b, c (f16), or
    // .shape.dtype.atype.btype.ctype (bf16, tf32, integers, f64).
    const auto& types = in.m.types;
    const unsigned count = in.m.typeCount;
    if (count != 2 && count != 4) return unsupported("types");
    const Type dtype = types[0], ctype = types[count - 1];
    const Type atype = count == 4 ? types[1] : Type::kF16, btype = count == 4 ? types[2] : Type::kF16;
    WmmaMatrix A, B, C, D;
    if (!wmmaMatrix(in, 'a', atype, A) || !wmmaMatrix(in, 'b', btype, B) || !wmmaMatrix(in, 'c', ctype, C) ||
        !wmmaMatrix(in, 'd', dtype, D)) {
      return unsupported("shape or types");
    }
    const Opnd* frags[4] = {&in.ops[0], &in.ops[1], &in.ops[2], &in.ops[3]};
    const WmmaMatrix* shapes[4] = {&D, &A, &B, &C};
    for (int i = 0; i < 4; ++i) {
      if (frags[i]->kind != OpndKind::kVec || frags[i]->elems.size() * shapes[i]->perReg < shapes[i]->perLane()) {
        return unsupported("fragment sizes");
      }
    }
    const bool integer = atype == Type::kS8 || atype == Type::kU8;
    const bool f64 = atype == Type::kF64;
    if (integer != (ctype == Type::kS32) || f64 != (ctype == Type::kF64)) return unsupported("accumulator type");
    auto gather = [&](const Opnd& vec, const WmmaMatrix& x) {
      std::vector<double> v(static_cast<size_t>(x.rows) * x.cols);
      const uint32_t n = x.perLane();
      for (int lane = 0; lane < static_cast<int>(kWarpSize); ++lane) {
        for (uint32_t s = 0; s < n; ++s) v[static_cast<size_t>(lane) * n + s] = wmmaValue(x, wmmaSlot(w, f, vec, x, lane, s));
      }
      return v;
    };
    const std::vector<double> a = gather(in.ops[1], A), b = gather(in.ops[2], B), c = gather(in.ops[3], C);
    const uint32_t M = A.rows, K = A.cols, N = B.cols;
    const bool satfinite = in.m.has(Flag::kSatfinite);
    std::vector<uint64_t> d(static_cast<size_t>(M) * N);
    for (uint32_t i = 0; i < M; ++i) {
      for (uint32_t j = 0; j < N; ++j) {
        const double cij = c[static_cast<size_t>(i) * N + j];
        uint64_t bits = 0;
        if (integer) {
          int64_t acc = static_cast<int64_t>(cij);
          for (uint32_t k = 0; k < K; ++k) {
            acc += static_cast<int64_t>(a[static_cast<size_t>(i) * K + k]) * static_cast<int64_t>(b[static_cast<size_t>(k) * N + j]);
          }
          if (satfinite) acc = std::clamp<int64_t>(acc, INT32_MIN, INT32_MAX);
          bits = static_cast<uint32_t>(static_cast<int32_t>(static_cast<uint32_t>(acc)));
        } else if (f64) {
          double acc = cij;
          for (uint32_t k = 0; k < K; ++k) acc = std::fma(a[static_cast<size_t>(i) * K + k], b[static_cast<size_t>(k) * N + j], acc);
          bits = std::bit_cast<uint64_t>(acc);
        } else {
          float acc = static_cast<float>(cij);
          for (uint32_t k = 0; k < K; ++k) {
            const float product = static_cast<float>(a[static_cast<size_t>(i) * K + k]) *
                                  static_cast<float>(b[static_cast<size_t>(k) * N + j]);  // exact
            acc += product;
          }
          bits = dtype == Type::kF16 ? doubleToF16(acc, ptx::Rounding::kRn) : bitsOf(acc);
        }
        d[static_cast<size_t>(i) * N + j] = bits;
      }
    }
    const uint32_t n = D.perLane();
    for (int lane = 0; lane < static_cast<int>(kWarpSize); ++lane) {
      std::vector<uint64_t> slots(n);
      for (uint32_t s = 0; s < n; ++s) slots[s] = d[static_cast<size_t>(lane) * n + s];
      wmmaStoreSlots(f, in.ops[0], D, lane, slots);
    }
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- mma.sync, ldmatrix
  // Unlike wmma's, these fragments have the layouts the PTX ISA documents
  // ("Matrix fragments for mma.m16n8k16 / m16n8k8", "ldmatrix"): with
  // g = laneid / 4 and t = laneid % 4, an 8 x 8 matrix of b16 gives each
  // thread the pair (row g, columns 2t and 2t + 1), low half first.
  bool wholeWarp(Warp& w, const Inst& in, uint32_t mask, uint32_t exec, Step& step) {
    if (exec == mask && std::popcount(exec) == static_cast<int>(kWarpSize)) return true;
    step = raise(KernelFault::kIllegalInstruction, w, in, std::countr_zero(exec | 1u),
                 fmt::format("{} executed by part of a warp (it needs all 32 threads, converged)", ptx::name(in.op)));
    return false;
  }
  static const Opnd& vecElem(const Opnd& o, size_t i) { return o.kind == OpndKind::kVec ? o.elems[i] : o; }
  static size_t vecSize(const Opnd& o) { return o.kind == OpndKind::kVec ? o.elems.size() : 1; }

  // ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared}.b16 d, [a]: thread
  // 8j + r gives the address of row r (16 bytes) of matrix j; .trans hands out
  // the transposed matrices.
  Step executeLdmatrix(Warp& w, Frame& f, const Inst& in, uint32_t mask, uint32_t exec) {
    if (exec == 0) return Step::kContinue;
    Step step = Step::kContinue;
    if (!wholeWarp(w, in, mask, exec, step)) return step;
    const unsigned count = in.m.has(Flag::kX4) ? 4 : in.m.has(Flag::kX2) ? 2 : 1;
    if (!in.m.has(Flag::kM8n8) || tsize(in.type) != 2 || vecSize(in.ops[0]) != count) {
      return raise(KernelFault::kIllegalInstruction, w, in, 0, "unsupported ldmatrix form (only .m8n8 .b16)");
    }
    const bool trans = in.m.has(Flag::kTrans);
    const Opnd& a = in.ops[1];
    uint16_t rows[4][8][8];
    for (unsigned j = 0; j < count; ++j) {
      for (int r = 0; r < 8; ++r) {
        const int lane = static_cast<int>(8 * j) + r;
        const uint8_t* p = resolve(w, f, in, in.m.space, a.base, effectiveAddress(w, f, a, lane), 16, 16, lane, false);
        if (!p) return Step::kStop;
        for (int c = 0; c < 8; ++c) rows[j][r][c] = static_cast<uint16_t>(loadBytes(p + 2 * c, 2));
      }
    }
    for (int lane = 0; lane < static_cast<int>(kWarpSize); ++lane) {
      const int g = lane / 4, c = 2 * (lane % 4);
      for (unsigned j = 0; j < count; ++j) {
        const uint32_t lo = trans ? rows[j][c][g] : rows[j][g][c];
        const uint32_t hi = trans ? rows[j][c + 1][g] : rows[j][g][c + 1];
        writeReg(f, vecElem(in.ops[0], j), lane, lo | (hi << 16));
      }
    }
    return Step::kContinue;
  }

  // stmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16 [p], r: ldmatrix
  // backwards. Register j of the warp holds matrix j in the layout the ISA
  // documents (thread t: row t / 4, columns 2(t % 4) and 2(t % 4) + 1, or
  // those of the transpose with .trans); thread 8j + r gives the address of
  // row r of matrix j, 16 bytes aligned to 16. Other shapes (.m16n8 of .b8)
  // fault.
  Step executeStmatrix(Warp& w, Frame& f, const Inst& in, uint32_t mask, uint32_t exec) {
    if (exec == 0) return Step::kContinue;
    Step step = Step::kContinue;
    if (!wholeWarp(w, in, mask, exec, step)) return step;
    const unsigned count = in.m.has(Flag::kX4) ? 4 : in.m.has(Flag::kX2) ? 2 : 1;
    if (!in.m.has(Flag::kM8n8) || tsize(in.type) != 2 || in.ops.size() != 2 || vecSize(in.ops[1]) != count) {
      return raise(KernelFault::kIllegalInstruction, w, in, 0, "unsupported stmatrix form (only .m8n8 .b16)");
    }
    const bool trans = in.m.has(Flag::kTrans);
    uint16_t rows[4][8][8];
    for (int lane = 0; lane < static_cast<int>(kWarpSize); ++lane) {
      const int g = lane / 4, c = 2 * (lane % 4);
      for (unsigned j = 0; j < count; ++j) {
        const uint32_t v = static_cast<uint32_t>(read(w, f, vecElem(in.ops[1], j), lane));
        (trans ? rows[j][c][g] : rows[j][g][c]) = static_cast<uint16_t>(v);
        (trans ? rows[j][c + 1][g] : rows[j][g][c + 1]) = static_cast<uint16_t>(v >> 16);
      }
    }
    const Opnd& a = in.ops[0];
    for (unsigned j = 0; j < count; ++j) {
      for (int r = 0; r < 8; ++r) {
        const int lane = static_cast<int>(8 * j) + r;
        uint8_t* p = resolve(w, f, in, in.m.space, a.base, effectiveAddress(w, f, a, lane), 16, 16, lane, true);
        if (!p) return Step::kStop;
        for (int c = 0; c < 8; ++c) storeBytes(p + 2 * c, rows[j][r][c], 2);
      }
    }
    return Step::kContinue;
  }

  // movmatrix.sync.aligned.m8n8.trans.b16 d, a: the warp's 8 x 8 matrix of
  // b16, held in ldmatrix's layout, transposed into the same layout.
  Step executeMovmatrix(Warp& w, Frame& f, const Inst& in, uint32_t mask, uint32_t exec) {
    if (exec == 0) return Step::kContinue;
    Step step = Step::kContinue;
    if (!wholeWarp(w, in, mask, exec, step)) return step;
    if (!in.m.has(Flag::kM8n8) || !in.m.has(Flag::kTrans) || tsize(in.type) != 2 || in.ops.size() != 2) {
      return raise(KernelFault::kIllegalInstruction, w, in, 0, "unsupported movmatrix form (only .m8n8.trans.b16)");
    }
    uint16_t m[8][8];
    for (int lane = 0; lane < static_cast<int>(kWarpSize); ++lane) {
      const int g = lane / 4, c = 2 * (lane % 4);
      const uint32_t v = static_cast<uint32_t>(read(w, f, in.ops[1], lane));
      m[g][c] = static_cast<uint16_t>(v);
      m[g][c + 1] = static_cast<uint16_t>(v >> 16);
    }
    for (int lane = 0; lane < static_cast<int>(kWarpSize); ++lane) {
      const int g = lane / 4, c = 2 * (lane % 4);
      writeReg(f, in.ops[0], lane, static_cast<uint32_t>(m[c][g]) | (static_cast<uint32_t>(m[c + 1][g]) << 16));
    }
    return Step::kContinue;
  }

  // mma.sync.aligned.{m16n8k16,m16n8k8}.row.col.{f32,f16}.{f16,bf16}.{f16,bf16}.{f32,f16}
  // d, a, b, c: products exact in f32, summed in k order from c, each addition
  // rounded once (the order a GPU uses is not specified).
  Step executeMmaSync(Warp& w, Frame& f, const Inst& in, uint32_t mask, uint32_t exec) {
    if (exec == 0) return Step::kContinue;
    Step step = Step::kContinue;
    if (!wholeWarp(w, in, mask, exec, step)) return step;
    const auto& types = in.m.types;
    const bool k16 = in.m.has(Flag::kM16n8k16), k8 = in.m.has(Flag::kM16n8k8);
    const Type dtype = types[0], atype = types[1], btype = types[2], ctype = types[3];
    const bool halfInputs = (atype == Type::kF16 || atype == Type::kBF16) && btype == atype;
    const bool accOk = (dtype == Type::kF32 || dtype == Type::kF16) && (ctype == Type::kF32 || ctype == Type::kF16) &&
                       (atype == Type::kF16 || (dtype == Type::kF32 && ctype == Type::kF32));
    const uint32_t K = k16 ? 16 : 8;
    const size_t aRegs = K / 4, bRegs = K / 8, cRegs = ctype == Type::kF32 ? 4 : 2, dRegs = dtype == Type::kF32 ? 4 : 2;
    if (in.m.typeCount != 4 || !(k16 || k8) || !halfInputs || !accOk || !in.m.has(Flag::kRow) ||
        !in.m.has(Flag::kCol) || vecSize(in.ops[0]) != dRegs || vecSize(in.ops[1]) != aRegs ||
        vecSize(in.ops[2]) != bRegs || vecSize(in.ops[3]) != cRegs) {
      return raise(KernelFault::kIllegalInstruction, w, in, 0,
                   "unsupported mma form (vgpu runs .m16n8k16 and .m16n8k8 .row.col with f16/bf16 inputs)");
    }
    auto half = [&](Type t, uint32_t bits) {
      return t == Type::kBF16 ? static_cast<float>(bf16ToDouble(static_cast<uint16_t>(bits)))
                              : static_cast<float>(f16ToDouble(static_cast<uint16_t>(bits)));
    };
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < static_cast<int>(kWarpSize); ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (size_t r = 0; r < aRegs; ++r) {  // a_r: row g (+8 for odd r), columns 2t, 2t+1 (+8 from r = 2)
        const uint32_t v = static_cast<uint32_t>(read(w, f, vecElem(in.ops[1], r), lane));
        const int row = g + 8 * static_cast<int>(r % 2), col = 2 * t + 8 * static_cast<int>(r / 2);
        A[row][col] = half(atype, v & 0xffffu);
        A[row][col + 1] = half(atype, v >> 16);
      }
      for (size_t r = 0; r < bRegs; ++r) {  // b_r: rows 2t, 2t+1 (+8 for r = 1), column g
        const uint32_t v = static_cast<uint32_t>(read(w, f, vecElem(in.ops[2], r), lane));
        const int row = 2 * t + 8 * static_cast<int>(r);
        B[row][g] = half(btype, v & 0xffffu);
        B[row + 1][g] = half(btype, v >> 16);
      }
      for (size_t r = 0; r < cRegs; ++r) {
        const uint64_t v = read(w, f, vecElem(in.ops[3], r), lane);
        if (ctype == Type::kF32) {  // c_r: row g (+8 from r = 2), column 2t + r % 2
          C[g + 8 * static_cast<int>(r / 2)][2 * t + static_cast<int>(r % 2)] = asF32(v);
        } else {  // an f16x2 per row: row g (+8 for r = 1), columns 2t, 2t+1
          C[g + 8 * static_cast<int>(r)][2 * t] = half(Type::kF16, static_cast<uint32_t>(v) & 0xffffu);
          C[g + 8 * static_cast<int>(r)][2 * t + 1] = half(Type::kF16, static_cast<uint32_t>(v >> 16) & 0xffffu);
        }
      }
    }
    float D[16][8];
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 8; ++j) {
        float acc = C[i][j];
        for (uint32_t k = 0; k < K; ++k) acc += A[i][k] * B[k][j];  // each product exact in f32
        D[i][j] = acc;
      }
    }
    for (int lane = 0; lane < static_cast<int>(kWarpSize); ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (size_t r = 0; r < dRegs; ++r) {
        uint64_t v;
        if (dtype == Type::kF32) {
          v = bitsOf(D[g + 8 * static_cast<int>(r / 2)][2 * t + static_cast<int>(r % 2)]);
        } else {
          const int row = g + 8 * static_cast<int>(r);
          v = doubleToF16(D[row][2 * t], ptx::Rounding::kRn) |
              (static_cast<uint64_t>(doubleToF16(D[row][2 * t + 1], ptx::Rounding::kRn)) << 16);
        }
        writeReg(f, vecElem(in.ops[0], r), lane, v);
      }
    }
    return Step::kContinue;
  }

  template <typename T>
  static T atomicApply(ptx::AtomOp op, Type type, T old, T b, T c, bool* store) {
    *store = true;
    switch (op) {
      case ptx::AtomOp::kAnd: return old & b;
      case ptx::AtomOp::kOr: return old | b;
      case ptx::AtomOp::kXor: return old ^ b;
      case ptx::AtomOp::kExch: return b;
      case ptx::AtomOp::kCas:
        if (old != b) *store = false;
        return c;
      case ptx::AtomOp::kInc: return old >= b ? T{0} : static_cast<T>(old + 1);
      case ptx::AtomOp::kDec: return (old == 0 || old > b) ? b : static_cast<T>(old - 1);
      case ptx::AtomOp::kAdd:
        if (type == Type::kF32) {
          // atom.add.f32 rounds to nearest even and flushes subnormal inputs and
          // results to sign-preserving zero.
          float r = flushF32(flushF32(asF32(old)) + flushF32(asF32(b)));
          return static_cast<T>(finishF32(r, true, false));
        }
        if (type == Type::kF64) return static_cast<T>(bitsOf(asF64(old) + asF64(b)));
        if (type == Type::kF16) {
          return static_cast<T>(doubleToF16(f16ToDouble(static_cast<uint16_t>(old)) +
                                            f16ToDouble(static_cast<uint16_t>(b)), ptx::Rounding::kRn));
        }
        if (type == Type::kBF16) {
          return static_cast<T>(doubleToBF16(bf16ToDouble(static_cast<uint16_t>(old)) +
                                             bf16ToDouble(static_cast<uint16_t>(b)), ptx::Rounding::kRn));
        }
        if (type == Type::kF16x2 || type == Type::kBF16x2) {
          bool bf = type == Type::kBF16x2;
          uint32_t r = 0;
          for (int h = 0; h < 2; ++h) {
            uint16_t x = static_cast<uint16_t>(static_cast<uint64_t>(old) >> (16 * h));
            uint16_t y = static_cast<uint16_t>(static_cast<uint64_t>(b) >> (16 * h));
            uint16_t s = bf ? doubleToBF16(bf16ToDouble(x) + bf16ToDouble(y), ptx::Rounding::kRn)
                            : doubleToF16(f16ToDouble(x) + f16ToDouble(y), ptx::Rounding::kRn);
            r |= static_cast<uint32_t>(s) << (16 * h);
          }
          return static_cast<T>(r);
        }
        return static_cast<T>(old + b);
      case ptx::AtomOp::kMin: case ptx::AtomOp::kMax: {
        bool isMin = op == ptx::AtomOp::kMin;
        if (type == Type::kF32 || type == Type::kF64) {
          double x = type == Type::kF32 ? asF32(old) : asF64(old);
          double y = type == Type::kF32 ? asF32(b) : asF64(b);
          if (std::isnan(y)) return old;
          if (std::isnan(x)) return b;
          return (isMin ? y < x : y > x) ? b : old;
        }
        if (tsigned(type)) {
          int64_t x = sext(static_cast<uint64_t>(old), sizeof(T));
          int64_t y = sext(static_cast<uint64_t>(b), sizeof(T));
          return (isMin ? y < x : y > x) ? b : old;
        }
        return isMin ? std::min(old, b) : std::max(old, b);
      }
      default:
        break;
    }
    *store = false;
    return old;
  }

  template <typename T>
  static T atomicRmw(uint8_t* p, ptx::AtomOp op, Type type, T b, T c) {
    std::atomic_ref<T> ref(*reinterpret_cast<T*>(p));
    T old = ref.load(std::memory_order_relaxed);
    for (;;) {
      bool store = false;
      T desired = atomicApply<T>(op, type, old, b, c, &store);
      if (!store) return old;
      if (ref.compare_exchange_weak(old, desired, std::memory_order_acq_rel,
                                    std::memory_order_relaxed)) {
        return old;
      }
    }
  }

  Step executeAtomic(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    bool isRed = in.op == Opcode::kRed;
    size_t ai = isRed ? 0 : 1;
    const Opnd& a = in.ops[ai];
    const Opnd& bo = in.ops[ai + 1];
    const Opnd* co = in.ops.size() > ai + 2 ? &in.ops[ai + 2] : nullptr;
    unsigned size = tsize(in.type);
    if (in.m.vectorWidth != 1 || (size != 2 && size != 4 && size != 8)) {
      return raise(KernelFault::kIllegalInstruction, w, in, std::countr_zero(exec),
                   "unsupported atomic operand type");
    }
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint64_t addr = effectiveAddress(w, f, a, lane);
      uint8_t* p = resolve(w, f, in, in.m.space, a.base, addr, size, size, lane, true);
      if (!p) return Step::kStop;
      uint64_t b = read(w, f, bo, lane);
      uint64_t c = co ? read(w, f, *co, lane) : 0;
      uint64_t old;
      if (size == 2) {
        old = atomicRmw<uint16_t>(p, in.m.atomOp, in.type, static_cast<uint16_t>(b),
                                  static_cast<uint16_t>(c));
      } else if (size == 4) {
        old = atomicRmw<uint32_t>(p, in.m.atomOp, in.type, static_cast<uint32_t>(b),
                                  static_cast<uint32_t>(c));
      } else {
        old = atomicRmw<uint64_t>(p, in.m.atomOp, in.type, b, c);
      }
      if (!isRed) {
        if (tsigned(in.type)) old = static_cast<uint64_t>(sext(old, size));
        writeReg(f, in.ops[0], lane, old);
      }
    }
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- warp primitives
  Step executeShfl(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    // shfl.sync.mode.b32 d[|p], a, b, c, membermask;
    const Opnd& d = in.ops[0];
    const Opnd* dst = &d;
    const Opnd* pred = nullptr;
    if (d.kind == OpndKind::kVec) {
      dst = &d.elems[0];
      if (d.elems.size() > 1) pred = &d.elems[1];
    }
    std::array<uint32_t, kWarpSize> values{};
    for (int lane = 0; lane < kWarpSize; ++lane) {
      values[static_cast<size_t>(lane)] = static_cast<uint32_t>(read(w, f, in.ops[1], lane));
    }
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint32_t b = static_cast<uint32_t>(read(w, f, in.ops[2], lane));
      uint32_t c = static_cast<uint32_t>(read(w, f, in.ops[3], lane));
      uint32_t bval = b & 0x1f;
      uint32_t cval = c & 0x1f;
      uint32_t segmask = (c >> 8) & 0x1f;
      uint32_t ulane = static_cast<uint32_t>(lane);
      uint32_t maxLane = (ulane & segmask) | (cval & ~segmask);
      uint32_t minLane = ulane & segmask;
      int64_t j;
      bool valid;
      if (in.m.has(Flag::kUp)) {
        j = static_cast<int64_t>(ulane) - bval;
        valid = j >= static_cast<int64_t>(maxLane);
      } else if (in.m.has(Flag::kDown)) {
        j = ulane + bval;
        valid = j <= static_cast<int64_t>(maxLane);
      } else if (in.m.has(Flag::kBfly)) {
        j = ulane ^ bval;
        valid = j <= static_cast<int64_t>(maxLane);
      } else {
        j = minLane | (bval & ~segmask);
        valid = j <= static_cast<int64_t>(maxLane);
      }
      if (!valid) j = lane;
      writeReg(f, *dst, lane, values[static_cast<size_t>(j)]);
      if (pred) writeReg(f, *pred, lane, valid);
    }
    return Step::kContinue;
  }

  // The lanes a .sync warp operation of `lane` acts on: those of its
  // membermask (operand `maskOperand`, when the form has one) that execute it
  // together. Lanes that pass different masks (cooperative groups'
  // binary_partition, labeled_partition) form separate groups.
  uint32_t syncGroup(const Warp& w, const Frame& f, const Inst& in, size_t maskOperand, int lane,
                     uint32_t exec) const {
    if (in.ops.size() <= maskOperand) return exec;
    return static_cast<uint32_t>(read(w, f, in.ops[maskOperand], lane)) & exec;
  }

  Step executeVote(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    uint32_t ballot = 0;
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      if (read(w, f, in.ops[1], lane) & 1) ballot |= 1u << lane;
    }
    for (uint32_t m = exec; m; m &= m - 1) {
      const int lane = std::countr_zero(m);
      const uint32_t group = syncGroup(w, f, in, 2, lane, exec);
      const uint32_t votes = ballot & group;
      uint64_t r;
      if (in.m.has(Flag::kBallot)) {
        r = votes;
      } else if (in.m.has(Flag::kAll)) {
        r = votes == group;
      } else if (in.m.has(Flag::kAny)) {
        r = votes != 0;
      } else {
        r = votes == group || votes == 0;  // .uni
      }
      writeReg(f, in.ops[0], lane, r);
    }
    return Step::kContinue;
  }

  Step executeMatch(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    const Opnd& d = in.ops[0];
    const Opnd* dst = d.kind == OpndKind::kVec ? &d.elems[0] : &d;
    const Opnd* pred = d.kind == OpndKind::kVec && d.elems.size() > 1 ? &d.elems[1] : nullptr;
    unsigned bytes = tsize(in.type);
    std::array<uint64_t, kWarpSize> v{};
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      v[static_cast<size_t>(lane)] = truncBytes(read(w, f, in.ops[1], lane), bytes);
    }
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      const uint32_t group = syncGroup(w, f, in, 2, lane, exec);
      uint32_t r = 0;
      if (in.m.has(Flag::kAll)) {
        bool all = true;
        for (uint32_t k = group; k; k &= k - 1) {
          all = all && v[static_cast<size_t>(std::countr_zero(k))] == v[static_cast<size_t>(lane)];
        }
        r = all ? group : 0;
        if (pred) writeReg(f, *pred, lane, all);
      } else {
        for (uint32_t k = group; k; k &= k - 1) {
          int other = std::countr_zero(k);
          if (v[static_cast<size_t>(other)] == v[static_cast<size_t>(lane)]) r |= 1u << other;
        }
      }
      writeReg(f, *dst, lane, r);
    }
    return Step::kContinue;
  }

  Step executeRedux(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    bool sign = tsigned(in.type);
    std::array<int64_t, kWarpSize> x{};
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint32_t raw = static_cast<uint32_t>(read(w, f, in.ops[1], lane));
      x[static_cast<size_t>(lane)] = sign ? static_cast<int32_t>(raw) : static_cast<int64_t>(raw);
    }
    uint32_t lastGroup = 0;
    uint64_t lastResult = 0;
    for (uint32_t m = exec; m; m &= m - 1) {
      const int lane = std::countr_zero(m);
      const uint32_t group = syncGroup(w, f, in, 2, lane, exec);
      if (group != lastGroup || lastGroup == 0) {
        int64_t acc = 0;
        bool firstLane = true;
        for (uint32_t k = group; k; k &= k - 1) {
          const int64_t v = x[static_cast<size_t>(std::countr_zero(k))];
          if (firstLane) {
            acc = v;
            firstLane = false;
            continue;
          }
          switch (in.m.atomOp) {
            case ptx::AtomOp::kAdd: acc += v; break;
            case ptx::AtomOp::kMin: acc = std::min(acc, v); break;
            case ptx::AtomOp::kMax: acc = std::max(acc, v); break;
            case ptx::AtomOp::kAnd: acc &= v; break;
            case ptx::AtomOp::kOr: acc |= v; break;
            case ptx::AtomOp::kXor: acc ^= v; break;
            default: break;
          }
        }
        lastGroup = group;
        lastResult = static_cast<uint32_t>(acc);
      }
      writeReg(f, in.ops[0], lane, lastResult);
    }
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- comparisons
  static bool compareInt(ptx::CmpOp op, uint64_t a, uint64_t b, Type t) {
    unsigned bytes = tsize(t);
    bool sign = tsigned(t);
    int64_t sa = sext(a, bytes), sb = sext(b, bytes);
    uint64_t ua = truncBytes(a, bytes), ub = truncBytes(b, bytes);
    switch (op) {
      case ptx::CmpOp::kEq: return ua == ub;
      case ptx::CmpOp::kNe: return ua != ub;
      case ptx::CmpOp::kLt: return sign ? sa < sb : ua < ub;
      case ptx::CmpOp::kLe: return sign ? sa <= sb : ua <= ub;
      case ptx::CmpOp::kGt: return sign ? sa > sb : ua > ub;
      case ptx::CmpOp::kGe: return sign ? sa >= sb : ua >= ub;
      case ptx::CmpOp::kLo: return ua < ub;
      case ptx::CmpOp::kLs: return ua <= ub;
      case ptx::CmpOp::kHi: return ua > ub;
      case ptx::CmpOp::kHs: return ua >= ub;
      default: return false;
    }
  }

  static bool compareFloat(ptx::CmpOp op, double a, double b) {
    bool unordered = std::isnan(a) || std::isnan(b);
    switch (op) {
      case ptx::CmpOp::kEq: return !unordered && a == b;
      case ptx::CmpOp::kNe: return !unordered && a != b;
      case ptx::CmpOp::kLt: return !unordered && a < b;
      case ptx::CmpOp::kLe: return !unordered && a <= b;
      case ptx::CmpOp::kGt: return !unordered && a > b;
      case ptx::CmpOp::kGe: return !unordered && a >= b;
      case ptx::CmpOp::kEqu: return unordered || a == b;
      case ptx::CmpOp::kNeu: return unordered || a != b;
      case ptx::CmpOp::kLtu: return unordered || a < b;
      case ptx::CmpOp::kLeu: return unordered || a <= b;
      case ptx::CmpOp::kGtu: return unordered || a > b;
      case ptx::CmpOp::kGeu: return unordered || a >= b;
      case ptx::CmpOp::kNum: return !unordered;
      case ptx::CmpOp::kNan: return unordered;
      default: return false;
    }
  }

  // A source of a float instruction as a double (exact for every format).
  static double floatValue(uint64_t bits, Type t, bool ftz) {
    switch (t) {
      case Type::kF32: {
        float x = asF32(bits);
        return ftz ? flushF32(x) : x;
      }
      case Type::kF64: return asF64(bits);
      case Type::kF16: {
        // .ftz on f16 flushes subnormal inputs to sign-preserving zero.
        auto h = static_cast<uint16_t>(bits);
        if (ftz && (h & 0x7c00) == 0) h &= 0x8000;
        return f16ToDouble(h);
      }
      case Type::kBF16: return bf16ToDouble(static_cast<uint16_t>(bits));
      default: return asF64(bits);
    }
  }

  bool compare(const Inst& in, Type t, uint64_t a, uint64_t b) const {
    if (tfloat(t)) {
      bool ftz = in.m.has(Flag::kFtz);
      return compareFloat(in.m.cmp, floatValue(a, t, ftz), floatValue(b, t, ftz));
    }
    return compareInt(in.m.cmp, a, b, t);
  }

  // The element type of a packed pair (f16x2 -> f16), or `t` itself.
  static Type halfOf(Type t) {
    return t == Type::kF16x2 ? Type::kF16 : t == Type::kBF16x2 ? Type::kBF16 : t;
  }
  static bool packedHalves(Type t) { return t == Type::kF16x2 || t == Type::kBF16x2; }

  // Comparison of the low (half 0) or high (half 1) elements of packed pairs.
  bool compareHalf(const Inst& in, Type packed, uint64_t a, uint64_t b, unsigned half) const {
    return compare(in, halfOf(packed), (a >> (16 * half)) & 0xffff, (b >> (16 * half)) & 0xffff);
  }

  // What set writes for a true comparison: 1.0 in a floating-point destination
  // type, all ones in an integer one.
  static uint64_t setTrueValue(Type dtype) {
    switch (dtype) {
      case Type::kF32: return bitsOf(1.0f);
      case Type::kF16: case Type::kF16x2: return 0x3c00;
      case Type::kBF16: case Type::kBF16x2: return 0x3f80;
      default: return ~uint64_t{0};
    }
  }

  static bool combine(ptx::BoolOp op, bool r, bool c) {
    switch (op) {
      case ptx::BoolOp::kAnd: return r && c;
      case ptx::BoolOp::kOr: return r || c;
      case ptx::BoolOp::kXor: return r != c;
      default: return r;
    }
  }

  Step executeSetp(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    // setp.CmpOp{.BoolOp}.type p[|q], a, b{, {!}c};
    const Opnd& d = in.ops[0];
    const Opnd* p = d.kind == OpndKind::kVec ? &d.elems[0] : &d;
    const Opnd* q = d.kind == OpndKind::kVec && d.elems.size() > 1 ? &d.elems[1] : nullptr;
    const Opnd* c = in.ops.size() > 3 ? &in.ops[3] : nullptr;
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint64_t a = read(w, f, in.ops[1], lane);
      uint64_t b = read(w, f, in.ops[2], lane);
      bool cv = c ? (read(w, f, *c, lane) & 1) : true;
      if (packedHalves(in.type)) {
        // f16x2/bf16x2: p is the comparison of the low halves, q of the high ones.
        writeReg(f, *p, lane, combine(in.m.boolOp, compareHalf(in, in.type, a, b, 0), cv));
        if (q) writeReg(f, *q, lane, combine(in.m.boolOp, compareHalf(in, in.type, a, b, 1), cv));
        continue;
      }
      bool r = compare(in, in.type, a, b);
      writeReg(f, *p, lane, combine(in.m.boolOp, r, cv));
      if (q) writeReg(f, *q, lane, combine(in.m.boolOp, !r, cv));
    }
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- conversions
  static uint64_t clampToInt(double x, Type dst) {
    unsigned bytes = tsize(dst);
    if (std::isnan(x)) return 0;
    if (tsigned(dst)) {
      double lo = -std::ldexp(1.0, static_cast<int>(bytes * 8 - 1));
      double hi = std::ldexp(1.0, static_cast<int>(bytes * 8 - 1));
      if (x <= lo) return truncBytes(static_cast<uint64_t>(static_cast<int64_t>(lo)), bytes);
      if (x >= hi) return truncBytes((uint64_t{1} << (bytes * 8 - 1)) - 1, bytes);
      return truncBytes(static_cast<uint64_t>(static_cast<int64_t>(x)), bytes);
    }
    double hi = std::ldexp(1.0, static_cast<int>(bytes * 8));
    if (x <= 0) return 0;
    if (x >= hi) return truncBytes(~uint64_t{0}, bytes);
    return static_cast<uint64_t>(x);
  }

  static uint64_t convert(const Inst& in, uint64_t src) {
    Type dt = in.type, st = in.type2;
    ptx::Rounding r = in.m.rounding;
    bool ftz = in.m.has(Flag::kFtz);
    bool sat = in.m.has(Flag::kSat);
    unsigned db = tsize(dt), sb = tsize(st);
    bool dFloat = tfloat(dt), sFloat = tfloat(st);
    if (!dFloat && !sFloat) {
      bool sSigned = tsigned(st);
      if (sat) {
        // Clamp the source value into the destination range.
        if (sSigned) {
          int64_t v = sext(src, sb);
          int64_t lo = tsigned(dt) ? -(int64_t{1} << (db * 8 - 1)) : 0;
          int64_t hi = tsigned(dt) ? (int64_t{1} << (db * 8 - 1)) - 1
                       : db >= 8 ? INT64_MAX : static_cast<int64_t>((uint64_t{1} << (db * 8)) - 1);
          if (db >= 8 && tsigned(dt)) { lo = INT64_MIN; hi = INT64_MAX; }
          v = std::clamp(v, lo, hi);
          return truncBytes(static_cast<uint64_t>(v), db);
        }
        uint64_t v = truncBytes(src, sb);
        uint64_t hi = tsigned(dt) ? (uint64_t{1} << (db * 8 - 1)) - 1
                      : truncBytes(~uint64_t{0}, db);
        return std::min(v, hi);
      }
      uint64_t v = sSigned ? static_cast<uint64_t>(sext(src, sb)) : truncBytes(src, sb);
      if (tsigned(dt)) return static_cast<uint64_t>(sext(v, db));
      return truncBytes(v, db);
    }
    if (dFloat && !sFloat) {
      bool sSigned = tsigned(st);
      int64_t sv = sext(src, sb);
      uint64_t uv = truncBytes(src, sb);
      switch (dt) {
        case Type::kF32: {
          float x = sSigned ? static_cast<float>(sv) : static_cast<float>(uv);
          return finishF32(x, ftz, sat);
        }
        case Type::kF64: {
          double x = sSigned ? static_cast<double>(sv) : static_cast<double>(uv);
          return finishF64(x, sat);
        }
        case Type::kF16: case Type::kBF16: {
          // Exactly representable in double for |v| < 2^53; larger values are far
          // beyond the f16 range and bf16's 8-bit precision, where a single
          // rounding through double cannot change the result's overflow class.
          double x = sSigned ? static_cast<double>(sv) : static_cast<double>(uv);
          return dt == Type::kF16 ? doubleToF16(x, r == ptx::Rounding::kNone ? ptx::Rounding::kRn : r)
                                  : doubleToBF16(x, r == ptx::Rounding::kNone ? ptx::Rounding::kRn : r);
        }
        default: return 0;
      }
    }
    double x = floatValue(src, st, ftz && st == Type::kF32);
    if (!dFloat) {
      // Float to integer: rounds as asked, saturates to the destination range and
      // converts NaN to 0.
      return clampToInt(roundIntegral(x, r), dt);
    }
    bool relu = in.m.has(Flag::kRelu);
    bool satfinite = in.m.has(Flag::kSatfinite);
    bool integral = r == ptx::Rounding::kRni || r == ptx::Rounding::kRzi ||
                    r == ptx::Rounding::kRmi || r == ptx::Rounding::kRpi;
    if (integral && !std::isnan(x)) x = roundIntegral(x, r);
    if (relu && !std::isnan(x) && x < 0) x = 0;
    switch (dt) {
      case Type::kF32: {
        float y;
        if (std::isnan(x)) return sat ? 0 : kCanonicalNanF32;
        y = static_cast<float>(x);  // rounded by the caller's RoundingScope
        return finishF32(y, ftz, sat);
      }
      case Type::kF64:
        if (std::isnan(x) && st == Type::kF64) return sat ? 0 : src;
        return finishF64(x, sat);
      case Type::kF16: case Type::kBF16: {
        ptx::Rounding rr = r == ptx::Rounding::kNone || integral ? ptx::Rounding::kRn : r;
        if (sat && !std::isnan(x)) x = std::clamp(x, 0.0, 1.0);
        if (sat && std::isnan(x)) x = 0;
        return dt == Type::kF16 ? doubleToF16(x, rr, satfinite) : doubleToBF16(x, rr, satfinite);
      }
      default: return 0;
    }
  }

  // cvt to or from a pair of fp8 values in 16 bits (.e4m3x2, .e5m2x2): as for
  // f16x2, the value of a (or of a's upper half) is the upper byte (half).
  Step executeCvtFp8(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    const bool relu = in.m.has(Flag::kRelu);
    if (in.type == Type::kF16x2) {  // cvt.rn{.relu}.f16x2.f8x2type d, a
      const bool e4 = in.type2 == Type::kE4M3x2;
      for (uint32_t m = exec; m; m &= m - 1) {
        const int lane = std::countr_zero(m);
        const uint64_t a = read(w, f, in.ops[1], lane);
        uint32_t d = 0;
        for (int k = 0; k < 2; ++k) {
          const auto b = static_cast<uint8_t>(a >> (8 * k));
          uint16_t h = e4 ? e4m3ToF16(b) : e5m2ToF16(b);
          if (relu && (h & 0x7fffu) > 0x7c00u) h = kCanonicalNanF16;
          if (relu && (h & 0x8000u) && (h & 0x7fffu) <= 0x7c00u) h = 0;
          d |= static_cast<uint32_t>(h) << (16 * k);
        }
        writeReg(f, in.ops[0], lane, d);
      }
      return Step::kContinue;
    }
    // cvt.rn.satfinite{.relu}.f8x2type.f32 d, a, b and .f8x2type.f16x2 d, a
    const bool e4 = in.type == Type::kE4M3x2;
    for (uint32_t m = exec; m; m &= m - 1) {
      const int lane = std::countr_zero(m);
      double x[2];  // upper, lower
      if (in.type2 == Type::kF16x2) {
        const uint64_t a = read(w, f, in.ops[1], lane);
        x[0] = f16ToDouble(static_cast<uint16_t>(a >> 16));
        x[1] = f16ToDouble(static_cast<uint16_t>(a));
      } else {
        x[0] = asF32(read(w, f, in.ops[1], lane));
        x[1] = asF32(read(w, f, in.ops[2], lane));
      }
      uint32_t d = 0;
      for (int k = 0; k < 2; ++k) {
        uint8_t b;
        if (relu && std::isnan(x[k])) {
          b = e4 ? kE4M3NaN : kE5M2NaN;  // canonical: .relu drops the sign
        } else {
          const double v = relu && x[k] < 0 ? 0.0 : x[k];
          b = e4 ? doubleToE4M3(v) : doubleToE5M2(v);
        }
        d = (d << 8) | b;
      }
      writeReg(f, in.ops[0], lane, d);
    }
    return Step::kContinue;
  }

  // cvt.{rna,rn,rz}{.satfinite}{.relu}.tf32.f32: an f32 with 10 fraction bits
  // (the low 13 bits zero), in a .b32 register.
  Step executeCvtTf32(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    const ptx::Rounding r = in.m.rounding;
    const bool satfinite = in.m.has(Flag::kSatfinite), relu = in.m.has(Flag::kRelu);
    for (uint32_t m = exec; m; m &= m - 1) {
      const int lane = std::countr_zero(m);
      uint32_t bits = static_cast<uint32_t>(read(w, f, in.ops[1], lane));
      uint32_t out;
      if ((bits & 0x7fffffffu) > 0x7f800000u) {
        out = kCanonicalNanF32;
      } else {
        if (relu && (bits & 0x80000000u)) bits = 0;
        const uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7fffffffu;
        uint32_t rounded = magnitude;
        if (magnitude < 0x7f800000u) {
          if (r == ptx::Rounding::kRna) rounded = magnitude + 0x1000u;                       // ties away
          else if (r != ptx::Rounding::kRz) rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);  // ties to even
        }
        rounded &= 0xffffe000u;
        if (satfinite && rounded >= 0x7f800000u) rounded = 0x7f7fe000u;
        out = sign | rounded;
      }
      writeReg(f, in.ops[0], lane, out);
    }
    return Step::kContinue;
  }

  Step unsupportedForm(Warp& w, const Inst& in, uint32_t exec) {
    return raise(KernelFault::kIllegalInstruction, w, in, std::countr_zero(exec),
                 fmt::format("{} is not supported by vgpu", spelledForm(*in.source)));
  }

  Step executeCvt(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.unsupported) return exec ? unsupportedForm(w, in, exec) : Step::kContinue;
    if (in.type == Type::kTF32) return executeCvtTf32(w, f, in, exec);
    if (in.type == Type::kE4M3x2 || in.type == Type::kE5M2x2 || in.type2 == Type::kE4M3x2 ||
        in.type2 == Type::kE5M2x2) {
      return executeCvtFp8(w, f, in, exec);
    }
    if (in.type == Type::kF16x2 || in.type == Type::kBF16x2) {
      // cvt.rn.f16x2.f32 d, a, b: a goes to the upper half, b to the lower.
      bool bf = in.type == Type::kBF16x2;
      ptx::Rounding r = in.m.rounding == ptx::Rounding::kNone ? ptx::Rounding::kRn : in.m.rounding;
      bool relu = in.m.has(Flag::kRelu), satfinite = in.m.has(Flag::kSatfinite);
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        uint16_t h[2];
        for (int k = 0; k < 2; ++k) {
          double x = asF32(read(w, f, in.ops[static_cast<size_t>(1 + k)], lane));
          if (relu && !std::isnan(x) && x < 0) x = 0;
          h[k] = bf ? doubleToBF16(x, r, satfinite) : doubleToF16(x, r, satfinite);
        }
        writeReg(f, in.ops[0], lane, (static_cast<uint32_t>(h[0]) << 16) | h[1]);
      }
      return Step::kContinue;
    }
    // The host rounding mode is set before the operands are loaded from the
    // register file and restored after the results are stored back, so the
    // compiler cannot move the conversion outside it.
    ptx::Rounding r = in.m.rounding;
    bool directed = r == ptx::Rounding::kRz || r == ptx::Rounding::kRm || r == ptx::Rounding::kRp;
    RoundingScope scope(directed ? r : ptx::Rounding::kRn);
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      writeReg(f, in.ops[0], lane, convert(in, read(w, f, in.ops[1], lane)));
    }
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- integer ALU
  // The frequent integer forms (address arithmetic, loop counters) without the
  // per-lane dispatch of intLane; same results.
  bool integerFast(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    const Type t = in.type;
    if (t == Type::kPred || in.ops.empty() || in.ops[0].kind != OpndKind::kReg) return false;
    if (in.m.has(Flag::kCc) || in.m.has(Flag::kSat) || in.m.has(Flag::kHi)) return false;
    const unsigned bytes = tsize(t);
    if (bytes != 4 && bytes != 8) return false;
    const bool wide = in.m.has(Flag::kWide);
    uint64_t* dst = &f.regs[in.ops[0].reg * kWarpSize];
    auto loop = [&](auto op) {
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        dst[lane] = op(lane);
      }
    };
    const Opnd& A = in.ops[1];
    switch (in.op) {
      case Opcode::kAdd:
        loop([&](int l) { return truncBytes(read(w, f, A, l) + read(w, f, in.ops[2], l), bytes); });
        return true;
      case Opcode::kSub:
        loop([&](int l) { return truncBytes(read(w, f, A, l) - read(w, f, in.ops[2], l), bytes); });
        return true;
      case Opcode::kAnd:
        loop([&](int l) { return truncBytes(read(w, f, A, l) & read(w, f, in.ops[2], l), bytes); });
        return true;
      case Opcode::kOr:
        loop([&](int l) { return truncBytes(read(w, f, A, l) | read(w, f, in.ops[2], l), bytes); });
        return true;
      case Opcode::kXor:
        loop([&](int l) { return truncBytes(read(w, f, A, l) ^ read(w, f, in.ops[2], l), bytes); });
        return true;
      case Opcode::kShl:
        loop([&](int l) {
          uint64_t n = truncBytes(read(w, f, in.ops[2], l), 4);
          return n >= bytes * 8 ? 0 : truncBytes(read(w, f, A, l) << n, bytes);
        });
        return true;
      case Opcode::kMul:
        if (wide) {
          if (bytes != 4) return false;
          bool sign = tsigned(t);
          loop([&](int l) { return mulWide(read(w, f, A, l), read(w, f, in.ops[2], l), 4, sign); });
        } else {
          loop([&](int l) { return truncBytes(read(w, f, A, l) * read(w, f, in.ops[2], l), bytes); });
        }
        return true;
      case Opcode::kMad:
        if (wide) return false;
        loop([&](int l) {
          return truncBytes(read(w, f, A, l) * read(w, f, in.ops[2], l) + read(w, f, in.ops[3], l),
                            bytes);
        });
        return true;
      default:
        return false;
    }
  }

  Step executeInteger(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (integerFast(w, f, in, exec)) return Step::kContinue;
    const size_t nops = in.ops.size();
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint64_t a = nops > 1 ? read(w, f, in.ops[1], lane) : 0;
      uint64_t b = nops > 2 ? read(w, f, in.ops[2], lane) : 0;
      uint64_t c = nops > 3 ? read(w, f, in.ops[3], lane) : 0;
      uint64_t d = nops > 4 ? read(w, f, in.ops[4], lane) : 0;
      uint64_t r;
      if (!intLane(w, in, lane, a, b, c, d, &r)) {
        const OpcodeCoverage& coverage = coverageOf(in.op);
        return raise(KernelFault::kIllegalInstruction, w, in, lane,
                     fmt::format("unsupported instruction {}{}{}", ptx::name(in.op), coverage.note.empty() ? "" : ": ",
                                 coverage.note));
      }
      writeReg(f, in.ops[0], lane, r);
    }
    return Step::kContinue;
  }

  static uint64_t mulHi(uint64_t a, uint64_t b, unsigned bytes, bool sign) {
    if (bytes == 8) {
      if (sign) {
        Int128 p = static_cast<Int128>(static_cast<int64_t>(a)) * static_cast<int64_t>(b);
        return static_cast<uint64_t>(p >> 64);
      }
      UInt128 p = static_cast<UInt128>(a) * b;
      return static_cast<uint64_t>(p >> 64);
    }
    if (sign) {
      int64_t p = sext(a, bytes) * sext(b, bytes);
      return truncBytes(static_cast<uint64_t>(p >> (bytes * 8)), bytes);
    }
    uint64_t p = truncBytes(a, bytes) * truncBytes(b, bytes);
    return truncBytes(p >> (bytes * 8), bytes);
  }

  static uint64_t mulWide(uint64_t a, uint64_t b, unsigned bytes, bool sign) {
    if (sign) return static_cast<uint64_t>(sext(a, bytes) * sext(b, bytes));
    return truncBytes(a, bytes) * truncBytes(b, bytes);
  }

  // Multiplication part of mul/mad: .lo, .hi or .wide.
  static uint64_t mulPart(const Inst& in, uint64_t a, uint64_t b, unsigned bytes, bool sign) {
    if (in.m.has(Flag::kHi)) return mulHi(a, b, bytes, sign);
    if (in.m.has(Flag::kWide)) return mulWide(a, b, bytes, sign);
    return truncBytes(a * b, bytes);
  }

  static uint64_t saturateS32(int64_t v) {
    return static_cast<uint32_t>(static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)));
  }

  bool intLane(Warp& w, const Inst& in, int lane, uint64_t a, uint64_t b, uint64_t c,
               uint64_t d, uint64_t* out) {
    const Type t = in.type;
    const unsigned bytes = t == Type::kPred ? 1 : tsize(t);
    const unsigned bits = bytes * 8;
    const bool sign = tsigned(t);
    const uint32_t bit = 1u << lane;
    const bool pred = t == Type::kPred;
    uint64_t r = 0;
    switch (in.op) {
      case Opcode::kAdd: case Opcode::kAddc: {
        uint64_t cin = in.op == Opcode::kAddc ? ((w.carry & bit) ? 1 : 0) : 0;
        if (in.m.has(Flag::kSat) && t == Type::kS32) {
          r = saturateS32(sext(a, 4) + sext(b, 4));
          break;
        }
        uint64_t ua = truncBytes(a, bytes), ub = truncBytes(b, bytes);
        r = truncBytes(ua + ub + cin, bytes);
        if (in.m.has(Flag::kCc)) {
          bool carry = bytes == 8 ? (r < ua || (cin && r == ua)) : ((ua + ub + cin) >> bits) != 0;
          w.carry = carry ? (w.carry | bit) : (w.carry & ~bit);
        }
        break;
      }
      case Opcode::kSub: case Opcode::kSubc: {
        uint64_t bin = in.op == Opcode::kSubc ? ((w.carry & bit) ? 1 : 0) : 0;
        if (in.m.has(Flag::kSat) && t == Type::kS32) {
          r = saturateS32(sext(a, 4) - sext(b, 4));
          break;
        }
        uint64_t ua = truncBytes(a, bytes), ub = truncBytes(b, bytes);
        r = truncBytes(ua - ub - bin, bytes);
        if (in.m.has(Flag::kCc)) {
          // CC.CF holds the borrow.
          bool borrow = ua < ub || (bin && ua == ub);
          w.carry = borrow ? (w.carry | bit) : (w.carry & ~bit);
        }
        break;
      }
      case Opcode::kMul:
        r = mulPart(in, a, b, bytes, sign);
        break;
      case Opcode::kMad: case Opcode::kMadc: {
        uint64_t p = mulPart(in, a, b, bytes, sign);
        unsigned rb = in.m.has(Flag::kWide) ? bytes * 2 : bytes;
        uint64_t cin = in.op == Opcode::kMadc ? ((w.carry & bit) ? 1 : 0) : 0;
        if (in.m.has(Flag::kSat) && t == Type::kS32 && in.m.has(Flag::kHi)) {
          r = saturateS32(sext(p, 4) + sext(c, 4));
          break;
        }
        uint64_t uc = truncBytes(c, rb);
        r = truncBytes(p + uc + cin, rb);
        if (in.m.has(Flag::kCc)) {
          bool carry = rb == 8 ? (r < p || (cin && r == p))
                               : ((truncBytes(p, rb) + uc + cin) >> (rb * 8)) != 0;
          w.carry = carry ? (w.carry | bit) : (w.carry & ~bit);
        }
        break;
      }
      case Opcode::kMul24: case Opcode::kMad24: {
        int64_t x = sign ? sext(a, 3) : static_cast<int64_t>(a & 0xffffff);
        int64_t y = sign ? sext(b, 3) : static_cast<int64_t>(b & 0xffffff);
        uint64_t p = static_cast<uint64_t>(x * y);
        uint64_t part = in.m.has(Flag::kHi) ? (p >> 16) : p;
        if (in.op == Opcode::kMad24) {
          if (in.m.has(Flag::kSat) && sign) {
            r = saturateS32(sext(part, 4) + sext(c, 4));
            break;
          }
          part += c;
        }
        r = part & 0xffffffffu;
        break;
      }
      case Opcode::kSad: {
        uint64_t diff;
        if (sign) {
          int64_t x = sext(a, bytes), y = sext(b, bytes);
          diff = static_cast<uint64_t>(x > y ? x - y : y - x);
        } else {
          uint64_t x = truncBytes(a, bytes), y = truncBytes(b, bytes);
          diff = x > y ? x - y : y - x;
        }
        r = truncBytes(c + diff, bytes);
        break;
      }
      case Opcode::kDiv: case Opcode::kRem: {
        bool isDiv = in.op == Opcode::kDiv;
        if (sign) {
          int64_t x = sext(a, bytes), y = sext(b, bytes);
          if (y == 0) {
            // Division by zero yields an unspecified value in PTX; GPUs give -1
            // (all ones) for the quotient and the dividend for the remainder.
            r = isDiv ? truncBytes(~uint64_t{0}, bytes) : truncBytes(a, bytes);
          } else if (y == -1) {
            r = isDiv ? truncBytes(static_cast<uint64_t>(0) - static_cast<uint64_t>(x), bytes) : 0;
          } else {
            r = truncBytes(static_cast<uint64_t>(isDiv ? x / y : x % y), bytes);
          }
        } else {
          uint64_t x = truncBytes(a, bytes), y = truncBytes(b, bytes);
          if (y == 0) {
            r = isDiv ? truncBytes(~uint64_t{0}, bytes) : x;
          } else {
            r = isDiv ? x / y : x % y;
          }
        }
        break;
      }
      case Opcode::kMin: case Opcode::kMax: {
        bool isMin = in.op == Opcode::kMin;
        if (t == Type::kU16x2 || t == Type::kS16x2) {
          r = 0;
          for (int h = 0; h < 2; ++h) {
            uint64_t x = (a >> (16 * h)) & 0xffff, y = (b >> (16 * h)) & 0xffff;
            bool less = t == Type::kS16x2 ? sext(x, 2) < sext(y, 2) : x < y;
            r |= ((isMin == less) ? x : y) << (16 * h);
          }
          break;
        }
        bool less = sign ? sext(a, bytes) < sext(b, bytes) : truncBytes(a, bytes) < truncBytes(b, bytes);
        r = truncBytes((isMin == less) ? a : b, bytes);
        if (in.m.has(Flag::kRelu) && sign && sext(r, bytes) < 0) r = 0;
        break;
      }
      case Opcode::kAbs:
        r = truncBytes(sext(a, bytes) < 0 ? static_cast<uint64_t>(0) - a : a, bytes);
        break;
      case Opcode::kNeg:
        r = truncBytes(static_cast<uint64_t>(0) - a, bytes);
        break;
      case Opcode::kAnd: r = pred ? (a & b & 1) : truncBytes(a & b, bytes); break;
      case Opcode::kOr: r = pred ? ((a | b) & 1) : truncBytes(a | b, bytes); break;
      case Opcode::kXor: r = pred ? ((a ^ b) & 1) : truncBytes(a ^ b, bytes); break;
      case Opcode::kNot: r = pred ? (~a & 1) : truncBytes(~a, bytes); break;
      case Opcode::kCnot: r = truncBytes(a, bytes) == 0 ? 1 : 0; break;
      case Opcode::kShl: {
        uint64_t n = truncBytes(b, 4);
        r = n >= bits ? 0 : truncBytes(a << n, bytes);
        break;
      }
      case Opcode::kShr: {
        uint64_t n = truncBytes(b, 4);
        if (sign) {
          int64_t x = sext(a, bytes);
          r = truncBytes(static_cast<uint64_t>(x >> std::min<uint64_t>(n, 63)), bytes);
        } else {
          r = n >= bits ? 0 : truncBytes(a, bytes) >> n;
        }
        break;
      }
      case Opcode::kPopc: r = static_cast<uint64_t>(std::popcount(truncBytes(a, bytes))); break;
      case Opcode::kClz:
        r = static_cast<uint64_t>(std::countl_zero(truncBytes(a, bytes))) - (64 - bits);
        break;
      case Opcode::kBrev: {
        uint64_t x = truncBytes(a, bytes);
        uint64_t y = 0;
        for (unsigned i = 0; i < bits; ++i) y |= ((x >> i) & 1) << (bits - 1 - i);
        r = y;
        break;
      }
      case Opcode::kBfind: {
        uint64_t x = truncBytes(a, bytes);
        if (sign && sext(a, bytes) < 0) x = truncBytes(~x, bytes);
        if (x == 0) {
          r = 0xffffffffu;
        } else {
          uint64_t msb = 63 - static_cast<uint64_t>(std::countl_zero(x));
          r = in.m.has(Flag::kShiftamt) ? (bits - 1 - msb) : msb;
        }
        break;
      }
      case Opcode::kBfe: {
        unsigned msb = bits - 1;
        unsigned pos = static_cast<unsigned>(b & 0xff), len = static_cast<unsigned>(c & 0xff);
        uint64_t x = truncBytes(a, bytes);
        uint64_t sbit = 0;
        if (sign && len != 0) sbit = (x >> std::min(pos + len - 1, msb)) & 1;
        uint64_t y = 0;
        for (unsigned i = 0; i <= msb; ++i) {
          uint64_t v = (i < len && pos + i <= msb) ? ((x >> (pos + i)) & 1) : sbit;
          y |= v << i;
        }
        r = y;
        break;
      }
      case Opcode::kBfi: {
        unsigned msb = bits - 1;
        unsigned pos = static_cast<unsigned>(c & 0xff), len = static_cast<unsigned>(d & 0xff);
        uint64_t y = truncBytes(b, bytes);
        for (unsigned i = 0; i < len && pos + i <= msb; ++i) {
          uint64_t v = (a >> i) & 1;
          y = (y & ~(uint64_t{1} << (pos + i))) | (v << (pos + i));
        }
        r = y;
        break;
      }
      case Opcode::kPrmt: r = permute(in, a, b, c); break;
      case Opcode::kShf: {
        uint64_t v = (truncBytes(b, 4) << 32) | truncBytes(a, 4);
        uint64_t n = truncBytes(c, 4);
        n = in.m.has(Flag::kWrap) ? (n & 31) : std::min<uint64_t>(n, 32);
        r = in.m.has(Flag::kL) ? truncBytes((v << n) >> 32, 4) : truncBytes(v >> n, 4);
        break;
      }
      case Opcode::kLop3: {
        uint32_t lut = static_cast<uint32_t>(d);
        uint64_t y = 0;
        for (unsigned i = 0; i < 8; ++i) {
          if (!((lut >> i) & 1)) continue;
          y |= ((i & 4) ? a : ~a) & ((i & 2) ? b : ~b) & ((i & 1) ? c : ~c);
        }
        r = truncBytes(y, bytes);
        break;
      }
      case Opcode::kBmsk: {
        uint64_t pos = a & 0xffffffffu, len = b & 0xffffffffu;
        if (!in.m.has(Flag::kWrap)) {
          pos = std::min<uint64_t>(pos, 32);
          len = std::min<uint64_t>(len, 32);
        } else {
          pos &= 31;
          len &= 31;
        }
        uint64_t maskv = len >= 32 ? 0xffffffffull : ((uint64_t{1} << len) - 1);
        r = pos >= 32 ? 0 : truncBytes(maskv << pos, 4);
        break;
      }
      case Opcode::kFns: {
        // The offset-th set bit of the mask from bit `base` up (offset > 0) or
        // down (offset < 0); offset 0: `base` itself if set. Not found (or a
        // base beyond 31, which the ISA leaves undefined): 0xffffffff.
        const uint32_t mask = static_cast<uint32_t>(a), base = static_cast<uint32_t>(b);
        const auto offset = static_cast<int32_t>(c);
        r = 0xffffffffu;
        if (base > 31) break;
        if (offset == 0) {
          if ((mask >> base) & 1u) r = base;
          break;
        }
        int64_t count = offset > 0 ? int64_t{offset} - 1 : -int64_t{offset} - 1;
        for (int pos = static_cast<int>(base); pos >= 0 && pos < 32; pos += offset > 0 ? 1 : -1) {
          if (((mask >> pos) & 1u) == 0) continue;
          if (count-- == 0) {
            r = static_cast<uint64_t>(pos);
            break;
          }
        }
        break;
      }
      case Opcode::kSzext: {
        uint64_t pos = in.m.has(Flag::kWrap) ? (b & 31) : std::min<uint64_t>(b & 0xffffffffu, 32);
        if (pos >= 32) {
          r = truncBytes(a, 4);
        } else if (sign) {
          r = pos == 0 ? 0 : truncBytes(static_cast<uint64_t>(sext(a, 8) << (64 - pos) >> (64 - pos)), 4);
          if (pos) r = truncBytes(static_cast<uint64_t>(static_cast<int64_t>(a << (64 - pos)) >> (64 - pos)), 4);
        } else {
          r = a & ((uint64_t{1} << pos) - 1);
        }
        break;
      }
      case Opcode::kDp4a: case Opcode::kDp2a: {
        bool as = tsigned(in.type), bs = tsigned(in.type2);
        int64_t acc = bs || as ? sext(c, 4) : static_cast<int64_t>(c & 0xffffffffu);
        if (in.op == Opcode::kDp4a) {
          for (int k = 0; k < 4; ++k) {
            int64_t x = as ? sext(a >> (8 * k), 1) : static_cast<int64_t>((a >> (8 * k)) & 0xff);
            int64_t y = bs ? sext(b >> (8 * k), 1) : static_cast<int64_t>((b >> (8 * k)) & 0xff);
            acc += x * y;
          }
        } else {
          unsigned base = in.m.has(Flag::kHi) ? 2 : 0;
          for (unsigned k = 0; k < 2; ++k) {
            int64_t x = as ? sext(a >> (16 * k), 2) : static_cast<int64_t>((a >> (16 * k)) & 0xffff);
            int64_t y = bs ? sext(b >> (8 * (base + k)), 1)
                           : static_cast<int64_t>((b >> (8 * (base + k))) & 0xff);
            acc += x * y;
          }
        }
        r = static_cast<uint64_t>(acc) & 0xffffffffu;
        break;
      }
      case Opcode::kSelp:
        r = (c & 1) ? a : b;
        r = pred ? (r & 1) : truncBytes(r, bytes);
        break;
      case Opcode::kSlct: {
        bool ge;
        if (in.type2 == Type::kF32) {
          float z = asF32(c);
          if (in.m.has(Flag::kFtz)) z = flushF32(z);
          ge = !std::isnan(z) && z >= 0.0f;
        } else {
          ge = sext(c, 4) >= 0;
        }
        r = truncBytes(ge ? a : b, bytes);
        break;
      }
      case Opcode::kSet: {
        // set.CmpOp{.BoolOp}.dtype.stype d, a, b{, {!}c}: 1.0 (f32, f16, bf16
        // destinations) or all ones (integer ones) when true, else 0. Packed
        // f16x2/bf16x2 sources compare each half into the matching half of d.
        const bool cv = in.ops.size() > 3 ? (c & 1) != 0 : true;
        if (packedHalves(in.type2)) {
          const uint64_t one = setTrueValue(in.type) & 0xffff;
          r = 0;
          for (unsigned half = 0; half < 2; ++half) {
            if (combine(in.m.boolOp, compareHalf(in, in.type2, a, b, half), cv)) r |= one << (16 * half);
          }
          break;
        }
        bool v = combine(in.m.boolOp, compare(in, in.type2, a, b), cv);
        r = v ? truncBytes(setTrueValue(in.type), bytes) : 0;
        break;
      }
      case Opcode::kCopysign: case Opcode::kTestp:
        return false;
      default:
        return false;
    }
    *out = r;
    return true;
  }

  static uint64_t permute(const Inst& in, uint64_t a, uint64_t b, uint64_t c) {
    uint8_t bytes8[8];
    for (int i = 0; i < 4; ++i) {
      bytes8[i] = static_cast<uint8_t>(a >> (8 * i));
      bytes8[i + 4] = static_cast<uint8_t>(b >> (8 * i));
    }
    unsigned sel[4];
    const unsigned s = static_cast<unsigned>(c & 3);
    bool modeSet = true;
    if (in.m.has(Flag::kF4e)) {
      for (unsigned i = 0; i < 4; ++i) sel[i] = (s + i) & 7;
    } else if (in.m.has(Flag::kB4e)) {
      for (unsigned i = 0; i < 4; ++i) sel[i] = (s + 8 - i) & 7;
    } else if (in.m.has(Flag::kRc8)) {
      for (unsigned i = 0; i < 4; ++i) sel[i] = s;
    } else if (in.m.has(Flag::kEcl)) {
      for (unsigned i = 0; i < 4; ++i) sel[i] = std::max(i, s);
    } else if (in.m.has(Flag::kEcr)) {
      for (unsigned i = 0; i < 4; ++i) sel[i] = std::min(i, s);
    } else if (in.m.has(Flag::kRc16)) {
      unsigned h = (s & 1) * 2;
      sel[0] = h; sel[1] = h + 1; sel[2] = h; sel[3] = h + 1;
    } else {
      modeSet = false;
    }
    uint64_t r = 0;
    for (unsigned i = 0; i < 4; ++i) {
      uint8_t v;
      if (modeSet) {
        v = bytes8[sel[i]];
      } else {
        unsigned nib = static_cast<unsigned>((c >> (4 * i)) & 0xf);
        v = bytes8[nib & 7];
        if (nib & 8) v = (v & 0x80) ? 0xff : 0x00;
      }
      r |= static_cast<uint64_t>(v) << (8 * i);
    }
    return r;
  }

  // ---------------------------------------------------------------- float ALU
  Step executeFloat(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    const Type t = in.type;
    if (t == Type::kF16x2 || t == Type::kBF16x2) return executePacked(w, f, in, exec);
    if (t != Type::kF32 && t != Type::kF64 && t != Type::kF16 && t != Type::kBF16) {
      return raise(KernelFault::kIllegalInstruction, w, in, std::countr_zero(exec),
                   fmt::format("unsupported float type .{}", ptx::name(t)));
    }
    const size_t nops = in.ops.size();
    if (t == Type::kF32 && (in.m.rounding == ptx::Rounding::kNone ||
                            in.m.rounding == ptx::Rounding::kRn) &&
        !in.m.has(Flag::kFtz) && !in.m.has(Flag::kSat) && in.ops[0].kind == OpndKind::kReg &&
        (in.op == Opcode::kAdd || in.op == Opcode::kSub || in.op == Opcode::kMul ||
         in.op == Opcode::kFma || in.op == Opcode::kMad)) {
      // The common round-to-nearest f32 arithmetic, without per-lane dispatch.
      uint64_t* dst = &f.regs[in.ops[0].reg * kWarpSize];
      for (uint32_t m = exec; m; m &= m - 1) {
        int lane = std::countr_zero(m);
        float a = asF32(read(w, f, in.ops[1], lane));
        float b = asF32(read(w, f, in.ops[2], lane));
        float r;
        switch (in.op) {
          case Opcode::kAdd: r = a + b; break;
          case Opcode::kSub: r = a - b; break;
          case Opcode::kMul: r = a * b; break;
          default: r = std::fma(a, b, asF32(read(w, f, in.ops[3], lane)));
        }
        dst[lane] = std::isnan(r) ? kCanonicalNanF32 : bitsOf(r);
      }
      return Step::kContinue;
    }
    RoundingScope scope(in.m.rounding);
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint64_t a = nops > 1 ? read(w, f, in.ops[1], lane) : 0;
      uint64_t b = nops > 2 ? read(w, f, in.ops[2], lane) : 0;
      uint64_t c = nops > 3 ? read(w, f, in.ops[3], lane) : 0;
      uint64_t r;
      bool ok = t == Type::kF32 ? f32Lane(in, a, b, c, &r)
                : t == Type::kF64 ? f64Lane(in, a, b, c, &r)
                                  : halfLane(in, t == Type::kBF16, a, b, c, &r);
      if (!ok) {
        return raise(KernelFault::kIllegalInstruction, w, in, lane,
                     fmt::format("unsupported instruction {}.{}", ptx::name(in.op),
                                 ptx::name(t)));
      }
      writeReg(f, in.ops[0], lane, r);
    }
    return Step::kContinue;
  }

  // PTX min/max on floats: a NaN operand loses to a number (both NaN, or .NaN:
  // the canonical NaN), and -0.0 is smaller than +0.0. Which operand wins, for
  // every float width (f16/bf16 values are exact in double).
  enum class MinMaxPick { kA, kB, kNaN };
  static MinMaxPick minMaxPick(bool isMin, double a, double b, bool propagateNan) {
    bool an = std::isnan(a), bn = std::isnan(b);
    if (an || bn) {
      if (propagateNan || (an && bn)) return MinMaxPick::kNaN;
      return an ? MinMaxPick::kB : MinMaxPick::kA;
    }
    if (a == b) return (isMin ? std::signbit(a) : !std::signbit(a)) ? MinMaxPick::kA : MinMaxPick::kB;
    return (isMin ? a < b : a > b) ? MinMaxPick::kA : MinMaxPick::kB;
  }

  // The winning operand's bits, or `nanBits`.
  static uint64_t minMaxBits(bool isMin, double a, double b, uint64_t ab, uint64_t bb,
                             bool propagateNan, uint64_t nanBits) {
    switch (minMaxPick(isMin, a, b, propagateNan)) {
      case MinMaxPick::kA: return ab;
      case MinMaxPick::kB: return bb;
      case MinMaxPick::kNaN: return nanBits;
    }
    return nanBits;
  }

  static float minMaxF32(bool isMin, float x, float y, bool propagateNan) {
    switch (minMaxPick(isMin, x, y, propagateNan)) {
      case MinMaxPick::kA: return x;
      case MinMaxPick::kB: return y;
      case MinMaxPick::kNaN: return asF32(kCanonicalNanF32);
    }
    return asF32(kCanonicalNanF32);
  }

  static bool f32Lane(const Inst& in, uint64_t ab, uint64_t bb, uint64_t cb, uint64_t* out) {
    const bool ftz = in.m.has(Flag::kFtz);
    const bool sat = in.m.has(Flag::kSat);
    float a = asF32(ab), b = asF32(bb), c = asF32(cb);
    if (ftz) {
      a = flushF32(a);
      b = flushF32(b);
      c = flushF32(c);
    }
    float r;
    switch (in.op) {
      case Opcode::kAdd: r = a + b; break;
      case Opcode::kSub: r = a - b; break;
      case Opcode::kMul: r = a * b; break;
      case Opcode::kFma: case Opcode::kMad: r = std::fma(a, b, c); break;
      case Opcode::kDiv:
        if (in.m.has(Flag::kApprox)) {
          // div.approx.f32: for 2^126 < |b| < 2^128 the result is 0 (NaN for an
          // infinite a), as the hardware computes a * (1/b).
          float ab2 = std::fabs(b);
          if (ab2 > 0x1p126f && ab2 < INFINITY) {
            r = std::isinf(a) ? NAN : std::copysign(0.0f, a) * std::copysign(1.0f, b);
          } else {
            r = static_cast<float>(static_cast<double>(a) / b);
          }
        } else {
          r = a / b;
        }
        break;
      case Opcode::kRcp: r = 1.0f / a; break;
      case Opcode::kSqrt: r = std::sqrt(a); break;
      case Opcode::kRsqrt: r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a))); break;
      case Opcode::kSin: r = static_cast<float>(std::sin(static_cast<double>(a))); break;
      case Opcode::kCos: r = static_cast<float>(std::cos(static_cast<double>(a))); break;
      case Opcode::kLg2: r = static_cast<float>(std::log2(static_cast<double>(a))); break;
      case Opcode::kEx2: r = static_cast<float>(std::exp2(static_cast<double>(a))); break;
      case Opcode::kTanh: r = static_cast<float>(std::tanh(static_cast<double>(a))); break;
      case Opcode::kAbs:
        *out = ftz ? bitsOf(std::fabs(a)) : (ab & 0x7fffffffu);
        return true;
      case Opcode::kNeg:
        *out = ftz ? bitsOf(-a) : ((ab ^ 0x80000000u) & 0xffffffffu);
        return true;
      case Opcode::kMin: case Opcode::kMax: {
        bool isMin = in.op == Opcode::kMin;
        r = minMaxF32(isMin, a, b, in.m.has(Flag::kNaN));
        if (in.m.has(Flag::kXorsign) && in.m.has(Flag::kAbs)) {
          bool s = std::signbit(a) != std::signbit(b);
          r = minMaxF32(isMin, std::fabs(a), std::fabs(b), in.m.has(Flag::kNaN));
          if (!std::isnan(r)) r = s ? -r : r;
        }
        *out = finishF32(r, ftz, false);
        return true;
      }
      case Opcode::kCopysign:
        *out = (ab & 0x80000000u) | (bb & 0x7fffffffu);
        return true;
      default:
        return false;
    }
    *out = finishF32(r, ftz, sat);
    return true;
  }

  static bool f64Lane(const Inst& in, uint64_t ab, uint64_t bb, uint64_t cb, uint64_t* out) {
    double a = asF64(ab), b = asF64(bb), c = asF64(cb);
    const bool ftz = in.m.has(Flag::kFtz);  // only rcp/rsqrt.approx.ftz.f64
    auto flush64 = [](double x) {
      return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0, x) : x;
    };
    if (ftz) a = flush64(a);
    double r;
    switch (in.op) {
      case Opcode::kAdd: r = a + b; break;
      case Opcode::kSub: r = a - b; break;
      case Opcode::kMul: r = a * b; break;
      case Opcode::kFma: case Opcode::kMad: r = std::fma(a, b, c); break;
      case Opcode::kDiv: r = a / b; break;
      case Opcode::kRcp: r = 1.0 / a; if (ftz) r = flush64(r); break;
      case Opcode::kSqrt: r = std::sqrt(a); break;
      case Opcode::kRsqrt: r = 1.0 / std::sqrt(a); if (ftz) r = flush64(r); break;
      case Opcode::kAbs: *out = ab & 0x7fffffffffffffffull; return true;
      case Opcode::kNeg: *out = ab ^ 0x8000000000000000ull; return true;
      case Opcode::kCopysign: *out = (ab & 0x8000000000000000ull) | (bb & 0x7fffffffffffffffull); return true;
      case Opcode::kMin: case Opcode::kMax:
        *out = minMaxBits(in.op == Opcode::kMin, a, b, ab, bb, in.m.has(Flag::kNaN),
                          0x7fffffffffffffffull);
        return true;
      default:
        return false;
    }
    *out = finishF64(r, in.m.has(Flag::kSat));
    return true;
  }

  // Scalar f16 / bf16: computed exactly in double, rounded once to the format.
  static bool halfLane(const Inst& in, bool bf, uint64_t ab, uint64_t bb, uint64_t cb,
                       uint64_t* out) {
    auto dec = [bf](uint64_t x) {
      return bf ? bf16ToDouble(static_cast<uint16_t>(x)) : f16ToDouble(static_cast<uint16_t>(x));
    };
    ptx::Rounding rr = in.m.rounding == ptx::Rounding::kNone ? ptx::Rounding::kRn : in.m.rounding;
    auto enc = [&](double x) -> uint64_t {
      if (in.m.has(Flag::kSat) && !std::isnan(x)) x = std::clamp(x, 0.0, 1.0);
      if (in.m.has(Flag::kSat) && std::isnan(x)) x = 0;
      if (in.m.has(Flag::kRelu) && !std::isnan(x) && x < 0) x = 0;
      return bf ? doubleToBF16(x, rr) : doubleToF16(x, rr);
    };
    double a = dec(ab), b = dec(bb), c = dec(cb);
    switch (in.op) {
      case Opcode::kAdd: *out = enc(a + b); return true;
      case Opcode::kSub: *out = enc(a - b); return true;
      case Opcode::kMul: *out = enc(a * b); return true;
      case Opcode::kFma: case Opcode::kMad: *out = enc(std::fma(a, b, c)); return true;
      case Opcode::kNeg: *out = (ab ^ 0x8000u) & 0xffffu; return true;
      case Opcode::kAbs: *out = ab & 0x7fffu; return true;
      case Opcode::kMin: case Opcode::kMax:
        *out = minMaxBits(in.op == Opcode::kMin, a, b, ab & 0xffff, bb & 0xffff,
                          in.m.has(Flag::kNaN), 0x7fff);
        return true;
      default:
        return false;
    }
  }

  Step executePacked(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    bool bf = in.type == Type::kBF16x2;
    const size_t nops = in.ops.size();
    for (uint32_t m = exec; m; m &= m - 1) {
      int lane = std::countr_zero(m);
      uint64_t a = nops > 1 ? read(w, f, in.ops[1], lane) : 0;
      uint64_t b = nops > 2 ? read(w, f, in.ops[2], lane) : 0;
      uint64_t c = nops > 3 ? read(w, f, in.ops[3], lane) : 0;
      uint64_t r = 0;
      for (int h = 0; h < 2; ++h) {
        uint64_t part;
        if (!halfLane(in, bf, (a >> (16 * h)) & 0xffff, (b >> (16 * h)) & 0xffff,
                      (c >> (16 * h)) & 0xffff, &part)) {
          return raise(KernelFault::kIllegalInstruction, w, in, lane,
                       fmt::format("unsupported instruction {}.{}", ptx::name(in.op),
                                   ptx::name(in.type)));
        }
        r |= (part & 0xffff) << (16 * h);
      }
      writeReg(f, in.ops[0], lane, r);
    }
    return Step::kContinue;
  }

  // ---------------------------------------------------------------- textures and surfaces
  // The object a tex/suld/... names, looked up once per block runner.
  const TextureView* textureObject(uint64_t handle, bool surface) {
    auto& cache = surface ? surfaces_ : textures_;
    auto it = cache.find(handle);
    if (it == cache.end()) {
      std::optional<TextureView> view;
      if (l_.context.textures != nullptr) {
        view =
            surface ? l_.context.textures->surface(handle) : l_.context.textures->texture(handle);
      }
      it = cache.emplace(handle, std::move(view)).first;
    }
    return it->second ? &*it->second : nullptr;
  }

  Step noObject(const Warp& w, const Inst& in, int lane, uint64_t handle, bool surface) {
    return raise(
        KernelFault::kIllegalAddress, w, in, lane,
        fmt::format("{} object {:#x} does not exist", surface ? "surface" : "texture", handle));
  }

  // Texel memory is the context's device memory: checked and recorded as a load's.
  bool readTexel(uint64_t address, unsigned bytes, void* out) {
    if (!l_.context.memory->isAccessible(address, bytes)) return false;
    if (recording_) recordAccess(address, bytes, true, false);
    std::memcpy(out, reinterpret_cast<const void*>(address), bytes);
    return true;
  }

  Step executeTexture(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.unsupported) return unsupportedForm(w, in, exec);
    const ptx::Modifiers& m = in.m;
    const Opnd& a = in.ops[1];
    const Opnd& coords = a.elems.back();
    const int dims = m.has(Flag::kGeom1d) ? 1 : m.has(Flag::kGeom2d) ? 2 : 3;
    // tex.geom.v4.dtype.ctype: the coordinates' type is the last one.
    const bool integer = in.type2 == Type::kS32;
    const int component = m.has(Flag::kG) ? 1 : m.has(Flag::kB) ? 2 : m.has(Flag::kA) ? 3 : 0;
    TexelReader reader = [this](uint64_t address, unsigned bytes, void* out) {
      return readTexel(address, bytes, out);
    };
    for (uint32_t mask = exec; mask; mask &= mask - 1) {
      const int lane = std::countr_zero(mask);
      const uint64_t handle = effectiveAddress(w, f, a, lane);
      const TextureView* t = textureObject(handle, false);
      if (t == nullptr) return noObject(w, in, lane, handle, false);
      TexCoords c;
      c.integer = integer;
      c.dimensions = dims;
      for (int d = 0; d < dims; ++d) {
        const uint64_t v = read(w, f, coords.elems[static_cast<size_t>(d)], lane);
        c.f[static_cast<size_t>(d)] = asF32(v);
        c.i[static_cast<size_t>(d)] = static_cast<int32_t>(static_cast<uint32_t>(v));
      }
      std::optional<TexResult> r = in.op == Opcode::kTld4
                                       ? gatherTexture(*t, c.f[0], c.f[1], component, reader)
                                       : sampleTexture(*t, c, reader);
      if (!r) {
        return raise(KernelFault::kIllegalAddress, w, in, lane,
                     "texel memory that is not the context's");
      }
      for (size_t k = 0; k < 4; ++k) writeReg(f, in.ops[0].elems[k], lane, (*r)[k]);
    }
    return Step::kContinue;
  }

  // suld.b / sust.b: x in bytes, y and z in rows and slices. Out of the
  // surface, .trap faults, .clamp uses the nearest location and .zero loads
  // zeros and drops stores.
  Step executeSurface(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.unsupported) return unsupportedForm(w, in, exec);
    const ptx::Modifiers& m = in.m;
    const bool load = in.op == Opcode::kSuld;
    const Opnd& a = in.ops[load ? 1 : 0];
    const Opnd& v = in.ops[load ? 0 : 1];
    const Opnd& coords = a.elems.back();
    const int dims = m.has(Flag::kGeom1d) ? 1 : m.has(Flag::kGeom2d) ? 2 : 3;
    const unsigned elem = tsize(in.type);
    const unsigned n = m.vectorWidth;
    const uint64_t size = uint64_t{elem} * n;
    for (uint32_t mask = exec; mask; mask &= mask - 1) {
      const int lane = std::countr_zero(mask);
      const uint64_t handle = effectiveAddress(w, f, a, lane);
      const TextureView* t = textureObject(handle, true);
      if (t == nullptr) return noObject(w, in, lane, handle, true);
      std::array<int64_t, 3> at{0, 0, 0};
      for (int d = 0; d < dims; ++d) {
        at[static_cast<size_t>(d)] = static_cast<int32_t>(
            static_cast<uint32_t>(read(w, f, coords.elems[static_cast<size_t>(d)], lane)));
      }
      const int64_t rowBytes = static_cast<int64_t>(t->width * t->texelBytes());
      const std::array<int64_t, 3> limit{rowBytes - static_cast<int64_t>(size),
                                         static_cast<int64_t>(t->height) - 1,
                                         static_cast<int64_t>(t->depth) - 1};
      bool outside = false;
      for (size_t d = 0; d < 3; ++d) outside = outside || at[d] < 0 || at[d] > limit[d];
      if (outside) {
        if (m.has(Flag::kZero)) {
          if (load) {
            for (unsigned i = 0; i < n; ++i) {
              writeReg(f, v.kind == OpndKind::kVec ? v.elems[i] : v, lane, 0);
            }
          }
          continue;
        }
        if (!m.has(Flag::kClamp)) {
          return raise(KernelFault::kIllegalAddress, w, in, lane,
                       fmt::format("surface access at ({}, {}, {}) outside its {} x {} x {} texels",
                                   at[0], at[1], at[2], t->width, t->height, t->depth));
        }
        for (size_t d = 0; d < 3; ++d) {
          at[d] = std::clamp<int64_t>(at[d], 0, std::max<int64_t>(limit[d], 0));
        }
      }
      if (at[0] % static_cast<int64_t>(size) != 0) {
        return raise(
            KernelFault::kMisalignedAddress, w, in, lane,
            fmt::format("surface access at byte {} of a row is not {}-byte aligned", at[0], size));
      }
      const uint64_t address = t->address + static_cast<uint64_t>(at[2]) * t->slicePitch +
                               static_cast<uint64_t>(at[1]) * t->pitch +
                               static_cast<uint64_t>(at[0]);
      if (!l_.context.memory->isAccessible(address, size)) {
        return raise(KernelFault::kIllegalAddress, w, in, lane,
                     "surface memory that is not the context's");
      }
      if (recording_) recordAccess(address, size, load, !load);
      auto* p = reinterpret_cast<uint8_t*>(address);
      for (unsigned i = 0; i < n; ++i) {
        const Opnd& r = v.kind == OpndKind::kVec ? v.elems[i] : v;
        if (load) {
          writeReg(f, r, lane, loadBytes(p + i * elem, elem));
        } else {
          const uint64_t value = read(w, f, r, lane);
          std::memcpy(p + i * elem, &value, elem);
        }
      }
    }
    return Step::kContinue;
  }

  // txq / suq: a property of the object. Surfaces report their width in
  // elements, as textures do.
  Step executeTextureQuery(Warp& w, Frame& f, const Inst& in, uint32_t exec) {
    if (in.unsupported) return unsupportedForm(w, in, exec);
    const ptx::Modifiers& m = in.m;
    const bool surface = in.op == Opcode::kSuq;
    for (uint32_t mask = exec; mask; mask &= mask - 1) {
      const int lane = std::countr_zero(mask);
      const uint64_t handle = effectiveAddress(w, f, in.ops[1], lane);
      const TextureView* t = textureObject(handle, surface);
      if (t == nullptr) return noObject(w, in, lane, handle, surface);
      // The PTX ISA's addressing-mode numbers: wrap 0, mirror 1, clamp_to_edge 3,
      // clamp_to_border 4.
      auto modeNumber = [](TextureView::Address mode) -> uint64_t {
        switch (mode) {
          case TextureView::Address::kWrap:
            return 0;
          case TextureView::Address::kMirror:
            return 1;
          case TextureView::Address::kClamp:
            return 3;
          case TextureView::Address::kBorder:
            return 4;
        }
        return 0;
      };
      uint64_t value = 0;
      if (m.has(Flag::kWidth)) {
        value = t->width;
      } else if (m.has(Flag::kHeight)) {
        value = t->height;
      } else if (m.has(Flag::kDepth)) {
        value = t->depth;
      } else if (m.has(Flag::kNormalizedCoords)) {
        value = t->normalizedCoordinates ? 1 : 0;
      } else if (m.has(Flag::kFilterMode)) {
        value = t->linearFilter ? 1 : 0;
      } else {
        value = modeNumber(t->addressMode[m.has(Flag::kAddrMode0)   ? 0
                                          : m.has(Flag::kAddrMode1) ? 1
                                                                    : 2]);
      }
      writeReg(f, in.ops[0], lane, value);
    }
    return Step::kContinue;
  }

  LaunchState& s_;
  const KernelLaunch& l_;
  const ExecModule& code_;
  uint32_t workerId_;
  std::array<uint32_t, 3> ctaid_{};
  std::vector<uint8_t> shared_;
  alignas(16) std::array<uint8_t, kReservedSharedBytes> reserved_{};
  std::vector<Warp> warps_;
  uint32_t nwarps_ = 0;
  std::array<BarrierState, kBarriers> barriers_{};
  ClusterBarrier clusterBarrier_;
  uint32_t liveThreads_ = 0;
  uint32_t idleRounds_ = 0;       // rounds in a row in which every running warp only waited
  bool waitYielded_ = false;      // the warp's turn ended on an mbarrier phase not yet complete
  bool mbarrierChanged_ = false;  // an mbarrier object changed in this round
  Status fault_;
  uint64_t warpInstructions_ = 0;
  uint64_t laneInstructions_ = 0;
  bool recording_ = false;
  std::vector<ByteRange> reads_;
  std::vector<ByteRange> writes_;
  std::unordered_map<uint64_t, std::optional<TextureView>> textures_;
  std::unordered_map<uint64_t, std::optional<TextureView>> surfaces_;
};

}  // namespace

// A cooperative grid: every block resident at once, as the launch promises,
// so that a grid-wide barrier completes. One thread runs a round of each
// block in turn until all have ended.
void runCooperative(LaunchState& state) {
  std::vector<std::unique_ptr<BlockRunner>> blocks;
  blocks.reserve(static_cast<size_t>(state.totalBlocks));
  for (uint64_t b = 0; b < state.totalBlocks; ++b) {
    auto& runner = blocks.emplace_back(std::make_unique<BlockRunner>(state, 0));
    if (Status st = runner->beginBlock(b); !st.isOk()) return state.setFault(std::move(st));
  }
  for (size_t live = blocks.size(); live > 0 && !state.stop;) {
    for (auto& runner : blocks) {
      if (!runner) continue;
      bool done = false;
      if (Status st = runner->runRound(done); !st.isOk()) return state.setFault(std::move(st));
      if (done) {
        runner.reset();
        --live;
      }
    }
  }
}

Status runKernel(const KernelLaunch& launch, LaunchStats* stats) {
  LaunchState state;
  state.launch = &launch;
  state.kernel = &launch.code->functions[launch.function];
  state.staticShared = launch.code->moduleSharedBytes + state.kernel->scopedSharedBytes;
  state.dynamicBase = (state.staticShared + 15) / 16 * 16;
  state.sharedBytes = state.dynamicBase + launch.config.dynamicSharedBytes;
  state.reservedBase = static_cast<uint32_t>(kReservedSharedOffset);
  const Dim3& g = launch.config.grid;
  state.totalBlocks = uint64_t{g.x} * g.y * g.z;
  uint32_t workers = static_cast<uint32_t>(
      std::clamp<uint64_t>(launch.workers, 1, std::max<uint64_t>(state.totalBlocks, 1)));
  if (launch.config.cooperative) {
    runCooperative(state);
  } else if (workers == 1) {
    BlockRunner runner(state, 0);
    runner.run();
  } else {
    std::vector<std::thread> threads;
    threads.reserve(workers);
    for (uint32_t i = 0; i < workers; ++i) {
      threads.emplace_back([&state, i] {
        BlockRunner runner(state, i);
        runner.run();
      });
    }
    for (auto& t : threads) t.join();
  }
  if (launch.record) {
    auto coalesce = [](std::vector<ByteRange> v) {
      std::sort(v.begin(), v.end(), [](const ByteRange& a, const ByteRange& b) {
        return a.begin < b.begin;
      });
      std::vector<ByteRange> out;
      for (const ByteRange& r : v) {
        if (!out.empty() && r.begin <= out.back().end) {
          out.back().end = std::max(out.back().end, r.end);
        } else {
          out.push_back(r);
        }
      }
      return out;
    };
    launch.record->reads = coalesce(std::move(state.reads));
    launch.record->writes = coalesce(std::move(state.writes));
  }
  if (stats) {
    stats->warpInstructions = state.warpInstructions;
    stats->laneInstructions = state.laneInstructions;
  }
  return state.fault;
}

}  // namespace phos::vgpu::engine::detail
