// SPDX-License-Identifier: Apache-2.0
#include "texture_sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "float_ops.h"

namespace phos::vgpu::engine::detail {
namespace {

using Channel = TextureView::Channel;
using Address = TextureView::Address;

std::uint32_t texelBits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}

// One channel: the float a float lookup returns, or the integer.
std::uint32_t channelValue(const TextureView& t, const std::uint8_t* p, bool asFloat) {
  std::uint32_t raw = 0;
  std::memcpy(&raw, p, t.channelBytes);  // little-endian, as the device's memory
  switch (t.channel) {
    case Channel::kFloat:
      return raw;
    case Channel::kHalf:
      return texelBits(static_cast<float>(f16ToDouble(static_cast<std::uint16_t>(raw))));
    case Channel::kUnsigned: {
      if (!asFloat) return raw;
      const double max = t.channelBytes == 1 ? 255.0 : 65535.0;
      return texelBits(static_cast<float>(raw / max));
    }
    case Channel::kSigned: {
      const unsigned shift = 32 - 8 * t.channelBytes;
      const std::int32_t v = static_cast<std::int32_t>(raw << shift) >> shift;
      if (!asFloat) return static_cast<std::uint32_t>(v);
      // "-128 ... maps to -1.0" as well as -127: the range is symmetric.
      const double max = t.channelBytes == 1 ? 127.0 : 32767.0;
      return texelBits(std::max(static_cast<float>(v / max), -1.0f));
    }
  }
  return raw;
}

// A texel's four components; channels the format lacks read as 0, and alpha as 1.
std::optional<TexResult> texel(const TextureView& t, std::int64_t x, std::int64_t y, std::int64_t z,
                               bool asFloat, const TexelReader& read) {
  const std::uint64_t bytes = t.texelBytes();
  const std::uint64_t address = t.address + static_cast<std::uint64_t>(z) * t.slicePitch +
                                static_cast<std::uint64_t>(y) * t.pitch +
                                static_cast<std::uint64_t>(x) * bytes;
  std::uint8_t raw[16] = {};
  if (!read(address, static_cast<unsigned>(bytes), raw)) return std::nullopt;
  TexResult r{0, 0, 0, asFloat ? texelBits(1.0f) : 1u};
  for (unsigned c = 0; c < t.channels; ++c) {
    r[c] = channelValue(t, raw + c * t.channelBytes, asFloat);
  }
  return r;
}

TexResult border(const TextureView& t, bool asFloat) {
  TexResult r{};
  for (std::size_t c = 0; c < 4; ++c) {
    r[c] = asFloat ? texelBits(t.borderColor[c])
                   : static_cast<std::uint32_t>(static_cast<std::int32_t>(t.borderColor[c]));
  }
  return r;
}

// The index `i` of a dimension of `n` texels under `mode`; nullopt: outside,
// in border mode. Wrap and mirror need normalized coordinates; without them
// they clamp.
std::optional<std::int64_t> addressed(std::int64_t i, std::int64_t n, Address mode,
                                      bool normalized) {
  if (!normalized && (mode == Address::kWrap || mode == Address::kMirror)) mode = Address::kClamp;
  switch (mode) {
    case Address::kWrap:
      return ((i % n) + n) % n;
    case Address::kMirror: {
      const std::int64_t m = ((i % (2 * n)) + 2 * n) % (2 * n);
      return m < n ? m : 2 * n - 1 - m;
    }
    case Address::kClamp:
      return std::clamp<std::int64_t>(i, 0, n - 1);
    case Address::kBorder:
      return i >= 0 && i < n ? std::optional<std::int64_t>(i) : std::nullopt;
  }
  return std::nullopt;
}

// floor() as an index, NaN and huge values pinned far outside any texture.
std::int64_t floorIndex(double x) {
  const double f = std::floor(x);
  if (!(f > -1e15)) return -1'000'000'000'000'000;
  if (f > 1e15) return 1'000'000'000'000'000;
  return static_cast<std::int64_t>(f);
}

std::array<std::int64_t, 3> sizes(const TextureView& t) {
  return {static_cast<std::int64_t>(t.width), static_cast<std::int64_t>(t.height),
          static_cast<std::int64_t>(t.depth)};
}

// Texel (x, y, z) of the texture's dimensions after addressing, or the border.
std::optional<TexResult> addressedTexel(const TextureView& t, std::array<std::int64_t, 3> index,
                                        bool asFloat, const TexelReader& read) {
  const auto n = sizes(t);
  for (int d = 0; d < 3; ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (d >= t.dimensions) {
      index[i] = 0;
      continue;
    }
    auto a = addressed(index[i], n[i], t.addressMode[i], t.normalizedCoordinates);
    if (!a) return border(t, asFloat);
    index[i] = *a;
  }
  return texel(t, index[0], index[1], index[2], asFloat, read);
}

// The unnormalized coordinate of dimension d.
double unnormalized(const TextureView& t, const TexCoords& c, int d) {
  const auto i = static_cast<std::size_t>(d);
  if (d >= c.dimensions) return 0.0;
  const double x = c.f[i];
  return t.normalizedCoordinates ? x * static_cast<double>(sizes(t)[i]) : x;
}

// Linear filtering weights are 9-bit fixed point with 8 fractional bits, a
// fraction halfway between two rounded up (as an H200 does: tests/gpu/texture_weights.cu).
float weight(double fraction) {
  return static_cast<float>(std::floor(fraction * 256.0 + 0.5) / 256.0);
}

}  // namespace

