// SPDX-License-Identifier: Apache-2.0
// Access bounds: speculated buffers narrowed to the bytes a launch's accesses
// can reach, from the PTX and the launch's parameters and dimensions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "phos/instrument/access_bounds.h"
#include "phos/instrument/signature.h"
#include "phos/instrument/speculation.h"
#include "phos/instrument/twin.h"
#include "phos/ptx/parser.h"

namespace phos::instrument {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const Buffer kIn{0x7000'0000'0000, 1 << 20};
const Buffer kOut{0x7000'1000'0000, 1 << 20};
const Buffer kIndex{0x7000'2000'0000, 1 << 16};
const Buffer kGlobal{0x7100'0000'0000, 64};

std::optional<Buffer> lookup(uint64_t address) {
  for (const Buffer& b : {kIn, kOut, kIndex}) {
    if (address >= b.base && address < b.base + b.size) return b;
  }
  return std::nullopt;
}

std::optional<Buffer> globalLookup(std::string_view name) {
  if (name == "table") return kGlobal;
  return std::nullopt;
}

// A parameter buffer: 8-byte words, then 4-byte words.
std::vector<std::byte> params(std::vector<uint64_t> words, std::vector<uint32_t> scalars = {}) {
  std::vector<std::byte> out(words.size() * 8 + scalars.size() * 4);
  for (size_t i = 0; i < words.size(); ++i) std::memcpy(out.data() + 8 * i, &words[i], 8);
  for (size_t i = 0; i < scalars.size(); ++i) std::memcpy(out.data() + 8 * words.size() + 4 * i, &scalars[i], 4);
  return out;
}

struct Narrowed {
  LaunchAccessSet before, after;
  std::string why;
};

// Speculates and narrows one launch of the only kernel of `body`.
Narrowed launch(const std::string& body, const std::vector<std::byte>& bytes, LaunchShape shape) {
  const std::string text = ".version 8.0\n.target sm_80\n.address_size 64\n" + body;
  auto module = ptx::parseModule(text, "test");
  EXPECT_TRUE(module.isOk()) << module.status().message();
  auto signatures = analyzeModule(*module);
  EXPECT_TRUE(signatures.isOk()) << signatures.status().message();
  const KernelSignature& sig = signatures->back();
  Narrowed n;
  n.before = speculateLaunch(sig, bytes, lookup, globalLookup);
  n.after = n.before;
  auto bounds = AccessBounds::analyze(*module, *module->findFunction(sig.name), sig);
  n.why = bounds->why();
  bounds->narrow(n.after, bytes, shape, lookup, globalLookup);
  return n;
}

// y[i] = a * x[i] + y[i] for i = ctaid.x * ntid.x + tid.x < n, as nvcc -O3 writes it.
const char* kSaxpy = R"(
.visible .entry saxpy(.param .u64 saxpy_param_0, .param .u64 saxpy_param_1, .param .f32 saxpy_param_2,
                      .param .u32 saxpy_param_3)
{
	.reg .pred %p<2>;
	.reg .f32 %f<5>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd1, [saxpy_param_0];
	ld.param.u64 %rd2, [saxpy_param_1];
	ld.param.f32 %f1, [saxpy_param_2];
	ld.param.u32 %r2, [saxpy_param_3];
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.s32 %r1, %r3, %r4, %r5;
	setp.ge.s32 %p1, %r1, %r2;
	@%p1 bra $L__BB0_2;
	cvta.to.global.u64 %rd3, %rd1;
	mul.wide.s32 %rd4, %r1, 4;
	add.s64 %rd5, %rd3, %rd4;
	ld.global.nc.f32 %f2, [%rd5];
	cvta.to.global.u64 %rd6, %rd2;
	add.s64 %rd7, %rd6, %rd4;
	ld.global.f32 %f3, [%rd7];
	fma.rn.f32 %f4, %f2, %f1, %f3;
	st.global.f32 [%rd7], %f4;
$L__BB0_2:
	ret;
}
)";

TEST(AccessBounds, AGridOverAWindowNarrowsBothBuffersToIt) {
  // x and y point 4 KiB into their buffers; 4 blocks of 128 threads touch 2 KiB.
  auto n = launch(kSaxpy, params({kIn.base + 4096, kOut.base + 4096}, {0x40000000u, 512}), {{4, 1, 1}, {128, 1, 1}});
  EXPECT_EQ(n.why, "");
  EXPECT_THAT(n.before.writes, ElementsAre(kOut));
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base + 4096, 2048}));
  EXPECT_THAT(n.after.reads, ElementsAre(Buffer{kIn.base + 4096, 2048}, Buffer{kOut.base + 4096, 2048}));
}

