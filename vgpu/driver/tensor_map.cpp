// SPDX-License-Identifier: Apache-2.0
// The rules are the Driver API reference's, for cuTensorMapEncodeTiled,
// cuTensorMapEncodeIm2col and cuTensorMapEncodeIm2colWide.
#include "tensor_map.h"

#include <bit>

#include "cu_status.h"

namespace phos::vgpu {
namespace {

// Bits of one element in memory (the packed types: the bits of a value with
// its share of the gaps of the 16-byte aligned forms).
std::uint32_t elementBits(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
      return 8;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
      return 16;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
      return 64;
    case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B:
      return 4;
    case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B:
    case CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B:
      return 8;
    default:
      return 32;
  }
}

bool packed16B(CUtensorMapDataType t) {
  return t == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B || t == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B;
}

bool floatingPoint(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
      return true;
    default:
      return false;
  }
}

// "globalAddress ... must be 16 byte aligned", 32 for a 32-byte interleave
// and the 16-byte aligned packed types.
std::uint64_t addressAlignment(CUtensorMapDataType t, CUtensorMapInterleave interleave) {
  return interleave == CU_TENSOR_MAP_INTERLEAVE_32B || packed16B(t) ? 32 : 16;
}

Status checkAddress(std::uint64_t address, CUtensorMapDataType t,
                    CUtensorMapInterleave interleave) {
  if (address == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "globalAddress is null");
  const std::uint64_t align = addressAlignment(t, interleave);
  if (address % align != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "globalAddress 0x{:x} is not {}-byte aligned",
                    address, align);
  }
  return Status::ok();
}

// The inner dimension of a box (bytes of one row in shared memory) against
// the swizzle's span: "must be less than or equal to the swizzle size".
Status checkSwizzleSpan(const TensorMapCommon& m, std::uint64_t innerElements) {
  if (m.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || m.swizzle == CU_TENSOR_MAP_SWIZZLE_NONE) {
    return Status::ok();
  }
  const std::uint64_t inner = innerElements * elementBits(m.dataType) / 8;
  const std::uint64_t span = m.swizzle == CU_TENSOR_MAP_SWIZZLE_32B   ? 32
                             : m.swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                                                                      : 128;
  if (inner > span) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "the box's inner dimension ({} bytes) exceeds the swizzle's {}", inner, span);
  }
  return Status::ok();
}

// The rules every form shares: enums, rank (`minRank` to 5), address,
// dimensions, strides, element strides, interleave and swizzle, fill.
Status checkCommon(const TensorMapCommon& m, std::uint32_t minRank) {
  const auto t = m.dataType;
  if (static_cast<unsigned>(t) > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "tensorDataType {} is invalid", static_cast<int>(t));
  }
  if (static_cast<unsigned>(m.interleave) > CU_TENSOR_MAP_INTERLEAVE_32B ||
      static_cast<unsigned>(m.swizzle) > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B ||
      static_cast<unsigned>(m.l2Promotion) > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
      static_cast<unsigned>(m.oobFill) > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA) {
    return cuError(CUDA_ERROR_INVALID_VALUE,
                   "interleave, swizzle, l2Promotion or oobFill is out of its enum");
  }
  if (m.rank < minRank || m.rank > 5) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "tensorRank {} is not {} to 5", m.rank, minRank);
  }
  if (m.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && m.rank < 3) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "an interleaved tensor needs a rank of 3 or more, not {}", m.rank);
  }
  RETURN_IF_ERROR(checkAddress(m.address, t, m.interleave));
  if (m.globalDim == nullptr || m.elementStrides == nullptr ||
      (m.rank > 1 && m.globalStrides == nullptr)) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "globalDim, globalStrides or elementStrides is null");
  }
  for (std::uint32_t i = 0; i < m.rank; ++i) {
    if (m.globalDim[i] == 0 || m.globalDim[i] > (std::uint64_t{1} << 32)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "globalDim[{}] = {} is not 1 to 2^32", i,
                      m.globalDim[i]);
    }
    if (m.elementStrides[i] == 0 || m.elementStrides[i] > 8) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "elementStrides[{}] = {} is not 1 to 8", i,
                      m.elementStrides[i]);
    }
  }
  if (packed16B(t) && m.globalDim[0] % 128 != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "globalDim[0] = {} is not a multiple of 128",
                    m.globalDim[0]);
  }
  if (t == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B && m.globalDim[0] % 2 != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "globalDim[0] = {} is not even", m.globalDim[0]);
  }
  const std::uint64_t strideAlign =
      m.interleave == CU_TENSOR_MAP_INTERLEAVE_32B || packed16B(t) ? 32 : 16;
  for (std::uint32_t i = 0; i + 1 < m.rank; ++i) {
    if (m.globalStrides[i] % strideAlign != 0 || m.globalStrides[i] >= (std::uint64_t{1} << 40)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "globalStrides[{}] = {} is not a multiple of {} below 2^40", i,
                      m.globalStrides[i], strideAlign);
    }
  }
  if (m.interleave == CU_TENSOR_MAP_INTERLEAVE_32B && m.swizzle != CU_TENSOR_MAP_SWIZZLE_32B) {
    return cuError(CUDA_ERROR_INVALID_VALUE,
                   "a 32-byte interleave needs CU_TENSOR_MAP_SWIZZLE_32B");
  }
  if (t == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B && m.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) {
    return cuError(CUDA_ERROR_INVALID_VALUE,
                   "CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B needs no interleave");
  }
  if (m.oobFill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && !floatingPoint(t)) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "a NaN fill needs a floating-point data type");
  }
  return Status::ok();
}

