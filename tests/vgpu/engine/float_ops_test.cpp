// SPDX-License-Identifier: Apache-2.0
// Half/bfloat16 encoding with every rounding mode, and the f32 result rules.
#include "float_ops.h"

#include <gtest/gtest.h>

namespace phos::vgpu::engine::detail {
namespace {

using ptx::Rounding;

TEST(FloatOps, HalfExactValues) {
  EXPECT_EQ(doubleToF16(1.0, Rounding::kRn), 0x3c00);
  EXPECT_EQ(doubleToF16(-2.0, Rounding::kRn), 0xc000);
  EXPECT_EQ(doubleToF16(65504.0, Rounding::kRn), 0x7bff);
  EXPECT_EQ(doubleToF16(0x1p-24, Rounding::kRn), 0x0001);  // smallest subnormal
  EXPECT_EQ(doubleToF16(0x1p-14, Rounding::kRn), 0x0400);  // smallest normal
  EXPECT_EQ(doubleToF16(-0.0, Rounding::kRn), 0x8000);
  EXPECT_EQ(doubleToF16(INFINITY, Rounding::kRn), 0x7c00);
  EXPECT_EQ(doubleToF16(NAN, Rounding::kRn), 0x7fff);
}

TEST(FloatOps, HalfRoundingModes) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  double half = 1.0 + 0x1p-11;
  EXPECT_EQ(doubleToF16(half, Rounding::kRn), 0x3c00);  // ties to even
  EXPECT_EQ(doubleToF16(half, Rounding::kRna), 0x3c01);  // ties away
  EXPECT_EQ(doubleToF16(half, Rounding::kRz), 0x3c00);
  EXPECT_EQ(doubleToF16(half, Rounding::kRp), 0x3c01);
  EXPECT_EQ(doubleToF16(-half, Rounding::kRm), 0xbc01);
  EXPECT_EQ(doubleToF16(-half, Rounding::kRp), 0xbc00);
  // 1 + 3 * 2^-11 ties to the even 1 + 2^-9.
  EXPECT_EQ(doubleToF16(1.0 + 3 * 0x1p-11, Rounding::kRn), 0x3c02);
  // Overflow: rn to infinity, rz to the largest finite.
  EXPECT_EQ(doubleToF16(70000.0, Rounding::kRn), 0x7c00);
  EXPECT_EQ(doubleToF16(70000.0, Rounding::kRz), 0x7bff);
  EXPECT_EQ(doubleToF16(-70000.0, Rounding::kRp), 0xfbff);
  EXPECT_EQ(doubleToF16(-70000.0, Rounding::kRm), 0xfc00);
  EXPECT_EQ(doubleToF16(70000.0, Rounding::kRn, /*satfinite=*/true), 0x7bff);
  // Subnormal rounding: 1.5 * 2^-24 ties to even (2 * 2^-24).
  EXPECT_EQ(doubleToF16(1.5 * 0x1p-24, Rounding::kRn), 0x0002);
  EXPECT_EQ(doubleToF16(0x1p-26, Rounding::kRn), 0x0000);
  EXPECT_EQ(doubleToF16(0x1p-26, Rounding::kRp), 0x0001);
}

TEST(FloatOps, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint32_t exp = (h >> 10) & 0x1f;
    if (exp == 0x1f && (h & 0x3ff)) continue;  // NaN
    EXPECT_EQ(doubleToF16(f16ToDouble(static_cast<uint16_t>(h)), Rounding::kRn), h) << h;
  }
}

TEST(FloatOps, BFloat16) {
  EXPECT_EQ(doubleToBF16(1.0, Rounding::kRn), 0x3f80);
  EXPECT_EQ(doubleToBF16(1.0 + 0x1p-8, Rounding::kRn), 0x3f80);  // tie to even
  EXPECT_EQ(doubleToBF16(1.0 + 3 * 0x1p-8, Rounding::kRn), 0x3f82);
  EXPECT_EQ(doubleToBF16(1.0 + 0x1p-8, Rounding::kRp), 0x3f81);
  EXPECT_EQ(doubleToBF16(3.0e38, Rounding::kRn), 0x7f62);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint32_t exp = (h >> 7) & 0xff;
    if (exp == 0xff && (h & 0x7f)) continue;
    EXPECT_EQ(doubleToBF16(bf16ToDouble(static_cast<uint16_t>(h)), Rounding::kRn), h) << h;
  }
}

TEST(FloatOps, F32ResultRules) {
  EXPECT_EQ(finishF32(NAN, false, false), kCanonicalNanF32);
  EXPECT_EQ(finishF32(NAN, false, true), 0u);  // .sat turns NaN into +0
  EXPECT_EQ(finishF32(1e-40f, true, false), 0u);
  EXPECT_EQ(finishF32(-1e-40f, true, false), 0x80000000u);
  EXPECT_EQ(finishF32(1e-40f, false, false), bitsOf(1e-40f));
  EXPECT_EQ(finishF32(-0.0f, false, true), 0u);
  EXPECT_EQ(finishF32(2.5f, false, true), bitsOf(1.0f));
}

TEST(FloatOps, RoundingScopeDirectsHostArithmetic) {
  volatile float a = 1.0f, b = 0x1p-30f;
  {
    RoundingScope up(Rounding::kRp);
    EXPECT_EQ(a + b, std::nextafter(1.0f, 2.0f));
  }
  EXPECT_EQ(a + b, 1.0f);
}

}  // namespace
}  // namespace phos::vgpu::engine::detail