bool returnsFloat(const TextureView& t) {
  return t.channel == Channel::kFloat || t.channel == Channel::kHalf ||
         (t.channelBytes < 4 && !t.readAsInteger);
}

std::optional<TexResult> sampleTexture(const TextureView& t, const TexCoords& c,
                                       const TexelReader& read) {
  const bool asFloat = returnsFloat(t);
  if (t.linearResource) {
    // tex1Dfetch: an integer index; outside the buffer, zeros.
    const std::int64_t i = c.integer ? c.i[0] : floorIndex(c.f[0]);
    if (i < 0 || static_cast<std::uint64_t>(i) >= t.width) return TexResult{0, 0, 0, 0};
    return texel(t, i, 0, 0, asFloat, read);
  }
  if (c.integer || !t.linearFilter || !asFloat) {
    std::array<std::int64_t, 3> index{0, 0, 0};
    for (int d = 0; d < c.dimensions && d < 3; ++d) {
      const auto i = static_cast<std::size_t>(d);
      index[i] = c.integer ? c.i[i] : floorIndex(unnormalized(t, c, d));
    }
    return addressedTexel(t, index, asFloat, read);
  }
  // Linear: the 2, 4 or 8 texels around x - 0.5, weighted by the fractions.
  // (A lookup of fewer dimensions than the texture has reads its first row or slice.)
  const int dims = std::min({t.dimensions, c.dimensions, 3});
  std::array<std::int64_t, 3> base{0, 0, 0};
  std::array<float, 3> alpha{0, 0, 0};
  for (int d = 0; d < dims; ++d) {
    const auto i = static_cast<std::size_t>(d);
    const double xb = unnormalized(t, c, d) - 0.5;
    base[i] = floorIndex(xb);
    alpha[i] = weight(xb - std::floor(xb));
  }
  std::array<float, 4> sum{0, 0, 0, 0};
  for (unsigned corner = 0; corner < (1u << dims); ++corner) {
    float w = 1.0f;
    std::array<std::int64_t, 3> index = base;
    for (int d = 0; d < dims; ++d) {
      const auto i = static_cast<std::size_t>(d);
      const bool upper = (corner >> d) & 1u;
      index[i] += upper ? 1 : 0;
      w *= upper ? alpha[i] : 1.0f - alpha[i];
    }
    auto v = addressedTexel(t, index, true, read);
    if (!v) return std::nullopt;
    for (std::size_t k = 0; k < 4; ++k) sum[k] += w * std::bit_cast<float>((*v)[k]);
  }
  return TexResult{texelBits(sum[0]), texelBits(sum[1]), texelBits(sum[2]), texelBits(sum[3])};
}

std::optional<TexResult> gatherTexture(const TextureView& t, float u, float v, int component,
                                       const TexelReader& read) {
  const bool asFloat = returnsFloat(t);
  TexCoords c;
  c.f = {u, v, 0};
  c.dimensions = 2;
  const std::int64_t i = floorIndex(unnormalized(t, c, 0) - 0.5);
  const std::int64_t j = floorIndex(unnormalized(t, c, 1) - 0.5);
  const std::array<std::array<std::int64_t, 2>, 4> corners{
      {{i, j + 1}, {i + 1, j + 1}, {i + 1, j}, {i, j}}};
  TexResult r{};
  for (std::size_t k = 0; k < 4; ++k) {
    auto texelValue = addressedTexel(t, {corners[k][0], corners[k][1], 0}, asFloat, read);
    if (!texelValue) return std::nullopt;
    r[k] = (*texelValue)[static_cast<std::size_t>(component & 3)];
  }
  return r;
}

}  // namespace phos::vgpu::engine::detail
