// SPDX-License-Identifier: Apache-2.0
// vgpu's contexts: primary contexts, created contexts, the per-thread stack, limits and flags, profiler control.
#include <cudaProfiler.h>

#include <thread>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

class ContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    // Every test starts with an empty context stack on its thread.
    CUcontext c = nullptr;
    while (cuCtxGetCurrent(&c) == CUDA_SUCCESS && c != nullptr) ASSERT_CU(cuCtxPopCurrent(&c));
  }
};

TEST_F(ContextTest, NoCurrentContextMeansInvalidContext) {
  CUcontext c = reinterpret_cast<CUcontext>(0x1);
  EXPECT_CU(cuCtxGetCurrent(&c));
  EXPECT_EQ(c, nullptr);
  CUdevice dev = -1;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetDevice(&dev));
  CUdeviceptr p = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&p, 64));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxSynchronize());
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxPopCurrent(&c));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxGetCurrent(nullptr));
}

TEST_F(ContextTest, AContextsExecutionAffinityIsItsDevicesSmCount) {
  CUexecAffinityParam affinity{};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT,
                cuCtxGetExecAffinity(&affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
  CUcontext ctx = nullptr;
  ASSERT_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
  ASSERT_CU(cuCtxGetExecAffinity(&affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
  int sms = 0;
  ASSERT_CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
  EXPECT_EQ(affinity.type, CU_EXEC_AFFINITY_TYPE_SM_COUNT);
  EXPECT_EQ(affinity.param.smCount.val, static_cast<unsigned>(sms));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuCtxGetExecAffinity(&affinity, CU_EXEC_AFFINITY_TYPE_MAX));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuCtxGetExecAffinity(nullptr, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
  int supported = 1;
  ASSERT_CU(cuDeviceGetExecAffinitySupport(&supported, CU_EXEC_AFFINITY_TYPE_SM_COUNT, 0));
  EXPECT_EQ(supported, 0);  // so a context with an SM count of its own is refused
  EXPECT_CU(cuCtxDestroy(ctx));
}

TEST_F(ContextTest, PrimaryContextIsReferenceCounted) {
  unsigned flags = 99;
  int active = -1;
  EXPECT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  EXPECT_EQ(active, 0);
  CUcontext a = nullptr, b = nullptr;
  EXPECT_CU(cuDevicePrimaryCtxRetain(&a, 0));
  EXPECT_CU(cuDevicePrimaryCtxRetain(&b, 0));
  EXPECT_EQ(a, b);
  EXPECT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  EXPECT_EQ(active, 1);
  // Retaining does not make it current.
  CUcontext current = reinterpret_cast<CUcontext>(0x1);
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, nullptr);
  EXPECT_CU(cuCtxSetCurrent(a));
  CUdevice dev = -1;
  EXPECT_CU(cuCtxGetDevice(&dev));
  EXPECT_EQ(dev, 0);
  EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  EXPECT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  EXPECT_EQ(active, 1);
  EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  EXPECT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  EXPECT_EQ(active, 0);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuDevicePrimaryCtxRelease(0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDevicePrimaryCtxRetain(&a, 4));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDevicePrimaryCtxRetain(nullptr, 0));
  EXPECT_CU(cuCtxSetCurrent(nullptr));
}

TEST_F(ContextTest, PrimaryFlagsAreValidated) {
  EXPECT_CU(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_BLOCKING_SYNC));
  unsigned flags = 0;
  int active = 0;
  EXPECT_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  EXPECT_EQ(flags, static_cast<unsigned>(CU_CTX_SCHED_BLOCKING_SYNC));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDevicePrimaryCtxSetFlags(0, 0x3));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDevicePrimaryCtxSetFlags(0, 0x10000));
  EXPECT_CU(cuDevicePrimaryCtxSetFlags(0, 0));
}

