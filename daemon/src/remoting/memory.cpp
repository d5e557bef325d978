// SPDX-License-Identifier: Apache-2.0
// Server hooks for memory the session owns: device memory from its heap at
// addresses a restore can give back, stream-ordered allocations, pinned host
// memory shared with the application, and what pointer attributes say of them.
#include <cuda.h>

#include <cstring>

#include "phos/common/ipc/value_sizes.h"
#include "phos/common/log.h"
#include "phos/cuda_api/server_hooks.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

// A free ends a buffer's contents: for the protocols, a write of all of it.
void passFreeGate(Session& s, uint64_t address) {
  const Allocation* a = s.memory().find(address);
  if (a != nullptr && a->address == address) s.passGate({.writes = {{a->address, a->bytes}}, .ends = true});
}

// A range of pinned memory (managed: cuMemAllocManaged's), registered with the
// driver so that copies from it are asynchronous and kernels may use it (it
// is mapped: unified addressing).
CUresult pinnedAlloc(ServerCall& c, size_t bytes, unsigned flags, bool managed, uint64_t* address,
                     uint64_t* mapped, std::string* path) {
  if (c.session().currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  auto range = c.session().createPinned(bytes, flags, managed);
  if (!range.isOk()) {
    log::get("daemon")->warn("session {}: {}", c.session().id(), range.status().message());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult r = PHOS_DRIVER(c.driverTable(), MemHostRegister_v2)(reinterpret_cast<void*>(range->address), range->mapped,
                                                                CU_MEMHOSTREGISTER_PORTABLE |
                                                                    CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r != CUDA_SUCCESS) {
    (void)c.session().freePinned(range->address);
    return r;
  }
  *address = range->address;
  *mapped = range->mapped;
  *path = range->path;
  return CUDA_SUCCESS;
}

CUresult hostAlloc(ServerCall& c, size_t bytes, unsigned flags, uint64_t* address, uint64_t* mapped,
                   std::string* path) {
  const unsigned known =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if ((flags & ~known) != 0 || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (auto refused = c.refuseUnsafeInCapture()) return *refused;
  return pinnedAlloc(c, bytes, flags, false, address, mapped, path);
}

// Pinned memory of the session that cuMemAllocHost or cuMemHostAlloc made
// (not managed memory, which answers as device memory, nor the application's
// memory it registered).
const PinnedRange* hostAllocated(Session& s, uint64_t p) {
  const PinnedRange* range = s.findPinned(p);
  return range != nullptr && !range->managed && range->registered == 0 ? range : nullptr;
}

// The managed allocation [p, p+bytes) lies in, or null.
const PinnedRange* managedRange(Session& s, uint64_t p, size_t bytes) {
  const PinnedRange* range = s.findPinned(p);
  if (range == nullptr || !range->managed || bytes > range->bytes - (p - range->address)) {
    return nullptr;
  }
  return range;
}

// The size of a pointer attribute's value as the driver writes it (0: no such attribute).
size_t pointerAttributeBytes(CUpointer_attribute attribute) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      return sizeof(CUmemoryPool);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      return sizeof(void*);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      return sizeof(int);
    default:
      return 0;
  }
}

// The session's own memory; anything else is unknown memory to it.
bool ownsPointer(Session& s, CUdeviceptr p) { return s.memory().find(p) != nullptr || s.findPinned(p) != nullptr; }

// Memory from the session's heap is a VMM mapping to the driver, but the
// application allocated it with cuMemAlloc: it answers as such memory does
// (owned by the context it was allocated in, its range the size asked for,
// usable with cuIpcGetMemHandle).
bool heapAllocationAttribute(const Allocation& a, CUpointer_attribute attribute, std::byte* value) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      std::memcpy(value, &a.context, sizeof(a.context));
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: {
      const CUdeviceptr start = a.address;
      std::memcpy(value, &start, sizeof(start));
      return true;
    }
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
      const size_t bytes = a.bytes;
      std::memcpy(value, &bytes, sizeof(bytes));
      return true;
    }
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: {
      const int capable = 1;
      std::memcpy(value, &capable, sizeof(capable));
      return true;
    }
    default:
      return false;
  }
}

