// SPDX-License-Identifier: Apache-2.0
// What an application sees of asynchrony through libphos.so: posted launches, synchronizing
// calls, deferred errors, per-thread default streams, pinned memory, and large copies of pageable
// memory (through the ring's transfer lanes).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client_support.h"

namespace phos::shim::testing {
namespace {

const auto* const kUnderPhos = ::testing::AddGlobalTestEnvironment(new UnderPhos);

// Far more steps than any gate stays closed in these tests; reaching it means
// the gate was never seen open.
constexpr unsigned long long kGateLimit = 2'000'000'000ull;

// The primary context with a gate: two ints of mapped pinned memory, [0] the
// flag the host sets to let the gate kernel finish, [1] how it finished.
class SemanticsTest : public PrimaryContextTest {
 protected:
  void SetUp() override {
    PrimaryContextTest::SetUp();
    if (HasFatalFailure()) return;
    void* p = nullptr;
    ASSERT_CU(cuMemHostAlloc(&p, 2 * sizeof(int), CU_MEMHOSTALLOC_DEVICEMAP));
    gate_ = static_cast<int*>(p);
    std::memset(gate_, 0, 2 * sizeof(int));
    ASSERT_CU(cuMemHostGetDevicePointer(&gateDevice_, gate_, 0));
  }
  void TearDown() override {
    if (gate_ != nullptr) {
      openGate();
      EXPECT_CU(cuCtxSynchronize());
      EXPECT_CU(cuMemFreeHost(gate_));
    }
    PrimaryContextTest::TearDown();
  }

  // Launches the gate kernel; it reports how it ended at `done` (default: gate_[1]).
  CUresult launchGate(CUstream stream, decltype(&::cuLaunchKernel) launch = &cuLaunchKernel, CUdeviceptr done = 0) {
    CUdeviceptr open = gateDevice_;
    if (done == 0) done = gateDevice_ + sizeof(int);
    unsigned long long limit = kGateLimit;
    void* params[] = {&open, &limit, &done};
    return launch(function("gate"), 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr);
  }
  void openGate() { __atomic_store_n(&gate_[0], 1, __ATOMIC_RELEASE); }
  int gateOutcome() const { return __atomic_load_n(&gate_[1], __ATOMIC_ACQUIRE); }

  // Opens the gate from another thread a little later, while this thread is
  // blocked in a synchronizing call. If that call did not wait, it returns
  // before the gate opens and the kernel's outcome is still 0.
  std::thread openGateSoon() {
    return std::thread([this] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      openGate();
    });
  }

