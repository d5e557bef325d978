// SPDX-License-Identifier: Apache-2.0
// Entry points: the stream-ordered allocator (cuMemAllocAsync, cuMemFreeAsync,
// memory pools). A pool's allocations come from the device heap when the call
// is made (work ordered after it on the stream may use them, which is all the
// stream promises) and go back when the stream reaches their free
// (driver/memory_pools.h).
#include "entry.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::handleOf;
using phos::vgpu::api::requireNonNull;

PHOS_CU_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                             CUstream hStream);

namespace {

std::uint64_t poolId(CUmemoryPool pool) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(pool)); }

Result<MemoryPool> livePool(Driver& d, CUmemoryPool pool) { return d.pools().get(poolId(pool)); }

// `bytes` from `pool` for work on `ref`'s stream.
Status allocate(Driver& d, const StreamRef& ref, std::uint64_t pool, std::size_t bytes, CUdeviceptr* dptr) {
  ASSIGN_OR_RETURN(MemoryPool p, d.pools().get(pool));
  if (bytes == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "cannot allocate 0 bytes");
  RETURN_IF_ERROR(d.pools().charge(pool, bytes, pooledBytes(bytes)));
  // In a context of the pool's device: "use cuMemAllocFromPoolAsync to
  // specify asynchronous allocations from a device different than the one the
  // stream runs on".
  std::shared_ptr<Context> owner = ref.context;
  if (owner->device() != p.device) {
    auto primary = d.retainPrimary(p.device);
    if (!primary.isOk()) {
      d.pools().uncharge(pool, bytes);
      d.pools().release(pool, pooledBytes(bytes));
      return primary.status();
    }
    owner = *primary;
    (void)d.releasePrimary(p.device);  // the pool's memory does not keep the context
  }
  auto address = d.allocateDevice(*owner, bytes);
  if (!address.isOk()) {
    d.pools().uncharge(pool, bytes);
    d.pools().release(pool, pooledBytes(bytes));
    return address.status();
  }
  auto a = d.allocations().find(*address);
  a->pool = pool;
  RETURN_IF_ERROR(d.allocations().update(*a));
  *dptr = *address;
  return Status::ok();
}

// A stream-ordered allocation in a capture is a memory node that allocates
// at each launch of the graph; vgpu does not make them.
Status refuseAllocationNode(Driver& d, const StreamRef& ref) {
  return d.refuseInCapture(
      ref, "stream-ordered allocation (a graph memory node, which vgpu does not make)");
}

CUresult allocAsync(const char* name, CUdeviceptr* dptr, size_t bytesize, CUstream hStream, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(dptr, "dptr"));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    RETURN_IF_ERROR(refuseAllocationNode(d, ref));
    // "The allocation comes from the memory pool current to the stream's device."
    return allocate(d, ref, d.pools().currentPool(ref.context->device()), bytesize, dptr);
  });
}

CUresult allocFromPool(const char* name, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream,
                       bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(dptr, "dptr"));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    RETURN_IF_ERROR(refuseAllocationNode(d, ref));
    return allocate(d, ref, poolId(pool), bytesize, dptr);
  });
}

CUresult freeAsync(const char* name, CUdeviceptr dptr, CUstream hStream, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    RETURN_IF_ERROR(refuseAllocationNode(d, ref));
    auto a = d.allocations().find(dptr);
    if (!a || a->base != dptr || a->kind != MemoryKind::kDevice) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not the start of a device allocation", dptr);
    }
    // The application holds it no more; its memory is the pool's until the
    // stream reaches the free (work queued before may still use it).
    if (a->pool != 0) d.pools().uncharge(a->pool, a->size);
    return ref.context->submit(ref.stream, [&d, dptr] { return d.freeDevice(dptr, false); })
        .status();
  });
}

// A device location: pools of host memory are not served by vgpu.
Result<int> deviceOf(Driver& d, const CUmemLocation* location) {
  RETURN_IF_ERROR(requireNonNull(location, "location"));
  if (location->type == CU_MEM_LOCATION_TYPE_HOST || location->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
      location->type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
    return cuError(CUDA_ERROR_NOT_SUPPORTED, "vgpu has no memory pools of host memory");
  }
  if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "location type {} is not a device", static_cast<int>(location->type));
  }
  RETURN_IF_ERROR(d.checkDevice(location->id));
  return location->id;
}

