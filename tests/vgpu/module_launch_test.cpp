// SPDX-License-Identifier: Apache-2.0
// vgpu's modules, libraries, linker and launches, through a recording ProgramLoader (no PTX engine needed).
#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// saxpy(float a, const float* x, float* y, int n) as PTX lays it out.
FakeKernel saxpyKernel() {
  FakeKernel k;
  k.info.name = "saxpy";
  k.info.params = {{0, 4}, {8, 8}, {16, 8}, {24, 4}};
  k.info.paramBufferSize = 28;
  k.info.registersPerThread = 32;
  return k;
}

FakeKernel bumpKernel() {
  FakeKernel k;
  k.info.name = "bump";
  k.info.staticSharedBytes = 1024;
  return k;
}

FakeModule kernelsModule() {
  FakeModule m;
  m.kernels = {saxpyKernel(), bumpKernel()};
  std::vector<std::byte> seven(4);
  const int v = 7;
  std::memcpy(seven.data(), &v, 4);
  m.globals = {{"hiddenCounter", seven}, {"scale", std::vector<std::byte>(4)}};
  return m;
}

std::string fixture(const char* name) {
#ifdef PHOS_VGPU_FIXTURES
  std::ifstream in(std::string(PHOS_VGPU_FIXTURES) + "/" + name, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
#else
  (void)name;
  return {};
#endif
}

template <typename T>
T paramAt(const RecordedLaunch& launch, size_t offset) {
  T value{};
  std::memcpy(&value, launch.params.data() + offset, sizeof(T));
  return value;
}

class ModuleTest : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    loader_ = installLoader(kernelsModule());
  }
  CUmodule load() {
    CUmodule m = nullptr;
    EXPECT_CU(cuModuleLoadData(&m, kTinyPtx));
    return m;
  }
  std::shared_ptr<RecordingLoader> loader_;
};

TEST_F(DriverTest, WithoutALoaderModulesAreNotSupported) {
  exportTable()->setProgramLoader(nullptr);
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuModuleLoadData(&m, kTinyPtx));
}

TEST_F(ModuleTest, PtxTextReachesTheLoaderUnchanged) {
  CUmodule m = load();
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(loader_->loadedPtx().size(), 1u);
  EXPECT_EQ(loader_->loadedPtx()[0], kTinyPtx);
  EXPECT_CU(cuModuleUnload(m));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(m));
}

TEST_F(ModuleTest, BadImagesAreRefused) {
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(&m, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(nullptr, kTinyPtx));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, "this is not a module at all"));
  // Machine code loads (as on a GPU of another architecture) and runs nothing.
  unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  ASSERT_CU(cuModuleLoadData(&m, elf));
  CUfunction f = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleGetFunction(&f, m, "saxpy"));
  EXPECT_CU(cuModuleUnload(m));
  EXPECT_CU_ERR(CUDA_ERROR_FILE_NOT_FOUND, cuModuleLoad(&m, "/nonexistent/kernels.ptx"));
  EXPECT_TRUE(loader_->loadedPtx().empty());
}

TEST_F(ModuleTest, LoaderErrorsMapToPtxErrors) {
  loader_->failLoadsWith(Status(Code::kInvalidArgument, "line 3: unexpected token"));
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_PTX, cuModuleLoadData(&m, kTinyPtx));
  loader_->failLoadsWith(Status(Code::kNotSupported, ".version 99.0"));
  EXPECT_CU_ERR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, cuModuleLoadData(&m, kTinyPtx));
}