TEST_F(ContextTest, CreatePushPopDestroy) {
  CUcontext a = nullptr, b = nullptr;
  ASSERT_CU(cuCtxCreate(&a, nullptr, 0, 0));
  CUcontext current = nullptr;
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, a);  // "made current to the calling thread"
  ASSERT_CU(cuCtxCreate(&b, nullptr, CU_CTX_SCHED_SPIN, 0));
  EXPECT_NE(a, b);
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, b);
  unsigned flags = 0;
  EXPECT_CU(cuCtxGetFlags(&flags));
  EXPECT_EQ(flags & CU_CTX_SCHED_MASK, static_cast<unsigned>(CU_CTX_SCHED_SPIN));
  CUcontext popped = nullptr;
  EXPECT_CU(cuCtxPopCurrent(&popped));
  EXPECT_EQ(popped, b);
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, a);
  EXPECT_CU(cuCtxPushCurrent(b));
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, b);
  unsigned long long idA = 0, idB = 0;
  EXPECT_CU(cuCtxGetId(a, &idA));
  EXPECT_CU(cuCtxGetId(b, &idB));
  EXPECT_NE(idA, idB);
  unsigned version = 0;
  EXPECT_CU(cuCtxGetApiVersion(a, &version));
  EXPECT_GE(version, 3020u);

  // Destroying the current context pops it.
  EXPECT_CU(cuCtxDestroy(b));
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, a);
  // A destroyed handle stays invalid.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxPushCurrent(b));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxDestroy(b));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetId(b, &idB));
  EXPECT_CU(cuCtxDestroy(a));
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, nullptr);
}

// The deprecated usage counts: cuCtxAttach counts one more user of the
// current context, cuCtxDetach one fewer, destroying it at none.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_F(ContextTest, AttachAndDetachCountAContextsUsers) {
  CUcontext none = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxAttach(&none, 0));
  CUcontext a = nullptr, b = nullptr, attached = nullptr;
  ASSERT_CU(cuCtxCreate(&a, nullptr, 0, 0));
  ASSERT_CU(cuCtxCreate(&b, nullptr, 0, 0));  // b is current
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxAttach(&attached, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxAttach(nullptr, 0));
  ASSERT_CU(cuCtxAttach(&attached, 0));
  EXPECT_EQ(attached, b);
  // Only the current context is detached.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxDetach(a));
  // Two users: the first detach leaves b working, the second destroys it.
  EXPECT_CU(cuCtxDetach(b));
  EXPECT_CU(cuCtxSynchronize());
  CUcontext current = nullptr;
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, b);
  EXPECT_CU(cuCtxDetach(b));
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, a);
  unsigned long long id = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetId(b, &id));
  // The creator's own use: one detach destroys it.
  EXPECT_CU(cuCtxDetach(a));
  EXPECT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, nullptr);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetId(a, &id));
}
#pragma GCC diagnostic pop

TEST_F(ContextTest, CreateRejectsBadArguments) {
  CUcontext c = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxCreate(nullptr, nullptr, 0, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuCtxCreate(&c, nullptr, 0, 9));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxCreate(&c, nullptr, 0x3, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxDestroy(nullptr));
  CUcontext primary = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&primary, 0));
  // A primary context is released, never destroyed.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxDestroy(primary));
  EXPECT_CU(cuDevicePrimaryCtxRelease(0));
}

TEST_F(ContextTest, ContextDestroyedOnAnotherThreadIsReported) {
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  CUresult seen = CUDA_SUCCESS;
  std::thread other([&] {
    EXPECT_CU(cuCtxSetCurrent(c));
    EXPECT_CU(cuCtxSynchronize());
  });
  other.join();
  std::thread second([&] {
    EXPECT_CU(cuCtxSetCurrent(c));
    // The main thread destroys it while it is current here.
    std::thread([&] { EXPECT_CU(cuCtxDestroy(c)); }).join();
    CUdeviceptr p = 0;
    seen = cuMemAlloc(&p, 16);
  });
  second.join();
  EXPECT_EQ(resultName(seen), "CUDA_ERROR_CONTEXT_IS_DESTROYED");
}

