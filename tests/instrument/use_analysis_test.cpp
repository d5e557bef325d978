// SPDX-License-Identifier: Apache-2.0
// The PTX use analysis: which parameter words form addresses, read or written, on
// handwritten PTX and on the nvcc/clang/numba corpus compiled at build time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "phos/instrument/signature.h"
#include "phos/ptx/parser.h"
#include "status_matchers.h"

namespace phos::instrument {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;

constexpr std::string_view kHeader = ".version 9.0\n.target sm_80\n.address_size 64\n";

Result<std::vector<KernelSignature>> analyze(std::string_view body) {
  std::string text = std::string(kHeader) + std::string(body);
  ASSIGN_OR_RETURN(ptx::Module m, ptx::parseModule(text, "test.ptx"));
  return analyzeModule(m);
}

const PointerWord* word(const KernelSignature& s, uint32_t ordinal, uint32_t offsetInParam = 0) {
  if (ordinal >= s.params.size()) return nullptr;
  const ParamSignature& p = s.params[ordinal];
  for (const PointerWord& w : p.words) {
    if (w.offset == p.offset + offsetInParam) return &w;
  }
  return nullptr;
}

Access accessOf(const KernelSignature& s, uint32_t ordinal, uint32_t offsetInParam = 0) {
  const PointerWord* w = word(s, ordinal, offsetInParam);
  return w ? w->access : Access::kNone;
}

bool escapes(const KernelSignature& s, uint32_t ordinal, uint32_t offsetInParam = 0) {
  const PointerWord* w = word(s, ordinal, offsetInParam);
  return w && w->escapes;
}

const KernelSignature* kernel(const std::vector<KernelSignature>& v, std::string_view name) {
  for (const KernelSignature& s : v) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST(UseAnalysis, SaxpyReadsXAndWritesY) {
  auto r = analyze(R"(
.visible .entry saxpy(.param .u32 n, .param .f32 a, .param .u64 x, .param .u64 y)
{
  .reg .pred %p<2>; .reg .f32 %f<5>; .reg .b32 %r<6>; .reg .b64 %rd<8>;
  ld.param.u32 %r2, [n];
  ld.param.f32 %f1, [a];
  ld.param.u64 %rd1, [x];
  ld.param.u64 %rd2, [y];
  mov.u32 %r1, %tid.x;
  setp.ge.s32 %p1, %r1, %r2;
  @%p1 bra $L_done;
  cvta.to.global.u64 %rd3, %rd2;
  cvta.to.global.u64 %rd4, %rd1;
  mul.wide.s32 %rd5, %r1, 4;
  add.s64 %rd6, %rd4, %rd5;
  ld.global.nc.f32 %f2, [%rd6];
  add.s64 %rd7, %rd3, %rd5;
  ld.global.f32 %f3, [%rd7];
  fma.rn.f32 %f4, %f2, %f1, %f3;
  st.global.f32 [%rd7], %f4;
$L_done:
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->size(), 1u);
  const KernelSignature& s = (*r)[0];
  EXPECT_EQ(s.name, "saxpy");
  EXPECT_EQ(s.demangled, "");
  EXPECT_EQ(s.paramBytes, 24u);
  ASSERT_EQ(s.params.size(), 4u);
  EXPECT_TRUE(s.params[0].words.empty());
  EXPECT_TRUE(s.params[1].words.empty());
  EXPECT_EQ(accessOf(s, 2), Access::kRead);
  EXPECT_EQ(accessOf(s, 3), Access::kReadWrite);
  EXPECT_FALSE(escapes(s, 2));
  EXPECT_FALSE(escapes(s, 3));
  EXPECT_EQ(s.indirect, Access::kNone);
  EXPECT_EQ(s.sources, kFromPtx);
}

TEST(UseAnalysis, SizeWordThatNeverFormsAnAddressIsNone) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 n, .param .u64 out)
{
  .reg .pred %p<2>; .reg .b64 %rd<6>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [n];
  ld.param.u64 %rd2, [out];
  mov.u32 %r1, %tid.x;
  cvt.u64.u32 %rd3, %r1;
  setp.ge.u64 %p1, %rd3, %rd1;
  @%p1 ret;
  st.global.u64 [%rd2], %rd3;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kNone);
  EXPECT_EQ(accessOf((*r)[0], 1), Access::kWrite);
}

TEST(UseAnalysis, StructParameterWordsAreSeparate) {
  // struct { const float* in; float* out; int64_t n; double scale; } by value.
  auto r = analyze(R"(
.visible .entry k(.param .align 8 .b8 b[32], .param .align 4 .b8 small[8])
{
  .reg .b64 %rd<8>; .reg .f32 %f<2>;
  ld.param.u64 %rd1, [b];
  ld.param.u64 %rd2, [b+8];
  ld.param.u64 %rd3, [b+16];
  ld.global.f32 %f1, [%rd1+4];
  st.global.f32 [%rd2], %f1;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature& s = (*r)[0];
  ASSERT_EQ(s.params[0].words.size(), 4u);
  EXPECT_EQ(accessOf(s, 0, 0), Access::kRead);
  EXPECT_EQ(accessOf(s, 0, 8), Access::kWrite);
  EXPECT_EQ(accessOf(s, 0, 16), Access::kNone);
  EXPECT_EQ(accessOf(s, 0, 24), Access::kNone);
  // An 8-byte struct at offset 32: one word, never used.
  ASSERT_EQ(s.params[1].words.size(), 1u);
  EXPECT_EQ(s.params[1].words[0].offset, 32u);
  EXPECT_EQ(s.indirect, Access::kNone);
}

TEST(UseAnalysis, ClangPtrParametersAndVectorAccesses) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 .ptr .global .align 16 k_param_0, .param .u64 .ptr .global .align 16 k_param_1)
{
  .reg .b64 %rd<4>; .reg .f32 %f<5>;
  ld.param.u64 %rd1, [k_param_0];
  ld.param.u64 %rd2, [k_param_1];
  ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];
  st.global.v4.f32 [%rd2+16], {%f1, %f2, %f3, %f4};
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kRead);
  EXPECT_EQ(accessOf((*r)[0], 1), Access::kWrite);
}

