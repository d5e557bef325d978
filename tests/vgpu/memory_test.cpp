// SPDX-License-Identifier: Apache-2.0
// vgpu's memory API: allocations, copies and sets in every form, host memory, pointer attributes, VMM.
#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

using MemoryTest = DriverTest;

// Run through phosd by the vgpu_phos_ variant of this test.
bool throughPhos() {
  return std::getenv("PHOS_RUNTIME_DIR") != nullptr;
}

std::vector<std::uint8_t> pattern(size_t n, std::uint8_t seed = 1) {
  std::vector<std::uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 7);
  return v;
}

TEST_F(MemoryTest, AllocCopyRoundTripAndFree) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 4096));
  EXPECT_NE(d, 0u);
  auto in = pattern(4096);
  std::vector<std::uint8_t> out(4096);
  EXPECT_CU(cuMemcpyHtoD(d, in.data(), in.size()));
  EXPECT_CU(cuMemcpyDtoH(out.data(), d, out.size()));
  EXPECT_EQ(in, out);
  CUdeviceptr e = 0;
  ASSERT_CU(cuMemAlloc(&e, 4096));
  EXPECT_CU(cuMemcpyDtoD(e, d, 4096));
  std::fill(out.begin(), out.end(), 0);
  EXPECT_CU(cuMemcpy(reinterpret_cast<CUdeviceptr>(out.data()), e, 4096));  // unified addressing
  EXPECT_EQ(in, out);
  EXPECT_CU(cuMemFree(d));
  EXPECT_CU(cuMemFree(e));
  // Freed memory is no longer a valid copy endpoint, and cannot be freed twice.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(d, in.data(), 16));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFree(d));
}

TEST_F(MemoryTest, AllocRejectsBadArguments) {
  CUdeviceptr d = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(nullptr, 16));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&d, 0));
  size_t total = 0;
  ASSERT_CU(cuDeviceTotalMem(&total, 0));
  EXPECT_CU_ERR(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc(&d, total + 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFree(0x1234));
}

// Null and zero arguments as NVIDIA's driver answers them: freeing 0 or NULL is a
// no-op that succeeds (free(NULL) semantics; cudaFree(0) and cuBLAS rely on it),
// a copy or set of nothing succeeds whatever the pointers, and a zero-byte
// allocation is refused ("If bytesize is 0, cuMemAlloc() returns
// CUDA_ERROR_INVALID_VALUE"). (Unregistering NULL is refused: HostRegistration.)
TEST_F(MemoryTest, NullAndZeroArguments) {
  EXPECT_CU(cuMemFree(0));
  EXPECT_CU(cuMemFreeHost(nullptr));
  CUdeviceptr d = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&d, 0));
  ASSERT_CU(cuMemAlloc(&d, 256));
  std::vector<std::uint8_t> host(256, 0x5a);
  EXPECT_CU(cuMemsetD8(d, 0x11, 0));
  EXPECT_CU(cuMemsetD32(d, 0x22, 0));
  EXPECT_CU(cuMemsetD2D8(d, 16, 0x33, 0, 4));
  EXPECT_CU(cuMemcpyHtoD(d, host.data(), 0));
  EXPECT_CU(cuMemcpyDtoH(nullptr, d, 0));
  EXPECT_CU(cuMemcpyDtoD(d, d, 0));
  EXPECT_CU(cuMemcpy(0, 0, 0));
  EXPECT_CU(cuMemcpyHtoDAsync(d, host.data(), 0, nullptr));
  EXPECT_CU(cuStreamSynchronize(nullptr));
  // None of the empty operations wrote anything.
  std::vector<std::uint8_t> out(256, 0);
  EXPECT_CU(cuMemsetD8(d, 0x44, 256));
  EXPECT_CU(cuMemsetD8(d, 0x11, 0));
  EXPECT_CU(cuMemcpyDtoH(out.data(), d, out.size()));
  EXPECT_EQ(out, std::vector<std::uint8_t>(256, 0x44));
  EXPECT_CU(cuMemFree(d));
  EXPECT_CU(cuMemFree(0));  // still a no-op once the only allocation is gone
}

TEST_F(MemoryTest, CopiesOutsideAnAllocationAreRefused) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 256));
  std::vector<std::uint8_t> host(512);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(d, host.data(), 512));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(host.data(), d + 128, 256));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(d, nullptr, 16));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(host.data()), host.data(), 16));
  EXPECT_CU(cuMemcpyHtoD(d, host.data(), 0));  // nothing to do
  EXPECT_CU(cuMemFree(d));
}

TEST_F(MemoryTest, InfoAndAddressRange) {
  size_t free0 = 0, total = 0;
  EXPECT_CU(cuMemGetInfo(&free0, &total));
  EXPECT_EQ(total, size_t{16} << 30);
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 1 << 20));
  size_t free1 = 0;
  EXPECT_CU(cuMemGetInfo(&free1, &total));
  EXPECT_EQ(free0 - free1, size_t{1} << 20);
  CUdeviceptr base = 0;
  size_t size = 0;
  EXPECT_CU(cuMemGetAddressRange(&base, &size, d + 100));
  EXPECT_EQ(base, d);
  EXPECT_EQ(size, size_t{1} << 20);
  EXPECT_CU(cuMemGetAddressRange(nullptr, &size, d));  // both outputs are optional
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange(&base, &size, d + (1 << 20)));
  EXPECT_CU(cuMemFree(d));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemGetInfo(nullptr, &total));
}

TEST_F(MemoryTest, MemsetsOfEveryWidth) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 1024));
  std::vector<std::uint8_t> b(1024);
  EXPECT_CU(cuMemsetD8(d, 0xab, 1024));
  EXPECT_CU(cuMemcpyDtoH(b.data(), d, 1024));
  EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](std::uint8_t v) { return v == 0xab; }));
  std::vector<std::uint16_t> h(512);
  EXPECT_CU(cuMemsetD16(d, 0x1234, 512));
  EXPECT_CU(cuMemcpyDtoH(h.data(), d, 1024));
  EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](std::uint16_t v) { return v == 0x1234; }));
  std::vector<std::uint32_t> w(256);
  EXPECT_CU(cuMemsetD32(d, 0xdeadbeef, 256));
  EXPECT_CU(cuMemcpyDtoH(w.data(), d, 1024));
  EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](std::uint32_t v) { return v == 0xdeadbeef; }));
  // Misaligned element sets and overruns are refused.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemsetD32(d + 2, 0, 4));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(d, 0, 1025));
  // 2D: 4 rows of 8 elements with a pitch of 64 bytes leave the gaps alone.
  EXPECT_CU(cuMemsetD8(d, 0, 1024));
  EXPECT_CU(cuMemsetD2D32(d, 64, 7, 8, 4));
  EXPECT_CU(cuMemcpyDtoH(w.data(), d, 1024));
  for (int row = 0; row < 4; ++row) {
    for (int i = 0; i < 16; ++i) EXPECT_EQ(w[row * 16 + i], i < 8 ? 7u : 0u) << row << "," << i;
  }
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemsetD2D32(d, 16, 7, 8, 4));  // pitch < row
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_CU(cuMemsetD8Async(d, 0x5a, 1024, s));
  EXPECT_CU(cuMemsetD2D16Async(d, 32, 0x0101, 4, 2, s));
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuMemcpyDtoH(b.data(), d, 1024));
  EXPECT_EQ(b[0], 0x01);
  EXPECT_EQ(b[7], 0x01);
  EXPECT_EQ(b[8], 0x5a);
  EXPECT_EQ(b[32], 0x01);
  EXPECT_EQ(b[64], 0x5a);
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuMemFree(d));
}