TEST(AccessBounds, ThreadsPastTheEndOfTheBufferAreClippedToIt) {
  // The last block reaches past the end; the kernel's own test stops it.
  auto n = launch(kSaxpy, params({kIn.base, kOut.base + kOut.size - 1024}, {0, 256}), {{2, 1, 1}, {256, 1, 1}});
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base + kOut.size - 1024, 1024}));
}

TEST(AccessBounds, AGridDimensionTheAddressesDoNotUseDoesNotWidenThem) {
  // The y dimension of the grid does not enter saxpy's addresses.
  auto a = launch(kSaxpy, params({kIn.base, kOut.base}, {0, 64}), {{1, 1, 1}, {64, 1, 1}});
  auto b = launch(kSaxpy, params({kIn.base, kOut.base}, {0, 64}), {{1, 7, 1}, {64, 1, 1}});
  EXPECT_EQ(a.after, b.after);
  EXPECT_THAT(a.after.writes, ElementsAre(Buffer{kOut.base, 256}));
}

// cache[(pos * dim + tid.x)] = v[tid.x]: one row of a cache, chosen by a scalar.
const char* kRow = R"(
.visible .entry append(.param .u64 append_param_0, .param .u64 append_param_1, .param .u32 append_param_2,
                       .param .u32 append_param_3)
{
	.reg .f32 %f<2>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<9>;
	ld.param.u64 %rd1, [append_param_0];
	ld.param.u64 %rd2, [append_param_1];
	ld.param.u32 %r1, [append_param_2];
	ld.param.u32 %r2, [append_param_3];
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	mov.u32 %r3, %tid.x;
	mul.wide.u32 %rd5, %r3, 4;
	add.s64 %rd6, %rd4, %rd5;
	ld.global.f32 %f1, [%rd6];
	mad.lo.s32 %r4, %r1, %r2, %r3;
	mul.wide.s32 %rd7, %r4, 4;
	add.s64 %rd8, %rd3, %rd7;
	st.global.f32 [%rd8], %f1;
	ret;
}
)";

TEST(AccessBounds, AScalarParameterSelectsTheRowWritten) {
  // pos 100, dim 256: bytes [102400, 103424) of the cache.
  auto n = launch(kRow, params({kOut.base, kIn.base}, {100, 256}), {{1, 1, 1}, {256, 1, 1}});
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base + 100 * 1024, 1024}));
  EXPECT_THAT(n.after.reads, ElementsAre(Buffer{kIn.base, 1024}));
  auto next = launch(kRow, params({kOut.base, kIn.base}, {101, 256}), {{1, 1, 1}, {256, 1, 1}});
  EXPECT_THAT(next.after.writes, ElementsAre(Buffer{kOut.base + 101 * 1024, 1024}));
}

// out[i] = sum over t < 8 of in[t * stride + i]: the loop's index grows from
// 0 by 1, and the branch that loops back caps it below 8.
const char* kLoop = R"(
.visible .entry colsum(.param .u64 colsum_param_0, .param .u64 colsum_param_1, .param .u32 colsum_param_2)
{
	.reg .pred %p<2>;
	.reg .f32 %f<4>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<9>;
	ld.param.u64 %rd1, [colsum_param_0];
	ld.param.u64 %rd2, [colsum_param_1];
	ld.param.u32 %r1, [colsum_param_2];
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	mov.u32 %r2, %tid.x;
	mov.f32 %f1, 0f00000000;
	mov.u32 %r3, 0;
$L__loop:
	mad.lo.s32 %r4, %r3, %r1, %r2;
	mul.wide.s32 %rd5, %r4, 4;
	add.s64 %rd6, %rd3, %rd5;
	ld.global.f32 %f2, [%rd6];
	add.f32 %f1, %f1, %f2;
	add.s32 %r3, %r3, 1;
	setp.CMP.s32 %p1, %r3, 8;
	@%p1 bra $L__loop;
	mul.wide.u32 %rd7, %r2, 4;
	add.s64 %rd8, %rd4, %rd7;
	st.global.f32 [%rd8], %f1;
	ret;
}
)";

std::string loop(const char* cmp) {
  std::string text = kLoop;
  text.replace(text.find("CMP"), 3, cmp);
  return text;
}