TEST(UseAnalysis, AtomicsAndReductionsReadAndWrite) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 a, .param .u64 b)
{
  .reg .b64 %rd<4>; .reg .b32 %r<3>;
  ld.param.u64 %rd1, [a];
  ld.param.u64 %rd2, [b];
  atom.global.add.u32 %r1, [%rd1], 1;
  red.global.add.u32 [%rd2], 1;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kReadWrite);
  EXPECT_EQ(accessOf((*r)[0], 1), Access::kReadWrite);
}

TEST(UseAnalysis, PointerStoredToMemoryEscapes) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 table, .param .u64 p)
{
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [table];
  ld.param.u64 %rd2, [p];
  st.global.u64 [%rd1], %rd2;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature& s = (*r)[0];
  EXPECT_EQ(accessOf(s, 0), Access::kWrite);
  EXPECT_FALSE(escapes(s, 0));
  EXPECT_TRUE(escapes(s, 1));
  EXPECT_EQ(word(s, 1)->observed, Access::kNone);
  EXPECT_EQ(accessOf(s, 1), Access::kReadWrite);
}

TEST(UseAnalysis, PointerLoadedFromMemoryIsIndirect) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 pp)
{
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [pp];
  ld.global.u64 %rd2, [%rd1];
  st.global.u32 [%rd2+8], 7;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kRead);
  EXPECT_EQ((*r)[0].indirect, Access::kWrite);
}

TEST(UseAnalysis, NarrowIndexFromMemoryIsAGatherNotIndirect) {
  // x[idx[i]]: the index is read from memory, the base is still x.
  auto r = analyze(R"(
.visible .entry k(.param .u64 idx, .param .u64 x, .param .u64 out)
{
  .reg .b64 %rd<10>; .reg .b32 %r<3>; .reg .f32 %f<2>;
  ld.param.u64 %rd1, [idx];
  ld.param.u64 %rd2, [x];
  ld.param.u64 %rd3, [out];
  ld.global.u32 %r1, [%rd1];
  mul.wide.u32 %rd4, %r1, 4;
  add.s64 %rd5, %rd2, %rd4;
  ld.global.f32 %f1, [%rd5];
  st.global.f32 [%rd3], %f1;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0].indirect, Access::kNone);
  EXPECT_EQ(accessOf((*r)[0], 1), Access::kRead);
}

