// SPDX-License-Identifier: Apache-2.0
// Entry points: device and host allocations, copies and sets in every form, pointer attributes.
#include <array>
#include <cstring>
#include <map>
#include <mutex>

#include "entry.h"
#include "phos/common/memcpy3d_peer.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::requireNonNull;

// The per-thread-default-stream variants cuda.h declares only under
// CUDA_API_PER_THREAD_DEFAULT_STREAM.
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                                  CUcontext srcContext, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext,
                                                       CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount,
                                                       CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                                          CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                                          CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                                          size_t ByteCount, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D* pCopy);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D* pCopy);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D* pCopy, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D* pCopy);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D* pCopy, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER* pCopy);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER* pCopy, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD2D8_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                                     size_t Width, size_t Height);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD2D16_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
                                                      size_t Width, size_t Height);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD2D32_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                                      size_t Width, size_t Height);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                                     CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                                      CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                                      CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD2D8Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                                       size_t Width, size_t Height, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD2D16Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
                                                        size_t Width, size_t Height, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemsetD2D32Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                                        size_t Width, size_t Height, CUstream hStream);

namespace {

// --- allocation --------------------------------------------------------------------

CUresult memAlloc(CUdeviceptr* dptr, size_t bytesize) {
  return call("cuMemAlloc", [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(dptr, "dptr"));
    RETURN_IF_ERROR(d.checkUnsafeCall("cuMemAlloc"));
    ASSIGN_OR_RETURN(auto context, d.current());
    ASSIGN_OR_RETURN(std::uint64_t address, d.allocateDevice(*context, bytesize));
    *dptr = address;
    return Status::ok();
  });
}

// --- copies ----------------------------------------------------------------------------

CUresult copy1D(const char* name, std::uint64_t dst, std::uint64_t src, size_t bytes, CUstream stream, bool perThread,
                bool async, bool dstDevice, bool srcDevice) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(stream, perThread));
    return d.copy(ref, dst, src, bytes, async, dstDevice, srcDevice);
  });
}

// The address of (x, y, z) in one side of a 2D/3D copy.
struct CopySide {
  CUmemorytype type;
  std::uint64_t base;
  size_t x, y, z, pitch, height;
};

Result<std::uint64_t> sideBase(CUmemorytype type, const void* host, CUdeviceptr device, CUarray array,
                               const char* which) {
  switch (type) {
    case CU_MEMORYTYPE_HOST:
      if (host == nullptr) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} host pointer is null", which);
      return reinterpret_cast<std::uint64_t>(host);
    case CU_MEMORYTYPE_DEVICE:
    case CU_MEMORYTYPE_UNIFIED:
      if (device == 0) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} device pointer is null", which);
      return device;
    case CU_MEMORYTYPE_ARRAY:
      if (array == nullptr) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} array is null", which);
      return 0;  // the array's memory: resolveArray
  }
  return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} memory type {} is invalid", which, static_cast<int>(type));
}

// An array side of a copy: its memory, rows of its width, the copy inside it.
Status resolveArray(Driver& d, CopySide& side, CUarray handle, size_t width, size_t height,
                    size_t depth, const char* which) {
  if (side.type != CU_MEMORYTYPE_ARRAY) return Status::ok();
  auto array =
      d.arrays().find(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle)));
  if (array == nullptr) {
    return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "{} array does not exist", which);
  }
  if (side.x + width > array->rowBytes || side.y + height > array->rows ||
      side.z + depth > array->slices) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "{}: {} bytes x {} rows x {} slices at ({}, {}, {}) do not fit its array of {} "
                    "bytes x {} x {}",
                    which, width, height, depth, side.x, side.y, side.z, array->rowBytes,
                    array->rows, array->slices);
  }
  side.type = CU_MEMORYTYPE_DEVICE;
  side.base = array->address;
  side.pitch = array->rowBytes;
  side.height = array->rows;
  return Status::ok();
}