// The swizzles a packed 16-byte aligned type takes (of the tiled and im2col forms).
Status checkPackedSwizzle(const TensorMapCommon& m) {
  const bool u6 = m.dataType == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B;
  if (!packed16B(m.dataType)) return Status::ok();
  const bool allowed = m.swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ||
                       m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B ||
                       m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B ||
                       (u6 && m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B);
  if (!allowed) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "swizzle {} is not one of those of data type {}",
                    static_cast<int>(m.swizzle), static_cast<int>(m.dataType));
  }
  return Status::ok();
}

// "channelsPerPixel ... must be less than or equal to 256", 128 for the
// packed 16-byte aligned types; "pixelsPerColumn ... less than or equal to 1024".
Status checkPixels(const TensorMapCommon& m, std::uint32_t channels, std::uint32_t pixels,
                   bool pixelsUsed) {
  if (channels == 0 || channels > 256 || (packed16B(m.dataType) && channels != 128)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "channelsPerPixel {} is not {}", channels,
                    packed16B(m.dataType) ? "128" : "1 to 256");
  }
  if (pixelsUsed && (pixels == 0 || pixels > 1024)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "pixelsPerColumn {} is not 1 to 1024", pixels);
  }
  return Status::ok();
}

// The bounding box spans globalDim + upper - lower pixels of a spatial
// dimension (its corners are offsets from the tensor's): "must have
// non-zero area".
Status checkBoxArea(std::uint64_t dim, int lower, int upper, std::uint32_t i) {
  if (static_cast<std::int64_t>(dim) + upper - lower <= 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "the bounding box is empty in dimension {} (corners {} and {})", i, lower,
                    upper);
  }
  return Status::ok();
}

TensorMapLayout layoutOf(const TensorMapCommon& m, TensorMapLayout::Kind kind) {
  TensorMapLayout layout;
  layout.dataType = static_cast<std::uint8_t>(m.dataType);
  layout.rank = static_cast<std::uint8_t>(m.rank);
  layout.interleave = static_cast<std::uint8_t>(m.interleave);
  layout.swizzle = static_cast<std::uint8_t>(m.swizzle);
  layout.l2Promotion = static_cast<std::uint8_t>(m.l2Promotion);
  layout.oobFill = static_cast<std::uint8_t>(m.oobFill);
  layout.kind = kind;
  layout.address = m.address;
  for (std::uint32_t i = 0; i < m.rank; ++i) {
    layout.globalDim[i] = m.globalDim[i];
    layout.elementStrides[i] = static_cast<std::uint8_t>(m.elementStrides[i]);
    if (i + 1 < m.rank) layout.globalStrides[i] = m.globalStrides[i];
  }
  return layout;
}

}  // namespace

Result<CUtensorMap> encodeTiled(const TiledTensorMap& m) {
  RETURN_IF_ERROR(checkCommon(m, 1));
  RETURN_IF_ERROR(checkPackedSwizzle(m));
  if (m.boxDim == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "boxDim is null");
  for (std::uint32_t i = 0; i < m.rank; ++i) {
    if (m.boxDim[i] == 0 || m.boxDim[i] > 256) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "boxDim[{}] = {} is not 1 to 256", i, m.boxDim[i]);
    }
  }
  if (packed16B(m.dataType) && m.boxDim[0] != 128) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "boxDim[0] = {} is not 128", m.boxDim[0]);
  }
  if (m.interleave == CU_TENSOR_MAP_INTERLEAVE_NONE &&
      std::uint64_t{m.boxDim[0]} * elementBits(m.dataType) % 128 != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "boxDim[0] = {} elements is not a multiple of 16 bytes", m.boxDim[0]);
  }
  RETURN_IF_ERROR(checkSwizzleSpan(m, m.boxDim[0]));
  TensorMapLayout layout = layoutOf(m, TensorMapLayout::kTiled);
  for (std::uint32_t i = 0; i < m.rank; ++i) {
    layout.boxDim[i] = static_cast<std::uint16_t>(m.boxDim[i]);
  }
  return std::bit_cast<CUtensorMap>(layout);
}