TEST_F(MemoryTest, PitchedAllocationAnd2DCopies) {
  CUdeviceptr d = 0;
  size_t pitch = 0;
  ASSERT_CU(cuMemAllocPitch(&d, &pitch, 100, 8, 4));
  EXPECT_GE(pitch, 100u);
  EXPECT_EQ(pitch % 512, 0u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAllocPitch(&d, &pitch, 100, 8, 3));

  // Host 100x8 (tight) -> device pitched -> host with a 128-byte pitch.
  auto src = pattern(100 * 8);
  CUDA_MEMCPY2D up{};
  up.srcMemoryType = CU_MEMORYTYPE_HOST;
  up.srcHost = src.data();
  up.srcPitch = 100;
  up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  up.dstDevice = d;
  up.dstPitch = pitch;
  up.WidthInBytes = 100;
  up.Height = 8;
  EXPECT_CU(cuMemcpy2D(&up));
  std::vector<std::uint8_t> dst(128 * 8, 0xee);
  CUDA_MEMCPY2D down{};
  down.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  down.srcDevice = d;
  down.srcPitch = pitch;
  down.dstMemoryType = CU_MEMORYTYPE_HOST;
  down.dstHost = dst.data();
  down.dstPitch = 128;
  down.WidthInBytes = 100;
  down.Height = 8;
  EXPECT_CU(cuMemcpy2DUnaligned(&down));
  for (int row = 0; row < 8; ++row) {
    for (int i = 0; i < 128; ++i) {
      EXPECT_EQ(dst[row * 128 + i], i < 100 ? src[row * 100 + i] : 0xee) << row << "," << i;
    }
  }
  // Async, with an offset: copy the 50x2 block at (10, 3) of the device image.
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  std::vector<std::uint8_t> block(50 * 2);
  CUDA_MEMCPY2D part = down;
  part.srcXInBytes = 10;
  part.srcY = 3;
  part.dstHost = block.data();
  part.dstPitch = 50;
  part.WidthInBytes = 50;
  part.Height = 2;
  EXPECT_CU(cuMemcpy2DAsync(&part, s));
  EXPECT_CU(cuStreamSynchronize(s));
  for (int row = 0; row < 2; ++row) {
    for (int i = 0; i < 50; ++i) EXPECT_EQ(block[row * 50 + i], src[(3 + row) * 100 + 10 + i]);
  }
  // A pitch smaller than the row is invalid, and so is an array side without its array.
  CUDA_MEMCPY2D bad = up;
  bad.srcPitch = 50;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy2D(&bad));
  bad = up;
  bad.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy2D(&bad));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy2D(nullptr));
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuMemFree(d));
}

TEST_F(MemoryTest, ThreeDimensionalCopy) {
  // A 4x3x2 box of 16-byte rows out of an 8x5x3 host volume with 32-byte pitch.
  const size_t pitch = 32, height = 5, depth = 3;
  auto volume = pattern(pitch * height * depth, 9);
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 16 * 3 * 2));
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = volume.data();
  c.srcXInBytes = 8;
  c.srcY = 1;
  c.srcZ = 1;
  c.srcPitch = pitch;
  c.srcHeight = height;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = d;
  c.dstPitch = 16;
  c.dstHeight = 3;
  c.WidthInBytes = 16;
  c.Height = 3;
  c.Depth = 2;
  EXPECT_CU(cuMemcpy3D(&c));
  std::vector<std::uint8_t> out(16 * 3 * 2);
  EXPECT_CU(cuMemcpyDtoH(out.data(), d, out.size()));
  for (size_t z = 0; z < 2; ++z) {
    for (size_t y = 0; y < 3; ++y) {
      for (size_t x = 0; x < 16; ++x) {
        EXPECT_EQ(out[(z * 3 + y) * 16 + x], volume[((1 + z) * height + 1 + y) * pitch + 8 + x]);
      }
    }
  }
  CUDA_MEMCPY3D bad = c;
  bad.srcLOD = 1;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy3D(&bad));
  bad = c;
  bad.dstHeight = 2;  // smaller than Height with Depth > 1
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy3D(&bad));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  EXPECT_CU(cuMemcpy3DAsync(&c, s));
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuMemFree(d));
}

TEST_F(MemoryTest, PinnedHostMemoryAndAsyncCopies) {
  void* pinned = nullptr;
  ASSERT_CU(cuMemHostAlloc(&pinned, 8192, CU_MEMHOSTALLOC_DEVICEMAP));
  unsigned flags = 0;
  EXPECT_CU(cuMemHostGetFlags(&flags, pinned));
  EXPECT_TRUE(flags & CU_MEMHOSTALLOC_DEVICEMAP);
  CUdeviceptr mapped = 0;
  EXPECT_CU(cuMemHostGetDevicePointer(&mapped, pinned, 0));
  EXPECT_EQ(mapped, reinterpret_cast<CUdeviceptr>(pinned));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemHostGetDevicePointer(&mapped, pinned, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemHostAlloc(&pinned, 16, 0x80));

  auto data = pattern(8192, 3);
  std::memcpy(pinned, data.data(), data.size());
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 8192));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_CU(cuMemcpyHtoDAsync(d, pinned, 8192, s));
  EXPECT_CU(cuStreamSynchronize(s));
  void* back = nullptr;
  ASSERT_CU(cuMemAllocHost(&back, 8192));
  EXPECT_CU(cuMemcpyDtoHAsync(back, d, 8192, s));
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(std::memcmp(back, data.data(), 8192), 0);
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuMemFreeHost(back));
  EXPECT_CU(cuMemFreeHost(pinned));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(pinned));
  EXPECT_CU(cuMemFree(d));
}