TEST_F(ModuleTest, NvccFatbinsYieldTheirPtx) {
  std::string zstd = fixture("kernels_ptx.fatbin");
  std::string lz4 = fixture("kernels_lz4.fatbin");
  std::string mixed = fixture("kernels_mixed.fatbin");
  if (zstd.empty()) GTEST_SKIP() << "nvcc fixtures were not built";
  CUmodule a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  ASSERT_CU(cuModuleLoadData(&a, zstd.data()));
  ASSERT_CU(cuModuleLoadFatBinary(&b, lz4.data()));
  ASSERT_CU(cuModuleLoadDataEx(&c, mixed.data(), 0, nullptr, nullptr));
  auto ptx = loader_->loadedPtx();
  ASSERT_EQ(ptx.size(), 3u);
  for (const std::string& text : ptx) {
    EXPECT_THAT(text, HasSubstr(".entry saxpy"));
    EXPECT_THAT(text, HasSubstr("hiddenCounter"));
    EXPECT_EQ(text.find('\0'), std::string::npos);
  }
  // The mixed fatbin has compute_75 and compute_80 PTX: the newest not above the device.
  EXPECT_THAT(ptx[2], HasSubstr(".target sm_80"));
  // The same PTX whatever the compression.
  EXPECT_EQ(ptx[0], ptx[1]);
  std::string text = fixture("kernels.ptx");
  ASSERT_CU(cuModuleLoadData(&d, text.c_str()));
  EXPECT_EQ(loader_->loadedPtx()[3], text);  // nvcc -ptx output, comments and all
  for (CUmodule m : {a, b, c, d}) EXPECT_CU(cuModuleUnload(m));
}

TEST_F(ModuleTest, MachineCodeOnlyReachesNoLoader) {
  std::string sass = fixture("kernels_sass.fatbin");
  std::string cubin = fixture("kernels.cubin");
  if (sass.empty()) GTEST_SKIP() << "nvcc fixtures were not built";
  for (const std::string* image : {&sass, &cubin}) {
    CUmodule m = nullptr;
    ASSERT_CU(cuModuleLoadData(&m, image->data()));
    CUfunction f = nullptr;
    EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleGetFunction(&f, m, "saxpy"));
    EXPECT_CU(cuModuleUnload(m));
  }
  EXPECT_TRUE(loader_->loadedPtx().empty());
}

TEST_F(ModuleTest, LoadFromFile) {
#ifdef PHOS_VGPU_FIXTURES
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoad(&m, PHOS_VGPU_FIXTURES "/kernels.ptx"));
  EXPECT_THAT(loader_->loadedPtx().at(0), HasSubstr(".entry bump"));
  EXPECT_CU(cuModuleUnload(m));
#else
  GTEST_SKIP() << "nvcc fixtures were not built";
#endif
}

TEST_F(ModuleTest, JitLogOptionsAreAnswered) {
  char info[64], error[64];
  std::memset(info, 'x', sizeof(info));
  std::memset(error, 'x', sizeof(error));
  CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_WALL_TIME};
  void* values[] = {info, reinterpret_cast<void*>(sizeof(info)), error, reinterpret_cast<void*>(sizeof(error)),
                    nullptr};
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadDataEx(&m, kTinyPtx, 5, options, values));
  EXPECT_EQ(info[0], '\0');
  EXPECT_EQ(error[0], '\0');
  EXPECT_EQ(values[1], nullptr);  // OUT: bytes of log written
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadDataEx(&m, kTinyPtx, 1, nullptr, values));
  CUjit_option bogus = static_cast<CUjit_option>(9999);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadDataEx(&m, kTinyPtx, 1, &bogus, values));
}