Result<CUtensorMap> encodeIm2col(const Im2colTensorMap& m) {
  RETURN_IF_ERROR(checkCommon(m, 3));
  RETURN_IF_ERROR(checkPackedSwizzle(m));
  if (m.pixelBoxLowerCorner == nullptr || m.pixelBoxUpperCorner == nullptr) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "pixelBoxLowerCorner or pixelBoxUpperCorner is null");
  }
  // One offset of 16 bits for rank 3, two of 8 for rank 4, three of 5 for rank 5.
  const int bits = m.rank == 3 ? 16 : m.rank == 4 ? 8 : 5;
  const int low = -(1 << (bits - 1)), high = (1 << (bits - 1)) - 1;
  TensorMapLayout layout = layoutOf(m, TensorMapLayout::kIm2col);
  for (std::uint32_t i = 0; i + 2 < m.rank; ++i) {
    const int lower = m.pixelBoxLowerCorner[i], upper = m.pixelBoxUpperCorner[i];
    if (lower < low || lower > high || upper < low || upper > high) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "pixel box corner offsets {} and {} are not within [{}, {}]", lower, upper,
                      low, high);
    }
    RETURN_IF_ERROR(checkBoxArea(m.globalDim[i + 1], lower, upper, i + 1));
    layout.lowerCorner[i] = static_cast<std::int16_t>(lower);
    layout.upperCorner[i] = static_cast<std::int16_t>(upper);
  }
  RETURN_IF_ERROR(checkPixels(m, m.channelsPerPixel, m.pixelsPerColumn, true));
  RETURN_IF_ERROR(checkSwizzleSpan(m, m.channelsPerPixel));
  layout.channelsPerPixel = static_cast<std::uint16_t>(m.channelsPerPixel);
  layout.pixelsPerColumn = static_cast<std::uint16_t>(m.pixelsPerColumn);
  return std::bit_cast<CUtensorMap>(layout);
}

Result<CUtensorMap> encodeIm2colWide(const Im2colWideTensorMap& m) {
  RETURN_IF_ERROR(checkCommon(m, 3));
  if (m.mode != CU_TENSOR_MAP_IM2COL_WIDE_MODE_W && m.mode != CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "mode {} is invalid", static_cast<int>(m.mode));
  }
  // "other swizzle modes are not supported" (and no 64-byte one for packed types).
  const bool allowed = m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B ||
                       m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B ||
                       (m.swizzle == CU_TENSOR_MAP_SWIZZLE_64B && !packed16B(m.dataType));
  if (!allowed) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "swizzle {} is not one of the wide im2col form's",
                    static_cast<int>(m.swizzle));
  }
  const int lower = m.pixelBoxLowerCornerWidth, upper = m.pixelBoxUpperCornerWidth;
  if (lower < -32768 || lower > 32767 || upper < -32768 || upper > 32767) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "width offsets {} and {} are not within [-32768, 32767]", lower, upper);
  }
  RETURN_IF_ERROR(checkBoxArea(m.globalDim[1], lower, upper, 1));
  RETURN_IF_ERROR(checkPixels(m, m.channelsPerPixel, m.pixelsPerColumn,
                              m.mode == CU_TENSOR_MAP_IM2COL_WIDE_MODE_W));
  RETURN_IF_ERROR(checkSwizzleSpan(m, m.channelsPerPixel));
  TensorMapLayout layout = layoutOf(m, TensorMapLayout::kIm2colWide);
  layout.wideMode = static_cast<std::uint8_t>(m.mode);
  layout.lowerCorner[0] = static_cast<std::int16_t>(lower);
  layout.upperCorner[0] = static_cast<std::int16_t>(upper);
  layout.channelsPerPixel = static_cast<std::uint16_t>(m.channelsPerPixel);
  layout.pixelsPerColumn = static_cast<std::uint16_t>(m.pixelsPerColumn);
  return std::bit_cast<CUtensorMap>(layout);
}

Status replaceAddress(CUtensorMap& map, std::uint64_t address) {
  auto layout = std::bit_cast<TensorMapLayout>(map);
  if (layout.magic != TensorMapLayout::kMagic || layout.rank == 0 || layout.rank > 5) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "tensorMap was not encoded by cuTensorMapEncode*");
  }
  RETURN_IF_ERROR(checkAddress(address, static_cast<CUtensorMapDataType>(layout.dataType),
                               static_cast<CUtensorMapInterleave>(layout.interleave)));
  layout.address = address;
  map = std::bit_cast<CUtensorMap>(layout);
  return Status::ok();
}

}  // namespace phos::vgpu
