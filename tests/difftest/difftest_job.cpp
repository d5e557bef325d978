// SPDX-License-Identifier: Apache-2.0
// phos-difftest-job: a random CUDA Driver API program, planned from a seed, for
// the differential checkpoint/restore tester (tests/python/difftest.py,
// docs/checkpoint.md "Differential testing").
//
//   phos-difftest-job --seed S [--steps N] [--sleep-ms M] [--features LIST]
//                     [--explain] [--trace]
//
// From the seed alone it plans and runs N steps of random operations:
// allocations of random sizes (cuMemAlloc, cuMemAllocPitch, cuMemAllocAsync
// and cuMemAllocFromPoolAsync with pools of its own, pinned host memory,
// cuMemAllocManaged, which the host also writes directly) and their frees and
// reallocations; memsets of every width (1D, 2D, sync and
// async); copies between host (pageable and pinned), device and module globals
// (1D, 2D, async, unified cuMemcpy); kernels from modules of three image kinds
// (PTX, a fatbin of SASS and zstd PTX, a PTX-only LZ4 fatbin) loaded by four
// entry points (cuModuleLoadData, cuModuleLoad, cuLibraryLoadData,
// cuLibraryLoadFromFile), launched four ways, on subsets of buffers, through
// pointers stored in device memory, in structs passed by value and in a
// `__device__` pointer variable; several streams (flags, priorities) ordered by
// events; host functions and stream callbacks; bursts of host threads, each on
// a stream and buffers of its own.
//
// After each step it synchronizes and prints ONE line, "step K CHECKSUM": a
// hash of every live device buffer, module global and pinned buffer (in
// creation order; device pointers stored in memory hashed as the buffer and
// offset they point at, since addresses differ between vgpu and PhOS), of the
// host's own accumulators, and of the objects' settings it can query. The last
// line, "final CHECKSUM ...", hashes all of that once more with every step's
// checksum and the counters. The output depends on the seed and options only:
// no timing, no float atomics, threads touch disjoint buffers and are joined
// before a line is printed, and every RNG draw happens on the main thread.
//
// --explain writes each hashed item's own hash to stderr at every step
// ("difftest: step K ITEM HASH"), which names what differs when two runs'
// lines do; --trace writes every operation to stderr.
//
// --features: a comma-separated list applied to the default set: NAME or +NAME
// adds, -NAME removes, "all" and "none" reset, "default" restores. Features
// (all on by default): pinned pools pitch threads events globals pointers
// hostfns libraries reload launches streams elapsed ctx-limits func-attrs
// managed. elapsed, ctx-limits and func-attrs are state PhOS restores since
// the draft of this job: events recorded before a checkpoint
// (cuEventElapsedTime across a restore), context limits and cache
// configuration, function attributes (cuFuncSetAttribute). managed adds
// cuMemAllocManaged buffers, which the host also reads and rewrites through
// their pointers. graphs (not on by default: the fixed seeds keep their plans)
// captures kernels and sets into executable graphs, launched on any stream
// later, until a buffer or module they name goes; between launches a kernel
// node takes a new argument in the executable graph only, or in the graph
// then the executable graph (cuGraphExecUpdate), or a node is disabled or
// enabled again. vmm (not on by default either) adds buffers of the program's
// own VMM: reserved, created, mapped and granted, then unmapped and freed.
// arrays (not on by default) adds CUDA arrays of 32-bit words with a texture
// and a surface object each: filled from the host or a buffer, sampled by a
// kernel through the texture into a buffer, written by a kernel through the
// surface, copied to and from buffers (1D and 2D, pageable host memory too),
// spare texture objects made and destroyed (freed handle slots), and the
// arrays destroyed with their objects.
#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if !defined(PHOS_DIFFTEST_PTX) || !defined(PHOS_DIFFTEST_FATBIN) || !defined(PHOS_DIFFTEST_FATBIN_PTX)
#error "PHOS_DIFFTEST_PTX, PHOS_DIFFTEST_FATBIN and PHOS_DIFFTEST_FATBIN_PTX must name the kernels' images"
#endif

namespace {

// ---- where we are, for error messages ---------------------------------------------

int gStep = 0;
int gOp = 0;
const char* gOpName = "setup";

[[noreturn]] void fail(const char* what, CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = "unknown CUresult";
  std::fprintf(stderr, "phos-difftest-job: step %d op %d (%s): %s failed: %s (%d)\n", gStep, gOp, gOpName, what,
               name, static_cast<int>(r));
  std::fflush(stderr);
  // Worker threads may be inside the driver: leave without destructors.
  std::_Exit(1);
}

#define CHECK(call)                          \
  do {                                       \
    CUresult r_ = (call);                    \
    if (r_ != CUDA_SUCCESS) fail(#call, r_); \
  } while (0)

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "phos-difftest-job: step %d op %d (%s): %s\n", gStep, gOp, gOpName, why.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// ---- options -----------------------------------------------------------------------

enum Feature : uint32_t {
  kPinned = 1u << 0,
  kPools = 1u << 1,
  kPitch = 1u << 2,
  kThreads = 1u << 3,
  kEvents = 1u << 4,
  kGlobals = 1u << 5,
  kPointers = 1u << 6,
  kHostFns = 1u << 7,
  kLibraries = 1u << 8,
  kReload = 1u << 9,
  kLaunches = 1u << 10,
  kStreams = 1u << 11,
  kElapsed = 1u << 12,
  kCtxLimits = 1u << 13,
  kFuncAttrs = 1u << 14,
  kManaged = 1u << 15,
  kGraphs = 1u << 16,
  kVmm = 1u << 17,
  kArrays = 1u << 18,
};

struct FeatureName {
  const char* name;
  uint32_t bit;
  bool byDefault;
};
constexpr FeatureName kFeatures[] = {
    {"pinned", kPinned, true},        {"pools", kPools, true},
    {"pitch", kPitch, true},          {"threads", kThreads, true},
    {"events", kEvents, true},        {"globals", kGlobals, true},
    {"pointers", kPointers, true},    {"hostfns", kHostFns, true},
    {"libraries", kLibraries, true},  {"reload", kReload, true},
    {"launches", kLaunches, true},    {"streams", kStreams, true},
    {"elapsed", kElapsed, true},      {"ctx-limits", kCtxLimits, true},
    {"func-attrs", kFuncAttrs, true}, {"managed", kManaged, true},
    {"graphs", kGraphs, false},       {"vmm", kVmm, false},
    {"arrays", kArrays, false},
};

uint32_t defaultFeatures() {
  uint32_t f = 0;
  for (const auto& n : kFeatures)
    if (n.byDefault) f |= n.bit;
  return f;
}

std::string featureList(uint32_t f) {
  std::string s;
  for (const auto& n : kFeatures) {
    if ((f & n.bit) == 0) continue;
    if (!s.empty()) s += ',';
    s += n.name;
  }
  return s.empty() ? "none" : s;
}

struct Options {
  uint64_t seed = 1;
  int steps = 20;
  int sleepMs = 0;
  uint32_t features = defaultFeatures();
  bool explain = false;
  bool trace = false;
};

bool parseFeatures(std::string_view list, uint32_t& f) {
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    if (item.empty()) continue;
    if (item == "all") {
      for (const auto& n : kFeatures) f |= n.bit;
      continue;
    }
    if (item == "none") {
      f = 0;
      continue;
    }
    if (item == "default") {
      f = defaultFeatures();
      continue;
    }
    bool remove = item[0] == '-';
    if (item[0] == '-' || item[0] == '+') item.remove_prefix(1);
    const FeatureName* found = nullptr;
    for (const auto& n : kFeatures)
      if (item == n.name) found = &n;
    if (found == nullptr) {
      std::fprintf(stderr, "phos-difftest-job: unknown feature '%.*s' (known: %s)\n", static_cast<int>(item.size()),
                   item.data(), featureList(~0u).c_str());
      return false;
    }
    if (remove)
      f &= ~found->bit;
    else
      f |= found->bit;
  }
  return true;
}

bool parse(int argc, char** argv, Options& o) {
  bool seeded = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    auto number = [&](long long low, long long high, long long& out) {
      const char* v = value();
      if (v == nullptr) return false;
      char* end = nullptr;
      long long n = std::strtoll(v, &end, 10);
      if (*v == '\0' || *end != '\0' || n < low || n > high) return false;
      out = n;
      return true;
    };
    long long n = 0;
    bool ok = true;
    if (a == "--seed") {
      const char* v = value();
      char* end = nullptr;
      ok = v != nullptr && *v != '\0';
      if (ok) o.seed = std::strtoull(v, &end, 0);
      ok = ok && *end == '\0';
      seeded = ok;
    } else if (a == "--steps") {
      ok = number(1, 100000, n);
      o.steps = static_cast<int>(n);
    } else if (a == "--sleep-ms") {
      ok = number(0, 60000, n);
      o.sleepMs = static_cast<int>(n);
    } else if (a == "--features") {
      const char* v = value();
      ok = v != nullptr && parseFeatures(v, o.features);
    } else if (a == "--explain") {
      o.explain = true;
    } else if (a == "--trace") {
      o.trace = true;
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: phos-difftest-job --seed S [--steps N] [--sleep-ms M] [--features LIST] [--explain] "
                  "[--trace]\nfeatures (default: %s): %s\n",
                  featureList(defaultFeatures()).c_str(), featureList(~0u).c_str());
      std::exit(0);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "phos-difftest-job: bad argument %s (see --help)\n", argv[i]);
      return false;
    }
  }
  if (!seeded) {
    std::fprintf(stderr, "phos-difftest-job: --seed is required\n");
    return false;
  }
  return true;
}

// ---- randomness and hashing ------------------------------------------------------------

// xoshiro256** seeded through splitmix64: the same sequence everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& w : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n), n > 0 (the tiny modulo bias does not matter here).
  uint64_t below(uint64_t n) { return next() % n; }
  uint64_t range(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }
  bool chance(unsigned percent) { return below(100) < percent; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

class Hasher {
 public:
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      word(w);
    }
    uint64_t tail = 0;
    for (size_t j = 0; i + j < n; ++j) tail |= static_cast<uint64_t>(p[i + j]) << (8 * j);
    word(tail ^ (static_cast<uint64_t>(n) << 56));
  }
  void word(uint64_t w) {
    h_ ^= w;
    h_ *= 0x100000001b3ull;
    h_ ^= h_ >> 29;
  }
  uint64_t value() const { return h_ ^ (h_ >> 32); }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

std::vector<char> readFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die(std::string("cannot read ") + path);
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  data.push_back('\0');  // PTX text must end with a NUL; a fatbin does not mind
  return data;
}

// ---- the objects the program holds ----------------------------------------------------------

enum class Kind { kDevice, kPitched, kAsync, kPool, kPinned, kTable, kManaged, kVmm };
const char* kindName(Kind k) {
  switch (k) {
    case Kind::kDevice: return "device";
    case Kind::kPitched: return "pitched";
    case Kind::kAsync: return "async";
    case Kind::kPool: return "pool";
    case Kind::kPinned: return "pinned";
    case Kind::kTable: return "table";
    case Kind::kManaged:
      return "managed";
    case Kind::kVmm:
      return "vmm";
  }
  return "?";
}

constexpr int kIdle = -1;         // a buffer no stream has pending work on
constexpr int kLegacy = 0;        // stream slot of the legacy NULL stream
constexpr int kPerThread = 1;     // stream slot of the main thread's per-thread default stream
constexpr unsigned kEntryBytes = 16;  // struct Entry of the kernels

struct Buffer {
  int id = 0;
  Kind kind = Kind::kDevice;
  bool alive = true;
  CUdeviceptr dptr = 0;   // device address (for pinned memory: its device pointer)
  void* host = nullptr;   // pinned memory
  unsigned hostFlags = 0;
  size_t bytes = 0;
  size_t pitch = 0, widthBytes = 0, height = 0;  // pitched
  size_t vmmBytes = 0;                           // vmm: reserved and mapped (whole granules)
  CUmemGenericAllocationHandle vmmHandle = 0;    // vmm: the handle, when kept while mapped
  int lastStream = kIdle;
  int owner = -1;   // -1: the main thread; else a worker thread slot, during a burst
  int pool = -1;    // the pool slot of a pool allocation (-1: the device's current pool)
  unsigned entries = 0;             // a table's entries
  std::vector<int> entryTarget;     // a table's entries: the buffer each names (-1: null)
  bool mapped() const { return kind != Kind::kPinned || (hostFlags & CU_MEMHOSTALLOC_DEVICEMAP) != 0; }
  bool data() const { return kind != Kind::kTable; }
  size_t words() const { return bytes / 4; }
};

struct StreamSlot {
  CUstream handle = nullptr;
  bool alive = false;
  bool created = false;
  unsigned flags = 0;
  int priority = 0;
  CUevent sync = nullptr;  // recorded here when another stream must wait for this one
};