TEST_F(ModuleTest, FunctionsAndTheirParameters) {
  CUmodule m = load();
  CUfunction f = nullptr, g = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, m, "saxpy"));
  ASSERT_CU(cuModuleGetFunction(&g, m, "saxpy"));
  EXPECT_EQ(f, g);  // one handle per kernel
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuModuleGetFunction(&g, m, "nope"));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleGetFunction(&g, m, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleGetFunction(nullptr, m, "saxpy"));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuModuleGetFunction(&g, reinterpret_cast<CUmodule>(0x99), "saxpy"));
  unsigned count = 0;
  EXPECT_CU(cuModuleGetFunctionCount(&count, m));
  EXPECT_EQ(count, 2u);
  CUfunction all[2] = {};
  EXPECT_CU(cuModuleEnumerateFunctions(all, 2, m));
  EXPECT_EQ(all[0], f);
  const char* name = nullptr;
  EXPECT_CU(cuFuncGetName(&name, all[1]));
  EXPECT_STREQ(name, "bump");
  CUmodule owner = nullptr;
  EXPECT_CU(cuFuncGetModule(&owner, f));
  EXPECT_EQ(owner, m);
  size_t offset = 0, size = 0;
  EXPECT_CU(cuFuncGetParamInfo(f, 2, &offset, &size));
  EXPECT_EQ(offset, 16u);
  EXPECT_EQ(size, 8u);
  EXPECT_CU(cuFuncGetParamInfo(f, 3, &offset, nullptr));
  EXPECT_EQ(offset, 24u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(f, 4, &offset, &size));
  int regs = 0, maxThreads = 0, shared = 0;
  EXPECT_CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
  EXPECT_EQ(regs, 32);
  EXPECT_CU(cuFuncGetAttribute(&maxThreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
  EXPECT_EQ(maxThreads, 1024);
  EXPECT_CU(cuFuncGetAttribute(&shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, all[1]));
  EXPECT_EQ(shared, 1024);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncGetAttribute(&regs, static_cast<CUfunction_attribute>(999), f));
  EXPECT_CU(cuModuleUnload(m));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuFuncGetName(&name, f));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuFuncGetParamInfo(f, 0, &offset, &size));
}

TEST_F(ModuleTest, GlobalsIncludingNonVisibleOnes) {
  CUmodule m = load();
  CUdeviceptr counter = 0;
  size_t bytes = 0;
  ASSERT_CU(cuModuleGetGlobal(&counter, &bytes, m, "hiddenCounter"));
  EXPECT_EQ(bytes, 4u);
  int value = 0;
  EXPECT_CU(cuMemcpyDtoH(&value, counter, 4));
  EXPECT_EQ(value, 7);  // the initializer the loader wrote through DeviceMemory
  EXPECT_CU(cuModuleGetGlobal(nullptr, &bytes, m, "scale"));  // outputs are optional
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuModuleGetGlobal(&counter, &bytes, m, "missing"));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleGetGlobal(&counter, &bytes, m, nullptr));
  EXPECT_CU(cuModuleUnload(m));
  // Module globals are freed with the module.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(&value, counter, 4));
}

