// SPDX-License-Identifier: Apache-2.0
// Bit-exact PTX floating-point helpers: rounding modes, flush-to-zero, canonical
// NaNs, saturation and the half/bfloat16 formats.
#pragma once

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "phos/ptx/ast.h"

namespace phos::vgpu::engine::detail {

inline float asF32(uint64_t bits) {
  uint32_t b = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline double asF64(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}
inline uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline uint64_t bitsOf(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

// GPUs produce a single canonical quiet NaN for single precision.
inline constexpr uint32_t kCanonicalNanF32 = 0x7fffffffu;
inline constexpr uint16_t kCanonicalNanF16 = 0x7fffu;
inline constexpr uint16_t kCanonicalNanBF16 = 0x7fffu;

// .ftz: subnormal inputs and results become zero of the same sign.
inline float flushF32(float f) {
  return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f;
}

// The result of an f32 arithmetic operation as the register receives it.
inline uint64_t finishF32(float f, bool ftz, bool sat) {
  if (std::isnan(f)) return sat ? 0 : kCanonicalNanF32;
  if (ftz) f = flushF32(f);
  if (sat) {
    if (f < 0.0f || (f == 0.0f && std::signbit(f))) f = 0.0f;
    if (f > 1.0f) f = 1.0f;
  }
  return bitsOf(f);
}
inline uint64_t finishF64(double d, bool sat) {
  if (sat) {
    if (std::isnan(d)) return 0;
    if (d < 0.0 || (d == 0.0 && std::signbit(d))) d = 0.0;
    if (d > 1.0) d = 1.0;
  }
  return bitsOf(d);
}

inline int feMode(ptx::Rounding r) {
  switch (r) {
    case ptx::Rounding::kRz: case ptx::Rounding::kRzi: return FE_TOWARDZERO;
    case ptx::Rounding::kRm: case ptx::Rounding::kRmi: return FE_DOWNWARD;
    case ptx::Rounding::kRp: case ptx::Rounding::kRpi: return FE_UPWARD;
    default: return FE_TONEAREST;
  }
}

// Sets the host rounding mode for the scope of one instruction.
class RoundingScope {
 public:
  explicit RoundingScope(ptx::Rounding r) : mode_(feMode(r)) {
    if (mode_ != FE_TONEAREST) std::fesetround(mode_);
  }
  ~RoundingScope() {
    if (mode_ != FE_TONEAREST) std::fesetround(FE_TONEAREST);
  }
  RoundingScope(const RoundingScope&) = delete;
  RoundingScope& operator=(const RoundingScope&) = delete;

 private:
  int mode_;
};

// Rounds x to an integral value with the given integer rounding (rni, rzi, rmi, rpi).
inline double roundIntegral(double x, ptx::Rounding r) {
  switch (r) {
    case ptx::Rounding::kRzi: case ptx::Rounding::kRz: return std::trunc(x);
    case ptx::Rounding::kRmi: case ptx::Rounding::kRm: return std::floor(x);
    case ptx::Rounding::kRpi: case ptx::Rounding::kRp: return std::ceil(x);
    default: return std::nearbyint(x);  // round to nearest even in FE_TONEAREST
  }
}

// Encodes x into a binary format with `mantBits` fraction bits and `expBits`
// exponent bits (f16: 10/5, bf16: 7/8), rounding as `r` says. x must not be NaN.
inline uint32_t encodeSmallFloat(double x, int mantBits, int expBits, ptx::Rounding r,
                                 bool satfinite) {
  const int bias = (1 << (expBits - 1)) - 1;
  const uint32_t sign = std::signbit(x) ? 1u << (mantBits + expBits) : 0;
  const uint32_t infBits = ((1u << expBits) - 1) << mantBits;
  const uint32_t maxBits = infBits - 1;  // largest finite
  double a = std::fabs(x);
  if (std::isinf(a)) return sign | (satfinite ? maxBits : infBits);
  if (a == 0.0) return sign;
  int e = std::ilogb(a);
  const int minNormal = 1 - bias;
  if (e < minNormal) e = minNormal;
  double quantum = std::ldexp(1.0, e - mantBits);
  double m = a / quantum;  // exact: scaling by a power of two
  bool negative = sign != 0;
  double rounded;
  switch (r) {
    case ptx::Rounding::kRz: rounded = std::trunc(m); break;
    case ptx::Rounding::kRm: rounded = negative ? std::ceil(m) : std::floor(m); break;
    case ptx::Rounding::kRp: rounded = negative ? std::floor(m) : std::ceil(m); break;
    case ptx::Rounding::kRna: rounded = std::round(m); break;
    default: {
      double f = std::floor(m);
      double diff = m - f;
      rounded = diff > 0.5 ? f + 1 : diff < 0.5 ? f : (std::fmod(f, 2.0) == 0 ? f : f + 1);
    }
  }
  double value = rounded * quantum;
  double maxValue = std::ldexp(2.0 - std::ldexp(1.0, -mantBits), bias);
  if (value > maxValue) {
    bool toInf = !satfinite;
    if (r == ptx::Rounding::kRz) toInf = false;
    if (r == ptx::Rounding::kRm && !negative) toInf = false;
    if (r == ptx::Rounding::kRp && negative) toInf = false;
    return sign | (toInf ? infBits : maxBits);
  }
  if (value == 0.0) return sign;
  int ve = std::ilogb(value);
  if (ve < minNormal) {
    return sign | static_cast<uint32_t>(value / std::ldexp(1.0, minNormal - mantBits));
  }
  uint32_t frac = static_cast<uint32_t>(value / std::ldexp(1.0, ve - mantBits)) -
                  (1u << mantBits);
  return sign | (static_cast<uint32_t>(ve + bias) << mantBits) | frac;
}

inline double decodeSmallFloat(uint32_t bits, int mantBits, int expBits) {
  const int bias = (1 << (expBits - 1)) - 1;
  bool negative = (bits >> (mantBits + expBits)) & 1;
  uint32_t exp = (bits >> mantBits) & ((1u << expBits) - 1);
  uint32_t frac = bits & ((1u << mantBits) - 1);
  double v;
  if (exp == (1u << expBits) - 1) {
    v = frac ? std::nan("") : INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(frac), 1 - bias - mantBits);
  } else {
    v = std::ldexp(static_cast<double>(frac | (1u << mantBits)),
                   static_cast<int>(exp) - bias - mantBits);
  }
  return negative ? -v : v;
}

inline double f16ToDouble(uint16_t h) { return decodeSmallFloat(h, 10, 5); }
inline double bf16ToDouble(uint16_t h) { return decodeSmallFloat(h, 7, 8); }
inline uint16_t doubleToF16(double x, ptx::Rounding r, bool satfinite = false) {
  if (std::isnan(x)) return kCanonicalNanF16;
  return static_cast<uint16_t>(encodeSmallFloat(x, 10, 5, r, satfinite));
}
inline uint16_t doubleToBF16(double x, ptx::Rounding r, bool satfinite = false) {
  if (std::isnan(x)) return kCanonicalNanBF16;
  return static_cast<uint16_t>(encodeSmallFloat(x, 7, 8, r, satfinite));
}

// fp8 (PTX .e4m3 and .e5m2, in .e4m3x2/.e5m2x2 pairs). E5M2 is IEEE-like
// (bias 15, infinities, NaNs); E4M3 (bias 7) has no infinities: its largest
// finite value is 448 (0x7e) and S.1111.111 is NaN. Conversions to them round
// to nearest even and saturate to the largest finite value (PTX requires
// .rn.satfinite); a NaN keeps its sign as in cuda_fp8.hpp's emulation.
inline constexpr uint8_t kE4M3NaN = 0x7f;
inline constexpr uint8_t kE5M2NaN = 0x7f;
inline uint8_t doubleToE5M2(double x) {
  if (std::isnan(x)) return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | kE5M2NaN);
  return static_cast<uint8_t>(encodeSmallFloat(x, 2, 5, ptx::Rounding::kRn, true));
}
inline uint8_t doubleToE4M3(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | kE4M3NaN;
  const double a = std::fabs(x);
  // Above 448 everything rounds to 448 or beyond it, which saturates to 448.
  if (a >= 448.0) return sign | 0x7e;
  if (a == 0.0) return sign;
  constexpr int kMantBits = 3, kMinNormal = -6;
  const int e = std::max(std::ilogb(a), kMinNormal);
  const double quantum = std::ldexp(1.0, e - kMantBits);
  const double m = a / quantum;  // exact: scaling by a power of two
  const double f = std::floor(m), diff = m - f;
  const double value = (diff > 0.5 || (diff == 0.5 && std::fmod(f, 2.0) != 0) ? f + 1 : f) * quantum;
  if (value == 0.0) return sign;
  const int ve = std::ilogb(value);
  if (ve < kMinNormal) return sign | static_cast<uint8_t>(value / std::ldexp(1.0, kMinNormal - kMantBits));
  const auto frac = static_cast<uint32_t>(value / std::ldexp(1.0, ve - kMantBits)) - (1u << kMantBits);
  return sign | static_cast<uint8_t>((static_cast<uint32_t>(ve + 7) << kMantBits) | frac);
}
// Every fp8 value is exact in f16; NaN becomes f16's canonical NaN.
inline uint16_t e5m2ToF16(uint8_t b) {
  const uint16_t h = static_cast<uint16_t>(b << 8);
  return (h & 0x7fffu) > 0x7c00u ? kCanonicalNanF16 : h;
}
inline double e4m3ToDouble(uint8_t b) {
  if ((b & 0x7fu) == kE4M3NaN) return std::nan("");
  const uint32_t exp = (b >> 3) & 0xfu, frac = b & 0x7u;
  const double v = exp == 0 ? std::ldexp(static_cast<double>(frac), -9)
                            : std::ldexp(static_cast<double>(frac | 8u), static_cast<int>(exp) - 10);
  return (b & 0x80u) ? -v : v;
}
inline uint16_t e4m3ToF16(uint8_t b) { return doubleToF16(e4m3ToDouble(b), ptx::Rounding::kRn); }

}  // namespace phos::vgpu::engine::detail
