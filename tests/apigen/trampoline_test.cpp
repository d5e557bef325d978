// SPDX-License-Identifier: Apache-2.0
// The generated trampolines, loaded as a shared library: exported symbols, default behaviour, argument forwarding.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

#include "elf_symbols.h"
#include "phos/cuda_api/api_table.h"
#include "phos/cuda_api/dispatch.h"
#include "status_matchers.h"

namespace phos::cuda_api {
namespace {

using ::phos::testing::IsOk;

class Library {
 public:
  explicit Library(const char* path) : handle_(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {}
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  // The exported function `name`, typed like `prototype` (a declaration from cuda.h).
  template <typename Fn>
  Fn* get(const char* name, Fn* /*prototype*/ = nullptr) const {
    return reinterpret_cast<Fn*>(dlsym(handle_, name));
  }

 private:
  void* handle_;
};

TEST(Trampolines, ExportExactlyTheTable) {
  Result<std::set<std::string>> exported = phos::testing::definedDynamicSymbols(PHOS_TRAMPOLINES_EXPORTS_SO);
  ASSERT_THAT(exported, IsOk());
  std::set<std::string> expected;
  for (const EntryPointInfo& e : entryPoints()) expected.emplace(e.symbol);
  EXPECT_EQ(*exported, expected);
  EXPECT_EQ(exported->size(), kEntryPointCount);
}

// Everything below calls into the probe library: the trampolines plus hooks
// to reach its (otherwise hidden) dispatch table and log sink.
class ProbeLibrary : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(lib_.loaded()) << dlerror();
    auto* getDispatch = lib_.get<Dispatch*()>("phosProbeDispatch");
    ASSERT_NE(getDispatch, nullptr);
    table_ = getDispatch();
    table_->resetAll();
  }
  void TearDown() override {
    if (table_ != nullptr) table_->resetAll();
  }