// Managed memory is pinned memory to the driver, but the application
// allocated it with cuMemAllocManaged: it answers as managed memory does
// (device memory, managed, its range the size asked for, at the same address
// for host and device).
bool managedAttribute(const PinnedRange& r, CUpointer_attribute attribute, std::byte* value) {
  auto put = [&](auto v) { std::memcpy(value, &v, sizeof(v)); };
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put(static_cast<unsigned int>(CU_MEMORYTYPE_DEVICE));
      return true;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_MAPPED:
      put(1);
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      put(static_cast<CUdeviceptr>(r.address));
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      put(r.bytes);
      return true;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      put(0);
      return true;
    default:
      return false;
  }
}

// Driver objects in a value become what the application may hold.
void virtualizePointerAttribute(Session& s, CUpointer_attribute attribute, std::byte* value, CUdeviceptr p) {
  if (const Allocation* a = s.memory().find(p); a != nullptr && a->module == nullptr) {
    if (heapAllocationAttribute(*a, attribute, value)) return;
  }
  if (const PinnedRange* r = s.findPinned(p); r != nullptr && r->managed) {
    if (managedAttribute(*r, attribute, value)) return;
  }
  if (attribute == CU_POINTER_ATTRIBUTE_CONTEXT) {
    CUcontext real{};
    std::memcpy(&real, value, sizeof(real));
    uint64_t id = 0;
    for (const auto& [vid, ctx] : s.contexts()) {
      if (real != nullptr && ctx.real == real) id = vid;
    }
    std::memcpy(value, &id, sizeof(id));
  } else if (attribute == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) {
    // The session's pool (its handle), not the driver's: none for cuMemAlloc memory.
    const Allocation* a = s.memory().find(p);
    const uint64_t pool = a != nullptr ? a->pool : 0;
    std::memcpy(value, &pool, sizeof(pool));
  }
}

}  // namespace