TEST_F(ModuleTest, KernelParamsArePackedAtPtxOffsets) {
  CUmodule m = load();
  CUfunction f = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, m, "saxpy"));
  float a = 2.5F;
  CUdeviceptr x = 0x1111222233334444ull, y = 0x5555666677778888ull;
  int n = 1000;
  void* args[] = {&a, &x, &y, &n};
  ASSERT_CU(cuLaunchKernel(f, 4, 2, 1, 128, 2, 1, 256, nullptr, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  auto launches = loader_->launches();
  ASSERT_EQ(launches.size(), 1u);
  const RecordedLaunch& l = launches[0];
  EXPECT_EQ(l.kernel, "saxpy");
  ASSERT_EQ(l.params.size(), 28u);
  EXPECT_EQ(paramAt<float>(l, 0), 2.5F);
  EXPECT_EQ(paramAt<CUdeviceptr>(l, 8), x);
  EXPECT_EQ(paramAt<CUdeviceptr>(l, 16), y);
  EXPECT_EQ(paramAt<int>(l, 24), 1000);
  EXPECT_EQ(l.config.grid.x, 4u);
  EXPECT_EQ(l.config.grid.y, 2u);
  EXPECT_EQ(l.config.block.x, 128u);
  EXPECT_EQ(l.config.block.y, 2u);
  EXPECT_EQ(l.config.dynamicSharedBytes, 256u);
  EXPECT_EQ(l.device, 0);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(ModuleTest, ExtraParameterBuffer) {
  CUmodule m = load();
  CUfunction f = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, m, "saxpy"));
  std::vector<std::byte> buffer(28);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<std::byte>(i + 1);
  size_t size = buffer.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ASSERT_CU(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, extra));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_EQ(loader_->launches().size(), 1u);
  EXPECT_EQ(loader_->launches()[0].params, buffer);
  size_t small = 8;
  void* tooSmall[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &small,
                      CU_LAUNCH_PARAM_END};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, tooSmall));
  void* noSize[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_END};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, noSize));
  void* unknown[] = {reinterpret_cast<void*>(0x77), buffer.data(), CU_LAUNCH_PARAM_END};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, unknown));
  float a = 1;
  CUdeviceptr p = 0;
  int n = 0;
  void* args[] = {&a, &p, &p, &n};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, args, extra));
  EXPECT_EQ(loader_->launches().size(), 1u);  // refused launches never reach the engine
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(ModuleTest, LaunchValidation) {
  CUmodule m = load();
  CUfunction f = nullptr, bump = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, m, "saxpy"));
  ASSERT_CU(cuModuleGetFunction(&bump, m, "bump"));
  float a = 1;
  CUdeviceptr p = 0;
  int n = 0;
  void* args[] = {&a, &p, &p, &n};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 65536, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 32, 32, 2, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 1, 1, 65, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE,
                cuLaunchKernel(nullptr, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0,
                                                          reinterpret_cast<CUstream>(0x4242), args, nullptr));
  // Dynamic shared memory: 48 KiB minus static by default, more after opting in.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuLaunchKernel(bump, 1, 1, 1, 32, 1, 1, 48 * 1024, nullptr, nullptr, nullptr));
  EXPECT_CU(cuLaunchKernel(bump, 1, 1, 1, 32, 1, 1, 47 * 1024, nullptr, nullptr, nullptr));
  EXPECT_CU(cuFuncSetAttribute(bump, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 * 1024));
  int dyn = 0;
  EXPECT_CU(cuFuncGetAttribute(&dyn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bump));
  EXPECT_EQ(dyn, 64 * 1024);
  EXPECT_CU(cuLaunchKernel(bump, 1, 1, 1, 32, 1, 1, 64 * 1024, nullptr, nullptr, nullptr));
  // The device's opt-in limit counts bump's 1 KiB of static shared memory too.
  int optIn = 0;
  ASSERT_CU(cuDeviceGetAttribute(&optIn, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0));
  EXPECT_CU(cuFuncSetAttribute(bump, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optIn - 1024));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuFuncSetAttribute(bump, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optIn - 1023));
  // The deprecated bank size of a function: checked, then nothing to do (fixed at four bytes).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_CU(cuFuncSetSharedMemConfig(bump, CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuFuncSetSharedMemConfig(bump, static_cast<CUsharedconfig>(3)));