  static inline Library lib_{PHOS_TRAMPOLINES_PROBE_SO};
  Dispatch* table_ = nullptr;
};

std::size_t countOccurrences(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST_F(ProbeLibrary, TrampolineAddressesAreTheExportedFunctions) {
  auto* trampolineOf = lib_.get<GenericFn(EntryPointId)>("phosProbeTrampoline");
  ASSERT_NE(trampolineOf, nullptr);
  for (const EntryPointInfo& e : entryPoints()) {
    std::string symbol(e.symbol);
    EXPECT_EQ(reinterpret_cast<void*>(trampolineOf(e.id)), lib_.get<void()>(symbol.c_str())) << symbol;
  }
  EXPECT_EQ(trampolineOf(kNoEntryPoint), nullptr);
}

TEST_F(ProbeLibrary, EmptySlotReturnsNotSupportedAndLogsOnce) {
  std::string logFile = (std::filesystem::temp_directory_path() /
                         ("phos-trampolines-" + std::to_string(getpid()) + ".log")).string();
  lib_.get<void(const char*)>("phosProbeLogTo")(logFile.c_str());

  auto* init = lib_.get("cuInit", &::cuInit);
  auto* count = lib_.get("cuDeviceGetCount", &::cuDeviceGetCount);
  ASSERT_NE(init, nullptr);
  ASSERT_NE(count, nullptr);
  EXPECT_EQ(init(0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(init(0), CUDA_ERROR_NOT_SUPPORTED);
  int n = 42;
  EXPECT_EQ(count(&n), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(n, 42) << "the default implementation touches no argument";
  EXPECT_EQ(count(&n), CUDA_ERROR_NOT_SUPPORTED);

  std::ifstream in(logFile);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(logFile);
  EXPECT_EQ(countOccurrences(text.str(), "cuInit is not supported"), 1u) << text.str();
  EXPECT_EQ(countOccurrences(text.str(), "cuDeviceGetCount is not supported"), 1u) << text.str();
  EXPECT_THAT(text.str(), ::testing::HasSubstr("[shim]"));
}

// What the fake implementations saw.
struct Seen {
  int calls = 0;
  CUdeviceptr* dptr = nullptr;
  size_t bytes = 0;
  const CUDA_MEMCPY2D* copy = nullptr;
  CUDA_MEMCPY2D copyValue{};
  unsigned dims[7] = {};
  CUfunction f = nullptr;
  CUstream stream = nullptr;
  void** kernelParams = nullptr;
  void** extra = nullptr;
  const CUlaunchConfig* config = nullptr;
  unsigned legacyBytes = 0;
  float bias = 0;
  unsigned char byte = 0;
};
Seen seen;

CUresult fakeMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  ++seen.calls;
  seen.dptr = dptr;
  seen.bytes = bytesize;
  *dptr = 0x7f0000001000ull;
  return CUDA_SUCCESS;
}
static_assert(std::is_same_v<decltype(&fakeMemAlloc), decltype(&::cuMemAlloc_v2)>);

CUresult fakeMemcpy2D(const CUDA_MEMCPY2D* pCopy) {
  ++seen.calls;
  seen.copy = pCopy;
  seen.copyValue = *pCopy;
  return CUDA_ERROR_INVALID_VALUE;  // any code: it must reach the caller unchanged
}
static_assert(std::is_same_v<decltype(&fakeMemcpy2D), decltype(&::cuMemcpy2D_v2)>);

CUresult fakeLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared, CUstream stream, void** kernelParams, void** extra) {
  ++seen.calls;
  seen.f = f;
  unsigned dims[7] = {gx, gy, gz, bx, by, bz, shared};
  std::copy(std::begin(dims), std::end(dims), seen.dims);
  seen.stream = stream;
  seen.kernelParams = kernelParams;
  seen.extra = extra;
  return CUDA_SUCCESS;
}
static_assert(std::is_same_v<decltype(&fakeLaunchKernel), decltype(&::cuLaunchKernel)>);

CUresult fakeLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  ++seen.calls;
  seen.config = config;
  seen.f = f;
  seen.kernelParams = kernelParams;
  seen.extra = extra;
  return CUDA_SUCCESS;
}
static_assert(std::is_same_v<decltype(&fakeLaunchKernelEx), decltype(&::cuLaunchKernelEx)>);

// The CUDA 2.0 ABI of cuMemAlloc: 32-bit device pointers and sizes.
using LegacyMemAlloc = CUresult(unsigned int*, unsigned int);
CUresult fakeLegacyMemAlloc(unsigned int* dptr, unsigned int bytesize) {
  ++seen.calls;
  seen.legacyBytes = bytesize;
  *dptr = 0x1000u;
  return CUDA_SUCCESS;
}

CUresult fakeSetMipmapLevelBias(CUtexref, float bias) {
  ++seen.calls;
  seen.bias = bias;
  return CUDA_SUCCESS;
}

CUresult fakeMemsetD8(CUdeviceptr dst, unsigned char uc, size_t n) {
  ++seen.calls;
  seen.bytes = n;
  seen.byte = uc;
  seen.dptr = reinterpret_cast<CUdeviceptr*>(dst);
  return CUDA_SUCCESS;
}
static_assert(std::is_same_v<decltype(&fakeMemsetD8), decltype(&::cuMemsetD8_v2)>);

TEST_F(ProbeLibrary, InstalledSlotReceivesTheArguments) {
  seen = {};
  auto* memAlloc = lib_.get("cuMemAlloc_v2", &::cuMemAlloc_v2);
  ASSERT_NE(memAlloc, nullptr);
  table_->install(EntryPointId::kCuMemAlloc_v2, toSlot(&fakeMemAlloc));
  CUdeviceptr ptr = 0;
  EXPECT_EQ(memAlloc(&ptr, 123456789012ull), CUDA_SUCCESS);
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.dptr, &ptr);
  EXPECT_EQ(seen.bytes, 123456789012ull);
  EXPECT_EQ(ptr, 0x7f0000001000ull);

  // A struct behind a const pointer arrives as the same pointer.
  auto* memcpy2D = lib_.get("cuMemcpy2D_v2", &::cuMemcpy2D_v2);
  table_->install(EntryPointId::kCuMemcpy2D_v2, toSlot(&fakeMemcpy2D));
  CUDA_MEMCPY2D copy{};
  copy.srcMemoryType = CU_MEMORYTYPE_HOST;
  copy.srcHost = &copy;
  copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.dstDevice = 0xdead0000ull;
  copy.WidthInBytes = 640;
  copy.Height = 480;
  EXPECT_EQ(memcpy2D(&copy), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(seen.copy, &copy);
  EXPECT_EQ(seen.copyValue.dstDevice, 0xdead0000ull);
  EXPECT_EQ(seen.copyValue.WidthInBytes, 640u);
  EXPECT_EQ(seen.copyValue.Height, 480u);
  EXPECT_EQ(seen.copyValue.srcHost, &copy);

  // Eleven arguments: some of them are passed on the stack.
  auto* launch = lib_.get("cuLaunchKernel", &::cuLaunchKernel);
  table_->install(EntryPointId::kCuLaunchKernel, toSlot(&fakeLaunchKernel));
  auto fn = reinterpret_cast<CUfunction>(0x1111);
  auto stream = reinterpret_cast<CUstream>(0x2222);
  int a = 1;
  void* params[] = {&a};
  void* extra[] = {CU_LAUNCH_PARAM_END};
  EXPECT_EQ(launch(fn, 1, 2, 3, 4, 5, 6, 7, stream, params, extra), CUDA_SUCCESS);
  EXPECT_EQ(seen.f, fn);
  EXPECT_THAT(seen.dims, ::testing::ElementsAre(1u, 2u, 3u, 4u, 5u, 6u, 7u));
  EXPECT_EQ(seen.stream, stream);
  EXPECT_EQ(seen.kernelParams, params);
  EXPECT_EQ(seen.extra, extra);
  // The per-thread symbol has its own slot.
  auto* launchPtsz = lib_.get("cuLaunchKernel_ptsz", &::cuLaunchKernel);
  ASSERT_NE(launchPtsz, nullptr);
  EXPECT_EQ(launchPtsz(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), CUDA_ERROR_NOT_SUPPORTED);

  auto* launchEx = lib_.get("cuLaunchKernelEx", &::cuLaunchKernelEx);
  table_->install(EntryPointId::kCuLaunchKernelEx, toSlot(&fakeLaunchKernelEx));
  CUlaunchConfig config{};
  config.gridDimX = 9;
  config.hStream = stream;
  EXPECT_EQ(launchEx(&config, fn, params, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(seen.config, &config);
  EXPECT_EQ(seen.f, fn);
  EXPECT_EQ(seen.kernelParams, params);
  EXPECT_EQ(seen.extra, nullptr);

  // The legacy ABI keeps its 32-bit parameters.
  auto* legacy = lib_.get<LegacyMemAlloc>("cuMemAlloc");
  ASSERT_NE(legacy, nullptr);
  table_->install(EntryPointId::kCuMemAlloc, toSlot(&fakeLegacyMemAlloc));
  unsigned int legacyPtr = 0;
  EXPECT_EQ(legacy(&legacyPtr, 0xfffffff0u), CUDA_SUCCESS);
  EXPECT_EQ(seen.legacyBytes, 0xfffffff0u);
  EXPECT_EQ(legacyPtr, 0x1000u);

  // A float travels in a vector register, a byte in a narrow integer one.
  // (cuTexRefSetMipmapLevelBias is deprecated: typed by hand, not by its declaration.)
  auto* bias = lib_.get<CUresult(CUtexref, float)>("cuTexRefSetMipmapLevelBias");
  table_->install(EntryPointId::kCuTexRefSetMipmapLevelBias, toSlot(&fakeSetMipmapLevelBias));
  EXPECT_EQ(bias(nullptr, -2.5f), CUDA_SUCCESS);
  EXPECT_EQ(seen.bias, -2.5f);
  auto* memset8 = lib_.get("cuMemsetD8_v2", &::cuMemsetD8_v2);
  table_->install(EntryPointId::kCuMemsetD8_v2, toSlot(&fakeMemsetD8));
  EXPECT_EQ(memset8(0xbeef00ull, 0xab, (size_t{1} << 33) + 1), CUDA_SUCCESS);
  EXPECT_EQ(seen.byte, 0xab);
  EXPECT_EQ(seen.bytes, (size_t{1} << 33) + 1);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(seen.dptr), 0xbeef00ull);

  EXPECT_EQ(seen.calls, 7);

  // Emptying the slot restores the default.
  table_->reset(EntryPointId::kCuMemAlloc_v2);
  EXPECT_EQ(memAlloc(&ptr, 1), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(seen.calls, 7);
}

}  // namespace
}  // namespace phos::cuda_api
