// SPDX-License-Identifier: Apache-2.0
// The stream-ordered allocator and its memory pools, as an application sees
// them. The same assertions run directly on vgpu (meson suite vgpu) and under
// libphos.so against phosd (tests/python/test_shim_semantics.py), whose pools
// are the session's own: both must answer alike.
#include <cstdlib>
#include <vector>

#include "client_support.h"

namespace phos::shim::testing {
namespace {

// Under the Python harness, every call must go through libphos.so.
const auto* const kUnderPhos =
    std::getenv("PHOS_TEST_SHIM") != nullptr ? ::testing::AddGlobalTestEnvironment(new UnderPhos) : nullptr;

class PoolsTest : public PrimaryContextTest {
 protected:
  void SetUp() override {
    PrimaryContextTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuDeviceGetDefaultMemPool(&default_, device_));
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_CU(cuStreamDestroy(stream_));
    }
    PrimaryContextTest::TearDown();
  }

  cuuint64_t attribute(CUmemoryPool pool, CUmemPool_attribute attr) {
    cuuint64_t v = ~cuuint64_t{0};
    EXPECT_CU(cuMemPoolGetAttribute(pool, attr, &v));
    return v;
  }
  CUmemPoolProps props(size_t maxSize = 0) {
    CUmemPoolProps p{};
    p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device_;
    p.maxSize = maxSize;
    return p;
  }
  CUmemoryPool poolOf(CUdeviceptr p) {
    CUmemoryPool pool = nullptr;
    EXPECT_CU(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
    return pool;
  }

  CUstream stream_ = nullptr;
  CUmemoryPool default_ = nullptr;
};

TEST_F(PoolsTest, TheDefaultPoolIsCurrentAndStays) {
  CUmemoryPool current = nullptr;
  ASSERT_CU(cuDeviceGetMemPool(&current, device_));
  EXPECT_EQ(current, default_);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemPoolDestroy(default_));
  CUmemLocation here{CU_MEM_LOCATION_TYPE_DEVICE, device_};
  CUmemoryPool byLocation = nullptr;
  ASSERT_CU(cuMemGetDefaultMemPool(&byLocation, &here, CU_MEM_ALLOCATION_TYPE_PINNED));
  EXPECT_EQ(byLocation, default_);
  ASSERT_CU(cuMemGetMemPool(&byLocation, &here, CU_MEM_ALLOCATION_TYPE_PINNED));
  EXPECT_EQ(byLocation, default_);
}

