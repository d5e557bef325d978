// SPDX-License-Identifier: Apache-2.0
// Tensor maps (TMA descriptors) on vgpu: cuTensorMapEncodeTiled,
// cuTensorMapEncodeIm2col and cuTensorMapEncodeIm2colWide check their
// parameters against every rule of the Driver API reference and encode
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
  enum Kind : std::uint8_t { kTiled = 0, kIm2col = 1, kIm2colWide = 2 };
  std::uint16_t magic = kMagic;
  std::uint8_t dataType = 0, rank = 0, interleave = 0, swizzle = 0, l2Promotion = 0, oobFill = 0;
  std::uint8_t kind = kTiled, wideMode = 0;
  std::uint8_t elementStrides[5] = {};
  std::uint8_t reserved0 = 0;
  std::uint64_t address = 0;
  std::uint64_t globalDim[5] = {};
  std::uint64_t globalStrides[4] = {};  // bytes, of dimensions 1 to rank - 1
  std::uint16_t boxDim[5] = {};         // tiled
  // im2col: the channels and pixels a load reaches, and the offsets of the
  // bounding box's corners in the spatial dimensions (W only for the wide form).
  std::uint16_t channelsPerPixel = 0, pixelsPerColumn = 0;
  std::int16_t lowerCorner[3] = {}, upperCorner[3] = {};
  std::uint8_t reserved1[6] = {};
};
static_assert(sizeof(TensorMapLayout) == sizeof(CUtensorMap));

// What every form shares: the tensor in memory and the load's steps.
struct TensorMapCommon {
  CUtensorMapDataType dataType{};
  std::uint32_t rank = 0;
  std::uint64_t address = 0;
  const std::uint64_t* globalDim = nullptr;
  const std::uint64_t* globalStrides = nullptr;
  const std::uint32_t* elementStrides = nullptr;
  CUtensorMapInterleave interleave{};
  CUtensorMapSwizzle swizzle{};
  CUtensorMapL2promotion l2Promotion{};
  CUtensorMapFloatOOBfill oobFill{};
};

struct TiledTensorMap : TensorMapCommon {
  const std::uint32_t* boxDim = nullptr;
};

struct Im2colTensorMap : TensorMapCommon {
  const int* pixelBoxLowerCorner = nullptr;  // rank - 2 offsets
  const int* pixelBoxUpperCorner = nullptr;
  std::uint32_t channelsPerPixel = 0, pixelsPerColumn = 0;
};

struct Im2colWideTensorMap : TensorMapCommon {
  int pixelBoxLowerCornerWidth = 0, pixelBoxUpperCornerWidth = 0;
  std::uint32_t channelsPerPixel = 0, pixelsPerColumn = 0;
  CUtensorMapIm2ColWideMode mode{};
};

// The descriptor of `map`, or CUDA_ERROR_INVALID_VALUE naming the rule it breaks.
Result<CUtensorMap> encodeTiled(const TiledTensorMap& map);
Result<CUtensorMap> encodeIm2col(const Im2colTensorMap& map);
Result<CUtensorMap> encodeIm2colWide(const Im2colWideTensorMap& map);
// `map` (vgpu's) with its global address replaced, or INVALID_VALUE.
Status replaceAddress(CUtensorMap& map, std::uint64_t address);

}  // namespace phos::vgpu
