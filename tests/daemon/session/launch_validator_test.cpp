// SPDX-License-Identifier: Apache-2.0
// phosd's module loading and twin launches on the vgpu driver
// (daemon/src/session/launch_validator.cpp, docs/twins.md): the program's module is its
// own image; the twin module is loaded beside it only when a twin first runs,
// uses the program's __device__ and __constant__ variables, and goes with it.
#include "session/launch_validator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "session/driver_table.h"
#include "phos/instrument/speculation.h"

namespace phos::daemon {
namespace {

// set_target stores a pointer in a __device__ variable; weigh stores through
// it, counts in another, and reads a __constant__ table with a register index
// and a __constant__ count by name.
constexpr std::string_view kPtx = R"(
.version 7.0
.target sm_80
.address_size 64

.global .align 8 .u64 g_target;
.global .align 4 .u32 g_hits;
.const .align 4 .b8 c_weights[32];
.const .align 4 .u32 c_count;

.visible .entry set_target(
	.param .u64 set_target_param_0
)
{
	.reg .b64 	%rd<2>;
	ld.param.u64 	%rd1, [set_target_param_0];
	st.global.u64 	[g_target], %rd1;
	ret;
}

.visible .entry weigh(
	.param .u64 weigh_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<4>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<12>;
	ld.param.u64 	%rd1, [weigh_param_0];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	mad.lo.s32 	%r1, %r2, %r3, %r4;
	ld.const.u32 	%r5, [c_count];
	setp.ge.s32 	%p1, %r1, %r5;
	@%p1 bra 	$L__done;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.s32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.global.f32 	%f1, [%rd4];
	and.b32 	%r6, %r1, 7;
	mul.wide.u32 	%rd5, %r6, 4;
	mov.u64 	%rd6, c_weights;
	add.s64 	%rd7, %rd6, %rd5;
	ld.const.f32 	%f2, [%rd7];
	mul.f32 	%f3, %f1, %f2;
	ld.global.u64 	%rd8, [g_target];
	add.s64 	%rd9, %rd8, %rd3;
	st.f32 	[%rd9], %f3;
	mov.u64 	%rd10, g_hits;
	atom.global.add.u32 	%r7, [%rd10], 1;
$L__done:
	ret;
}
)";

#define CHECK_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr

class LaunchValidatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static DriverTable* shared = [] {
      auto d = DriverTable::load(PHOS_VGPU_DRIVER);
      return d.isOk() ? *d : nullptr;
    }();
    ASSERT_NE(shared, nullptr) << "cannot load the vgpu driver " << PHOS_VGPU_DRIVER;
    d_ = shared;
    CUdevice device = 0;
    CHECK_CU(PHOS_DRIVER(*d_, DeviceGet)(&device, 0));
    CHECK_CU(PHOS_DRIVER(*d_, DevicePrimaryCtxRetain)(&context_, device));
    CHECK_CU(PHOS_DRIVER(*d_, CtxSetCurrent)(context_));
    image_.assign(kPtx.begin(), kPtx.end());
    image_.push_back('\0');
    CHECK_CU(loadModule(*d_, image_, &module_, &prepared_));
  }
  void TearDown() override {
    if (module_ != nullptr) PHOS_DRIVER(*d_, ModuleUnload)(module_);
  }

  CUfunction function(const char* name) {
    CUfunction f = nullptr;
    EXPECT_EQ(PHOS_DRIVER(*d_, ModuleGetFunction)(&f, module_, name), CUDA_SUCCESS) << name;
    return f;
  }
  CUdeviceptr global(const char* name, size_t* bytes = nullptr) {
    CUdeviceptr address = 0;
    size_t size = 0;
    EXPECT_EQ(PHOS_DRIVER(*d_, ModuleGetGlobal_v2)(&address, &size, module_, name), CUDA_SUCCESS) << name;
    if (bytes != nullptr) *bytes = size;
    return address;
  }
  template <typename T>
  void write(CUdeviceptr to, const T& value) {
    ASSERT_EQ(PHOS_DRIVER(*d_, MemcpyHtoD_v2)(to, &value, sizeof(T)), CUDA_SUCCESS);
  }
  template <typename T>
  T read(CUdeviceptr from) {
    T value{};
    EXPECT_EQ(PHOS_DRIVER(*d_, MemcpyDtoH_v2)(&value, from, sizeof(T)), CUDA_SUCCESS);
    return value;
  }
  // Runs `f`'s twin through the validator, as validatedLaunch does.
  CUresult launchTwin(LaunchValidator& v, CUfunction f, std::vector<void*> params,
                      const instrument::LaunchAccessSet& sets, unsigned blocks = 1, unsigned threads = 1) {
    return v.launchTwin(f, params.data(), {}, nullptr, sets, [&](CUfunction twin, void** p, void** extra) {
      return PHOS_DRIVER(*d_, LaunchKernel)(twin, blocks, 1, 1, threads, 1, 1, 0, nullptr, p, extra);
    });
  }

  DriverTable* d_ = nullptr;
  CUcontext context_ = nullptr;
  std::vector<char> image_;
  CUmodule module_ = nullptr;
  std::shared_ptr<const PreparedModule> prepared_;
};

