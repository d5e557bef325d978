// SPDX-License-Identifier: Apache-2.0
// Entry points: the virtual memory management API (reserve, create, map, access, release).
#include "entry.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::requireNonNull;

namespace {

Status validateProperties(Driver& d, const CUmemAllocationProp* prop) {
  RETURN_IF_ERROR(requireNonNull(prop, "prop"));
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "allocation type {} is not CU_MEM_ALLOCATION_TYPE_PINNED",
                    static_cast<int>(prop->type));
  }
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return cuError(CUDA_ERROR_NOT_SUPPORTED, "vgpu creates physical memory on devices only");
  }
  RETURN_IF_ERROR(d.checkDevice(prop->location.id));
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    return cuError(CUDA_ERROR_NOT_SUPPORTED, "shareable handles are not supported by vgpu");
  }
  return Status::ok();
}

}  // namespace

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(granularity, "granularity"));
    RETURN_IF_ERROR(validateProperties(d, prop));
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "granularity option {} is invalid", static_cast<int>(option));
    }
    *granularity = kVmmGranularity;
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(ptr, "ptr"));
    // "flags: Currently unused, must be zero".
    if (flags != 0) return cuError(CUDA_ERROR_INVALID_VALUE, "flags must be 0");
    ASSIGN_OR_RETURN(std::uint64_t base, d.reserveVa(size, alignment, addr));
    *ptr = base;
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return call(__func__, [&](Driver& d) { return d.freeVa(ptr, size); });
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(handle, "handle"));
    RETURN_IF_ERROR(validateProperties(d, prop));
    if (flags != 0) return cuError(CUDA_ERROR_INVALID_VALUE, "flags must be 0");
    ASSIGN_OR_RETURN(std::uint64_t h, d.createPhysical(size, *prop));
    *handle = h;
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                        CUmemGenericAllocationHandle handle) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(prop, "prop"));
    ASSIGN_OR_RETURN(*prop, d.physicalProperties(handle));
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return call(__func__, [&](Driver& d) { return d.releasePhysical(handle); });
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  return call(__func__, [&](Driver& d) -> Status {
    if (flags != 0) return cuError(CUDA_ERROR_INVALID_VALUE, "flags must be 0");
    return d.map(ptr, size, offset, handle);
  });
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return call(__func__, [&](Driver& d) { return d.unmap(ptr, size); });
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(desc, "desc"));
    return d.setAccess(ptr, size, std::span<const CUmemAccessDesc>(desc, count));
  });
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(flags, "flags"));
    RETURN_IF_ERROR(requireNonNull(location, "location"));
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "only device locations have access flags");
    }
    RETURN_IF_ERROR(d.checkDevice(location->id));
    auto a = d.allocations().find(ptr);
    if (!a || a->kind != MemoryKind::kVmmMapping) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not mapped with cuMemMap", ptr);
    }
    bool granted = ((a->accessDevices >> location->id) & 1U) != 0;
    *flags = !granted ? CU_MEM_ACCESS_FLAGS_PROT_NONE
                      : (a->readOnlyAccess ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(handle, "handle"));
    ASSIGN_OR_RETURN(std::uint64_t h, d.retainPhysical(reinterpret_cast<std::uint64_t>(addr)));
    *handle = h;
    return Status::ok();
  });
}