  int* gate_ = nullptr;
  CUdeviceptr gateDevice_ = 0;
};

TEST_F(SemanticsTest, LaunchReturnsWhileTheKernelStillRuns) {
  CUevent finished = nullptr;
  ASSERT_CU(cuEventCreate(&finished, CU_EVENT_DEFAULT));
  // The kernel cannot end before openGate() below, so a launch that waited for
  // it would never return.
  ASSERT_CU(launchGate(nullptr));
  ASSERT_CU(cuEventRecord(finished, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuEventQuery(finished));
  EXPECT_EQ(gateOutcome(), 0);
  openGate();
  EXPECT_CU(cuEventSynchronize(finished));
  EXPECT_CU(cuEventQuery(finished));
  EXPECT_EQ(gateOutcome(), 1);
  EXPECT_CU(cuEventDestroy(finished));
}

TEST_F(SemanticsTest, CtxSynchronizeWaitsForTheKernel) {
  ASSERT_CU(launchGate(nullptr));
  std::thread opener = openGateSoon();
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(gateOutcome(), 1) << "cuCtxSynchronize returned before the kernel ended";
  opener.join();
}

TEST_F(SemanticsTest, SynchronousCopyWaitsForTheKernelBeforeIt) {
  CUdeviceptr done = 0;
  ASSERT_CU(cuMemAlloc(&done, sizeof(int)));
  ASSERT_CU(cuMemsetD32(done, 0, 1));
  ASSERT_CU(launchGate(nullptr, &cuLaunchKernel, done));
  std::thread opener = openGateSoon();
  // "cuMemcpyDtoH ... synchronous": it follows the kernel on the legacy stream.
  int outcome = -1;
  EXPECT_CU(cuMemcpyDtoH(&outcome, done, sizeof(outcome)));
  EXPECT_EQ(outcome, 1) << "the copy did not wait for the kernel that writes its source";
  opener.join();
  EXPECT_CU(cuMemFree(done));
}

TEST_F(SemanticsTest, ErrorOfAPostedCallIsReportedAtTheNextSynchronizingCall) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 256));
  // Posted: the application does not wait for phosd, so it cannot know yet.
  EXPECT_CU(cuMemsetD8Async(p + 256, 0x11, 16, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamSynchronize(nullptr));
  // Reported once.
  EXPECT_CU(cuStreamSynchronize(nullptr));

  // A launch the driver refuses (more threads per block than the device has).
  CUdeviceptr a = p;
  int n = 1;
  void* params[] = {&a, &a, &a, &n};
  EXPECT_CU(cuLaunchKernel(function("addVectors"), 1, 1, 1, 4096, 1, 1, 0, nullptr, params, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxSynchronize());
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_CU(cuMemFree(p));
}

TEST_F(SemanticsTest, PerThreadDefaultStreamsAreDistinct) {
  // How a program built with --default-stream per-thread gets its launches.
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(cuGetProcAddress_v2("cuLaunchKernel", &pfn, CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                &status));
  ASSERT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  auto launchPerThread = reinterpret_cast<decltype(&::cuLaunchKernel)>(pfn);
  ASSERT_NE(launchPerThread, nullptr);

  constexpr int n = 256;
  const size_t bytes = n * sizeof(float);
  CUdeviceptr da = 0, db = 0, dc = 0;
  ASSERT_CU(cuMemAlloc(&da, bytes));
  ASSERT_CU(cuMemAlloc(&db, bytes));
  ASSERT_CU(cuMemAlloc(&dc, bytes));
  CUevent gateDone = nullptr;
  ASSERT_CU(cuEventCreate(&gateDone, CU_EVENT_DEFAULT));

  // This thread's per-thread stream is held by the gate kernel.
  ASSERT_CU(launchGate(nullptr, launchPerThread));
  ASSERT_CU(cuEventRecord(gateDone, CU_STREAM_PER_THREAD));

  // Another thread's per-thread stream is not: its work runs and its stream
  // synchronizes while the gate is closed. Only per-thread streams are used
  // there: the legacy default stream would wait for this thread's.
  std::vector<float> a(n), b(n), c(n, 0.0f);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f;
  }
  CUresult launched = CUDA_ERROR_UNKNOWN, synced = CUDA_ERROR_UNKNOWN, copied = CUDA_ERROR_UNKNOWN;
  std::thread other([&] {
    if (cuCtxSetCurrent(context_) != CUDA_SUCCESS) return;
    cuMemcpyHtoDAsync(da, a.data(), bytes, CU_STREAM_PER_THREAD);
    cuMemcpyHtoDAsync(db, b.data(), bytes, CU_STREAM_PER_THREAD);
    int count = n;
    void* params[] = {&da, &db, &dc, &count};
    launched = launchPerThread(function("addVectors"), 1, 1, 1, n, 1, 1, 0, nullptr, params, nullptr);
    synced = cuStreamSynchronize(CU_STREAM_PER_THREAD);
    copied = cuMemcpyDtoHAsync(c.data(), dc, bytes, CU_STREAM_PER_THREAD);
  });
  other.join();
  EXPECT_CU(launched);
  EXPECT_CU(synced);
  EXPECT_CU(copied);
  for (int i = 0; i < n; ++i) ASSERT_EQ(c[i], a[i] + b[i]) << "at " << i;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuEventQuery(gateDone));
  EXPECT_EQ(gateOutcome(), 0);

  openGate();
  EXPECT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  EXPECT_CU(cuEventQuery(gateDone));
  EXPECT_EQ(gateOutcome(), 1);
  EXPECT_CU(cuEventDestroy(gateDone));
  for (CUdeviceptr p : {da, db, dc}) EXPECT_CU(cuMemFree(p));
}