TEST_F(LaunchValidatorTest, TheProgramsModuleIsItsOwnImage) {
  ASSERT_NE(prepared_, nullptr);
  EXPECT_FALSE(prepared_->twinText.empty()) << prepared_->note;
  // The driver, asked directly (phosd's enumeration filter aside), lists the
  // program's two kernels and nothing else.
  unsigned count = 0;
  CHECK_CU(PHOS_DRIVER(*d_, ModuleGetFunctionCount)(&count, module_));
  EXPECT_EQ(count, 2u);
  CUfunction twin = nullptr;
  EXPECT_NE(PHOS_DRIVER(*d_, ModuleGetFunction)(&twin, module_, "set_target__phos_twin"), CUDA_SUCCESS);
  // Validation off: no twin module is ever loaded.
  LaunchValidator v(*d_);
  v.noteModule(module_, prepared_);
  EXPECT_NE(v.signatureOf(function("weigh")), nullptr);
  EXPECT_EQ(v.twinModuleCount(), 0u);
}

TEST_F(LaunchValidatorTest, TwinsUseTheProgramsVariablesAndGoWithItsModule) {
  LaunchValidator v(*d_);
  v.noteModule(module_, prepared_);
  v.setMode(ValidationMode::kValidate);
  const int n = 100;
  std::vector<float> in(n), weights = {0.5f, -1.25f, 2.0f, 3.5f, -0.75f, 1.0f, 8.0f, -4.0f};
  for (int i = 0; i < n; ++i) in[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i) - 7.0f;
  CUdeviceptr din = 0, out = 0;
  CHECK_CU(PHOS_DRIVER(*d_, MemAlloc_v2)(&din, n * sizeof(float)));
  CHECK_CU(PHOS_DRIVER(*d_, MemAlloc_v2)(&out, n * sizeof(float)));
  CHECK_CU(PHOS_DRIVER(*d_, MemcpyHtoD_v2)(din, in.data(), n * sizeof(float)));
  CHECK_CU(PHOS_DRIVER(*d_, MemcpyHtoD_v2)(global("c_weights"), weights.data(), weights.size() * sizeof(float)));
  write(global("c_count"), n);

  CUfunction setTarget = function("set_target"), weigh = function("weigh");
  ASSERT_TRUE(v.hasTwin(setTarget));
  EXPECT_EQ(v.twinModuleCount(), 1u);
  size_t targetBytes = 0, hitsBytes = 0;
  const CUdeviceptr target = global("g_target", &targetBytes), hits = global("g_hits", &hitsBytes);
  instrument::LaunchAccessSet sets;
  sets.writes = {{target, targetBytes}};
  CUdeviceptr outArg = out;
  CHECK_CU(launchTwin(v, setTarget, {&outArg}, sets));
  CHECK_CU(PHOS_DRIVER(*d_, CtxSynchronize)());
  // The program's g_target, not a copy in the twin module.
  EXPECT_EQ(read<uint64_t>(target), out);

  sets.reads = {{din, n * sizeof(float)}};
  sets.writes = {{out, n * sizeof(float)}, {hits, hitsBytes}};
  CUdeviceptr inArg = din;
  CHECK_CU(launchTwin(v, weigh, {&inArg}, sets, 4, 32));
  CHECK_CU(PHOS_DRIVER(*d_, CtxSynchronize)());
  EXPECT_EQ(v.twinModuleCount(), 1u) << "one twin module per module and context";
  std::vector<float> twinOut(n);
  CHECK_CU(PHOS_DRIVER(*d_, MemcpyDtoH_v2)(twinOut.data(), out, n * sizeof(float)));
  for (int i = 0; i < n; ++i) {
    const float expected = in[static_cast<size_t>(i)] * weights[static_cast<size_t>(i & 7)];
    ASSERT_EQ(std::memcmp(&twinOut[static_cast<size_t>(i)], &expected, sizeof(float)), 0) << "element " << i;
  }
  EXPECT_EQ(read<uint32_t>(hits), static_cast<uint32_t>(n));
  EXPECT_TRUE(v.collect().empty());

  // A counter outside the speculated writes is reported at the program's address.
  sets.writes = {{out, n * sizeof(float)}};
  CHECK_CU(launchTwin(v, weigh, {&inArg}, sets, 4, 32));
  CHECK_CU(PHOS_DRIVER(*d_, CtxSynchronize)());
  std::vector<Violation> found = v.collect();
  ASSERT_EQ(found.size(), static_cast<size_t>(n));
  for (const Violation& f : found) {
    EXPECT_EQ(f.kernel, "weigh");
    EXPECT_EQ(f.address, hits);
    EXPECT_EQ(f.kind, instrument::ViolationKind::kAtomic);
  }
  EXPECT_EQ(read<uint32_t>(hits), 2u * n);

  v.forgetModule(module_);
  EXPECT_EQ(v.twinModuleCount(), 0u);
  PHOS_DRIVER(*d_, MemFree_v2)(din);
  PHOS_DRIVER(*d_, MemFree_v2)(out);
}

