// SPDX-License-Identifier: Apache-2.0
// Name resolution for executors: flattened scopes, register lookup, branch targets,
// special registers and initializer bytes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "phos/ptx/parser.h"
#include "phos/ptx/resolve.h"
#include "status_matchers.h"

namespace phos::ptx {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Module parse(std::string_view body) {
  std::string text = ".version 9.0\n.target sm_80\n.address_size 64\n" + std::string(body);
  Result<Module> m = parseModule(text, "resolve.ptx");
  EXPECT_THAT(m, IsOk());
  return m.isOk() ? std::move(*m) : Module{};
}

constexpr std::string_view kLoop = R"(
.global .align 4 .u32 g_count;
.visible .entry loop(
	.param .u64 loop_param_0,
	.param .u32 loop_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<2>;
	.loc	1 4 0
	ld.param.u32 	%r1, [loop_param_1];
	mov.u32 	%r2, 0;
$L__BB0_1:
	{
	.reg .b32 t;
	add.s32 	t, %r2, 1;
	mov.u32 	%r2, t;
	}
	setp.lt.u32 	%p1, %r2, %r1;
	@%p1 bra 	$L__BB0_1;
	mov.u32 	%r3, %tid.x;
	st.global.u32 	[g_count], %r3;
	bra.uni 	$L__BB0_end;
$L__BB0_end:
}
)";

TEST(PtxResolve, FlattensBlocksAndResolvesBranchTargets) {
  Module m = parse(kLoop);
  const Function* f = m.findFunction("loop");
  ASSERT_NE(f, nullptr);
  Result<ResolvedFunction> r = ResolvedFunction::build(*f, &m);
  ASSERT_THAT(r, IsOk());
  const auto& insts = r->instructions();
  ASSERT_EQ(insts.size(), 9u);
  EXPECT_EQ(insts[2].inst->opcode, Opcode::kAdd);
  EXPECT_EQ(insts[2].scope, 1u);
  EXPECT_EQ(insts[4].scope, 0u);
  EXPECT_EQ(insts[5].inst->opcode, Opcode::kBra);
  EXPECT_EQ(insts[5].target, 2) << "the loop jumps back into the first instruction of the block";
  EXPECT_EQ(insts[8].target, 9) << "a label at the end points past the last instruction";
  EXPECT_EQ(insts[0].target, -1);
  ASSERT_NE(insts[0].loc, nullptr);
  EXPECT_EQ(insts[0].loc->line, 4u);
  ASSERT_EQ(r->labels().size(), 2u);
  EXPECT_EQ(r->labels()[0].first, "$L__BB0_1");
  EXPECT_EQ(r->labels()[0].second, 2u);
  ASSERT_EQ(r->scopes().size(), 2u);
  EXPECT_EQ(r->scopes()[1].parent, 0);
  ASSERT_EQ(r->scopes()[1].decls.size(), 1u);
  EXPECT_EQ(r->scopes()[1].decls[0]->name, "t");
}

TEST(PtxResolve, FindsRegistersThroughRangesAndScopes) {
  Module m = parse(kLoop);
  Result<ResolvedFunction> r = ResolvedFunction::build(*m.findFunction("loop"), &m);
  ASSERT_THAT(r, IsOk());
  const VarDecl* r3 = r->findDecl("%r3", 0);
  ASSERT_NE(r3, nullptr);
  EXPECT_EQ(r3->type, Type::kB32);
  EXPECT_EQ(r3->rangeCount, 4u);
  EXPECT_EQ(r->findDecl("%r4", 0), nullptr) << "%r<4> declares %r0..%r3";
  EXPECT_EQ(r->findDecl("%rd1", 0)->type, Type::kB64);
  EXPECT_EQ(r->findDecl("%p1", 1)->type, Type::kPred) << "visible from the inner scope";
  EXPECT_EQ(r->findDecl("t", 0), nullptr) << "not visible outside its block";
  EXPECT_EQ(r->findDecl("t", 1)->type, Type::kB32);
  EXPECT_EQ(r->findDecl("loop_param_1", 0)->type, Type::kU32);
  EXPECT_EQ(r->labelTarget("$L__BB0_1", 1), 2u);
  EXPECT_EQ(r->labelTarget("nowhere", 0), std::nullopt);
}

TEST(PtxResolve, ReportsUndeclaredNames) {
  Module m = parse(R"(
.visible .entry k()
{
	.reg .b32 	%r<2>;
	mov.u32 	%r5, 1;
}
.visible .entry l()
{
	bra.uni 	$L__missing;
}
.visible .entry d()
{
$L__x:
$L__x:
	ret;
}
.visible .entry v()
{
	.reg .b32 	%r<2>;
	ld.global.u32 	%r1, [no_such_var];
}
)");
  Result<ResolvedFunction> k = ResolvedFunction::build(*m.findFunction("k"), &m);
  EXPECT_THAT(k, StatusIs(Code::kInvalidArgument, HasSubstr("register %r5 is not declared")));
  EXPECT_THAT(k.status().message(), HasSubstr("function k: line 8"));
  EXPECT_THAT(ResolvedFunction::build(*m.findFunction("l"), &m),
              StatusIs(Code::kInvalidArgument, HasSubstr("label $L__missing is not declared")));
  EXPECT_THAT(ResolvedFunction::build(*m.findFunction("d"), &m),
              StatusIs(Code::kInvalidArgument, HasSubstr("label $L__x is defined twice")));
  EXPECT_THAT(ResolvedFunction::build(*m.findFunction("v"), &m),
              StatusIs(Code::kInvalidArgument, HasSubstr("variable no_such_var")));
}