#pragma GCC diagnostic pop
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(loader_->launches().size(), 2u);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(ModuleTest, LaunchesRunAsynchronouslyOnTheirStream) {
  std::atomic<bool> release{false};
  FakeModule module = kernelsModule();
  module.kernels[1].body = [&](const LaunchConfig&, std::span<const std::byte>, const LaunchContext& context) {
    EXPECT_NE(context.memory, nullptr);
    EXPECT_NE(context.printf, nullptr);
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return Status::ok();
  };
  loader_ = installLoader(module);
  CUmodule m = load();
  CUfunction bump = nullptr;
  ASSERT_CU(cuModuleGetFunction(&bump, m, "bump"));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuLaunchKernel(bump, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  release = true;
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(ModuleTest, KernelFaultsAreStickyForTheContext) {
  FakeModule module = kernelsModule();
  CUdeviceptr seenAllocation = 0;
  bool accessible = false, foreignAccessible = true;
  module.kernels[1].body = [&](const LaunchConfig&, std::span<const std::byte>, const LaunchContext& context) {
    accessible = context.memory->isAccessible(seenAllocation, 16);
    foreignAccessible = context.memory->isAccessible(0x1000, 16);
    return kernelFaultStatus(KernelFault::kIllegalAddress, "st.global.u32 to 0x1000 in bump");
  };
  loader_ = installLoader(module);
  ASSERT_CU(cuMemAlloc(&seenAllocation, 64));
  CUmodule m = load();
  CUfunction bump = nullptr;
  ASSERT_CU(cuModuleGetFunction(&bump, m, "bump"));
  // The launch itself succeeds; the fault shows at the next synchronizing call
  // and then on every call that uses the context.
  EXPECT_CU(cuLaunchKernel(bump, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
  CUdeviceptr p = 0;
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemAlloc(&p, 16));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
  EXPECT_TRUE(accessible);
  EXPECT_FALSE(foreignAccessible);
  // Another context is unaffected.
  CUcontext fresh = nullptr;
  ASSERT_CU(cuCtxCreate(&fresh, nullptr, 0, 0));
  EXPECT_CU(cuMemAlloc(&p, 16));
  EXPECT_CU(cuMemFree(p));
  EXPECT_CU(cuCtxDestroy(fresh));
}

TEST_F(ModuleTest, LaunchKernelExAndCooperativeLaunch) {
  CUmodule m = load();
  CUfunction bump = nullptr;
  ASSERT_CU(cuModuleGetFunction(&bump, m, "bump"));
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  attr.value.cooperative = 1;
  CUlaunchConfig config{};
  config.gridDimX = 3;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 64;
  config.blockDimY = config.blockDimZ = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  EXPECT_CU(cuLaunchKernelEx(&config, bump, nullptr, nullptr));
  int sms = 0;
  ASSERT_CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
  EXPECT_CU(cuLaunchCooperativeKernel(bump, sms, 1, 1, 64, 1, 1, 0, nullptr, nullptr));
  // More blocks than can be resident at once.
  EXPECT_CU_ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                cuLaunchCooperativeKernel(bump, sms * 64, 1, 1, 1024, 1, 1, 0, nullptr, nullptr));
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = 2;
  attr.value.clusterDim.y = attr.value.clusterDim.z = 1;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuLaunchKernelEx(&config, bump, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(nullptr, bump, nullptr, nullptr));
  EXPECT_CU(cuCtxSynchronize());
  auto launches = loader_->launches();
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_EQ(launches[0].config.grid.x, 3u);
  EXPECT_EQ(launches[0].config.block.x, 64u);
  EXPECT_EQ(launches[1].config.grid.x, static_cast<unsigned>(sms));
  EXPECT_TRUE(launches[0].config.cooperative);
  EXPECT_TRUE(launches[1].config.cooperative);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(ModuleTest, Occupancy) {
  CUmodule m = load();
  CUfunction f = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, m, "saxpy"));
  int threadsPerSm = 0, sms = 0;
  ASSERT_CU(cuDeviceGetAttribute(&threadsPerSm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 0));
  ASSERT_CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
  int blocks = 0;
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 256, 0));
  EXPECT_EQ(blocks, threadsPerSm / 256);  // resident threads per SM
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 32, 0));
  EXPECT_EQ(blocks, 32);  // the block limit
  int minGrid = 0, blockSize = 0;
  EXPECT_CU(cuOccupancyMaxPotentialBlockSize(&minGrid, &blockSize, f, nullptr, 0, 0));
  EXPECT_GT(blockSize, 0);
  EXPECT_EQ(minGrid % sms, 0);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuOccupancyMaxActiveBlocksPerMultiprocessor(nullptr, f, 256, 0));
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(ModuleTest, LibrariesAndKernels) {
  CUlibrary lib = nullptr;
  ASSERT_CU(cuLibraryLoadData(&lib, kTinyPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&kernel, lib, "saxpy"));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuLibraryGetKernel(&kernel, lib, "missing"));
  ASSERT_CU(cuLibraryGetKernel(&kernel, lib, "saxpy"));
  unsigned count = 0;
  EXPECT_CU(cuLibraryGetKernelCount(&count, lib));
  EXPECT_EQ(count, 2u);
  CUlibrary owner = nullptr;
  EXPECT_CU(cuKernelGetLibrary(&owner, kernel));
  EXPECT_EQ(owner, lib);
  const char* name = nullptr;
  EXPECT_CU(cuKernelGetName(&name, kernel));
  EXPECT_STREQ(name, "saxpy");
  size_t offset = 0, size = 0;
  EXPECT_CU(cuKernelGetParamInfo(kernel, 1, &offset, &size));
  EXPECT_EQ(offset, 8u);
  EXPECT_EQ(size, 8u);
  CUfunction f = nullptr;
  EXPECT_CU(cuKernelGetFunction(&f, kernel));
  CUdeviceptr global = 0;
  EXPECT_CU(cuLibraryGetGlobal(&global, &size, lib, "hiddenCounter"));
  EXPECT_NE(global, 0u);
  // A CUkernel may be launched as a CUfunction.
  float a = 1;
  CUdeviceptr p = 0;
  int n = 0;
  void* args[] = {&a, &p, &p, &n};
  EXPECT_CU(cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(loader_->launches().size(), 1u);
  CUmodule mod = nullptr;
  EXPECT_CU(cuLibraryGetModule(&mod, lib));
  EXPECT_CU(cuLibraryUnload(lib));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLibraryUnload(lib));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuKernelGetName(&name, kernel));
}