TEST_F(SemanticsTest, PinnedMemoryRoundTripsThroughAsyncCopies) {
  constexpr int n = 4096;
  const size_t bytes = n * sizeof(float);
  void* in = nullptr;
  void* out = nullptr;
  ASSERT_CU(cuMemHostAlloc(&in, bytes, 0));
  ASSERT_CU(cuMemHostAlloc(&out, bytes, 0));
  auto* hin = static_cast<float*>(in);
  auto* hout = static_cast<float*>(out);
  for (int i = 0; i < n; ++i) {
    hin[i] = static_cast<float>(i) - 1000.0f;
    hout[i] = 0.0f;
  }
  CUdeviceptr din = 0, dout = 0;
  ASSERT_CU(cuMemAlloc(&din, bytes));
  ASSERT_CU(cuMemAlloc(&dout, bytes));
  CUstream stream = nullptr;
  ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuMemcpyHtoDAsync(din, in, bytes, stream));
  float factor = 2.5f;
  int count = n;
  void* params[] = {&din, &dout, &factor, &count};
  ASSERT_CU(cuLaunchKernel(function("scale"), n / 256, 1, 1, 256, 1, 1, 0, stream, params, nullptr));
  ASSERT_CU(cuMemcpyDtoHAsync(out, dout, bytes, stream));
  ASSERT_CU(cuStreamSynchronize(stream));
  for (int i = 0; i < n; ++i) ASSERT_EQ(hout[i], hin[i] * 2.5f) << "at " << i;
  EXPECT_CU(cuStreamDestroy(stream));
  EXPECT_CU(cuMemFree(din));
  EXPECT_CU(cuMemFree(dout));
  EXPECT_CU(cuMemFreeHost(in));
  EXPECT_CU(cuMemFreeHost(out));
}

std::vector<unsigned char> pageablePattern(size_t bytes, unsigned seed) {
  std::vector<unsigned char> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 131 + seed + i / 4096);
  return v;
}

// Copies of pageable memory around the size where they start to go through a
// transfer lane (1 MiB) and over several 4 MiB chunks with a partial last
// one: every byte arrives, both ways, synchronous and on a stream.
TEST_F(SemanticsTest, PageableCopiesOfEverySizeArriveWhole) {
  CUstream stream = nullptr;
  ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  for (size_t bytes : {size_t{(1u << 20) - 1}, size_t{1u << 20}, size_t{(9u << 20) + 123}}) {
    SCOPED_TRACE(bytes);
    const auto in = pageablePattern(bytes, static_cast<unsigned>(bytes));
    CUdeviceptr d = 0, d2 = 0;
    ASSERT_CU(cuMemAlloc(&d, bytes));
    ASSERT_CU(cuMemAlloc(&d2, bytes));
    // `stream` does not wait for the legacy default stream, and a copy from
    // pageable memory may return before its DMA ends: the syncs order them,
    // as the Driver API's synchronization rules ask of a program.
    ASSERT_CU(cuMemcpyHtoD(d, in.data(), bytes));
    ASSERT_CU(cuCtxSynchronize());
    ASSERT_CU(cuMemcpyDtoDAsync(d2, d, bytes, stream));
    std::vector<unsigned char> out(bytes, 0);
    ASSERT_CU(cuMemcpyDtoHAsync(out.data(), d2, bytes, stream));  // pageable: complete on return
    EXPECT_TRUE(out == in);
    ASSERT_CU(cuMemsetD8Async(d2, 0, bytes, stream));
    ASSERT_CU(cuMemcpyHtoDAsync(d2, in.data(), bytes, stream));
    ASSERT_CU(cuStreamSynchronize(stream));
    std::fill(out.begin(), out.end(), 0);
    ASSERT_CU(cuMemcpyDtoH(out.data(), d2, bytes));
    EXPECT_TRUE(out == in);
    // Unified addresses: phosd tells the shim which side is the device.
    const auto again = pageablePattern(bytes, static_cast<unsigned>(bytes) + 1);
    ASSERT_CU(cuMemcpy(d, reinterpret_cast<CUdeviceptr>(again.data()), bytes));
    ASSERT_CU(cuCtxSynchronize());
    std::fill(out.begin(), out.end(), 0);
    ASSERT_CU(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(out.data()), d, bytes, stream));
    EXPECT_TRUE(out == again);
    EXPECT_CU(cuMemFree(d));
    EXPECT_CU(cuMemFree(d2));
  }
  EXPECT_CU(cuStreamDestroy(stream));
}

