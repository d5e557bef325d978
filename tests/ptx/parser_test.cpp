// SPDX-License-Identifier: Apache-2.0
// Tests of the PTX parser: each construct real compilers emit lands in the typed AST.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "status_matchers.h"

namespace phos::ptx {
namespace {

using ::phos::testing::IsOk;
using ::testing::ElementsAre;

constexpr std::string_view kHeader = ".version 9.0\n.target sm_80\n.address_size 64\n";

Module parseOk(std::string_view body) {
  std::string text = std::string(kHeader) + std::string(body);
  Result<Module> m = parseModule(text, "test.ptx");
  EXPECT_THAT(m, IsOk());
  return m.isOk() ? std::move(*m) : Module{};
}

Instruction parseInstruction(std::string_view text) {
  Result<std::vector<Statement>> s = parseStatements(text);
  EXPECT_THAT(s, IsOk());
  if (!s.isOk() || s->size() != 1) {
    ADD_FAILURE() << "expected one statement from: " << text;
    return {};
  }
  const auto* inst = std::get_if<Instruction>(&(*s)[0].value);
  if (!inst) {
    ADD_FAILURE() << "not an instruction: " << text;
    return {};
  }
  return *inst;
}

TEST(PtxParser, ModuleHeader) {
  Result<Module> m =
      parseModule(".version 8.5\n.target sm_90a, debug\n.address_size 64\n", "h.ptx");
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->versionMajor, 8u);
  EXPECT_EQ(m->versionMinor, 5u);
  EXPECT_THAT(m->target, ElementsAre("sm_90a", "debug"));
  EXPECT_EQ(m->addressSize, 64u);
  EXPECT_TRUE(m->items.empty());
}

TEST(PtxParser, EntryWithParametersAndRegisters) {
  Module m = parseOk(R"(
.visible .entry saxpy(
	.param .u32 saxpy_param_0,
	.param .f32 saxpy_param_1,
	.param .u64 .ptr .global .align 16 saxpy_param_2
)
.maxntid 256, 1, 1
.minnctapersm 2
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	ret;
}
)");
  const Function* f = m.findFunction("saxpy");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->isEntry);
  EXPECT_EQ(f->linkage, Linkage::kVisible);
  ASSERT_EQ(f->params.size(), 3u);
  EXPECT_EQ(f->params[0].type, Type::kU32);
  EXPECT_EQ(f->params[0].space, StateSpace::kParam);
  EXPECT_EQ(f->params[1].type, Type::kF32);
  EXPECT_TRUE(f->params[2].isPtr);
  EXPECT_EQ(f->params[2].ptrSpace, StateSpace::kGlobal);
  EXPECT_EQ(f->params[2].ptrAlign, 16u);
  ASSERT_EQ(f->attributes.size(), 2u);
  EXPECT_EQ(f->attributes[0].kind, FunctionAttribute::Kind::kMaxNtid);
  EXPECT_THAT(f->attributes[0].values, ElementsAre(256u, 1u, 1u));
  EXPECT_EQ(f->attributes[1].kind, FunctionAttribute::Kind::kMinNctaPerSm);
  ASSERT_EQ(f->body.size(), 3u);
  const auto& preds = std::get<VarDecl>(f->body[0].value);
  EXPECT_EQ(preds.space, StateSpace::kReg);
  EXPECT_EQ(preds.type, Type::kPred);
  EXPECT_EQ(preds.name, "%p");
  EXPECT_EQ(preds.rangeCount, 2u);
  EXPECT_EQ(std::get<Instruction>(f->body[2].value).opcode, Opcode::kRet);
}

