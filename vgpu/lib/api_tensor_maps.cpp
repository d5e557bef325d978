// SPDX-License-Identifier: Apache-2.0
// Entry points: tensor maps (driver/tensor_map.h). vgpu encodes tiled tensor
// maps; its PTX engine does not run the instructions that use them
// (cp.async.bulk.tensor), and im2col tensor maps are not encoded.
#include <cstdint>

#include "entry.h"
#include "tensor_map.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::requireNonNull;

namespace {

// "tensorMap address must be aligned to 64 bytes".
Status checkDescriptor(const CUtensorMap* tensorMap) {
  RETURN_IF_ERROR(requireNonNull(tensorMap, "tensorMap"));
  if (reinterpret_cast<std::uintptr_t>(tensorMap) % 64 != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "tensorMap {} is not 64-byte aligned",
                    static_cast<const void*>(tensorMap));
  }
  return Status::ok();
}

}  // namespace

CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
    void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
    const cuuint32_t* boxDim, const cuuint32_t* elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
    CUtensorMapFloatOOBfill oobFill) {
  return call(__func__, [&](Driver&) -> Status {
    RETURN_IF_ERROR(checkDescriptor(tensorMap));
    ASSIGN_OR_RETURN(*tensorMap,
                     encodeTiled({.dataType = tensorDataType,
                                  .rank = tensorRank,
                                  .address = reinterpret_cast<std::uintptr_t>(globalAddress),
                                  .globalDim = globalDim,
                                  .globalStrides = globalStrides,
                                  .boxDim = boxDim,
                                  .elementStrides = elementStrides,
                                  .interleave = interleave,
                                  .swizzle = swizzle,
                                  .l2Promotion = l2Promotion,
                                  .oobFill = oobFill}));
    return Status::ok();
  });
}

CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* tensorMap, void* globalAddress) {
  return call(__func__, [&](Driver&) -> Status {
    RETURN_IF_ERROR(checkDescriptor(tensorMap));
    return replaceAddress(*tensorMap, reinterpret_cast<std::uintptr_t>(globalAddress));
  });
}