Status copy3D(Driver& d, const StreamRef& ref, const CopySide& src, const CopySide& dst, size_t width,
              size_t height, size_t depth, bool async) {
  if (width == 0 || height == 0 || depth == 0) return Status::ok();
  if ((height > 1 || depth > 1) && (src.pitch < src.x + width || dst.pitch < dst.x + width)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "pitches {} (source) and {} (destination) are smaller than a row",
                    src.pitch, dst.pitch);
  }
  if (depth > 1 && (src.height < src.y + height || dst.height < dst.y + height)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "heights {} (source) and {} (destination) are smaller than the copy",
                    src.height, dst.height);
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> rows;
  rows.reserve(height * depth);
  for (size_t z = 0; z < depth; ++z) {
    for (size_t y = 0; y < height; ++y) {
      std::uint64_t s = src.base + ((src.z + z) * src.height + src.y + y) * src.pitch + src.x;
      std::uint64_t t = dst.base + ((dst.z + z) * dst.height + dst.y + y) * dst.pitch + dst.x;
      rows.emplace_back(t, s);
    }
  }
  CUDA_MEMCPY3D described{};
  described.srcXInBytes = src.x;
  described.srcY = src.y;
  described.srcZ = src.z;
  described.srcMemoryType = src.type;
  if (src.type == CU_MEMORYTYPE_HOST) {
    described.srcHost = reinterpret_cast<const void*>(src.base);
  } else {
    described.srcDevice = src.base;
  }
  described.srcPitch = src.pitch;
  described.srcHeight = src.height;
  described.dstXInBytes = dst.x;
  described.dstY = dst.y;
  described.dstZ = dst.z;
  described.dstMemoryType = dst.type;
  if (dst.type == CU_MEMORYTYPE_HOST) {
    described.dstHost = reinterpret_cast<void*>(dst.base);
  } else {
    described.dstDevice = dst.base;
  }
  described.dstPitch = dst.pitch;
  described.dstHeight = dst.height;
  described.WidthInBytes = width;
  described.Height = height;
  described.Depth = depth;
  return d.copyRows(ref, described, std::move(rows), width, async);
}

CUresult memcpy2D(const char* name, const CUDA_MEMCPY2D* p, CUstream stream, bool perThread, bool async) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(p, "pCopy"));
    ASSIGN_OR_RETURN(std::uint64_t srcBase, sideBase(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcArray, "source"));
    ASSIGN_OR_RETURN(std::uint64_t dstBase, sideBase(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstArray, "destination"));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(stream, perThread));
    CopySide src{p->srcMemoryType, srcBase, p->srcXInBytes, p->srcY, 0, p->srcPitch, p->srcY + p->Height};
    CopySide dst{p->dstMemoryType, dstBase, p->dstXInBytes, p->dstY, 0, p->dstPitch, p->dstY + p->Height};
    RETURN_IF_ERROR(resolveArray(d, src, p->srcArray, p->WidthInBytes, p->Height, 1, "source"));
    RETURN_IF_ERROR(
        resolveArray(d, dst, p->dstArray, p->WidthInBytes, p->Height, 1, "destination"));
    if (p->Height <= 1) {
      src.pitch = std::max(src.pitch, src.x + p->WidthInBytes);
      dst.pitch = std::max(dst.pitch, dst.x + p->WidthInBytes);
    }
    return copy3D(d, ref, src, dst, p->WidthInBytes, p->Height, 1, async);
  });
}

CUresult memcpy3D(const char* name, const CUDA_MEMCPY3D* p, CUstream stream, bool perThread, bool async) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(p, "pCopy"));
    // "reserved0/reserved1: Must be NULL"; "srcLOD and dstLOD members ... must be set to 0".
    if (p->reserved0 != nullptr || p->reserved1 != nullptr || p->srcLOD != 0 || p->dstLOD != 0) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "reserved fields and LODs of CUDA_MEMCPY3D must be 0");
    }
    ASSIGN_OR_RETURN(std::uint64_t srcBase, sideBase(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcArray, "source"));
    ASSIGN_OR_RETURN(std::uint64_t dstBase, sideBase(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstArray, "destination"));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(stream, perThread));
    CopySide src{p->srcMemoryType, srcBase, p->srcXInBytes, p->srcY, p->srcZ, p->srcPitch, p->srcHeight};
    CopySide dst{p->dstMemoryType, dstBase, p->dstXInBytes, p->dstY, p->dstZ, p->dstPitch, p->dstHeight};
    RETURN_IF_ERROR(
        resolveArray(d, src, p->srcArray, p->WidthInBytes, p->Height, p->Depth, "source"));
    RETURN_IF_ERROR(
        resolveArray(d, dst, p->dstArray, p->WidthInBytes, p->Height, p->Depth, "destination"));
    // "srcHeight ... may be 0 if Depth==1".
    if (p->Depth == 1) {
      src.height = std::max(src.height, src.y + p->Height);
      dst.height = std::max(dst.height, dst.y + p->Height);
    }
    if (p->Height <= 1 && p->Depth <= 1) {
      src.pitch = std::max(src.pitch, src.x + p->WidthInBytes);
      dst.pitch = std::max(dst.pitch, dst.x + p->WidthInBytes);
    }
    return copy3D(d, ref, src, dst, p->WidthInBytes, p->Height, p->Depth, async);
  });
}

