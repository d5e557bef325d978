// SPDX-License-Identifier: Apache-2.0
// cuMemAdvise, cuMemRangeGetAttribute(s) (answered here: apigen/remoting.json
// "local") and what the shim records of cuMemPrefetchAsync once phosd has
// checked its range and stream.
#include "managed_memory.h"

#include <cuda.h>

#include "api_trace.h"
#include "connection.h"
#include "phos/cuda_api/client_hooks.h"

namespace phos::shim {
namespace managed {

ManagedAdvice& advice() {
  static ManagedAdvice model;
  return model;
}

}  // namespace managed

namespace {

// The devices advice may name (as the daemon's driver counts them).
int deviceCount() {
  trace::InternalCalls internal;
  int count = 0;
  return ::cuDeviceGetCount(&count) == CUDA_SUCCESS ? count : 0;
}

// The legacy int form of a location: a device ordinal or CU_DEVICE_CPU.
CUmemLocation locationOf(CUdevice device) {
  if (device == CU_DEVICE_CPU) return {CU_MEM_LOCATION_TYPE_HOST, 0};
  return {CU_MEM_LOCATION_TYPE_DEVICE, device};
}

bool initialized() {
  return Connection::instance().connected();
}

}  // namespace

namespace local {

CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                     CUmemLocation location) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return ManagedAdvice::resultOf(
      managed::advice().advise(devPtr, count, advice, location, deviceCount()));
}

CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device) {
  return cuMemAdvise(devPtr, count, advice, locationOf(device));
}

CUresult cuMemRangeGetAttribute(void* data, size_t dataSize, CUmem_range_attribute attribute,
                                CUdeviceptr devPtr, size_t count) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return ManagedAdvice::resultOf(
      managed::advice().attribute(attribute, devPtr, count, data, dataSize, deviceCount()));
}

CUresult cuMemRangeGetAttributes(void** data, size_t* dataSizes, CUmem_range_attribute* attributes,
                                 size_t numAttributes, CUdeviceptr devPtr, size_t count) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (data == nullptr || dataSizes == nullptr || attributes == nullptr || numAttributes == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int devices = deviceCount();
  for (size_t i = 0; i < numAttributes; ++i) {
    Status s =
        managed::advice().attribute(attributes[i], devPtr, count, data[i], dataSizes[i], devices);
    if (!s.isOk()) return ManagedAdvice::resultOf(s);
  }
  return CUDA_SUCCESS;
}

}  // namespace local

namespace epilogue {

CUresult cuMemPrefetchAsync(CUresult result, CUdeviceptr devPtr, size_t count,
                            CUmemLocation location, unsigned int, CUstream) {
  if (result != CUDA_SUCCESS) return result;
  return ManagedAdvice::resultOf(
      managed::advice().prefetch(devPtr, count, location, deviceCount()));
}

CUresult cuMemPrefetchAsync(CUresult result, CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                            CUstream) {
  if (result != CUDA_SUCCESS) return result;
  return ManagedAdvice::resultOf(
      managed::advice().prefetch(devPtr, count, locationOf(dstDevice), deviceCount()));
}

}  // namespace epilogue
}  // namespace phos::shim