enum KernelIndex { kFill, kMix, kCombine, kCombineStruct, kGather, kSetPtr, kThroughPtr, kGlobalsStep,
                   kHistogram, kReduceShared, kPitchedKernel, kKernelCount };
constexpr const char* kKernelNames[kKernelCount] = {"fill", "mix", "combine", "combine_struct", "gather",
                                                    "set_ptr", "through_ptr", "globals_step", "histogram",
                                                    "reduce_shared", "pitched"};

struct ModuleInstance {
  int id = 0;
  bool alive = true;
  int imageKind = 0;  // 0 PTX, 1 fatbin (SASS + zstd PTX), 2 PTX-only LZ4 fatbin
  int api = 0;        // 0 cuModuleLoadData, 1 cuModuleLoad, 2 cuLibraryLoadData, 3 cuLibraryLoadFromFile
  CUmodule module = nullptr;
  CUlibrary library = nullptr;
  CUfunction fn[kKernelCount] = {};
  CUdeviceptr counter = 0, array = 0, table = 0, ptr = 0, ptrWords = 0;
  int ptrTarget = -1;  // the buffer g_ptr names (-1: null)
  // The stream slot of the kernel that set g_ptr to null when its buffer went
  // (release): the next set_ptr is ordered after it, or the two race.
  int ptrStream = -1;
  int dynamicShared = 0;  // func-attrs: the opt-in of reduce_shared
  // Feature arrays: tex_sample and surf_store (looked up only with it, so
  // that the other features' plans do not change).
  CUfunction texSample = nullptr, surfStore = nullptr;
};

// Feature arrays: a w x h array of 32-bit words, a texture object (point
// sampling, clamped, unnormalized coordinates) and a surface object over it.
struct ArraySlot {
  CUarray array = nullptr;
  CUtexObject texture = 0;
  CUsurfObject surface = 0;
  unsigned w = 0, h = 0;
  bool alive = false;
  size_t bytes() const { return size_t{w} * h * 4; }
};

struct PoolSlot {
  CUmemoryPool pool = nullptr;
  bool alive = false;
  uint64_t threshold = 0;
};

constexpr const char* kImagePaths[3] = {PHOS_DIFFTEST_PTX, PHOS_DIFFTEST_FATBIN, PHOS_DIFFTEST_FATBIN_PTX};
constexpr const char* kImageKinds[3] = {"ptx", "fatbin", "fatbin-ptx-lz4"};
constexpr const char* kLoadApis[4] = {"cuModuleLoadData", "cuModuleLoad", "cuLibraryLoadData",
                                      "cuLibraryLoadFromFile"};

// Host functions and stream callbacks add into these: sums, in any order.
std::atomic<uint64_t> gHostSum{0};
std::atomic<uint64_t> gHostCalls{0};
void CUDA_CB hostFunction(void* value) {
  gHostSum.fetch_add(reinterpret_cast<uintptr_t>(value) * 0x9e3779b1u, std::memory_order_relaxed);
  gHostCalls.fetch_add(1, std::memory_order_relaxed);
}
void CUDA_CB streamCallback(CUstream, CUresult status, void* value) {
  gHostSum.fetch_add(reinterpret_cast<uintptr_t>(value) * 0x85ebca6bu + static_cast<unsigned>(status),
                     std::memory_order_relaxed);
  gHostCalls.fetch_add(1, std::memory_order_relaxed);
}

// What a worker thread of a burst does, planned by the main thread.
struct ThreadOp {
  enum Type { kMemset, kMix, kCombine, kUpload, kDownload, kTemp, kHostFn } type = kMemset;
  int a = -1, b = -1;  // buffers
  size_t offset = 0, words = 0;
  unsigned value = 0;
  int module = 0;
  size_t tempBytes = 0;
};

struct ThreadSlot {
  int stream = -1;        // its stream slot (created for it), or kPerThread-like use of CU_STREAM_PER_THREAD
  bool perThread = false;
  uint64_t accumulator = 0;
};

constexpr size_t kMaxLiveBytes = 40u << 20;
constexpr size_t kMaxBuffers = 40;
constexpr size_t kMaxKernelWords = 64u << 10;
constexpr int kMaxModules = 3;
constexpr int kMaxThreads = 4;

class Job {
 public:
  explicit Job(const Options& o) : o_(o), rng_(o.seed) {}