// More threads copying at once than the ring has lanes: those without one
// copy without it, and no thread sees another's bytes.
TEST_F(SemanticsTest, ConcurrentPageableCopiesKeepTheirOwnBytes) {
  constexpr size_t kBytes = (6u << 20) + 4097;
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&ctx));
  std::vector<std::thread> threads;
  std::vector<int> wrong(5, -1);
  for (int t = 0; t < 5; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return;
      CUdeviceptr d = 0;
      if (cuMemAlloc(&d, kBytes) != CUDA_SUCCESS) return;
      int bad = 0;
      for (int round = 0; round < 3; ++round) {
        const auto in = pageablePattern(kBytes, static_cast<unsigned>(t * 7 + round));
        std::vector<unsigned char> out(kBytes, 0);
        if (cuMemcpyHtoD(d, in.data(), kBytes) != CUDA_SUCCESS ||
            cuMemcpyDtoH(out.data(), d, kBytes) != CUDA_SUCCESS || out != in) {
          ++bad;
        }
      }
      wrong[t] = bad;
      cuMemFree(d);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 5; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
}

TEST_F(SemanticsTest, KernelUsesPinnedMemoryThroughItsDevicePointer) {
  constexpr int n = 1024;
  const size_t bytes = n * sizeof(float);
  void* in = nullptr;
  void* out = nullptr;
  ASSERT_CU(cuMemHostAlloc(&in, bytes, CU_MEMHOSTALLOC_DEVICEMAP));
  ASSERT_CU(cuMemHostAlloc(&out, bytes, CU_MEMHOSTALLOC_DEVICEMAP));
  auto* hin = static_cast<float*>(in);
  auto* hout = static_cast<float*>(out);
  for (int i = 0; i < n; ++i) {
    hin[i] = static_cast<float>(3 * i);
    hout[i] = -1.0f;
  }
  CUdeviceptr din = 0, dout = 0;
  ASSERT_CU(cuMemHostGetDevicePointer(&din, in, 0));
  ASSERT_CU(cuMemHostGetDevicePointer(&dout, out, 0));
  float factor = -1.5f;
  int count = n;
  void* params[] = {&din, &dout, &factor, &count};
  ASSERT_CU(cuLaunchKernel(function("scale"), n / 128, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  // The kernel wrote the application's own pages: no copy back.
  for (int i = 0; i < n; ++i) ASSERT_EQ(hout[i], hin[i] * -1.5f) << "at " << i;
  EXPECT_CU(cuMemFreeHost(in));
  EXPECT_CU(cuMemFreeHost(out));
}

// A generated out array (apigen/remoting.json "out_array") comes back whole,
// and one larger than half a ring slot is refused with CUDA_ERROR_INVALID_VALUE
// before phosd lends the driver memory for it (docs/remoting.md).
TEST_F(SemanticsTest, GeneratedOutArraysComeBackWholeAndOversizedOnesAreRefused) {
  std::vector<CUatomicOperation> ops(8, CU_ATOMIC_OPERATION_INTEGER_ADD);
  std::vector<unsigned> caps(ops.size(), 0xdeadu);
  ASSERT_CU(cuDeviceGetHostAtomicCapabilities(caps.data(), ops.data(), static_cast<unsigned>(ops.size()), device_));
  EXPECT_EQ(caps, std::vector<unsigned>(ops.size(), 0u));  // vgpu: no native atomics with the host
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(caps.data(), ops.data(), 0, device_));
  // 12000 bytes of capabilities: over half of phosd's 16 KiB slots (the
  // request's 12000 bytes of operations fit in one).
  ops.assign(3000, CU_ATOMIC_OPERATION_INTEGER_ADD);
  caps.assign(ops.size(), 0xdeadu);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuDeviceGetHostAtomicCapabilities(caps.data(), ops.data(), static_cast<unsigned>(ops.size()), device_));
  EXPECT_EQ(caps[0], 0xdeadu);
}