TEST_F(MemoryTest, HostRegistration) {
  const size_t size = 4 * 4096;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_CU(cuMemHostRegister(p, size, CU_MEMHOSTREGISTER_DEVICEMAP));
  EXPECT_CU_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister(p, 4096, 0));
  CUdeviceptr mapped = 0;
  EXPECT_CU(cuMemHostGetDevicePointer(&mapped, p, 0));
  EXPECT_EQ(mapped, reinterpret_cast<CUdeviceptr>(p));
  unsigned type = 0;
  EXPECT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, mapped));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
  EXPECT_CU(cuMemHostUnregister(p));
  EXPECT_CU_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(p));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemHostRegister(nullptr, size, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemHostUnregister(nullptr));  // as NVIDIA's driver
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemHostRegister(p, size, 0x100));
  // A registration ends with the context it was made in: the pages stay the
  // program's, with their bytes, copies read them as any other host memory,
  // and they may be registered again.
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, 0));
  std::memset(p, 0x5a, size);
  EXPECT_CU(cuMemHostRegister(p, size, 0));
  ASSERT_CU(cuCtxDestroy(other));
  ASSERT_CU(cuCtxSetCurrent(context_));
  auto* bytes = static_cast<std::uint8_t*>(p);
  EXPECT_EQ(bytes[0], 0x5a);
  EXPECT_EQ(bytes[size - 1], 0x5a);
  bytes[7] = 7;
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, size));
  EXPECT_CU(cuMemcpyHtoD(d, p, size));
  std::vector<std::uint8_t> back(size);
  EXPECT_CU(cuMemcpyDtoH(back.data(), d, size));
  EXPECT_EQ(back[7], 7);
  EXPECT_EQ(back[size - 1], 0x5a);
  EXPECT_CU_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(p));
  EXPECT_CU(cuMemHostRegister(p, size, 0));
  EXPECT_CU(cuMemHostUnregister(p));
  EXPECT_CU(cuMemFree(d));
  munmap(p, size);
}

TEST_F(MemoryTest, PointerAttributes) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 1000));
  unsigned type = 0;
  EXPECT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 10));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  CUcontext owner = nullptr;
  EXPECT_CU(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d));
  EXPECT_EQ(owner, context_);
  int ordinal = -1;
  EXPECT_CU(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d));
  EXPECT_EQ(ordinal, 0);
  CUdeviceptr start = 0;
  size_t size = 0;
  EXPECT_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 500));
  EXPECT_CU(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 500));
  EXPECT_EQ(start, d);
  EXPECT_EQ(size, 1000u);
  unsigned long long id1 = 0, id2 = 0;
  CUdeviceptr e = 0;
  ASSERT_CU(cuMemAlloc(&e, 16));
  EXPECT_CU(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, d));
  EXPECT_CU(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, e));
  EXPECT_NE(id1, id2);
  // Unknown memory: an error from the single query, NULL values from the batch.
  int local = 0;
  auto host = reinterpret_cast<CUdeviceptr>(&local);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, host));
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED};
  unsigned t = 99;
  CUcontext ctx = reinterpret_cast<CUcontext>(0x1);
  int managed = 5;
  void* values[] = {&t, &ctx, &managed};
  EXPECT_CU(cuPointerGetAttributes(3, attrs, values, host));
  EXPECT_EQ(t, 0u);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_EQ(managed, 0);
  EXPECT_CU(cuPointerGetAttributes(3, attrs, values, e));
  EXPECT_EQ(t, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(ctx, context_);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuPointerGetAttribute(nullptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuPointerGetAttribute(&type, static_cast<CUpointer_attribute>(999), d));
  int sync = 1;
  EXPECT_CU(cuPointerSetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d));
  EXPECT_CU(cuMemFree(d));
  EXPECT_CU(cuMemFree(e));
}