TEST(PtxParser, FuncWithReturnParameterAndExternDeclaration) {
  Module m = parseOk(R"(
.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.weak .func  (.param .align 16 .b8 func_retval0[16]) pair(.param .b32 pair_param_0)
.noreturn
{
	ret;
}
)");
  const Function* v = m.findFunction("vprintf");
  ASSERT_NE(v, nullptr);
  EXPECT_FALSE(v->isEntry);
  EXPECT_FALSE(v->hasBody);
  EXPECT_EQ(v->linkage, Linkage::kExtern);
  ASSERT_EQ(v->returnParams.size(), 1u);
  EXPECT_EQ(v->returnParams[0].name, "func_retval0");
  EXPECT_EQ(v->params.size(), 2u);
  const Function* p = m.findFunction("pair");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->linkage, Linkage::kWeak);
  EXPECT_EQ(p->returnParams[0].align, 16u);
  EXPECT_THAT(p->returnParams[0].dims, ElementsAre(16u));
  ASSERT_EQ(p->attributes.size(), 1u);
  EXPECT_EQ(p->attributes[0].kind, FunctionAttribute::Kind::kNoReturn);
}

TEST(PtxParser, GlobalsWithInitializers) {
  Module m = parseOk(R"(
.global .align 4 .f32 g_bias = 0f3FC00000;
.global .align 4 .b8 g_table[8] = {1, 0, 0, 0, 2, 0, 0, 0};
.const .align 8 .f64 c_dscale = 0d4000000000000000;
.global .align 8 .u64 ptrs[2] = {generic(g_table), generic(g_table)+4};
.extern .shared .align 16 .b8 dyn[];
.common .global .align 8 .u64 numba_env;
.global .align 1 .b8 $str[3] = {104, 105, 0};
)");
  ASSERT_EQ(m.items.size(), 7u);
  const auto& bias = std::get<VarDecl>(m.items[0]);
  EXPECT_EQ(bias.space, StateSpace::kGlobal);
  ASSERT_TRUE(bias.init.has_value());
  EXPECT_EQ(bias.init->kind, OperandKind::kImmFloat);
  EXPECT_EQ(bias.init->floatWidth, 32);
  EXPECT_EQ(bias.init->floatBits, 0x3FC00000u);
  const auto& table = std::get<VarDecl>(m.items[1]);
  EXPECT_EQ(table.byteSize(), 8u);
  ASSERT_EQ(table.init->kind, OperandKind::kVector);
  EXPECT_EQ(table.init->elements.size(), 8u);
  EXPECT_EQ(std::get<VarDecl>(m.items[2]).space, StateSpace::kConst);
  const auto& ptrs = std::get<VarDecl>(m.items[3]);
  ASSERT_EQ(ptrs.init->elements.size(), 2u);
  EXPECT_TRUE(ptrs.init->elements[1].generic);
  EXPECT_EQ(ptrs.init->elements[1].name, "g_table");
  EXPECT_EQ(ptrs.init->elements[1].value, 4);
  const auto& dyn = std::get<VarDecl>(m.items[4]);
  EXPECT_EQ(dyn.linkage, Linkage::kExtern);
  EXPECT_EQ(dyn.space, StateSpace::kShared);
  EXPECT_THAT(dyn.dims, ElementsAre(0u));
  EXPECT_EQ(dyn.byteSize(), 0u);
  EXPECT_EQ(std::get<VarDecl>(m.items[5]).linkage, Linkage::kCommon);
  EXPECT_EQ(std::get<VarDecl>(m.items[6]).name, "$str");
  EXPECT_FALSE(bias.managed);
}