// JIT options whose values point to arrays of names are not remoted: the shim
// refuses them rather than send phosd an address of the application
// (docs/remoting.md); the other options of the same call never load anything.
TEST_F(SemanticsTest, JitOptionsThatPointToArraysOfNamesAreRefused) {
  const char* names[] = {"symbol"};
  void* addresses[] = {nullptr};
  CUjit_option options[] = {CU_JIT_GLOBAL_SYMBOL_NAMES, CU_JIT_GLOBAL_SYMBOL_ADDRESSES,
                            CU_JIT_GLOBAL_SYMBOL_COUNT};
  void* values[] = {names, addresses, reinterpret_cast<void*>(uintptr_t{1})};
  CUlinkState link = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuLinkCreate(3, options, values, &link));
  EXPECT_EQ(link, nullptr);
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED,
                cuModuleLoadDataEx(&m, ".version 8.0\n.target sm_80\n", 3, options, values));
  EXPECT_EQ(m, nullptr);
}

// Managed memory is served as pinned memory that answers as managed memory
// (docs/remoting.md): the devices advertise it (and not pageable memory,
// which phosd cannot reach), the host writes it while a kernel reads it, it
// is freed with cuMemFree and refused by pinned memory's own calls, and
// freed addresses are reused: allocations in a loop, 20 GiB in all, never
// run out of the session's 16 GiB window.
TEST_F(SemanticsTest, ManagedMemoryIsServedAsSharedPinnedMemory) {
  CUdevice device = 0;
  ASSERT_CU(cuCtxGetDevice(&device));
  const std::pair<CUdevice_attribute, int> advertised[] = {
      {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
      {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0},
      {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0}};
  for (const auto& [attribute, expected] : advertised) {
    int v = -1;
    EXPECT_CU(cuDeviceGetAttribute(&v, attribute, device));
    EXPECT_EQ(v, expected) << attribute;
  }

  CUdeviceptr m = 0;
  ASSERT_CU(cuMemAllocManaged(&m, 2 * sizeof(int), CU_MEM_ATTACH_GLOBAL));
  auto* flags = reinterpret_cast<int*>(m);
  flags[0] = flags[1] = 0;
  CUdeviceptr open = m, done = m + sizeof(int);
  unsigned long long limit = kGateLimit;
  void* params[] = {&open, &limit, &done};
  ASSERT_CU(cuLaunchKernel(function("gate"), 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  __atomic_store_n(&flags[0], 1, __ATOMIC_RELEASE);  // while the kernel runs
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(__atomic_load_n(&flags[1], __ATOMIC_ACQUIRE), 1);  // it saw the gate open

  unsigned int hostFlags = 0;
  CUdeviceptr mapped = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemHostGetFlags(&hostFlags, flags));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemHostGetDevicePointer(&mapped, flags, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(flags));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFree(m + sizeof(int)));
  EXPECT_CU(cuMemFree(m));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFree(m));
  // Pinned memory is not freed as managed memory is.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFree(gateDevice_));

  // Managed memory of a context goes with it; its addresses are handed out
  // again (the shim drops its stale mapping).
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, device));
  CUdeviceptr ofOther = 0;
  ASSERT_CU(cuMemAllocManaged(&ofOther, 3 * 4096, CU_MEM_ATTACH_GLOBAL));
  ASSERT_CU(cuCtxDestroy(other));
  ASSERT_CU(cuCtxSetCurrent(context_));
  CUdeviceptr again = 0;
  ASSERT_CU(cuMemAllocManaged(&again, 3 * 4096, CU_MEM_ATTACH_GLOBAL));
  EXPECT_EQ(again, ofOther);
  reinterpret_cast<volatile int*>(again)[0] = 7;
  int isManaged = 0;
  EXPECT_CU(cuPointerGetAttribute(&isManaged, CU_POINTER_ATTRIBUTE_IS_MANAGED, again));
  EXPECT_EQ(isManaged, 1);
  EXPECT_CU(cuMemFree(again));

  constexpr size_t kChunk = size_t{256} << 20;
  for (int i = 0; i < 80; ++i) {
    CUdeviceptr chunk = 0;
    ASSERT_CU(cuMemAllocManaged(&chunk, kChunk, CU_MEM_ATTACH_HOST)) << "allocation " << i;
    reinterpret_cast<volatile char*>(chunk)[kChunk - 1] = static_cast<char>(i);
    ASSERT_CU(cuMemFree(chunk));
  }
}