// Managed memory: the host dereferences it, the driver's copies and memsets
// see what the host wrote, pointer and device attributes say so, and advice
// and prefetches are kept page by page for the range queries.
TEST_F(MemoryTest, ManagedMemoryIsSharedWithTheHostAndKeepsItsAdvice) {
  int managed = 0, concurrent = 0;
  EXPECT_CU(cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, device_));
  EXPECT_CU(
      cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, device_));
  EXPECT_EQ(managed, 1);
  EXPECT_EQ(concurrent, 1);
  CUdeviceptr m = 0, plain = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&m, 4096, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_SINGLE));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&m, 0, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(nullptr, 4096, CU_MEM_ATTACH_GLOBAL));
  constexpr size_t kBytes = 4 * 4096;
  ASSERT_CU(cuMemAllocManaged(&m, kBytes, CU_MEM_ATTACH_GLOBAL));
  ASSERT_CU(cuMemAlloc(&plain, 4096));
  auto* host = reinterpret_cast<unsigned*>(m);
  for (size_t i = 0; i < kBytes / 4; ++i) host[i] = static_cast<unsigned>(i * 7);
  std::vector<unsigned> back(kBytes / 4);
  ASSERT_CU(cuMemcpyDtoH(back.data(), m, kBytes));
  EXPECT_EQ(back[1000], 7000u);
  ASSERT_CU(cuMemsetD32(m + 4096, 0xabcdef01u, 1024));
  EXPECT_EQ(host[1024], 0xabcdef01u);
  EXPECT_EQ(host[1023], 1023u * 7);

  int isManaged = 0;
  unsigned type = 0;
  EXPECT_CU(cuPointerGetAttribute(&isManaged, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 100));
  EXPECT_EQ(isManaged, 1);
  EXPECT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_CU(cuPointerGetAttribute(&isManaged, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain));
  EXPECT_EQ(isManaged, 0);

  auto attribute = [&](CUmem_range_attribute a, CUdeviceptr p, size_t n) {
    int v = 12345;
    EXPECT_CU(cuMemRangeGetAttribute(&v, sizeof v, a, p, n));
    return v;
  };
  const CUmemLocation dev0{CU_MEM_LOCATION_TYPE_DEVICE, 0}, hostLoc{CU_MEM_LOCATION_TYPE_HOST, 0};
  // Nothing advised yet.
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, kBytes), 0);
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, kBytes), CU_DEVICE_INVALID);
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, kBytes), CU_DEVICE_INVALID);
  // Read-mostly on the second page only (the range is rounded out to pages).
  EXPECT_CU(cuMemAdvise(m + 4096 + 8, 16, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0));
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m + 4096, 4096), 1);
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, kBytes), 0);
  EXPECT_CU(cuMemAdvise(m, kBytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev0));
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, kBytes), 0);
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, m, kBytes),
            CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID, m, kBytes), 0);
  EXPECT_CU(cuMemAdvise(m, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, hostLoc));
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, 4096), CU_DEVICE_CPU);
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, kBytes), CU_DEVICE_INVALID);
  EXPECT_CU(cuMemAdvise(m, kBytes, CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, dev0));
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, m, kBytes),
            CU_MEM_LOCATION_TYPE_INVALID);
  // Accessed by device 0 and the host: listed, the rest CU_DEVICE_INVALID.
  EXPECT_CU(cuMemAdvise(m, kBytes, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0));
  EXPECT_CU(cuMemAdvise(m, kBytes, CU_MEM_ADVISE_SET_ACCESSED_BY, hostLoc));
  int accessedBy[3] = {7, 7, 7};
  EXPECT_CU(cuMemRangeGetAttribute(accessedBy, sizeof accessedBy,
                                   CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, m, kBytes));
  EXPECT_EQ(accessedBy[0], 0);
  EXPECT_EQ(accessedBy[1], CU_DEVICE_CPU);
  EXPECT_EQ(accessedBy[2], CU_DEVICE_INVALID);
  EXPECT_CU(cuMemAdvise(m, 4096, CU_MEM_ADVISE_UNSET_ACCESSED_BY, hostLoc));
  EXPECT_CU(cuMemRangeGetAttribute(accessedBy, sizeof accessedBy,
                                   CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, m, kBytes));
  EXPECT_EQ(accessedBy[1], CU_DEVICE_INVALID);
  // Prefetches: the last location asked, where every page shares it.
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_CU(cuMemPrefetchAsync(m, kBytes, hostLoc, 0, s));
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, kBytes), CU_DEVICE_CPU);
  EXPECT_CU(cuMemPrefetchAsync(m, 2 * 4096, dev0, 0, s));
  EXPECT_EQ(attribute(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, kBytes), CU_DEVICE_INVALID);
  CUmem_range_attribute asks[] = {CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE,
                                  CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID};
  CUmemLocationType lastType = CU_MEM_LOCATION_TYPE_INVALID;
  int lastId = -1;
  void* answers[] = {&lastType, &lastId};
  size_t sizes[] = {sizeof lastType, sizeof lastId};
  EXPECT_CU(cuMemRangeGetAttributes(answers, sizes, asks, 2, m, 2 * 4096));
  EXPECT_EQ(lastType, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(lastId, 0);

  // Refused: what is not managed memory, flags, sizes and locations the
  // documentation rules out.
  int v = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync(plain, 4096, dev0, 0, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuMemAdvise(plain, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0));
  EXPECT_CU_ERR(
      CUDA_ERROR_INVALID_VALUE,
      cuMemRangeGetAttribute(&v, sizeof v, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, plain, 4096));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync(m, kBytes + 1, dev0, 0, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync(m, kBytes, dev0, 1, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE,
                cuMemPrefetchAsync(m, kBytes, CUmemLocation{CU_MEM_LOCATION_TYPE_DEVICE, 7}, 0, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuMemAdvise(m, kBytes, CU_MEM_ADVISE_SET_ACCESSED_BY,
                            CUmemLocation{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuMemAdvise(m, kBytes, static_cast<CUmem_advise>(99), dev0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuMemRangeGetAttribute(&v, 8, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, kBytes));
  EXPECT_CU_ERR(
      CUDA_ERROR_INVALID_VALUE,
      cuMemRangeGetAttribute(accessedBy, 6, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, m, kBytes));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuMemRangeGetAttribute(&v, sizeof v, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 0));

  // Attached: the whole allocation, to a created stream singly.
  EXPECT_CU(cuStreamAttachMemAsync(s, m, 0, CU_MEM_ATTACH_SINGLE));
  EXPECT_CU(cuStreamAttachMemAsync(s, m, kBytes, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamAttachMemAsync(s, m, 4096, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamAttachMemAsync(nullptr, m, 0, CU_MEM_ATTACH_SINGLE));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamAttachMemAsync(s, plain, 0, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamAttachMemAsync(s, m, 0, 8));
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuStreamDestroy(s));

  // Freed as device memory is; its advice goes with it.
  EXPECT_CU(cuMemFree(m));
  EXPECT_CU_ERR(
      CUDA_ERROR_INVALID_VALUE,
      cuMemRangeGetAttribute(&v, sizeof v, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, kBytes));
  EXPECT_CU(cuMemFree(plain));
}

TEST_F(MemoryTest, AllocationsDieWithTheirContext) {
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, 0));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 64));
  ASSERT_CU(cuCtxDestroy(other));  // pops it; context_ is current again
  std::vector<std::uint8_t> host(64);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(host.data(), d, 64));
}

TEST_F(MemoryTest, StreamOrderedAllocation) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAllocAsync(&d, 256, s));
  EXPECT_CU(cuMemsetD8Async(d, 1, 256, s));
  EXPECT_CU(cuMemFreeAsync(d, s));
  EXPECT_CU(cuStreamSynchronize(s));
  std::vector<std::uint8_t> host(16);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(host.data(), d, 16));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemFreeAsync(d, s));
  EXPECT_CU(cuStreamDestroy(s));
}

// Reserve (at `want`, a hint; 0 for none), create, map, grant, copy, retain,
// release, unmap and free, with what each refuses on the way.
void reserveMapAndRelease(CUdeviceptr want) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t granularity = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(granularity, size_t{2} << 20);
  const size_t size = 2 * granularity;
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, size, 0, want, 0));
  if (want != 0) {
    EXPECT_EQ(va, want);  // the requested address, honoured
  }
  EXPECT_EQ(va % granularity, 0u);
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_CU(cuMemCreate(&handle, size, &prop, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&handle, size + 1, &prop, 0));
  ASSERT_CU(cuMemMap(va, size, 0, handle, 0));
  // Mapped but not yet accessible.
  std::vector<std::uint8_t> host = pattern(4096);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(va, host.data(), host.size()));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_CU(cuMemSetAccess(va, size, &access, 1));
  unsigned long long flags = 0;
  EXPECT_CU(cuMemGetAccess(&flags, &prop.location, va));
  EXPECT_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  EXPECT_CU(cuMemcpyHtoD(va + granularity, host.data(), host.size()));
  std::vector<std::uint8_t> out(4096);
  EXPECT_CU(cuMemcpyDtoH(out.data(), va + granularity, out.size()));
  EXPECT_EQ(out, host);
  CUmemGenericAllocationHandle retained = 0;
  EXPECT_CU(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va)));
  EXPECT_EQ(retained, handle);
  EXPECT_CU(cuMemRelease(retained));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, size));  // still mapped
  EXPECT_CU(cuMemUnmap(va, size));
  EXPECT_CU(cuMemRelease(handle));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemRelease(handle));
  EXPECT_CU(cuMemAddressFree(va, size));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, 4096, 0, 0, 0));
}

