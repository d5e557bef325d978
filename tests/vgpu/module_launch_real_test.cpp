// SPDX-License-Identifier: Apache-2.0
// vgpu's modules, libraries and launches with real kernels (fixtures/launch_kernels.cu), seen only through the Driver API.
//
// The same executable runs directly on vgpu (tests/vgpu) and through
// libphos.so and a phosd of its own (tests/vgpu_phos): it touches nothing but
// cu* entry points, and where the remoting documents a different but
// legitimate behaviour (docs/remoting.md, "Semantics kept, and where they
// differ") the test asserts each mode's behaviour explicitly.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

using ::testing::HasSubstr;

// run_under_phos.py gives the test the daemon's directory (and scrubs the
// variable from the environment of direct runs).
bool throughPhos() { return std::getenv("PHOS_RUNTIME_DIR") != nullptr; }

// The kernels of launch_kernels.cu, in no particular order.
const std::set<std::string> kKernelNames = {"saxpy", "bump", "packParams", "spin", "storeTo", "greet"};

std::string fixturePath(const char* name) { return std::string(PHOS_LAUNCH_FIXTURES) + "/" + name; }

// The file's bytes; std::string keeps a NUL after them, which PTX text needs.
std::string fixture(const char* name) {
  std::ifstream in(fixturePath(name), std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// What nvcc embeds in a host object around a fatbin (crt/host_runtime.h's
// __fatBinC_Wrapper_t): cuModuleLoadData and cuModuleLoadFatBinary take either.
struct FatbinWrapper {
  int magic;
  int version;
  const void* data;
  void* filenameOrFatbins;
};
constexpr int kFatbinWrapperMagic = 0x466243b1;

// packParams' by-value struct and what it writes back, as launch_kernels.cu declares them.
struct Packet {
  char tag;
  int count;
  double value;
  long long id;
};
static_assert(sizeof(Packet) == 24);
struct Echo {
  long long c, s, i;
  double d;
  long long tag, count;
  double value;
  long long id;
  unsigned long long self;
};

// spin's result, computed on the host.
unsigned lcg(unsigned iterations) {
  unsigned x = 1;
  for (unsigned k = 0; k < iterations; ++k) x = x * 1664525u + 1013904223u;
  return x;
}

// A launch the driver refuses. Directly, the call itself fails. Through phosd
// launches are posted, so a refusal only the driver can make (limits of the
// device or the kernel, a stream phosd does not know) comes with the next
// synchronizing call, once (docs/remoting.md: "An error of a posted call (a
// launch with a bad configuration ...) is reported by the next synchronizing
// call").
void expectLaunchRefused(CUresult expected, CUresult launched) {
  if (!throughPhos()) {
    EXPECT_CU_ERR(expected, launched);
    return;
  }
  EXPECT_CU(launched);
  EXPECT_CU_ERR(expected, cuCtxSynchronize());
}
#define EXPECT_LAUNCH_REFUSED(code, expr) \
  do {                                    \
    SCOPED_TRACE(#expr);                  \
    expectLaunchRefused(code, expr);      \
  } while (0)

class RealModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&device_, 0));
    ASSERT_CU(cuCtxCreate(&context_, nullptr, 0, device_));
    ptx_ = fixture("launch_kernels.ptx");
    ASSERT_FALSE(ptx_.empty()) << "missing fixture " << fixturePath("launch_kernels.ptx");
  }
  void TearDown() override {
    for (CUdeviceptr p : allocations_) (void)cuMemFree(p);
    if (context_ != nullptr) (void)cuCtxDestroy(context_);
  }

  CUmodule load() {
    CUmodule m = nullptr;
    EXPECT_CU(cuModuleLoadData(&m, ptx_.c_str()));
    return m;
  }
  CUfunction function(CUmodule m, const char* name) {
    CUfunction f = nullptr;
    EXPECT_CU(cuModuleGetFunction(&f, m, name));
    return f;
  }

  template <typename T>
  CUdeviceptr upload(const std::vector<T>& host) {
    CUdeviceptr p = 0;
    EXPECT_CU(cuMemAlloc(&p, host.size() * sizeof(T)));
    allocations_.push_back(p);
    EXPECT_CU(cuMemcpyHtoD(p, host.data(), host.size() * sizeof(T)));
    return p;
  }
  template <typename T>
  std::vector<T> download(CUdeviceptr p, size_t count) {
    std::vector<T> host(count);
    EXPECT_CU(cuMemcpyDtoH(host.data(), p, count * sizeof(T)));
    return host;
  }
  template <typename T>
  T read(CUdeviceptr p) {
    T value{};
    EXPECT_CU(cuMemcpyDtoH(&value, p, sizeof(T)));
    return value;
  }
  CUdeviceptr zeroed(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_CU(cuMemAlloc(&p, bytes));
    allocations_.push_back(p);
    EXPECT_CU(cuMemsetD8(p, 0, bytes));
    return p;
  }

  // Runs saxpy (y = a * x * scale + y) over 1000 elements and checks every
  // one; the values are exact in float whatever the rounding.
  void expectSaxpyComputes(CUfunction f, float scale = 2.0f) {
    int n = 1000;
    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i);
      y[i] = static_cast<float>(i % 7);
    }
    CUdeviceptr dx = upload(x), dy = upload(y);
    float a = 0.5F;
    void* args[] = {&a, &dx, &dy, &n};
    ASSERT_CU(cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
    ASSERT_CU(cuCtxSynchronize());
    std::vector<float> out = download<float>(dy, n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], a * x[i] * scale + y[i]) << "element " << i;
  }

  std::string ptx_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  std::vector<CUdeviceptr> allocations_;
};

TEST_F(RealModuleTest, PtxTextLoadsAndRuns) {
  CUmodule m = load();
  ASSERT_NE(m, nullptr);
  expectSaxpyComputes(function(m, "saxpy"));
  EXPECT_CU(cuModuleUnload(m));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(m));
}

