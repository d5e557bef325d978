// SPDX-License-Identifier: Apache-2.0
// vgpu's libnvrtc.so.13 (vgpu/nvrtc/) seen by a program built the plain way:
// linked with -lnvrtc -lcuda against the CUDA toolkit, run with vgpu's directory
// first on LD_LIBRARY_PATH (tests/vgpu/meson.build), so that NVRTC and the
// driver it loads are vgpu's. The first test compiles and launches as NVIDIA's
// cuda-samples do (compile for sm_<device's CC>, nvrtcGetCUBIN, cuModuleLoadData);
// the others pin each rule against NVIDIA's own NVRTC, opened here by path
// ($PHOS_TEST_NVIDIA_NVRTC).
#include <cuda.h>
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nvrtc.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

#define ASSERT_NVRTC(expr) ASSERT_EQ(nvrtcGetErrorString(expr), std::string("NVRTC_SUCCESS"))
#define EXPECT_NVRTC(expr) EXPECT_EQ(nvrtcGetErrorString(expr), std::string("NVRTC_SUCCESS"))
#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS)
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS)

constexpr const char* kSaxpy = R"(
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

std::string programLog(nvrtcProgram prog) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size == 0) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) return {};
  log.resize(size - 1);
  return log;
}

// A program compiled with `options`; the result of nvrtcCompileProgram in *result.
nvrtcProgram compile(const char* source, const std::vector<const char*>& options, nvrtcResult* result) {
  nvrtcProgram prog = nullptr;
  EXPECT_NVRTC(nvrtcCreateProgram(&prog, source, "test.cu", 0, nullptr, nullptr));
  *result = nvrtcCompileProgram(prog, static_cast<int>(options.size()), options.data());
  return prog;
}

std::string cubinOf(nvrtcProgram prog) {
  size_t size = 0;
  EXPECT_NVRTC(nvrtcGetCUBINSize(prog, &size));
  std::string cubin(size, '\0');
  if (size > 0) {
    EXPECT_NVRTC(nvrtcGetCUBIN(prog, cubin.data()));
  }
  return cubin;
}

std::string ptxOf(nvrtcProgram prog) {
  size_t size = 0;
  EXPECT_NVRTC(nvrtcGetPTXSize(prog, &size));
  std::string ptx(size, '\0');
  if (size > 0) {
    EXPECT_NVRTC(nvrtcGetPTX(prog, ptx.data()));
  }
  return ptx;
}

// NVIDIA's NVRTC, opened directly, for comparison.
struct NvidiaNvrtc {
  void* handle = nullptr;
  decltype(&nvrtcCreateProgram) create = nullptr;
  decltype(&nvrtcCompileProgram) compile = nullptr;
  decltype(&nvrtcDestroyProgram) destroy = nullptr;
  decltype(&nvrtcGetCUBINSize) cubinSize = nullptr;
  decltype(&nvrtcGetPTXSize) ptxSize = nullptr;
  decltype(&nvrtcGetPTX) ptx = nullptr;
  decltype(&nvrtcVersion) version = nullptr;
  decltype(&nvrtcGetNumSupportedArchs) numArchs = nullptr;

