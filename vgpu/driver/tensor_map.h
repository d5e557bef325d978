// SPDX-License-Identifier: Apache-2.0
// Tensor maps (TMA descriptors) on vgpu: cuTensorMapEncodeTiled checks its
// parameters against every rule of the Driver API reference and encodes
// them into the 128 opaque bytes of a CUtensorMap in vgpu's own layout
// (TensorMapLayout); cuTensorMapReplaceAddress changes the address of one.
// A GPU's layout is its own too: programs only pass the bytes to kernels
// (a __grid_constant__ parameter) and to these calls.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "phos/common/status.h"

namespace phos::vgpu {

// What vgpu keeps in a CUtensorMap's 128 bytes.
struct TensorMapLayout {
  static constexpr std::uint16_t kMagic = 0x7476;  // "vt"
  std::uint16_t magic = kMagic;
  std::uint8_t dataType = 0, rank = 0, interleave = 0, swizzle = 0, l2Promotion = 0, oobFill = 0;
  std::uint64_t address = 0;
  std::uint64_t globalDim[5] = {};
  std::uint64_t globalStrides[4] = {};  // bytes, of dimensions 1 to rank - 1
  std::uint32_t boxDim[5] = {};
  std::uint32_t elementStrides[5] = {};
};
static_assert(sizeof(TensorMapLayout) == sizeof(CUtensorMap));

struct TiledTensorMap {
  CUtensorMapDataType dataType{};
  std::uint32_t rank = 0;
  std::uint64_t address = 0;
  const std::uint64_t* globalDim = nullptr;
  const std::uint64_t* globalStrides = nullptr;
  const std::uint32_t* boxDim = nullptr;
  const std::uint32_t* elementStrides = nullptr;
  CUtensorMapInterleave interleave{};
  CUtensorMapSwizzle swizzle{};
  CUtensorMapL2promotion l2Promotion{};
  CUtensorMapFloatOOBfill oobFill{};
};

// The descriptor of `map`, or CUDA_ERROR_INVALID_VALUE naming the rule it breaks.
Result<CUtensorMap> encodeTiled(const TiledTensorMap& map);
// `map` (vgpu's) with its global address replaced, or INVALID_VALUE.
Status replaceAddress(CUtensorMap& map, std::uint64_t address);

}  // namespace phos::vgpu