CUresult memcpyPeer(const char* name, CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src, CUcontext srcContext,
                    size_t bytes, CUstream stream, bool perThread, bool async) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto dc, d.context(dstContext));
    ASSIGN_OR_RETURN(auto sc, d.context(srcContext));
    (void)dc;
    (void)sc;
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(stream, perThread));
    return d.copy(ref, dst, src, bytes, async, true, true);
  });
}

// A 3D copy between contexts: both must be live; the rest is a 3D copy's
// (memory is one address space on vgpu, as with unified addressing).
CUresult memcpy3DPeer(const char* name, const CUDA_MEMCPY3D_PEER* p, CUstream stream,
                      bool perThread, bool async) {
  if (p == nullptr) return memcpy3D(name, nullptr, stream, perThread, async);
  CUresult contexts = call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto dc, d.context(p->dstContext));
    ASSIGN_OR_RETURN(auto sc, d.context(p->srcContext));
    (void)dc;
    (void)sc;
    return Status::ok();
  });
  if (contexts != CUDA_SUCCESS) return contexts;
  const CUDA_MEMCPY3D copy = memcpy3d_peer::withoutContexts(*p);
  return memcpy3D(name, &copy, stream, perThread, async);
}

// --- sets ---------------------------------------------------------------------------------

CUresult memset2D(const char* name, CUdeviceptr dst, size_t pitch, std::uint32_t value, unsigned elementSize,
                  size_t width, size_t height, CUstream stream, bool perThread, bool async) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(stream, perThread));
    return d.memset(ref, dst, height <= 1 ? width * elementSize : pitch, value, elementSize, width, height, async);
  });
}

// --- pointer attributes --------------------------------------------------------------------

// Writes one attribute of the allocation `a` (null: memory vgpu does not know).
Status pointerAttribute(Driver& d, void* data, CUpointer_attribute attribute, std::uint64_t ptr,
                        const std::optional<Allocation>& a) {
  const bool device = a && (a->kind == MemoryKind::kDevice || a->kind == MemoryKind::kVmmMapping);
  auto put = [&](auto value) { std::memcpy(data, &value, sizeof(value)); };
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      put(a && a->context != 0 ? api::handleOf<CUcontext>(a->context) : CUcontext{nullptr});
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put(static_cast<unsigned int>(!a ? 0 : device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      // Unified addressing: host and device see the same address.
      if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_POINTER) {
        put(static_cast<CUdeviceptr>(a ? ptr : 0));
      } else {
        put(a ? reinterpret_cast<void*>(ptr) : nullptr);
      }
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      put(static_cast<int>(1));  // vgpu's synchronous copies always are
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      put(static_cast<unsigned long long>(a ? a->bufferId : 0));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      put(static_cast<int>(a && a->managed ? 1 : 0));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      put(static_cast<int>(0));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: {
      int ordinal = -2;  // "invalid" for unknown memory, as NVIDIA's driver reports
      if (a) {
        if (a->device >= 0) {
          ordinal = a->device;
        } else if (auto owner = d.context(api::handleOf<CUcontext>(a->context)); owner.isOk()) {
          ordinal = (*owner)->device();
        } else {
          ordinal = 0;
        }
      }
      put(ordinal);
      return Status::ok();
    }
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      put(static_cast<CUdeviceptr>(a ? a->base : 0));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      put(static_cast<size_t>(a ? a->size : 0));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_MAPPED:
      put(static_cast<int>(a ? 1 : 0));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      put(static_cast<unsigned long long>(CU_MEM_HANDLE_TYPE_NONE));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: {
      unsigned flags = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
      if (a) {
        auto current = d.currentOrNull();
        bool accessible = current && d.isAccessible(*current, ptr, 1);
        if (accessible) {
          flags = a->readOnlyAccess ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        }
      }
      put(flags);
      return Status::ok();
    }
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      // The pool of a stream-ordered allocation; none for other memory.
      put(api::handleOf<CUmemoryPool>(a ? a->pool : 0));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      put(static_cast<unsigned long long>(a ? (a->kind == MemoryKind::kVmmMapping ? a->vmmHandle : a->bufferId) : 0));
      return Status::ok();
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      return cuError(CUDA_ERROR_NOT_SUPPORTED, "P2P tokens need nv-p2p.h and a real GPU");
  }
  return cuErrorf(CUDA_ERROR_INVALID_VALUE, "pointer attribute {} does not exist", static_cast<int>(attribute));
}

}  // namespace