// A __managed__ variable as nvcc declares it: .attribute(.managed) among the
// other qualifiers, kept by the printer.
TEST(PtxParser, ManagedVariables) {
  Module m = parseOk(R"(
.global .attribute(.managed) .align 4 .u32 counter;
.visible .global .attribute( .managed ) .align 8 .b8 table[16] = {1, 2};
)");
  ASSERT_EQ(m.items.size(), 2u);
  const auto& counter = std::get<VarDecl>(m.items[0]);
  EXPECT_TRUE(counter.managed);
  EXPECT_EQ(counter.space, StateSpace::kGlobal);
  EXPECT_EQ(counter.align, 4u);
  EXPECT_EQ(counter.type, Type::kU32);
  const auto& table = std::get<VarDecl>(m.items[1]);
  EXPECT_TRUE(table.managed);
  EXPECT_EQ(table.linkage, Linkage::kVisible);
  EXPECT_EQ(table.byteSize(), 16u);
  EXPECT_EQ(print(counter), ".global .attribute(.managed) .align 4 .u32 \tcounter");
  Result<Module> again = parseModule(print(m), "printed.ptx");
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->items, m.items);
}

TEST(PtxParser, MemoryInstructionModifiersAreDecoded) {
  Instruction ld = parseInstruction("ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd4+-256];");
  EXPECT_EQ(ld.opcode, Opcode::kLd);
  EXPECT_EQ(ld.m.space, StateSpace::kGlobal);
  EXPECT_TRUE(ld.m.has(Flag::kNc));
  EXPECT_EQ(ld.m.vectorWidth, 4);
  EXPECT_EQ(ld.m.type(), Type::kF32);
  ASSERT_EQ(ld.operands.size(), 2u);
  EXPECT_EQ(ld.operands[0].kind, OperandKind::kVector);
  EXPECT_EQ(ld.operands[0].elements.size(), 4u);
  EXPECT_EQ(ld.operands[1].kind, OperandKind::kAddress);
  EXPECT_EQ(ld.operands[1].name, "%rd4");
  EXPECT_EQ(ld.operands[1].value, -256);
  EXPECT_FALSE(ld.operands[1].addressIsSymbol);

  Instruction st = parseInstruction("st.volatile.shared.u32 [smem+8], %r1;");
  EXPECT_EQ(st.m.sem, MemSem::kVolatile);
  EXPECT_EQ(st.m.space, StateSpace::kShared);
  EXPECT_TRUE(st.operands[0].addressIsSymbol);
  EXPECT_EQ(st.operands[0].value, 8);

  Instruction atom = parseInstruction("atom.relaxed.gpu.global.cas.b32 %r2, [%rd1], %r3, %r4;");
  EXPECT_EQ(atom.m.sem, MemSem::kRelaxed);
  EXPECT_EQ(atom.m.scope, Scope::kGpu);
  EXPECT_EQ(atom.m.atomOp, AtomOp::kCas);
  EXPECT_EQ(atom.m.type(), Type::kB32);
  EXPECT_EQ(atom.operands.size(), 4u);

  Instruction red = parseInstruction("red.global.add.f32 [%rd2], %f1;");
  EXPECT_EQ(red.m.atomOp, AtomOp::kAdd);

  Instruction abs = parseInstruction("ld.param.u64 %rd1, [0];");
  EXPECT_EQ(abs.operands[1].kind, OperandKind::kAddress);
  EXPECT_TRUE(abs.operands[1].name.empty());
}

TEST(PtxParser, AmbiguousSpellingsResolveByOpcode) {
  // .lo is a comparison on setp and a flag on mul; .and is a boolean op on setp.
  Instruction setp = parseInstruction("setp.lo.and.u32 %p1|%p2, %r1, %r2, %p3;");
  EXPECT_EQ(setp.m.cmp, CmpOp::kLo);
  EXPECT_EQ(setp.m.boolOp, BoolOp::kAnd);
  ASSERT_EQ(setp.operands[0].kind, OperandKind::kPredPair);
  EXPECT_EQ(setp.operands[0].elements[1].name, "%p2");

  Instruction mul = parseInstruction("mul.lo.s32 %r1, %r2, 3;");
  EXPECT_EQ(mul.m.cmp, CmpOp::kNone);
  EXPECT_TRUE(mul.m.has(Flag::kLo));

  Instruction wide = parseInstruction("mul.wide.s32 %rd1, %r1, 4;");
  EXPECT_TRUE(wide.m.has(Flag::kWide));
  EXPECT_EQ(wide.operands[2].value, 4);

  Instruction cvt = parseInstruction("cvt.rni.f32.s32 %f1, %r1;");
  EXPECT_EQ(cvt.m.rounding, Rounding::kRni);
  EXPECT_EQ(cvt.m.type(), Type::kF32);
  EXPECT_EQ(cvt.m.lastType(), Type::kS32);

  Instruction and_ = parseInstruction("and.b32 %r1, %r2, 0xFF;");
  EXPECT_EQ(and_.opcode, Opcode::kAnd);
  EXPECT_EQ(and_.operands[2].value, 255);
}

