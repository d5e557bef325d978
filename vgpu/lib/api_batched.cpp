// SPDX-License-Identifier: Apache-2.0
// Entry points: batched copies, prefetches and discards, made of vgpu's own
// single operations (phos/common/batched_memory_ops.h, shared with the shim).
#include "entry.h"
#include "phos/common/batched_memory_ops.h"

// The first revisions (CUDA 12.8) also return the failing copy's index;
// cuda.h 13 declares only the second under the plain names.
#undef cuMemcpyBatchAsync
#undef cuMemcpy3DBatchAsync

using phos::batched_memory_ops::ExportedApi;
namespace batched = phos::batched_memory_ops;

PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                   size_t* sizes, size_t count,
                                                   CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                                                   size_t numAttrs, size_t* failIdx,
                                                   CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                        size_t* sizes, size_t count,
                                                        CUmemcpyAttributes* attrs,
                                                        size_t* attrsIdxs, size_t numAttrs,
                                                        size_t* failIdx, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                           size_t* sizes, size_t count,
                                                           CUmemcpyAttributes* attrs,
                                                           size_t* attrsIdxs, size_t numAttrs,
                                                           CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                                     size_t* failIdx, unsigned long long flags,
                                                     CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy3DBatchAsync_ptsz(size_t numOps,
                                                          CUDA_MEMCPY3D_BATCH_OP* opList,
                                                          size_t* failIdx, unsigned long long flags,
                                                          CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemcpy3DBatchAsync_v2_ptsz(size_t numOps,
                                                             CUDA_MEMCPY3D_BATCH_OP* opList,
                                                             unsigned long long flags,
                                                             CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(
    CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* prefetchLocs,
    size_t* prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemDiscardBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes,
                                                            size_t count, unsigned long long flags,
                                                            CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync_ptsz(
    CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* prefetchLocs,
    size_t* prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags, CUstream hStream);

namespace {

// Not initialized: the batch's own answer, before any operation's.
bool ready() {
  return phos::vgpu::Driver::instance().initialized();
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                    size_t count, CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                                    size_t numAttrs, size_t* failIdx, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::memcpyBatch<ExportedApi>(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
                                           failIdx, hStream, false);
}
CUresult CUDAAPI cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                         size_t count, CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                                         size_t numAttrs, size_t* failIdx, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::memcpyBatch<ExportedApi>(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
                                           failIdx, hStream, true);
}
CUresult CUDAAPI cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                       size_t count, CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                                       size_t numAttrs, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::memcpyBatch<ExportedApi>(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
                                           nullptr, hStream, false);
}
CUresult CUDAAPI cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                            size_t count, CUmemcpyAttributes* attrs,
                                            size_t* attrsIdxs, size_t numAttrs, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::memcpyBatch<ExportedApi>(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
                                           nullptr, hStream, true);
}

CUresult CUDAAPI cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                      size_t* failIdx, unsigned long long flags, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::memcpy3DBatch<ExportedApi>(numOps, opList, failIdx, flags, hStream, false);
}
CUresult CUDAAPI cuMemcpy3DBatchAsync_ptsz(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                           size_t* failIdx, unsigned long long flags,
                                           CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::memcpy3DBatch<ExportedApi>(numOps, opList, failIdx, flags, hStream, true);
}
CUresult CUDAAPI cuMemcpy3DBatchAsync_v2(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                         unsigned long long flags, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::memcpy3DBatch<ExportedApi>(numOps, opList, nullptr, flags, hStream, false);
}
CUresult CUDAAPI cuMemcpy3DBatchAsync_v2_ptsz(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                              unsigned long long flags, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::memcpy3DBatch<ExportedApi>(numOps, opList, nullptr, flags, hStream, true);
}

CUresult CUDAAPI cuMemPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                         CUmemLocation* prefetchLocs, size_t* prefetchLocIdxs,
                                         size_t numPrefetchLocs, unsigned long long flags,
                                         CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::managedBatch<ExportedApi>(dptrs, sizes, count, false, prefetchLocs,
                                            prefetchLocIdxs, numPrefetchLocs, flags, hStream,
                                            false);
}
CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                              CUmemLocation* prefetchLocs, size_t* prefetchLocIdxs,
                                              size_t numPrefetchLocs, unsigned long long flags,
                                              CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::managedBatch<ExportedApi>(dptrs, sizes, count, false, prefetchLocs,
                                            prefetchLocIdxs, numPrefetchLocs, flags, hStream, true);
}
CUresult CUDAAPI cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                        unsigned long long flags, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::managedBatch<ExportedApi>(dptrs, sizes, count, true, nullptr, nullptr, 0, flags,
                                            hStream, false);
}
CUresult CUDAAPI cuMemDiscardBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                             unsigned long long flags, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return batched::managedBatch<ExportedApi>(dptrs, sizes, count, true, nullptr, nullptr, 0, flags,
                                            hStream, true);
}
CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                                   CUmemLocation* prefetchLocs,
                                                   size_t* prefetchLocIdxs, size_t numPrefetchLocs,
                                                   unsigned long long flags, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  if (prefetchLocs == nullptr || numPrefetchLocs == 0) return CUDA_ERROR_INVALID_VALUE;
  return batched::managedBatch<ExportedApi>(dptrs, sizes, count, true, prefetchLocs,
                                            prefetchLocIdxs, numPrefetchLocs, flags, hStream,
                                            false);
}
CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync_ptsz(
    CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* prefetchLocs,
    size_t* prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags, CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  if (prefetchLocs == nullptr || numPrefetchLocs == 0) return CUDA_ERROR_INVALID_VALUE;
  return batched::managedBatch<ExportedApi>(dptrs, sizes, count, true, prefetchLocs,
                                            prefetchLocIdxs, numPrefetchLocs, flags, hStream, true);
}

}  // extern "C"
