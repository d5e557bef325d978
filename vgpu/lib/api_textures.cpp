// SPDX-License-Identifier: Apache-2.0
// Entry points: CUDA arrays, their 1D copies, and texture and surface objects
// (driver/textures.h). 2D and 3D copies to and from arrays are cuMemcpy2D's
// and cuMemcpy3D's (api_memory.cpp).
#include <cstring>
#include <functional>

#include "entry.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::handleOf;
using phos::vgpu::api::requireNonNull;

PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyHtoA_v2_ptds(CUarray dstArray, size_t dstOffset,
                                                     const void* srcHost, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyAtoH_v2_ptds(void* dstHost, CUarray srcArray,
                                                     size_t srcOffset, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyDtoA_v2_ptds(CUarray dstArray, size_t dstOffset,
                                                     CUdeviceptr srcDevice, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyAtoD_v2_ptds(CUdeviceptr dstDevice, CUarray srcArray,
                                                     size_t srcOffset, size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyAtoA_v2_ptds(CUarray dstArray, size_t dstOffset,
                                                     CUarray srcArray, size_t srcOffset,
                                                     size_t ByteCount);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyHtoAAsync_v2_ptsz(CUarray dstArray, size_t dstOffset,
                                                          const void* srcHost, size_t ByteCount,
                                                          CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyAtoHAsync_v2_ptsz(void* dstHost, CUarray srcArray,
                                                          size_t srcOffset, size_t ByteCount,
                                                          CUstream hStream);

namespace {

std::uint64_t idOf(CUarray a) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(a));
}

Result<std::shared_ptr<ArrayObject>> arrayOf(Driver& d, CUarray handle) {
  auto array = handle == nullptr ? nullptr : d.arrays().find(idOf(handle));
  if (array == nullptr) return cuError(CUDA_ERROR_INVALID_HANDLE, "the array does not exist");
  return array;
}

CUresult createArray(const char* name, CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* descriptor) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(handle, "pHandle"));
    RETURN_IF_ERROR(requireNonNull(descriptor, "pAllocateArray"));
    ASSIGN_OR_RETURN(auto context, d.current());
    ASSIGN_OR_RETURN(ArrayObject array, describeArray(*descriptor));
    ASSIGN_OR_RETURN(array.address, d.allocateDevice(*context, array.bytes()));
    array.id = newHandle(HandleKind::kArray);
    array.context = context->id();
    const std::uint64_t id = array.id;
    d.arrays().add(id, std::make_shared<ArrayObject>(array));
    *handle = handleOf<CUarray>(id);
    return Status::ok();
  });
}

// A 1D copy to or from an array's bytes, in the order its texels lie.
struct ArraySide {
  std::uint64_t address = 0;
  bool device = false;
};

Result<ArraySide> arrayBytes(Driver& d, CUarray handle, size_t offset, size_t bytes) {
  ASSIGN_OR_RETURN(auto array, arrayOf(d, handle));
  if (offset > array->bytes() || bytes > array->bytes() - offset) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "{} bytes at offset {} do not fit the array's {} bytes", bytes, offset,
                    array->bytes());
  }
  return ArraySide{array->address + offset, true};
}

CUresult arrayCopy(const char* name,
                   std::function<Result<std::pair<ArraySide, ArraySide>>(Driver&)> sides,
                   size_t bytes, CUstream stream, bool perThread, bool async) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto ends, sides(d));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(stream, perThread));
    const auto& [dst, src] = ends;
    return d.copy(ref, dst.address, src.address, bytes, async, dst.device, src.device);
  });
}

ArraySide hostSide(const void* p) {
  return ArraySide{reinterpret_cast<std::uint64_t>(p), false};
}

CUresult htoA(const char* name, CUarray dst, size_t offset, const void* src, size_t bytes,
              CUstream stream, bool perThread, bool async) {
  return arrayCopy(
      name,
      [&](Driver& d) -> Result<std::pair<ArraySide, ArraySide>> {
        RETURN_IF_ERROR(requireNonNull(src, "srcHost"));
        ASSIGN_OR_RETURN(ArraySide a, arrayBytes(d, dst, offset, bytes));
        return std::pair{a, hostSide(src)};
      },
      bytes, stream, perThread, async);
}