// --- allocation entry points -----------------------------------------------------------

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) { return memAlloc(dptr, bytesize); }

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                    unsigned int ElementSizeBytes) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(dptr, "dptr"));
    RETURN_IF_ERROR(requireNonNull(pPitch, "pPitch"));
    // "ElementSizeBytes ... may be 4, 8 or 16".
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "ElementSizeBytes {} is not 4, 8 or 16", ElementSizeBytes);
    }
    if (WidthInBytes == 0 || Height == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "empty pitched allocation");
    RETURN_IF_ERROR(d.checkUnsafeCall("cuMemAllocPitch"));
    ASSIGN_OR_RETURN(auto context, d.current());
    size_t pitch = roundUp(WidthInBytes, kPitchAlignment);
    ASSIGN_OR_RETURN(std::uint64_t address, d.allocateDevice(*context, pitch * Height));
    *dptr = address;
    *pPitch = pitch;
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  return call(__func__, [&](Driver& d) -> Status {
    // NVIDIA's driver does nothing for 0 and succeeds (cudaFree(0), cublasCreate rely on it).
    if (dptr == 0) return Status::ok();
    RETURN_IF_ERROR(d.checkUnsafeCall("cuMemFree"));
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    // A pool's allocation may be freed here too: the application holds it no more.
    if (auto a = d.allocations().find(dptr); a && a->base == dptr && a->kind == MemoryKind::kDevice && a->pool != 0) {
      d.pools().uncharge(a->pool, a->size);
    }
    return d.freeDevice(dptr, true);
  });
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(free, "free"));
    RETURN_IF_ERROR(requireNonNull(total, "total"));
    ASSIGN_OR_RETURN(auto context, d.current());
    DeviceHeap& heap = d.heap(context->device());
    *total = heap.capacity();
    *free = heap.capacity() - std::min(heap.capacity(), heap.used());
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    auto a = d.allocations().find(dptr);
    if (!a || (a->kind != MemoryKind::kDevice && a->kind != MemoryKind::kVmmMapping)) {
      return cuErrorf(CUDA_ERROR_NOT_FOUND, "0x{:x} is not inside a device allocation", dptr);
    }
    // "Both parameters pbase and psize are optional".
    if (pbase != nullptr) *pbase = a->base;
    if (psize != nullptr) *psize = a->size;
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pp, "pp"));
    RETURN_IF_ERROR(d.checkUnsafeCall("cuMemHostAlloc"));
    ASSIGN_OR_RETURN(auto context, d.current());
    ASSIGN_OR_RETURN(void* p, d.allocateHost(bytesize, Flags, context->id()));
    *pp = p;
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemFreeHost(void* p) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    // NULL is a no-op that succeeds on NVIDIA's driver too (free(NULL) semantics);
    // cudaFreeHost of a zero-byte cudaMallocHost reaches it that way.
    if (p == nullptr) return Status::ok();
    RETURN_IF_ERROR(d.checkUnsafeCall("cuMemFreeHost"));
    return d.freeHost(p);
  });
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pdptr, "pdptr"));
    RETURN_IF_ERROR(requireNonNull(p, "p"));
    // "Flags provides for future releases. For now, it must be set to 0."
    if (Flags != 0) return cuError(CUDA_ERROR_INVALID_VALUE, "Flags must be 0");
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    auto a = d.allocations().find(reinterpret_cast<std::uint64_t>(p));
    if (!a || (a->kind != MemoryKind::kHostPinned && a->kind != MemoryKind::kHostRegistered)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} is not page-locked host memory", p);
    }
    *pdptr = reinterpret_cast<CUdeviceptr>(p);
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pFlags, "pFlags"));
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    auto a = d.allocations().find(reinterpret_cast<std::uint64_t>(p));
    if (!a || a->kind != MemoryKind::kHostPinned) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} was not allocated by cuMemHostAlloc", p);
    }
    *pFlags = a->hostFlags;
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    return d.registerHost(p, bytesize, Flags, context->id());
  });
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(p, "p"));
    ASSIGN_OR_RETURN(auto context, d.current());
    context->drain();  // queued copies may still read it
    return d.unregisterHost(p);
  });
}