TEST(PtxParser, GuardsSpecialRegistersAndImmediates) {
  Instruction bra = parseInstruction("@!%p1 bra.uni $L__BB0_2;");
  EXPECT_TRUE(bra.guard.present());
  EXPECT_TRUE(bra.guard.negated);
  EXPECT_EQ(bra.guard.reg, "%p1");
  EXPECT_TRUE(bra.m.has(Flag::kUni));
  EXPECT_EQ(bra.operands[0].kind, OperandKind::kSymbol);
  EXPECT_EQ(bra.operands[0].name, "$L__BB0_2");

  Instruction mov = parseInstruction("mov.u32 %r1, %ctaid.y;");
  EXPECT_EQ(mov.operands[1].name, "%ctaid");
  EXPECT_EQ(mov.operands[1].component, 'y');

  Instruction fma = parseInstruction("fma.rn.f64 %fd1, %fd2, 0d3FF0000000000000, -0d4000000000000000;");
  EXPECT_EQ(fma.operands[2].floatBits, 0x3FF0000000000000u);
  EXPECT_EQ(fma.operands[2].floatWidth, 64);
  EXPECT_EQ(fma.operands[3].floatBits, 0xC000000000000000u);

  Instruction neg = parseInstruction("add.s32 %r1, %r2, -1;");
  EXPECT_EQ(neg.operands[2].value, -1);

  Instruction shfl = parseInstruction("shfl.sync.down.b32 %r1|%p1, %r2, 16, 31, -1;");
  EXPECT_TRUE(shfl.m.has(Flag::kSync));
  EXPECT_TRUE(shfl.m.has(Flag::kDown));
  EXPECT_EQ(shfl.operands[0].kind, OperandKind::kPredPair);

  // CUB's inline assembly declares its registers without '%': `r0|p` is a pair too.
  Instruction bare = parseInstruction("shfl.sync.down.b32 r0|p, %r369, %r307, %r308, %r309;");
  ASSERT_EQ(bare.operands[0].kind, OperandKind::kPredPair);
  ASSERT_EQ(bare.operands[0].elements.size(), 2u);
  EXPECT_EQ(bare.operands[0].elements[0].kind, OperandKind::kRegister);
  EXPECT_EQ(bare.operands[0].elements[0].name, "r0");
  EXPECT_EQ(bare.operands[0].elements[1].name, "p");

  Instruction vote = parseInstruction("vote.sync.ballot.b32 %r1, %p1, -1;");
  EXPECT_TRUE(vote.m.has(Flag::kBallot));

  Instruction selp = parseInstruction("selp.b32 %r1, 1, 0, !%p2;");
  EXPECT_TRUE(selp.operands[3].negated);

  Instruction cp = parseInstruction("cp.async.ca.shared.global [%r1], [%rd1], 16;");
  EXPECT_EQ(cp.m.space, StateSpace::kShared);
  EXPECT_EQ(cp.m.space2, StateSpace::kGlobal);
  EXPECT_EQ(cp.m.cacheOp, CacheOp::kCa);
}