TEST(PtxResolve, CallTargetsAndParamBlocks) {
  Module m = parse(R"(
.func  (.param .b32 func_retval0) twice(.param .b32 twice_param_0)
{
	.reg .b32 	%r<3>;
	ld.param.b32 	%r1, [twice_param_0];
	add.s32 	%r2, %r1, %r1;
	st.param.b32 	[func_retval0], %r2;
	ret;
}
.visible .entry k()
{
	.reg .b32 	%r<2>;
	{
	.param .b32 param0;
	st.param.b32 	[param0], 3;
	.param .b32 retval0;
	call.uni (retval0), twice, (param0);
	ld.param.b32 	%r1, [retval0];
	}
	ret;
}
)");
  Result<ResolvedFunction> twice = ResolvedFunction::build(*m.findFunction("twice"), &m);
  ASSERT_THAT(twice, IsOk());
  EXPECT_EQ(twice->findDecl("func_retval0", 0)->type, Type::kB32);
  Result<ResolvedFunction> k = ResolvedFunction::build(*m.findFunction("k"), &m);
  ASSERT_THAT(k, IsOk());
  EXPECT_EQ(k->instructions()[1].inst->opcode, Opcode::kCall);
  EXPECT_EQ(k->instructions()[1].target, -1) << "a function is not a label";
}

TEST(PtxResolve, SpecialRegisters) {
  ASSERT_TRUE(specialRegister("%tid").has_value());
  EXPECT_TRUE(specialRegister("%tid")->hasComponents);
  EXPECT_EQ(specialRegister("%tid")->type, Type::kU32);
  EXPECT_EQ(specialRegister("%clock64")->type, Type::kU64);
  EXPECT_FALSE(specialRegister("%laneid")->hasComponents);
  EXPECT_TRUE(specialRegister("%envreg31").has_value());
  EXPECT_FALSE(specialRegister("%envreg32").has_value());
  EXPECT_EQ(specialRegister("%pm3_64")->type, Type::kU64);
  EXPECT_FALSE(specialRegister("%r1").has_value());
}

TEST(PtxInitializer, EncodesScalarsArraysAndAddresses) {
  Module m = parse(R"(
.global .align 4 .f32 g_bias = 0f3FC00000;
.global .align 4 .u32 g_table[4] = {1, 2, 0xFFFFFFFF};
.global .align 2 .b16 g_half[2] = {{0x3C00}, {0xC000}};
.global .align 4 .f32 g_conv[2] = {0d3FF0000000000000, 2};
.global .align 8 .u64 g_ptrs[2] = {generic(g_table), generic(g_table)+8};
.global .align 8 .f64 g_zero;
)");
  auto bytes = [&](std::string_view name) {
    AddressResolver at = [](std::string_view sym) -> Result<uint64_t> {
      if (sym == "g_table") return uint64_t{0x7f0000001000};
      return makeError(Code::kNotFound, "no {}", sym);
    };
    return encodeInitializer(*m.findVariable(name), at);
  };
  EXPECT_THAT(*bytes("g_bias"), ElementsAre(0x00, 0x00, 0xC0, 0x3F));
  EXPECT_THAT(*bytes("g_table"), ElementsAre(1, 0, 0, 0, 2, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF,
                                             0, 0, 0, 0));
  EXPECT_THAT(*bytes("g_half"), ElementsAre(0x00, 0x3C, 0x00, 0xC0));
  EXPECT_THAT(*bytes("g_conv"), ElementsAre(0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40));
  EXPECT_THAT(*bytes("g_ptrs"), ElementsAre(0x00, 0x10, 0, 0, 0, 0x7f, 0, 0,  //
                                            0x08, 0x10, 0, 0, 0, 0x7f, 0, 0));
  EXPECT_THAT(*bytes("g_zero"), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
  EXPECT_THAT(encodeInitializer(*m.findVariable("g_ptrs")),
              StatusIs(Code::kFailedPrecondition));
}

TEST(PtxInitializer, RejectsTooManyElements) {
  Module m = parse(".global .u8 small[2] = {1, 2, 3};\n");
  EXPECT_THAT(encodeInitializer(*m.findVariable("small")),
              StatusIs(Code::kInvalidArgument, HasSubstr("has 3 elements; the variable holds 2")));
}

}  // namespace
}  // namespace phos::ptx