TEST(AccessBounds, ALoopIndexCappedByTheBranchThatLoopsBackIsBounded) {
  // t < 8, stride 64, 64 threads: words 0 to 7 * 64 + 63 of `in`.
  auto n = launch(loop("lt"), params({kIn.base, kOut.base}, {64}), {{1, 1, 1}, {64, 1, 1}});
  EXPECT_THAT(n.after.reads, ElementsAre(Buffer{kIn.base, 2048}));
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base, 256}));
}

TEST(AccessBounds, ALoopIndexNoBranchCapsLeavesItsBufferWholeAndTheOthersNarrowed) {
  // t != 8 says nothing of how far t goes.
  auto n = launch(loop("ne"), params({kIn.base, kOut.base}, {64}), {{1, 1, 1}, {64, 1, 1}});
  EXPECT_THAT(n.after.reads, ElementsAre(kIn));
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base, 256}));
}

// The grid-stride loop nvcc -O3 writes for
//   for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] += x[i];
// the test before the loop and the one at its end both cap i below n.
const char* kGridStride = R"(
.visible .entry stride(.param .u64 stride_param_0, .param .u64 stride_param_1, .param .u32 stride_param_2)
{
	.reg .pred %p<3>;
	.reg .f32 %f<4>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd3, [stride_param_0];
	ld.param.u64 %rd4, [stride_param_1];
	ld.param.u32 %r6, [stride_param_2];
	mov.u32 %r1, %ntid.x;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %tid.x;
	mad.lo.s32 %r7, %r2, %r1, %r3;
	setp.ge.s32 %p1, %r7, %r6;
	@%p1 bra $L__done;
	mov.u32 %r4, %nctaid.x;
	mul.lo.s32 %r5, %r1, %r4;
	cvta.to.global.u64 %rd1, %rd3;
	cvta.to.global.u64 %rd2, %rd4;
$L__loop:
	mul.wide.s32 %rd5, %r7, 4;
	add.s64 %rd6, %rd1, %rd5;
	ld.global.f32 %f1, [%rd6];
	add.s64 %rd7, %rd2, %rd5;
	ld.global.f32 %f2, [%rd7];
	add.f32 %f3, %f1, %f2;
	st.global.f32 [%rd7], %f3;
	add.s32 %r7, %r7, %r5;
	setp.lt.s32 %p2, %r7, %r6;
	@%p2 bra $L__loop;
$L__done:
	ret;
}
)";

TEST(AccessBounds, AGridStrideLoopIsBoundedByItsCount) {
  // n = 1000 elements, 2 blocks of 128 threads going round: y[0, 1000) of a window.
  auto n = launch(kGridStride, params({kIn.base, kOut.base + 4096}, {1000}), {{2, 1, 1}, {128, 1, 1}});
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base + 4096, 4000}));
  EXPECT_THAT(n.after.reads, ElementsAre(Buffer{kIn.base, 4000}, Buffer{kOut.base + 4096, 4000}));
}

// *(*pp + tid.x) = 1: the address comes from memory.
const char* kIndirect = R"(
.visible .entry indirect(.param .u64 indirect_param_0, .param .u64 indirect_param_1)
{
	.reg .b32 %r<3>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd1, [indirect_param_0];
	ld.param.u64 %rd2, [indirect_param_1];
	cvta.to.global.u64 %rd3, %rd1;
	ld.global.u64 %rd4, [%rd3];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd5, %r1, 4;
	add.s64 %rd6, %rd4, %rd5;
	mov.u32 %r2, 1;
	st.u32 [%rd6], %r2;
	cvta.to.global.u64 %rd7, %rd2;
	st.global.u32 [%rd7], %r2;
	ret;
}
)";

TEST(AccessBounds, AnAddressLoadedFromMemoryNarrowsNoWrite) {
  auto n = launch(kIndirect, params({kIn.base, kOut.base}), {{1, 1, 1}, {32, 1, 1}});
  EXPECT_EQ(n.after.writes, n.before.writes);
  // The one load is of the pointer itself: eight bytes of `in`.
  EXPECT_THAT(n.after.reads, ElementsAre(Buffer{kIn.base, 8}));
}

