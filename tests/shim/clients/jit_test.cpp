// SPDX-License-Identifier: Apache-2.0
// JIT options and the linker, as an application sees them: options that
// reach the compiler, logs and outputs that come back (on failure too), and
// cuLink* from inputs in memory and in files to an image that loads and
// runs. The same assertions run directly on vgpu (meson suite vgpu) and
// under libphos.so against phosd (tests/python/test_shim_semantics.py).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "client_support.h"

namespace phos::shim::testing {
namespace {

// Under the Python harness, every call must go through libphos.so.
const auto* const kUnderPhos = std::getenv("PHOS_TEST_SHIM") != nullptr
                                   ? ::testing::AddGlobalTestEnvironment(new UnderPhos)
                                   : nullptr;

// PTX that every JIT refuses: an instruction that does not exist.
constexpr char kBadPtx[] =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry broken()\n{\n  frobnicate.u32 %r1, 7;\n  ret;\n}\n";

std::string shimKernelsPtx() {
  std::ifstream in(PHOS_SHIM_KERNELS_PTX);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void* scalar(unsigned v) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(v));
}
unsigned scalarOf(void* v) {
  return static_cast<unsigned>(reinterpret_cast<uintptr_t>(v));
}
float floatOf(void* v) {
  float f = 0;
  std::memcpy(&f, &v, sizeof(f));
  return f;
}
void* floatValue(float f) {
  void* v = nullptr;
  std::memcpy(&v, &f, sizeof(f));
  return v;
}

class JitTest : public PrimaryContextTest {
 protected:
  // scale(in, out, factor, n) of `module` on n floats: out = in * factor.
  void expectScaleRuns(CUmodule module) {
    CUfunction f = nullptr;
    ASSERT_CU(cuModuleGetFunction(&f, module, "scale"));
    constexpr int n = 256;
    std::vector<float> in(n), out(n, 0.0F);
    for (int i = 0; i < n; ++i) in[i] = static_cast<float>(i);
    CUdeviceptr din = 0, dout = 0;
    ASSERT_CU(cuMemAlloc(&din, n * sizeof(float)));
    ASSERT_CU(cuMemAlloc(&dout, n * sizeof(float)));
    ASSERT_CU(cuMemcpyHtoD(din, in.data(), n * sizeof(float)));
    float factor = 3.0F;
    int count = n;
    void* params[] = {&din, &dout, &factor, &count};
    ASSERT_CU(cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
    ASSERT_CU(cuMemcpyDtoH(out.data(), dout, n * sizeof(float)));
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], in[i] * 3.0F) << i;
    EXPECT_CU(cuMemFree(din));
    EXPECT_CU(cuMemFree(dout));
  }
};

TEST_F(JitTest, AFailedLoadFillsTheErrorLogAndItsSize) {
  char info[256];
  char error[256];
  std::memset(info, 'x', sizeof(info));
  std::memset(error, 'x', sizeof(error));
  CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {info, scalar(sizeof(info)), error, scalar(sizeof(error))};
  CUmodule m = nullptr;
  const CUresult r = cuModuleLoadDataEx(&m, kBadPtx, 4, options, values);
  EXPECT_NE(r, CUDA_SUCCESS);
  // The error log says why, terminated, and its size counts what it holds.
  const size_t length = strnlen(error, sizeof(error));
  ASSERT_LT(length, sizeof(error));
  EXPECT_GT(length, 0U);
  EXPECT_EQ(scalarOf(values[3]), length + 1) << error;
  EXPECT_LE(scalarOf(values[1]), sizeof(info));
  EXPECT_EQ(info[0], '\0');
}

TEST_F(JitTest, AnErrorLogIsCutToItsBuffer) {
  char error[8];
  std::memset(error, 'x', sizeof(error));
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error, scalar(sizeof(error))};
  CUmodule m = nullptr;
  EXPECT_NE(cuModuleLoadDataEx(&m, kBadPtx, 2, options, values), CUDA_SUCCESS);
  EXPECT_EQ(strnlen(error, sizeof(error)), sizeof(error) - 1);
  EXPECT_LE(scalarOf(values[1]), sizeof(error));
}

