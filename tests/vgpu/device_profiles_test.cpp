// SPDX-License-Identifier: Apache-2.0
// vgpu's device profiles through the Driver API: the same executable runs once per
// compute capability (PHOS_VGPU_CC=8.0, 9.0, 12.0; tests/vgpu/meson.build) and
// checks what that profile's part reports, which PTX of a fatbin it runs, and
// the occupancy its per-SM limits give.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

// What each profile models: NVIDIA's product specifications for the part and
// the CUDA C++ Programming Guide's limits for its compute capability.
struct Expected {
  int major, minor;
  const char* part;
  int multiprocessors;
  int threadsPerSm;
  int blocksPerSm;
  int sharedPerSm;
  int sharedOptin;
  int l2Bytes;
  int clockKhz;
  int memoryClockKhz;
  int busWidth;
  int ecc;
  int fp64Ratio;
  int clusters;
  int pciDeviceId;
};

constexpr Expected kProfiles[] = {
    {8, 0, "A100", 108, 2048, 32, 164 * 1024, 163 * 1024, 40 << 20, 1410000, 1215000, 5120, 1, 2, 0, 0x20b010de},
    {9, 0, "H100", 132, 2048, 32, 228 * 1024, 227 * 1024, 50 << 20, 1980000, 2619000, 5120, 1, 2, 1, 0x233010de},
    {12, 0, "RTX 5090", 170, 1536, 32, 100 * 1024, 99 * 1024, 96 << 20, 2407000, 14001000, 512, 0, 64, 1, 0x2b8510de},
};

int attribute(CUdevice_attribute a) {
  int v = -1;
  EXPECT_CU(cuDeviceGetAttribute(&v, a, 0));
  return v;
}

class DeviceProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    const int major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    const int minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    for (const Expected& e : kProfiles) {
      if (e.major == major && e.minor == minor) expected_ = &e;
    }
    ASSERT_NE(expected_, nullptr) << "no expectations for compute capability " << major << "." << minor;
    // The executable is run once per profile; the one asked for is the one we got.
    if (const char* cc = std::getenv("PHOS_VGPU_CC")) {
      EXPECT_EQ(std::string(cc), std::to_string(major) + "." + std::to_string(minor));
    }
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
  }
  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_CU(cuDevicePrimaryCtxRelease(0));
    }
  }
  const Expected* expected_ = nullptr;
  CUcontext ctx_ = nullptr;
};

TEST_F(DeviceProfileTest, AttributesDescribeThePart) {
  const Expected& e = *expected_;
  char name[256] = {};
  EXPECT_CU(cuDeviceGetName(name, sizeof name, 0));
  EXPECT_THAT(std::string(name), ::testing::HasSubstr(e.part));
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), e.multiprocessors);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR), e.threadsPerSm);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR), e.blocksPerSm);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR), e.sharedPerSm);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), e.sharedOptin);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE), e.l2Bytes);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE), e.clockKhz);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE), e.memoryClockKhz);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH), e.busWidth);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_ECC_ENABLED), e.ecc);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO), e.fp64Ratio);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH), e.clusters);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED), e.clusters);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID), e.pciDeviceId);
  // The same on every compute capability vgpu models.
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK), 48 * 1024);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR), 65536);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK), 65536);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK), 1024);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE), 32);
}

#ifdef PHOS_VGPU_ARCH_FATBIN
std::vector<char> readFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A fatbin with compute_80 and compute_120 PTX: a device runs the newest PTX
// not above its compute capability (12.0 the compute_120 one, 8.0 and 9.0 the
// compute_80 one), as NVIDIA's driver JIT-compiles it.
TEST_F(DeviceProfileTest, FatbinPtxForTheDevice) {
  std::vector<char> image = readFile(PHOS_VGPU_ARCH_FATBIN);
  ASSERT_FALSE(image.empty());
  CUmodule module = nullptr;
  ASSERT_CU(cuModuleLoadData(&module, image.data()));
  CUfunction fn = nullptr;
  ASSERT_CU(cuModuleGetFunction(&fn, module, "arch"));
  CUdeviceptr out = 0;
  ASSERT_CU(cuMemAlloc(&out, sizeof(int)));
  void* params[] = {&out};
  ASSERT_CU(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  int arch = 0;
  ASSERT_CU(cuMemcpyDtoH(&arch, out, sizeof arch));
  EXPECT_EQ(arch, expected_->major >= 12 ? 1200 : 800);
  // The function reports the PTX it came from and the device it was JIT-compiled for.
  int ptxVersion = 0, binaryVersion = 0;
  EXPECT_CU(cuFuncGetAttribute(&ptxVersion, CU_FUNC_ATTRIBUTE_PTX_VERSION, fn));
  EXPECT_CU(cuFuncGetAttribute(&binaryVersion, CU_FUNC_ATTRIBUTE_BINARY_VERSION, fn));
  EXPECT_EQ(ptxVersion, expected_->major >= 12 ? 120 : 80);
  EXPECT_EQ(binaryVersion, expected_->major * 10 + expected_->minor);
  EXPECT_CU(cuMemFree(out));
  EXPECT_CU(cuModuleUnload(module));
}

// Resident blocks per SM follow the profile's limits: on 12.0, 48 resident
// warps allow 24 blocks of two warps and one block of 1024 threads; 8.0 and
// 9.0 (64 warps) allow 32 and 2. A small kernel is limited by neither
// registers nor shared memory here.
TEST_F(DeviceProfileTest, OccupancyFollowsThePerSmLimits) {
  std::vector<char> image = readFile(PHOS_VGPU_ARCH_FATBIN);
  CUmodule module = nullptr;
  ASSERT_CU(cuModuleLoadData(&module, image.data()));
  CUfunction fn = nullptr;
  ASSERT_CU(cuModuleGetFunction(&fn, module, "arch"));
  int regs = 0;
  ASSERT_CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn));
  ASSERT_LE(regs, 32);
  const int warpsPerSm = expected_->threadsPerSm / 32;
  int blocks = 0;
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 64, 0));
  EXPECT_EQ(blocks, std::min(expected_->blocksPerSm, warpsPerSm / 2));
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 1024, 0));
  EXPECT_EQ(blocks, warpsPerSm / 32);
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 32, 0));
  EXPECT_EQ(blocks, expected_->blocksPerSm);
  int minGrid = 0, blockSize = 0;
  EXPECT_CU(cuOccupancyMaxPotentialBlockSize(&minGrid, &blockSize, fn, nullptr, 0, 0));
  EXPECT_EQ(minGrid / expected_->multiprocessors * blockSize, expected_->threadsPerSm);
  EXPECT_CU(cuModuleUnload(module));
}
#endif

}  // namespace
}  // namespace phos::vgpu::testing