void CUDA_CB noteHostCall(void* flag) {
  *static_cast<int*>(flag) = 1;
}

// Stream capture runs on phosd's streams (docs/remoting.md): what phosd serves
// with more than the one driver call on the stream cannot be a graph's node
// and is refused as CUDA refuses what a capture does not support, the
// capture invalidated; pinned copies, sets and the application's host
// functions are captured and replayed. A call a capture refuses is answered
// at the call, posted or not.
TEST_F(SemanticsTest, WhatPhosdCannotCaptureIsRefusedAndInvalidatesTheCapture) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0;
  constexpr size_t kBytes = size_t{2} << 20;  // large enough for a transfer lane
  ASSERT_CU(cuMemAlloc(&d, kBytes));
  std::vector<unsigned char> pageable(kBytes, 7);
  CUgraph graph = nullptr;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  auto expectInvalidated = [&] {
    ASSERT_CU(cuStreamIsCapturing(s, &status));
    EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &graph));
    EXPECT_EQ(graph, nullptr);
  };
  for (size_t bytes : {size_t{256}, kBytes}) {
    ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  cuMemcpyHtoDAsync(d, pageable.data(), bytes, s));
    expectInvalidated();
    ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  cuMemcpyDtoHAsync(pageable.data(), d, bytes, s));
    expectInvalidated();
  }
  // A set of pinned memory: phosd sets it with a host function of its own.
  void* pinned = nullptr;
  ASSERT_CU(cuMemHostAlloc(&pinned, 4096, 0));
  ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(pinned), 0, 1024, s));
  expectInvalidated();
  // An event recorded outside the capture: the wait (a posted call) is refused at once.
  CUevent outside = nullptr;
  ASSERT_CU(cuEventCreate(&outside, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventRecord(outside, nullptr));
  ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cuStreamWaitEvent(s, outside, 0));
  expectInvalidated();
  EXPECT_CU(cuEventDestroy(outside));

  // Pinned memory is at the same address in phosd: its copies are captured;
  // so are the application's host functions.
  std::memset(pinned, 0, 4096);
  ASSERT_CU(cuMemsetD32(d, 0, 1024));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD32Async(d, 0x01020304, 1024, s));
  ASSERT_CU(cuMemcpyDtoHAsync(pinned, d, 4096, s));
  int called = 0;
  ASSERT_CU(cuLaunchHostFunc(s, noteHostCall, &called));
  ASSERT_CU(cuStreamEndCapture(s, &graph));
  EXPECT_EQ(static_cast<unsigned*>(pinned)[0], 0u);  // captured, not run
  EXPECT_EQ(called, 0);
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(static_cast<unsigned*>(pinned)[1023], 0x01020304u);
  EXPECT_EQ(called, 1);
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
  // Gone from the session; the launch is posted, as kernel launches are.
  EXPECT_CU(cuGraphLaunch(exec, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamSynchronize(s));
  EXPECT_CU(cuMemFreeHost(pinned));
  EXPECT_CU(cuMemFree(d));
  EXPECT_CU(cuStreamDestroy(s));
}

}  // namespace
}  // namespace phos::shim::testing