  static const NvidiaNvrtc& get() {
    static const NvidiaNvrtc n = [] {
      NvidiaNvrtc r;
      const char* path = std::getenv("PHOS_TEST_NVIDIA_NVRTC");
      if (path == nullptr || *path == '\0') return r;
      r.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (r.handle == nullptr) return r;
      auto load = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(r.handle, name)); };
      load(r.create, "nvrtcCreateProgram");
      load(r.compile, "nvrtcCompileProgram");
      load(r.destroy, "nvrtcDestroyProgram");
      load(r.cubinSize, "nvrtcGetCUBINSize");
      load(r.ptxSize, "nvrtcGetPTXSize");
      load(r.ptx, "nvrtcGetPTX");
      load(r.version, "nvrtcVersion");
      load(r.numArchs, "nvrtcGetNumSupportedArchs");
      return r;
    }();
    return n;
  }

  // What NVIDIA's NVRTC answers for a compile: its result, nvrtcGetCUBINSize's
  // result and size, and the PTX.
  struct Outcome {
    nvrtcResult compiled;
    nvrtcResult cubinSizeResult;
    size_t cubinSize = 0;
    std::string ptx;
  };
  Outcome run(const char* source, const std::vector<const char*>& options) const {
    Outcome o{};
    nvrtcProgram prog = nullptr;
    EXPECT_EQ(create(&prog, source, "test.cu", 0, nullptr, nullptr), NVRTC_SUCCESS);
    o.compiled = compile(prog, static_cast<int>(options.size()), options.data());
    o.cubinSizeResult = cubinSize(prog, &o.cubinSize);
    size_t n = 0;
    if (o.compiled == NVRTC_SUCCESS && ptxSize(prog, &n) == NVRTC_SUCCESS && n > 0) {
      o.ptx.assign(n, '\0');
      EXPECT_EQ(ptx(prog, o.ptx.data()), NVRTC_SUCCESS);
    }
    destroy(&prog);
    return o;
  }
};

class VgpuNvrtc : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
  }
  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_CU(cuDevicePrimaryCtxRelease(0));
    }
  }
  const NvidiaNvrtc& nvidia() {
    const NvidiaNvrtc& n = NvidiaNvrtc::get();
    EXPECT_NE(n.handle, nullptr) << "PHOS_TEST_NVIDIA_NVRTC does not name NVIDIA's libnvrtc.so.13";
    return n;
  }

  // Launches saxpy from `module` on 1000 elements and checks y = 2x + y.
  void runSaxpy(CUfunction fn) {
    const int n = 1000;
    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i);
      y[i] = static_cast<float>(3 * i + 1);
    }
    CUdeviceptr dx = 0, dy = 0;
    ASSERT_CU(cuMemAlloc(&dx, n * sizeof(float)));
    ASSERT_CU(cuMemAlloc(&dy, n * sizeof(float)));
    ASSERT_CU(cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
    ASSERT_CU(cuMemcpyHtoD(dy, y.data(), n * sizeof(float)));
    float a = 2.0f;
    int count = n;
    void* args[] = {&a, &dx, &dy, &count};
    ASSERT_CU(cuLaunchKernel(fn, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
    ASSERT_CU(cuCtxSynchronize());
    std::vector<float> out(n);
    ASSERT_CU(cuMemcpyDtoH(out.data(), dy, n * sizeof(float)));
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * x[i] + y[i]) << "element " << i;
    EXPECT_CU(cuMemFree(dx));
    EXPECT_CU(cuMemFree(dy));
  }

  CUcontext ctx_ = nullptr;
};

// The cuda-samples way: compile for the device's own architecture, take the
// cubin, load it, launch.
TEST_F(VgpuNvrtc, CompileForTheDeviceLoadTheCubinAndLaunch) {
  int major = 0, minor = 0;
  ASSERT_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
  ASSERT_CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0));
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(major) + std::to_string(minor);
  nvrtcProgram prog = nullptr;
  ASSERT_NVRTC(nvrtcCreateProgram(&prog, kSaxpy, "saxpy.cu", 0, nullptr, nullptr));
  const char* options[] = {arch.c_str(), "--std=c++17"};
  nvrtcResult r = nvrtcCompileProgram(prog, 2, options);
  ASSERT_NVRTC(r) << programLog(prog);
  size_t cubinSize = 0;
  ASSERT_NVRTC(nvrtcGetCUBINSize(prog, &cubinSize));
  ASSERT_GT(cubinSize, 0u);
  std::vector<char> cubin(cubinSize);
  ASSERT_NVRTC(nvrtcGetCUBIN(prog, cubin.data()));
  ASSERT_NVRTC(nvrtcDestroyProgram(&prog));
  EXPECT_EQ(prog, nullptr);

  CUmodule module = nullptr;
  ASSERT_CU(cuModuleLoadData(&module, cubin.data()));
  CUfunction fn = nullptr;
  ASSERT_CU(cuModuleGetFunction(&fn, module, "saxpy"));
  runSaxpy(fn);
  EXPECT_CU(cuModuleUnload(module));
}