TEST(PtxParser, CallSequenceInANestedBlock) {
  Result<std::vector<Statement>> s = parseStatements(R"(
	{ // callseq 0, 0
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd1;
	.param .b32 retval0;
	call.uni (retval0),
	vprintf,
	(
	param0
	);
	ld.param.b32 	%r10, [retval0+0];
	} // callseq 0
)");
  ASSERT_THAT(s, IsOk());
  ASSERT_EQ(s->size(), 1u);
  const auto& block = std::get<Block>((*s)[0].value);
  ASSERT_EQ(block.statements.size(), 5u);
  EXPECT_EQ(std::get<VarDecl>(block.statements[0].value).space, StateSpace::kParam);
  const auto& call = std::get<Instruction>(block.statements[3].value);
  EXPECT_EQ(call.opcode, Opcode::kCall);
  ASSERT_EQ(call.operands.size(), 3u);
  EXPECT_EQ(call.operands[0].kind, OperandKind::kList);
  EXPECT_EQ(call.operands[0].elements[0].name, "retval0");
  EXPECT_EQ(call.operands[1].kind, OperandKind::kSymbol);
  EXPECT_EQ(call.operands[1].name, "vprintf");
  EXPECT_EQ(call.operands[2].kind, OperandKind::kList);
}

TEST(PtxParser, IndirectCallWithPrototype) {
  Result<std::vector<Statement>> s = parseStatements(R"(
prototype_0 : .callprototype (.param .b32 _) _ (.param .b64 _);
call (retval0), %rd5, (param0), prototype_0;
)");
  ASSERT_THAT(s, IsOk());
  ASSERT_EQ(s->size(), 2u);
  const auto& raw = std::get<RawDirective>((*s)[0].value);
  EXPECT_THAT(raw.text, ::testing::HasSubstr(".callprototype"));
  const auto& call = std::get<Instruction>((*s)[1].value);
  EXPECT_EQ(call.operands[1].kind, OperandKind::kRegister);
  EXPECT_EQ(call.operands[3].name, "prototype_0");
}

TEST(PtxParser, DebugDirectives) {
  Module m = parseOk(R"(
.file	1 "/src/k.cu", 1700000000, 1234
.file	2 "/usr/local/cuda/include/cuda_fp16.hpp"
.visible .entry k()
{
	.loc	1 7 3
	.loc	2 120 10, function_name $L__info_string0, inlined_at 1 7 3
$L__BB0_1:
	.pragma "nounroll";
	ret;
}
.section	.debug_str
{
$L__info_string0:
.b8 95,90,0
.b32 .debug_abbrev
.b64 $L__func_begin0+12
}
)");
  ASSERT_EQ(m.items.size(), 4u);
  const auto& f1 = std::get<FileDirective>(m.items[0]);
  EXPECT_EQ(f1.index, 1u);
  EXPECT_EQ(f1.path, "/src/k.cu");
  EXPECT_EQ(f1.timestamp, 1700000000u);
  EXPECT_EQ(f1.size, 1234u);
  EXPECT_FALSE(std::get<FileDirective>(m.items[1]).timestamp.has_value());
  const Function* k = m.findFunction("k");
  ASSERT_NE(k, nullptr);
  ASSERT_EQ(k->body.size(), 5u);
  const auto& loc = std::get<LocDirective>(k->body[1].value);
  EXPECT_EQ(loc.file, 2u);
  EXPECT_EQ(loc.line, 120u);
  ASSERT_TRUE(loc.functionName.has_value());
  EXPECT_EQ(loc.functionName->name, "$L__info_string0");
  ASSERT_TRUE(loc.inlinedAt.has_value());
  EXPECT_EQ(loc.inlinedAt->line, 7u);
  EXPECT_EQ(std::get<Label>(k->body[2].value).name, "$L__BB0_1");
  EXPECT_THAT(std::get<PragmaDirective>(k->body[3].value).values, ElementsAre("nounroll"));
  const auto& sec = std::get<SectionDirective>(m.items[3]);
  EXPECT_EQ(sec.name, ".debug_str");
  ASSERT_EQ(sec.items.size(), 4u);
  EXPECT_EQ(sec.items[0].label, "$L__info_string0");
  EXPECT_EQ(sec.items[1].type, Type::kB8);
  EXPECT_EQ(sec.items[1].values.size(), 3u);
  EXPECT_EQ(sec.items[2].values[0].name, ".debug_abbrev");
  EXPECT_EQ(sec.items[3].values[0].value, 12);
}

