// SPDX-License-Identifier: Apache-2.0
// The access recorder through the export table: byte-exact per-allocation ranges of real kernels run by the engine.
#include <cuda.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "phos/vgpu/export_table.h"
#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

// Unlike DriverTest, keeps the engine cuInit installed (no recording loader): the
// kernels of fixtures/access_kernels.cu run for real.
class AccessRecorder : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    table_ = exportTable();
    ASSERT_NE(table_, nullptr);
    ASSERT_GE(table_->size, sizeof(ExportTable));
    ASSERT_CU(cuDeviceGet(&device_, 0));
    ASSERT_CU(cuCtxCreate(&context_, nullptr, 0, device_));
    std::ifstream in(PHOS_VGPU_ACCESS_PTX, std::ios::binary);
    ASSERT_TRUE(in) << PHOS_VGPU_ACCESS_PTX;
    std::string ptx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_CU(cuModuleLoadData(&module_, ptx.c_str()));
    ASSERT_CU(table_->setRecordAccesses(nullptr, true));
  }
  void TearDown() override {
    if (context_ != nullptr) (void)cuCtxDestroy(context_);
  }

  CUfunction kernel(const char* name) {
    CUfunction f = nullptr;
    EXPECT_CU(cuModuleGetFunction(&f, module_, name));
    return f;
  }
  CUdeviceptr alloc(std::size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_CU(cuMemAlloc(&p, bytes));
    EXPECT_CU(cuMemsetD8(p, 0, bytes));
    return p;
  }
  // The allocation as cuMemGetAddressRange reports it, with the expected ranges.
  AllocationAccesses expected(CUdeviceptr inside, std::vector<ByteRange> reads,
                              std::vector<ByteRange> writes) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    EXPECT_CU(cuMemGetAddressRange(&base, &size, inside));
    return AllocationAccesses{base, size, std::move(reads), std::move(writes)};
  }
  // Launches on the legacy stream, synchronizes, and returns the record.
  LaunchAccesses run(CUfunction f, unsigned grid, unsigned block, std::vector<void*> params) {
    EXPECT_CU(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, nullptr, params.empty() ? nullptr : params.data(),
                             nullptr));
    EXPECT_CU(cuCtxSynchronize());
    LaunchAccesses out;
    EXPECT_CU(table_->lastLaunchAccesses(nullptr, &out));
    EXPECT_EQ(out.function, f);
    return out;
  }
  static std::vector<AllocationAccesses> sortedByBase(std::vector<AllocationAccesses> v) {
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.base < b.base; });
    return v;
  }

  const ExportTable* table_ = nullptr;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
};

TEST_F(AccessRecorder, SaxpyOverAnOffsetSubrange) {
  constexpr int kElems = 4096, kOffset = 37, kN = 1000;
  CUdeviceptr x = alloc(kElems * 4);
  CUdeviceptr y = alloc(kElems * 4);
  CUdeviceptr xs = x + kOffset * 4, ys = y + kOffset * 4;
  int n = kN;
  float a = 2.0f;
  LaunchAccesses got = run(kernel("saxpy"), 4, 256, {&n, &a, &xs, &ys});
  const ByteRange touched{kOffset * 4, (kOffset + kN) * 4};
  EXPECT_EQ(got.allocations, sortedByBase({expected(x, {touched}, {}), expected(y, {touched}, {touched})}));
}

TEST_F(AccessRecorder, StridedWriteIsByteExact) {
  constexpr int kStride = 3, kN = 500;
  CUdeviceptr out = alloc(kN * kStride * 4);
  int stride = kStride, n = kN;
  LaunchAccesses got = run(kernel("stridedWrite"), 4, 128, {&out, &stride, &n});
  std::vector<ByteRange> writes;
  for (std::uint64_t i = 0; i < kN; ++i) writes.push_back({i * kStride * 4, i * kStride * 4 + 4});
  EXPECT_EQ(got.allocations, (std::vector<AllocationAccesses>{expected(out, {}, writes)}));
}

TEST_F(AccessRecorder, TwoInputsOneOutput) {
  constexpr int kN = 777;
  CUdeviceptr a = alloc(kN * 4), b = alloc(kN * 4), c = alloc(kN * 4);
  int n = kN;
  LaunchAccesses got = run(kernel("addVectors"), 7, 128, {&a, &b, &c, &n});
  const ByteRange all{0, kN * 4};
  EXPECT_EQ(got.allocations,
            sortedByBase({expected(a, {all}, {}), expected(b, {all}, {}), expected(c, {}, {all})}));
}