// The launch API before CUDA 4.0, as programs of the time used it: the block
// shape, then each parameter at its (aligned) offset, the total size last,
// then a grid. Deprecated, and still in cuda.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_F(RealModuleTest, TheLaunchApiBeforeCuda4SetsAndLaunchesPieceByPiece) {
  CUmodule m = load();
  ASSERT_NE(m, nullptr);
  CUfunction f = function(m, "saxpy");
  int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = static_cast<float>(i % 7);
  }
  CUdeviceptr dx = upload(x), dy = upload(y);
  // Before a block shape, the launch is of an empty block.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchGrid(f, 8, 1));
  ASSERT_CU(cuFuncSetBlockShape(f, 128, 1, 1));
  ASSERT_CU(cuFuncSetSharedSize(f, 0));
  ASSERT_CU(cuParamSetf(f, 0, 0.5F));
  ASSERT_CU(cuParamSetv(f, 8, &dx, sizeof(dx)));
  ASSERT_CU(cuParamSetv(f, 16, &dy, sizeof(dy)));
  ASSERT_CU(cuParamSeti(f, 24, static_cast<unsigned>(n)));
  ASSERT_CU(cuParamSetSize(f, 28));
  ASSERT_CU(cuLaunchGrid(f, (n + 127) / 128, 1));
  ASSERT_CU(cuCtxSynchronize());
  std::vector<float> out = download<float>(dy, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 0.5F * x[i] * 2.0f + y[i]) << "element " << i;
  // Asynchronously on a stream, the same parameters: y grows again.
  CUstream stream = nullptr;
  ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuLaunchGridAsync(f, (n + 127) / 128, 1, stream));
  ASSERT_CU(cuStreamSynchronize(stream));
  EXPECT_CU(cuStreamDestroy(stream));
  std::vector<float> again = download<float>(dy, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(again[i], 0.5F * x[i] * 2.0f + out[i]) << "element " << i;
  // cuLaunch is one block: only the first 128 elements change.
  ASSERT_CU(cuLaunch(f));
  ASSERT_CU(cuCtxSynchronize());
  std::vector<float> once = download<float>(dy, n);
  EXPECT_EQ(once[127], 0.5F * x[127] * 2.0f + again[127]);
  EXPECT_EQ(once[128], again[128]);
  // A size the kernel's parameters do not have is the launch's error (posted
  // under PhOS: reported by the next synchronizing call).
  ASSERT_CU(cuParamSetSize(f, 12));
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_INVALID_VALUE, cuLaunchGrid(f, 1, 1));
  // What the calls check themselves.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuFuncSetBlockShape(nullptr, 1, 1, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncSetBlockShape(f, 0, 1, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuParamSeti(f, -4, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuParamSetv(f, 0, nullptr, 8));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuParamSetSize(f, 1 << 20));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchGrid(f, 0, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLaunch(nullptr));
  EXPECT_CU(cuModuleUnload(m));
}
#pragma GCC diagnostic pop

// A kernel compiled for thread block clusters (__cluster_dims__) runs in
// clusters on a GPU at every launch; vgpu runs no clusters, so the launch is
// refused, naming the shape, rather than run as clusters of one CTA.
TEST_F(RealModuleTest, KernelsCompiledForClustersAreRefusedAtLaunch) {
  const char* ptx = R"(.version 8.0
.target sm_90
.address_size 64
.visible .entry clustered() .reqnctapercluster 2, 1, 1
{
  ret;
}
)";
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, ptx));
  CUfunction f = function(m, "clustered");
  int width = -1, height = -1;
  EXPECT_CU(cuFuncGetAttribute(&width, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, f));
  EXPECT_CU(cuFuncGetAttribute(&height, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT, f));
  EXPECT_EQ(width, 2);
  EXPECT_EQ(height, 1);
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_NOT_SUPPORTED,
                        cuLaunchKernel(f, 2, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, BadImagesAreRefused) {
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(&m, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(nullptr, ptx_.c_str()));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, "this is not a module at all"));
  // A 64-bit ELF header without sections: machine code, not PTX. It loads (as
  // on a GPU of another architecture) and has nothing to run.
  unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  ASSERT_CU(cuModuleLoadData(&m, elf));
  CUfunction none = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleGetFunction(&none, m, "saxpy"));
  EXPECT_CU(cuModuleUnload(m));
  EXPECT_CU_ERR(CUDA_ERROR_FILE_NOT_FOUND, cuModuleLoad(&m, "/nonexistent/launch_kernels.ptx"));
  // PTX the engine cannot parse: the driver's PTX error, not a crash.
  const char broken[] = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n bogus.op %r1;\n}\n";
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_PTX, cuModuleLoadData(&m, broken));
  // Fatbins whose compressed PTX is damaged (the headers are intact).
  for (const char* name : {"launch_kernels.fatbin", "launch_kernels_lz4.fatbin"}) {
    std::string fatbin = fixture(name);
    ASSERT_GT(fatbin.size(), 512u);
    std::fill(fatbin.begin() + 128, fatbin.end() - 16, '\xa5');
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, fatbin.data())) << name;
  }
  // nvcc's wrapper pointing at nothing, at unmapped memory, at what is no fatbin.
  FatbinWrapper empty{kFatbinWrapperMagic, 1, nullptr, nullptr};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, &empty));
  FatbinWrapper wild{kFatbinWrapperMagic, 1, reinterpret_cast<const void*>(0x10), nullptr};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, &wild));
  CUlibrary lib = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuLibraryLoadData(&lib, &wild, nullptr, nullptr, 0, nullptr, nullptr, 0));
  FatbinWrapper notFatbin{kFatbinWrapperMagic, 1, ptx_.c_str(), nullptr};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, &notFatbin));
  // A fatbin header claiming more than its memory holds.
  std::string fatbin = fixture("launch_kernels.fatbin");
  std::vector<char> truncated(fatbin.begin(), fatbin.begin() + 64);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, truncated.data()));
  // An image pointer into unmapped memory.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(&m, reinterpret_cast<const void*>(0x10)));
  // Still usable afterwards.
  CUmodule good = load();
  EXPECT_CU(cuModuleUnload(good));
}

