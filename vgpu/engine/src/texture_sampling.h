// SPDX-License-Identifier: Apache-2.0
// What tex, tld4 and suld/sust compute from a texture or surface object
// (TextureView): texel addressing, format conversion, addressing modes and
// filtering, as the CUDA programming guide's "Texture Fetching" appendix and
// the PTX ISA describe them. docs/vgpu.md lists the forms vgpu runs.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>

#include "phos/vgpu/program.h"

namespace phos::vgpu::engine::detail {

// Four 32-bit results, as tex writes them to its destination registers.
using TexResult = std::array<std::uint32_t, 4>;

// Reads `bytes` of texel memory at an absolute address; false if the memory
// is not the context's (the launch then faults).
using TexelReader = std::function<bool(std::uint64_t address, unsigned bytes, void* out)>;

// Coordinates of one lookup: floats (scaled by the size when the texture
// normalizes coordinates) or integer texel indices.
struct TexCoords {
  std::array<float, 3> f{0, 0, 0};
  std::array<std::int32_t, 3> i{0, 0, 0};
  bool integer = false;
  int dimensions = 1;
};

// tex: the filtered lookup; nullopt where a texel could not be read.
std::optional<TexResult> sampleTexture(const TextureView& t, const TexCoords& c,
                                       const TexelReader& read);

// tld4: `component` (0..3: r, g, b, a) of the four texels bilinear filtering
// at (u, v) would use, in the order (i, j+1), (i+1, j+1), (i+1, j), (i, j).
std::optional<TexResult> gatherTexture(const TextureView& t, float u, float v, int component,
                                       const TexelReader& read);

// Whether the texture's lookups return floats (float formats, and 8- and
// 16-bit integers read as normalized floats) rather than integers.
bool returnsFloat(const TextureView& t);

}  // namespace phos::vgpu::engine::detail