TEST_F(JitTest, ASuccessfulLoadReportsItsWallTimeAndEmptyLogs) {
  const std::string ptx = shimKernelsPtx();
  char error[64] = "untouched";
  CUjit_option options[] = {CU_JIT_WALL_TIME, CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_OPTIMIZATION_LEVEL};
  void* values[] = {floatValue(-1.0F), error, scalar(sizeof(error)), scalar(2)};
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadDataEx(&m, ptx.c_str(), 4, options, values));
  EXPECT_GE(floatOf(values[0]), 0.0F);
  EXPECT_EQ(error[0], '\0');
  EXPECT_EQ(scalarOf(values[2]), 0U);
  expectScaleRuns(m);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(JitTest, MaxRegistersReachesTheCompiler) {
  const std::string ptx = shimKernelsPtx();
  CUjit_option options[] = {CU_JIT_MAX_REGISTERS};
  void* values[] = {scalar(16)};
  CUmodule capped = nullptr;
  ASSERT_CU(cuModuleLoadDataEx(&capped, ptx.c_str(), 1, options, values));
  CUfunction f = nullptr, g = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, capped, "scale"));
  ASSERT_CU(cuModuleGetFunction(&g, module_, "scale"));
  int cappedRegs = 0, regs = 0;
  ASSERT_CU(cuFuncGetAttribute(&cappedRegs, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
  ASSERT_CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, g));
  EXPECT_GT(cappedRegs, 0);
  EXPECT_LE(cappedRegs, 16);
  EXPECT_LE(cappedRegs, regs);
  expectScaleRuns(capped);
  EXPECT_CU(cuModuleUnload(capped));
}

// A library's kernels too, in whatever context they are used.
TEST_F(JitTest, MaxRegistersCapsALibrarysKernels) {
  const std::string ptx = shimKernelsPtx();
  CUjit_option options[] = {CU_JIT_MAX_REGISTERS};
  void* values[] = {scalar(16)};
  CUlibrary capped = nullptr, plain = nullptr;
  ASSERT_CU(cuLibraryLoadData(&capped, ptx.c_str(), options, values, 1, nullptr, nullptr, 0));
  ASSERT_CU(cuLibraryLoadData(&plain, ptx.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel k = nullptr, u = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&k, capped, "scale"));
  ASSERT_CU(cuLibraryGetKernel(&u, plain, "scale"));
  CUdevice device = 0;
  ASSERT_CU(cuCtxGetDevice(&device));
  int cappedRegs = 0, regs = 0;
  ASSERT_CU(cuKernelGetAttribute(&cappedRegs, CU_FUNC_ATTRIBUTE_NUM_REGS, k, device));
  ASSERT_CU(cuKernelGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, u, device));
  EXPECT_GT(cappedRegs, 0);
  EXPECT_LE(cappedRegs, 16);
  EXPECT_LE(cappedRegs, regs);
  CUfunction f = nullptr;
  ASSERT_CU(cuKernelGetFunction(&f, k));
  int functionRegs = 0;
  ASSERT_CU(cuFuncGetAttribute(&functionRegs, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
  EXPECT_EQ(functionRegs, cappedRegs);
  EXPECT_CU(cuLibraryUnload(capped));
  EXPECT_CU(cuLibraryUnload(plain));
}

TEST_F(JitTest, OptionsWithoutArraysOrUnknownOnesAreInvalidValue) {
  const std::string ptx = shimKernelsPtx();
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadDataEx(&m, ptx.c_str(), 1, nullptr, nullptr));
  CUjit_option unknown[] = {static_cast<CUjit_option>(999)};
  void* values[] = {nullptr};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadDataEx(&m, ptx.c_str(), 1, unknown, values));
}

