// SPDX-License-Identifier: Apache-2.0
// checkpoint_client: a deterministic Driver API job with the states a checkpoint
// finds hard to land in, run by tests/python/test_checkpoint_phos.py directly on
// vgpu and under phos run, checkpointed, killed and restored.
//
//   checkpoint_client [--iterations N] [--sleep-ms MS] [--threads N] [--inflight]
//                     [--pinned] [--events] [--kernels K] [--rounds R] [--words W]
//                     [--fill-device --scratch-kib K] [--ptx FILE] [--jit]
//                     [--stream-attributes] [--default-stream-attribute]
//
// Each of --threads workers has its own stream, device state and host buffers;
// every iteration it copies an input in (cuMemcpyHtoDAsync), mixes it into its
// state with a kernel and copies the state back (cuMemcpyDtoHAsync +
// cuStreamSynchronize). The modes add:
//   --inflight  K launches of a long-running kernel queued asynchronously, then
//               one cuCtxSynchronize (one worker) or cuStreamSynchronize: a
//               checkpoint taken just after an iteration's line lands while
//               kernels are in flight and the job is blocked in that call;
//   --pinned    the host buffers are cuMemHostAlloc'd (else pageable memory);
//   --events    a second stream waits for the first through cuEventRecord +
//               cuStreamWaitEvent, folds the state, and the host waits with
//               cuEventSynchronize; a stream and an event made, used once
//               and destroyed first.
//   --fill-device  after the workers' buffers, allocates the device full
//               (ballast) but for K KiB, which every iteration allocates
//               (cuMemAlloc), fills, reads back into its checksum and frees:
//               a checkpoint running then must not take the memory the job
//               needs, nor fail its launches for want of memory of its own.
//   --jit       the kernels' module loaded a second time with
//               cuModuleLoadDataEx and CU_JIT_MAX_REGISTERS 16, and a linker
//               state made from the kernels' PTX at start and completed at the
//               end (a checkpoint finds it open): the final line adds the
//               capped module's register count and the linked image's size,
//               once the image loaded and its kernel was found.
//   --stream-attributes  each worker's stream given an access policy window
//               over its state, the yield synchronization policy, the remote
//               memory synchronization domain and a priority through
//               cuStreamSetAttribute (with --events, copied to the side
//               stream with cuStreamCopyAttributes); the final line adds
//               worker 0's streams' attributes as cuStreamGetAttribute reads
//               them at the end.
//   --default-stream-attribute  the NULL stream given the yield
//               synchronization policy, and the per-thread default stream
//               a created stream's attributes (cuStreamCopyAttributes): a
//               checkpoint under PhOS refuses both, naming them.
// Module globals: `salt` and the __constant__ `spread` are set through
// cuModuleGetGlobal once at start and read by the kernels; `launches` is
// incremented by every kernel and printed at the end.
//
// Output: "iteration I checksum C" per iteration (C chains every worker's
// state and folds of this iteration onto the previous C), printed once the next
// iteration's work is queued, then "final checksum C launches L salt S" (L: the
// kernels that ran, as counted by the kernels themselves). The same bits
// whatever the thread interleaving, on vgpu directly and under PhOS.
#include <cuda.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#ifndef PHOS_CHECKPOINT_KERNELS_PTX
#error "PHOS_CHECKPOINT_KERNELS_PTX must name the PTX of checkpoint_client_kernels.cu"
#endif