TEST_F(RealModuleTest, NvccFatbinsRunTheirPtx) {
  std::string zstd = fixture("launch_kernels.fatbin");
  std::string lz4 = fixture("launch_kernels_lz4.fatbin");
  ASSERT_FALSE(zstd.empty());
  ASSERT_FALSE(lz4.empty());
  ASSERT_NE(zstd, lz4);  // --compress-mode=speed really changed the payload
  FatbinWrapper wrapped{kFatbinWrapperMagic, 1, zstd.data(), nullptr};
  FatbinWrapper wrappedLz4{kFatbinWrapperMagic, 1, lz4.data(), nullptr};
  CUmodule modules[5] = {};
  // The bare container (as nvcc -fatbin writes it) and the wrapper nvcc embeds.
  ASSERT_CU(cuModuleLoadData(&modules[0], zstd.data()));
  ASSERT_CU(cuModuleLoadData(&modules[1], lz4.data()));
  ASSERT_CU(cuModuleLoadData(&modules[2], &wrapped));
  ASSERT_CU(cuModuleLoadFatBinary(&modules[3], lz4.data()));
  ASSERT_CU(cuModuleLoadFatBinary(&modules[4], &wrappedLz4));
  for (CUmodule m : modules) {
    SCOPED_TRACE(::testing::Message() << "module " << (&m - modules));
    expectSaxpyComputes(function(m, "saxpy"));
    unsigned count = 0;
    EXPECT_CU(cuModuleGetFunctionCount(&count, m));
    EXPECT_EQ(count, kKernelNames.size());
    EXPECT_CU(cuModuleUnload(m));
  }
}

// Machine code only (SASS, a cubin): loaded, as a GPU of another
// architecture loads it lazily, and refused when a kernel or a global of it is
// asked for. A runtime registering every kernel of a program at start (cudart)
// must not fail on the ones it never launches.
TEST_F(RealModuleTest, MachineCodeOnlyLoadsAndIsRefusedAtUse) {
  std::string sass = fixture("launch_kernels_sass.fatbin");
  std::string cubin = fixture("launch_kernels.cubin");
  ASSERT_FALSE(sass.empty());
  ASSERT_FALSE(cubin.empty());
  std::vector<CUmodule> modules(4);
  ASSERT_CU(cuModuleLoadData(&modules[0], sass.data()));
  ASSERT_CU(cuModuleLoadData(&modules[1], cubin.data()));
  ASSERT_CU(cuModuleLoadFatBinary(&modules[2], sass.data()));
  ASSERT_CU(cuModuleLoad(&modules[3], fixturePath("launch_kernels.cubin").c_str()));
  for (CUmodule m : modules) {
    CUfunction f = nullptr;
    EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleGetFunction(&f, m, "saxpy"));
    CUdeviceptr global = 0;
    EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleGetGlobal(&global, nullptr, m, "hiddenCounter"));
    unsigned count = 99;
    EXPECT_CU(cuModuleGetFunctionCount(&count, m));
    EXPECT_EQ(count, 0u);
    EXPECT_CU(cuModuleUnload(m));
  }
  CUlibrary lib = nullptr;
  ASSERT_CU(cuLibraryLoadData(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuLibraryGetKernel(&kernel, lib, "saxpy"));
  EXPECT_CU(cuLibraryUnload(lib));
}

// "CUlibrary ... context-independent": loaded without a context, its kernels
// run in whichever context is current, each with its own copy of the
// library's globals; the library outlives a context it was used in.
TEST_F(RealModuleTest, LibrariesAreContextIndependent) {
  ASSERT_CU(cuCtxPopCurrent(nullptr));
  CUcontext none = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&none));
  ASSERT_EQ(none, nullptr);
  CUlibrary lib = nullptr;
  ASSERT_CU(cuLibraryLoadData(&lib, ptx_.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel saxpy = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&saxpy, lib, "saxpy"));
  unsigned count = 0;
  EXPECT_CU(cuLibraryGetKernelCount(&count, lib));
  EXPECT_EQ(count, kKernelNames.size());
  // Loading it retained no primary context.
  unsigned flags = 0;
  int active = 1;
  ASSERT_CU(cuDevicePrimaryCtxGetState(device_, &flags, &active));
  EXPECT_EQ(active, 0);
  // Without a current context there is no function or global to give.
  CUfunction f = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuKernelGetFunction(&f, saxpy));
  CUdeviceptr global = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuLibraryGetGlobal(&global, nullptr, lib, "hiddenCounter"));

  ASSERT_CU(cuCtxPushCurrent(context_));
  CUfunction inFirst = nullptr;
  ASSERT_CU(cuKernelGetFunction(&inFirst, saxpy));
  expectSaxpyComputes(reinterpret_cast<CUfunction>(saxpy));
  CUdeviceptr firstCounter = 0;
  ASSERT_CU(cuLibraryGetGlobal(&firstCounter, nullptr, lib, "hiddenCounter"));

  CUcontext second = nullptr;
  ASSERT_CU(cuCtxCreate(&second, nullptr, 0, device_));  // now current
  CUfunction inSecond = nullptr;
  ASSERT_CU(cuKernelGetFunction(&inSecond, saxpy));
  EXPECT_NE(inSecond, inFirst);
  CUdeviceptr secondCounter = 0;
  ASSERT_CU(cuLibraryGetGlobal(&secondCounter, nullptr, lib, "hiddenCounter"));
  EXPECT_NE(secondCounter, firstCounter);
  expectSaxpyComputes(reinterpret_cast<CUfunction>(saxpy));
  ASSERT_CU(cuCtxDestroy(second));

  // The first context still runs it; the destroyed one took only its copy.
  ASSERT_CU(cuCtxSetCurrent(context_));
  expectSaxpyComputes(reinterpret_cast<CUfunction>(saxpy));
  EXPECT_CU(cuLibraryUnload(lib));
}