TEST_F(AccessRecorder, AtomicCountsAsReadAndWrite) {
  constexpr int kN = 256;
  std::vector<int> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = i % 3 == 0 ? 1 : -1;
  CUdeviceptr in = alloc(kN * 4);
  CUdeviceptr counter = alloc(64);
  ASSERT_CU(cuMemcpyHtoD(in, host.data(), kN * 4));
  int n = kN;
  LaunchAccesses got = run(kernel("countPositive"), 2, 128, {&in, &n, &counter});
  EXPECT_EQ(got.allocations, sortedByBase({expected(in, {{0, kN * 4}}, {}),
                                           expected(counter, {{0, 4}}, {{0, 4}})}));
  unsigned count = 0;
  ASSERT_CU(cuMemcpyDtoH(&count, counter, 4));
  EXPECT_EQ(count, 86u);
}

TEST_F(AccessRecorder, KernelTouchingNothing) {
  LaunchAccesses got = run(kernel("noop"), 3, 64, {});
  EXPECT_TRUE(got.allocations.empty());
}

TEST_F(AccessRecorder, ModuleGlobalIsItsOwnAllocation) {
  CUdeviceptr global = 0;
  std::size_t size = 0;
  ASSERT_CU(cuModuleGetGlobal(&global, &size, module_, "launchCount"));
  LaunchAccesses got = run(kernel("bumpGlobal"), 2, 32, {});
  EXPECT_EQ(got.allocations, (std::vector<AllocationAccesses>{expected(global, {{0, 4}}, {{0, 4}})}));
  EXPECT_EQ(got.allocations.at(0).base, global);
}

// A read crossing from one allocation into the next is split at the boundary.
TEST_F(AccessRecorder, RangesAreSplitBetweenAdjacentAllocations) {
  CUdeviceptr first = alloc(4096), second = alloc(4096);
  if (second != first + 4096) GTEST_SKIP() << "the heap did not place the allocations back to back";
  CUdeviceptr xs = first + 4096 - 64, y = alloc(4096);
  int n = 32;
  float a = 1.0f;
  LaunchAccesses got = run(kernel("saxpy"), 1, 32, {&n, &a, &xs, &y});
  EXPECT_EQ(got.allocations, sortedByBase({expected(first, {{4096 - 64, 4096}}, {}),
                                           expected(second, {{0, 64}}, {}),
                                           expected(y, {{0, 128}}, {{0, 128}})}));
}

TEST_F(AccessRecorder, RecordsPerStreamAndOnlyWhileOn) {
  CUstream stream = nullptr;
  ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  LaunchAccesses out;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, table_->lastLaunchAccesses(stream, &out));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, table_->lastLaunchAccesses(stream, nullptr));

  CUdeviceptr buf = alloc(4096);
  int stride = 1, n = 8;
  void* params[] = {&buf, &stride, &n};
  CUfunction strided = kernel("stridedWrite");
  // Held back by a host function, the launch has not run: NOT_READY.
  static std::atomic<bool> release;
  release = false;
  ASSERT_CU(cuLaunchHostFunc(stream, [](void*) { while (!release.load()) {} }, nullptr));
  ASSERT_CU(cuLaunchKernel(strided, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, table_->lastLaunchAccesses(stream, &out));
  release = true;
  ASSERT_CU(cuStreamSynchronize(stream));
  ASSERT_CU(table_->lastLaunchAccesses(stream, &out));
  EXPECT_EQ(out.allocations, (std::vector<AllocationAccesses>{expected(buf, {}, {{0, 32}})}));
  // The legacy stream has its own last launch.
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, table_->lastLaunchAccesses(nullptr, &out));

  // Launches enqueued with the recorder off leave the last record in place.
  ASSERT_CU(table_->setRecordAccesses(context_, false));
  n = 16;
  ASSERT_CU(cuLaunchKernel(strided, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr));
  ASSERT_CU(cuStreamSynchronize(stream));
  ASSERT_CU(table_->lastLaunchAccesses(stream, &out));
  EXPECT_EQ(out.allocations, (std::vector<AllocationAccesses>{expected(buf, {}, {{0, 32}})}));
  EXPECT_CU(cuStreamDestroy(stream));

  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT,
                table_->setRecordAccesses(reinterpret_cast<CUcontext>(std::uintptr_t{0x1234}), true));
}

}  // namespace
}  // namespace phos::vgpu::testing