CUresult atoH(const char* name, void* dst, CUarray src, size_t offset, size_t bytes,
              CUstream stream, bool perThread, bool async) {
  return arrayCopy(
      name,
      [&](Driver& d) -> Result<std::pair<ArraySide, ArraySide>> {
        RETURN_IF_ERROR(requireNonNull(dst, "dstHost"));
        ASSIGN_OR_RETURN(ArraySide a, arrayBytes(d, src, offset, bytes));
        return std::pair{hostSide(dst), a};
      },
      bytes, stream, perThread, async);
}

CUresult dtoA(const char* name, CUarray dst, size_t offset, CUdeviceptr src, size_t bytes,
              bool perThread) {
  return arrayCopy(
      name,
      [&](Driver& d) -> Result<std::pair<ArraySide, ArraySide>> {
        ASSIGN_OR_RETURN(ArraySide a, arrayBytes(d, dst, offset, bytes));
        return std::pair{a, ArraySide{src, true}};
      },
      bytes, nullptr, perThread, false);
}

CUresult atoD(const char* name, CUdeviceptr dst, CUarray src, size_t offset, size_t bytes,
              bool perThread) {
  return arrayCopy(
      name,
      [&](Driver& d) -> Result<std::pair<ArraySide, ArraySide>> {
        ASSIGN_OR_RETURN(ArraySide a, arrayBytes(d, src, offset, bytes));
        return std::pair{ArraySide{dst, true}, a};
      },
      bytes, nullptr, perThread, false);
}

CUresult atoA(const char* name, CUarray dst, size_t dstOffset, CUarray src, size_t srcOffset,
              size_t bytes, bool perThread) {
  return arrayCopy(
      name,
      [&](Driver& d) -> Result<std::pair<ArraySide, ArraySide>> {
        ASSIGN_OR_RETURN(ArraySide a, arrayBytes(d, dst, dstOffset, bytes));
        ASSIGN_OR_RETURN(ArraySide b, arrayBytes(d, src, srcOffset, bytes));
        return std::pair{a, b};
      },
      bytes, nullptr, perThread, false);
}

Result<std::shared_ptr<TextureObject>> objectOf(HandleTable<TextureObject>& table,
                                                std::uint64_t handle, const char* what) {
  auto object = table.find(handle);
  if (object == nullptr) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} object {:#x} does not exist", what, handle);
  }
  return object;
}

// A texture (texture != null) or surface object over `resource`.
Status createObject(Driver& d, HandleTable<TextureObject>& table, unsigned long long* handle,
                    const CUDA_RESOURCE_DESC& resource, const CUDA_TEXTURE_DESC* texture) {
  ASSIGN_OR_RETURN(auto context, d.current());
  std::shared_ptr<ArrayObject> array;
  if (resource.resType == CU_RESOURCE_TYPE_ARRAY) {
    ASSIGN_OR_RETURN(array, arrayOf(d, resource.res.array.hArray));
    if (array->context != context->id()) {
      return cuError(CUDA_ERROR_INVALID_CONTEXT, "the array belongs to another context");
    }
  }
  if (texture == nullptr &&
      (array == nullptr || (array->descriptor.Flags & CUDA_ARRAY3D_SURFACE_LDST) == 0)) {
    return cuError(CUDA_ERROR_INVALID_VALUE,
                   "a surface object needs an array created with CUDA_ARRAY3D_SURFACE_LDST");
  }
  ASSIGN_OR_RETURN(TextureView view, viewOf(resource, texture, array));
  auto object = std::make_shared<TextureObject>();
  object->context = context->id();
  object->view = view;
  object->resource = resource;
  if (texture != nullptr) object->texture = *texture;
  // Small integers, the lowest free first, as a GPU's descriptor slots:
  // a process that makes the same objects again gets the same handles,
  // which is what PhOS's restore relies on (docs/remoting.md).
  object->id = table.addAtLowestFree(object);
  *handle = object->id;
  return Status::ok();
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  if (pAllocateArray == nullptr) return createArray(__func__, pHandle, nullptr);
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = pAllocateArray->Width;
  d.Height = pAllocateArray->Height;
  d.Format = pAllocateArray->Format;
  d.NumChannels = pAllocateArray->NumChannels;
  return createArray(__func__, pHandle, &d);
}

