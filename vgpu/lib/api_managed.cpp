// SPDX-License-Identifier: Apache-2.0
// Entry points: managed memory (cuMemAllocManaged, cuMemAdvise,
// cuMemPrefetchAsync, cuMemRangeGetAttribute(s), cuStreamAttachMemAsync).
// vgpu's managed memory is device memory that every context may use and the
// host dereferences (vgpu's device memory is this process's memory): all of
// vgpu's devices report concurrent managed access, every access is coherent,
// and nothing migrates. Advice and prefetches are checked as the
// documentation says and kept, page by page, for the range queries
// (phos/common/managed_advice.h); the older signatures are in api_legacy.cpp.
#include "entry.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::requireNonNull;

PHOS_CU_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                                           CUmemLocation location,
                                                           unsigned int flags, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamAttachMemAsync_ptsz(CUstream hStream, CUdeviceptr dptr,
                                                            size_t length, unsigned int flags);

namespace {

CUresult prefetch(const char* name, CUdeviceptr devPtr, size_t count, CUmemLocation location,
                  unsigned flags, CUstream hStream, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    // "flags for future use, must be zero now".
    if (flags != 0)
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "prefetch flags 0x{:x} are not zero", flags);
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    RETURN_IF_ERROR(ref.context->usable());
    // Recorded now: the attribute "simply returns the last location that the
    // application requested to prefetch the memory range to". The data is
    // where every processor reads it already, so nothing is enqueued.
    return d.managed().prefetch(devPtr, count, location, d.deviceCount());
  });
}

CUresult attach(const char* name, CUstream hStream, CUdeviceptr dptr, size_t length, unsigned flags,
                bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST &&
        flags != CU_MEM_ATTACH_SINGLE) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "attach flags 0x{:x} are not one of CUmemAttach_flags", flags);
    }
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    // "It is illegal to attach singly to the NULL stream".
    if (flags == CU_MEM_ATTACH_SINGLE && ref.stream->kind() != Stream::Kind::kCreated) {
      return cuError(CUDA_ERROR_INVALID_VALUE,
                     "memory cannot be attached singly to a default stream");
    }
    auto a = d.allocations().find(dptr);
    if (!a || !a->managed)
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not managed memory", dptr);
    // "length must be either zero or the entire allocation's size".
    if (dptr != a->base || (length != 0 && length != a->size)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "only a whole managed allocation (0x{:x}, {} bytes) can be attached, not {} "
                      "bytes at 0x{:x}",
                      a->base, a->size, length, dptr);
    }
    return Status::ok();
  });
}

}  // namespace

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(dptr, "dptr"));
    ASSIGN_OR_RETURN(auto context, d.current());
    RETURN_IF_ERROR(context->usable());
    ASSIGN_OR_RETURN(std::uint64_t address, d.allocateManaged(*context, bytesize, flags));
    *dptr = address;
    return Status::ok();
  });
}

CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                CUmemLocation location) {
  return call(__func__, [&](Driver& d) {
    return d.managed().advise(devPtr, count, advice, location, d.deviceCount());
  });
}

CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                       unsigned int flags, CUstream hStream) {
  return prefetch(__func__, devPtr, count, location, flags, hStream, false);
}
CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                            CUmemLocation location, unsigned int flags,
                                            CUstream hStream) {
  return prefetch(__func__, devPtr, count, location, flags, hStream, true);
}

CUresult CUDAAPI cuMemRangeGetAttribute(void* data, size_t dataSize,
                                        CUmem_range_attribute attribute, CUdeviceptr devPtr,
                                        size_t count) {
  return call(__func__, [&](Driver& d) {
    return d.managed().attribute(attribute, devPtr, count, data, dataSize, d.deviceCount());
  });
}

CUresult CUDAAPI cuMemRangeGetAttributes(void** data, size_t* dataSizes,
                                         CUmem_range_attribute* attributes, size_t numAttributes,
                                         CUdeviceptr devPtr, size_t count) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(data, "data"));
    RETURN_IF_ERROR(requireNonNull(dataSizes, "dataSizes"));
    RETURN_IF_ERROR(requireNonNull(attributes, "attributes"));
    if (numAttributes == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "no attributes asked");
    for (size_t i = 0; i < numAttributes; ++i) {
      RETURN_IF_ERROR(d.managed().attribute(attributes[i], devPtr, count, data[i], dataSizes[i],
                                            d.deviceCount()));
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuStreamAttachMemAsync(CUstream hStream, CUdeviceptr dptr, size_t length,
                                        unsigned int flags) {
  return attach(__func__, hStream, dptr, length, flags, false);
}
CUresult CUDAAPI cuStreamAttachMemAsync_ptsz(CUstream hStream, CUdeviceptr dptr, size_t length,
                                             unsigned int flags) {
  return attach(__func__, hStream, dptr, length, flags, true);
}
