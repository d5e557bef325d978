// SPDX-License-Identifier: Apache-2.0
// Server hooks for the application's own virtual memory management: checked
// here, kept by the session's ApplicationVmm (session/application_vmm.h),
// which places reservations where a restore can place them again.
#include <cuda.h>

#include <vector>

#include "phos/common/log.h"
#include "phos/cuda_api/server_hooks.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

// Physical memory the session can hold: pinned device memory, without
// shareable handles (they would be file descriptors of phosd's).
CUresult checkProperties(ServerCall& c, const CUmemAllocationProp* prop, const char* entry) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    log::get("daemon")->info(
        "session {}: {}: {} is not served (device memory without shareable handles is)",
        c.session().id(), entry,
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ? "memory of a host location"
                                                           : "a shareable handle type");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
  int count = 0;
  PHOS_DRIVER(c.driverTable(), DeviceGetCount)(&count);
  if (prop->location.id < 0 || prop->location.id >= count) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuMemGetAllocationGranularity(ServerCall& c, size_t* granularity,
                                       const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return PHOS_DRIVER(c.driverTable(), MemGetAllocationGranularity)(granularity, prop, option);
}

CUresult cuMemAddressReserve(ServerCall& c, CUdeviceptr* ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags) {
  if (ptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;  // "flags: must be zero"
  return c.session().vmm().reserve(size, alignment, addr, ptr);
}

CUresult cuMemAddressFree(ServerCall& c, CUdeviceptr ptr, size_t size) {
  return c.session().vmm().free(ptr, size);
}

CUresult cuMemCreate(ServerCall& c, CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = checkProperties(c, prop, "cuMemCreate"); r != CUDA_SUCCESS) return r;
  uint64_t id = 0;
  CUresult r = c.session().vmm().create(size, *prop, &id);
  *handle = id;
  return r;
}

CUresult cuMemRelease(ServerCall& c, CUmemGenericAllocationHandle handle) {
  return c.session().vmm().release(handle);
}

CUresult cuMemMap(ServerCall& c, CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return c.session().vmm().map(ptr, size, offset, handle, c.session().currentContext(),
                               c.session().memory());
}

CUresult cuMemUnmap(ServerCall& c, CUdeviceptr ptr, size_t size) {
  if (auto refused = c.refuseUnsafeInCapture()) return *refused;
  Session& s = c.session();
  // Whole mappings of the session (ApplicationVmm::unmap checks it again).
  std::vector<const VmmMapping*> mappings;
  CUdeviceptr at = ptr;
  while (at - ptr < size) {
    const VmmMapping* m = s.vmm().mappingAt(at);
    if (m == nullptr || m->address != at) return CUDA_ERROR_INVALID_VALUE;
    mappings.push_back(m);
    at += m->bytes;
  }
  // Exactly: a refused unmap must not end any contents for the protocols.
  if (mappings.empty() || at - ptr != size) return CUDA_ERROR_INVALID_VALUE;
  // It waits for the work below: answered later while a stream memory wait may hold it.
  if (s.deferBehindStreamWaits(c, std::nullopt)) return CUDA_SUCCESS;
  // The end of their contents, for the protocols, as a free's; unmapping
  // under a running kernel would fault it.
  for (const VmmMapping* m : mappings) {
    s.passGate({.writes = {{m->address, m->bytes}}, .ends = true});
  }
  s.waitForWork(std::nullopt);
  return s.vmm().unmap(ptr, size, s.memory());
}

CUresult cuMemSetAccess(ServerCall& c, CUdeviceptr ptr, size_t size,
                        std::span<const CUmemAccessDesc> desc, size_t count) {
  if (desc.size() != count || count == 0) return CUDA_ERROR_INVALID_VALUE;
  return c.session().vmm().setAccess(ptr, size, desc);
}

CUresult cuMemGetAccess(ServerCall& c, unsigned long long* flags, const CUmemLocation* location,
                        CUdeviceptr ptr) {
  if (flags == nullptr || location == nullptr || c.session().vmm().mappingAt(ptr) == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return PHOS_DRIVER(c.driverTable(), MemGetAccess)(flags, location, ptr);
}

CUresult cuMemRetainAllocationHandle(ServerCall& c, CUmemGenericAllocationHandle* handle,
                                     uint64_t addr) {
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t id = 0;
  CUresult r = c.session().vmm().retain(addr, &id);
  *handle = id;
  return r;
}

CUresult cuMemGetAllocationPropertiesFromHandle(ServerCall& c, CUmemAllocationProp* prop,
                                                CUmemGenericAllocationHandle handle) {
  const VmmPhysical* p = c.session().vmm().physical(handle);
  if (prop == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *prop = p->prop;
  return CUDA_SUCCESS;
}

}  // namespace phos::daemon::hooks