TEST(UseAnalysis, WideIndexReducedModuloABoundIsNotAPointer) {
  // numba: bins[data[i] % bins.size] with 64-bit data. The same value used
  // unreduced is a possible pointer.
  auto r = analyze(R"(
.visible .entry k(.param .u64 data, .param .u64 bins, .param .u64 size)
{
  .reg .b64 %rd<12>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [data];
  ld.param.u64 %rd2, [bins];
  ld.param.u64 %rd3, [size];
  ld.global.u64 %rd4, [%rd1];
  rem.s64 %rd5, %rd4, %rd3;
  shl.b64 %rd6, %rd5, 2;
  add.s64 %rd7, %rd2, %rd6;
  atom.global.add.u32 %r1, [%rd7], 1;
  and.b64 %rd8, %rd4, 255;
  add.s64 %rd9, %rd2, %rd8;
  ld.global.u8 %r1, [%rd9];
  ret;
}
.visible .entry unreduced(.param .u64 data, .param .u64 bins)
{
  .reg .b64 %rd<8>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [data];
  ld.param.u64 %rd2, [bins];
  ld.global.u64 %rd4, [%rd1];
  add.s64 %rd7, %rd2, %rd4;
  atom.global.add.u32 %r1, [%rd7], 1;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0].indirect, Access::kNone);
  EXPECT_EQ(accessOf((*r)[0], 1), Access::kReadWrite);
  EXPECT_EQ((*r)[1].indirect, Access::kReadWrite);
}

TEST(UseAnalysis, HalvesReadFromMemoryPackedIntoAPointerAreIndirect) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 p)
{
  .reg .b64 %rd<4>; .reg .b32 %r<3>;
  ld.param.u64 %rd1, [p];
  ld.global.v2.u32 {%r1, %r2}, [%rd1];
  mov.b64 %rd2, {%r1, %r2};
  st.u32 [%rd2], 0;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0].indirect, Access::kWrite);
}

TEST(UseAnalysis, IntegerAddressIsIndirect) {
  auto r = analyze(R"(
.visible .entry k()
{
  .reg .b64 %rd<3>; .reg .b32 %r<2>;
  mov.u32 %r1, %tid.x;
  cvt.u64.u32 %rd1, %r1;
  ld.global.u32 %r1, [%rd1];
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0].indirect, Access::kRead);
}

TEST(UseAnalysis, NamedGlobalsAndConstants) {
  auto r = analyze(R"(
.global .align 4 .u32 g_counter;
.global .align 4 .b8 g_table[32];
.const .align 4 .f32 c_coeffs[4];
.global .align 8 .u64 g_ptr;
.visible .entry k()
{
  .reg .b64 %rd<6>; .reg .b32 %r<4>; .reg .f32 %f<2>;
  mov.u64 %rd1, g_counter;
  cvta.global.u64 %rd2, %rd1;
  atom.add.u32 %r1, [%rd2], 1;
  ld.global.u32 %r2, [g_table+8];
  ld.const.f32 %f1, [c_coeffs+4];
  ld.global.u64 %rd3, [g_ptr];
  st.global.u32 [%rd3], %r2;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature& s = (*r)[0];
  ASSERT_EQ(s.globals.size(), 4u);
  EXPECT_EQ(s.globals[0], (GlobalUse{"c_coeffs", Access::kRead}));
  EXPECT_EQ(s.globals[1], (GlobalUse{"g_counter", Access::kReadWrite}));
  EXPECT_EQ(s.globals[2], (GlobalUse{"g_ptr", Access::kRead}));
  EXPECT_EQ(s.globals[3], (GlobalUse{"g_table", Access::kRead}));
  // What g_ptr holds is a pointer nobody named.
  EXPECT_EQ(s.indirect, Access::kWrite);
}

TEST(UseAnalysis, SharedAndLocalAccessesAreNotGlobalMemory) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 out)
{
  .local .align 8 .b8 depot[16];
  .shared .align 4 .b8 tile[128];
  .reg .b64 %rd<8>; .reg .b32 %r<4>;
  ld.param.u64 %rd1, [out];
  mov.u64 %rd2, tile;
  cvta.shared.u64 %rd3, %rd2;
  ld.global.u8 %r1, [%rd1];
  mul.wide.u32 %rd4, %r1, 4;
  add.s64 %rd5, %rd3, %rd4;
  atom.add.u32 %r2, [%rd5], 1;
  st.shared.u32 [tile], %r2;
  mov.u64 %rd6, depot;
  cvta.local.u64 %rd7, %rd6;
  st.u32 [%rd7+4], %r2;
  ld.local.u32 %r3, [depot+4];
  st.global.u32 [%rd1+4], %r3;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0].indirect, Access::kNone);
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kReadWrite);
}

