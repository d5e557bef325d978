// SPDX-License-Identifier: Apache-2.0
// Batched copies, prefetches and discards (CUDA 12.8 and later):
// cuMemcpyBatchAsync, cuMemcpy3DBatchAsync, cuMemPrefetchBatchAsync,
// cuMemDiscardBatchAsync and cuMemDiscardAndPrefetchBatchAsync, made of the
// single operations they batch: the exported cuMemcpyAsync, cuMemcpy3DAsync
// and cuMemPrefetchAsync of the process that includes this (vgpu's own, or
// the shim's, which remote them).
//
// "The batch as a whole executes in stream order but operations within a
// batch are not guaranteed to execute in any specific order": they run in
// the order given, one of those allowed. A copy whose attributes say
// CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL must have read its source when
// the call returns; the batch then waits for its stream before returning.
// Discarding is exact as nothing: a discarded range reads indeterminate
// values, and the bytes it held are one of them. Hints (location hints,
// CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE) change nothing a program sees.
//
// The first revisions of the copies (CUDA 12.8) also say which copy failed
// (`failIdx`; SIZE_MAX when the error is not one copy's).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace phos::batched_memory_ops {

inline constexpr size_t kNoCopy = SIZE_MAX;

// The stream a batch runs on: never the legacy default stream ("Must not be
// legacy NULL stream"); 0 in a per-thread variant is the thread's stream.
inline CUresult batchStream(CUstream& stream, bool perThread) {
  if (stream == nullptr && perThread) {
    stream = CU_STREAM_PER_THREAD;
    return CUDA_SUCCESS;
  }
  return stream == nullptr || stream == CU_STREAM_LEGACY ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

inline bool validOrder(CUmemcpySrcAccessOrder order) {
  return order == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
         order == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL ||
         order == CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
}

// attrsIdxs / prefetchLocIdxs: the first 0, each greater than the one
// before, the last below `count`, and no more of them than operations.
inline bool validGroups(const size_t* firsts, size_t groups, size_t count) {
  if (firsts == nullptr || groups == 0 || groups > count || firsts[0] != 0) return false;
  for (size_t k = 1; k < groups; ++k) {
    if (firsts[k] <= firsts[k - 1]) return false;
  }
  return firsts[groups - 1] < count;
}

// The group operation i belongs to.
inline size_t groupOf(const size_t* firsts, size_t groups, size_t i) {
  size_t k = 0;
  while (k + 1 < groups && firsts[k + 1] <= i) ++k;
  return k;
}

template <typename Api>
CUresult memcpyBatch(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                     CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs, size_t* failIdx,
                     CUstream stream, bool perThread) {
  if (failIdx != nullptr) *failIdx = kNoCopy;
  if (CUresult r = batchStream(stream, perThread); r != CUDA_SUCCESS) return r;
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      !validGroups(attrsIdxs, numAttrs, count)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool waitForSources = false;
  for (size_t k = 0; k < numAttrs; ++k) {
    if (!validOrder(attrs[k].srcAccessOrder) ||
        (attrs[k].flags & ~CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE) != 0) {
      if (failIdx != nullptr) *failIdx = attrsIdxs[k];
      return CUDA_ERROR_INVALID_VALUE;
    }
    waitForSources |= attrs[k].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
  }
  for (size_t i = 0; i < count; ++i) {
    if (CUresult r = Api::memcpyAsync(dsts[i], srcs[i], sizes[i], stream); r != CUDA_SUCCESS) {
      if (failIdx != nullptr) *failIdx = i;
      return r;
    }
  }
  return waitForSources ? Api::streamSynchronize(stream) : CUDA_SUCCESS;
}

// Bytes per element of an array's texels.
template <typename Api>
CUresult elementBytes(CUarray array, size_t& bytes) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  if (CUresult r = Api::arrayGetDescriptor(&d, array); r != CUDA_SUCCESS) return r;
  size_t channel = 0;
  switch (d.Format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      channel = 1;
      break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      channel = 2;
      break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      channel = 4;
      break;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;  // packed and compressed formats: no element size of this
                                        // kind
  }
  bytes = channel * d.NumChannels;
  return CUDA_SUCCESS;
}