// "Attributes set using cuFuncSetAttribute() will override the attribute set by
// [cuKernelSetAttribute] irrespective of whether the call to cuFuncSetAttribute()
// is made before or after": a restore sets a kernel's opt-in again with
// cuKernelSetAttribute, and the program's later cuFuncSetAttribute through the
// CUkernel must still hold (found by the differential tester, seed 123).
TEST_F(ModuleTest, FunctionAttributesOverrideTheKernelsInEitherOrder) {
  CUlibrary lib = nullptr;
  ASSERT_CU(cuLibraryLoadData(&lib, kTinyPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&kernel, lib, "saxpy"));
  auto asFunction = reinterpret_cast<CUfunction>(kernel);
  CUfunction f = nullptr;
  ASSERT_CU(cuKernelGetFunction(&f, kernel));
  auto optIn = [](CUfunction fn) {
    int v = 0;
    EXPECT_CU(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn));
    return v;
  };
  EXPECT_CU(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 96 * 1024, kernel, 0));
  EXPECT_EQ(optIn(f), 96 * 1024);
  EXPECT_EQ(optIn(asFunction), 96 * 1024);
  // The function's own value wins, set after the kernel's ...
  EXPECT_CU(cuFuncSetAttribute(asFunction, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 68 * 1024));
  EXPECT_EQ(optIn(asFunction), 68 * 1024);
  EXPECT_EQ(optIn(f), 68 * 1024);
  // ... and before it.
  EXPECT_CU(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 80 * 1024, kernel, 0));
  EXPECT_EQ(optIn(asFunction), 68 * 1024);
  int kernelValue = 0;
  EXPECT_CU(cuKernelGetAttribute(&kernelValue, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kernel, 0));
  EXPECT_EQ(kernelValue, 80 * 1024);
  EXPECT_CU(cuLibraryUnload(lib));
}

TEST_F(ModuleTest, LinkerWithPtx) {
  CUlinkState state = nullptr;
  ASSERT_CU(cuLinkCreate(0, nullptr, nullptr, &state));
  std::string ptx = kTinyPtx;
  ASSERT_CU(cuLinkAddData(state, CU_JIT_INPUT_PTX, ptx.data(), ptx.size(), "tiny.ptx", 0, nullptr, nullptr));
  char elf[] = "\x7f" "ELF....";
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU,
                cuLinkAddData(state, CU_JIT_INPUT_CUBIN, elf, sizeof(elf), "x.cubin", 0, nullptr, nullptr));
  void* image = nullptr;
  size_t size = 0;
  ASSERT_CU(cuLinkComplete(state, &image, &size));
  EXPECT_GT(size, ptx.size());
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, image));
  EXPECT_EQ(loader_->loadedPtx().at(0), ptx);
  EXPECT_CU(cuLinkDestroy(state));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLinkDestroy(state));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLinkComplete(state, &image, &size));
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(ModuleTest, ModulesDieWithTheirContext) {
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, 0));
  CUmodule m = load();
  CUfunction f = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, m, "saxpy"));
  ASSERT_CU(cuCtxDestroy(other));
  const char* name = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuFuncGetName(&name, f));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(m));
}

}  // namespace
}  // namespace phos::vgpu::testing