const char* kCall = R"(
.func helper(.param .b64 helper_param_0)
{
	.reg .b64 %rd<2>;
	.reg .b32 %r<2>;
	ld.param.u64 %rd1, [helper_param_0];
	mov.u32 %r1, 7;
	st.global.u32 [%rd1+4096], %r1;
	ret;
}
.visible .entry calls(.param .u64 calls_param_0)
{
	.reg .b64 %rd<3>;
	.reg .b32 %r<2>;
	ld.param.u64 %rd1, [calls_param_0];
	cvta.to.global.u64 %rd2, %rd1;
	mov.u32 %r1, 1;
	st.global.u32 [%rd2], %r1;
	{
	.param .b64 param0;
	st.param.b64 [param0], %rd2;
	call.uni helper, (param0);
	}
	ret;
}
)";

TEST(AccessBounds, AKernelThatCallsAFunctionNarrowsNothingAndSaysWhy) {
  auto n = launch(kCall, params({kOut.base}), {{1, 1, 1}, {1, 1, 1}});
  EXPECT_EQ(n.after, n.before);
  EXPECT_THAT(n.why, HasSubstr("calls a function"));
}

// table[tid.x] += out[tid.x] through a module variable, and a store through
// a guarded definition.
const char* kGlobalAndGuard = R"(
.global .align 4 .b8 table[64];
.visible .entry mixed(.param .u64 mixed_param_0, .param .u32 mixed_param_1)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<9>;
	ld.param.u64 %rd1, [mixed_param_0];
	ld.param.u32 %r1, [mixed_param_1];
	cvta.to.global.u64 %rd2, %rd1;
	mov.u32 %r2, %tid.x;
	mul.wide.u32 %rd3, %r2, 4;
	mov.u64 %rd4, table;
	add.s64 %rd5, %rd4, %rd3;
	add.s64 %rd6, %rd2, %rd3;
	ld.global.u32 %r3, [%rd6];
	st.global.u32 [%rd5], %r3;
	setp.eq.s32 %p1, %r1, 0;
	@%p1 mov.u32 %r4, 1000;
	mul.wide.u32 %rd7, %r4, 4;
	add.s64 %rd8, %rd2, %rd7;
	st.global.u32 [%rd8], %r3;
	ret;
}
)";

TEST(AccessBounds, ModuleVariablesAndGuardedDefinitionsStayWhole) {
  auto n = launch(kGlobalAndGuard, params({kOut.base}, {0}), {{1, 1, 1}, {16, 1, 1}});
  EXPECT_THAT(n.after.writes, ElementsAre(kOut, kGlobal));
  EXPECT_THAT(n.after.reads, ElementsAre(Buffer{kOut.base, 64}));
}

// An index that may be negative or wrap at 32 bits is not followed past the wrap.
const char* kWrap = R"(
.visible .entry wrap(.param .u64 wrap_param_0, .param .u32 wrap_param_1)
{
	.reg .b32 %r<5>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [wrap_param_0];
	ld.param.u32 %r1, [wrap_param_1];
	cvta.to.global.u64 %rd2, %rd1;
	mov.u32 %r2, %tid.x;
	mul.lo.s32 %r3, %r2, %r1;
	cvt.u64.u32 %rd3, %r3;
	add.s64 %rd4, %rd2, %rd3;
	st.global.u8 [%rd4], %r2;
	ret;
}
)";

TEST(AccessBounds, AProductThatMayWrapIsUnbounded) {
  // 64 threads times 0x10000000 wraps a 32-bit product: the buffer stays whole.
  auto wraps = launch(kWrap, params({kOut.base}, {0x10000000u}), {{1, 1, 1}, {64, 1, 1}});
  EXPECT_THAT(wraps.after.writes, ElementsAre(kOut));
  auto fits = launch(kWrap, params({kOut.base}, {16}), {{1, 1, 1}, {64, 1, 1}});
  EXPECT_THAT(fits.after.writes, ElementsAre(Buffer{kOut.base, 63 * 16 + 1}));
}

// As nvcc -O3 writes a tiled matmul: %r1 holds tid.x where the output index
// is computed, and is then reused as the loop's column; the store after the
// loop uses the index computed before it.
const char* kReused = R"(
.visible .entry reused(.param .u64 reused_param_0, .param .u32 reused_param_1)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [reused_param_0];
	ld.param.u32 %r5, [reused_param_1];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, %ctaid.x;
	mad.lo.s32 %r3, %r2, 64, %r1;
$L__loop:
	add.s32 %r1, %r1, 16;
	setp.lt.s32 %p1, %r1, %r5;
	@%p1 bra $L__loop;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.s32 %rd3, %r3, 4;
	add.s64 %rd4, %rd2, %rd3;
	st.global.u32 [%rd4], %r1;
	ret;
}
)";