CUresult cuMemAlloc(ServerCall& c, CUdeviceptr* dptr, size_t bytesize) {
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (auto refused = c.refuseUnsafeInCapture()) return *refused;
  Session& s = c.session();
  if (s.currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  const int device = s.currentDevice();
  CUresult r = s.allocateDevice(device, bytesize, dptr);
  if (r == CUDA_SUCCESS) s.memory().add({*dptr, bytesize, s.currentContext(), nullptr, device});
  return r;
}

// The driver chooses the pitch (and checks the arguments): asked with a
// throw-away allocation, then the memory comes from the heap.
CUresult cuMemAllocPitch(ServerCall& c, CUdeviceptr* dptr, size_t* pPitch, size_t width, size_t height,
                         unsigned int element) {
  if (dptr == nullptr || pPitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (auto refused = c.refuseUnsafeInCapture()) return *refused;
  Session& s = c.session();
  if (s.currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUdeviceptr probe = 0;
  size_t pitch = 0;
  CUresult r = PHOS_DRIVER(c.driverTable(), MemAllocPitch_v2)(&probe, &pitch, width, height, element);
  if (r != CUDA_SUCCESS) return r;
  PHOS_DRIVER(c.driverTable(), MemFree_v2)(probe);
  const int device = s.currentDevice();
  r = s.allocateDevice(device, pitch * height, dptr);
  if (r != CUDA_SUCCESS) return r;
  s.memory().add({*dptr, pitch * height, s.currentContext(), nullptr, device});
  *pPitch = pitch;
  return CUDA_SUCCESS;
}

CUresult cuMemFree(ServerCall& c, CUdeviceptr dptr) {
  // "If dptr is 0, no operation is performed" (as cudaFree(0)).
  if (dptr == 0) return CUDA_SUCCESS;
  if (auto refused = c.refuseUnsafeInCapture()) return *refused;
  if (const PinnedRange* range = c.session().findPinned(dptr); range != nullptr && range->managed) {
    if (range->address != dptr) return CUDA_ERROR_INVALID_VALUE;
    if (c.session().deferBehindStreamWaits(c, std::nullopt)) return CUDA_SUCCESS;
    return c.session().freePinned(dptr).isOk() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  // It waits for its device's work (Session::freeDevice): answered later
  // while a stream memory wait may hold that work.
  if (const Allocation* a = c.session().memory().find(dptr);
      a != nullptr && a->address == dptr && c.session().deferBehindStreamWaits(c, a->device)) {
    return CUDA_SUCCESS;
  }
  passFreeGate(c.session(), dptr);
  c.session().memoryPools().forget(c.session(), dptr);  // a pool's allocation freed synchronously
  return c.session().freeDevice(dptr);
}

// ---- the stream-ordered allocator (memory_pools.h) ----------------------------------

namespace {

// The device a stream's work runs on: its context's (the current one for the
// default streams).
int deviceOfStream(Session& s, uint64_t stream) {
  return s.contexts().deviceOf(s.contextOf(stream), s.currentDevice());
}

// What a pool handle stands for: the session's pool object (null for the
// NULL handle, which no pool entry point accepts).
MemoryPool* poolOf(const Handle<CUmemoryPool>& pool) { return reinterpret_cast<MemoryPool*>(pool.real); }

// A device location of the session's devices (pools live on devices only).
CUresult deviceLocation(ServerCall& c, const CUmemLocation* location, int* device) {
  if (location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (location->type == CU_MEM_LOCATION_TYPE_HOST || location->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
      location->type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
    log::get("daemon")->info("session {}: memory pools of host memory are not served", c.session().id());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  int count = 0;
  PHOS_DRIVER(c.driverTable(), DeviceGetCount)(&count);
  if (location->id < 0 || location->id >= count) return CUDA_ERROR_INVALID_DEVICE;
  *device = location->id;
  return CUDA_SUCCESS;
}

CUresult checkDevice(ServerCall& c, CUdevice dev) {
  int count = 0;
  PHOS_DRIVER(c.driverTable(), DeviceGetCount)(&count);
  return dev >= 0 && dev < count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

}  // namespace

CUresult cuMemAllocAsync(ServerCall& c, CUdeviceptr* dptr, size_t bytesize, Handle<CUstream> hStream) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Session& s = c.session();
  if (s.currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  // Captured, it would be a graph's memory node; the session's heap serves it now.
  if (auto refused = c.refuseInCapture(hStream.real)) return *refused;
  // "The allocation comes from the memory pool current to the stream's device."
  MemoryPools& pools = s.memoryPools();
  return pools.allocate(s, pools.currentPool(s, deviceOfStream(s, hStream.id)), bytesize, dptr);
}

CUresult cuMemAllocFromPoolAsync(ServerCall& c, CUdeviceptr* dptr, size_t bytesize,
                                 Handle<CUmemoryPool> pool, Handle<CUstream> hStream) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (auto refused = c.refuseInCapture(hStream.real)) return *refused;
  Session& s = c.session();
  if (s.currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (poolOf(pool) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return s.memoryPools().allocate(s, *poolOf(pool), bytesize, dptr);
}

CUresult cuMemFreeAsync(ServerCall& c, CUdeviceptr dptr, Handle<CUstream> hStream) {
  Session& s = c.session();
  if (s.currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  const Allocation* a = s.memory().find(dptr);
  if (a == nullptr || a->address != dptr || a->module != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (auto refused = c.refuseInCapture(hStream.real)) return *refused;
  passFreeGate(s, dptr);
  return s.memoryPools().freeAsync(s, dptr, hStream.real);
}

CUresult cuDeviceGetDefaultMemPool(ServerCall& c, uint64_t* pool_out, CUdevice dev) {
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = checkDevice(c, dev); r != CUDA_SUCCESS) return r;
  *pool_out = c.session().memoryPools().defaultPool(c.session(), dev).id;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(ServerCall& c, uint64_t* pool, CUdevice dev) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = checkDevice(c, dev); r != CUDA_SUCCESS) return r;
  *pool = c.session().memoryPools().currentPool(c.session(), dev).id;
  return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(ServerCall& c, CUdevice dev, Handle<CUmemoryPool> pool) {
  if (CUresult r = checkDevice(c, dev); r != CUDA_SUCCESS) return r;
  if (poolOf(pool) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return c.session().memoryPools().setCurrent(dev, *poolOf(pool));
}

// CUDA 13's forms by location and allocation type: device locations of
// pinned memory are the cuDevice*MemPool calls; managed and host pools are
// not served.
CUresult cuMemGetDefaultMemPool(ServerCall& c, uint64_t* pool_out, const CUmemLocation* location,
                                CUmemAllocationType type) {
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type == CU_MEM_ALLOCATION_TYPE_MANAGED) return CUDA_ERROR_NOT_SUPPORTED;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult r = deviceLocation(c, location, &device); r != CUDA_SUCCESS) return r;
  *pool_out = c.session().memoryPools().defaultPool(c.session(), device).id;
  return CUDA_SUCCESS;
}

CUresult cuMemGetMemPool(ServerCall& c, uint64_t* pool, const CUmemLocation* location, CUmemAllocationType type) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type == CU_MEM_ALLOCATION_TYPE_MANAGED) return CUDA_ERROR_NOT_SUPPORTED;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult r = deviceLocation(c, location, &device); r != CUDA_SUCCESS) return r;
  *pool = c.session().memoryPools().currentPool(c.session(), device).id;
  return CUDA_SUCCESS;
}

CUresult cuMemSetMemPool(ServerCall& c, const CUmemLocation* location, CUmemAllocationType type,
                         Handle<CUmemoryPool> pool) {
  if (type == CU_MEM_ALLOCATION_TYPE_MANAGED) return CUDA_ERROR_NOT_SUPPORTED;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult r = deviceLocation(c, location, &device); r != CUDA_SUCCESS) return r;
  if (poolOf(pool) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return c.session().memoryPools().setCurrent(device, *poolOf(pool));
}

CUresult cuMemPoolCreate(ServerCall& c, uint64_t* pool, const CUmemPoolProps* poolProps) {
  if (pool == nullptr || poolProps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return poolProps->allocType == CU_MEM_ALLOCATION_TYPE_MANAGED ? CUDA_ERROR_NOT_SUPPORTED
                                                                  : CUDA_ERROR_INVALID_VALUE;
  }
  // Exportable pools hand out file descriptors, which would be phosd's.
  if (poolProps->handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    log::get("daemon")->info("session {}: memory pools with shareable handles are not served", c.session().id());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (poolProps->win32SecurityAttributes != nullptr) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult r = deviceLocation(c, &poolProps->location, &device); r != CUDA_SUCCESS) return r;
  *pool = c.session().memoryPools().create(c.session(), device, poolProps->maxSize).id;
  return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(ServerCall& c, Handle<CUmemoryPool> pool) {
  if (poolOf(pool) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return c.session().memoryPools().destroy(c.session(), *poolOf(pool));
}

CUresult cuMemPoolTrimTo(ServerCall& c, Handle<CUmemoryPool> pool, size_t) {
  // Nothing is kept beyond completed frees: trimming returns those.
  if (poolOf(pool) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  c.session().memoryPools().reap(c.session(), false, poolOf(pool));
  return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(ServerCall&, Handle<CUmemoryPool> pool, CUmemPool_attribute attr,
                               std::span<const std::byte> value) {
  if (value.size() != ipc::valueBytes(attr) || value.empty() || poolOf(pool) == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  MemoryPool& p = *poolOf(pool);
  int flag = 0;
  uint64_t bytes = 0;
  if (value.size() == sizeof(int)) std::memcpy(&flag, value.data(), sizeof(flag));
  if (value.size() == sizeof(uint64_t)) std::memcpy(&bytes, value.data(), sizeof(bytes));
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p.followEventDependencies = flag; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p.allowOpportunistic = flag; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p.allowInternalDependencies = flag; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p.releaseThreshold = bytes; return CUDA_SUCCESS;
    // "It is illegal to set this attribute to a non-zero value": resets the high watermark.
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (bytes != 0) return CUDA_ERROR_INVALID_VALUE;
      p.reservedHigh = p.reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (bytes != 0) return CUDA_ERROR_INVALID_VALUE;
      p.usedHigh = p.used;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // read-only or unknown
  }
}

CUresult cuMemPoolGetAttribute(ServerCall& c, Handle<CUmemoryPool> pool, CUmemPool_attribute attr,
                               AttributeValue* value) {
  const size_t bytes = ipc::valueBytes(attr);
  if (value == nullptr || bytes == 0 || poolOf(pool) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MemoryPool& p = *poolOf(pool);
  c.session().memoryPools().reap(c.session());
  uint64_t u = 0;
  int flag = 0;
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: flag = p.followEventDependencies; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: flag = p.allowOpportunistic; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: flag = p.allowInternalDependencies; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: u = p.releaseThreshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: u = p.reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: u = p.reservedHigh; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: u = p.used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: u = p.usedHigh; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  if (bytes == sizeof(int)) {
    std::memcpy(value->bytes.data(), &flag, sizeof(flag));
  } else {
    std::memcpy(value->bytes.data(), &u, sizeof(u));
  }
  value->size = bytes;
  return CUDA_SUCCESS;
}

// Pools' memory is reachable from their own device; access from peers is not
// served yet (the session's heap maps for its device only).
CUresult cuMemPoolSetAccess(ServerCall& c, Handle<CUmemoryPool> pool,
                            std::span<const CUmemAccessDesc> map, size_t count) {
  if (poolOf(pool) == nullptr || map.size() != count) return CUDA_ERROR_INVALID_VALUE;
  MemoryPool& p = *poolOf(pool);
  for (const CUmemAccessDesc& d : map) {
    int device = 0;
    if (CUresult r = deviceLocation(c, &d.location, &device); r != CUDA_SUCCESS) return r;
    if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // "The pool's own device always has read/write access."
    if (device == p.device) {
      if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_DEVICE;
      continue;
    }
    if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      log::get("daemon")->info("session {}: access from device {} to a pool of device {} is not served",
                               c.session().id(), device, p.device);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return CUDA_SUCCESS;
}

// Graph memory: no graphs are served, so the driver's counts (0) are the session's.
CUresult cuDeviceGetGraphMemAttribute(ServerCall& c, CUdevice device, CUgraphMem_attribute attr,
                                      AttributeValue* value) {
  const size_t bytes = ipc::valueBytes(attr);
  if (value == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_DRIVER(c.driverTable(), DeviceGetGraphMemAttribute)(device, attr, value->bytes.data());
  if (r == CUDA_SUCCESS) value->size = bytes;
  return r;
}

CUresult cuDeviceSetGraphMemAttribute(ServerCall& c, CUdevice device, CUgraphMem_attribute attr,
                                      std::span<const std::byte> value) {
  if (value.size() != ipc::valueBytes(attr) || value.empty()) return CUDA_ERROR_INVALID_VALUE;
  cuuint64_t v = 0;
  std::memcpy(&v, value.data(), sizeof(v));
  return PHOS_DRIVER(c.driverTable(), DeviceSetGraphMemAttribute)(device, attr, &v);
}

CUresult cuMemPoolGetAccess(ServerCall& c, CUmemAccess_flags* flags, Handle<CUmemoryPool> pool,
                            const CUmemLocation* location) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult r = deviceLocation(c, location, &device); r != CUDA_SUCCESS) return r;
  if (poolOf(pool) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = device == poolOf(pool)->device ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost(ServerCall& c, size_t bytesize, uint64_t* address, uint64_t* mapped, std::string* path) {
  return hostAlloc(c, bytesize, 0, address, mapped, path);
}

CUresult cuMemHostAlloc(ServerCall& c, size_t bytesize, unsigned int flags, uint64_t* address, uint64_t* mapped,
                        std::string* path) {
  return hostAlloc(c, bytesize, flags, address, mapped, path);
}

CUresult cuMemFreeHost(ServerCall& c, uint64_t p) {
  if (p == 0) return CUDA_SUCCESS;  // free(NULL) semantics, as NVIDIA's driver
  if (auto refused = c.refuseUnsafeInCapture()) return *refused;
  const PinnedRange* range = hostAllocated(c.session(), p);
  if (range == nullptr || range->address != p) return CUDA_ERROR_INVALID_VALUE;
  if (c.session().deferBehindStreamWaits(c, std::nullopt)) return CUDA_SUCCESS;
  (void)c.session().freePinned(p);
  return CUDA_SUCCESS;
}

// The application's memory, registered: its pages become a file phosd maps at
// their address and the shim maps over them with their bytes (its epilogue),
// so that the pointer means the same memory in phosd, in the driver and in the
// application (docs/remoting.md).
CUresult cuMemHostRegister(ServerCall& c, uint64_t p, size_t bytesize, unsigned int Flags,
                           uint64_t* address, uint64_t* mapped, std::string* path) {
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (p == 0 || bytesize == 0 || (Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  Session& s = c.session();
  if ((Flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) {
    // Device memory of another PCIe device: it is no file phosd could share.
    log::get("daemon")->info("session {}: cuMemHostRegister of I/O memory is not served", s.id());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (s.currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (auto refused = c.refuseUnsafeInCapture()) return *refused;
  auto range = s.createRegistered(p, bytesize, Flags);
  if (!range.isOk()) {
    log::get("daemon")->info("session {}: {}", s.id(), range.status().message());
    switch (range.status().code()) {
      case Code::kAlreadyExists:
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
      case Code::kNotSupported:
        return CUDA_ERROR_NOT_SUPPORTED;
      case Code::kResourceExhausted:
        return CUDA_ERROR_OUT_OF_MEMORY;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  CUresult r = PHOS_DRIVER(c.driverTable(), MemHostRegister_v2)(reinterpret_cast<void*>(p),
                                                                bytesize, registrationFlags(Flags));
  if (r != CUDA_SUCCESS) {
    (void)s.freePinned(range->address);
    return r;
  }
  *address = range->address;
  *mapped = range->mapped;
  *path = range->path;
  return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(ServerCall& c, uint64_t p) {
  if (p == 0) return CUDA_ERROR_INVALID_VALUE;
  if (auto refused = c.refuseUnsafeInCapture()) return *refused;
  const PinnedRange* range = c.session().findRegistered(p);
  if (range == nullptr) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  if (c.session().deferBehindStreamWaits(c, std::nullopt)) return CUDA_SUCCESS;
  (void)c.session().freePinned(range->address);
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(ServerCall& c, CUdeviceptr* pdptr, uint64_t p, unsigned int flags) {
  const PinnedRange* range = c.session().findPinned(p);
  if (pdptr == nullptr || flags != 0 || range == nullptr || range->managed) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return PHOS_DRIVER(c.driverTable(), MemHostGetDevicePointer_v2)(pdptr, reinterpret_cast<void*>(p), 0);
}

CUresult cuMemHostGetFlags(ServerCall& c, unsigned int* pFlags, uint64_t p) {
  if (pFlags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const PinnedRange* range = hostAllocated(c.session(), p);
  if (range == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // With unified addressing every page-locked allocation is mapped: the
  // driver reports DEVICEMAP whether or not it was asked for.
  *pFlags = range->flags | CU_MEMHOSTALLOC_DEVICEMAP;
  return CUDA_SUCCESS;
}

// ---- managed memory -----------------------------------------------------------------
// Served as pinned memory (docs/remoting.md): shared host memory mapped in the
// application and registered with the driver, which every device reads in
// place and the host may use while kernels run. The shim keeps the advice and
// prefetch locations (phos/common/managed_advice.h).

CUresult cuMemAllocManaged(ServerCall& c, size_t bytesize, unsigned int flags, uint64_t* address,
                           uint64_t* mapped, std::string* path) {
  if (bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return pinnedAlloc(c, bytesize, flags, true, address, mapped, path);
}

// "Prefetches memory to the specified destination location": the memory is
// where every processor reads it already, so nothing is enqueued; the shim
// records the location (its epilogue) once the range and stream are checked.
CUresult cuMemPrefetchAsync(ServerCall& c, CUdeviceptr devPtr, size_t count, CUmemLocation,
                            unsigned int flags, Handle<CUstream>) {
  if (flags != 0 || count == 0 || managedRange(c.session(), devPtr, count) == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// The legacy form: a device ordinal, or CU_DEVICE_CPU for the host.
CUresult cuMemPrefetchAsync(ServerCall& c, CUdeviceptr devPtr, size_t count, CUdevice,
                            Handle<CUstream> hStream) {
  return cuMemPrefetchAsync(c, devPtr, count, CUmemLocation{}, 0, hStream);
}

CUresult cuStreamAttachMemAsync(ServerCall& c, Handle<CUstream> hStream, CUdeviceptr dptr,
                                size_t length, unsigned int flags) {
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST &&
      flags != CU_MEM_ATTACH_SINGLE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // "It is illegal to attach singly to the NULL stream" (or another default one).
  const bool defaultStream = hStream.id == 0 ||
                             hStream.id == reinterpret_cast<uint64_t>(CU_STREAM_LEGACY) ||
                             hStream.id == reinterpret_cast<uint64_t>(CU_STREAM_PER_THREAD);
  if (flags == CU_MEM_ATTACH_SINGLE && defaultStream) return CUDA_ERROR_INVALID_VALUE;
  // "length must be either zero or the entire allocation's size".
  const PinnedRange* range = managedRange(c.session(), dptr, 1);
  if (range == nullptr || range->address != dptr || (length != 0 && length != range->bytes)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;  // every device and the host may access it at any time
}

// Managed memory is served on every device (as pinned memory); memory the
// application did not allocate through CUDA is not (the daemon cannot reach
// it), whatever the driver says of pageable memory.
CUresult cuDeviceGetAttribute(ServerCall& c, int* pi, CUdevice_attribute attrib, CUdevice dev) {
  CUresult r = PHOS_DRIVER(c.driverTable(), DeviceGetAttribute)(pi, attrib, dev);
  if (r != CUDA_SUCCESS || pi == nullptr) return r;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST:
      *pi = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
      *pi = 0;
      break;
    default:
      break;
  }
  return r;
}

// The session's own allocations and managed memory answer with the range the
// application asked for (the driver would give the heap's mapping, rounded to
// its granularity, or the pinned range's pages).
CUresult cuMemGetAddressRange(ServerCall& c, CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  if (!c.checkDevicePointer(dptr)) return CUDA_ERROR_NOT_FOUND;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = CUDA_SUCCESS;
  if (const Allocation* a = c.session().memory().find(dptr); a != nullptr && a->module == nullptr) {
    base = a->address;
    size = a->bytes;
  } else if (const PinnedRange* m = c.session().findPinned(dptr); m != nullptr && m->managed) {
    base = m->address;
    size = m->bytes;
  } else {
    r = PHOS_DRIVER(c.driverTable(), MemGetAddressRange_v2)(&base, &size, dptr);
  }
  if (pbase != nullptr) *pbase = base;
  if (psize != nullptr) *psize = size;
  return r;
}

CUresult cuPointerGetAttribute(ServerCall& c, AttributeValue* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  const size_t bytes = pointerAttributeBytes(attribute);
  if (data == nullptr || bytes == 0 || !ownsPointer(c.session(), ptr)) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_DRIVER(c.driverTable(), PointerGetAttribute)(data->bytes.data(), attribute, ptr);
  if (r != CUDA_SUCCESS) return r;
  virtualizePointerAttribute(c.session(), attribute, data->bytes.data(), ptr);
  data->size = bytes;
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttributes(ServerCall& c, unsigned int numAttributes,
                                std::span<const CUpointer_attribute> attributes, std::span<AttributeValue> data,
                                CUdeviceptr ptr) {
  constexpr unsigned kMaxAttributes = 64;
  if (numAttributes == 0 || numAttributes > kMaxAttributes || attributes.size() != numAttributes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<void*> slots(numAttributes);
  for (unsigned i = 0; i < numAttributes; ++i) {
    if (pointerAttributeBytes(attributes[i]) == 0) return CUDA_ERROR_INVALID_VALUE;
    slots[i] = data[i].wanted ? data[i].bytes.data() : nullptr;
  }
  // "Unlike cuPointerGetAttribute, this function will not return an error when
  // the ptr encountered is not a valid CUDA pointer": another session's memory
  // is asked as address 0, which nothing is allocated at, so the driver's own
  // defaults for unknown memory answer.
  const CUdeviceptr asked = ownsPointer(c.session(), ptr) ? ptr : 0;
  std::vector<CUpointer_attribute> asks(attributes.begin(), attributes.end());
  CUresult r = PHOS_DRIVER(c.driverTable(), PointerGetAttributes)(numAttributes, asks.data(), slots.data(), asked);
  if (r != CUDA_SUCCESS) return r;
  for (unsigned i = 0; i < numAttributes; ++i) {
    if (!data[i].wanted) continue;
    virtualizePointerAttribute(c.session(), attributes[i], data[i].bytes.data(), asked);
    data[i].size = pointerAttributeBytes(attributes[i]);
  }
  return CUDA_SUCCESS;
}

// "The only attribute supported is CU_POINTER_ATTRIBUTE_SYNC_MEMOPS".
CUresult cuPointerSetAttribute(ServerCall& c, const unsigned int* value, CUpointer_attribute attribute,
                               CUdeviceptr ptr) {
  if (value == nullptr || !ownsPointer(c.session(), ptr) || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  unsigned int v = *value;
  return PHOS_DRIVER(c.driverTable(), PointerSetAttribute)(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ptr);
}

}  // namespace phos::daemon::hooks