TEST_F(PoolsTest, AllocationsAreUsableCountedAndFreedInStreamOrder) {
  const cuuint64_t before = attribute(default_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAllocAsync(&a, 3000, stream_));
  ASSERT_CU(cuMemAllocAsync(&b, 1 << 20, stream_));
  EXPECT_EQ(attribute(default_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), before + 3000 + (1 << 20));
  EXPECT_GE(attribute(default_, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), before + 3000 + (1 << 20));
  EXPECT_EQ(poolOf(a), default_);
  ASSERT_CU(cuMemsetD8Async(a, 0x5a, 3000, stream_));
  ASSERT_CU(cuMemcpyDtoDAsync(b, a, 3000, stream_));
  std::vector<unsigned char> host(3000);
  ASSERT_CU(cuMemcpyDtoHAsync(host.data(), b, host.size(), stream_));
  ASSERT_CU(cuMemFreeAsync(a, stream_));
  ASSERT_CU(cuMemFreeAsync(b, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(host, std::vector<unsigned char>(3000, 0x5a));
  EXPECT_EQ(attribute(default_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), before);
  // The high watermark remembers, and resets to the current value.
  EXPECT_GE(attribute(default_, CU_MEMPOOL_ATTR_USED_MEM_HIGH), before + 3000 + (1 << 20));
  cuuint64_t zero = 0, one = 1;
  ASSERT_CU(cuMemPoolSetAttribute(default_, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  EXPECT_EQ(attribute(default_, CU_MEMPOOL_ATTR_USED_MEM_HIGH), before);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemPoolSetAttribute(default_, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemPoolSetAttribute(default_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero));
}

TEST_F(PoolsTest, AttributesAreKept) {
  CUmemoryPool pool = nullptr;
  CUmemPoolProps p = props();
  ASSERT_CU(cuMemPoolCreate(&pool, &p));
  cuuint64_t threshold = 64u << 20;
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  EXPECT_EQ(attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), threshold);
  int flag = -1;
  ASSERT_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
  EXPECT_EQ(flag, 1);
  flag = 0;
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
  flag = -1;
  ASSERT_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
  EXPECT_EQ(flag, 0);
  EXPECT_CU(cuMemPoolTrimTo(pool, 0));
  ASSERT_CU(cuMemPoolDestroy(pool));
}

TEST_F(PoolsTest, APoolOfItsOwnWithALimit) {
  CUmemoryPool pool = nullptr;
  CUmemPoolProps p = props(1 << 20);
  ASSERT_CU(cuMemPoolCreate(&pool, &p));
  EXPECT_NE(pool, default_);
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&a, 1 << 20, pool, stream_));
  EXPECT_EQ(poolOf(a), pool);
  EXPECT_CU_ERR(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocFromPoolAsync(&b, 4096, pool, stream_));
  ASSERT_CU(cuMemFreeAsync(a, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CU(cuMemAllocFromPoolAsync(&b, 4096, pool, stream_));
  // cuMemFree frees a pool's allocation too.
  ASSERT_CU(cuMemFree(b));
  EXPECT_EQ(attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);
  ASSERT_CU(cuMemPoolDestroy(pool));
}

TEST_F(PoolsTest, TheCurrentPoolServesAllocAsyncUntilDestroyed) {
  CUmemoryPool pool = nullptr;
  CUmemPoolProps p = props();
  ASSERT_CU(cuMemPoolCreate(&pool, &p));
  ASSERT_CU(cuDeviceSetMemPool(device_, pool));
  CUmemoryPool current = nullptr;
  ASSERT_CU(cuDeviceGetMemPool(&current, device_));
  EXPECT_EQ(current, pool);
  CUdeviceptr a = 0;
  ASSERT_CU(cuMemAllocAsync(&a, 4096, stream_));
  EXPECT_EQ(poolOf(a), pool);
  ASSERT_CU(cuMemFreeAsync(a, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  // "Destroying the current mempool of a device sets the default mempool of
  // that device as the current mempool for that device."
  ASSERT_CU(cuMemPoolDestroy(pool));
  ASSERT_CU(cuDeviceGetMemPool(&current, device_));
  EXPECT_EQ(current, default_);
}

TEST_F(PoolsTest, APoolDestroyedWithAllocationsOutstandingKeepsThem) {
  CUmemoryPool pool = nullptr;
  CUmemPoolProps p = props();
  ASSERT_CU(cuMemPoolCreate(&pool, &p));
  CUdeviceptr a = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&a, 8192, pool, stream_));
  ASSERT_CU(cuMemPoolDestroy(pool));
  ASSERT_CU(cuMemsetD32Async(a, 7u, 2048, stream_));
  unsigned last = 0;
  ASSERT_CU(cuMemcpyDtoHAsync(&last, a + 8188, sizeof(last), stream_));
  ASSERT_CU(cuMemFreeAsync(a, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(last, 7u);
}

TEST_F(PoolsTest, MemoryFromCuMemAllocHasNoPool) {
  CUdeviceptr a = 0;
  ASSERT_CU(cuMemAlloc(&a, 4096));
  EXPECT_EQ(poolOf(a), nullptr);
  ASSERT_CU(cuMemFree(a));
  // "If dptr is 0, no operation is performed" (cudaFree(0)).
  EXPECT_CU(cuMemFree(0));
}

TEST_F(PoolsTest, AccessIsTheOwnDevicesReadWrite) {
  CUmemLocation here{CU_MEM_LOCATION_TYPE_DEVICE, device_};
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  ASSERT_CU(cuMemPoolGetAccess(&flags, default_, &here));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CUmemAccessDesc rw{here, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  EXPECT_CU(cuMemPoolSetAccess(default_, &rw, 1));
  CUmemAccessDesc readOnly{here, CU_MEM_ACCESS_FLAGS_PROT_READ};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuMemPoolSetAccess(default_, &readOnly, 1));
}

TEST_F(PoolsTest, WhatIsNotServedIsRefusedByName) {
  CUmemoryPool pool = nullptr;
  CUmemPoolProps p = props();
  p.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // shareable: a file descriptor
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuMemPoolCreate(&pool, &p));
  p = props();
  p.location.type = CU_MEM_LOCATION_TYPE_HOST;
  p.location.id = 0;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuMemPoolCreate(&pool, &p));
  p = props();
  p.location.id = 64;  // no such device
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuMemPoolCreate(&pool, &p));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemPoolCreate(&pool, nullptr));
  CUmemLocation here{CU_MEM_LOCATION_TYPE_DEVICE, device_};
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuMemGetDefaultMemPool(&pool, &here, CU_MEM_ALLOCATION_TYPE_MANAGED));
  CUdeviceptr a = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAllocFromPoolAsync(&a, 4096, nullptr, stream_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemPoolSetAttribute(nullptr, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &a));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFreeAsync(0x1234, stream_));
}

}  // namespace
}  // namespace phos::shim::testing