// A __managed__ variable (.attribute(.managed)): one copy for the library in
// every context, found without a current context, the host dereferencing it
// and kernels of two contexts adding to it.
TEST_F(RealModuleTest, ManagedVariablesAreOneCopyTheHostUses) {
  constexpr const char* kPtx = R"(.version 8.0
.target sm_80
.address_size 64
.global .attribute(.managed) .align 4 .u32 counter = 5;
.global .align 4 .u32 plain = 1;
.visible .entry bump()
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<2>;
	mov.u64 	%rd1, counter;
	atom.global.add.u32 	%r1, [%rd1], 1;
	ret;
}
)";
  ASSERT_CU(cuCtxPopCurrent(nullptr));
  CUlibrary lib = nullptr;
  ASSERT_CU(cuLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUdeviceptr counter = 0;
  size_t bytes = 0;
  ASSERT_CU(cuLibraryGetManaged(&counter, &bytes, lib, "counter"));
  EXPECT_EQ(bytes, 4u);
  auto* host = reinterpret_cast<volatile unsigned*>(counter);
  EXPECT_EQ(*host, 5u);
  int managed = 0;
  EXPECT_CU(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, counter));
  EXPECT_EQ(managed, 1);
  CUdeviceptr other = 0;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuLibraryGetManaged(&other, nullptr, lib, "plain"));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuLibraryGetManaged(&other, nullptr, lib, "missing"));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLibraryGetManaged(nullptr, nullptr, lib, "counter"));

  CUkernel bump = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&bump, lib, "bump"));
  ASSERT_CU(cuCtxPushCurrent(context_));
  ASSERT_CU(cuLaunchKernel(reinterpret_cast<CUfunction>(bump), 1, 1, 1, 32, 1, 1, 0, nullptr,
                           nullptr, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(*host, 37u);
  CUcontext second = nullptr;
  ASSERT_CU(cuCtxCreate(&second, nullptr, 0, device_));  // now current
  CUdeviceptr inSecond = 0;
  ASSERT_CU(cuLibraryGetGlobal(&inSecond, nullptr, lib, "counter"));
  EXPECT_EQ(inSecond, counter);
  *host = 100;  // the host writes it; the second context's kernels see it
  ASSERT_CU(cuLaunchKernel(reinterpret_cast<CUfunction>(bump), 2, 1, 1, 32, 1, 1, 0, nullptr,
                           nullptr, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(*host, 164u);
  ASSERT_CU(cuCtxDestroy(second));
  ASSERT_CU(cuCtxSetCurrent(context_));
  EXPECT_CU(cuLibraryUnload(lib));
}

TEST_F(RealModuleTest, LoadFromFile) {
  CUmodule ptx = nullptr, fatbin = nullptr;
  ASSERT_CU(cuModuleLoad(&ptx, fixturePath("launch_kernels.ptx").c_str()));
  ASSERT_CU(cuModuleLoad(&fatbin, fixturePath("launch_kernels_lz4.fatbin").c_str()));
  // Each module has its own globals: bump adds 1 to the first one's counter only.
  CUdeviceptr counter = 0, other = 0;
  ASSERT_CU(cuModuleGetGlobal(&counter, nullptr, ptx, "hiddenCounter"));
  ASSERT_CU(cuModuleGetGlobal(&other, nullptr, fatbin, "hiddenCounter"));
  EXPECT_NE(counter, other);
  CUdeviceptr noEcho = 0;
  unsigned noDynamic = 0;
  void* args[] = {&noEcho, &noDynamic};
  ASSERT_CU(cuLaunchKernel(function(ptx, "bump"), 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(read<int>(counter), 8);
  EXPECT_EQ(read<int>(other), 7);
  EXPECT_CU(cuModuleUnload(ptx));
  EXPECT_CU(cuModuleUnload(fatbin));
}

TEST_F(RealModuleTest, JitLogOptionsAreAnswered) {
  char info[64], error[64];
  std::memset(info, 'x', sizeof(info));
  std::memset(error, 'x', sizeof(error));
  CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_WALL_TIME};
  void* values[] = {info, reinterpret_cast<void*>(sizeof(info)), error, reinterpret_cast<void*>(sizeof(error)),
                    nullptr};
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadDataEx(&m, ptx_.c_str(), 5, options, values));
  EXPECT_EQ(info[0], '\0');
  EXPECT_EQ(error[0], '\0');
  EXPECT_EQ(values[1], nullptr);  // OUT: bytes of log written
  EXPECT_EQ(values[3], nullptr);
  expectSaxpyComputes(function(m, "saxpy"));
  EXPECT_CU(cuModuleUnload(m));
  CUmodule none = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadDataEx(&none, ptx_.c_str(), 1, nullptr, values));
  // No options at all is a plain load.
  ASSERT_CU(cuModuleLoadDataEx(&m, ptx_.c_str(), 0, nullptr, nullptr));
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, FunctionsAndTheirParameters) {
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
  ASSERT_EQ(count, kKernelNames.size());
  std::vector<CUfunction> all(count);
  EXPECT_CU(cuModuleEnumerateFunctions(all.data(), count, m));
  std::set<std::string> names;
  for (CUfunction each : all) {
    const char* name = nullptr;
    EXPECT_CU(cuFuncGetName(&name, each));
    ASSERT_NE(name, nullptr);
    names.insert(name);
    if (std::string(name) == "saxpy") {
      EXPECT_EQ(each, f);
    }
  }
  EXPECT_EQ(names, kKernelNames);
  CUmodule owner = nullptr;
  EXPECT_CU(cuFuncGetModule(&owner, f));
  EXPECT_EQ(owner, m);

  // saxpy(float, const float*, float*, int): 4 bytes, then pointers at 8 and 16.
  size_t offset = 0, size = 0;
  EXPECT_CU(cuFuncGetParamInfo(f, 2, &offset, &size));
  EXPECT_EQ(offset, 16u);
  EXPECT_EQ(size, 8u);
  EXPECT_CU(cuFuncGetParamInfo(f, 3, &offset, nullptr));
  EXPECT_EQ(offset, 24u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(f, 4, &offset, &size));
  // packParams(char, short, int, double, Packet, Echo*): each at its alignment.
  CUfunction pack = function(m, "packParams");
  const std::pair<size_t, size_t> expected[] = {{0, 1}, {2, 2}, {4, 4}, {8, 8}, {16, 24}, {40, 8}};
  for (size_t i = 0; i < std::size(expected); ++i) {
    EXPECT_CU(cuFuncGetParamInfo(pack, i, &offset, &size));
    EXPECT_EQ(offset, expected[i].first) << "parameter " << i;
    EXPECT_EQ(size, expected[i].second) << "parameter " << i;
  }
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(pack, 6, &offset, &size));

  int regs = 0, maxThreads = 0, shared = 0, ptxVersion = 0;
  EXPECT_CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
  EXPECT_GT(regs, 0);
  EXPECT_CU(cuFuncGetAttribute(&maxThreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
  EXPECT_EQ(maxThreads, 1024);
  EXPECT_CU(cuFuncGetAttribute(&shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function(m, "bump")));
  EXPECT_EQ(shared, 1024);  // __shared__ int scratch[256]
  EXPECT_CU(cuFuncGetAttribute(&shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f));
  EXPECT_EQ(shared, 0);
  EXPECT_CU(cuFuncGetAttribute(&ptxVersion, CU_FUNC_ATTRIBUTE_PTX_VERSION, f));
  EXPECT_EQ(ptxVersion, 80);  // nvcc -arch=compute_80
  int binaryVersion = 0, major = 0, minor = 0;
  EXPECT_CU(cuFuncGetAttribute(&binaryVersion, CU_FUNC_ATTRIBUTE_BINARY_VERSION, f));
  ASSERT_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_));
  ASSERT_CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_));
  EXPECT_EQ(binaryVersion, major * 10 + minor);  // JIT-compiled for the device
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncGetAttribute(&regs, static_cast<CUfunction_attribute>(999), f));

  EXPECT_CU(cuModuleUnload(m));
  const char* name = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuFuncGetName(&name, f));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuFuncGetParamInfo(f, 0, &offset, &size));
}

