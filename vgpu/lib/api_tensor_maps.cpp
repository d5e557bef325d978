// SPDX-License-Identifier: Apache-2.0
// Entry points: tensor maps (driver/tensor_map.h). vgpu encodes every form;
// its PTX engine does not run the instructions that use them
// (cp.async.bulk.tensor).
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

namespace {

TensorMapCommon common(CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
                       void* globalAddress, const cuuint64_t* globalDim,
                       const cuuint64_t* globalStrides, const cuuint32_t* elementStrides,
                       CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                       CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  TensorMapCommon m;
  m.dataType = tensorDataType;
  m.rank = tensorRank;
  m.address = reinterpret_cast<std::uintptr_t>(globalAddress);
  m.globalDim = globalDim;
  m.globalStrides = globalStrides;
  m.elementStrides = elementStrides;
  m.interleave = interleave;
  m.swizzle = swizzle;
  m.l2Promotion = l2Promotion;
  m.oobFill = oobFill;
  return m;
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
    TiledTensorMap m{common(tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
                            elementStrides, interleave, swizzle, l2Promotion, oobFill)};
    m.boxDim = boxDim;
    ASSIGN_OR_RETURN(*tensorMap, encodeTiled(m));
    return Status::ok();
  });
}

CUresult CUDAAPI cuTensorMapEncodeIm2col(
    CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
    void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
    const int* pixelBoxLowerCorner, const int* pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
    cuuint32_t pixelsPerColumn, const cuuint32_t* elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
    CUtensorMapFloatOOBfill oobFill) {
  return call(__func__, [&](Driver&) -> Status {
    RETURN_IF_ERROR(checkDescriptor(tensorMap));
    Im2colTensorMap m{common(tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
                             elementStrides, interleave, swizzle, l2Promotion, oobFill)};
    m.pixelBoxLowerCorner = pixelBoxLowerCorner;
    m.pixelBoxUpperCorner = pixelBoxUpperCorner;
    m.channelsPerPixel = channelsPerPixel;
    m.pixelsPerColumn = pixelsPerColumn;
    ASSIGN_OR_RETURN(*tensorMap, encodeIm2col(m));
    return Status::ok();
  });
}

CUresult CUDAAPI cuTensorMapEncodeIm2colWide(
    CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
    void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
    int pixelBoxLowerCornerWidth, int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel,
    cuuint32_t pixelsPerColumn, const cuuint32_t* elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
    CUtensorMapFloatOOBfill oobFill) {
  return call(__func__, [&](Driver&) -> Status {
    RETURN_IF_ERROR(checkDescriptor(tensorMap));
    Im2colWideTensorMap m{common(tensorDataType, tensorRank, globalAddress, globalDim,
                                 globalStrides, elementStrides, interleave, swizzle, l2Promotion,
                                 oobFill)};
    m.pixelBoxLowerCornerWidth = pixelBoxLowerCornerWidth;
    m.pixelBoxUpperCornerWidth = pixelBoxUpperCornerWidth;
    m.channelsPerPixel = channelsPerPixel;
    m.pixelsPerColumn = pixelsPerColumn;
    m.mode = mode;
    ASSIGN_OR_RETURN(*tensorMap, encodeIm2colWide(m));
    return Status::ok();
  });
}

CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap* tensorMap, void* globalAddress) {
  return call(__func__, [&](Driver&) -> Status {
    RETURN_IF_ERROR(checkDescriptor(tensorMap));
    return replaceAddress(*tensorMap, reinterpret_cast<std::uintptr_t>(globalAddress));
  });
}