TEST(AccessBounds, ARegisterALoopReusesKeepsTheValueItHadWhereItWasRead) {
  auto n = launch(kReused, params({kOut.base}, {1000}), {{2, 1, 1}, {64, 1, 1}});
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base, 512}));
}

// Two branches give the index 4 or 8: the store reaches the hull of both.
const char* kBranches = R"(
.visible .entry branches(.param .u64 branches_param_0, .param .u32 branches_param_1)
{
	.reg .pred %p<2>;
	.reg .b32 %r<3>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [branches_param_0];
	ld.param.u32 %r2, [branches_param_1];
	setp.eq.s32 %p1, %r2, 0;
	@%p1 bra $L__else;
	mov.u32 %r1, 4;
	bra.uni $L__join;
$L__else:
	mov.u32 %r1, 8;
$L__join:
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.u32 %rd3, %r1, 4;
	add.s64 %rd4, %rd2, %rd3;
	st.global.u32 [%rd4], %r2;
	ret;
}
)";

TEST(AccessBounds, DefinitionsOnTwoBranchesGiveTheHullOfBoth) {
  auto n = launch(kBranches, params({kOut.base}, {1}), {{1, 1, 1}, {1, 1, 1}});
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base + 16, 20}));
}

// out[i] = table[idx[i]] with 64-bit indices, as an embedding lookup: the
// row read comes from memory, so the table is read whole; the indices read
// and the output written are the thread's.
const char* kGather = R"(
.visible .entry gather(.param .u64 gather_param_0, .param .u64 gather_param_1, .param .u64 gather_param_2)
{
	.reg .f32 %f<2>;
	.reg .b32 %r<2>;
	.reg .b64 %rd<14>;
	ld.param.u64 %rd1, [gather_param_0];
	ld.param.u64 %rd2, [gather_param_1];
	ld.param.u64 %rd3, [gather_param_2];
	cvta.to.global.u64 %rd4, %rd1;
	cvta.to.global.u64 %rd5, %rd2;
	cvta.to.global.u64 %rd6, %rd3;
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd7, %r1, 8;
	add.s64 %rd8, %rd5, %rd7;
	ld.global.u64 %rd9, [%rd8];
	shl.b64 %rd10, %rd9, 2;
	add.s64 %rd11, %rd4, %rd10;
	ld.global.f32 %f1, [%rd11];
	mul.wide.u32 %rd12, %r1, 4;
	add.s64 %rd13, %rd6, %rd12;
	st.global.f32 [%rd13], %f1;
	ret;
}
)";

TEST(AccessBounds, AnIndexReadFromMemoryLeavesOnlyTheTableItIndexesWhole) {
  auto n = launch(kGather, params({kIn.base, kIndex.base, kOut.base + 64}), {{1, 1, 1}, {32, 1, 1}});
  EXPECT_THAT(n.after.reads, ElementsAre(kIn, Buffer{kIndex.base, 256}));
  EXPECT_THAT(n.after.writes, ElementsAre(Buffer{kOut.base + 64, 128}));
}

TEST(RangeTable, APartWrittenInsideABufferReadWholeSplitsIt) {
  LaunchAccessSet sets;
  sets.reads = {Buffer{0x1000, 0x1000}, Buffer{0x3000, 0x100}};
  sets.writes = {Buffer{0x1400, 0x200}, Buffer{0x3000, 0x100}, Buffer{0x3100, 0x80}};
  const std::vector<RangeEntry> table = rangeTable(sets);
  ASSERT_EQ(table.size(), 4u);
  EXPECT_EQ(table[0].begin, 0x1000u);
  EXPECT_EQ(table[0].end, 0x1400u);
  EXPECT_EQ(table[0].access, 1u);
  EXPECT_EQ(table[1].begin, 0x1400u);
  EXPECT_EQ(table[1].end, 0x1600u);
  EXPECT_EQ(table[1].access, 3u);
  EXPECT_EQ(table[2].begin, 0x1600u);
  EXPECT_EQ(table[2].end, 0x2000u);
  EXPECT_EQ(table[2].access, 1u);
  // Adjacent writes with the same bits are one entry.
  EXPECT_EQ(table[3].begin, 0x3000u);
  EXPECT_EQ(table[3].end, 0x3180u);
  EXPECT_EQ(table[3].access, 3u);
}

}  // namespace
}  // namespace phos::instrument