TEST_F(RealModuleTest, GlobalsIncludingNonVisibleOnes) {
  // The variable really is module-private in the PTX the engine gets.
  ASSERT_THAT(ptx_, HasSubstr("\n.global .align 4 .u32 hiddenCounter = 7;"));
  CUmodule m = load();
  CUdeviceptr counter = 0, scale = 0;
  size_t bytes = 0;
  ASSERT_CU(cuModuleGetGlobal(&counter, &bytes, m, "hiddenCounter"));
  EXPECT_EQ(bytes, 4u);
  EXPECT_EQ(read<int>(counter), 7);  // its initializer
  ASSERT_CU(cuModuleGetGlobal(&scale, &bytes, m, "scale"));
  EXPECT_EQ(bytes, 4u);
  EXPECT_EQ(read<float>(scale), 2.0F);
  EXPECT_CU(cuModuleGetGlobal(nullptr, &bytes, m, "scale"));  // outputs are optional
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuModuleGetGlobal(&counter, &bytes, m, "missing"));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleGetGlobal(&counter, &bytes, m, nullptr));

  // Kernels read and write the same memory the host sees.
  float three = 3.0F;
  ASSERT_CU(cuMemcpyHtoD(scale, &three, sizeof(three)));
  expectSaxpyComputes(function(m, "saxpy"), 3.0F);
  CUdeviceptr noEcho = 0;
  unsigned noDynamic = 0;
  void* args[] = {&noEcho, &noDynamic};
  CUfunction bump = function(m, "bump");
  ASSERT_CU(cuLaunchKernel(bump, 4, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr));
  ASSERT_CU(cuLaunchKernel(bump, 4, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(read<int>(counter), 9);  // block 0 of each launch adds 1

  EXPECT_CU(cuModuleUnload(m));
  // Module globals are freed with the module.
  int value = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(&value, counter, 4));
}