// Every spelling of a real architecture gives the PTX of the matching virtual
// one as the "cubin": NUL-terminated, the same bytes as nvrtcGetPTX, and the
// PTX NVIDIA's NVRTC makes for compute_XX.
TEST_F(VgpuNvrtc, RealArchitectureInAnySpellingYieldsPtx) {
  const NvidiaNvrtc::Outcome reference = nvidia().run(kSaxpy, {"--gpu-architecture=compute_80"});
  ASSERT_EQ(reference.compiled, NVRTC_SUCCESS);
  const std::vector<std::vector<const char*>> spellings = {
      {"--gpu-architecture=sm_80"}, {"-arch=sm_80"}, {"--gpu-architecture", "sm_80"}, {"-arch", "sm_80"},
      {"-lineinfo", "-arch", "sm_80", "-default-device"}};
  for (const auto& options : spellings) {
    SCOPED_TRACE(::testing::PrintToString(options));
    nvrtcResult r{};
    nvrtcProgram prog = compile(kSaxpy, options, &r);
    ASSERT_NVRTC(r) << programLog(prog);
    const std::string cubin = cubinOf(prog);
    ASSERT_FALSE(cubin.empty());
    EXPECT_EQ(cubin.back(), '\0');
    EXPECT_THAT(cubin, HasSubstr(".version"));
    EXPECT_THAT(cubin, HasSubstr(".target sm_80"));
    EXPECT_EQ(cubin, ptxOf(prog));
    if (options.size() == 1) {
      EXPECT_EQ(cubin, reference.ptx);  // -lineinfo changes the PTX
    }
    EXPECT_NVRTC(nvrtcDestroyProgram(&prog));
  }
  // Architecture-specific and family targets keep their suffix.
  for (const char* arch : {"-arch=sm_90a", "-arch=sm_120f"}) {
    nvrtcResult r{};
    nvrtcProgram prog = compile(kSaxpy, {arch}, &r);
    ASSERT_NVRTC(r) << arch << ": " << programLog(prog);
    const std::string want = std::string(".target ") + (arch + 6);
    EXPECT_THAT(cubinOf(prog), HasSubstr(want)) << arch;
    EXPECT_NVRTC(nvrtcDestroyProgram(&prog));
  }
}

// A virtual architecture, LTO-IR and no architecture at all are NVIDIA's
// business: the same results as NVIDIA's NVRTC, nvrtcGetCUBINSize included
// (no cubin is made for them).
TEST_F(VgpuNvrtc, OtherTargetsBehaveAsNvidiaNvrtc) {
  const std::vector<std::vector<const char*>> cases = {
      {"--gpu-architecture=compute_80"}, {"-arch", "compute_90"}, {}, {"-dlto", "-arch=sm_80"}};
  for (const auto& options : cases) {
    SCOPED_TRACE(::testing::PrintToString(options));
    const NvidiaNvrtc::Outcome reference = nvidia().run(kSaxpy, options);
    nvrtcResult r{};
    nvrtcProgram prog = compile(kSaxpy, options, &r);
    EXPECT_EQ(r, reference.compiled);
    size_t size = 12345;
    EXPECT_EQ(nvrtcGetCUBINSize(prog, &size), reference.cubinSizeResult);
    EXPECT_EQ(size, reference.cubinSize);
    if (!reference.ptx.empty()) {
      EXPECT_EQ(ptxOf(prog), reference.ptx);
    }
    EXPECT_NVRTC(nvrtcDestroyProgram(&prog));
  }
  // With -dlto the result is LTO-IR, as NVRTC documents.
  nvrtcResult r{};
  nvrtcProgram prog = compile(kSaxpy, {"-dlto", "-arch=sm_80"}, &r);
  ASSERT_NVRTC(r);
  size_t lto = 0;
  EXPECT_NVRTC(nvrtcGetLTOIRSize(prog, &lto));
  EXPECT_GT(lto, 0u);
  EXPECT_NVRTC(nvrtcDestroyProgram(&prog));
}