Status pinnedType(CUmemAllocationType type) {
  if (type == CU_MEM_ALLOCATION_TYPE_MANAGED) return cuError(CUDA_ERROR_NOT_SUPPORTED, "vgpu has no managed memory pools");
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "allocation type {} is invalid", static_cast<int>(type));
  }
  return Status::ok();
}

}  // namespace

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return allocAsync(__func__, dptr, bytesize, hStream, false);
}
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return allocAsync(__func__, dptr, bytesize, hStream, true);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  return allocFromPool(__func__, dptr, bytesize, pool, hStream, false);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream) {
  return allocFromPool(__func__, dptr, bytesize, pool, hStream, true);
}
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return freeAsync(__func__, dptr, hStream, false); }
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return freeAsync(__func__, dptr, hStream, true);
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pool_out, "pool_out"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    *pool_out = handleOf<CUmemoryPool>(d.pools().defaultPool(dev));
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pool, "pool"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    *pool = handleOf<CUmemoryPool>(d.pools().currentPool(dev));
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(d.checkDevice(dev));
    return d.pools().setCurrent(dev, poolId(pool));
  });
}

CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool* pool_out, CUmemLocation* location, CUmemAllocationType type) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pool_out, "pool_out"));
    RETURN_IF_ERROR(pinnedType(type));
    ASSIGN_OR_RETURN(int device, deviceOf(d, location));
    *pool_out = handleOf<CUmemoryPool>(d.pools().defaultPool(device));
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pool, "pool"));
    RETURN_IF_ERROR(pinnedType(type));
    ASSIGN_OR_RETURN(int device, deviceOf(d, location));
    *pool = handleOf<CUmemoryPool>(d.pools().currentPool(device));
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(pinnedType(type));
    ASSIGN_OR_RETURN(int device, deviceOf(d, location));
    return d.pools().setCurrent(device, poolId(pool));
  });
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pool, "pool"));
    RETURN_IF_ERROR(requireNonNull(poolProps, "poolProps"));
    RETURN_IF_ERROR(pinnedType(poolProps->allocType));
    if (poolProps->handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
      return cuError(CUDA_ERROR_NOT_SUPPORTED, "vgpu's pools export no shareable handles");
    }
    // "In all other cases, this field is required to be zero."
    if (poolProps->win32SecurityAttributes != nullptr) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "win32SecurityAttributes is set without a Win32 handle type");
    }
    ASSIGN_OR_RETURN(int device, deviceOf(d, &poolProps->location));
    *pool = handleOf<CUmemoryPool>(d.pools().create(device, poolProps->maxSize));
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  return call(__func__, [&](Driver& d) -> Status { return d.pools().destroy(poolId(pool)); });
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t) {
  // Nothing is kept beyond what allocations and pending frees hold.
  return call(__func__, [&](Driver& d) -> Status { return livePool(d, pool).status(); });
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value, "value"));
    return d.pools().update(poolId(pool), [&](MemoryPool& p) -> Status {
      switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
          p.reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *static_cast<int*>(value);
          return Status::ok();
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
          p.releaseThreshold = *static_cast<cuuint64_t*>(value);
          return Status::ok();
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
          // "It is illegal to set this attribute to a non-zero value": it resets the watermark.
          if (*static_cast<cuuint64_t*>(value) != 0) {
            return cuError(CUDA_ERROR_INVALID_VALUE, "high watermarks can only be reset to 0");
          }
          if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
            p.usedHigh = p.used;
          } else {
            p.reservedHigh = p.reserved;
          }
          return Status::ok();
        default:
          return cuErrorf(CUDA_ERROR_INVALID_VALUE, "pool attribute {} cannot be set", static_cast<int>(attr));
      }
    });
  });
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value, "value"));
    ASSIGN_OR_RETURN(MemoryPool p, livePool(d, pool));
    auto bytes = [&](std::uint64_t v) { *static_cast<cuuint64_t*>(value) = v; };
    switch (attr) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *static_cast<int*>(value) = p.reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        return Status::ok();
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: bytes(p.releaseThreshold); return Status::ok();
      case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: bytes(p.reserved); return Status::ok();
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: bytes(p.reservedHigh); return Status::ok();
      case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: bytes(p.used); return Status::ok();
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH: bytes(p.usedHigh); return Status::ok();
    }
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "pool attribute {} does not exist", static_cast<int>(attr));
  });
}

// A pool's memory is its device's; vgpu maps no pool memory for peers.
CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(MemoryPool p, livePool(d, pool));
    if (count != 0) RETURN_IF_ERROR(requireNonNull(map, "map"));
    for (size_t i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(int device, deviceOf(d, &map[i].location));
      const CUmemAccess_flags flags = map[i].flags;
      if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "access flags {} are invalid", static_cast<int>(flags));
      }
      if (device == p.device) {
        if (flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
          return cuError(CUDA_ERROR_INVALID_DEVICE, "a pool's own device always has read/write access");
        }
      } else if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        return cuErrorf(CUDA_ERROR_NOT_SUPPORTED, "vgpu does not map pool memory of device {} for device {}",
                        p.device, device);
      }
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool memPool, CUmemLocation* location) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(flags, "flags"));
    ASSIGN_OR_RETURN(MemoryPool p, livePool(d, memPool));
    ASSIGN_OR_RETURN(int device, deviceOf(d, location));
    *flags = device == p.device ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return Status::ok();
  });
}