TEST_F(RealModuleTest, KernelParamsOfMixedSizesArePackedAtPtxOffsets) {
  CUmodule m = load();
  CUfunction pack = function(m, "packParams");
  char c = -5;
  short s = -1234;
  int i = 0x12345678;
  double d = -2.75;
  Packet p{'Q', -77, 1.0e300, 0x0123456789abcdefLL};
  CUdeviceptr out = zeroed(sizeof(Echo));
  void* args[] = {&c, &s, &i, &d, &p, &out};
  ASSERT_CU(cuLaunchKernel(pack, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  Echo e = read<Echo>(out);
  EXPECT_EQ(e.c, -5);
  EXPECT_EQ(e.s, -1234);
  EXPECT_EQ(e.i, 0x12345678);
  EXPECT_EQ(e.d, -2.75);
  EXPECT_EQ(e.tag, 'Q');
  EXPECT_EQ(e.count, -77);
  EXPECT_EQ(e.value, 1.0e300);
  EXPECT_EQ(e.id, 0x0123456789abcdefLL);
  EXPECT_EQ(e.self, out);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, ExtraParameterBuffer) {
  CUmodule m = load();
  CUfunction pack = function(m, "packParams");
  CUdeviceptr out = zeroed(sizeof(Echo));
  // The buffer is laid out at the PTX offsets cuFuncGetParamInfo gives.
  std::vector<std::byte> buffer(48);
  auto put = [&](size_t offset, const auto& value) { std::memcpy(buffer.data() + offset, &value, sizeof(value)); };
  put(0, char{9});
  put(2, short{-2});
  put(4, int{-300000});
  put(8, 0.125);
  put(16, Packet{'z', 12, -0.5, -1});
  put(40, out);
  size_t size = buffer.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ASSERT_CU(cuLaunchKernel(pack, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra));
  ASSERT_CU(cuCtxSynchronize());
  Echo e = read<Echo>(out);
  EXPECT_EQ(e.c, 9);
  EXPECT_EQ(e.s, -2);
  EXPECT_EQ(e.i, -300000);
  EXPECT_EQ(e.d, 0.125);
  EXPECT_EQ(e.tag, 'z');
  EXPECT_EQ(e.count, 12);
  EXPECT_EQ(e.value, -0.5);
  EXPECT_EQ(e.id, -1);
  EXPECT_EQ(e.self, out);

  ASSERT_CU(cuMemsetD8(out, 0, sizeof(Echo)));
  size_t small = 8;
  void* tooSmall[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &small,
                      CU_LAUNCH_PARAM_END};
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_INVALID_VALUE,
                        cuLaunchKernel(pack, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, tooSmall));
  void* noSize[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_END};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(pack, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, noSize));
  void* unknown[] = {reinterpret_cast<void*>(0x77), buffer.data(), CU_LAUNCH_PARAM_END};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(pack, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, unknown));
  char c = 0;
  short s = 0;
  int i = 0;
  double d = 0;
  Packet p{};
  void* args[] = {&c, &s, &i, &d, &p, &out};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(pack, 1, 1, 1, 1, 1, 1, 0, nullptr, args, extra));
  // None of the refused launches ran.
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(read<Echo>(out).self, 0u);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, LaunchValidation) {
  CUmodule m = load();
  CUfunction f = function(m, "saxpy"), bump = function(m, "bump");
  float a = 1;
  CUdeviceptr p = 0;
  int n = 0;
  void* args[] = {&a, &p, &p, &n};
  // What the shim can check without a round trip fails at the call in both modes.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 0, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(nullptr, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  // The device's and the kernel's limits.
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 65536, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 32, 32, 2, 0, nullptr, args, nullptr));
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 1, 1, 65, 0, nullptr, args, nullptr));
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0,
                                                                  reinterpret_cast<CUstream>(0x4242), args, nullptr));

  // Dynamic shared memory: 48 KiB minus static by default, more after opting
  // in; the kernel writes the last byte it was given, so too little faults.
  CUdeviceptr echo = zeroed(sizeof(int));
  unsigned dynamic = 48 * 1024;
  void* bumpArgs[] = {&echo, &dynamic};
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_INVALID_VALUE,
                        cuLaunchKernel(bump, 1, 1, 1, 32, 1, 1, dynamic, nullptr, bumpArgs, nullptr));
  dynamic = 47 * 1024;
  EXPECT_CU(cuLaunchKernel(bump, 2, 1, 1, 32, 1, 1, dynamic, nullptr, bumpArgs, nullptr));
  EXPECT_CU(cuFuncSetAttribute(bump, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 * 1024));
  int optIn = 0;
  EXPECT_CU(cuFuncGetAttribute(&optIn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bump));
  EXPECT_EQ(optIn, 64 * 1024);
  unsigned large = 64 * 1024;
  void* largeArgs[] = {&echo, &large};
  EXPECT_CU(cuLaunchKernel(bump, 3, 1, 1, 32, 1, 1, large, nullptr, largeArgs, nullptr));
  // Beyond the device's opt-in limit (which counts bump's static shared memory).
  int deviceOptIn = 0;
  ASSERT_CU(cuDeviceGetAttribute(&deviceOptIn, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuFuncSetAttribute(bump, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, deviceOptIn));
  EXPECT_CU(cuCtxSynchronize());
  // Blocks 1+2 of the first launch and 1+2+3 of the second read back their byte.
  EXPECT_EQ(read<int>(echo), 3 + 6);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, LaunchesRunAsynchronouslyOnTheirStream) {
  CUmodule m = load();
  CUfunction spin = function(m, "spin");
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr out = zeroed(sizeof(unsigned));
  // Long enough for the engine that the query below finds it still running.
  unsigned iterations = 20'000'000;
  void* args[] = {&iterations, &out};
  auto start = std::chrono::steady_clock::now();
  ASSERT_CU(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
  auto launched = std::chrono::steady_clock::now();
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  EXPECT_CU(cuStreamSynchronize(s));
  auto done = std::chrono::steady_clock::now();
  EXPECT_CU(cuStreamQuery(s));
  EXPECT_EQ(read<unsigned>(out), lcg(iterations));
  // The launch returned well before the kernel finished.
  EXPECT_LT(launched - start, (done - start) / 2);
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, KernelFaultsAreStickyForTheContext) {
  CUmodule m = load();
  CUfunction storeTo = function(m, "storeTo");
  CUdeviceptr nowhere = 0x1000;
  void* args[] = {&nowhere};
  // The launch itself succeeds; the fault shows at the next synchronizing call
  // and then on every call that uses the context.
  EXPECT_CU(cuLaunchKernel(storeTo, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
  CUdeviceptr p = 0;
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemAlloc(&p, 16));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
  CUmodule again = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuModuleLoadData(&again, ptx_.c_str()));
  // Another context is unaffected and runs kernels.
  CUcontext fresh = nullptr;
  ASSERT_CU(cuCtxCreate(&fresh, nullptr, 0, device_));
  CUmodule clean = load();
  expectSaxpyComputes(function(clean, "saxpy"));
  EXPECT_CU(cuModuleUnload(clean));
  EXPECT_CU(cuCtxDestroy(fresh));
  allocations_.clear();  // they belonged to `fresh`, or to the failed context
}

TEST_F(RealModuleTest, LaunchKernelExWithAttributes) {
  CUmodule m = load();
  CUfunction bump = function(m, "bump");
  CUdeviceptr counter = 0;
  ASSERT_CU(cuModuleGetGlobal(&counter, nullptr, m, "hiddenCounter"));
  CUdeviceptr echo = zeroed(sizeof(int));
  unsigned dynamic = 256;
  void* args[] = {&echo, &dynamic};
  CUlaunchAttribute attrs[2] = {};
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  attrs[0].value.cooperative = 1;
  attrs[1].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  attrs[1].value.priority = 0;
  CUlaunchConfig config{};
  config.gridDimX = 3;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 64;
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = dynamic;
  config.attrs = attrs;
  config.numAttrs = 2;
  ASSERT_CU(cuLaunchKernelEx(&config, bump, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(read<int>(echo), 1 + 2 + 3);
  EXPECT_EQ(read<int>(counter), 8);

  CUlaunchAttribute cluster{};
  cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster.value.clusterDim.x = 2;
  cluster.value.clusterDim.y = cluster.value.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  EXPECT_LAUNCH_REFUSED(CUDA_ERROR_NOT_SUPPORTED, cuLaunchKernelEx(&config, bump, args, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(nullptr, bump, args, nullptr));
  config.numAttrs = 1;
  config.attrs = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(&config, bump, args, nullptr));
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(read<int>(counter), 8);  // the refused launches did not run
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, CooperativeLaunch) {
  CUmodule m = load();
  CUfunction bump = function(m, "bump");
  int supported = 0, sms = 0;
  ASSERT_CU(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, device_));
  ASSERT_CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_));
  EXPECT_EQ(supported, 1);
  CUdeviceptr echo = zeroed(sizeof(int));
  unsigned dynamic = 16;
  void* args[] = {&echo, &dynamic};
  // One block per multiprocessor always fits.
  ASSERT_CU(cuLaunchCooperativeKernel(bump, sms, 1, 1, 64, 1, 1, dynamic, nullptr, args));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_LT(sms, 256);  // each block echoes blockIdx.x + 1 as one byte
  EXPECT_EQ(read<int>(echo), sms * (sms + 1) / 2);
  // More blocks than can be resident at once.
  EXPECT_CU_ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                cuLaunchCooperativeKernel(bump, sms * 64, 1, 1, 1024, 1, 1, 0, nullptr, args));
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, CooperativeGridSync) {
  std::string ptx = fixture("grid_sync_kernel.ptx");
  ASSERT_FALSE(ptx.empty());
  CUmodule m = nullptr;
  CUresult loaded = cuModuleLoadData(&m, ptx.c_str());
  if (loaded == CUDA_ERROR_INVALID_PTX) {
    // cooperative_groups' grid.sync() finds its barrier through %envreg1/2,
    // which CUDA fills for cooperative launches; the engine does not know them.
    GTEST_SKIP() << "vgpu's PTX engine does not support %envreg (cooperative_groups' grid workspace)";
  }
  ASSERT_CU(loaded);
  CUfunction gridSum = function(m, "gridSum");
  int sms = 0;
  ASSERT_CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_));
  const int threads = sms * 64;
  CUdeviceptr data = zeroed(threads * sizeof(int)), total = zeroed(sizeof(int));
  void* args[] = {&data, &total};
  ASSERT_CU(cuLaunchCooperativeKernel(gridSum, sms, 1, 1, 64, 1, 1, 0, nullptr, args));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(read<int>(total), threads * (threads - 1) / 2);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, Occupancy) {
  CUmodule m = load();
  CUfunction f = function(m, "saxpy"), bump = function(m, "bump");
  int sms = 0, threadsPerSm = 0, sharedPerSm = 0;
  ASSERT_CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_));
  ASSERT_CU(cuDeviceGetAttribute(&threadsPerSm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, device_));
  ASSERT_CU(cuDeviceGetAttribute(&sharedPerSm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, device_));
  int blocks = 0;
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 256, 0));
  EXPECT_EQ(blocks, threadsPerSm / 256);  // resident threads per multiprocessor
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 32, 0));
  EXPECT_EQ(blocks, 32);  // the block limit
  // Shared memory bounds bump: 1 KiB static + 1 KiB reserved + 40 KiB dynamic
  // per block of the multiprocessor's shared memory (3 in 164 KiB, 2 in 100 KiB).
  const int bumpBlocks = sharedPerSm / (42 * 1024);
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, bump, 32, 40 * 1024));
  EXPECT_EQ(blocks, bumpBlocks);
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 2048, 0));
  EXPECT_EQ(blocks, 0);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuOccupancyMaxActiveBlocksPerMultiprocessor(nullptr, f, 256, 0));
  // The best block size for saxpy fills a multiprocessor.
  int minGrid = 0, blockSize = 0;
  EXPECT_CU(cuOccupancyMaxPotentialBlockSize(&minGrid, &blockSize, f, nullptr, 0, 0));
  EXPECT_GT(blockSize, 0);
  EXPECT_EQ(blockSize % 32, 0);
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, blockSize, 0));
  EXPECT_EQ(minGrid, blocks * sms);
  EXPECT_EQ(blocks * blockSize, threadsPerSm);  // full occupancy
  // With 40 KiB of dynamic shared memory per block (the callback runs in the
  // application), shared memory bounds bump to bumpBlocks per multiprocessor;
  // no block size keeps more threads resident than the answer.
  static int calls = 0;
  calls = 0;
  auto fortyKiB = [](int) -> size_t {
    ++calls;
    return 40 * 1024;
  };
  EXPECT_CU(cuOccupancyMaxPotentialBlockSize(&minGrid, &blockSize, bump, fortyKiB, 0, 0));
  EXPECT_GT(calls, 0);
  EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, bump, blockSize, 40 * 1024));
  EXPECT_LE(blocks, bumpBlocks);
  EXPECT_EQ(minGrid, blocks * sms);
  for (int size = 32; size <= 1024; size += 32) {
    int other = 0;
    EXPECT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&other, bump, size, 40 * 1024));
    EXPECT_LE(other * size, blocks * blockSize) << "block size " << size;
  }
  EXPECT_CU(cuOccupancyMaxPotentialBlockSize(&minGrid, &blockSize, bump, nullptr, 0, 96));
  EXPECT_LE(blockSize, 96);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuOccupancyMaxPotentialBlockSize(nullptr, &blockSize, f, nullptr, 0, 0));
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, LibrariesAndKernels) {
  CUlibrary lib = nullptr;
  ASSERT_CU(cuLibraryLoadData(&lib, ptx_.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuLibraryGetKernel(&kernel, lib, "missing"));
  ASSERT_CU(cuLibraryGetKernel(&kernel, lib, "saxpy"));
  unsigned count = 0;
  EXPECT_CU(cuLibraryGetKernelCount(&count, lib));
  EXPECT_EQ(count, kKernelNames.size());
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

  CUdeviceptr counter = 0;
  EXPECT_CU(cuLibraryGetGlobal(&counter, &size, lib, "hiddenCounter"));
  EXPECT_EQ(size, 4u);
  EXPECT_EQ(read<int>(counter), 7);
  // A CUkernel may be launched as a CUfunction, and so may its function.
  expectSaxpyComputes(reinterpret_cast<CUfunction>(kernel));
  CUfunction f = nullptr;
  EXPECT_CU(cuKernelGetFunction(&f, kernel));
  expectSaxpyComputes(f);
  CUkernel bump = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&bump, lib, "bump"));
  CUdeviceptr noEcho = 0;
  unsigned noDynamic = 0;
  void* args[] = {&noEcho, &noDynamic};
  ASSERT_CU(cuLaunchKernel(reinterpret_cast<CUfunction>(bump), 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(read<int>(counter), 8);

  CUmodule mod = nullptr;
  EXPECT_CU(cuLibraryGetModule(&mod, lib));
  CUdeviceptr sameCounter = 0;
  EXPECT_CU(cuModuleGetGlobal(&sameCounter, nullptr, mod, "hiddenCounter"));
  EXPECT_EQ(sameCounter, counter);
  EXPECT_CU(cuLibraryUnload(lib));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLibraryUnload(lib));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuKernelGetName(&name, kernel));
}