CUresult CUDAAPI cuArray3DCreate_v2(CUarray* pHandle,
                                    const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  return createArray(__func__, pHandle, pAllocateArray);
}

CUresult CUDAAPI cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* pArrayDescriptor, CUarray hArray) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pArrayDescriptor, "pArrayDescriptor"));
    ASSIGN_OR_RETURN(auto array, arrayOf(d, hArray));
    pArrayDescriptor->Width = array->descriptor.Width;
    pArrayDescriptor->Height = array->descriptor.Height;
    pArrayDescriptor->Format = array->descriptor.Format;
    pArrayDescriptor->NumChannels = array->descriptor.NumChannels;
    return Status::ok();
  });
}

CUresult CUDAAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* pArrayDescriptor,
                                           CUarray hArray) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pArrayDescriptor, "pArrayDescriptor"));
    ASSIGN_OR_RETURN(auto array, arrayOf(d, hArray));
    *pArrayDescriptor = array->descriptor;
    return Status::ok();
  });
}

CUresult CUDAAPI cuArrayDestroy(CUarray hArray) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto array, arrayOf(d, hArray));
    if (d.arrays().erase(array->id) == nullptr) {
      return cuError(CUDA_ERROR_INVALID_HANDLE, "the array does not exist");
    }
    // As cuMemFree: work that may still read it finishes first.
    return d.freeDevice(array->address, true);
  });
}

CUresult CUDAAPI cuMemcpyHtoA_v2(CUarray dstArray, size_t dstOffset, const void* srcHost,
                                 size_t ByteCount) {
  return htoA(__func__, dstArray, dstOffset, srcHost, ByteCount, nullptr, false, false);
}
CUresult CUDAAPI cuMemcpyHtoA_v2_ptds(CUarray dstArray, size_t dstOffset, const void* srcHost,
                                      size_t ByteCount) {
  return htoA(__func__, dstArray, dstOffset, srcHost, ByteCount, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpyAtoH_v2(void* dstHost, CUarray srcArray, size_t srcOffset,
                                 size_t ByteCount) {
  return atoH(__func__, dstHost, srcArray, srcOffset, ByteCount, nullptr, false, false);
}
CUresult CUDAAPI cuMemcpyAtoH_v2_ptds(void* dstHost, CUarray srcArray, size_t srcOffset,
                                      size_t ByteCount) {
  return atoH(__func__, dstHost, srcArray, srcOffset, ByteCount, nullptr, true, false);
}
CUresult CUDAAPI cuMemcpyHtoAAsync_v2(CUarray dstArray, size_t dstOffset, const void* srcHost,
                                      size_t ByteCount, CUstream hStream) {
  return htoA(__func__, dstArray, dstOffset, srcHost, ByteCount, hStream, false, true);
}
CUresult CUDAAPI cuMemcpyHtoAAsync_v2_ptsz(CUarray dstArray, size_t dstOffset, const void* srcHost,
                                           size_t ByteCount, CUstream hStream) {
  return htoA(__func__, dstArray, dstOffset, srcHost, ByteCount, hStream, true, true);
}
CUresult CUDAAPI cuMemcpyAtoHAsync_v2(void* dstHost, CUarray srcArray, size_t srcOffset,
                                      size_t ByteCount, CUstream hStream) {
  return atoH(__func__, dstHost, srcArray, srcOffset, ByteCount, hStream, false, true);
}
CUresult CUDAAPI cuMemcpyAtoHAsync_v2_ptsz(void* dstHost, CUarray srcArray, size_t srcOffset,
                                           size_t ByteCount, CUstream hStream) {
  return atoH(__func__, dstHost, srcArray, srcOffset, ByteCount, hStream, true, true);
}
CUresult CUDAAPI cuMemcpyDtoA_v2(CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice,
                                 size_t ByteCount) {
  return dtoA(__func__, dstArray, dstOffset, srcDevice, ByteCount, false);
}
CUresult CUDAAPI cuMemcpyDtoA_v2_ptds(CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice,
                                      size_t ByteCount) {
  return dtoA(__func__, dstArray, dstOffset, srcDevice, ByteCount, true);
}
CUresult CUDAAPI cuMemcpyAtoD_v2(CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset,
                                 size_t ByteCount) {
  return atoD(__func__, dstDevice, srcArray, srcOffset, ByteCount, false);
}
CUresult CUDAAPI cuMemcpyAtoD_v2_ptds(CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset,
                                      size_t ByteCount) {
  return atoD(__func__, dstDevice, srcArray, srcOffset, ByteCount, true);
}
CUresult CUDAAPI cuMemcpyAtoA_v2(CUarray dstArray, size_t dstOffset, CUarray srcArray,
                                 size_t srcOffset, size_t ByteCount) {
  return atoA(__func__, dstArray, dstOffset, srcArray, srcOffset, ByteCount, false);
}
CUresult CUDAAPI cuMemcpyAtoA_v2_ptds(CUarray dstArray, size_t dstOffset, CUarray srcArray,
                                      size_t srcOffset, size_t ByteCount) {
  return atoA(__func__, dstArray, dstOffset, srcArray, srcOffset, ByteCount, true);
}

CUresult CUDAAPI cuTexObjectCreate(CUtexObject* pTexObject, const CUDA_RESOURCE_DESC* pResDesc,
                                   const CUDA_TEXTURE_DESC* pTexDesc,
                                   const CUDA_RESOURCE_VIEW_DESC* pResViewDesc) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pTexObject, "pTexObject"));
    RETURN_IF_ERROR(requireNonNull(pResDesc, "pResDesc"));
    RETURN_IF_ERROR(requireNonNull(pTexDesc, "pTexDesc"));
    if (pResViewDesc != nullptr) {
      return cuError(CUDA_ERROR_NOT_SUPPORTED,
                     "resource views (pResViewDesc) are not supported by vgpu");
    }
    return createObject(d, d.textureObjects(), pTexObject, *pResDesc, pTexDesc);
  });
}