TEST_F(ContextTest, LimitsAndCacheConfig) {
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  size_t value = 0;
  EXPECT_CU(cuCtxGetLimit(&value, CU_LIMIT_STACK_SIZE));
  EXPECT_GT(value, 0u);
  EXPECT_CU(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 64 << 20));
  EXPECT_CU(cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE));
  EXPECT_EQ(value, size_t{64} << 20);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxGetLimit(&value, static_cast<CUlimit>(0x77)));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxGetLimit(nullptr, CU_LIMIT_STACK_SIZE));
  int least = 1, greatest = 1;
  EXPECT_CU(cuCtxGetStreamPriorityRange(&least, &greatest));
  EXPECT_EQ(least, 0);
  EXPECT_LT(greatest, 0);
  CUfunc_cache cache{};
  EXPECT_CU(cuCtxGetCacheConfig(&cache));
  EXPECT_CU(cuCtxSetCacheConfig(CU_FUNC_CACHE_PREFER_SHARED));
  EXPECT_CU(cuCtxDestroy(c));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetLimit(&value, CU_LIMIT_STACK_SIZE));
}

// cudaProfilerStart/Stop reach these through cuGetProcAddress; a driver
// without them makes the runtime report cudaErrorCallRequiresNewerDriver.
TEST_F(ContextTest, ProfilerStartAndStopNeedACurrentContextAndChangeNothing) {
  void* start = nullptr;
  CUdriverProcAddressQueryResult found{};
  ASSERT_CU(cuGetProcAddress("cuProfilerStart", &start, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &found));
  EXPECT_EQ(found, CU_GET_PROC_ADDRESS_SUCCESS);
  ASSERT_NE(start, nullptr);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuProfilerStart());
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuProfilerStop());
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  EXPECT_CU(reinterpret_cast<CUresult (*)()>(start)());
  EXPECT_CU(cuProfilerStart());  // already started: no effect
  EXPECT_CU(cuProfilerStop());
  EXPECT_CU(cuProfilerStop());
  // Deprecated: "Starting with CUDA 12.0, it always returns CUDA_ERROR_NOT_SUPPORTED."
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuProfilerInitialize("config", "out", CU_OUT_CSV));
#pragma GCC diagnostic pop
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_CU(cuCtxDestroy(c));
}

// Deprecated shared memory bank sizes: fixed at four bytes, so a setting is
// checked and changes nothing.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_F(ContextTest, SharedMemoryBanksAreFourBytes) {
  CUsharedconfig config = CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetSharedMemConfig(&config));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT,
                cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE));
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  EXPECT_CU(cuCtxGetSharedMemConfig(&config));
  EXPECT_EQ(config, CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE);
  EXPECT_CU(cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE));
  EXPECT_CU(cuCtxGetSharedMemConfig(&config));
  EXPECT_EQ(config, CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxSetSharedMemConfig(static_cast<CUsharedconfig>(3)));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxGetSharedMemConfig(nullptr));
  EXPECT_CU(cuCtxDestroy(c));
}
#pragma GCC diagnostic pop

TEST_F(ContextTest, PeerAccessNeedsTwoDevices) {
  CUcontext a = nullptr, b = nullptr;
  ASSERT_CU(cuCtxCreate(&a, nullptr, 0, 0));
  ASSERT_CU(cuCtxCreate(&b, nullptr, 0, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuCtxEnablePeerAccess(a, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuCtxEnablePeerAccess(a, 1));
  EXPECT_CU_ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, cuCtxDisablePeerAccess(a));
  EXPECT_CU(cuCtxDestroy(b));
  EXPECT_CU(cuCtxDestroy(a));
}

}  // namespace
}  // namespace phos::vgpu::testing
