// SPDX-License-Identifier: Apache-2.0
// Server hooks for tensor maps (TMA descriptors). A descriptor is 128 bytes
// the driver encodes from plain values and one device address, which is the
// same in phosd and in the application, and again after a restore: phosd
// encodes into its own copy, which the reply carries back. The shim checks
// the application's copy's alignment and the rank before it reads the arrays.
#include <cuda.h>

#include <span>

#include "phos/cuda_api/server_hooks.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

// The driver's array: null where the application passed none.
template <typename T>
const T* data(std::span<const T> values) {
  return values.empty() ? nullptr : values.data();
}

}  // namespace

CUresult cuTensorMapEncodeTiled(ServerCall& c, CUtensorMap* tensorMap,
                                CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
                                uint64_t globalAddress, std::span<const cuuint64_t> globalDim,
                                std::span<const cuuint64_t> globalStrides,
                                std::span<const cuuint32_t> boxDim,
                                std::span<const cuuint32_t> elementStrides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2Promotion,
                                CUtensorMapFloatOOBfill oobFill) {
  if (!c.driverTable().has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  // The shim sent tensorRank elements of each array (fewer where the
  // reference says so); another rank is not one the driver takes.
  if (tensorMap == nullptr || tensorRank == 0 || tensorRank > 5) return CUDA_ERROR_INVALID_VALUE;
  return PHOS_DRIVER(c.driverTable(), TensorMapEncodeTiled)(
      tensorMap, tensorDataType, tensorRank, reinterpret_cast<void*>(globalAddress),
      data(globalDim), data(globalStrides), data(boxDim), data(elementStrides), interleave, swizzle,
      l2Promotion, oobFill);
}

CUresult cuTensorMapEncodeIm2col(
    ServerCall& c, CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
    cuuint32_t tensorRank, uint64_t globalAddress, std::span<const cuuint64_t> globalDim,
    std::span<const cuuint64_t> globalStrides, std::span<const int> pixelBoxLowerCorner,
    std::span<const int> pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
    cuuint32_t pixelsPerColumn, std::span<const cuuint32_t> elementStrides,
    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  if (!c.driverTable().has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  if (tensorMap == nullptr || tensorRank == 0 || tensorRank > 5) return CUDA_ERROR_INVALID_VALUE;
  return PHOS_DRIVER(c.driverTable(), TensorMapEncodeIm2col)(
      tensorMap, tensorDataType, tensorRank, reinterpret_cast<void*>(globalAddress),
      data(globalDim), data(globalStrides), data(pixelBoxLowerCorner), data(pixelBoxUpperCorner),
      channelsPerPixel, pixelsPerColumn, data(elementStrides), interleave, swizzle, l2Promotion,
      oobFill);
}

CUresult cuTensorMapEncodeIm2colWide(
    ServerCall& c, CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
    cuuint32_t tensorRank, uint64_t globalAddress, std::span<const cuuint64_t> globalDim,
    std::span<const cuuint64_t> globalStrides, int pixelBoxLowerCornerWidth,
    int pixelBoxUpperCornerWidth, cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
    std::span<const cuuint32_t> elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
    CUtensorMapFloatOOBfill oobFill) {
  if (!c.driverTable().has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  if (tensorMap == nullptr || tensorRank == 0 || tensorRank > 5) return CUDA_ERROR_INVALID_VALUE;
  return PHOS_DRIVER(c.driverTable(), TensorMapEncodeIm2colWide)(
      tensorMap, tensorDataType, tensorRank, reinterpret_cast<void*>(globalAddress),
      data(globalDim), data(globalStrides), pixelBoxLowerCornerWidth, pixelBoxUpperCornerWidth,
      channelsPerPixel, pixelsPerColumn, data(elementStrides), interleave, mode, swizzle,
      l2Promotion, oobFill);
}

CUresult cuTensorMapReplaceAddress(ServerCall& c, CUtensorMap* tensorMap, uint64_t globalAddress) {
  if (!c.driverTable().has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  if (tensorMap == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return PHOS_DRIVER(c.driverTable(), TensorMapReplaceAddress)(
      tensorMap, reinterpret_cast<void*>(globalAddress));
}

}  // namespace phos::daemon::hooks