TEST(UseAnalysis, PointerSpilledToLocalMemoryIsStillTracked) {
  // What nvcc -G emits: every parameter spilled to the frame and reloaded.
  auto r = analyze(R"(
.visible .entry k(.param .u64 in, .param .u64 out)
{
  .local .align 8 .b8 __local_depot0[32];
  .reg .b64 %SP; .reg .b64 %SPL;
  .reg .b64 %rd<12>; .reg .b32 %r<3>;
  mov.u64 %SPL, __local_depot0;
  cvta.local.u64 %SP, %SPL;
  ld.param.u64 %rd1, [in];
  ld.param.u64 %rd2, [out];
  st.u64 [%SP+0], %rd1;
  st.u64 [%SP+8], %rd2;
  st.local.v2.u32 [%SPL+16], {%r1, %r2};
  ld.u64 %rd3, [%SP+0];
  ld.u32 %r1, [%rd3];
  ld.local.u32 %r2, [%SPL+12];
  cvt.u64.u32 %rd9, %r2;
  ld.u64 %rd4, [%SP+8];
  add.u64 %rd5, %SP, 8;
  ld.u64 %rd6, [%rd5];
  st.u32 [%rd6], %r1;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature& s = (*r)[0];
  EXPECT_EQ(accessOf(s, 0), Access::kRead);
  EXPECT_EQ(accessOf(s, 1), Access::kWrite);
  EXPECT_FALSE(escapes(s, 0));
  EXPECT_FALSE(escapes(s, 1));
  EXPECT_EQ(s.indirect, Access::kNone);
}

TEST(UseAnalysis, PointerStoredToSharedMemoryEscapes) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 p)
{
  .shared .align 8 .u64 slot;
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [p];
  st.shared.u64 [slot], %rd1;
  ld.shared.u64 %rd2, [slot];
  st.u32 [%rd2], 1;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(escapes((*r)[0], 0));
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kReadWrite);
  EXPECT_EQ((*r)[0].indirect, Access::kWrite);
}

TEST(UseAnalysis, CalleesSeeTheCallersFrame) {
  // -G: a struct of pointers built in the caller's frame, its address passed down,
  // the callee loads a pointer from it and stores through it. Handed to unknown
  // code instead, everything the frame holds escapes.
  auto r = analyze(R"(
.func store_through(.param .b64 s);
.extern .func opaque(.param .b64 p);
.visible .entry followed(.param .u64 out)
{
  .local .align 8 .b8 __local_depot0[16];
  .reg .b64 %SP; .reg .b64 %SPL; .reg .b64 %rd<4>;
  mov.u64 %SPL, __local_depot0;
  cvta.local.u64 %SP, %SPL;
  ld.param.u64 %rd1, [out];
  st.u64 [%SP+8], %rd1;
  add.u64 %rd3, %SP, 0;
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd3;
  call.uni store_through, (param0);
  }
  ret;
}
.visible .entry unknown(.param .u64 out)
{
  .local .align 8 .b8 __local_depot1[16];
  .reg .b64 %SP; .reg .b64 %SPL; .reg .b64 %rd<4>;
  mov.u64 %SPL, __local_depot1;
  cvta.local.u64 %SP, %SPL;
  ld.param.u64 %rd1, [out];
  st.u64 [%SP+8], %rd1;
  add.u64 %rd3, %SP, 0;
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd3;
  call.uni opaque, (param0);
  }
  ret;
}
.func store_through(.param .b64 s)
{
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [s];
  ld.u64 %rd2, [%rd1+8];
  st.u32 [%rd2], 5;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature* followed = kernel(*r, "followed");
  ASSERT_NE(followed, nullptr);
  EXPECT_EQ(accessOf(*followed, 0), Access::kWrite);
  EXPECT_FALSE(escapes(*followed, 0));
  EXPECT_EQ(followed->indirect, Access::kNone);

  const KernelSignature* unknown = kernel(*r, "unknown");
  ASSERT_NE(unknown, nullptr);
  EXPECT_TRUE(escapes(*unknown, 0));
  EXPECT_EQ(accessOf(*unknown, 0), Access::kReadWrite);
  EXPECT_EQ(unknown->indirect, Access::kReadWrite);
}