TEST(PtxParser, InlineAsmScopeDeclaresItsOwnRegisters) {
  Result<std::vector<Statement>> s = parseStatements(R"(
	// begin inline asm
	{
	.reg .s32 t;
	add.s32 t, %r1, 1;
	mul.lo.s32 %r2, t, 3;
	}
	// end inline asm
)");
  ASSERT_THAT(s, IsOk());
  ASSERT_EQ(s->size(), 1u);
  const auto& block = std::get<Block>((*s)[0].value);
  ASSERT_EQ(block.statements.size(), 3u);
  EXPECT_EQ(std::get<VarDecl>(block.statements[0].value).name, "t");
  EXPECT_EQ(std::get<Instruction>(block.statements[1].value).operands[0].name, "t");
}

TEST(PtxParser, CommentsAndLineNumbers) {
  Result<Module> m = parseModule(
      "// header\n.version 9.0 /* inline */\n.target sm_80\n.address_size 64\n"
      ".visible .entry k()\n{\n\t/* multi\n line */ ret;\n}\n",
      "c.ptx");
  ASSERT_THAT(m, IsOk());
  const Function* k = m->findFunction("k");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->line, 5u);
  EXPECT_EQ(std::get<Instruction>(k->body[0].value).line, 8u);
}

}  // namespace
// Texture and surface instructions: geometry modifiers that start with a
// digit after another modifier (suld.b.2d), and addresses that list the
// coordinates after the object ([tex, {x, y}]); printed back as written.
TEST(PtxParser, TextureAndSurfaceOperands) {
  Instruction tex = parseInstruction("tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd2, {%f5, %f6}];");
  EXPECT_EQ(tex.opcode, Opcode::kTex);
  EXPECT_TRUE(tex.m.has(Flag::kGeom2d));
  ASSERT_EQ(tex.operands.size(), 2u);
  const Operand& a = tex.operands[1];
  EXPECT_EQ(a.kind, OperandKind::kAddress);
  EXPECT_EQ(a.name, "%rd2");
  ASSERT_EQ(a.elements.size(), 1u);
  EXPECT_EQ(a.elements[0].kind, OperandKind::kVector);
  EXPECT_EQ(a.elements[0].elements.size(), 2u);
  EXPECT_EQ(print(tex), "tex.2d.v4.f32.f32 \t{%f1, %f2, %f3, %f4}, [%rd2, {%f5, %f6}];");
  Instruction suld =
      parseInstruction("suld.b.3d.v2.b16.zero {%rs1, %rs2}, [%rd3, {%r1, %r2, %r3, %r3}];");
  EXPECT_TRUE(suld.m.has(Flag::kB) && suld.m.has(Flag::kGeom3d) && suld.m.has(Flag::kZero));
  Instruction tld4 =
      parseInstruction("tld4.g.2d.v4.s32.f32 {%r1, %r2, %r3, %r4}, [%rd2, {%f1, %f2}];");
  EXPECT_TRUE(tld4.m.has(Flag::kG));
  Instruction txq = parseInstruction("txq.addr_mode_1.b32 %r1, [%rd2];");
  EXPECT_TRUE(txq.m.has(Flag::kAddrMode1));
  // A float literal after an operand separator is still a number.
  Instruction mov = parseInstruction("mov.f32 %f1, 0f3F000000;");
  EXPECT_EQ(mov.operands[1].kind, OperandKind::kImmFloat);
}

}  // namespace phos::ptx