// Errors are NVRTC's own, with their logs.
TEST_F(VgpuNvrtc, BadOptionAndCompileErrorKeepTheirLogs) {
  nvrtcResult r{};
  nvrtcProgram prog = compile(kSaxpy, {"--gpu-architecture=sm_80", "--no-such-option"}, &r);
  EXPECT_EQ(r, NVRTC_ERROR_INVALID_OPTION);
  EXPECT_THAT(programLog(prog), HasSubstr("unrecognized option --no-such-option"));
  EXPECT_NVRTC(nvrtcDestroyProgram(&prog));

  prog = compile(kSaxpy, {"-arch=sm_12"}, &r);
  EXPECT_EQ(r, NVRTC_ERROR_INVALID_OPTION);
  EXPECT_THAT(programLog(prog), HasSubstr("--gpu-architecture"));
  EXPECT_NVRTC(nvrtcDestroyProgram(&prog));

  const char* broken = "extern \"C\" __global__ void k(int* p) { *p = undeclared; }";
  const NvidiaNvrtc::Outcome reference = nvidia().run(broken, {"--gpu-architecture=sm_80"});
  prog = compile(broken, {"--gpu-architecture=sm_80"}, &r);
  EXPECT_EQ(r, NVRTC_ERROR_COMPILATION);
  EXPECT_EQ(r, reference.compiled);
  EXPECT_THAT(programLog(prog), HasSubstr("identifier \"undeclared\" is undefined"));
  size_t size = 12345;
  EXPECT_EQ(nvrtcGetCUBINSize(prog, &size), reference.cubinSizeResult);
  EXPECT_EQ(size, reference.cubinSize);
  EXPECT_NVRTC(nvrtcDestroyProgram(&prog));
  EXPECT_EQ(nvrtcDestroyProgram(&prog), NVRTC_ERROR_INVALID_PROGRAM);
  EXPECT_EQ(nvrtcGetCUBINSize(nullptr, &size), NVRTC_ERROR_INVALID_PROGRAM);
}

// The "cubin" is accepted wherever vgpu takes one: a library, and the linker
// given it as a cubin. Name expressions work through the forwarding.
TEST_F(VgpuNvrtc, CubinLoadsAsLibraryAndLinksAsCubin) {
  const char* source = R"(
template <int N> __global__ void scale(float* x) { x[threadIdx.x] *= N; }
)";
  nvrtcProgram prog = nullptr;
  ASSERT_NVRTC(nvrtcCreateProgram(&prog, source, "scale.cu", 0, nullptr, nullptr));
  ASSERT_NVRTC(nvrtcAddNameExpression(prog, "scale<3>"));
  const char* options[] = {"-arch=sm_80"};
  ASSERT_NVRTC(nvrtcCompileProgram(prog, 1, options));
  const char* lowered = nullptr;
  ASSERT_NVRTC(nvrtcGetLoweredName(prog, "scale<3>", &lowered));
  const std::string name = lowered;
  EXPECT_THAT(name, StartsWith("_Z5scaleILi3EEvPf"));
  const std::string cubin = cubinOf(prog);
  ASSERT_NVRTC(nvrtcDestroyProgram(&prog));

  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 32 * sizeof(float)));
  std::vector<float> ones(32, 1.0f);
  ASSERT_CU(cuMemcpyHtoD(d, ones.data(), 32 * sizeof(float)));

  CUlibrary library = nullptr;
  ASSERT_CU(cuLibraryLoadData(&library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&kernel, library, name.c_str()));
  void* args[] = {&d};
  ASSERT_CU(cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));

  CUlinkState link = nullptr;
  ASSERT_CU(cuLinkCreate(0, nullptr, nullptr, &link));
  ASSERT_CU(cuLinkAddData(link, CU_JIT_INPUT_CUBIN, const_cast<char*>(cubin.data()), cubin.size(), "scale.cubin", 0,
                          nullptr, nullptr));
  void* image = nullptr;
  size_t imageSize = 0;
  ASSERT_CU(cuLinkComplete(link, &image, &imageSize));
  CUmodule module = nullptr;
  ASSERT_CU(cuModuleLoadData(&module, image));
  ASSERT_CU(cuLinkDestroy(link));
  CUfunction fn = nullptr;
  ASSERT_CU(cuModuleGetFunction(&fn, module, name.c_str()));
  ASSERT_CU(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));

  std::vector<float> out(32);
  ASSERT_CU(cuMemcpyDtoH(out.data(), d, 32 * sizeof(float)));
  EXPECT_EQ(out, std::vector<float>(32, 9.0f));  // scaled by 3, twice
  EXPECT_CU(cuModuleUnload(module));
  EXPECT_CU(cuLibraryUnload(library));
  EXPECT_CU(cuMemFree(d));
}

