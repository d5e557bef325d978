// SPDX-License-Identifier: Apache-2.0
// The rules are the Driver API reference's, for cuTensorMapEncodeTiled.
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

Status checkSwizzle(const TiledTensorMap& m) {
  const auto t = m.dataType;
  if (m.interleave == CU_TENSOR_MAP_INTERLEAVE_32B && m.swizzle != CU_TENSOR_MAP_SWIZZLE_32B) {
    return cuError(CUDA_ERROR_INVALID_VALUE,
                   "a 32-byte interleave needs CU_TENSOR_MAP_SWIZZLE_32B");
  }
  if (t == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B && m.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) {
    return cuError(CUDA_ERROR_INVALID_VALUE,
                   "CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B needs no interleave");
  }
  const bool u6 = t == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B,
             u4 = t == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B;
  if (u6 || u4) {
    const bool allowed = m.swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ||
                         m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B ||
                         m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B ||
                         (u6 && m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B);
    if (!allowed) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "swizzle {} is not one of those of data type {}",
                      static_cast<int>(m.swizzle), static_cast<int>(t));
    }
  }
  // "the bounding box inner dimension ... must be less than or equal to the swizzle size".
  if (m.interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && m.swizzle != CU_TENSOR_MAP_SWIZZLE_NONE) {
    const std::uint64_t inner = std::uint64_t{m.boxDim[0]} * elementBits(t) / 8;
    const std::uint64_t span = m.swizzle == CU_TENSOR_MAP_SWIZZLE_32B   ? 32
                               : m.swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                                                                        : 128;
    if (inner > span) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "the box's inner dimension ({} bytes) exceeds the swizzle's {}", inner, span);
    }
  }
  return Status::ok();
}

}  // namespace

Result<CUtensorMap> encodeTiled(const TiledTensorMap& m) {
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
  if (m.rank == 0 || m.rank > 5) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "tensorRank {} is not 1 to 5", m.rank);
  }
  if (m.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && m.rank < 3) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "an interleaved tensor needs a rank of 3 or more, not {}", m.rank);
  }
  RETURN_IF_ERROR(checkAddress(m.address, t, m.interleave));
  if (m.globalDim == nullptr || m.boxDim == nullptr || m.elementStrides == nullptr ||
      (m.rank > 1 && m.globalStrides == nullptr)) {
    return cuError(CUDA_ERROR_INVALID_VALUE,
                   "globalDim, globalStrides, boxDim or elementStrides is null");
  }
  for (std::uint32_t i = 0; i < m.rank; ++i) {
    if (m.globalDim[i] == 0 || m.globalDim[i] > (std::uint64_t{1} << 32)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "globalDim[{}] = {} is not 1 to 2^32", i,
                      m.globalDim[i]);
    }
    if (m.boxDim[i] == 0 || m.boxDim[i] > 256) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "boxDim[{}] = {} is not 1 to 256", i, m.boxDim[i]);
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
  if (packed16B(t) && m.boxDim[0] != 128) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "boxDim[0] = {} is not 128", m.boxDim[0]);
  }
  if (m.interleave == CU_TENSOR_MAP_INTERLEAVE_NONE &&
      std::uint64_t{m.boxDim[0]} * elementBits(t) % 128 != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "boxDim[0] = {} elements is not a multiple of 16 bytes", m.boxDim[0]);
  }
  RETURN_IF_ERROR(checkSwizzle(m));
  if (m.oobFill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && !floatingPoint(t)) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "a NaN fill needs a floating-point data type");
  }
  TensorMapLayout layout;
  layout.dataType = static_cast<std::uint8_t>(t);
  layout.rank = static_cast<std::uint8_t>(m.rank);
  layout.interleave = static_cast<std::uint8_t>(m.interleave);
  layout.swizzle = static_cast<std::uint8_t>(m.swizzle);
  layout.l2Promotion = static_cast<std::uint8_t>(m.l2Promotion);
  layout.oobFill = static_cast<std::uint8_t>(m.oobFill);
  layout.address = m.address;
  for (std::uint32_t i = 0; i < m.rank; ++i) {
    layout.globalDim[i] = m.globalDim[i];
    layout.boxDim[i] = m.boxDim[i];
    layout.elementStrides[i] = m.elementStrides[i];
    if (i + 1 < m.rank) layout.globalStrides[i] = m.globalStrides[i];
  }
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
