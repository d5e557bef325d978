// SPDX-License-Identifier: Apache-2.0
// Server hooks for memory the session owns: device memory from its heap at
// addresses a restore can give back, stream-ordered allocations, pinned host
// memory shared with the application, and what pointer attributes say of them.
#include <cuda.h>

#include <cstring>

#include "phos/common/log.h"
#include "phos/cuda_api/server_hooks.h"
#include "session.h"

namespace phos::daemon::hooks {
namespace {

// A free ends a buffer's contents: for the protocols, a write of all of it.
void passFreeGate(Session& s, uint64_t address) {
  const Allocation* a = s.findAllocation(address);
  if (a != nullptr && a->address == address) s.passGate({.writes = {{a->address, a->bytes}}, .ends = true});
}

CUresult hostAlloc(ServerCall& c, size_t bytes, unsigned flags, uint64_t* address, uint64_t* mapped,
                   std::string* path) {
  const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if ((flags & ~known) != 0 || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (c.session().currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  auto range = c.session().createPinned(bytes, flags);
  if (!range.isOk()) {
    log::get("daemon")->warn("session {}: {}", c.session().id(), range.status().message());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Registered with the driver so that copies from it are asynchronous and
  // kernels may use it (it is mapped: unified addressing).
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
bool ownsPointer(Session& s, CUdeviceptr p) { return s.findAllocation(p) != nullptr || s.findPinned(p) != nullptr; }

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

// Driver objects in a value become what the application may hold.
void virtualizePointerAttribute(Session& s, CUpointer_attribute attribute, std::byte* value, CUdeviceptr p) {
  if (const Allocation* a = s.findAllocation(p); a != nullptr && a->module == nullptr) {
    if (heapAllocationAttribute(*a, attribute, value)) return;
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
    // Memory pools are not remoted: the application cannot hold one.
    std::memset(value, 0, sizeof(CUmemoryPool));
  }
}

}  // namespace

CUresult cuMemAlloc(ServerCall& c, CUdeviceptr* dptr, size_t bytesize) {
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  Session& s = c.session();
  if (s.currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  const int device = s.currentDevice();
  CUresult r = s.allocateDevice(device, bytesize, dptr);
  if (r == CUDA_SUCCESS) s.addAllocation({*dptr, bytesize, s.currentContext(), nullptr, device});
  return r;
}

// The driver chooses the pitch (and checks the arguments): asked with a
// throw-away allocation, then the memory comes from the heap.
CUresult cuMemAllocPitch(ServerCall& c, CUdeviceptr* dptr, size_t* pPitch, size_t width, size_t height,
                         unsigned int element) {
  if (dptr == nullptr || pPitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
  s.addAllocation({*dptr, pitch * height, s.currentContext(), nullptr, device});
  *pPitch = pitch;
  return CUDA_SUCCESS;
}

CUresult cuMemFree(ServerCall& c, CUdeviceptr dptr) {
  // 0 frees nothing and succeeds, as on NVIDIA's driver (cudaFree(0)).
  if (dptr == 0) return CUDA_SUCCESS;
  passFreeGate(c.session(), dptr);
  return c.session().freeDevice(dptr);
}

// Recorded when enqueued: work the application enqueues later may name it,
// and the stream orders that work after the allocation.
CUresult cuMemAllocAsync(ServerCall& c, CUdeviceptr* dptr, size_t bytesize, Handle<CUstream> hStream) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_DRIVER(c.driverTable(), MemAllocAsync)(dptr, bytesize, hStream.real);
  if (r == CUDA_SUCCESS) c.session().addAllocation({*dptr, bytesize, c.session().currentContext()});
  return r;
}

CUresult cuMemFreeAsync(ServerCall& c, CUdeviceptr dptr, Handle<CUstream> hStream) {
  const Allocation* a = c.session().findAllocation(dptr);
  if (a == nullptr || a->address != dptr || a->module != nullptr) return CUDA_ERROR_INVALID_VALUE;
  passFreeGate(c.session(), dptr);
  CUresult r = PHOS_DRIVER(c.driverTable(), MemFreeAsync)(dptr, hStream.real);
  if (r == CUDA_SUCCESS) c.session().removeAllocation(dptr);
  return r;
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
  const PinnedRange* range = c.session().findPinned(p);
  if (range == nullptr || range->address != p) return CUDA_ERROR_INVALID_VALUE;
  // Work that still reads it must finish first (as cuMemFreeHost does).
  PHOS_DRIVER(c.driverTable(), CtxSynchronize)();
  c.session().unregisterPinned(*range);
  (void)c.session().freePinned(p);
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(ServerCall& c, CUdeviceptr* pdptr, uint64_t p, unsigned int flags) {
  if (pdptr == nullptr || flags != 0 || c.session().findPinned(p) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return PHOS_DRIVER(c.driverTable(), MemHostGetDevicePointer_v2)(pdptr, reinterpret_cast<void*>(p), 0);
}

CUresult cuMemHostGetFlags(ServerCall& c, unsigned int* pFlags, uint64_t p) {
  if (pFlags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const PinnedRange* range = c.session().findPinned(p);
  if (range == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // With unified addressing every page-locked allocation is mapped: the
  // driver reports DEVICEMAP whether or not it was asked for.
  *pFlags = range->flags | CU_MEMHOSTALLOC_DEVICEMAP;
  return CUDA_SUCCESS;
}

// The session's own allocations answer with the range the application asked
// for (the driver would give the heap's mapping, rounded to its granularity).
CUresult cuMemGetAddressRange(ServerCall& c, CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  if (!c.checkDevicePointer(dptr)) return CUDA_ERROR_NOT_FOUND;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = CUDA_SUCCESS;
  if (const Allocation* a = c.session().findAllocation(dptr); a != nullptr && a->module == nullptr) {
    base = a->address;
    size = a->bytes;
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
  if (numAttributes == 0 || numAttributes > kMaxAttributes) return CUDA_ERROR_INVALID_VALUE;
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