namespace {

[[noreturn]] void fail(const char* what, CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = "unknown CUresult";
  std::fprintf(stderr, "checkpoint_client: %s failed: %s (%d)\n", what, name, static_cast<int>(r));
  std::fflush(stderr);
  // Other workers may be inside the driver: leave without running destructors.
  std::_Exit(1);
}

#define CHECK(call)                          \
  do {                                       \
    CUresult r_ = (call);                    \
    if (r_ != CUDA_SUCCESS) fail(#call, r_); \
  } while (0)

constexpr unsigned kSalt = 0x5eed1234u;
constexpr unsigned kSpread[8] = {0x9e3779b9u, 0x7f4a7c15u, 0xf39cc060u, 0x5cedc834u,
                                 0x1b873593u, 0xcc9e2d51u, 0xe6546b64u, 0x85ebca6bu};

struct Options {
  int iterations = 10;
  int sleepMs = 0;
  int threads = 1;
  bool inflight = false;
  bool pinned = false;
  bool events = false;
  int kernels = 16;   // --inflight launches per iteration
  int rounds = 12;    // hash-chain steps per word of one --inflight launch
  int words = 16384;  // 32-bit words of each worker's state
  bool fillDevice = false;
  int scratchKib = 2048;  // --fill-device: what is left free, and used every iteration
  std::string ptx = PHOS_CHECKPOINT_KERNELS_PTX;  // the kernels' module (scripts/gpu-bundle carries a copy)
  bool jit = false;
  bool streamAttributes = false;
  bool defaultStreamAttribute = false;
};

// --jit: a module loaded with JIT options and a link state left open.
struct Jit {
  CUmodule capped = nullptr;
  CUlinkState link = nullptr;
  std::string ptx;
  CUjit_option options[3] = {CU_JIT_WALL_TIME, CU_JIT_ERROR_LOG_BUFFER,
                             CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[3] = {};
  char errorLog[512] = {};
};

// FNV-1a, 64 bits: a checksum with no dependency, folded in a fixed order.
uint64_t fnv1a(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

// The input of worker `w` at iteration `it`, word `j`.
unsigned inputWord(int it, int w, int j) {
  uint64_t x = (static_cast<uint64_t>(it) << 40) ^ (static_cast<uint64_t>(w) << 24) ^
               static_cast<uint64_t>(j);
  x = x * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<unsigned>(x >> 29);
}

unsigned blocks(int n, unsigned per) {
  return (static_cast<unsigned>(n) + per - 1) / per;
}

struct Kernels {
  CUfunction mix = nullptr, churn = nullptr, fold = nullptr;
};

// Host memory of one worker: pinned (cuMemHostAlloc) or pageable.
class HostBuffer {
 public:
  HostBuffer(size_t words, bool pinned) : pinned_(pinned) {
    if (pinned) {
      void* p = nullptr;
      CHECK(cuMemHostAlloc(&p, words * sizeof(unsigned), 0));
      data_ = static_cast<unsigned*>(p);
    } else {
      pageable_.resize(words);
      data_ = pageable_.data();
    }
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (pinned_) cuMemFreeHost(data_);
  }
  unsigned* data() { return data_; }

 private:
  bool pinned_;
  unsigned* data_ = nullptr;
  std::vector<unsigned> pageable_;
};

class Worker {
 public:
  Worker(int index, const Options& o, const Kernels& k)
      : index_(index),
        o_(o),
        k_(k),
        in_(o.words, o.pinned),
        out_(o.words, o.pinned),
        folds_(o.words / 2, o.pinned) {
    const size_t bytes = static_cast<size_t>(o.words) * sizeof(unsigned);
    CHECK(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&state_, bytes));
    CHECK(cuMemAlloc(&input_, bytes));
    CHECK(cuMemsetD32(state_, 0x01010101u * static_cast<unsigned>(index + 1), o.words));
    std::memset(out_.data(), 0, bytes);
    if (o.events) {
      CHECK(cuStreamCreate(&side_, CU_STREAM_NON_BLOCKING));
      CHECK(cuEventCreate(&produced_, CU_EVENT_DISABLE_TIMING));
      CHECK(cuEventCreate(&folded_, CU_EVENT_DEFAULT));
      CHECK(cuMemAlloc(&foldsDevice_, bytes / 2));
      // A stream and a timed event used once and destroyed: a checkpoint
      // must neither save nor touch them (NVIDIA's driver crashes on a
      // destroyed event).
      CUstream once = nullptr;
      CUevent onceDone = nullptr;
      CHECK(cuStreamCreate(&once, CU_STREAM_NON_BLOCKING));
      CHECK(cuEventCreate(&onceDone, CU_EVENT_DEFAULT));
      CHECK(cuEventRecord(onceDone, once));
      CHECK(cuEventSynchronize(onceDone));
      CHECK(cuEventDestroy(onceDone));
      CHECK(cuStreamDestroy(once));
    }
    if (o.streamAttributes) {
      CUstreamAttrValue v{};
      v.accessPolicyWindow = {reinterpret_cast<void*>(state_), bytes,
                              0.5f + 0.125f * static_cast<float>(index % 4),
                              CU_ACCESS_PROPERTY_PERSISTING, CU_ACCESS_PROPERTY_STREAMING};
      CHECK(cuStreamSetAttribute(stream_, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v));
      v = {};
      v.syncPolicy = CU_SYNC_POLICY_YIELD;
      CHECK(cuStreamSetAttribute(stream_, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v));
      v = {};
      v.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
      CHECK(cuStreamSetAttribute(stream_, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &v));
      v = {};
      v.priority = -1 - index % 5;
      CHECK(cuStreamSetAttribute(stream_, CU_LAUNCH_ATTRIBUTE_PRIORITY, &v));
      if (o.events) CHECK(cuStreamCopyAttributes(side_, stream_));
    }
  }

  // --stream-attributes: the attributes of this worker's streams as the
  // driver reports them now (the window's base relative to the state's).
  std::string attributes() const {
    std::string report;
    for (CUstream s : {stream_, side_}) {
      if (s == nullptr) continue;
      CUstreamAttrValue window{}, sync{}, domain{}, priority{};
      CHECK(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &window));
      CHECK(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &sync));
      CHECK(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &domain));
      CHECK(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_PRIORITY, &priority));
      const auto& w = window.accessPolicyWindow;
      char line[160];
      std::snprintf(line, sizeof line,
                    " window %lld+%zu hit %.3f %d/%d sync %d domain %d priority %d",
                    static_cast<long long>(reinterpret_cast<CUdeviceptr>(w.base_ptr) - state_),
                    w.num_bytes, static_cast<double>(w.hitRatio), static_cast<int>(w.hitProp),
                    static_cast<int>(w.missProp), static_cast<int>(sync.syncPolicy),
                    static_cast<int>(domain.memSyncDomain), priority.priority);
      report += line;
    }
    return report;
  }

  // The asynchronous half of iteration `it`: the input copy and the kernels
  // (and, with --events, the fold on the side stream), queued.
  void enqueue(int it) {
    const size_t bytes = static_cast<size_t>(o_.words) * sizeof(unsigned);
    n_ = o_.words;
    // The input depends on the state read back last iteration, kept in the host
    // buffer: host memory (pinned or not) must come back from a restore too.
    for (int j = 0; j < n_; ++j) in_.data()[j] = inputWord(it, index_, j) ^ out_.data()[j];
    CHECK(cuMemcpyHtoDAsync(input_, in_.data(), bytes, stream_));
    tag_ = static_cast<unsigned>(it * 31 + index_);
    void* mixArgs[] = {&state_, &input_, &n_, &tag_};
    CHECK(cuLaunchKernel(k_.mix, blocks(n_, 256), 1, 1, 256, 1, 1, 0, stream_, mixArgs, nullptr));
    if (o_.inflight) {
      rounds_ = o_.rounds;
      void* churnArgs[] = {&state_, &n_, &rounds_};
      for (int i = 0; i < o_.kernels; ++i) {
        CHECK(cuLaunchKernel(k_.churn, blocks(n_, 256), 1, 1, 256, 1, 1, 0, stream_, churnArgs,
                             nullptr));
      }
    }
    if (o_.events) {
      half_ = n_ / 2;
      CHECK(cuEventRecord(produced_, stream_));
      CHECK(cuStreamWaitEvent(side_, produced_, 0));
      void* foldArgs[] = {&state_, &foldsDevice_, &half_};
      CHECK(cuLaunchKernel(k_.fold, blocks(half_, 256), 1, 1, 256, 1, 1, 0, side_, foldArgs,
                           nullptr));
      CHECK(cuMemcpyDtoHAsync(folds_.data(), foldsDevice_, bytes / 2, side_));
      CHECK(cuEventRecord(folded_, side_));
    }
  }

  // The waiting half: returns the checksum of what the host read back.
  uint64_t finish() {
    const size_t bytes = static_cast<size_t>(o_.words) * sizeof(unsigned);
    if (o_.inflight) {
      // The one synchronizing call of the iteration, with every kernel above in flight.
      if (o_.threads == 1) {
        CHECK(cuCtxSynchronize());
      } else {
        CHECK(cuStreamSynchronize(stream_));
      }
    }
    uint64_t h = kFnvBasis;
    if (o_.events) {
      CHECK(cuEventSynchronize(folded_));
      h = fnv1a(h, folds_.data(), bytes / 2);
    }
    CHECK(cuMemcpyDtoHAsync(out_.data(), state_, bytes, stream_));
    CHECK(cuStreamSynchronize(stream_));
    return fnv1a(h, out_.data(), bytes);
  }

  uint64_t finalState(uint64_t h) {
    const size_t bytes = static_cast<size_t>(o_.words) * sizeof(unsigned);
    CHECK(cuMemcpyDtoH(out_.data(), state_, bytes));
    return fnv1a(h, out_.data(), bytes);
  }

 private:
  int index_;
  const Options& o_;
  const Kernels& k_;
  HostBuffer in_, out_, folds_;
  CUstream stream_ = nullptr, side_ = nullptr;
  CUevent produced_ = nullptr, folded_ = nullptr;
  CUdeviceptr state_ = 0, input_ = 0, foldsDevice_ = 0;
  // Kernel parameters are read at launch, but kept here for the iteration anyway.
  int n_ = 0, rounds_ = 0, half_ = 0;
  unsigned tag_ = 0;
};

