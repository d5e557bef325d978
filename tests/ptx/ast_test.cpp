// SPDX-License-Identifier: Apache-2.0
// Tests of the AST helpers: enum spellings, type sizes, modifier decoding, builders.
#include <gtest/gtest.h>

#include "phos/ptx/ast.h"
#include "phos/ptx/printer.h"

namespace phos::ptx {
namespace {

TEST(PtxAst, EnumSpellings) {
  EXPECT_EQ(name(Opcode::kAdd), "add");
  EXPECT_EQ(name(Opcode::kLdmatrix), "ldmatrix");
  EXPECT_EQ(name(Type::kF16x2), "f16x2");
  EXPECT_EQ(name(Type::kBF16), "bf16");
  EXPECT_EQ(name(StateSpace::kSharedCta), "shared::cta");
  EXPECT_EQ(name(Rounding::kRni), "rni");
  EXPECT_EQ(name(CmpOp::kGeu), "geu");
  EXPECT_EQ(name(AtomOp::kCas), "cas");
  EXPECT_EQ(name(CacheOp::kCg), "cg");
  EXPECT_EQ(name(Flag::kL2CacheHint), "L2::cache_hint");
  EXPECT_EQ(name(Type::kNone), "");
  EXPECT_EQ(modName(Mod::vector(4)), "v4");
}

TEST(PtxAst, TypeSizes) {
  EXPECT_EQ(typeSize(Type::kB8), 1u);
  EXPECT_EQ(typeSize(Type::kPred), 1u);
  EXPECT_EQ(typeSize(Type::kF16), 2u);
  EXPECT_EQ(typeSize(Type::kBF16x2), 4u);
  EXPECT_EQ(typeSize(Type::kF64), 8u);
  EXPECT_EQ(typeSize(Type::kB128), 16u);
  EXPECT_TRUE(isFloatType(Type::kF16x2));
  EXPECT_FALSE(isFloatType(Type::kU32));
  EXPECT_TRUE(isSignedType(Type::kS64));
  EXPECT_TRUE(isBitType(Type::kB32));
}

TEST(PtxAst, DecodesModifiersInOrder) {
  Modifiers m = decodeModifiers(
      Opcode::kLd, {Mod::of(StateSpace::kGlobal), Mod::of(Flag::kNc), Mod::vector(4),
                    Mod::of(Type::kF32)});
  EXPECT_EQ(m.space, StateSpace::kGlobal);
  EXPECT_TRUE(m.has(Flag::kNc));
  EXPECT_FALSE(m.has(Flag::kSat));
  EXPECT_EQ(m.vectorWidth, 4);
  EXPECT_EQ(m.type(), Type::kF32);

  Modifiers cvt = decodeModifiers(
      Opcode::kCvt, {Mod::of(Rounding::kRn), Mod::of(Type::kF32), Mod::of(Type::kS32)});
  EXPECT_EQ(cvt.rounding, Rounding::kRn);
  EXPECT_EQ(cvt.type(), Type::kF32);
  EXPECT_EQ(cvt.lastType(), Type::kS32);
  EXPECT_EQ(cvt.typeCount, 2);

  Modifiers cp = decodeModifiers(
      Opcode::kCp, {Mod::of(Flag::kAsync), Mod::of(CacheOp::kCa),
                    Mod::of(StateSpace::kShared), Mod::of(StateSpace::kGlobal)});
  EXPECT_EQ(cp.space, StateSpace::kShared);
  EXPECT_EQ(cp.space2, StateSpace::kGlobal);
}

TEST(PtxAst, BuiltInstructionPrints) {
  Instruction st = makeInstruction(
      Opcode::kSt, {Mod::of(StateSpace::kGlobal), Mod::of(Type::kU32)},
      {Operand::addrReg("%rd4", -256), Operand::reg("%r1")}, Guard{"%p1", true});
  EXPECT_EQ(st.m.space, StateSpace::kGlobal);
  EXPECT_EQ(print(st), "@!%p1 st.global.u32 \t[%rd4+-256], %r1;");

  Instruction mov = makeInstruction(Opcode::kMov, {Mod::of(Type::kU32)},
                                    {Operand::reg("%r2"), Operand::reg("%tid", 'x')});
  EXPECT_EQ(print(mov), "mov.u32 \t%r2, %tid.x;");
  Instruction fmul = makeInstruction(Opcode::kMul, {Mod::of(Type::kF32)},
                                     {Operand::reg("%f1"), Operand::reg("%f2"),
                                      Operand::f32(0x3F800000)});
  EXPECT_EQ(print(fmul), "mul.f32 \t%f1, %f2, 0f3F800000;");
}

TEST(PtxAst, VarDeclByteSize) {
  VarDecl d;
  d.space = StateSpace::kShared;
  d.type = Type::kF32;
  d.dims = {16, 17};
  EXPECT_EQ(d.byteSize(), 16u * 17u * 4u);
  d.vectorWidth = 2;
  EXPECT_EQ(d.byteSize(), 16u * 17u * 8u);
  d.dims = {0};
  EXPECT_EQ(d.byteSize(), 0u);
}

TEST(PtxAst, EqualityIgnoresSourceLines) {
  Instruction a = makeInstruction(Opcode::kRet, {}, {});
  Instruction b = a;
  b.line = 42;
  EXPECT_TRUE(a == b);
  b.mods.push_back(Mod::of(Flag::kUni));
  EXPECT_FALSE(a == b);
}

}  // namespace
}  // namespace phos::ptx