TEST_F(MemoryTest, A3DPeerCopyMovesABoxBetweenContexts) {
  // A 16 x 4 x 2 box of bytes from a pitched volume in one context to another's.
  CUcontext first = nullptr, second = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&first));
  ASSERT_CU(cuCtxCreate(&second, nullptr, 0, 0));
  CUdeviceptr dst = 0;
  ASSERT_CU(cuMemAlloc(&dst, 16 * 4 * 2));
  ASSERT_CU(cuCtxSetCurrent(first));
  constexpr size_t kPitch = 64, kHeight = 8, kDepth = 3;
  CUdeviceptr src = 0;
  ASSERT_CU(cuMemAlloc(&src, kPitch * kHeight * kDepth));
  std::vector<std::uint8_t> volume = pattern(kPitch * kHeight * kDepth);
  ASSERT_CU(cuMemcpyHtoD(src, volume.data(), volume.size()));
  CUDA_MEMCPY3D_PEER p{};
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = src;
  p.srcContext = first;
  p.srcXInBytes = 8;
  p.srcY = 2;
  p.srcZ = 1;
  p.srcPitch = kPitch;
  p.srcHeight = kHeight;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = dst;
  p.dstContext = second;
  p.dstPitch = 16;
  p.dstHeight = 4;
  p.WidthInBytes = 16;
  p.Height = 4;
  p.Depth = 2;
  ASSERT_CU(cuMemcpy3DPeer(&p));
  std::vector<std::uint8_t> out(16 * 4 * 2), want;
  for (size_t z = 0; z < 2; ++z) {
    for (size_t y = 0; y < 4; ++y) {
      for (size_t x = 0; x < 16; ++x) {
        want.push_back(volume[((z + 1) * kHeight + y + 2) * kPitch + x + 8]);
      }
    }
  }
  ASSERT_CU(cuMemcpyDtoH(out.data(), dst, out.size()));
  EXPECT_EQ(out, want);
  // Asynchronously, on a stream: back the other way.
  std::swap(p.srcContext, p.dstContext);
  std::swap(p.srcDevice, p.dstDevice);
  std::swap(p.srcPitch, p.dstPitch);
  std::swap(p.srcHeight, p.dstHeight);
  std::swap(p.srcXInBytes, p.dstXInBytes);
  std::swap(p.srcY, p.dstY);
  std::swap(p.srcZ, p.dstZ);
  ASSERT_CU(cuMemsetD8(src, 0, volume.size()));
  ASSERT_CU(cuMemcpy3DPeerAsync(&p, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  std::vector<std::uint8_t> back(volume.size());
  ASSERT_CU(cuMemcpyDtoH(back.data(), src, back.size()));
  EXPECT_EQ(back[(1 * kHeight + 2) * kPitch + 8], want[0]);
  EXPECT_EQ(back[0], 0);
  ASSERT_CU(cuMemFree(src));
  ASSERT_CU(cuCtxDestroy(second));
  ASSERT_CU(cuCtxSetCurrent(first));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuMemcpy3DPeer(&p));  // a destroyed context
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy3DPeer(nullptr));
}

TEST_F(MemoryTest, VirtualMemoryManagementAtAFixedAddress) {
  reserveMapAndRelease(0x310000000000ull);
}

TEST_F(MemoryTest, VirtualMemoryManagementWhereTheDriverChooses) {
  reserveMapAndRelease(0);
}