TEST(UseAnalysis, LoopCarriedRegistersReachAFixpoint) {
  // %rd4 walks from `b` only on the back edge: the first pass has not seen it.
  auto r = analyze(R"(
.visible .entry k(.param .u64 a, .param .u64 b, .param .u32 n)
{
  .reg .pred %p<2>; .reg .b64 %rd<8>; .reg .b32 %r<4>;
  ld.param.u64 %rd1, [a];
  ld.param.u64 %rd2, [b];
  ld.param.u32 %r1, [n];
  mov.u64 %rd4, %rd1;
  mov.u32 %r2, 0;
$L_loop:
  st.global.u32 [%rd4], %r2;
  add.s64 %rd5, %rd6, 4;
  mov.u64 %rd4, %rd5;
  mov.u64 %rd6, %rd2;
  add.s32 %r2, %r2, 1;
  setp.lt.u32 %p1, %r2, %r1;
  @%p1 bra $L_loop;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kWrite);
  EXPECT_EQ(accessOf((*r)[0], 1), Access::kWrite);
  EXPECT_EQ((*r)[0].indirect, Access::kNone);
}

TEST(UseAnalysis, CallsIntoFunctionsWithBodiesAreFollowed) {
  auto r = analyze(R"(
.func (.param .b64 ret) advance(.param .b64 p, .param .b32 v);
.visible .entry k(.param .u64 a, .param .u64 b)
{
  .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [a];
  ld.param.u64 %rd2, [b];
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd1;
  .param .b32 param1;
  st.param.b32 [param1+0], 3;
  .param .b64 retval0;
  call.uni (retval0), advance, (param0, param1);
  ld.param.b64 %rd3, [retval0+0];
  }
  ld.global.u32 %r9, [%rd3];
  st.global.u32 [%rd2], %r9;
  ret;
}
.func (.param .b64 ret) advance(.param .b64 p, .param .b32 v)
{
  .reg .b64 %rd<4>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [v];
  st.u32 [%rd1], %r1;
  add.s64 %rd2, %rd1, 16;
  st.param.b64 [ret+0], %rd2;
  ret;
}
)");
  // %r9 is undeclared in the kernel: the module is malformed.
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));

  r = analyze(R"(
.func (.param .b64 ret) advance(.param .b64 p, .param .b32 v);
.visible .entry k(.param .u64 a, .param .u64 b)
{
  .reg .b64 %rd<6>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [a];
  ld.param.u64 %rd2, [b];
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd1;
  .param .b32 param1;
  st.param.b32 [param1+0], 3;
  .param .b64 retval0;
  call.uni (retval0), advance, (param0, param1);
  ld.param.b64 %rd3, [retval0+0];
  }
  ld.global.u32 %r1, [%rd3];
  st.global.u32 [%rd2], %r1;
  ret;
}
.func (.param .b64 ret) advance(.param .b64 p, .param .b32 v)
{
  .reg .b64 %rd<4>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [v];
  st.u32 [%rd1], %r1;
  add.s64 %rd2, %rd1, 16;
  st.param.b64 [ret+0], %rd2;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature& s = (*r)[0];
  // Written in the callee, read through the pointer it returns.
  EXPECT_EQ(accessOf(s, 0), Access::kReadWrite);
  EXPECT_EQ(accessOf(s, 1), Access::kWrite);
  EXPECT_FALSE(escapes(s, 0));
  EXPECT_EQ(s.indirect, Access::kNone);
}

TEST(UseAnalysis, RecursionEndsAndKeepsWhatTheCalleeDoes) {
  auto r = analyze(R"(
.func walk(.param .b64 p, .param .b32 n);
.visible .entry k(.param .u64 a)
{
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [a];
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd1;
  .param .b32 param1;
  st.param.b32 [param1+0], 10;
  call.uni walk, (param0, param1);
  }
  ret;
}
.func walk(.param .b64 p, .param .b32 n)
{
  .reg .pred %p<2>; .reg .b64 %rd<3>; .reg .b32 %r<3>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  setp.eq.s32 %p1, %r1, 0;
  @%p1 ret;
  st.u32 [%rd1], %r1;
  add.s64 %rd2, %rd1, 4;
  sub.s32 %r2, %r1, 1;
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd2;
  .param .b32 param1;
  st.param.b32 [param1+0], %r2;
  call.uni walk, (param0, param1);
  }
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kWrite);
  EXPECT_EQ((*r)[0].indirect, Access::kNone);
}

TEST(UseAnalysis, UnknownCalleesMakeArgumentsEscape) {
  auto r = analyze(R"(
.extern .func (.param .b32 ret) opaque(.param .b64 p);
.visible .entry k(.param .u64 a, .param .u64 b)
{
  .reg .b64 %rd<3>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [a];
  ld.param.u64 %rd2, [b];
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd1;
  .param .b32 retval0;
  call.uni (retval0), opaque, (param0);
  ld.param.b32 %r1, [retval0+0];
  }
  st.global.u32 [%rd2], %r1;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature& s = (*r)[0];
  EXPECT_TRUE(escapes(s, 0));
  EXPECT_EQ(accessOf(s, 0), Access::kReadWrite);
  EXPECT_FALSE(escapes(s, 1));
  EXPECT_EQ(accessOf(s, 1), Access::kWrite);
  EXPECT_EQ(s.indirect, Access::kReadWrite);
}

TEST(UseAnalysis, IndirectCallThroughARegister) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 a, .param .u64 fn)
{
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [a];
  ld.param.u64 %rd2, [fn];
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd1;
  prototype_0 : .callprototype ()_ (.param .b64 _);
  call %rd2, (param0), prototype_0;
  }
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(escapes((*r)[0], 0));
  EXPECT_EQ((*r)[0].indirect, Access::kReadWrite);
}

