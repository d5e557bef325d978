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
  // The shim sent tensorRank elements of each array (the strides one fewer);
  // anything else is not a rank the driver takes, or not the shim.
  if (tensorMap == nullptr || tensorRank == 0 || tensorRank > 5) return CUDA_ERROR_INVALID_VALUE;
  auto data = [](auto span) { return span.empty() ? nullptr : span.data(); };
  return PHOS_DRIVER(c.driverTable(), TensorMapEncodeTiled)(
      tensorMap, tensorDataType, tensorRank, reinterpret_cast<void*>(globalAddress),
      data(globalDim), data(globalStrides), data(boxDim), data(elementStrides), interleave, swizzle,
      l2Promotion, oobFill);
}

CUresult cuTensorMapReplaceAddress(ServerCall& c, CUtensorMap* tensorMap, uint64_t globalAddress) {
  if (!c.driverTable().has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  if (tensorMap == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return PHOS_DRIVER(c.driverTable(), TensorMapReplaceAddress)(
      tensorMap, reinterpret_cast<void*>(globalAddress));
}

}  // namespace phos::daemon::hooks