// What needs no program is NVIDIA's answer.
TEST_F(VgpuNvrtc, VersionAndArchitecturesAreNvidias) {
  int major = 0, minor = 0, nvMajor = -1, nvMinor = -1;
  EXPECT_NVRTC(nvrtcVersion(&major, &minor));
  EXPECT_EQ(nvidia().version(&nvMajor, &nvMinor), NVRTC_SUCCESS);
  EXPECT_EQ(major, nvMajor);
  EXPECT_EQ(minor, nvMinor);
  int count = 0, nvCount = -1;
  EXPECT_NVRTC(nvrtcGetNumSupportedArchs(&count));
  EXPECT_EQ(nvidia().numArchs(&nvCount), NVRTC_SUCCESS);
  EXPECT_EQ(count, nvCount);
  std::vector<int> archs(static_cast<size_t>(count));
  EXPECT_NVRTC(nvrtcGetSupportedArchs(archs.data()));
  EXPECT_NE(std::find(archs.begin(), archs.end(), 80), archs.end());
  EXPECT_EQ(std::string(nvrtcGetErrorString(NVRTC_ERROR_COMPILATION)), "NVRTC_ERROR_COMPILATION");
}

// Run with PHOS_VGPU_NVRTC naming no usable NVIDIA NVRTC (missing, or vgpu's
// own library): every entry point fails with NVRTC_ERROR_INTERNAL_ERROR, error
// strings still come, and nothing recurses.
TEST(VgpuNvrtcWithoutNvidia, EntryPointsFailCleanly) {
  int major = 0, minor = 0;
  EXPECT_EQ(nvrtcVersion(&major, &minor), NVRTC_ERROR_INTERNAL_ERROR);
  nvrtcProgram prog = nullptr;
  EXPECT_EQ(nvrtcCreateProgram(&prog, kSaxpy, "saxpy.cu", 0, nullptr, nullptr), NVRTC_ERROR_INTERNAL_ERROR);
  EXPECT_EQ(nvrtcCompileProgram(prog, 0, nullptr), NVRTC_ERROR_INTERNAL_ERROR);
  EXPECT_EQ(std::string(nvrtcGetErrorString(NVRTC_ERROR_INVALID_OPTION)), "NVRTC_ERROR_INVALID_OPTION");
  // __nvrtcCPEx (exported, not declared in nvrtc.h) goes through vgpu's
  // trampoline, which has nothing to jump to here.
  auto cpEx = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "__nvrtcCPEx"));
  ASSERT_NE(cpEx, nullptr);
  Dl_info where{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(cpEx), &where), 0);
  EXPECT_THAT(std::string(where.dli_fname), HasSubstr("vgpu/libnvrtc.so.13"));
  EXPECT_EQ(cpEx(), NVRTC_ERROR_INTERNAL_ERROR);
}

}  // namespace