// Allocates the device full, then frees ballast until `scratch` bytes fit;
// what it keeps is never freed (the process's end frees it).
void fillDevice(size_t scratch) {
  std::vector<CUdeviceptr> ballast;
  for (size_t chunk = size_t{64} << 20; chunk >= (size_t{64} << 10); chunk /= 4) {
    for (;;) {
      CUdeviceptr p = 0;
      CUresult r = cuMemAlloc(&p, chunk);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) break;
      CHECK(r);
      ballast.push_back(p);
    }
  }
  for (;;) {
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, scratch);
    if (r == CUDA_SUCCESS) {
      CHECK(cuMemFree(p));
      return;
    }
    if (r != CUDA_ERROR_OUT_OF_MEMORY || ballast.empty()) fail("cuMemAlloc of the scratch", r);
    CHECK(cuMemFree(ballast.back()));
    ballast.pop_back();
  }
}

// --fill-device: the scratch of iteration `it`, allocated, filled, read back
// into `h` and freed.
uint64_t useScratch(uint64_t h, size_t bytes, int it) {
  CUdeviceptr scratch = 0;
  CHECK(cuMemAlloc(&scratch, bytes));
  CHECK(cuMemsetD32(scratch, 0x9e3779b9u * static_cast<unsigned>(it + 1), bytes / sizeof(unsigned)));
  unsigned last[16];
  CHECK(cuMemcpyDtoH(last, scratch + bytes - sizeof last, sizeof last));
  CHECK(cuMemFree(scratch));
  return fnv1a(h, last, sizeof last);
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto number = [&](int& out, int low, int high) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < low || v > high) return false;
      out = static_cast<int>(v);
      return true;
    };
    bool ok = true;
    if (a == "--iterations")
      ok = number(o.iterations, 1, 1000000);
    else if (a == "--sleep-ms")
      ok = number(o.sleepMs, 0, 60000);
    else if (a == "--threads")
      ok = number(o.threads, 1, 64);
    else if (a == "--kernels")
      ok = number(o.kernels, 1, 4096);
    else if (a == "--rounds")
      ok = number(o.rounds, 1, 1 << 20);
    else if (a == "--words")
      ok = number(o.words, 2, 1 << 24);
    else if (a == "--inflight")
      o.inflight = true;
    else if (a == "--pinned")
      o.pinned = true;
    else if (a == "--events")
      o.events = true;
    else if (a == "--fill-device")
      o.fillDevice = true;
    else if (a == "--scratch-kib")
      ok = number(o.scratchKib, 4, 1 << 20);
    else if (a == "--jit")
      o.jit = true;
    else if (a == "--stream-attributes")
      o.streamAttributes = true;
    else if (a == "--default-stream-attribute")
      o.defaultStreamAttribute = true;
    else if (a == "--ptx" && i + 1 < argc)
      o.ptx = argv[++i];
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "checkpoint_client: bad argument %s\n", argv[i]);
      return false;
    }
  }
  if (o.words % 2 != 0) {
    std::fprintf(stderr, "checkpoint_client: --words must be even\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;

  CHECK(cuInit(0));
  CUdevice device = 0;
  CHECK(cuDeviceGet(&device, 0));
  CUcontext context = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  // A context setting that a restore must carry over (the default is 1 KiB):
  // the final line reports it.
  CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096));
  CUmodule module = nullptr;
  CHECK(cuModuleLoad(&module, o.ptx.c_str()));
  Kernels k;
  CHECK(cuModuleGetFunction(&k.mix, module, "mix"));
  CHECK(cuModuleGetFunction(&k.churn, module, "churn"));
  CHECK(cuModuleGetFunction(&k.fold, module, "fold"));
  CUdeviceptr launches = 0, salt = 0;
  size_t launchesBytes = 0, saltBytes = 0;
  CHECK(cuModuleGetGlobal(&launches, &launchesBytes, module, "launches"));
  CHECK(cuModuleGetGlobal(&salt, &saltBytes, module, "salt"));
  if (launchesBytes != sizeof(unsigned long long) || saltBytes != sizeof(unsigned)) {
    std::fprintf(stderr,
                 "checkpoint_client: module globals of %zu and %zu bytes, expected 8 and 4\n",
                 launchesBytes, saltBytes);
    return 1;
  }
  CHECK(cuMemcpyHtoD(salt, &kSalt, sizeof kSalt));
  CUdeviceptr spread = 0;
  size_t spreadBytes = 0;
  CHECK(cuModuleGetGlobal(&spread, &spreadBytes, module, "spread"));
  if (spreadBytes != sizeof kSpread) {
    std::fprintf(stderr, "checkpoint_client: __constant__ spread of %zu bytes, expected %zu\n", spreadBytes,
                 sizeof kSpread);
    return 1;
  }
  CHECK(cuMemcpyHtoD(spread, kSpread, sizeof kSpread));
  if (o.defaultStreamAttribute) {
    CUstreamAttrValue v{};
    v.syncPolicy = CU_SYNC_POLICY_YIELD;
    CHECK(cuStreamSetAttribute(nullptr, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v));
    CUstream source = nullptr;
    CHECK(cuStreamCreate(&source, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamSetAttribute(source, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v));
    CHECK(cuStreamCopyAttributes(CU_STREAM_PER_THREAD, source));
    CHECK(cuStreamDestroy(source));
  }
  Jit jit;
  if (o.jit) {
    std::FILE* f = std::fopen(o.ptx.c_str(), "rb");
    if (f == nullptr) {
      std::fprintf(stderr, "checkpoint_client: cannot read %s\n", o.ptx.c_str());
      return 1;
    }
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) jit.ptx.append(buffer, n);
    std::fclose(f);
    CUjit_option capOption[] = {CU_JIT_MAX_REGISTERS};
    void* capValue[] = {reinterpret_cast<void*>(uintptr_t{16})};
    CHECK(cuModuleLoadDataEx(&jit.capped, jit.ptx.c_str(), 1, capOption, capValue));
    jit.values[1] = jit.errorLog;
    jit.values[2] = reinterpret_cast<void*>(uintptr_t{sizeof jit.errorLog});
    CHECK(cuLinkCreate(3, jit.options, jit.values, &jit.link));
    CHECK(cuLinkAddData(jit.link, CU_JIT_INPUT_PTX, jit.ptx.data(), jit.ptx.size() + 1,
                        "kernels.ptx", 0, nullptr, nullptr));
  }

  // The ballast first, leaving room for the workers' buffers and the
  // scratch: a checkpoint saves in address order, so the buffers the
  // kernels write come last and must be shadowed if written meanwhile.
  const size_t scratchBytes = static_cast<size_t>(o.scratchKib) << 10;
  if (o.fillDevice) {
    const size_t workerBytes = static_cast<size_t>(o.words) * sizeof(unsigned) * (o.events ? 5 : 4) / 2;
    fillDevice(scratchBytes + workerBytes * static_cast<size_t>(o.threads));
  }
  std::vector<std::unique_ptr<Worker>> workers;
  for (int w = 0; w < o.threads; ++w) workers.push_back(std::make_unique<Worker>(w, o, k));
  std::vector<uint64_t> digests(o.threads);
  // The workers' streams do not wait for the memsets and the salt's copy above,
  // which went to the NULL stream: CU_STREAM_NON_BLOCKING "specifies that work
  // running in the created stream may run concurrently with work in stream 0
  // (the NULL stream), and that the created stream should perform no implicit
  // synchronization with stream 0".
  CHECK(cuCtxSynchronize());

  uint64_t checksum = kFnvBasis;
  int iteration = 0;
  // Runs on one worker thread once all have finished iteration `iteration`
  // and queued the next one's work: when a line is out, the next iteration's
  // kernels are already in flight (with --inflight, a checkpoint taken just
  // after the line finds the job waiting for them in its synchronizing call).
  auto report = [&]() noexcept {
    for (uint64_t d : digests) checksum = fnv1a(checksum, &d, sizeof d);
    std::printf("iteration %d checksum %016llx\n", iteration,
                static_cast<unsigned long long>(checksum));
    std::fflush(stdout);
    ++iteration;
    if (o.sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.sleepMs));
  };
  std::barrier done(o.threads, report);
  auto run = [&](int w) {
    CHECK(cuCtxSetCurrent(context));
    for (int it = 0; it < o.iterations; ++it) {
      workers[w]->enqueue(it);
      if (it > 0) done.arrive_and_wait();  // the line of iteration it - 1
      digests[w] = workers[w]->finish();
      if (o.fillDevice && w == 0) digests[w] = useScratch(digests[w], scratchBytes, it);
    }
    done.arrive_and_wait();  // the last iteration's line
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < o.threads; ++w) threads.emplace_back(run, w);
  run(0);
  for (std::thread& t : threads) t.join();

  uint64_t finalChecksum = checksum;
  for (auto& w : workers) finalChecksum = w->finalState(finalChecksum);
  unsigned long long count = 0;
  unsigned saltNow = 0;
  CHECK(cuMemcpyDtoH(&count, launches, sizeof count));
  CHECK(cuMemcpyDtoH(&saltNow, salt, sizeof saltNow));
  size_t stack = 0;
  CHECK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
  std::string jitReport;
  if (o.jit) {
    CUfunction capped = nullptr;
    int regs = 0;
    CHECK(cuModuleGetFunction(&capped, jit.capped, "mix"));
    CHECK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, capped));
    void* image = nullptr;
    size_t imageBytes = 0;
    CHECK(cuLinkComplete(jit.link, &image, &imageBytes));
    CUmodule linked = nullptr;
    CUfunction mix = nullptr;
    CHECK(cuModuleLoadData(&linked, image));
    CHECK(cuModuleGetFunction(&mix, linked, "mix"));
    CHECK(cuModuleUnload(linked));
    CHECK(cuLinkDestroy(jit.link));
    CHECK(cuModuleUnload(jit.capped));
    jitReport = " regs " + std::to_string(regs) + " linked " + std::to_string(imageBytes) +
                " error log '" + jit.errorLog + "'";
  }
  const std::string attributeReport =
      o.streamAttributes ? " attributes" + workers[0]->attributes() : "";
  std::printf("final checksum %016llx launches %llu salt %08x stack %zu%s%s\n",
              static_cast<unsigned long long>(finalChecksum), count, saltNow, stack,
              jitReport.c_str(), attributeReport.c_str());
  workers.clear();
  CHECK(cuModuleUnload(module));
  CHECK(cuDevicePrimaryCtxRelease(device));
  return 0;
}