// --- copy entry points --------------------------------------------------------------------

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return copy1D(__func__, dst, src, ByteCount, nullptr, false, false, false, false);
}
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return copy1D(__func__, dst, src, ByteCount, nullptr, true, false, false, false);
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return copy1D(__func__, dst, src, ByteCount, hStream, false, true, false, false);
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return copy1D(__func__, dst, src, ByteCount, hStream, true, true, false, false);
}
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  return copy1D(__func__, dstDevice, reinterpret_cast<std::uint64_t>(srcHost), ByteCount, nullptr, false, false, true,
                false);
}
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  return copy1D(__func__, dstDevice, reinterpret_cast<std::uint64_t>(srcHost), ByteCount, nullptr, true, false, true,
                false);
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return copy1D(__func__, reinterpret_cast<std::uint64_t>(dstHost), srcDevice, ByteCount, nullptr, false, false, false,
                true);
}
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return copy1D(__func__, reinterpret_cast<std::uint64_t>(dstHost), srcDevice, ByteCount, nullptr, true, false, false,
                true);
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return copy1D(__func__, dstDevice, srcDevice, ByteCount, nullptr, false, false, true, true);
}
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return copy1D(__func__, dstDevice, srcDevice, ByteCount, nullptr, true, false, true, true);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  return copy1D(__func__, dstDevice, reinterpret_cast<std::uint64_t>(srcHost), ByteCount, hStream, false, true, true,
                false);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                           CUstream hStream) {
  return copy1D(__func__, dstDevice, reinterpret_cast<std::uint64_t>(srcHost), ByteCount, hStream, true, true, true,
                false);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return copy1D(__func__, reinterpret_cast<std::uint64_t>(dstHost), srcDevice, ByteCount, hStream, false, true, false,
                true);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return copy1D(__func__, reinterpret_cast<std::uint64_t>(dstHost), srcDevice, ByteCount, hStream, true, true, false,
                true);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
  return copy1D(__func__, dstDevice, srcDevice, ByteCount, hStream, false, true, true, true);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                           CUstream hStream) {
  return copy1D(__func__, dstDevice, srcDevice, ByteCount, hStream, true, true, true, true);
}
CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                              size_t ByteCount) {
  return memcpyPeer(__func__, dstDevice, dstContext, srcDevice, srcContext, ByteCount, nullptr, false, false);
}
CUresult CUDAAPI cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                   CUcontext srcContext, size_t ByteCount) {
  return memcpyPeer(__func__, dstDevice, dstContext, srcDevice, srcContext, ByteCount, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                   CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  return memcpyPeer(__func__, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, false, true);
}
CUresult CUDAAPI cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                        CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  return memcpyPeer(__func__, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, true, true);
}
CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* pCopy) { return memcpy2D(__func__, pCopy, nullptr, false, false); }
CUresult CUDAAPI cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D* pCopy) {
  return memcpy2D(__func__, pCopy, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* pCopy) {
  return memcpy2D(__func__, pCopy, nullptr, false, false);
}
CUresult CUDAAPI cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D* pCopy) {
  return memcpy2D(__func__, pCopy, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  return memcpy2D(__func__, pCopy, hStream, false, true);
}
CUresult CUDAAPI cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  return memcpy2D(__func__, pCopy, hStream, true, true);
}
CUresult CUDAAPI cuMemcpy3D_v2(const CUDA_MEMCPY3D* pCopy) { return memcpy3D(__func__, pCopy, nullptr, false, false); }
CUresult CUDAAPI cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D* pCopy) {
  return memcpy3D(__func__, pCopy, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
  return memcpy3D(__func__, pCopy, hStream, false, true);
}
CUresult CUDAAPI cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
  return memcpy3D(__func__, pCopy, hStream, true, true);
}
CUresult CUDAAPI cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER* pCopy) {
  return memcpy3DPeer(__func__, pCopy, nullptr, false, false);
}
CUresult CUDAAPI cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER* pCopy) {
  return memcpy3DPeer(__func__, pCopy, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER* pCopy, CUstream hStream) {
  return memcpy3DPeer(__func__, pCopy, hStream, false, true);
}
CUresult CUDAAPI cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER* pCopy, CUstream hStream) {
  return memcpy3DPeer(__func__, pCopy, hStream, true, true);
}