TEST(UseAnalysis, PrintfReadsItsArgumentsAndEscapesNothing) {
  auto r = analyze(R"(
.extern .func (.param .b32 func_retval0) vprintf(.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);
.global .align 1 .b8 $str[4] = {37, 115, 10, 0};
.visible .entry k(.param .u64 label, .param .u64 out)
{
  .local .align 8 .b8 __local_depot0[16];
  .reg .b64 %SP; .reg .b64 %SPL;
  .reg .b64 %rd<8>; .reg .b32 %r<2>;
  mov.u64 %SPL, __local_depot0;
  cvta.local.u64 %SP, %SPL;
  ld.param.u64 %rd1, [label];
  ld.param.u64 %rd6, [out];
  st.u64 [%SP+0], %rd6;
  st.u64 [%SP+8], %rd1;
  mov.u64 %rd2, $str;
  cvta.global.u64 %rd3, %rd2;
  add.u64 %rd4, %SP, 8;
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd3;
  .param .b64 param1;
  st.param.b64 [param1+0], %rd4;
  .param .b32 retval0;
  call.uni (retval0), vprintf, (param0, param1);
  ld.param.b32 %r1, [retval0+0];
  }
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature& s = (*r)[0];
  EXPECT_EQ(accessOf(s, 0), Access::kRead);
  EXPECT_FALSE(escapes(s, 0));
  // Spilled below the printf buffer: not printed, not read.
  EXPECT_EQ(accessOf(s, 1), Access::kNone);
  EXPECT_EQ(s.indirect, Access::kNone);
  ASSERT_EQ(s.globals.size(), 1u);
  EXPECT_EQ(s.globals[0], (GlobalUse{"$str", Access::kRead}));
}

TEST(UseAnalysis, AsyncCopiesReadTheirGlobalSource) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 src, .param .u64 dst)
{
  .shared .align 16 .b8 buf[256];
  .reg .b64 %rd<4>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [src];
  ld.param.u64 %rd2, [dst];
  mov.u32 %r1, buf;
  cp.async.ca.shared.global [%r1], [%rd1], 16;
  cp.async.wait_all;
  ret;
}
)");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(accessOf((*r)[0], 0), Access::kRead);
  EXPECT_EQ(accessOf((*r)[0], 1), Access::kNone);
  EXPECT_EQ((*r)[0].indirect, Access::kNone);
}

TEST(UseAnalysis, MangledNamesGiveConstPointees) {
  auto r = analyze(R"(
.visible .entry _Z5saxpyifPKfPf(.param .u32 _Z5saxpyifPKfPf_param_0, .param .f32 _Z5saxpyifPKfPf_param_1, .param .u64 _Z5saxpyifPKfPf_param_2, .param .u64 _Z5saxpyifPKfPf_param_3)
{
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [_Z5saxpyifPKfPf_param_2];
  ld.param.u64 %rd2, [_Z5saxpyifPKfPf_param_3];
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd1;
  call.uni opaque, (param0);
  }
  {
  .param .b64 param0;
  st.param.b64 [param0+0], %rd2;
  call.uni opaque, (param0);
  }
  ret;
}
.extern .func opaque(.param .b64 p);
)");
  ASSERT_THAT(r, IsOk());
  const KernelSignature& s = (*r)[0];
  EXPECT_EQ(s.demangled, "saxpy(int, float, float const*, float*)");
  EXPECT_EQ(s.sources, kFromPtx | kFromMangledName);
  const PointerWord* x = word(s, 2);
  const PointerWord* y = word(s, 3);
  ASSERT_TRUE(x && y);
  EXPECT_TRUE(x->declaredConst);
  EXPECT_EQ(x->declaredType, "float const*");
  EXPECT_TRUE(x->escapes);
  EXPECT_EQ(x->access, Access::kRead);  // escaped, but const: only read
  EXPECT_FALSE(y->declaredConst);
  EXPECT_EQ(y->access, Access::kReadWrite);
}

