// SPDX-License-Identifier: Apache-2.0
// Shared by the GoogleTest clients of libphos.so: CUresult assertions, the kernels' module, and
// a check that calls really go through libphos.so.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#ifndef PHOS_SHIM_KERNELS_PTX
#error "PHOS_SHIM_KERNELS_PTX must name the PTX of shim_kernels.cu"
#endif

namespace phos::shim::testing {

inline std::string resultName(CUresult r) {
  const char* name = nullptr;
  return cuGetErrorName(r, &name) == CUDA_SUCCESS ? name : "CUresult " + std::to_string(static_cast<int>(r));
}

// Compared as names, so a failure prints CUDA_ERROR_NOT_READY rather than 600.
#define EXPECT_CU(expr) EXPECT_EQ(::phos::shim::testing::resultName(expr), "CUDA_SUCCESS")
#define ASSERT_CU(expr) ASSERT_EQ(::phos::shim::testing::resultName(expr), "CUDA_SUCCESS")
#define EXPECT_CU_ERR(code, expr) \
  EXPECT_EQ(::phos::shim::testing::resultName(expr), ::phos::shim::testing::resultName(code))

// The shared object that defines `fn`, as the dynamic linker resolved it.
inline std::string libraryOf(const void* fn) {
  Dl_info info{};
  if (dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// These clients are linked against vgpu's libcuda.so.1 and meant to run with
// LD_PRELOAD=libphos.so: without it they would pass against vgpu alone and
// prove nothing about the shim. PHOS_TEST_SHIM (set by the pytest harness)
// names the library every cu* call must come from.
class UnderPhos : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* expected = std::getenv("PHOS_TEST_SHIM");
    ASSERT_NE(expected, nullptr) << "run this client through tests/python/test_shim_*.py (PHOS_TEST_SHIM unset)";
    EXPECT_EQ(libraryOf(reinterpret_cast<const void*>(&cuInit)), expected);
    EXPECT_EQ(libraryOf(reinterpret_cast<const void*>(&cuLaunchKernel)), expected);
  }
};

// cuInit and device 0's primary context, current on the calling thread, with
// the kernels of shim_kernels.cu loaded into it.
class PrimaryContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&device_, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&context_, device_));
    ASSERT_CU(cuCtxSetCurrent(context_));
    ASSERT_CU(cuModuleLoad(&module_, PHOS_SHIM_KERNELS_PTX));
  }
  void TearDown() override {
    if (module_ != nullptr) {
      EXPECT_CU(cuModuleUnload(module_));
    }
    if (context_ != nullptr) {
      EXPECT_CU(cuDevicePrimaryCtxRelease(device_));
    }
  }

  CUfunction function(const char* name) {
    CUfunction f = nullptr;
    EXPECT_CU(cuModuleGetFunction(&f, module_, name));
    return f;
  }

  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
};

}  // namespace phos::shim::testing