TEST_F(MemoryTest, DefaultMemoryPool) {
  CUmemoryPool pool = nullptr, same = nullptr;
  ASSERT_CU(cuDeviceGetDefaultMemPool(&pool, 0));
  ASSERT_CU(cuDeviceGetMemPool(&same, 0));
  EXPECT_EQ(pool, same);
  EXPECT_CU(cuDeviceSetMemPool(0, pool));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceSetMemPool(0, reinterpret_cast<CUmemoryPool>(0x5)));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetDefaultMemPool(&pool, 3));
  cuuint64_t threshold = 1 << 30;
  EXPECT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  threshold = 0;
  EXPECT_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  EXPECT_EQ(threshold, cuuint64_t{1} << 30);
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&d, 1 << 20, pool, s));
  cuuint64_t used = 0;
  EXPECT_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
  EXPECT_GE(used, cuuint64_t{1} << 20);
  EXPECT_CU(cuMemsetD8Async(d, 3, 1 << 20, s));
  EXPECT_CU(cuMemFreeAsync(d, s));
  EXPECT_CU(cuMemPoolTrimTo(pool, 0));
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuStreamDestroy(s));
}

}  // namespace
// CUDA arrays: created from descriptors vgpu can hold, copied to and from in
// 1D, 2D and 3D, and sampled by texture and surface objects (whose kernels
// tests/cudart/programs/textures.cu and the engine's semantics tests run).
TEST_F(MemoryTest, ArraysCopiesAndTextureObjects) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = 8;
  d.Height = 4;
  d.Depth = 2;
  d.Format = CU_AD_FORMAT_UNSIGNED_INT16;
  d.NumChannels = 2;
  d.Flags = CUDA_ARRAY3D_SURFACE_LDST;
  CUarray a = nullptr;
  ASSERT_CU(cuArray3DCreate(&a, &d));
  CUDA_ARRAY3D_DESCRIPTOR got{};
  ASSERT_CU(cuArray3DGetDescriptor(&got, a));
  EXPECT_EQ(got.Width, 8u);
  EXPECT_EQ(got.Depth, 2u);
  EXPECT_EQ(got.Flags, static_cast<unsigned>(CUDA_ARRAY3D_SURFACE_LDST));
  // 8 x 4 x 2 texels of 4 bytes: 256 bytes, filled in 1D and read back in 3D.
  auto bytes = pattern(256);
  ASSERT_CU(cuMemcpyHtoA(a, 0, bytes.data(), bytes.size()));
  std::vector<std::uint8_t> back(256);
  CUDA_MEMCPY3D down{};
  down.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  down.srcArray = a;
  down.dstMemoryType = CU_MEMORYTYPE_HOST;
  down.dstHost = back.data();
  down.dstPitch = 32;
  down.dstHeight = 4;
  down.WidthInBytes = 32;
  down.Height = 4;
  down.Depth = 2;
  ASSERT_CU(cuMemcpy3D(&down));
  EXPECT_EQ(back, bytes);
  // Array to array and to device memory, then back to the host.
  CUarray b = nullptr;
  ASSERT_CU(cuArray3DCreate(&b, &d));
  ASSERT_CU(cuMemcpyAtoA(b, 16, a, 0, 64));
  CUdeviceptr dev = 0;
  ASSERT_CU(cuMemAlloc(&dev, 64));
  ASSERT_CU(cuMemcpyAtoD(dev, b, 16, 64));
  std::vector<std::uint8_t> part(64);
  ASSERT_CU(cuMemcpyDtoH(part.data(), dev, 64));
  EXPECT_TRUE(std::equal(part.begin(), part.end(), bytes.begin()));
  ASSERT_CU(cuMemcpyAtoH(part.data(), a, 192, 64));
  EXPECT_TRUE(std::equal(part.begin(), part.end(), bytes.begin() + 192));
  // Outside the array: refused, naming the sizes; a size far past it too
  // (phosd stages no more than the array holds).
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoA(a, 200, bytes.data(), 64));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoA(a, 0, bytes.data(), size_t{1} << 40));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyAtoH(bytes.data(), a, 0, size_t{1} << 40));
  down.Depth = 3;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy3D(&down));

  // Texture and surface objects keep their descriptions.
  CUDA_RESOURCE_DESC res{};
  res.resType = CU_RESOURCE_TYPE_ARRAY;
  res.res.array.hArray = a;
  CUDA_TEXTURE_DESC tex{};
  tex.addressMode[0] = CU_TR_ADDRESS_MODE_MIRROR;
  tex.filterMode = CU_TR_FILTER_MODE_LINEAR;
  tex.flags = CU_TRSF_NORMALIZED_COORDINATES;
  CUtexObject t = 0;
  ASSERT_CU(cuTexObjectCreate(&t, &res, &tex, nullptr));
  CUDA_TEXTURE_DESC texBack{};
  ASSERT_CU(cuTexObjectGetTextureDesc(&texBack, t));
  EXPECT_EQ(texBack.addressMode[0], CU_TR_ADDRESS_MODE_MIRROR);
  CUDA_RESOURCE_DESC resBack{};
  ASSERT_CU(cuTexObjectGetResourceDesc(&resBack, t));
  EXPECT_EQ(resBack.res.array.hArray, a);
  // No resource view was set (vgpu refuses them): "CUDA_ERROR_INVALID_VALUE is returned".
  CUDA_RESOURCE_VIEW_DESC view{};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuTexObjectGetResourceViewDesc(&view, t));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuTexObjectGetResourceViewDesc(nullptr, t));
  CUsurfObject s = 0;
  ASSERT_CU(cuSurfObjectCreate(&s, &res));
  ASSERT_CU(cuSurfObjectGetResourceDesc(&resBack, s));
  // Handles are slots, small integers from 1 with the lowest free one given
  // out first: a process that makes its objects again in their order of
  // handles gets the same ones (PhOS's restore, docs/remoting.md).
  CUtexObject t2 = 0, again = 0;
  ASSERT_CU(cuTexObjectCreate(&t2, &res, &tex, nullptr));
  EXPECT_GE(t, 1u);
  EXPECT_LT(t2, 64u);
  EXPECT_NE(t2, t);
  ASSERT_CU(cuTexObjectDestroy(t2));
  ASSERT_CU(cuTexObjectCreate(&again, &res, &tex, nullptr));
  EXPECT_EQ(again, t2);
  ASSERT_CU(cuTexObjectDestroy(again));

  // What vgpu cannot hold or sample is refused, naming it; bad handles too.
  CUDA_ARRAY3D_DESCRIPTOR odd = d;
  odd.NumChannels = 3;
  CUarray none = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuArray3DCreate(&none, &odd));
  odd = d;
  odd.Flags = CUDA_ARRAY3D_LAYERED;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuArray3DCreate(&none, &odd));
  odd.Flags = CUDA_ARRAY3D_SPARSE;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuArray3DCreate(&none, &odd));
  odd = d;
  odd.Format = CU_AD_FORMAT_BC1_UNORM;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuArray3DCreate(&none, &odd));
  CUDA_ARRAY_DESCRIPTOR plain{};
  plain.Width = 16;
  plain.Format = CU_AD_FORMAT_FLOAT;
  plain.NumChannels = 1;
  CUarray noSurface = nullptr;
  ASSERT_CU(cuArrayCreate(&noSurface, &plain));
  res.res.array.hArray = noSurface;
  CUsurfObject s2 = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuSurfObjectCreate(&s2, &res));
  CUDA_RESOURCE_VIEW_DESC viewDesc{};
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuTexObjectCreate(&t, &res, &tex, &viewDesc));
  tex.flags |= CU_TRSF_SRGB;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuTexObjectCreate(&t, &res, &tex, nullptr));
  res.resType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
  tex.flags = 0;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuTexObjectCreate(&t, &res, &tex, nullptr));

  // Linear memory that is no allocation: vgpu takes it (as a GPU would, its
  // reads fault); phosd refuses it, since a restore could not give that
  // memory back to the object. A handle that names no object is refused.
  res.resType = CU_RESOURCE_TYPE_LINEAR;
  res.res.linear.devPtr = dev + (1ull << 40);
  res.res.linear.format = CU_AD_FORMAT_FLOAT;
  res.res.linear.numChannels = 1;
  res.res.linear.sizeInBytes = 64;
  tex.filterMode = CU_TR_FILTER_MODE_POINT;
  if (throughPhos()) {
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuTexObjectCreate(&t2, &res, &tex, nullptr));
  } else {
    ASSERT_CU(cuTexObjectCreate(&t2, &res, &tex, nullptr));
    ASSERT_CU(cuTexObjectDestroy(t2));
  }
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuTexObjectDestroy(t + 1000));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuSurfObjectDestroy(s + 1000));

  ASSERT_CU(cuSurfObjectDestroy(s));
  ASSERT_CU(cuTexObjectDestroy(t));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuTexObjectDestroy(t));
  ASSERT_CU(cuArrayDestroy(a));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuArrayDestroy(a));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuArray3DGetDescriptor(&got, a));
  ASSERT_CU(cuArrayDestroy(b));
  ASSERT_CU(cuArrayDestroy(noSurface));
  ASSERT_CU(cuMemFree(dev));
}