TEST(UseAnalysis, MalformedModulesAreRefused) {
  auto r = analyze(R"(
.visible .entry k(.param .u64 a)
{
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [a];
  bra $L_nowhere;
  ret;
}
)");
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument, ::testing::HasSubstr("$L_nowhere")));
}

// --- The corpus --------------------------------------------------------------

class Corpus : public ::testing::Test {
 protected:
  // Whether the build made tests/corpus PTX `file` (it lists what nvcc, numba and
  // clang produced on this host in PHOS_CORPUS_FILES).
  static bool made(const std::string& file) {
    const char* list = std::getenv("PHOS_CORPUS_FILES");
    return list && ("," + std::string(list) + ",").find("," + file + ",") != std::string::npos;
  }
  // The signatures of a corpus file the build made; a made file that is missing
  // or does not analyse is a failure.
  std::vector<KernelSignature> load(const std::string& file) {
    const char* dir = std::getenv("PHOS_CORPUS_DIR");
    std::string path = std::string(dir ? dir : "") + "/" + file;
    if (!std::filesystem::exists(path)) {
      ADD_FAILURE() << "corpus file missing: " << path;
      return {};
    }
    std::ifstream in(path);
    std::stringstream buf;
    buf << in.rdbuf();
    Result<ptx::Module> m = ptx::parseModule(buf.str(), path);
    EXPECT_THAT(m, IsOk());
    if (!m.isOk()) return {};
    Result<std::vector<KernelSignature>> s = analyzeModule(*m);
    EXPECT_THAT(s, IsOk());
    return s.isOk() ? *s : std::vector<KernelSignature>{};
  }
};

#define REQUIRE_CORPUS(file) \
  if (!made(file)) GTEST_SKIP() << file << " was not built here (no nvcc/numba/clang)"

TEST_F(Corpus, SaxpyO3) {
  REQUIRE_CORPUS("corpus_saxpy_O3.ptx");
  auto sigs = load("corpus_saxpy_O3.ptx");
  const KernelSignature* saxpy = kernel(sigs, "saxpy");
  ASSERT_NE(saxpy, nullptr);
  EXPECT_EQ(accessOf(*saxpy, 2), Access::kRead);       // const float* x
  EXPECT_EQ(accessOf(*saxpy, 3), Access::kReadWrite);  // float* y
  EXPECT_EQ(saxpy->indirect, Access::kNone);

  const KernelSignature* grid = kernel(sigs, "saxpy_grid_stride");
  ASSERT_NE(grid, nullptr);
  EXPECT_EQ(accessOf(*grid, 0), Access::kNone);  // size_t n
  EXPECT_EQ(accessOf(*grid, 2), Access::kRead);

  const KernelSignature* daxpy = kernel(sigs, "_Z14daxpy_unrolledidPKdPd");
  ASSERT_NE(daxpy, nullptr);
  EXPECT_EQ(daxpy->demangled, "daxpy_unrolled(int, double, double const*, double*)");
  EXPECT_TRUE(word(*daxpy, 2)->declaredConst);
  EXPECT_EQ(accessOf(*daxpy, 2), Access::kRead);
  EXPECT_EQ(accessOf(*daxpy, 3), Access::kReadWrite);

  const KernelSignature* v4 = kernel(sigs, "vector_add_float4");
  ASSERT_NE(v4, nullptr);
  EXPECT_EQ(accessOf(*v4, 0), Access::kRead);
  EXPECT_EQ(accessOf(*v4, 1), Access::kRead);
  EXPECT_EQ(accessOf(*v4, 2), Access::kWrite);

  const KernelSignature* fill = kernel(sigs, "fill_u8");
  ASSERT_NE(fill, nullptr);
  EXPECT_EQ(accessOf(*fill, 0), Access::kWrite);
}

TEST_F(Corpus, StructArgumentsPrintfAndGlobals) {
  REQUIRE_CORPUS("corpus_misc_O3.ptx");
  auto sigs = load("corpus_misc_O3.ptx");
  const KernelSignature* s = kernel(sigs, "struct_args");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(accessOf(*s, 0, 0), Access::kRead);   // b.in
  EXPECT_EQ(accessOf(*s, 0, 8), Access::kWrite);  // b.out
  EXPECT_EQ(accessOf(*s, 2), Access::kRead);      // label, printed with %s
  EXPECT_EQ(s->indirect, Access::kNone);
  for (const char* g : {"g_bias", "g_table", "c_coeffs", "c_dscale"}) {
    EXPECT_TRUE(std::any_of(s->globals.begin(), s->globals.end(), [&](const GlobalUse& u) {
      return u.name == g && u.access == Access::kRead;
    })) << g;
  }
  for (const ParamSignature& p : s->params) {
    for (const PointerWord& w : p.words) EXPECT_FALSE(w.escapes) << p.name << "+" << w.offset;
  }
}