// One side of a batched 3D copy as cuMemcpy3D takes it. A pointer's memory
// type is the driver's (host memory it does not know is pageable host memory).
template <typename Api>
CUresult describeSide(const CUmemcpy3DOperand& o, size_t elem, const CUextent3D& extent,
                      CUmemorytype& type, const void*& host, CUdeviceptr& device, CUarray& array,
                      size_t& x, size_t& y, size_t& z, size_t& pitch, size_t& height) {
  if (o.type == CU_MEMCPY_OPERAND_TYPE_ARRAY) {
    type = CU_MEMORYTYPE_ARRAY;
    array = o.op.array.array;
    x = o.op.array.offset.x * elem;
    y = o.op.array.offset.y;
    z = o.op.array.offset.z;
    return CUDA_SUCCESS;
  }
  if (o.type != CU_MEMCPY_OPERAND_TYPE_POINTER) return CUDA_ERROR_INVALID_VALUE;
  const auto& p = o.op.ptr;
  if ((p.rowLength != 0 && p.rowLength < extent.width) ||
      (p.layerHeight != 0 && p.layerHeight < extent.height)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  pitch = (p.rowLength != 0 ? p.rowLength : extent.width) * elem;
  height = p.layerHeight != 0 ? p.layerHeight : extent.height;
  unsigned int memoryType = 0;
  if (Api::pointerGetAttribute(&memoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p.ptr) !=
          CUDA_SUCCESS ||
      memoryType == CU_MEMORYTYPE_HOST) {
    type = CU_MEMORYTYPE_HOST;
    host = reinterpret_cast<const void*>(static_cast<uintptr_t>(p.ptr));
  } else {
    type = CU_MEMORYTYPE_DEVICE;
    device = p.ptr;
  }
  return CUDA_SUCCESS;
}

template <typename Api>
CUresult memcpy3DBatch(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* ops, size_t* failIdx,
                       unsigned long long flags, CUstream stream, bool perThread) {
  if (failIdx != nullptr) *failIdx = kNoCopy;
  if (CUresult r = batchStream(stream, perThread); r != CUDA_SUCCESS) return r;
  if (numOps == 0 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  bool waitForSources = false;
  for (size_t i = 0; i < numOps; ++i) {
    const CUDA_MEMCPY3D_BATCH_OP& op = ops[i];
    auto fail = [&](CUresult r) {
      if (failIdx != nullptr) *failIdx = i;
      return r;
    };
    if (!validOrder(op.srcAccessOrder) || op.extent.width == 0 || op.extent.height == 0 ||
        op.extent.depth == 0 || (op.flags & ~CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE) != 0) {
      return fail(CUDA_ERROR_INVALID_VALUE);
    }
    waitForSources |= op.srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    // Elements are bytes between pointers, else an array's texels; two
    // arrays must have texels of one size.
    size_t elem = 1, other = 0;
    const bool srcArray = op.src.type == CU_MEMCPY_OPERAND_TYPE_ARRAY;
    const bool dstArray = op.dst.type == CU_MEMCPY_OPERAND_TYPE_ARRAY;
    if (srcArray) {
      if (CUresult r = elementBytes<Api>(op.src.op.array.array, elem); r != CUDA_SUCCESS) {
        return fail(r);
      }
    }
    if (dstArray) {
      if (CUresult r = elementBytes<Api>(op.dst.op.array.array, srcArray ? other : elem);
          r != CUDA_SUCCESS) {
        return fail(r);
      }
      if (srcArray && other != elem) return fail(CUDA_ERROR_INVALID_VALUE);
    }
    CUDA_MEMCPY3D c{};
    if (CUresult r =
            describeSide<Api>(op.src, elem, op.extent, c.srcMemoryType, c.srcHost, c.srcDevice,
                              c.srcArray, c.srcXInBytes, c.srcY, c.srcZ, c.srcPitch, c.srcHeight);
        r != CUDA_SUCCESS) {
      return fail(r);
    }
    const void* dstHost = nullptr;
    if (CUresult r =
            describeSide<Api>(op.dst, elem, op.extent, c.dstMemoryType, dstHost, c.dstDevice,
                              c.dstArray, c.dstXInBytes, c.dstY, c.dstZ, c.dstPitch, c.dstHeight);
        r != CUDA_SUCCESS) {
      return fail(r);
    }
    c.dstHost = const_cast<void*>(dstHost);
    c.WidthInBytes = op.extent.width * elem;
    c.Height = op.extent.height;
    c.Depth = op.extent.depth;
    if (CUresult r = Api::memcpy3DAsync(&c, stream); r != CUDA_SUCCESS) return fail(r);
  }
  return waitForSources ? Api::streamSynchronize(stream) : CUDA_SUCCESS;
}

// Batches of managed memory need every device to access it concurrently
// with the host ("otherwise the API will return an error").
template <typename Api>
CUresult managedBatchesSupported() {
  int devices = 0;
  if (CUresult r = Api::deviceGetCount(&devices); r != CUDA_SUCCESS) return r;
  for (int d = 0; d < devices; ++d) {
    int concurrent = 0;
    if (CUresult r =
            Api::deviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, d);
        r != CUDA_SUCCESS) {
      return r;
    }
    if (concurrent == 0) return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

// Discards (when `discard`) and prefetches (when `locations` is given) of
// ranges of managed memory.
template <typename Api>
CUresult managedBatch(CUdeviceptr* dptrs, size_t* sizes, size_t count, bool discard,
                      CUmemLocation* locations, size_t* locationIdxs, size_t numLocations,
                      unsigned long long flags, CUstream stream, bool perThread) {
  if (CUresult r = batchStream(stream, perThread); r != CUDA_SUCCESS) return r;
  if (count == 0 || dptrs == nullptr || sizes == nullptr || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const bool prefetch = !discard || locations != nullptr || numLocations != 0;
  if (prefetch && (locations == nullptr || !validGroups(locationIdxs, numLocations, count))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = managedBatchesSupported<Api>(); r != CUDA_SUCCESS) return r;
  for (size_t i = 0; i < count; ++i) {
    unsigned int managed = 0;
    if (Api::pointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dptrs[i]) !=
            CUDA_SUCCESS ||
        managed == 0 || sizes[i] == 0) {
      return CUDA_ERROR_INVALID_VALUE;  // "must refer to managed memory"
    }
  }
  if (!prefetch) return CUDA_SUCCESS;
  for (size_t i = 0; i < count; ++i) {
    const CUmemLocation& where = locations[groupOf(locationIdxs, numLocations, i)];
    if (CUresult r = Api::prefetchAsync(dptrs[i], sizes[i], where, 0, stream); r != CUDA_SUCCESS) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

// The exported entry points of the process (vgpu's, or the shim's), by
// their symbols' names (the shim sees cuda.h without its renaming macros).
struct ExportedApi {
  static constexpr auto memcpyAsync = &::cuMemcpyAsync;
  static constexpr auto memcpy3DAsync = &::cuMemcpy3DAsync_v2;
  static constexpr auto streamSynchronize = &::cuStreamSynchronize;
  static constexpr auto prefetchAsync = &::cuMemPrefetchAsync_v2;
  static constexpr auto pointerGetAttribute = &::cuPointerGetAttribute;
  static constexpr auto arrayGetDescriptor = &::cuArray3DGetDescriptor_v2;
  static constexpr auto deviceGetCount = &::cuDeviceGetCount;
  static constexpr auto deviceGetAttribute = &::cuDeviceGetAttribute;
};

}  // namespace phos::batched_memory_ops