// Batched copies, prefetches and discards (CUDA 12.8): each operation as the
// single call it batches, in stream order; a source read "during the API call"
// is read when the call returns; the legacy stream and malformed attribute
// groups are refused; the first revision names the failing copy.
TEST_F(MemoryTest, BatchedCopiesPrefetchesAndDiscards) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  auto src = pattern(4096, 3);
  std::vector<std::uint8_t> back(4096, 0);
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc(&a, 4096));
  ASSERT_CU(cuMemAlloc(&b, 4096));
  {
    // The host source lives in this scope only: read before the call returns.
    std::vector<std::uint8_t> ephemeral = src;
    CUdeviceptr dsts[3] = {a, b, reinterpret_cast<CUdeviceptr>(back.data())};
    CUdeviceptr srcs[3] = {reinterpret_cast<CUdeviceptr>(ephemeral.data()), a, b};
    size_t sizes[3] = {4096, 4096, 4096};
    CUmemcpyAttributes attrs[2]{};
    attrs[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    attrs[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attrs[1].flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
    size_t firsts[2] = {0, 1};
    ASSERT_CU(cuMemcpyBatchAsync(dsts, srcs, sizes, 3, attrs, firsts, 2, s));
    std::fill(ephemeral.begin(), ephemeral.end(), 0);
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(back, src);
    // Refused: the legacy stream, groups that do not start at 0 or do not
    // grow, an access order of none.
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                  cuMemcpyBatchAsync(dsts, srcs, sizes, 3, attrs, firsts, 2, nullptr));
    size_t late[2] = {1, 2};
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                  cuMemcpyBatchAsync(dsts, srcs, sizes, 3, attrs, late, 2, s));
    size_t same[2] = {0, 0};
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                  cuMemcpyBatchAsync(dsts, srcs, sizes, 3, attrs, same, 2, s));
    attrs[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID;
    using V1 = CUresult (*)(CUdeviceptr*, CUdeviceptr*, size_t*, size_t, CUmemcpyAttributes*,
                            size_t*, size_t, size_t*, CUstream);
    auto v1 = reinterpret_cast<V1>(dlsym(RTLD_DEFAULT, "cuMemcpyBatchAsync"));
    ASSERT_NE(v1, nullptr);
    size_t failed = 0;
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, v1(dsts, srcs, sizes, 3, attrs, firsts, 2, &failed, s));
    EXPECT_EQ(failed, 1u);
  }
  // 3D: a 16 x 4 byte rectangle out of rows of 64 bytes, between pointers.
  CUDA_MEMCPY3D_BATCH_OP op{};
  op.src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  op.src.op.ptr.ptr = a + 64 + 8;
  op.src.op.ptr.rowLength = 64;
  op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  std::vector<std::uint8_t> rect(64, 0);
  op.dst.op.ptr.ptr = reinterpret_cast<CUdeviceptr>(rect.data());
  op.extent = {16, 4, 1};
  op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  ASSERT_CU(cuMemcpy3DBatchAsync(1, &op, 0, s));
  ASSERT_CU(cuStreamSynchronize(s));
  for (int row = 0; row < 4; ++row) {
    for (int i = 0; i < 16; ++i) EXPECT_EQ(rect[row * 16 + i], src[(1 + row) * 64 + 8 + i]);
  }
  op.extent.depth = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy3DBatchAsync(1, &op, 0, s));
  op.extent.depth = 1;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpy3DBatchAsync(1, &op, 1, s));  // flags must be 0
  if (!throughPhos()) {
    // Into and out of an array: offsets and extents in its texels (8 bytes).
    CUDA_ARRAY3D_DESCRIPTOR d{};
    d.Width = 8;
    d.Height = 4;
    d.Format = CU_AD_FORMAT_FLOAT;
    d.NumChannels = 2;
    CUarray arr = nullptr;
    ASSERT_CU(cuArray3DCreate(&arr, &d));
    CUDA_MEMCPY3D_BATCH_OP in{}, out{};
    in.src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    in.src.op.ptr.ptr = reinterpret_cast<CUdeviceptr>(src.data());
    in.dst.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
    in.dst.op.array.array = arr;
    in.dst.op.array.offset = {2, 1, 0};
    in.extent = {4, 2, 1};
    in.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    out = in;
    std::swap(out.src, out.dst);
    std::vector<std::uint8_t> round(64, 0);
    out.dst.op.ptr.ptr = reinterpret_cast<CUdeviceptr>(round.data());
    out.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    CUDA_MEMCPY3D_BATCH_OP both[2] = {in, out};
    ASSERT_CU(cuMemcpy3DBatchAsync(1, &both[0], 0, s));
    ASSERT_CU(cuMemcpy3DBatchAsync(1, &both[1], 0, s));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_TRUE(std::equal(round.begin(), round.end(), src.begin()));
    std::vector<std::uint8_t> whole(256, 0);
    ASSERT_CU(cuMemcpyAtoH(whole.data(), arr, 0, 256));
    EXPECT_TRUE(std::equal(whole.begin() + 64 + 16, whole.begin() + 64 + 48, src.begin()));
    ASSERT_CU(cuArrayDestroy(arr));
  }
  // Managed memory: prefetched and discarded in batches; device memory refused.
  CUdeviceptr m = 0;
  ASSERT_CU(cuMemAllocManaged(&m, 8192, CU_MEM_ATTACH_GLOBAL));
  CUdeviceptr ranges[2] = {m, m + 4096};
  size_t lengths[2] = {4096, 4096};
  CUmemLocation where[2]{};
  where[0].type = CU_MEM_LOCATION_TYPE_DEVICE;
  where[0].id = 0;
  where[1].type = CU_MEM_LOCATION_TYPE_HOST;
  size_t whereFirsts[2] = {0, 1};
  EXPECT_CU(cuMemPrefetchBatchAsync(ranges, lengths, 2, where, whereFirsts, 2, 0, s));
  EXPECT_CU(cuMemDiscardBatchAsync(ranges, lengths, 2, 0, s));
  EXPECT_CU(cuMemDiscardAndPrefetchBatchAsync(ranges, lengths, 2, where, whereFirsts, 1, 0, s));
  EXPECT_CU(cuStreamSynchronize(s));
  // Written after the discard, the memory holds what was written.
  std::vector<std::uint8_t> fresh = pattern(8192, 9), got(8192);
  ASSERT_CU(cuMemcpyHtoD(m, fresh.data(), fresh.size()));
  ASSERT_CU(cuMemcpyDtoH(got.data(), m, got.size()));
  EXPECT_EQ(got, fresh);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemDiscardBatchAsync(ranges, lengths, 2, 1, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemDiscardBatchAsync(ranges, lengths, 2, 0, nullptr));
  ranges[1] = a;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemDiscardBatchAsync(ranges, lengths, 2, 0, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuMemPrefetchBatchAsync(ranges, lengths, 2, where, whereFirsts, 2, 0, s));
  ASSERT_CU(cuMemFree(m));
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemFree(b));
  ASSERT_CU(cuStreamDestroy(s));
}