// --- set entry points -----------------------------------------------------------------------

#define PHOS_VGPU_MEMSET(suffix, T, size)                                                                       \
  CUresult CUDAAPI cuMemsetD##suffix##_v2(CUdeviceptr dst, T v, size_t N) {                                      \
    return memset2D(__func__, dst, 0, v, size, N, 1, nullptr, false, false);                                     \
  }                                                                                                              \
  CUresult CUDAAPI cuMemsetD##suffix##_v2_ptds(CUdeviceptr dst, T v, size_t N) {                                 \
    return memset2D(__func__, dst, 0, v, size, N, 1, nullptr, true, false);                                      \
  }                                                                                                              \
  CUresult CUDAAPI cuMemsetD##suffix##Async(CUdeviceptr dst, T v, size_t N, CUstream s) {                        \
    return memset2D(__func__, dst, 0, v, size, N, 1, s, false, true);                                            \
  }                                                                                                              \
  CUresult CUDAAPI cuMemsetD##suffix##Async_ptsz(CUdeviceptr dst, T v, size_t N, CUstream s) {                   \
    return memset2D(__func__, dst, 0, v, size, N, 1, s, true, true);                                             \
  }                                                                                                              \
  CUresult CUDAAPI cuMemsetD2D##suffix##_v2(CUdeviceptr dst, size_t pitch, T v, size_t w, size_t h) {            \
    return memset2D(__func__, dst, pitch, v, size, w, h, nullptr, false, false);                                 \
  }                                                                                                              \
  CUresult CUDAAPI cuMemsetD2D##suffix##_v2_ptds(CUdeviceptr dst, size_t pitch, T v, size_t w, size_t h) {       \
    return memset2D(__func__, dst, pitch, v, size, w, h, nullptr, true, false);                                  \
  }                                                                                                              \
  CUresult CUDAAPI cuMemsetD2D##suffix##Async(CUdeviceptr dst, size_t pitch, T v, size_t w, size_t h,            \
                                              CUstream s) {                                                      \
    return memset2D(__func__, dst, pitch, v, size, w, h, s, false, true);                                        \
  }                                                                                                              \
  CUresult CUDAAPI cuMemsetD2D##suffix##Async_ptsz(CUdeviceptr dst, size_t pitch, T v, size_t w, size_t h,       \
                                                   CUstream s) {                                                 \
    return memset2D(__func__, dst, pitch, v, size, w, h, s, true, true);                                         \
  }

PHOS_VGPU_MEMSET(8, unsigned char, 1)
PHOS_VGPU_MEMSET(16, unsigned short, 2)
PHOS_VGPU_MEMSET(32, unsigned int, 4)
#undef PHOS_VGPU_MEMSET

// --- pointer attributes -------------------------------------------------------------------------

CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(data, "data"));
    auto a = d.allocations().find(ptr);
    // "CUDA_ERROR_INVALID_VALUE if ptr is not a valid pointer" (memory CUDA does not know).
    if (!a) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not memory vgpu allocated or registered", ptr);
    return pointerAttribute(d, data, attribute, ptr, a);
  });
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                        CUdeviceptr ptr) {
  return call(__func__, [&](Driver& d) -> Status {
    if (numAttributes == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "numAttributes is 0");
    RETURN_IF_ERROR(requireNonNull(attributes, "attributes"));
    RETURN_IF_ERROR(requireNonNull(data, "data"));
    // "Unlike cuPointerGetAttribute, this function will not return an error when the
    // ptr encountered is not a valid CUDA pointer. Instead, the attributes are
    // assigned default NULL values and CUDA_SUCCESS is returned."
    auto a = d.allocations().find(ptr);
    for (unsigned i = 0; i < numAttributes; ++i) {
      if (data[i] == nullptr) continue;
      RETURN_IF_ERROR(pointerAttribute(d, data[i], attributes[i], ptr, a));
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuPointerSetAttribute(const void* value, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value, "value"));
    if (!d.allocations().find(ptr)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not memory vgpu allocated", ptr);
    }
    // "The only attribute supported is CU_POINTER_ATTRIBUTE_SYNC_MEMOPS"; vgpu's
    // synchronous operations always synchronize, so setting it changes nothing.
    if (attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "pointer attribute {} cannot be set", static_cast<int>(attribute));
    }
    return Status::ok();
  });
}