TEST_F(Corpus, AtomicsAndNamedGlobals) {
  REQUIRE_CORPUS("corpus_atomics_O3.ptx");
  auto sigs = load("corpus_atomics_O3.ptx");
  const KernelSignature* h = kernel(sigs, "histogram");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(accessOf(*h, 0), Access::kRead);
  EXPECT_EQ(accessOf(*h, 1), Access::kReadWrite);
  EXPECT_EQ(h->indirect, Access::kNone);
}

// -G code spills every parameter through local memory and calls device functions
// with the addresses of locals; the answers must not change.
TEST_F(Corpus, DebugBuildsGiveTheSameAnswersAsOptimizedOnes) {
  for (const char* src : {"saxpy", "matmul", "reduce", "normalize", "adam", "atomics",
                          "half_bf16", "misc", "warp_tensor"}) {
    REQUIRE_CORPUS(std::string("corpus_") + src + "_G.ptx");
    auto opt = load(std::string("corpus_") + src + "_O3.ptx");
    auto dbg = load(std::string("corpus_") + src + "_G.ptx");
    ASSERT_EQ(opt.size(), dbg.size()) << src;
    for (const KernelSignature& o : opt) {
      const KernelSignature* d = kernel(dbg, o.name);
      ASSERT_NE(d, nullptr) << o.name;
      EXPECT_EQ(d->indirect, o.indirect) << o.name;
      ASSERT_EQ(d->params.size(), o.params.size()) << o.name;
      for (size_t i = 0; i < o.params.size(); ++i) {
        ASSERT_EQ(d->params[i].words.size(), o.params[i].words.size());
        for (size_t w = 0; w < o.params[i].words.size(); ++w) {
          EXPECT_EQ(d->params[i].words[w].access, o.params[i].words[w].access)
              << o.name << " param " << i << " word " << w;
          EXPECT_EQ(d->params[i].words[w].escapes, o.params[i].words[w].escapes)
              << o.name << " param " << i << " word " << w;
        }
      }
    }
  }
}

TEST_F(Corpus, ClangPtrParameters) {
  REQUIRE_CORPUS("corpus_clang_kernels_clang.ptx");
  auto sigs = load("corpus_clang_kernels_clang.ptx");
  const KernelSignature* scale = kernel(sigs, "clang_scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(accessOf(*scale, 0), Access::kWrite);
  EXPECT_EQ(accessOf(*scale, 1), Access::kRead);
  EXPECT_EQ(scale->globals, (std::vector<GlobalUse>{{"clang_bias", Access::kRead}}));
  EXPECT_EQ(scale->indirect, Access::kNone);
}

// A numba array is seven parameters (meminfo, parent, nitems, itemsize, data,
// shape, strides); only data is a buffer (shape/strides enter the address
// arithmetic too, harmlessly: they point into no allocation).
TEST_F(Corpus, NumbaArrays) {
  REQUIRE_CORPUS("corpus_numba_axpy.ptx");
  auto sigs = load("corpus_numba_axpy.ptx");
  ASSERT_EQ(sigs.size(), 1u);
  const KernelSignature& s = sigs[0];
  EXPECT_EQ(accessOf(s, 4), Access::kWrite);   // r.data
  EXPECT_EQ(accessOf(s, 12), Access::kRead);   // x.data
  EXPECT_EQ(accessOf(s, 19), Access::kRead);   // y.data
  EXPECT_EQ(accessOf(s, 0), Access::kNone);    // meminfo
  EXPECT_EQ(s.indirect, Access::kNone);
  // The mangled name demangles, but its three C++ arrays are 22 PTX parameters.
  EXPECT_FALSE(s.demangled.empty());
  EXPECT_EQ(s.sources, kFromPtx);

  REQUIRE_CORPUS("corpus_numba_axpy_debug.ptx");
  auto dbg = load("corpus_numba_axpy_debug.ptx");
  ASSERT_EQ(dbg.size(), 1u);
  EXPECT_EQ(accessOf(dbg[0], 4), Access::kWrite);
  EXPECT_EQ(accessOf(dbg[0], 12), Access::kRead);
  EXPECT_EQ(dbg[0].indirect, Access::kNone);
}

}  // namespace
}  // namespace phos::instrument