// A tiled tensor map of a 64 x 48 float matrix (rows 256 bytes apart)
// encodes and moves to another address; the rules of the reference refuse
// the rest. The descriptor is opaque: only what the calls accept is checked,
// and that the same parameters give the same bytes.
TEST_F(MemoryTest, TiledTensorMapsAndTheirRules) {
  CUdeviceptr base = 0;
  ASSERT_CU(cuMemAlloc(&base, 1 << 16));
  void* address = reinterpret_cast<void*>(base);
  const cuuint64_t dims[2] = {64, 48};
  const cuuint64_t strides[1] = {256};
  const cuuint32_t box[2] = {32, 8}, ones[2] = {1, 1};
  auto encode = [&](CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* at,
                    const cuuint64_t* d, const cuuint64_t* st, const cuuint32_t* b,
                    const cuuint32_t* e, CUtensorMapInterleave il = CU_TENSOR_MAP_INTERLEAVE_NONE,
                    CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_NONE,
                    CUtensorMapFloatOOBfill fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) {
    return cuTensorMapEncodeTiled(map, type, rank, at, d, st, b, e, il, sw,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B, fill);
  };
  CUtensorMap map{}, again{};
  ASSERT_CU(encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, address, dims, strides, box, ones));
  ASSERT_CU(encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, address, dims, strides, box, ones));
  EXPECT_EQ(std::memcmp(&map, &again, sizeof(map)), 0);
  // Moved 4 KiB on, then back: the bytes come back too.
  ASSERT_CU(cuTensorMapReplaceAddress(&again, static_cast<char*>(address) + 4096));
  EXPECT_NE(std::memcmp(&map, &again, sizeof(map)), 0);
  ASSERT_CU(cuTensorMapReplaceAddress(&again, address));
  EXPECT_EQ(std::memcmp(&map, &again, sizeof(map)), 0);
  // A 128-byte swizzle of a 128-byte box row, a NaN fill of floats, a 1D map.
  const cuuint32_t wide[2] = {32, 8};
  EXPECT_CU(encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, address, dims, strides, wide, ones,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA));
  EXPECT_CU(encode(&again, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, address, dims, nullptr, box, ones));

  // Refused: a descriptor not 64-byte aligned, a rank of 0 or 6, an address
  // not 16-byte aligned, a zero dimension, a stride not a multiple of 16, a
  // box over 256 or whose row is not a multiple of 16 bytes, an element
  // stride over 8, a box row wider than its swizzle, a NaN fill of integers,
  // a 32-byte interleave with another swizzle, a descriptor vgpu did not
  // encode.
  alignas(64) unsigned char raw[sizeof(CUtensorMap) + 64] = {};
  auto* misaligned = reinterpret_cast<CUtensorMap*>(raw + 16);
  const cuuint64_t zeroDim[2] = {0, 48}, oddStride[1] = {200};
  const cuuint32_t hugeBox[2] = {512, 8}, oddBox[2] = {3, 8}, bigStep[2] = {1, 9};
  std::vector<cuuint64_t> six(6, 16);
  std::vector<cuuint32_t> sixBox(6, 4);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, encode(misaligned, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                                                 address, dims, strides, box, ones));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 0,
                                                 address, dims, strides, box, ones));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 6, address, six.data(), six.data(),
                       sixBox.data(), sixBox.data()));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, static_cast<char*>(address) + 8,
                       dims, strides, box, ones));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                                                 address, zeroDim, strides, box, ones));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                                                 address, dims, oddStride, box, ones));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                                                 address, dims, strides, hugeBox, ones));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                                                 address, dims, strides, oddBox, ones));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                                                 address, dims, strides, box, bigStep));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, address, dims, strides, wide,
                       ones, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                encode(&again, CU_TENSOR_MAP_DATA_TYPE_INT32, 2, address, dims, strides, box, ones,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA));
  const cuuint64_t dims3[3] = {64, 48, 2}, strides3[2] = {256, 256 * 48};
  const cuuint32_t box3[3] = {8, 8, 1}, ones3[3] = {1, 1, 1};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, address, dims3, strides3, box3,
                       ones3, CU_TENSOR_MAP_INTERLEAVE_32B, CU_TENSOR_MAP_SWIZZLE_64B));
  EXPECT_CU(encode(&again, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, address, dims3, strides3, box3,
                   ones3, CU_TENSOR_MAP_INTERLEAVE_32B, CU_TENSOR_MAP_SWIZZLE_32B));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuTensorMapReplaceAddress(&again, static_cast<char*>(address) + 16));
  CUtensorMap foreign{};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuTensorMapReplaceAddress(&foreign, address));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuTensorMapReplaceAddress(misaligned, address));
  ASSERT_CU(cuMemFree(base));
}

// The im2col forms, over a half-precision NHWC tensor (C 16, W 32, H 32, N 2;
// and C 16, W 64, N 2 for the wide form): encoded, moved, and refused where
// the reference's rules say.
TEST_F(MemoryTest, Im2colTensorMapsAndTheirRules) {
  CUdeviceptr base = 0;
  ASSERT_CU(cuMemAlloc(&base, 1 << 17));
  void* address = reinterpret_cast<void*>(base);
  const cuuint64_t dims[4] = {16, 32, 32, 2}, strides[3] = {32, 1024, 32768};
  const cuuint32_t ones[4] = {1, 1, 1, 1};
  auto im2col = [&](CUtensorMap* out, cuuint32_t rank, const int* lo, const int* up,
                    cuuint32_t channels, cuuint32_t pixels,
                    CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_32B) {
    return cuTensorMapEncodeIm2col(
        out, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, rank, address, dims, strides, lo, up, channels,
        pixels, ones, CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_NONE,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  const int lower[2] = {-1, -1}, upper[2] = {-1, -1};
  CUtensorMap map{}, again{};
  ASSERT_CU(im2col(&map, 4, lower, upper, 16, 64));
  ASSERT_CU(im2col(&again, 4, lower, upper, 16, 64));
  EXPECT_EQ(std::memcmp(&map, &again, sizeof(map)), 0);
  ASSERT_CU(cuTensorMapReplaceAddress(&again, static_cast<char*>(address) + 512));
  EXPECT_NE(std::memcmp(&map, &again, sizeof(map)), 0);
  // Refused: a rank under 3, a corner outside rank 4's [-128, 127], an empty
  // box (its lower corner past the W dimension), no channels or over 256,
  // over 1024 pixels, a box row wider than its swizzle.
  const int far[2] = {200, 0}, past[2] = {40, 0}, zero[2] = {0, 0};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, im2col(&again, 2, lower, upper, 16, 64));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, im2col(&again, 4, far, upper, 16, 64));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, im2col(&again, 4, past, zero, 16, 64));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, im2col(&again, 4, lower, upper, 0, 64));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, im2col(&again, 4, lower, upper, 300, 64));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, im2col(&again, 4, lower, upper, 16, 2000));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                im2col(&again, 4, lower, upper, 32, 64));  // 64 bytes in 32

  const cuuint64_t wideDims[3] = {16, 64, 2}, wideStrides[2] = {32, 2048};
  auto wide = [&](CUtensorMap* out, int lowerW, int upperW, CUtensorMapIm2ColWideMode mode,
                  CUtensorMapSwizzle sw) {
    return cuTensorMapEncodeIm2colWide(
        out, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, address, wideDims, wideStrides, lowerW, upperW, 16,
        64, ones, CU_TENSOR_MAP_INTERLEAVE_NONE, mode, sw, CU_TENSOR_MAP_L2_PROMOTION_NONE,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  EXPECT_CU(wide(&again, -1, -1, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W, CU_TENSOR_MAP_SWIZZLE_64B));
  EXPECT_CU(wide(&again, 0, 0, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128, CU_TENSOR_MAP_SWIZZLE_128B));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                wide(&again, -1, -1, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W, CU_TENSOR_MAP_SWIZZLE_NONE));
  EXPECT_CU_ERR(
      CUDA_ERROR_INVALID_VALUE,
      wide(&again, -1, -1, static_cast<CUtensorMapIm2ColWideMode>(7), CU_TENSOR_MAP_SWIZZLE_64B));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, wide(&again, 40000, 0, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W,
                                               CU_TENSOR_MAP_SWIZZLE_64B));
  ASSERT_CU(cuMemFree(base));
}

}  // namespace phos::vgpu::testing