TEST_F(RealModuleTest, LinkerKeepsPtx) {
  CUlinkState state = nullptr;
  ASSERT_CU(cuLinkCreate(0, nullptr, nullptr, &state));
  ASSERT_CU(cuLinkAddData(state, CU_JIT_INPUT_PTX, ptx_.data(), ptx_.size() + 1, "launch_kernels.ptx", 0, nullptr,
                          nullptr));
  std::string cubin = fixture("launch_kernels.cubin");
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuLinkAddData(state, CU_JIT_INPUT_CUBIN, cubin.data(), cubin.size(),
                                                            "launch_kernels.cubin", 0, nullptr, nullptr));
  void* image = nullptr;
  size_t size = 0;
  ASSERT_CU(cuLinkComplete(state, &image, &size));
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, image));
  EXPECT_CU(cuLinkDestroy(state));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuLinkDestroy(state));
  expectSaxpyComputes(function(m, "saxpy"));
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, DevicePrintfReachesStdoutBySynchronization) {
  CUmodule m = load();
  CUfunction greet = function(m, "greet");
  int value = 31337;
  void* args[] = {&value};
  // CUDA: "the output buffer ... is flushed to the host stream at a
  // synchronization point"; capture from before the launch until after it.
  fflush(stdout);
  ::testing::internal::CaptureStdout();
  CUresult launched = cuLaunchKernel(greet, 2, 1, 1, 3, 1, 1, 0, nullptr, args, nullptr);
  CUresult synced = cuCtxSynchronize();
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_CU(launched);
  EXPECT_CU(synced);
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 3; ++t) {
      EXPECT_THAT(out, HasSubstr("greet: block " + std::to_string(b) + " thread " + std::to_string(t) +
                                 " value 31337\n"));
    }
  }
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 6);
  EXPECT_CU(cuModuleUnload(m));
}

TEST_F(RealModuleTest, ModulesDieWithTheirContext) {
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, device_));
  CUmodule m = load();
  CUfunction f = function(m, "saxpy");
  CUdeviceptr counter = 0;
  ASSERT_CU(cuModuleGetGlobal(&counter, nullptr, m, "hiddenCounter"));
  expectSaxpyComputes(f);
  allocations_.clear();  // freed with `other`
  ASSERT_CU(cuCtxDestroy(other));
  ASSERT_CU(cuCtxSetCurrent(context_));
  const char* name = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuFuncGetName(&name, f));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(m));
  int value = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(&value, counter, sizeof(value)));
  // The surviving context still loads and runs.
  CUmodule fresh = load();
  expectSaxpyComputes(function(fresh, "saxpy"));
  EXPECT_CU(cuModuleUnload(fresh));
}

}  // namespace
}  // namespace phos::vgpu::testing