TEST_F(JitTest, ALinkedImageLoadsAndRunsAndLivesUntilTheStateIsDestroyed) {
  const std::string ptx = shimKernelsPtx();
  char error[128] = "untouched";
  CUjit_option options[] = {CU_JIT_WALL_TIME, CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {floatValue(-1.0F), error, scalar(sizeof(error))};
  CUlinkState link = nullptr;
  ASSERT_CU(cuLinkCreate(3, options, values, &link));
  ASSERT_CU(cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(ptx.c_str()), ptx.size() + 1,
                          "shim_kernels.ptx", 0, nullptr, nullptr));
  void* image = nullptr;
  size_t size = 0;
  ASSERT_CU(cuLinkComplete(link, &image, &size));
  ASSERT_NE(image, nullptr);
  EXPECT_GT(size, 0U);
  EXPECT_GE(floatOf(values[0]), 0.0F);
  EXPECT_EQ(error[0], '\0');
  // The image is the program's to read until cuLinkDestroy.
  const std::vector<char> copy(static_cast<const char*>(image),
                               static_cast<const char*>(image) + size);
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, image));
  expectScaleRuns(m);
  EXPECT_CU(cuModuleUnload(m));
  EXPECT_CU(cuLinkDestroy(link));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLinkDestroy(link));
  // Copied before, it loads after.
  ASSERT_CU(cuModuleLoadData(&m, copy.data()));
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(JitTest, ALinkReadsItsInputFromAFile) {
  CUlinkState link = nullptr;
  ASSERT_CU(cuLinkCreate(0, nullptr, nullptr, &link));
  ASSERT_CU(cuLinkAddFile(link, CU_JIT_INPUT_PTX, PHOS_SHIM_KERNELS_PTX, 0, nullptr, nullptr));
  void* image = nullptr;
  size_t size = 0;
  ASSERT_CU(cuLinkComplete(link, &image, &size));
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, image));
  expectScaleRuns(m);
  EXPECT_CU(cuModuleUnload(m));
  EXPECT_CU(cuLinkDestroy(link));
  ASSERT_CU(cuLinkCreate(0, nullptr, nullptr, &link));
  EXPECT_CU_ERR(
      CUDA_ERROR_FILE_NOT_FOUND,
      cuLinkAddFile(link, CU_JIT_INPUT_PTX, "/nonexistent/kernels.ptx", 0, nullptr, nullptr));
  EXPECT_CU(cuLinkDestroy(link));
}

TEST_F(JitTest, ABadInputFailsTheLinkWithItsReasonInTheStatesErrorLog) {
  char error[256];
  std::memset(error, 'x', sizeof(error));
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error, scalar(sizeof(error))};
  CUlinkState link = nullptr;
  ASSERT_CU(cuLinkCreate(2, options, values, &link));
  CUresult added = cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(kBadPtx),
                                 sizeof(kBadPtx), "bad.ptx", 0, nullptr, nullptr);
  void* image = nullptr;
  size_t size = 0;
  // A JIT may refuse the input when it is added or when the link completes.
  const CUresult completed = added == CUDA_SUCCESS ? cuLinkComplete(link, &image, &size) : added;
  EXPECT_NE(completed, CUDA_SUCCESS);
  EXPECT_GT(strnlen(error, sizeof(error)), 0U);
  EXPECT_LT(strnlen(error, sizeof(error)), sizeof(error));
  EXPECT_CU(cuLinkDestroy(link));
}

TEST_F(JitTest, LinkCallsCheckTheirArguments) {
  CUlinkState link = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLinkCreate(0, nullptr, nullptr, nullptr));
  ASSERT_CU(cuLinkCreate(0, nullptr, nullptr, &link));
  size_t size = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLinkComplete(link, nullptr, &size));
  void* image = nullptr;
  EXPECT_NE(cuLinkComplete(link, &image, &size), CUDA_SUCCESS);  // nothing was added
  EXPECT_CU(cuLinkDestroy(link));
}

}  // namespace
}  // namespace phos::shim::testing