CUresult CUDAAPI cuTexObjectDestroy(CUtexObject texObject) {
  return call(__func__, [&](Driver& d) -> Status {
    if (d.textureObjects().erase(texObject) == nullptr) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "texture object {:#x} does not exist", texObject);
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* pResDesc, CUtexObject texObject) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pResDesc, "pResDesc"));
    ASSIGN_OR_RETURN(auto object, objectOf(d.textureObjects(), texObject, "texture"));
    *pResDesc = object->resource;
    return Status::ok();
  });
}

CUresult CUDAAPI cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* pTexDesc, CUtexObject texObject) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pTexDesc, "pTexDesc"));
    ASSIGN_OR_RETURN(auto object, objectOf(d.textureObjects(), texObject, "texture"));
    *pTexDesc = object->texture;
    return Status::ok();
  });
}

// "If no resource view was set for texObject, the CUDA_ERROR_INVALID_VALUE is
// returned": none is, since cuTexObjectCreate refuses resource views.
CUresult CUDAAPI cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* pResViewDesc,
                                                CUtexObject texObject) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pResViewDesc, "pResViewDesc"));
    ASSIGN_OR_RETURN(auto object, objectOf(d.textureObjects(), texObject, "texture"));
    (void)object;
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "texture object {:#x} has no resource view",
                    texObject);
  });
}

CUresult CUDAAPI cuSurfObjectCreate(CUsurfObject* pSurfObject, const CUDA_RESOURCE_DESC* pResDesc) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pSurfObject, "pSurfObject"));
    RETURN_IF_ERROR(requireNonNull(pResDesc, "pResDesc"));
    return createObject(d, d.surfaceObjects(), pSurfObject, *pResDesc, nullptr);
  });
}

CUresult CUDAAPI cuSurfObjectDestroy(CUsurfObject surfObject) {
  return call(__func__, [&](Driver& d) -> Status {
    if (d.surfaceObjects().erase(surfObject) == nullptr) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "surface object {:#x} does not exist", surfObject);
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* pResDesc,
                                             CUsurfObject surfObject) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pResDesc, "pResDesc"));
    ASSIGN_OR_RETURN(auto object, objectOf(d.surfaceObjects(), surfObject, "surface"));
    *pResDesc = object->resource;
    return Status::ok();
  });
}

}  // extern "C"
