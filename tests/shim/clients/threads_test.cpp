// SPDX-License-Identifier: Apache-2.0
// Many application threads calling through libphos.so at once, and the context stack that each of them owns.
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>

#include "client_support.h"

namespace phos::shim::testing {
namespace {

const auto* const kUnderPhos = ::testing::AddGlobalTestEnvironment(new UnderPhos);

constexpr int kThreads = 8;
constexpr int kRounds = 4;
constexpr int kElements = 2048;

// Failures found on worker threads, reported on the test's thread.
class Failures {
 public:
  void add(int thread, const std::string& what, CUresult r = CUDA_SUCCESS) {
    std::lock_guard lock(mutex_);
    list_.push_back("thread " + std::to_string(thread) + ": " + what +
                    (r != CUDA_SUCCESS ? " -> " + resultName(r) : ""));
  }
  std::vector<std::string> list() const {
    std::lock_guard lock(mutex_);
    return list_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> list_;
};

#define TRY(thread, failures, call)                     \
  do {                                                  \
    CUresult r_ = (call);                               \
    if (r_ != CUDA_SUCCESS) {                           \
      (failures).add((thread), #call, r_);              \
      return;                                           \
    }                                                   \
  } while (0)

// One round of work: c = a + b with inputs unique to (thread, round), through
// `stream`, checked element by element.
void addRound(int thread, int round, CUfunction add, CUstream stream, Failures& failures) {
  const size_t bytes = kElements * sizeof(float);
  std::vector<float> a(kElements), b(kElements), c(kElements, -1.0f);
  for (int i = 0; i < kElements; ++i) {
    a[i] = static_cast<float>(thread * 100000 + round * 1000 + i);
    b[i] = static_cast<float>(thread + 1);
  }
  CUdeviceptr da = 0, db = 0, dc = 0;
  TRY(thread, failures, cuMemAlloc(&da, bytes));
  TRY(thread, failures, cuMemAlloc(&db, bytes));
  TRY(thread, failures, cuMemAlloc(&dc, bytes));
  TRY(thread, failures, cuMemcpyHtoDAsync(da, a.data(), bytes, stream));
  TRY(thread, failures, cuMemcpyHtoDAsync(db, b.data(), bytes, stream));
  TRY(thread, failures, cuMemsetD32Async(dc, 0, kElements, stream));
  int n = kElements;
  void* params[] = {&da, &db, &dc, &n};
  TRY(thread, failures, cuLaunchKernel(add, kElements / 128, 1, 1, 128, 1, 1, 0, stream, params, nullptr));
  TRY(thread, failures, cuMemcpyDtoHAsync(c.data(), dc, bytes, stream));
  TRY(thread, failures, cuStreamSynchronize(stream));
  for (int i = 0; i < kElements; ++i) {
    if (c[i] != a[i] + b[i]) {
      failures.add(thread, "round " + std::to_string(round) + ": c[" + std::to_string(i) + "] = " +
                               std::to_string(c[i]) + ", expected " + std::to_string(a[i] + b[i]));
      return;
    }
  }
  for (CUdeviceptr p : {da, db, dc}) TRY(thread, failures, cuMemFree(p));
}

TEST(ShimThreads, EightThreadsEachWithTheirOwnContext) {
  ASSERT_CU(cuInit(0));
  CUdevice device = 0;
  ASSERT_CU(cuDeviceGet(&device, 0));
  Failures failures;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      CUcontext ctx = nullptr;
      TRY(t, failures, cuCtxCreate(&ctx, nullptr, 0, device));
      CUmodule module = nullptr;
      CUfunction add = nullptr;
      TRY(t, failures, cuModuleLoad(&module, PHOS_SHIM_KERNELS_PTX));
      TRY(t, failures, cuModuleGetFunction(&add, module, "addVectors"));
      for (int round = 0; round < kRounds; ++round) {
        addRound(t, round, add, nullptr, failures);
        // Other threads creating and destroying contexts leave ours current.
        CUcontext current = nullptr;
        TRY(t, failures, cuCtxGetCurrent(&current));
        if (current != ctx) failures.add(t, "the current context changed under the thread");
        TRY(t, failures, cuCtxSynchronize());
      }
      TRY(t, failures, cuModuleUnload(module));
      TRY(t, failures, cuCtxDestroy(ctx));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(failures.list(), ::testing::IsEmpty());
}

TEST(ShimThreads, EightThreadsShareThePrimaryContext) {
  ASSERT_CU(cuInit(0));
  CUdevice device = 0;
  CUcontext primary = nullptr;
  ASSERT_CU(cuDeviceGet(&device, 0));
  ASSERT_CU(cuDevicePrimaryCtxRetain(&primary, device));
  ASSERT_CU(cuCtxSetCurrent(primary));
  CUmodule module = nullptr;
  CUfunction add = nullptr;
  ASSERT_CU(cuModuleLoad(&module, PHOS_SHIM_KERNELS_PTX));
  ASSERT_CU(cuModuleGetFunction(&add, module, "addVectors"));
  Failures failures;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TRY(t, failures, cuCtxSetCurrent(primary));
      CUstream stream = nullptr;
      TRY(t, failures, cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
      start.arrive_and_wait();
      for (int round = 0; round < kRounds; ++round) addRound(t, round, add, stream, failures);
      TRY(t, failures, cuStreamDestroy(stream));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(failures.list(), ::testing::IsEmpty());
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_CU(cuModuleUnload(module));
  EXPECT_CU(cuDevicePrimaryCtxRelease(device));
}

TEST(ShimContextStack, EachThreadHasItsOwn) {
  ASSERT_CU(cuInit(0));
  CUdevice device = 0;
  ASSERT_CU(cuDeviceGet(&device, 0));
  CUcontext a = nullptr, b = nullptr, current = nullptr;
  ASSERT_CU(cuCtxCreate(&a, nullptr, 0, device));
  // "creates a new CUDA context ... and pushes it onto the calling thread's stack"
  ASSERT_CU(cuCtxCreate(&b, nullptr, 0, device));
  ASSERT_NE(a, b);
  ASSERT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, b);
  ASSERT_CU(cuCtxPopCurrent(&current));
  EXPECT_EQ(current, b);
  ASSERT_CU(cuCtxGetCurrent(&current));
  ASSERT_EQ(current, a);

  std::latch pushed(1), checked(1);
  std::vector<std::string> seen;
  std::thread other([&] {
    CUcontext c = reinterpret_cast<CUcontext>(0x1);
    auto expectCurrent = [&](CUcontext expected, const char* when) {
      CUresult r = cuCtxGetCurrent(&c);
      if (r != CUDA_SUCCESS || c != expected) seen.push_back(std::string(when) + ": " + resultName(r));
    };
    // A new thread starts with an empty stack, whatever its creator had.
    expectCurrent(nullptr, "at start");
    if (cuCtxPopCurrent(&c) != CUDA_ERROR_INVALID_CONTEXT) seen.push_back("popping an empty stack succeeded");
    if (cuCtxPushCurrent(b) != CUDA_SUCCESS) seen.push_back("push b failed");
    expectCurrent(b, "after push b");
    // Calls follow this thread's current context: the allocation is b's.
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 64) != CUDA_SUCCESS) seen.push_back("cuMemAlloc in b failed");
    CUcontext owner = nullptr;
    CUresult r = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p);
    if (r != CUDA_SUCCESS || owner != b) seen.push_back("the allocation's context is not b: " + resultName(r));
    if (cuMemFree(p) != CUDA_SUCCESS) seen.push_back("cuMemFree in b failed");
    pushed.count_down();
    checked.wait();
    if (cuCtxPushCurrent(a) != CUDA_SUCCESS) seen.push_back("push a failed");
    expectCurrent(a, "after push a");
    if (cuCtxPopCurrent(&c) != CUDA_SUCCESS || c != a) seen.push_back("pop did not return a");
    expectCurrent(b, "after pop a");
    // "If there exists a CUDA context stack on the calling CPU thread, this
    // will replace the top of that stack with ctx."
    if (cuCtxSetCurrent(a) != CUDA_SUCCESS) seen.push_back("set a failed");
    expectCurrent(a, "after set a");
    if (cuCtxPopCurrent(&c) != CUDA_SUCCESS || c != a) seen.push_back("pop after set did not return a");
    expectCurrent(nullptr, "after the last pop");
  });
  pushed.wait();
  // The other thread pushed b: this thread's current context is still a.
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, a);
  checked.count_down();
  other.join();
  EXPECT_THAT(seen, ::testing::IsEmpty());
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, a);
  EXPECT_CU(cuCtxDestroy(b));
  EXPECT_CU(cuCtxDestroy(a));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxPushCurrent(a));
}

}  // namespace
}  // namespace phos::shim::testing
