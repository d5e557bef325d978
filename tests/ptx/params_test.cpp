// SPDX-License-Identifier: Apache-2.0
// Kernel parameter layout: the offsets and sizes cuFuncGetParamInfo reports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "phos/ptx/params.h"
#include "phos/ptx/parser.h"
#include "status_matchers.h"

namespace phos::ptx {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;

Result<std::vector<ParamLayout>> layoutsOf(std::string_view entries) {
  std::string text = ".version 9.0\n.target sm_80\n.address_size 64\n" + std::string(entries);
  ASSIGN_OR_RETURN(Module m, parseModule(text, "params.ptx"));
  return computeParamLayouts(m);
}

struct Expect {
  uint32_t offset, size, alignment;
};

void expectLayout(const ParamLayout& l, std::initializer_list<Expect> want, uint32_t total) {
  ASSERT_EQ(l.params.size(), want.size()) << l.kernel;
  size_t i = 0;
  for (const Expect& e : want) {
    SCOPED_TRACE(l.kernel + " param " + std::to_string(i));
    EXPECT_EQ(l.params[i].ordinal, i);
    EXPECT_EQ(l.params[i].offset, e.offset);
    EXPECT_EQ(l.params[i].size, e.size);
    EXPECT_EQ(l.params[i].alignment, e.alignment);
    ++i;
  }
  EXPECT_EQ(l.totalSize, total) << l.kernel;
}

TEST(PtxParams, NaturalAlignmentOfScalars) {
  // __global__ void k(char c, double d, short s, int i, float* p, half h)
  auto r = layoutsOf(R"(
.visible .entry k(
	.param .u8 k_param_0,
	.param .f64 k_param_1,
	.param .u16 k_param_2,
	.param .u32 k_param_3,
	.param .u64 k_param_4,
	.param .align 2 .b8 k_param_5[2]
)
{
	ret;
}
)");
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->size(), 1u);
  expectLayout((*r)[0], {{0, 1, 1}, {8, 8, 8}, {16, 2, 2}, {20, 4, 4}, {24, 8, 8}, {32, 2, 2}},
               34);
  EXPECT_EQ((*r)[0].kernel, "k");
  EXPECT_EQ((*r)[0].params[4].name, "k_param_4");
}

TEST(PtxParams, StructsByValueUseTheirDeclaredAlignment) {
  // struct Buffers { const float* in; float* out; int64_t n; double s; } (32 bytes, align 8)
  // struct Small { char tag; short s; int i; } (8 bytes, align 4); then a pointer.
  // struct alignas(16) V { float x, y, z, w; }; struct P { char c[3]; } (align 1).
  auto r = layoutsOf(R"(
.visible .entry struct_args(
	.param .align 8 .b8 struct_args_param_0[32],
	.param .align 4 .b8 struct_args_param_1[8],
	.param .u64 struct_args_param_2
)
{
	ret;
}
.visible .entry mixed(
	.param .u8 mixed_param_0,
	.param .align 16 .b8 mixed_param_1[16],
	.param .align 1 .b8 mixed_param_2[3],
	.param .u32 mixed_param_3,
	.param .b8 mixed_param_4[5],
	.param .u16 mixed_param_5
)
{
	ret;
}
)");
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->size(), 2u);
  expectLayout((*r)[0], {{0, 32, 8}, {32, 8, 4}, {40, 8, 8}}, 48);
  EXPECT_FALSE((*r)[0].params[0].mayBePointer);
  EXPECT_TRUE((*r)[0].params[2].mayBePointer);
  // A .b8 array without .align is byte-aligned.
  expectLayout((*r)[1], {{0, 1, 1}, {16, 16, 16}, {32, 3, 1}, {36, 4, 4}, {40, 5, 1},
                         {46, 2, 2}},
               48);
}

TEST(PtxParams, VectorsPointersAndPointerLikeScalars) {
  auto r = layoutsOf(R"(
.visible .entry clangk(
	.param .u64 .ptr .global .align 4 clangk_param_0,
	.param .u32 clangk_param_1,
	.param .v2 .u32 clangk_param_2,
	.param .s64 clangk_param_3,
	.param .f64 clangk_param_4,
	.param .v4 .f32 clangk_param_5
)
{
	ret;
}
.func helper(.param .b32 x)
{
	ret;
}
)");
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->size(), 1u) << "only .entry functions have a launch layout";
  expectLayout((*r)[0], {{0, 8, 8}, {8, 4, 4}, {16, 8, 8}, {24, 8, 8}, {32, 8, 8}, {48, 16, 16}},
               64);
  const auto& p = (*r)[0].params;
  EXPECT_TRUE(p[0].isPtr);
  EXPECT_TRUE(p[0].mayBePointer);
  EXPECT_FALSE(p[1].mayBePointer);
  EXPECT_FALSE(p[2].mayBePointer);
  EXPECT_TRUE(p[3].mayBePointer) << "a 64-bit integer can hold a pointer";
  EXPECT_FALSE(p[4].mayBePointer) << "a double cannot";
  EXPECT_EQ(p[5].type, Type::kF32);
}

TEST(PtxParams, KernelWithoutParameters) {
  auto r = layoutsOf(".visible .entry empty()\n{\n\tret;\n}\n");
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_TRUE((*r)[0].params.empty());
  EXPECT_EQ((*r)[0].totalSize, 0u);
}

TEST(PtxParams, UnsizedParameterIsAnError) {
  auto r = layoutsOf(".visible .entry bad(\n\t.param .b8 bad_param_0[]\n)\n{\n\tret;\n}\n");
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("bad_param_0"));
}

}  // namespace
}  // namespace phos::ptx