  int run() {
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device_, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx_, device_));
    CHECK(cuCtxSetCurrent(ctx_));
    CHECK(cuCtxGetStreamPriorityRange(&leastPriority_, &greatestPriority_));
    for (int k = 0; k < 3; ++k) images_[k] = readFile(kImagePaths[k]);
    // Slots 0 and 1: the legacy stream and the main thread's per-thread stream.
    streams_.resize(2);
    streams_[kLegacy].handle = CU_STREAM_LEGACY;
    streams_[kPerThread].handle = CU_STREAM_PER_THREAD;
    for (auto& s : streams_) {
      s.alive = true;
      CHECK(cuEventCreate(&s.sync, CU_EVENT_DISABLE_TIMING));
    }
    std::vector<uint64_t> stepSums;
    for (gStep = 1; gStep <= o_.steps; ++gStep) {
      gOp = 0;
      if (gStep == 1) setup();
      const int ops = static_cast<int>(rng_.range(4, 13));
      for (int i = 0; i < ops; ++i) {
        ++gOp;
        operation();
      }
      gOpName = "checksum";
      CHECK(cuCtxSynchronize());
      for (auto& b : buffers_) b.lastStream = kIdle;
      const uint64_t sum = checksum(true);
      stepSums.push_back(sum);
      std::printf("step %d %016llx\n", gStep, static_cast<unsigned long long>(sum));
      std::fflush(stdout);
      if (o_.sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.sleepMs));
    }
    gStep = o_.steps;
    gOpName = "final";
    return finish(stepSums);
  }

 private:
  // ---- tracing ----
  __attribute__((format(printf, 2, 3))) void trace(const char* fmt, ...) {
    if (!o_.trace) return;
    char line[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    std::fprintf(stderr, "difftest: step %d op %d %s: %s\n", gStep, gOp, gOpName, line);
  }
  bool has(uint32_t feature) const { return (o_.features & feature) != 0; }

  // ---- ordering between streams ----

  // Orders the next operation on stream slot `s` after all earlier work on the
  // buffers `ids` (reads and writes alike: each access waits for the previous
  // one, so the chain covers every hazard), then makes `s` their last stream.
  void orderOn(int s, std::initializer_list<int> ids) { orderOn(s, std::vector<int>(ids)); }
  void orderOn(int s, const std::vector<int>& ids) {
    std::vector<int> waited;
    for (int id : ids) {
      if (id < 0) continue;
      Buffer& b = buffers_[id];
      if (b.lastStream != kIdle && b.lastStream != s &&
          std::find(waited.begin(), waited.end(), b.lastStream) == waited.end()) {
        StreamSlot& from = streams_[b.lastStream];
        CHECK(cuEventRecord(from.sync, from.handle));
        CHECK(cuStreamWaitEvent(streams_[s].handle, from.sync, 0));
        waited.push_back(b.lastStream);
      }
    }
    for (int id : ids)
      if (id >= 0) buffers_[id].lastStream = s;
  }
  // The host is about to read, write or free these buffers.
  void hostWait(std::initializer_list<int> ids) {
    for (int id : ids) {
      Buffer& b = buffers_[id];
      if (b.lastStream != kIdle) {
        const int s = b.lastStream;
        CHECK(cuStreamSynchronize(streams_[s].handle));
        for (auto& other : buffers_)
          if (other.lastStream == s) other.lastStream = kIdle;
      }
    }
  }

  // A live stream slot of the main thread, chosen at random.
  int pickStream() {
    std::vector<int> live;
    for (size_t i = 0; i < streams_.size(); ++i)
      if (streams_[i].alive && (i < 2 || !ownedByThread(static_cast<int>(i)))) live.push_back(static_cast<int>(i));
    return rng_.pick(live);
  }
  bool ownedByThread(int slot) const {
    for (const auto& t : threads_)
      if (t.stream == slot) return true;
    return false;
  }

  // ---- choosing buffers ----

  std::vector<int> live(bool dataOnly = true, bool deviceOnly = false, bool mappedOnly = false) const {
    std::vector<int> ids;
    for (const auto& b : buffers_) {
      if (!b.alive || b.owner >= 0) continue;
      if (dataOnly && !b.data()) continue;
      if (deviceOnly && b.kind == Kind::kPinned) continue;
      if (mappedOnly && !b.mapped()) continue;
      ids.push_back(b.id);
    }
    return ids;
  }
  size_t liveBytes() const {
    size_t n = 0;
    for (const auto& b : buffers_)
      if (b.alive) n += b.bytes;
    return n;
  }
  size_t liveCount() const {
    return static_cast<size_t>(std::count_if(buffers_.begin(), buffers_.end(), [](const Buffer& b) { return b.alive; }));
  }

  size_t pickSize() {
    const uint64_t r = rng_.below(100);
    size_t n;
    if (r < 10)
      n = rng_.range(1, 64) * 4;
    else if (r < 70)
      n = rng_.range(256, 65536) * 4;
    else if (r < 92)
      n = rng_.range(65536, 524288) * 4;
    else
      n = rng_.range(524288, 1572864) * 4;
    if (rng_.chance(50)) n = (n + 4095) & ~size_t{4095};
    return n;
  }

  // A word range [offset, offset + words) of buffer b, words >= 1.
  std::pair<size_t, size_t> pickRange(const Buffer& b, size_t maxWords) {
    const size_t total = b.kind == Kind::kPitched ? b.widthBytes / 4 : b.words();
    size_t words = std::min(maxWords, total);
    if (rng_.chance(60)) words = rng_.range(1, words);
    const size_t offset = rng_.below(total - words + 1);
    return {offset, words};
  }

  const ModuleInstance& pickModule() {
    std::vector<int> ids;
    for (const auto& m : modules_)
      if (m.alive) ids.push_back(m.id);
    return modules_[rng_.pick(ids)];
  }

  // ---- launching ----

  void launch(const ModuleInstance& m, KernelIndex k, unsigned gx, unsigned gy, unsigned bx, unsigned shared,
              int s, std::vector<void*> params, const std::vector<size_t>& sizes, bool mayVary = true) {
    const CUfunction f = m.fn[k];
    CUstream stream = streams_[s].handle;
    const uint64_t how = (mayVary && has(kLaunches)) ? rng_.below(4) : 0;
    trace("launch %s of module %d grid %ux%u block %u shared %u stream %d via %d", kKernelNames[k], m.id, gx, gy,
          bx, shared, s, static_cast<int>(how));
    if (how == 0) {
      CHECK(cuLaunchKernel(f, gx, gy, 1, bx, 1, 1, shared, stream, params.data(), nullptr));
    } else if (how == 1) {
      // One buffer of parameters, each at its natural alignment.
      std::vector<unsigned char> buffer;
      for (size_t i = 0; i < params.size(); ++i) {
        const size_t align = std::min<size_t>(sizes[i], 8);
        buffer.resize((buffer.size() + align - 1) / align * align);
        const size_t at = buffer.size();
        buffer.resize(at + sizes[i]);
        std::memcpy(buffer.data() + at, params[i], sizes[i]);
      }
      size_t size = buffer.size();
      void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                       CU_LAUNCH_PARAM_END};
      CHECK(cuLaunchKernel(f, gx, gy, 1, bx, 1, 1, shared, stream, nullptr, extra));
    } else if (how == 2) {
      CUlaunchConfig config{};
      config.gridDimX = gx;
      config.gridDimY = gy;
      config.gridDimZ = 1;
      config.blockDimX = bx;
      config.blockDimY = 1;
      config.blockDimZ = 1;
      config.sharedMemBytes = shared;
      config.hStream = stream;
      CUlaunchAttribute attr{};
      if (rng_.chance(50)) {
        attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
        attr.value.priority = static_cast<int>(rng_.range(0, static_cast<uint64_t>(leastPriority_ - greatestPriority_))) +
                              greatestPriority_;
        config.attrs = &attr;
        config.numAttrs = 1;
      }
      CHECK(cuLaunchKernelEx(&config, f, params.data(), nullptr));
    } else {
      // A cooperative launch: a grid small enough to be resident at once.
      CHECK(cuLaunchCooperativeKernel(f, std::min(gx, 4u), std::min(gy, 2u), 1, bx, 1, 1, shared, stream,
                                      params.data()));
    }
  }

  static unsigned blocksFor(size_t words) { return static_cast<unsigned>(std::clamp<size_t>((words + 255) / 256, 1, 32)); }

  // ---- setup ----

  void setup() {
    gOpName = "setup";
    loadModule();
    for (int i = 0; i < 3; ++i) allocate(Kind::kDevice);
    if (has(kPointers)) allocate(Kind::kTable);
    if (has(kPinned)) allocate(Kind::kPinned);
    if (has(kStreams)) createStream();
    if (has(kPools)) createPool();
    if (has(kArrays)) createArray();
  }

  // ---- modules ----

  void loadModule() {
    ModuleInstance m;
    m.id = static_cast<int>(modules_.size());
    m.imageKind = static_cast<int>(rng_.below(3));
    m.api = static_cast<int>(has(kLibraries) ? rng_.below(4) : rng_.below(2));
    trace("load module %d: %s image through %s", m.id, kImageKinds[m.imageKind], kLoadApis[m.api]);
    const char* path = kImagePaths[m.imageKind];
    const void* image = images_[m.imageKind].data();
    if (m.api == 0) {
      CHECK(cuModuleLoadData(&m.module, image));
    } else if (m.api == 1) {
      CHECK(cuModuleLoad(&m.module, path));
    } else if (m.api == 2) {
      CHECK(cuLibraryLoadData(&m.library, image, nullptr, nullptr, 0, nullptr, nullptr, 0));
    } else {
      CHECK(cuLibraryLoadFromFile(&m.library, path, nullptr, nullptr, 0, nullptr, nullptr, 0));
    }
    if (m.library != nullptr && rng_.chance(50)) {
      // Functions through the library's module, or its kernels (below).
      CHECK(cuLibraryGetModule(&m.module, m.library));
    }
    for (int k = 0; k < kKernelCount; ++k) {
      if (m.module != nullptr) {
        CHECK(cuModuleGetFunction(&m.fn[k], m.module, kKernelNames[k]));
      } else {
        CUkernel kernel = nullptr;
        CHECK(cuLibraryGetKernel(&kernel, m.library, kKernelNames[k]));
        if (rng_.chance(50)) {
          m.fn[k] = reinterpret_cast<CUfunction>(kernel);
        } else {
          CHECK(cuKernelGetFunction(&m.fn[k], kernel));
        }
      }
    }
    auto global = [&](const char* name, CUdeviceptr& at, size_t expect) {
      size_t bytes = 0;
      if (m.library != nullptr && m.module == nullptr) {
        CHECK(cuLibraryGetGlobal(&at, &bytes, m.library, name));
      } else {
        CHECK(cuModuleGetGlobal(&at, &bytes, m.module, name));
      }
      if (bytes != expect) die(std::string("global ") + name + " has an unexpected size");
    };
    if (has(kArrays)) {
      for (auto [name, fn] :
           {std::pair{"tex_sample", &m.texSample}, std::pair{"surf_store", &m.surfStore}}) {
        if (m.module != nullptr) {
          CHECK(cuModuleGetFunction(fn, m.module, name));
        } else {
          CUkernel kernel = nullptr;
          CHECK(cuLibraryGetKernel(&kernel, m.library, name));
          CHECK(cuKernelGetFunction(fn, kernel));
        }
      }
    }
    global("g_counter", m.counter, 4);
    global("g_array", m.array, 4096);
    global("c_table", m.table, 1024);
    global("g_ptr", m.ptr, 8);
    global("g_ptr_words", m.ptrWords, 4);
    // The constant table, from the host (cuMemcpyHtoD to the global's address).
    std::vector<unsigned> table(256);
    for (auto& w : table) w = static_cast<unsigned>(rng_.next());
    CHECK(cuMemcpyHtoD(m.table, table.data(), table.size() * 4));
    modules_.push_back(m);
  }

  void unloadModule(ModuleInstance& m) {
    trace("unload module %d", m.id);
    dropGraphs([&](const GraphExec& g) { return g.module == m.id; });
    CHECK(cuCtxSynchronize());
    for (auto& b : buffers_) b.lastStream = kIdle;
    if (m.library != nullptr) {
      CHECK(cuLibraryUnload(m.library));
    } else {
      CHECK(cuModuleUnload(m.module));
    }
    m.alive = false;
  }

  // ---- allocations ----

  int allocate(Kind kind) {
    Buffer b;
    b.id = static_cast<int>(buffers_.size());
    b.kind = kind;
    const int s = pickStream();
    switch (kind) {
      case Kind::kDevice:
        b.bytes = pickSize();
        CHECK(cuMemAlloc(&b.dptr, b.bytes));
        break;
      case Kind::kTable:
        b.entries = static_cast<unsigned>(rng_.range(1, 8));
        b.bytes = b.entries * kEntryBytes;
        b.entryTarget.assign(b.entries, -1);
        CHECK(cuMemAlloc(&b.dptr, b.bytes));
        break;
      case Kind::kPitched: {
        const unsigned element = 4u << rng_.below(3);
        b.widthBytes = rng_.range(1, 2048) * 4;
        b.height = rng_.range(1, 256);
        CHECK(cuMemAllocPitch(&b.dptr, &b.pitch, b.widthBytes, b.height, element));
        b.bytes = b.pitch * b.height;
        break;
      }
      case Kind::kAsync:
        b.bytes = pickSize();
        CHECK(cuMemAllocAsync(&b.dptr, b.bytes, streams_[s].handle));
        b.lastStream = s;
        break;
      case Kind::kPool: {
        std::vector<int> pools;
        for (size_t i = 0; i < pools_.size(); ++i)
          if (pools_[i].alive) pools.push_back(static_cast<int>(i));
        if (pools.empty()) return allocate(Kind::kAsync);
        b.pool = rng_.pick(pools);
        b.bytes = pickSize();
        CHECK(cuMemAllocFromPoolAsync(&b.dptr, b.bytes, pools_[b.pool].pool, streams_[s].handle));
        b.lastStream = s;
        break;
      }
      case Kind::kManaged:
        b.bytes = pickSize();
        CHECK(cuMemAllocManaged(&b.dptr, b.bytes,
                                rng_.chance(25) ? CU_MEM_ATTACH_HOST : CU_MEM_ATTACH_GLOBAL));
        break;
      case Kind::kVmm: {
        // The program's own VMM: a range of its own, physical memory mapped
        // there and made accessible; the handle released at once (the
        // mapping keeps the memory) or kept until the free.
        b.bytes = pickSize();
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device_;
        size_t granularity = 0;
        CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        b.vmmBytes = (b.bytes + granularity - 1) / granularity * granularity;
        CHECK(cuMemAddressReserve(&b.dptr, b.vmmBytes, 0, 0, 0));
        CUmemGenericAllocationHandle handle = 0;
        CHECK(cuMemCreate(&handle, b.vmmBytes, &prop, 0));
        CHECK(cuMemMap(b.dptr, b.vmmBytes, 0, handle, 0));
        if (rng_.chance(50)) {
          CHECK(cuMemRelease(handle));
        } else {
          b.vmmHandle = handle;
        }
        CUmemAccessDesc access{};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CHECK(cuMemSetAccess(b.dptr, b.vmmBytes, &access, 1));
        break;
      }
      case Kind::kPinned: {
        b.bytes = rng_.range(1, 65536) * 4;
        static constexpr unsigned kFlags[] = {0, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP,
                                              CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP,
                                              CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED};
        if (rng_.chance(20)) {
          CHECK(cuMemAllocHost(&b.host, b.bytes));
        } else {
          b.hostFlags = kFlags[rng_.below(std::size(kFlags))];
          CHECK(cuMemHostAlloc(&b.host, b.bytes, b.hostFlags));
        }
        CHECK(cuMemHostGetFlags(&b.hostFlags, b.host));
        if (b.mapped()) CHECK(cuMemHostGetDevicePointer(&b.dptr, b.host, 0));
        break;
      }
    }
    trace("allocate buffer %d: %s, %zu bytes (pitch %zu)", b.id, kindName(kind), b.bytes, b.pitch);
    buffers_.push_back(b);
    initialize(b.id, s);
    return b.id;
  }

  // Every byte of a new buffer is written before anything reads it: fresh and
  // reused memory hold different garbage on vgpu and under PhOS.
  void initialize(int id, int s) {
    Buffer& b = buffers_[id];
    if (b.kind == Kind::kPinned) {
      auto* w = static_cast<unsigned*>(b.host);
      for (size_t i = 0; i < b.words(); ++i) w[i] = static_cast<unsigned>(i * 2654435761u) ^ static_cast<unsigned>(id);
      return;
    }
    if (b.kind == Kind::kManaged && rng_.chance(40)) {
      // By the host, through the pointer (nothing is pending on a new buffer).
      auto* w = reinterpret_cast<unsigned char*>(b.dptr);
      const unsigned char salt = static_cast<unsigned char>(rng_.next());
      for (size_t i = 0; i < b.bytes; ++i) w[i] = static_cast<unsigned char>(salt + i * 13);
      return;
    }
    const uint64_t how = b.kind == Kind::kTable ? 0 : rng_.below(3);
    if (how == 0) {
      const unsigned value = b.kind == Kind::kTable ? 0 : static_cast<unsigned>(rng_.next());
      if (b.kind == Kind::kPitched) {
        orderOn(kLegacy, {id});
        CHECK(cuMemsetD2D32(b.dptr, b.pitch, value, b.pitch / 4, b.height));
      } else if (b.bytes % 4 == 0 && rng_.chance(50)) {
        orderOn(s, {id});
        CHECK(cuMemsetD32Async(b.dptr, value, b.words(), streams_[s].handle));
      } else {
        orderOn(kLegacy, {id});
        CHECK(cuMemsetD8(b.dptr, static_cast<unsigned char>(value), b.bytes));
      }
    } else if (how == 1) {
      std::vector<unsigned> data(b.bytes / 4);
      const unsigned salt = static_cast<unsigned>(rng_.next());
      for (size_t i = 0; i < data.size(); ++i) data[i] = salt ^ static_cast<unsigned>(i * 0x9e3779b1u);
      orderOn(kLegacy, {id});
      CHECK(cuMemcpyHtoD(b.dptr, data.data(), b.bytes));
    } else {
      // The fill kernel, on the whole allocation (a pitched one as words).
      const ModuleInstance& m = pickModule();
      CUdeviceptr p = b.dptr;
      unsigned n = static_cast<unsigned>(b.bytes / 4);
      unsigned seed = static_cast<unsigned>(rng_.next());
      orderOn(s, {id});
      launch(m, kFill, blocksFor(n), 1, 256, 0, s, {&p, &n, &seed}, {8, 4, 4});
    }
  }

  void release(int id) {
    dropGraphs([&](const GraphExec& g) {
      return std::find(g.buffers.begin(), g.buffers.end(), id) != g.buffers.end();
    });
    Buffer& b = buffers_[id];
    trace("free buffer %d (%s)", id, kindName(b.kind));
    // Nothing may point at it any more: table entries and g_ptr variables.
    for (auto& t : buffers_) {
      if (!t.alive || t.kind != Kind::kTable) continue;
      for (unsigned e = 0; e < t.entries; ++e) {
        if (t.entryTarget[e] != id) continue;
        orderOn(kLegacy, {t.id});
        CHECK(cuMemsetD8(t.dptr + e * kEntryBytes, 0, kEntryBytes));
        t.entryTarget[e] = -1;
      }
    }
    for (auto& m : modules_) {
      if (!m.alive || m.ptrTarget != id) continue;
      const int s = pickStream();
      CUdeviceptr null = 0;
      unsigned zero = 0;
      // The kernel itself is ordered after the buffer's users below.
      orderOn(s, {id});
      launch(m, kSetPtr, 1, 1, 32, 0, s, {&null, &zero}, {8, 4});
      m.ptrTarget = -1;
      m.ptrStream = s;
    }
    if ((b.kind == Kind::kAsync || b.kind == Kind::kPool) && rng_.chance(80)) {
      const int s = pickStream();
      orderOn(s, {id});
      CHECK(cuMemFreeAsync(b.dptr, streams_[s].handle));
    } else if (b.kind == Kind::kPinned) {
      hostWait({id});
      CHECK(cuMemFreeHost(b.host));
    } else if (b.kind == Kind::kVmm) {
      hostWait({id});
      CHECK(cuMemUnmap(b.dptr, b.vmmBytes));
      if (b.vmmHandle != 0) CHECK(cuMemRelease(b.vmmHandle));
      CHECK(cuMemAddressFree(b.dptr, b.vmmBytes));
    } else {
      hostWait({id});
      CHECK(cuMemFree(b.dptr));
    }
    b.alive = false;
    b.lastStream = kIdle;
  }

  Kind pickKind() {
    std::vector<Kind> kinds = {Kind::kDevice, Kind::kDevice, Kind::kDevice};
    if (has(kPitch)) kinds.push_back(Kind::kPitched);
    if (has(kPools)) {
      kinds.push_back(Kind::kAsync);
      kinds.push_back(Kind::kPool);
    }
    if (has(kPinned)) kinds.push_back(Kind::kPinned);
    if (has(kPointers)) kinds.push_back(Kind::kTable);
    if (has(kManaged)) kinds.push_back(Kind::kManaged);
    if (has(kVmm)) kinds.push_back(Kind::kVmm);
    return rng_.pick(kinds);
  }

  // ---- streams and pools ----

  int createStream() {
    StreamSlot s;
    s.flags = rng_.chance(50) ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
    if (rng_.chance(50)) {
      s.priority = greatestPriority_ + static_cast<int>(rng_.range(0, static_cast<uint64_t>(leastPriority_ - greatestPriority_)));
      CHECK(cuStreamCreateWithPriority(&s.handle, s.flags, s.priority));
    } else {
      CHECK(cuStreamCreate(&s.handle, s.flags));
      s.priority = 0;
    }
    CHECK(cuEventCreate(&s.sync, CU_EVENT_DISABLE_TIMING));
    s.alive = true;
    s.created = true;
    streams_.push_back(s);
    trace("create stream %zu flags %u priority %d", streams_.size() - 1, s.flags, s.priority);
    return static_cast<int>(streams_.size() - 1);
  }

  void destroyStream(int slot) {
    trace("destroy stream %d", slot);
    StreamSlot& s = streams_[slot];
    if (rng_.chance(50)) {
      // Work still queued on a destroyed stream completes: wait for it only
      // through the buffers' next users (the legacy stream here).
      for (auto& b : buffers_)
        if (b.alive && b.lastStream == slot) {
          CHECK(cuEventRecord(s.sync, s.handle));
          CHECK(cuStreamWaitEvent(CU_STREAM_LEGACY, s.sync, 0));
          b.lastStream = kLegacy;
        }
    } else {
      CHECK(cuStreamSynchronize(s.handle));
      for (auto& b : buffers_)
        if (b.lastStream == slot) b.lastStream = kIdle;
    }
    CHECK(cuStreamDestroy(s.handle));
    CHECK(cuEventDestroy(s.sync));
    s.alive = false;
  }

  void createPool() {
    PoolSlot p;
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device_;
    if (rng_.chance(30)) props.maxSize = size_t{256} << 20;
    CHECK(cuMemPoolCreate(&p.pool, &props));
    p.threshold = rng_.chance(50) ? 0 : rng_.range(1, 64) << 20;
    CHECK(cuMemPoolSetAttribute(p.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &p.threshold));
    p.alive = true;
    pools_.push_back(p);
    trace("create pool %zu threshold %llu", pools_.size() - 1, static_cast<unsigned long long>(p.threshold));
  }

  // ---- one random operation ----

  void operation() {
    struct Choice {
      const char* name;
      unsigned weight;
      void (Job::*run)();
    };
    std::vector<Choice> choices = {
        {"alloc", liveCount() < kMaxBuffers && liveBytes() < kMaxLiveBytes ? 8u : 0u,
         &Job::opAlloc},
        {"free", liveCount() > 4 ? 5u : 0u, &Job::opFree},
        {"realloc", liveCount() > 2 ? 3u : 0u, &Job::opRealloc},
        {"memset", 12, &Job::opMemset},
        {"memset2d", has(kPitch) ? 4u : 0u, &Job::opMemset2D},
        {"htod", 8, &Job::opHtoD},
        {"dtoh", 6, &Job::opDtoH},
        {"dtod", 8, &Job::opDtoD},
        {"copy2d", has(kPitch) ? 3u : 0u, &Job::opCopy2D},
        {"kernel", 20, &Job::opKernel},
        {"gather", has(kPointers) ? 4u : 0u, &Job::opGather},
        {"table", has(kPointers) ? 3u : 0u, &Job::opTable},
        {"ptrvar", has(kPointers) ? 3u : 0u, &Job::opPointerVariable},
        {"globals", has(kGlobals) ? 5u : 0u, &Job::opGlobals},
        {"streams", has(kStreams) ? 2u : 0u, &Job::opStreams},
        {"events", has(kEvents) ? 3u : 0u, &Job::opEvents},
        {"hostfn", has(kHostFns) ? 3u : 0u, &Job::opHostFn},
        {"threads", has(kThreads) ? 3u : 0u, &Job::opThreads},
        {"pools", has(kPools) ? 2u : 0u, &Job::opPools},
        {"modules", has(kReload) ? 1u : 0u, &Job::opModules},
        {"sync", 3, &Job::opSync},
        {"elapsed", has(kElapsed) ? 2u : 0u, &Job::opElapsed},
        {"ctx-limits", has(kCtxLimits) ? 2u : 0u, &Job::opCtxLimits},
        {"func-attrs", has(kFuncAttrs) ? 2u : 0u, &Job::opFuncAttrs},
        {"managed-host", has(kManaged) ? 3u : 0u, &Job::opManagedHost},
        {"graphs", has(kGraphs) ? 10u : 0u, &Job::opGraphs},
        {"arrays", has(kArrays) ? 10u : 0u, &Job::opArrays},
    };
    unsigned total = 0;
    for (const auto& c : choices) total += c.weight;
    uint64_t r = rng_.below(total);
    for (const auto& c : choices) {
      if (r < c.weight) {
        gOpName = c.name;
        (this->*c.run)();
        return;
      }
      r -= c.weight;
    }
  }

  void opAlloc() { allocate(pickKind()); }

  // ---- arrays (feature arrays): all their work on the legacy stream ----

  void createArray() {
    ArraySlot a;
    a.w = static_cast<unsigned>(rng_.range(1, 128));
    a.h = static_cast<unsigned>(rng_.range(1, 32));
    CUDA_ARRAY3D_DESCRIPTOR d{};
    d.Width = a.w;
    d.Height = a.h;
    d.Format = CU_AD_FORMAT_UNSIGNED_INT32;
    d.NumChannels = 1;
    d.Flags = CUDA_ARRAY3D_SURFACE_LDST;
    CHECK(cuArray3DCreate(&a.array, &d));
    const int id = static_cast<int>(arrays_.size());
    trace("create array %d: %ux%u", id, a.w, a.h);
    // Every texel written before anything reads it: from the host, or a buffer.
    auto data = live(true, true);
    std::erase_if(data, [&](int i) {
      return buffers_[i].kind == Kind::kManaged || buffers_[i].bytes < a.bytes();
    });
    if (data.empty() || rng_.chance(50)) {
      std::vector<unsigned> words(a.bytes() / 4);
      const unsigned salt = static_cast<unsigned>(rng_.next());
      for (size_t i = 0; i < words.size(); ++i) {
        words[i] = salt ^ static_cast<unsigned>(i * 0x9e3779b1u);
      }
      CHECK(cuMemcpyHtoA(a.array, 0, words.data(), a.bytes()));
    } else {
      const Buffer& b = buffers_[rng_.pick(data)];
      orderOn(kLegacy, {b.id});
      CHECK(cuMemcpyDtoA(a.array, 0, b.dptr, a.bytes()));
    }
    // A spare texture object destroyed after the others leaves a free slot
    // before their handles.
    const bool spare = rng_.chance(40);
    CUtexObject spareTexture = 0;
    if (spare) spareTexture = textureOf(a.array);
    a.texture = textureOf(a.array);
    CUDA_RESOURCE_DESC res{};
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = a.array;
    CHECK(cuSurfObjectCreate(&a.surface, &res));
    if (spare) CHECK(cuTexObjectDestroy(spareTexture));
    a.alive = true;
    arrays_.push_back(a);
  }

  CUtexObject textureOf(CUarray array) {
    CUDA_RESOURCE_DESC res{};
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = array;
    CUDA_TEXTURE_DESC tex{};
    tex.addressMode[0] = tex.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
    tex.filterMode = CU_TR_FILTER_MODE_POINT;
    tex.flags = CU_TRSF_READ_AS_INTEGER;
    CUtexObject t = 0;
    CHECK(cuTexObjectCreate(&t, &res, &tex, nullptr));
    return t;
  }

  void destroyArray(ArraySlot& a) {
    trace("destroy array %ux%u", a.w, a.h);
    CHECK(cuTexObjectDestroy(a.texture));
    CHECK(cuSurfObjectDestroy(a.surface));
    // Launches still reading it are on the legacy stream: done first.
    CHECK(cuStreamSynchronize(CU_STREAM_LEGACY));
    for (auto& b : buffers_)
      if (b.lastStream == kLegacy) b.lastStream = kIdle;
    CHECK(cuArrayDestroy(a.array));
    a.alive = false;
  }

  void opArrays() {
    std::vector<int> alive;
    for (size_t i = 0; i < arrays_.size(); ++i)
      if (arrays_[i].alive) alive.push_back(static_cast<int>(i));
    const uint64_t what = rng_.below(6);
    if (alive.empty() || (what == 0 && alive.size() < 3)) {
      createArray();
      return;
    }
    ArraySlot& a = arrays_[rng_.pick(alive)];
    if (what == 5 && alive.size() > 1) {
      destroyArray(a);
      return;
    }
    auto data = live(true, true, true);
    std::erase_if(data, [&](int i) { return buffers_[i].kind == Kind::kManaged; });
    if (data.empty()) return;
    const Buffer& b = buffers_[rng_.pick(data)];
    const ModuleInstance& m = pickModule();
    CUdeviceptr p = b.dptr;
    unsigned n = static_cast<unsigned>(
        std::min<size_t>(b.kind == Kind::kPitched ? b.widthBytes / 4 : b.words(), kMaxKernelWords));
    unsigned w = a.w, h = a.h, k = static_cast<unsigned>(rng_.next());
    if (n == 0) return;
    orderOn(kLegacy, {b.id});
    if (what <= 2) {
      trace("sample array %ux%u into buffer %d, %u words", a.w, a.h, b.id, n);
      unsigned long long texture = a.texture;
      void* params[] = {&p, &texture, &n, &w, &h, &k};
      CHECK(cuLaunchKernel(m.texSample, blocksFor(n), 1, 1, 256, 1, 1, 0, CU_STREAM_LEGACY, params,
                           nullptr));
    } else if (what == 3) {
      trace("store buffer %d (%u words) into array %ux%u", b.id, n, a.w, a.h);
      unsigned long long surface = a.surface;
      void* params[] = {&surface, &p, &n, &w, &h, &k};
      CHECK(cuLaunchKernel(m.surfStore, blocksFor(size_t{w} * h), 1, 1, 256, 1, 1, 0,
                           CU_STREAM_LEGACY, params, nullptr));
    } else {
      // Copies: array to buffer or back (1D), or a rectangle from pageable host memory (2D).
      const size_t bytes = std::min<size_t>(a.bytes(), size_t{n} * 4);
      const uint64_t how = rng_.below(3);
      trace("copy %zu bytes between array %ux%u and buffer %d (%d)", bytes, a.w, a.h, b.id,
            static_cast<int>(how));
      if (how == 0) {
        CHECK(cuMemcpyAtoD(b.dptr, a.array, 0, bytes));
      } else if (how == 1) {
        CHECK(cuMemcpyDtoA(a.array, 0, b.dptr, bytes));
      } else {
        const unsigned cw = static_cast<unsigned>(rng_.range(1, a.w)),
                       ch = static_cast<unsigned>(rng_.range(1, a.h));
        std::vector<unsigned> rect(size_t{cw} * ch);
        for (size_t i = 0; i < rect.size(); ++i) {
          rect[i] = k ^ static_cast<unsigned>(i * 2654435761u);
        }
        CUDA_MEMCPY2D c{};
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = rect.data();
        c.srcPitch = cw * 4;
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
        c.dstArray = a.array;
        c.dstXInBytes = static_cast<size_t>(rng_.below(a.w - cw + 1)) * 4;
        c.dstY = static_cast<size_t>(rng_.below(a.h - ch + 1));
        c.WidthInBytes = cw * 4;
        c.Height = ch;
        CHECK(cuMemcpy2D(&c));
      }
    }
  }

  // The host reads and rewrites part of a managed buffer through its pointer,
  // once the work that uses it is done: the words read go into the host's
  // accumulator, and each is replaced by a mix of itself.
  void opManagedHost() {
    auto ids = live();
    std::erase_if(
        ids, [&](int i) { return buffers_[i].kind != Kind::kManaged || buffers_[i].words() < 1; });
    if (ids.empty()) return;
    Buffer& b = buffers_[rng_.pick(ids)];
    const size_t first = rng_.below(b.words());
    const size_t words = rng_.range(1, std::min<size_t>(b.words() - first, 4096));
    trace("host rewrites managed %d at word %zu, %zu words", b.id, first, words);
    hostWait({b.id});
    auto* w = reinterpret_cast<unsigned*>(b.dptr) + first;
    Hasher h;
    h.word(hostAccumulator_);
    h.bytes(w, words * 4);
    hostAccumulator_ = h.value();
    for (size_t i = 0; i < words; ++i) w[i] = w[i] * 2654435761u + static_cast<unsigned>(i);
  }

  void opFree() {
    auto ids = live(false);
    if (ids.empty()) return;
    // A table is freed only when it is not the last.
    int id = rng_.pick(ids);
    if (buffers_[id].kind == Kind::kTable) {
      size_t tables = 0;
      for (int i : ids) tables += buffers_[i].kind == Kind::kTable;
      if (tables <= 1) return;
    }
    release(id);
  }

  void opRealloc() {
    // Free and allocate the same kind again: the allocator may hand out the
    // same address, which a restore must not confuse with the old buffer.
    auto ids = live(false);
    if (ids.empty()) return;
    int id = rng_.pick(ids);
    const Kind kind = buffers_[id].kind;
    if (kind == Kind::kTable) return;
    release(id);
    allocate(kind);
  }

  void opMemset() {
    auto ids = live(true, true);
    if (ids.empty()) return;
    const Buffer& b = buffers_[rng_.pick(ids)];
    const uint64_t width = rng_.below(3);  // 8, 16, 32 bits
    const size_t unit = size_t{1} << width;
    size_t total = b.bytes / unit;
    size_t count = rng_.chance(30) ? total : rng_.range(1, total);
    size_t offset = rng_.below(total - count + 1) * unit;
    const unsigned value = static_cast<unsigned>(rng_.next());
    const bool async = rng_.chance(60);
    const int s = async ? pickStream() : kLegacy;
    trace("memset D%u of buffer %d at %zu, %zu units, %s on stream %d", static_cast<unsigned>(8 * unit), b.id,
          offset, count, async ? "async" : "sync", s);
    orderOn(s, {b.id});
    CUstream h = streams_[s].handle;
    const CUdeviceptr p = b.dptr + offset;
    if (width == 0) {
      if (async) CHECK(cuMemsetD8Async(p, static_cast<unsigned char>(value), count, h));
      else CHECK(cuMemsetD8(p, static_cast<unsigned char>(value), count));
    } else if (width == 1) {
      if (async) CHECK(cuMemsetD16Async(p, static_cast<unsigned short>(value), count, h));
      else CHECK(cuMemsetD16(p, static_cast<unsigned short>(value), count));
    } else {
      if (async) CHECK(cuMemsetD32Async(p, value, count, h));
      else CHECK(cuMemsetD32(p, value, count));
    }
  }

  // 2D memsets, on a pitched buffer (rows of its width) or any device buffer
  // seen as rows.
  void opMemset2D() {
    auto ids = live(true, true);
    if (ids.empty()) return;
    const Buffer& b = buffers_[rng_.pick(ids)];
    size_t pitch, width, height;
    if (b.kind == Kind::kPitched) {
      pitch = b.pitch;
      width = rng_.range(1, b.widthBytes / 4) * 4;
      height = rng_.range(1, b.height);
    } else {
      if (b.bytes < 64) return;
      pitch = rng_.range(4, std::min<size_t>(b.bytes / 4, 4096) / 4) * 16;
      if (pitch > b.bytes) return;
      width = rng_.range(1, pitch / 4) * 4;
      height = rng_.range(1, b.bytes / pitch);
    }
    const uint64_t widthBits = rng_.below(3);
    const size_t unit = size_t{1} << widthBits;
    const unsigned value = static_cast<unsigned>(rng_.next());
    const bool async = rng_.chance(50);
    const int s = async ? pickStream() : kLegacy;
    trace("memset2D D2D%u of buffer %d pitch %zu width %zu height %zu", static_cast<unsigned>(8 * unit), b.id, pitch,
          width, height);
    orderOn(s, {b.id});
    CUstream h = streams_[s].handle;
    if (widthBits == 0) {
      if (async) CHECK(cuMemsetD2D8Async(b.dptr, pitch, static_cast<unsigned char>(value), width, height, h));
      else CHECK(cuMemsetD2D8(b.dptr, pitch, static_cast<unsigned char>(value), width, height));
    } else if (widthBits == 1) {
      if (async) CHECK(cuMemsetD2D16Async(b.dptr, pitch, static_cast<unsigned short>(value), width / 2, height, h));
      else CHECK(cuMemsetD2D16(b.dptr, pitch, static_cast<unsigned short>(value), width / 2, height));
    } else {
      if (async) CHECK(cuMemsetD2D32Async(b.dptr, pitch, value, width / 4, height, h));
      else CHECK(cuMemsetD2D32(b.dptr, pitch, value, width / 4, height));
    }
  }

  void opHtoD() {
    auto ids = live(true, true);
    if (ids.empty()) return;
    const Buffer& b = buffers_[rng_.pick(ids)];
    auto [offset, words] = pickRange(b, b.words());
    if (b.kind == Kind::kPitched) offset = rng_.below(b.words() - words + 1);
    auto pinned = live(true, false);
    std::erase_if(pinned, [&](int i) { return buffers_[i].kind != Kind::kPinned || buffers_[i].words() < 1; });
    if (!pinned.empty() && rng_.chance(50)) {
      // From pinned memory, asynchronously: the host writes it first.
      Buffer& src = buffers_[rng_.pick(pinned)];
      words = std::min(words, src.words());
      const size_t from = rng_.below(src.words() - words + 1);
      hostWait({src.id});
      auto* w = static_cast<unsigned*>(src.host);
      const unsigned salt = static_cast<unsigned>(rng_.next());
      for (size_t i = 0; i < words; ++i) w[from + i] ^= salt + static_cast<unsigned>(i);
      const int s = pickStream();
      trace("htod async from pinned %d at %zu to buffer %d at %zu, %zu words, stream %d", src.id, from, b.id, offset,
            words, s);
      orderOn(s, {b.id, src.id});
      if (rng_.chance(50)) {
        CHECK(cuMemcpyHtoDAsync(b.dptr + offset * 4, w + from, words * 4, streams_[s].handle));
      } else {
        CHECK(cuMemcpyAsync(b.dptr + offset * 4, reinterpret_cast<CUdeviceptr>(w + from), words * 4,
                            streams_[s].handle));
      }
      return;
    }
    std::vector<unsigned> data(words);
    const unsigned salt = static_cast<unsigned>(rng_.next());
    for (size_t i = 0; i < words; ++i) data[i] = salt * static_cast<unsigned>(i + 1);
    const bool async = rng_.chance(30);
    const int s = async ? pickStream() : kLegacy;
    trace("htod %s from pageable memory to buffer %d at %zu, %zu words", async ? "async" : "sync", b.id, offset,
          words);
    orderOn(s, {b.id});
    if (async) {
      // From pageable memory the copy has been staged when the call returns.
      CHECK(cuMemcpyHtoDAsync(b.dptr + offset * 4, data.data(), words * 4, streams_[s].handle));
    } else {
      CHECK(cuMemcpyHtoD(b.dptr + offset * 4, data.data(), words * 4));
    }
  }

  void opDtoH() {
    auto ids = live(true, true);
    if (ids.empty()) return;
    const Buffer& b = buffers_[rng_.pick(ids)];
    auto [offset, words] = pickRange(b, b.words());
    if (b.kind == Kind::kPitched) offset = rng_.below(b.words() - words + 1);
    auto pinned = live(true, false);
    std::erase_if(pinned, [&](int i) { return buffers_[i].kind != Kind::kPinned; });
    if (!pinned.empty() && rng_.chance(60)) {
      Buffer& dst = buffers_[rng_.pick(pinned)];
      words = std::min(words, dst.words());
      const size_t to = rng_.below(dst.words() - words + 1);
      // cuMemcpyDtoHAsync on a stream, or the unified cuMemcpy (synchronous, legacy stream).
      const bool async = rng_.chance(50);
      const int s = async ? pickStream() : kLegacy;
      trace("dtoh %s from buffer %d at %zu to pinned %d at %zu, %zu words, stream %d", async ? "async" : "cuMemcpy",
            b.id, offset, dst.id, to, words, s);
      orderOn(s, {b.id, dst.id});
      auto* w = static_cast<unsigned*>(dst.host);
      if (async) {
        CHECK(cuMemcpyDtoHAsync(w + to, b.dptr + offset * 4, words * 4, streams_[s].handle));
      } else {
        CHECK(cuMemcpy(reinterpret_cast<CUdeviceptr>(w + to), b.dptr + offset * 4, words * 4));
      }
      return;
    }
    std::vector<unsigned> data(words);
    trace("dtoh sync from buffer %d at %zu, %zu words, into the host accumulator", b.id, offset, words);
    hostWait({b.id});
    orderOn(kLegacy, {b.id});
    CHECK(cuMemcpyDtoH(data.data(), b.dptr + offset * 4, words * 4));
    Hasher h;
    h.word(hostAccumulator_);
    h.bytes(data.data(), words * 4);
    hostAccumulator_ = h.value();
  }

  void opDtoD() {
    auto ids = live(true, true);
    if (ids.empty()) return;
    if (ids.size() < 2) return;
    const int a = rng_.pick(ids);
    int c = rng_.pick(ids);
    const Buffer& dst = buffers_[a];
    const Buffer& src = buffers_[c];
    size_t words = std::min(dst.words(), src.words());
    if (rng_.chance(60)) words = rng_.range(1, words);
    size_t to = rng_.below(dst.words() - words + 1);
    size_t from = rng_.below(src.words() - words + 1);
    if (a == c) {
      // Within one buffer: two ranges that do not overlap.
      if (dst.words() < 2) return;
      words = rng_.range(1, dst.words() / 2);
      from = rng_.below(dst.words() / 2 - words + 1);
      to = dst.words() / 2 + rng_.below(dst.words() - dst.words() / 2 - words + 1);
      if (rng_.chance(50)) std::swap(from, to);
    }
    const uint64_t how = rng_.below(4);
    const int s = how >= 2 ? pickStream() : kLegacy;
    trace("dtod %llu from buffer %d at %zu to buffer %d at %zu, %zu words, stream %d",
          static_cast<unsigned long long>(how), src.id, from, dst.id, to, words, s);
    orderOn(s, {a, c});
    const CUdeviceptr d = dst.dptr + to * 4, f = src.dptr + from * 4;
    switch (how) {
      case 0: CHECK(cuMemcpyDtoD(d, f, words * 4)); break;
      case 1: CHECK(cuMemcpy(d, f, words * 4)); break;
      case 2: CHECK(cuMemcpyDtoDAsync(d, f, words * 4, streams_[s].handle)); break;
      default: CHECK(cuMemcpyAsync(d, f, words * 4, streams_[s].handle)); break;
    }
  }

  // 2D copies between pitched buffers, and between a pitched buffer and host memory.
  void opCopy2D() {
    auto ids = live(true, true);
    if (ids.empty()) return;
    std::vector<int> pitched;
    for (int i : ids)
      if (buffers_[i].kind == Kind::kPitched) pitched.push_back(i);
    if (pitched.empty()) {
      allocate(Kind::kPitched);
      return;
    }
    const Buffer& dst = buffers_[rng_.pick(pitched)];
    CUDA_MEMCPY2D c{};
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dst.dptr;
    c.dstPitch = dst.pitch;
    const uint64_t from = rng_.below(3);
    std::vector<unsigned char> host;
    int srcId = -1;
    if (from == 0) {
      const Buffer& src = buffers_[rng_.pick(pitched)];
      if (src.id == dst.id) return;
      srcId = src.id;
      c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
      c.srcDevice = src.dptr;
      c.srcPitch = src.pitch;
      c.WidthInBytes = rng_.range(1, std::min(src.widthBytes, dst.widthBytes));
      c.Height = rng_.range(1, std::min(src.height, dst.height));
      c.srcXInBytes = rng_.below(src.widthBytes - c.WidthInBytes + 1);
      c.srcY = rng_.below(src.height - c.Height + 1);
    } else {
      c.WidthInBytes = rng_.range(1, dst.widthBytes);
      c.Height = rng_.range(1, dst.height);
      const size_t pitch = c.WidthInBytes + rng_.below(64);
      host.resize(pitch * c.Height);
      const unsigned char salt = static_cast<unsigned char>(rng_.next());
      for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(salt + i * 7);
      c.srcMemoryType = CU_MEMORYTYPE_HOST;
      c.srcHost = host.data();
      c.srcPitch = pitch;
    }
    c.dstXInBytes = rng_.below(dst.widthBytes - c.WidthInBytes + 1);
    c.dstY = rng_.below(dst.height - c.Height + 1);
    const bool async = from == 2;
    const int s = async ? pickStream() : kLegacy;
    trace("copy2d from %s to pitched %d: %zu x %zu", srcId >= 0 ? "pitched" : "host", dst.id, c.WidthInBytes,
          c.Height);
    orderOn(s, {dst.id, srcId});
    if (async)
      CHECK(cuMemcpy2DAsync(&c, streams_[s].handle));
    else if (rng_.chance(50))
      CHECK(cuMemcpy2D(&c));
    else
      CHECK(cuMemcpy2DUnaligned(&c));
  }

  void opKernel() {
    const ModuleInstance& m = pickModule();
    const int s = pickStream();
    auto data = live(true, false, true);
    if (data.empty()) return;
    const uint64_t which = rng_.below(6);
    unsigned k = static_cast<unsigned>(rng_.next());
    if (which == 0 || data.size() < 2) {
      const Buffer& b = buffers_[rng_.pick(data)];
      if (b.kind == Kind::kPitched && has(kPitch) && rng_.chance(60)) {
        CUdeviceptr p = b.dptr;
        size_t pitch = b.pitch;
        unsigned width = static_cast<unsigned>(rng_.range(1, b.widthBytes / 4));
        unsigned height = static_cast<unsigned>(rng_.range(1, b.height));
        orderOn(s, {b.id});
        launch(m, kPitchedKernel, blocksFor(width), std::min(height, 8u), 128, 0, s, {&p, &pitch, &width, &height,
                                                                                     &k},
               {8, 8, 4, 4, 4});
        return;
      }
      auto [offset, words] = pickRange(b, kMaxKernelWords);
      if (b.kind == Kind::kPitched) offset = rng_.below(b.words() - words + 1);
      CUdeviceptr p = b.dptr + offset * 4;
      unsigned n = static_cast<unsigned>(words);
      orderOn(s, {b.id});
      launch(m, kMix, blocksFor(words), 1, 256, 0, s, {&p, &n, &k}, {8, 4, 4});
      return;
    }
    int a = rng_.pick(data), c = rng_.pick(data);
    while (c == a) c = rng_.pick(data);
    const Buffer& dst = buffers_[a];
    const Buffer& src = buffers_[c];
    size_t words = std::min({dst.words(), src.words(), kMaxKernelWords});
    words = rng_.range(1, words);
    CUdeviceptr d = dst.dptr + rng_.below(dst.words() - words + 1) * 4;
    CUdeviceptr f = src.dptr + rng_.below(src.words() - words + 1) * 4;
    unsigned n = static_cast<unsigned>(words);
    orderOn(s, {a, c});
    if (which == 1 || which == 2) {
      launch(m, kCombine, blocksFor(words), 1, 256, 0, s, {&d, &f, &n, &k}, {8, 8, 4, 4});
    } else if (which == 3) {
      struct Pair {
        CUdeviceptr dst, src;
        unsigned n, k;
        unsigned long long salt;
      } pair{d, f, n, k, rng_.next()};
      launch(m, kCombineStruct, blocksFor(words), 1, 256, 0, s, {&pair}, {sizeof pair});
    } else if (which == 4) {
      // 64 bins at the start of dst.
      if (dst.words() < 64) return;
      CUdeviceptr bins = dst.dptr;
      launch(m, kHistogram, blocksFor(words), 1, 256, 0, s, {&f, &n, &bins}, {8, 4, 8});
    } else {
      // One sum per block into dst; the blocks are at most its words.
      const unsigned blocks = static_cast<unsigned>(std::min<size_t>(blocksFor(words), dst.words()));
      const unsigned threads = 64u << rng_.below(3);
      unsigned shared = threads * 4;
      if (has(kFuncAttrs) && m.dynamicShared > 0 && rng_.chance(50)) shared = static_cast<unsigned>(m.dynamicShared);
      launch(m, kReduceShared, blocks, 1, threads, shared, s, {&f, &n, &d}, {8, 4, 8}, shared <= 48 * 1024);
    }
  }

  // The pointer table: the gather kernel updates the buffers its entries name.
  std::vector<int> tables() const {
    std::vector<int> t;
    for (const auto& b : buffers_)
      if (b.alive && b.kind == Kind::kTable) t.push_back(b.id);
    return t;
  }

  void opTable() {
    auto t = tables();
    if (t.empty()) {
      allocate(Kind::kTable);
      return;
    }
    Buffer& table = buffers_[rng_.pick(t)];
    auto data = live(true, false, true);
    if (data.empty()) return;
    // Entries name distinct buffers: two entries on one buffer would race.
    const unsigned e = static_cast<unsigned>(rng_.below(table.entries));
    int target = rng_.chance(15) ? -1 : rng_.pick(data);
    for (unsigned i = 0; i < table.entries; ++i)
      if (i != e && table.entryTarget[i] == target) target = -1;
    struct {
      CUdeviceptr p;
      unsigned words, pad;
    } entry{0, 0, 0};
    if (target >= 0) {
      entry.p = buffers_[target].dptr;
      entry.words = static_cast<unsigned>(std::min(buffers_[target].words(), kMaxKernelWords));
      if (buffers_[target].kind == Kind::kPitched) entry.words = static_cast<unsigned>(buffers_[target].widthBytes / 4);
    }
    trace("table %d entry %u -> buffer %d", table.id, e, target);
    table.entryTarget[e] = target;
    if (rng_.chance(50)) {
      orderOn(kLegacy, {table.id});
      CHECK(cuMemcpyHtoD(table.dptr + e * kEntryBytes, &entry, kEntryBytes));
    } else {
      // Pageable memory: the copy is staged before the call returns.
      const int s = pickStream();
      orderOn(s, {table.id});
      CHECK(cuMemcpyHtoDAsync(table.dptr + e * kEntryBytes, &entry, kEntryBytes, streams_[s].handle));
    }
  }

  void opGather() {
    auto t = tables();
    if (t.empty()) return;
    const Buffer& table = buffers_[rng_.pick(t)];
    const ModuleInstance& m = pickModule();
    const int s = pickStream();
    std::vector<int> touched = {table.id};
    for (int id : table.entryTarget)
      if (id >= 0) touched.push_back(id);
    CUdeviceptr p = table.dptr;
    unsigned entries = table.entries;
    unsigned n = static_cast<unsigned>(rng_.range(1, kMaxKernelWords / 4));
    unsigned k = static_cast<unsigned>(rng_.next());
    orderOn(s, touched);
    launch(m, kGather, blocksFor(n), 1, 256, 0, s, {&p, &entries, &n, &k}, {8, 4, 4, 4});
  }

  // g_ptr: set by one kernel, dereferenced by another (later, maybe on another stream).
  void opPointerVariable() {
    ModuleInstance& m = modules_[pickModule().id];
    auto data = live(true, false, true);
    if (data.empty()) return;
    const int s = pickStream();
    if (m.ptrTarget < 0 || rng_.chance(40)) {
      const int target = rng_.pick(data);
      const Buffer& b = buffers_[target];
      CUdeviceptr p = b.dptr;
      unsigned words = static_cast<unsigned>(b.kind == Kind::kPitched ? b.widthBytes / 4 : b.words());
      std::vector<int> order = {target};
      if (m.ptrTarget >= 0) order.push_back(m.ptrTarget);
      orderOn(s, order);
      if (m.ptrStream >= 0 && m.ptrStream != s && streams_[m.ptrStream].alive) {
        StreamSlot& from = streams_[m.ptrStream];
        CHECK(cuEventRecord(from.sync, from.handle));
        CHECK(cuStreamWaitEvent(streams_[s].handle, from.sync, 0));
      }
      m.ptrStream = -1;
      launch(m, kSetPtr, 1, 1, 32, 0, s, {&p, &words}, {8, 4});
      trace("module %d g_ptr -> buffer %d", m.id, target);
      m.ptrTarget = target;
      // The launches of through_ptr below order after this one through the buffer.
      return;
    }
    unsigned n = static_cast<unsigned>(rng_.range(1, kMaxKernelWords));
    unsigned k = static_cast<unsigned>(rng_.next());
    orderOn(s, {m.ptrTarget});
    launch(m, kThroughPtr, blocksFor(n), 1, 256, 0, s, {&n, &k}, {4, 4});
  }

  void opGlobals() {
    ModuleInstance& m = modules_[pickModule().id];
    const uint64_t what = rng_.below(4);
    // Module globals are not buffers of ours: they are ordered by synchronizing.
    if (what == 0) {
      std::vector<unsigned> table(256);
      for (auto& w : table) w = static_cast<unsigned>(rng_.next());
      const size_t first = rng_.below(256);
      const size_t count = rng_.range(1, 256 - first);
      trace("module %d c_table[%zu..+%zu] from the host", m.id, first, count);
      CHECK(cuCtxSynchronize());
      for (auto& b : buffers_) b.lastStream = kIdle;
      CHECK(cuMemcpyHtoD(m.table + first * 4, table.data() + first, count * 4));
    } else if (what == 1) {
      const size_t first = rng_.below(1024);
      const size_t count = rng_.range(1, 1024 - first);
      trace("module %d g_array[%zu..+%zu] memset", m.id, first, count);
      CHECK(cuCtxSynchronize());
      for (auto& b : buffers_) b.lastStream = kIdle;
      CHECK(cuMemsetD32(m.array + first * 4, static_cast<unsigned>(rng_.next()), count));
    } else {
      unsigned k = static_cast<unsigned>(rng_.next());
      // globals_step touches only the module's globals: serialize on the legacy stream.
      CHECK(cuCtxSynchronize());
      for (auto& b : buffers_) b.lastStream = kIdle;
      launch(m, kGlobalsStep, 4, 1, 256, 0, kLegacy, {&k}, {4});
      if (what == 3) {
        // And a copy of a global into a buffer of ours (device to device).
        auto data = live(true, true);
        if (data.empty()) return;
        const Buffer& b = buffers_[rng_.pick(data)];
        const size_t words = std::min<size_t>(b.words(), 1024);
        orderOn(kLegacy, {b.id});
        CHECK(cuMemcpyDtoD(b.dptr, m.array, words * 4));
      }
    }
  }

  void opStreams() {
    std::vector<int> created;
    for (size_t i = 2; i < streams_.size(); ++i)
      if (streams_[i].alive && !ownedByThread(static_cast<int>(i))) created.push_back(static_cast<int>(i));
    if (created.size() < 4 && (created.empty() || rng_.chance(60))) {
      createStream();
    } else {
      destroyStream(rng_.pick(created));
    }
  }

  // Events beyond the ordering ones: one recorded after some work, waited
  // for by another stream, the host or both; queries only once complete.
  void opEvents() {
    const int a = pickStream();
    const int b = pickStream();
    CUevent e = nullptr;
    const unsigned flags = rng_.chance(50) ? CU_EVENT_DISABLE_TIMING : CU_EVENT_DEFAULT;
    CHECK(cuEventCreate(&e, flags | (rng_.chance(30) ? CU_EVENT_BLOCKING_SYNC : 0)));
    trace("event recorded on stream %d, waited on stream %d", a, b);
    if (rng_.chance(50)) {
      CHECK(cuEventRecord(e, streams_[a].handle));
    } else {
      CHECK(cuEventRecordWithFlags(e, streams_[a].handle, CU_EVENT_RECORD_DEFAULT));
    }
    CHECK(cuStreamWaitEvent(streams_[b].handle, e, 0));
    if (rng_.chance(50)) {
      CHECK(cuEventSynchronize(e));
      CUresult q = cuEventQuery(e);
      eventStatus_.word(static_cast<uint64_t>(q));
    }
    if (rng_.chance(40)) {
      CHECK(cuStreamSynchronize(streams_[b].handle));
      CUresult q = cuStreamQuery(streams_[b].handle);
      eventStatus_.word(static_cast<uint64_t>(q) + 1000);
      for (auto& buf : buffers_)
        if (buf.lastStream == b) buf.lastStream = kIdle;
    }
    // Everything on `a` before the event is now also before everything later on `b`.
    for (auto& buf : buffers_)
      if (buf.alive && buf.lastStream == a && a != b && rng_.chance(50)) buf.lastStream = b;
    if (rng_.chance(70)) {
      CHECK(cuEventDestroy(e));
    } else {
      spareEvents_.push_back(e);
    }
  }

  void opHostFn() {
    const int s = pickStream();
    const uintptr_t value = static_cast<uintptr_t>(rng_.range(1, 1u << 20));
    trace("host function on stream %d, value %llu", s, static_cast<unsigned long long>(value));
    if (rng_.chance(50)) {
      CHECK(cuLaunchHostFunc(streams_[s].handle, hostFunction, reinterpret_cast<void*>(value)));
    } else {
      CHECK(cuStreamAddCallback(streams_[s].handle, streamCallback, reinterpret_cast<void*>(value), 0));
    }
  }

  void opPools() {
    std::vector<int> alive;
    for (size_t i = 0; i < pools_.size(); ++i)
      if (pools_[i].alive) alive.push_back(static_cast<int>(i));
    const uint64_t what = rng_.below(4);
    if (what == 0 && alive.size() < 3) {
      createPool();
    } else if (what == 1 && !alive.empty()) {
      PoolSlot& p = pools_[rng_.pick(alive)];
      p.threshold = rng_.chance(50) ? 0 : rng_.range(1, 64) << 20;
      trace("pool threshold %llu", static_cast<unsigned long long>(p.threshold));
      CHECK(cuMemPoolSetAttribute(p.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &p.threshold));
    } else if (what == 2 && !alive.empty()) {
      const int i = rng_.pick(alive);
      trace("trim pool %d", i);
      CHECK(cuMemPoolTrimTo(pools_[i].pool, rng_.chance(50) ? 0 : size_t{8} << 20));
    } else if (!alive.empty()) {
      // Destroy a pool none of our buffers comes from, once its frees are done.
      const int i = rng_.pick(alive);
      for (const auto& b : buffers_)
        if (b.alive && b.kind == Kind::kPool && b.pool == i) return;
      trace("destroy pool %d", i);
      CHECK(cuCtxSynchronize());
      for (auto& b : buffers_) b.lastStream = kIdle;
      CHECK(cuMemPoolDestroy(pools_[i].pool));
      pools_[i].alive = false;
    }
  }

  // An executable graph of 1-3 captured kernels and sets over device
  // buffers, or a launch of one on any stream (ordered after the buffers'
  // last streams, as any launch is).
  struct GraphExec {
    CUgraphExec exec = nullptr;
    CUgraph graph = nullptr;  // kept: its nodes name the executable graph's
    std::vector<int> buffers;
    int module = 0;
    struct Item {
      CUgraphNode node = nullptr;
      bool kernel = false;
      CUdeviceptr p = 0;
      unsigned n = 0;
    };
    std::vector<Item> items;
  };
  // A change of `g` between launches: a kernel node's new seed in the
  // executable graph alone, or in its graph and then the executable graph
  // by an update; or a node disabled or enabled.
  void changeGraph(GraphExec& g) {
    const GraphExec::Item& item = g.items[rng_.below(g.items.size())];
    const int how = static_cast<int>(rng_.below(3));
    if (how == 2 || !item.kernel) {
      const unsigned enabled = rng_.chance(50) ? 1u : 0u;
      trace("graph node %s", enabled != 0 ? "enabled" : "disabled");
      CHECK(cuGraphNodeSetEnabled(g.exec, item.node, enabled));
      return;
    }
    const ModuleInstance& m = modules_[static_cast<size_t>(g.module)];
    CUdeviceptr p = item.p;
    unsigned n = item.n;
    unsigned k = static_cast<unsigned>(rng_.next());
    void* params[] = {&p, &n, &k};
    CUDA_KERNEL_NODE_PARAMS kp{};
    kp.func = m.fn[kMix];
    kp.gridDimX = blocksFor(n);
    kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = 256;
    kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = params;
    if (how == 0) {
      trace("graph kernel node set in the executable graph");
      CHECK(cuGraphExecKernelNodeSetParams(g.exec, item.node, &kp));
      return;
    }
    trace("graph kernel node set in the graph, executable graph updated");
    CHECK(cuGraphKernelNodeSetParams(item.node, &kp));
    CUgraphExecUpdateResultInfo info{};
    CHECK(cuGraphExecUpdate(g.exec, g.graph, &info));
  }
  void opGraphs() {
    if (!graphs_.empty() && (graphs_.size() >= 3 || rng_.chance(70))) {
      GraphExec& g = graphs_[rng_.below(graphs_.size())];
      if (rng_.chance(40)) changeGraph(g);
      const int s = pickStream();
      trace("graph launch on stream %d", s);
      orderOn(s, g.buffers);
      CHECK(cuGraphLaunch(g.exec, streams_[s].handle));
      return;
    }
    std::vector<int> data;
    for (int id : live(true, true, true)) {
      if (buffers_[id].kind != Kind::kManaged) data.push_back(id);
    }
    if (data.empty()) return;
    const ModuleInstance& m = pickModule();
    if (captureStream_ == nullptr) CHECK(cuStreamCreate(&captureStream_, CU_STREAM_NON_BLOCKING));
    GraphExec g;
    g.module = m.id;
    const unsigned items = static_cast<unsigned>(rng_.range(1, 3));
    trace("graph of %u items captured with module %d", items, m.id);
    // Thread-local: the job's other threads may allocate meanwhile.
    CHECK(cuStreamBeginCapture(captureStream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (unsigned i = 0; i < items; ++i) {
      const Buffer& b = buffers_[rng_.pick(data)];
      auto [offset, words] = pickRange(b, kMaxKernelWords);
      if (b.kind == Kind::kPitched) offset = rng_.below(b.words() - words + 1);
      CUdeviceptr p = b.dptr + offset * 4;
      unsigned n = static_cast<unsigned>(words);
      g.buffers.push_back(b.id);
      g.items.push_back({nullptr, false, p, n});
      if (rng_.chance(70)) {
        g.items.back().kernel = true;
        unsigned k = static_cast<unsigned>(rng_.next());
        void* params[] = {&p, &n, &k};
        CHECK(cuLaunchKernel(m.fn[kMix], blocksFor(words), 1, 1, 256, 1, 1, 0, captureStream_,
                             params, nullptr));
      } else {
        CHECK(cuMemsetD32Async(p, static_cast<unsigned>(rng_.next()), words, captureStream_));
      }
    }
    CHECK(cuStreamEndCapture(captureStream_, &g.graph));
    // One node per captured call, in the order they were made.
    size_t count = g.items.size();
    std::vector<CUgraphNode> nodes(count);
    CHECK(cuGraphGetNodes(g.graph, nodes.data(), &count));
    if (count != g.items.size()) {
      std::fprintf(stderr, "difftest_job: a capture of %zu calls made %zu nodes\n", g.items.size(),
                   count);
      std::exit(1);
    }
    for (size_t i = 0; i < count; ++i) g.items[i].node = nodes[i];
    CHECK(cuGraphInstantiateWithFlags(&g.exec, g.graph, 0));
    graphs_.push_back(std::move(g));
  }
  // Destroys the executable graphs `gone` says name what is going away.
  template <typename Gone>
  void dropGraphs(Gone gone) {
    for (size_t i = 0; i < graphs_.size();) {
      if (gone(graphs_[i])) {
        CHECK(cuGraphExecDestroy(graphs_[i].exec));
        CHECK(cuGraphDestroy(graphs_[i].graph));
        graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  void opModules() {
    int alive = 0;
    for (const auto& m : modules_) alive += m.alive;
    if (alive < kMaxModules && (alive == 1 || rng_.chance(50))) {
      loadModule();
      return;
    }
    std::vector<int> ids;
    for (const auto& m : modules_)
      if (m.alive) ids.push_back(m.id);
    unloadModule(modules_[rng_.pick(ids)]);
  }

  void opSync() {
    const uint64_t how = rng_.below(3);
    trace("sync %llu", static_cast<unsigned long long>(how));
    if (how == 0) {
      CHECK(cuCtxSynchronize());
      for (auto& b : buffers_) b.lastStream = kIdle;
    } else {
      const int s = pickStream();
      CHECK(cuStreamSynchronize(streams_[s].handle));
      for (auto& b : buffers_)
        if (b.lastStream == s) b.lastStream = kIdle;
    }
  }

  // A burst of worker threads, each with a stream and buffers of its own; the
  // main thread plans their operations and joins them.
  void opThreads() {
    auto data = live(true, true);
    if (data.empty()) return;
    std::erase_if(data, [&](int id) { return buffers_[id].kind == Kind::kPitched; });
    const int count = static_cast<int>(rng_.range(2, kMaxThreads));
    if (static_cast<int>(data.size()) < count) return;
    CHECK(cuCtxSynchronize());
    for (auto& b : buffers_) b.lastStream = kIdle;
    // Shuffle, then deal the buffers out.
    for (size_t i = data.size(); i > 1; --i) std::swap(data[i - 1], data[rng_.below(i)]);
    while (static_cast<int>(threads_.size()) < count) {
      ThreadSlot t;
      t.perThread = rng_.chance(30);
      if (!t.perThread) t.stream = createStream();
      threads_.push_back(t);
    }
    std::vector<std::vector<ThreadOp>> plans(count);
    std::vector<std::vector<int>> owned(count);
    size_t next = 0;
    for (int t = 0; t < count; ++t) {
      const size_t mine = std::max<size_t>(1, std::min<size_t>(rng_.range(1, 3), (data.size() - next) / (count - t)));
      for (size_t i = 0; i < mine; ++i) owned[t].push_back(data[next++]);
      const int ops = static_cast<int>(rng_.range(2, 6));
      for (int i = 0; i < ops; ++i) {
        ThreadOp op;
        op.type = static_cast<ThreadOp::Type>(rng_.below(7));
        op.a = rng_.pick(owned[t]);
        op.b = rng_.pick(owned[t]);
        op.module = pickModule().id;
        op.value = static_cast<unsigned>(rng_.next());
        const Buffer& a = buffers_[op.a];
        op.words = rng_.range(1, std::min(a.words(), kMaxKernelWords));
        op.offset = rng_.below(a.words() - op.words + 1);
        if (op.type == ThreadOp::kCombine) {
          // Whole buffers from their start: a into b's words.
          if (op.a == op.b) {
            op.type = ThreadOp::kMix;
          } else {
            op.offset = 0;
            op.words = std::min({op.words, buffers_[op.a].words(), buffers_[op.b].words()});
          }
        }
        if (op.type == ThreadOp::kHostFn && !has(kHostFns)) op.type = ThreadOp::kMemset;
        op.tempBytes = rng_.range(1, 65536) * 4;
        plans[t].push_back(op);
      }
    }
    for (int t = 0; t < count; ++t)
      for (int id : owned[t]) buffers_[id].owner = t;
    trace("burst of %d threads", count);
    std::vector<std::thread> workers;
    for (int t = 0; t < count; ++t) workers.emplace_back([this, t, &plans] { worker(t, plans[t]); });
    for (auto& w : workers) w.join();
    for (int t = 0; t < count; ++t)
      for (int id : owned[t]) {
        buffers_[id].owner = -1;
        buffers_[id].lastStream = kIdle;
      }
  }

  void worker(int t, const std::vector<ThreadOp>& plan) {
    CHECK(cuCtxSetCurrent(ctx_));
    ThreadSlot& slot = threads_[t];
    CUstream stream = slot.perThread ? CU_STREAM_PER_THREAD : streams_[slot.stream].handle;
    for (const ThreadOp& op : plan) {
      const Buffer& a = buffers_[op.a];
      const Buffer& b = buffers_[op.b];
      const ModuleInstance& m = modules_[op.module];
      switch (op.type) {
        case ThreadOp::kMemset:
          CHECK(cuMemsetD32Async(a.dptr + op.offset * 4, op.value, op.words, stream));
          break;
        case ThreadOp::kMix: {
          CUdeviceptr p = a.dptr + op.offset * 4;
          unsigned n = static_cast<unsigned>(op.words), k = op.value;
          void* params[] = {&p, &n, &k};
          CHECK(cuLaunchKernel(m.fn[kMix], blocksFor(op.words), 1, 1, 256, 1, 1, 0, stream, params, nullptr));
          break;
        }
        case ThreadOp::kCombine: {
          CUdeviceptr d = a.dptr, f = b.dptr;
          unsigned n = static_cast<unsigned>(op.words), k = op.value;
          void* params[] = {&d, &f, &n, &k};
          CHECK(cuLaunchKernel(m.fn[kCombine], blocksFor(op.words), 1, 1, 256, 1, 1, 0, stream, params, nullptr));
          break;
        }
        case ThreadOp::kUpload: {
          std::vector<unsigned> data(op.words);
          for (size_t i = 0; i < op.words; ++i) data[i] = op.value ^ static_cast<unsigned>(i * 31);
          CHECK(cuMemcpyHtoDAsync(a.dptr + op.offset * 4, data.data(), op.words * 4, stream));
          break;
        }
        case ThreadOp::kDownload: {
          std::vector<unsigned> data(op.words);
          CHECK(cuMemcpyDtoHAsync(data.data(), a.dptr + op.offset * 4, op.words * 4, stream));
          CHECK(cuStreamSynchronize(stream));
          Hasher h;
          h.word(slot.accumulator);
          h.bytes(data.data(), op.words * 4);
          slot.accumulator = h.value();
          break;
        }
        case ThreadOp::kTemp: {
          // A temporary buffer of the thread: allocated, used and freed on its stream.
          CUdeviceptr tmp = 0;
          CHECK(cuMemAllocAsync(&tmp, op.tempBytes, stream));
          CHECK(cuMemsetD32Async(tmp, op.value, op.tempBytes / 4, stream));
          const size_t words = std::min(op.tempBytes / 4, a.words() - op.offset);
          CHECK(cuMemcpyDtoDAsync(a.dptr + op.offset * 4, tmp, words * 4, stream));
          CHECK(cuMemFreeAsync(tmp, stream));
          break;
        }
        case ThreadOp::kHostFn:
          CHECK(cuLaunchHostFunc(stream, hostFunction, reinterpret_cast<void*>(static_cast<uintptr_t>(op.value & 0xffff))));
          break;
      }
    }
    CHECK(cuStreamSynchronize(stream));
  }

  // ---- state PhOS restores beyond memory: event times, limits, attributes ----

  // cuEventElapsedTime between two events recorded in this operation: only
  // whether it succeeded goes into the checksum.
  void opElapsed() {
    const int s = pickStream();
    CUevent a = nullptr, b = nullptr;
    CHECK(cuEventCreate(&a, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&b, CU_EVENT_DEFAULT));
    CHECK(cuEventRecord(a, streams_[s].handle));
    opMemset();
    CHECK(cuEventRecord(b, streams_[s].handle));
    CHECK(cuEventSynchronize(b));
    float ms = 0;
    CUresult r = cuEventElapsedTime(&ms, a, b);
    trace("elapsed time on stream %d: %d", s, static_cast<int>(r));
    eventStatus_.word(static_cast<uint64_t>(r) + 2000);
    if (rng_.chance(50)) {
      // Kept: elapsed time between events of an earlier operation, later.
      timedEvents_.push_back({a, b});
    } else {
      CHECK(cuEventDestroy(a));
      CHECK(cuEventDestroy(b));
    }
    if (!timedEvents_.empty() && rng_.chance(50)) {
      auto [c, d] = timedEvents_[rng_.below(timedEvents_.size())];
      eventStatus_.word(static_cast<uint64_t>(cuEventElapsedTime(&ms, c, d)) + 3000);
    }
  }

  void opCtxLimits() {
    const uint64_t what = rng_.below(3);
    if (what == 0) {
      static constexpr CUlimit kLimits[] = {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE};
      const CUlimit limit = kLimits[rng_.below(3)];
      const size_t value = limit == CU_LIMIT_STACK_SIZE ? rng_.range(1, 16) * 1024 : rng_.range(1, 32) << 20;
      trace("ctx limit %d = %zu", static_cast<int>(limit), value);
      CHECK(cuCtxSetLimit(limit, value));
    } else if (what == 1) {
      const CUfunc_cache config = static_cast<CUfunc_cache>(rng_.below(4));
      trace("ctx cache config %d", static_cast<int>(config));
      CHECK(cuCtxSetCacheConfig(config));
    } else {
      ModuleInstance& m = modules_[pickModule().id];
      const CUfunc_cache config = static_cast<CUfunc_cache>(rng_.below(4));
      CHECK(cuFuncSetCacheConfig(m.fn[rng_.below(kKernelCount)], config));
    }
  }

  void opFuncAttrs() {
    ModuleInstance& m = modules_[pickModule().id];
    if (rng_.chance(60)) {
      m.dynamicShared = static_cast<int>(rng_.range(49, 96)) * 1024;
      trace("module %d reduce_shared max dynamic shared %d", m.id, m.dynamicShared);
      CHECK(cuFuncSetAttribute(m.fn[kReduceShared], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, m.dynamicShared));
    } else {
      const int carveout = static_cast<int>(rng_.range(0, 100));
      CHECK(cuFuncSetAttribute(m.fn[rng_.below(kKernelCount)], CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                               carveout));
    }
  }

  // ---- the checksum ----

  // A device pointer read back from memory, as what it points at.
  void pointer(Hasher& h, uint64_t p) {
    if (p == 0) {
      h.word(0);
      return;
    }
    for (const auto& b : buffers_) {
      if (!b.alive || b.dptr == 0) continue;
      if (p >= b.dptr && p < b.dptr + b.bytes) {
        h.word(static_cast<uint64_t>(b.id + 1));
        h.word(p - b.dptr);
        return;
      }
    }
    h.word(0xdead0000deadull);  // a pointer to nothing live: a divergence by itself
  }

  uint64_t checksum(bool perStep) {
    Hasher all;
    std::string explain;
    auto item = [&](const std::string& name, const Hasher& h) {
      all.word(h.value());
      if (o_.explain && perStep) {
        char line[160];
        std::snprintf(line, sizeof line, "difftest: step %d %s %016llx\n", gStep, name.c_str(),
                      static_cast<unsigned long long>(h.value()));
        explain += line;
      }
    };
    std::vector<unsigned char> scratch;
    for (const auto& b : buffers_) {
      if (!b.alive) continue;
      Hasher h;
      h.word(static_cast<uint64_t>(b.kind));
      h.word(b.bytes);
      h.word(b.pitch);
      if (b.kind == Kind::kPinned) {
        h.word(b.hostFlags);
        h.bytes(b.host, b.bytes);
      } else {
        scratch.resize(b.bytes);
        CHECK(cuMemcpyDtoH(scratch.data(), b.dptr, b.bytes));
        if (b.kind == Kind::kTable) {
          for (unsigned e = 0; e < b.entries; ++e) {
            uint64_t p;
            unsigned words;
            std::memcpy(&p, scratch.data() + e * kEntryBytes, 8);
            std::memcpy(&words, scratch.data() + e * kEntryBytes + 8, 4);
            pointer(h, p);
            h.word(words);
          }
        } else {
          h.bytes(scratch.data(), b.bytes);
        }
        // What the driver says of the allocation (not its address).
        CUdeviceptr base = 0;
        size_t size = 0;
        CHECK(cuMemGetAddressRange(&base, &size, b.dptr));
        h.word(base == b.dptr);
        h.word(size);
      }
      item(std::string("buffer#") + std::to_string(b.id) + "(" + kindName(b.kind) + "," + std::to_string(b.bytes) + ")",
           h);
    }
    for (const auto& m : modules_) {
      if (!m.alive) continue;
      Hasher h;
      unsigned counter = 0, ptrWords = 0;
      uint64_t ptr = 0;
      std::vector<unsigned> array(1024), table(256);
      CHECK(cuMemcpyDtoH(&counter, m.counter, 4));
      CHECK(cuMemcpyDtoH(array.data(), m.array, 4096));
      CHECK(cuMemcpyDtoH(table.data(), m.table, 1024));
      CHECK(cuMemcpyDtoH(&ptr, m.ptr, 8));
      CHECK(cuMemcpyDtoH(&ptrWords, m.ptrWords, 4));
      h.word(counter);
      h.bytes(array.data(), 4096);
      h.bytes(table.data(), 1024);
      pointer(h, ptr);
      h.word(ptrWords);
      item("module#" + std::to_string(m.id) + "(" + kImageKinds[m.imageKind] + "," + kLoadApis[m.api] + ")", h);
    }
    for (size_t i = 0; i < arrays_.size(); ++i) {
      const ArraySlot& a = arrays_[i];
      if (!a.alive) continue;
      Hasher h;
      h.word(a.w);
      h.word(a.h);
      scratch.resize(a.bytes());
      CHECK(cuMemcpyAtoH(scratch.data(), a.array, 0, a.bytes()));
      h.bytes(scratch.data(), a.bytes());
      CUDA_RESOURCE_DESC res{};
      CHECK(cuTexObjectGetResourceDesc(&res, a.texture));
      h.word(res.res.array.hArray == a.array);
      item("array#" + std::to_string(i) + "(" + std::to_string(a.w) + "x" + std::to_string(a.h) +
               ")",
           h);
    }
    {
      Hasher h;
      for (size_t i = 2; i < streams_.size(); ++i) {
        if (!streams_[i].alive) continue;
        unsigned flags = 0;
        int priority = 0;
        CHECK(cuStreamGetFlags(streams_[i].handle, &flags));
        CHECK(cuStreamGetPriority(streams_[i].handle, &priority));
        h.word(i);
        h.word(flags);
        h.word(static_cast<uint64_t>(priority));
        h.word(static_cast<uint64_t>(cuStreamQuery(streams_[i].handle)));
      }
      item("streams", h);
    }
    {
      Hasher h;
      for (size_t i = 0; i < pools_.size(); ++i) {
        if (!pools_[i].alive) continue;
        uint64_t threshold = 0;
        CHECK(cuMemPoolGetAttribute(pools_[i].pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
        h.word(i);
        h.word(threshold);
      }
      item("pools", h);
    }
    {
      Hasher h;
      h.word(hostAccumulator_);
      for (const auto& t : threads_) h.word(t.accumulator);
      h.word(gHostSum.load());
      h.word(gHostCalls.load());
      h.word(eventStatus_.value());
      item("host", h);
    }
    if (has(kCtxLimits)) {
      Hasher h;
      for (CUlimit l : {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE}) {
        size_t v = 0;
        CHECK(cuCtxGetLimit(&v, l));
        h.word(v);
      }
      CUfunc_cache config;
      CHECK(cuCtxGetCacheConfig(&config));
      h.word(static_cast<uint64_t>(config));
      item("ctx-limits", h);
    }
    if (has(kFuncAttrs)) {
      Hasher h;
      for (const auto& m : modules_) {
        if (!m.alive) continue;
        for (int k = 0; k < kKernelCount; ++k) {
          int dyn = 0, carveout = 0;
          CHECK(cuFuncGetAttribute(&dyn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, m.fn[k]));
          CHECK(cuFuncGetAttribute(&carveout, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, m.fn[k]));
          h.word(static_cast<uint64_t>(dyn));
          h.word(static_cast<uint64_t>(carveout));
          if (o_.explain && perStep) {
            // Each function's values, as the item's "hash": which one differs.
            char line[160];
            std::snprintf(line, sizeof line, "difftest: step %d func-attrs:module#%d:%s %08x%08x\n", gStep, m.id,
                          kKernelNames[k], static_cast<unsigned>(dyn), static_cast<unsigned>(carveout));
            explain += line;
          }
        }
      }
      item("func-attrs", h);
    }
    if (!explain.empty()) std::fputs(explain.c_str(), stderr);
    return all.value();
  }

  int finish(const std::vector<uint64_t>& stepSums) {
    CHECK(cuCtxSynchronize());
    Hasher h;
    for (uint64_t s : stepSums) h.word(s);
    h.word(checksum(false));
    size_t bytes = liveBytes(), count = liveCount();
    int modules = 0, streams = 0;
    for (const auto& m : modules_) modules += m.alive;
    for (const auto& s : streams_) streams += s.alive && s.created;
    // Everything is released, in a fixed order, and every release must succeed.
    for (auto& b : buffers_) {
      if (!b.alive) continue;
      if (b.kind == Kind::kPinned) {
        CHECK(cuMemFreeHost(b.host));
      } else if (b.kind == Kind::kVmm) {
        CHECK(cuMemUnmap(b.dptr, b.vmmBytes));
        if (b.vmmHandle != 0) CHECK(cuMemRelease(b.vmmHandle));
        CHECK(cuMemAddressFree(b.dptr, b.vmmBytes));
      } else {
        CHECK(cuMemFree(b.dptr));
      }
      b.alive = false;
    }
    for (auto& m : modules_)
      if (m.alive) {
        if (m.library != nullptr) CHECK(cuLibraryUnload(m.library));
        else CHECK(cuModuleUnload(m.module));
      }
    for (auto& s : streams_)
      if (s.alive && s.created) CHECK(cuStreamDestroy(s.handle));
    for (auto& p : pools_)
      if (p.alive) CHECK(cuMemPoolDestroy(p.pool));
    CHECK(cuCtxSynchronize());
    std::printf("final %016llx buffers %zu bytes %zu modules %d streams %d host-calls %llu\n",
                static_cast<unsigned long long>(h.value()), count, bytes, modules, streams,
                static_cast<unsigned long long>(gHostCalls.load()));
    std::fflush(stdout);
    CHECK(cuDevicePrimaryCtxRelease(device_));
    return 0;
  }

  const Options& o_;
  Rng rng_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  int leastPriority_ = 0, greatestPriority_ = 0;
  std::vector<char> images_[3];
  std::vector<Buffer> buffers_;
  std::vector<StreamSlot> streams_;
  std::vector<ModuleInstance> modules_;
  std::vector<GraphExec> graphs_;     // executable graphs (feature graphs)
  CUstream captureStream_ = nullptr;  // where they are captured (never launched on)
  std::vector<PoolSlot> pools_;
  std::vector<ArraySlot> arrays_;  // feature arrays
  std::vector<ThreadSlot> threads_;
  std::vector<CUevent> spareEvents_;
  std::vector<std::pair<CUevent, CUevent>> timedEvents_;
  uint64_t hostAccumulator_ = 0;
  Hasher eventStatus_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;
  Job job(o);
  return job.run();
}