// A restore loads the twin modules before the job runs again: its first twin
// launches find them.
TEST_F(LaunchValidatorTest, LoadTwinModulesLoadsEachModulesOnceInItsContext) {
  LaunchValidator v(*d_);
  v.noteModule(module_, prepared_);
  CHECK_CU(PHOS_DRIVER(*d_, CtxSetCurrent)(nullptr));
  v.loadTwinModules();
  EXPECT_EQ(v.twinModuleCount(), 1u);
  CUcontext current = nullptr;
  CHECK_CU(PHOS_DRIVER(*d_, CtxGetCurrent)(&current));
  EXPECT_EQ(current, nullptr) << "the caller's context changed";
  CHECK_CU(PHOS_DRIVER(*d_, CtxSetCurrent)(context_));
  v.setMode(ValidationMode::kValidateRestore);
  EXPECT_TRUE(v.hasTwin(function("weigh")));
  v.loadTwinModules();
  EXPECT_EQ(v.twinModuleCount(), 1u);
  v.release(nullptr);
  EXPECT_EQ(v.twinModuleCount(), 0u);
}

// A checkpoint loads the twin modules before its window without holding the
// session (Session::prepareTwinModules): listed, loaded, then kept only if the
// program's module is still there and no launch loaded them first.
TEST_F(LaunchValidatorTest, TwinModulesLoadedAheadOfAWindowAreKeptOnlyForLiveModules) {
  LaunchValidator v(*d_);
  v.noteModule(module_, prepared_);
  auto loads = v.twinLoadsPending();
  ASSERT_EQ(loads.size(), 1u);
  v.loadTwins(loads[0]);
  ASSERT_NE(loads[0].twins, nullptr);
  EXPECT_EQ(v.twinModuleCount(), 0u) << "kept before keepTwins";
  v.keepTwins(loads[0]);
  EXPECT_EQ(v.twinModuleCount(), 1u);
  EXPECT_TRUE(v.twinLoadsPending().empty()) << "listed again once kept";
  v.setMode(ValidationMode::kValidate);
  EXPECT_TRUE(v.hasTwin(function("weigh")));
  v.release(nullptr);

  LaunchValidator gone(*d_);
  gone.noteModule(module_, prepared_);
  auto late = gone.twinLoadsPending();
  ASSERT_EQ(late.size(), 1u);
  gone.loadTwins(late[0]);
  gone.forgetModule(module_);  // the program unloaded it while its twins compiled
  gone.keepTwins(late[0]);
  EXPECT_EQ(gone.twinModuleCount(), 0u);
}

// A twin module the driver refuses leaves the program's module as it is and
// its kernels without twins.
TEST_F(LaunchValidatorTest, ARefusedTwinModuleLeavesTheKernelsWithoutTwins) {
  auto broken = std::make_shared<PreparedModule>(*prepared_);
  broken->twinText = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry set_target__phos_twin(";
  LaunchValidator v(*d_);
  v.noteModule(module_, broken);
  v.setMode(ValidationMode::kValidate);
  CUfunction setTarget = function("set_target");
  EXPECT_FALSE(v.hasTwin(setTarget));
  EXPECT_EQ(v.twinModuleCount(), 0u);
  CUdeviceptr p = 0x1234;
  void* params[] = {&p};
  CHECK_CU(PHOS_DRIVER(*d_, LaunchKernel)(setTarget, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  CHECK_CU(PHOS_DRIVER(*d_, CtxSynchronize)());
  EXPECT_EQ(read<uint64_t>(global("g_target")), p);
  v.forgetModule(module_);
}

}  // namespace
}  // namespace phos::daemon
