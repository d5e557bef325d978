// SPDX-License-Identifier: Apache-2.0
// What libphos.so answers without phosd (apigen/remoting.json "local"): error
// strings, cuGetProcAddress with the shim's own entry points, NVIDIA's private
// export tables, the per-thread context stacks and contexts' usage counts,
// the occupancy queries whose callback runs in the application, and the
// launch API before CUDA 4.0.
#include <cuda.h>

#include <algorithm>

#include "api_trace.h"
#include "client_call.h"
#include "connection.h"
#include "phos/common/batched_memory_ops.h"
#include "phos/common/context_usage.h"
#include "phos/common/graph_node_params.h"
#include "phos/common/legacy_launch.h"
#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "phos/cuda_api/client_hooks.h"
#include "phos/cuda_api/proc_address.h"
#include "phos/export_tables/driver_logs.h"
#include "phos/export_tables/export_tables.h"

namespace phos::shim::local {
namespace {

Connection& conn() { return Connection::instance(); }
bool initialized() { return conn().connected(); }

struct ErrorText {
  int value;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
#include "cu_error_table.inc"
};

const ErrorText* findError(CUresult r) {
  for (const auto& e : kErrors) {
    if (e.value == static_cast<int>(r)) return &e;
  }
  return nullptr;
}

}  // namespace

CUresult cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *str = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *str = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// NVIDIA's private tables, served here: the runtime's integrity check hashes
// this process's pid and where the tables are, so only the application can
// answer it (docs/cudart.md).
CUresult cuGetExportTable(const void** table, const CUuuid* id) {
  if (table == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *table = export_tables::find(*id);
  if (*table != nullptr) return CUDA_SUCCESS;
  log::get("shim")->debug("cuGetExportTable: no table {}", export_tables::uuidText(*id));
  return CUDA_ERROR_NOT_FOUND;
}

// cuGetProcAddress: every pointer handed out is one of the shim's trampolines.
namespace {

CUresult procAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                     CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~known) != 0 || cudaVersion > cuda_api::headerCudaVersion()) return CUDA_ERROR_INVALID_VALUE;
  auto found = cuda_api::lookupProcAddress(symbol, cudaVersion, flags);
  if (status != nullptr) *status = static_cast<CUdriverProcAddressQueryResult>(found.status);
  *pfn = found.found() ? reinterpret_cast<void*>(cuda_api::trampoline(found.entry)) : nullptr;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* status) {
  return procAddress(symbol, pfn, cudaVersion, flags, status);
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  // The CUDA 11 ABI has no status output: a symbol it cannot hand out is
  // CUDA_ERROR_NOT_FOUND.
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult r = procAddress(symbol, pfn, cudaVersion, flags, &status);
  if (r != CUDA_SUCCESS) return r;
  return status == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

// ---- contexts ----------------------------------------------------------------
// The stack of current contexts is the calling thread's and lives here; every
// call carries its top to phosd.
CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(currentContext());
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto& stack = contextStack();
  uint64_t id = ClientCall::handleId(ctx);
  if (id == 0) {
    // "equivalent to popping the top of the calling thread's stack"
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!conn().knownContext(id)) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack.empty()) {
    stack.push_back(id);
  } else {
    stack.back() = id;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  uint64_t id = ClientCall::handleId(ctx);
  if (id == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!conn().knownContext(id)) return CUDA_ERROR_INVALID_CONTEXT;
  contextStack().push_back(id);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* pctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto& stack = contextStack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(stack.back());
  stack.pop_back();
  return CUDA_SUCCESS;
}

// ---- occupancy -----------------------------------------------------------------
// cuOccupancyMaxPotentialBlockSize(WithFlags) take a host callback (dynamic
// shared memory per block size), so they are answered here: the callback runs
// in the application, each candidate block size is one remoted
// cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags. The largest block size
// of the highest occupancy wins, as in the driver.
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int* minGridSize, int* blockSize, CUfunction f,
                                                   CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                   size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (minGridSize == nullptr || blockSize == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int maxThreads = 0, multiprocessors = 0, warp = 0;
  CUdevice device = 0;
  trace::InternalCalls internal;  // the application called one entry point
  if (CUresult r = ::cuFuncGetAttribute(&maxThreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f); r != CUDA_SUCCESS) {
    return r;
  }
  if (CUresult r = ::cuCtxGetDevice(&device); r != CUDA_SUCCESS) return r;
  if (CUresult r = ::cuDeviceGetAttribute(&multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (CUresult r = ::cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, device); r != CUDA_SUCCESS) return r;
  warp = std::max(warp, 1);
  int limit = blockSizeLimit > 0 ? std::min(maxThreads, blockSizeLimit) : maxThreads;
  int bestSize = 0, bestThreads = 0, bestBlocks = 0;
  for (int size = (limit / warp) * warp; size >= warp; size -= warp) {
    size_t shared = blockSizeToDynamicSMemSize != nullptr ? blockSizeToDynamicSMemSize(size) : dynamicSMemSize;
    int blocks = 0;
    CUresult r = ::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, size, shared, flags);
    if (r != CUDA_SUCCESS) return r;
    if (blocks * size > bestThreads) {
      bestThreads = blocks * size;
      bestSize = size;
      bestBlocks = blocks;
    }
  }
  if (bestSize == 0) return CUDA_ERROR_INVALID_VALUE;
  *blockSize = bestSize;
  *minGridSize = bestBlocks * multiprocessors;
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialBlockSize(int* minGridSize, int* blockSize, CUfunction f,
                                          CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                          int blockSizeLimit) {
  return local::cuOccupancyMaxPotentialBlockSizeWithFlags(minGridSize, blockSize, f, blockSizeToDynamicSMemSize,
                                                          dynamicSMemSize, blockSizeLimit, CU_OCCUPANCY_DEFAULT);
}

// ---- the error log ---------------------------------------------------------------------
// The application's: what the shim refuses and what comes back failed from
// phosd (client_call.cpp). The driver's own log is phosd's worker's.
CUresult cuLogsRegisterCallback(CUlogsCallback callback, void* userData, CUlogsCallbackHandle* handle) {
  return driver_logs::registerCallback(callback, userData, handle);
}
CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle handle) { return driver_logs::unregisterCallback(handle); }
CUresult cuLogsCurrent(CUlogIterator* iterator, unsigned int flags) { return driver_logs::current(iterator, flags); }
CUresult cuLogsDumpToFile(CUlogIterator* iterator, const char* path, unsigned int flags) {
  return driver_logs::dumpToFile(iterator, path, flags);
}
CUresult cuLogsDumpToMemory(CUlogIterator* iterator, char* buffer, size_t* size, unsigned int flags) {
  return driver_logs::dumpToMemory(iterator, buffer, size, flags);
}

// Contexts' usage counts, kept beside the context stack
// (phos/common/context_usage.h): at none left, one remoted cuCtxDestroy.
CUresult cuCtxAttach(CUcontext* pctx, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return context_usage::attach(pctx, flags);
}
CUresult cuCtxDetach(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return context_usage::detach(ctx);
}

// ---- the launch API before CUDA 4.0 ----------------------------------------------------------
// What it sets is the application's (phos/common/legacy_launch.h); each launch
// is one remoted cuLaunchKernel.
CUresult cuFuncSetBlockShape(CUfunction hfunc, int x, int y, int z) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::setBlockShape(hfunc, x, y, z);
}
CUresult cuFuncSetSharedSize(CUfunction hfunc, unsigned int bytes) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::setSharedSize(hfunc, bytes);
}
CUresult cuParamSetSize(CUfunction hfunc, unsigned int numbytes) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::setParamSize(hfunc, numbytes);
}
CUresult cuParamSeti(CUfunction hfunc, int offset, unsigned int value) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::setParam(hfunc, offset, &value, sizeof(value));
}
CUresult cuParamSetf(CUfunction hfunc, int offset, float value) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::setParam(hfunc, offset, &value, sizeof(value));
}
CUresult cuParamSetv(CUfunction hfunc, int offset, void* ptr, unsigned int numbytes) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::setParam(hfunc, offset, ptr, numbytes);
}
CUresult cuLaunch(CUfunction f) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::launch(f, 1, 1, nullptr);
}
CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::launch(f, grid_width, grid_height, nullptr);
}
CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return legacy_launch::launch(f, grid_width, grid_height, hStream);
}

// The generic graph node entry points, made of the per-kind ones, which
// are remoted (the shim's own exported entry points, not the application's calls).
CUresult cuGraphAddNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                        const CUgraphEdgeData* dependencyData, size_t numDependencies,
                        CUgraphNodeParams* nodeParams) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return graph_node_params::addNode<graph_node_params::ExportedApi>(
      phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams);
}
// The CUDA 12.2 revision, without edge data.
CUresult cuGraphAddNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                        size_t numDependencies, CUgraphNodeParams* nodeParams) {
  return cuGraphAddNode(phGraphNode, hGraph, dependencies, nullptr, numDependencies, nodeParams);
}
CUresult cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams* nodeParams) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return graph_node_params::setParams<graph_node_params::ExportedApi>(nullptr, hNode, nodeParams);
}
CUresult cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                  CUgraphNodeParams* nodeParams) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  trace::InternalCalls internal;
  return graph_node_params::setParams<graph_node_params::ExportedApi>(hGraphExec, hNode,
                                                                      nodeParams);
}

// ---- batched copies, prefetches and discards ------------------------------------------------
// Each operation is the shim's own remoted single call (cuMemcpyAsync, with
// the application's host memory through its transfer lanes; cuMemcpy3DAsync;
// cuMemPrefetchAsync): phos/common/batched_memory_ops.h.
namespace batched = phos::batched_memory_ops;
using BatchApi = batched::ExportedApi;

CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                            CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs,
                            size_t* failIdx, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::memcpyBatch<BatchApi>(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
                                        failIdx, hStream, false);
}
CUresult cuMemcpyBatchAsync(PerThread, CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                            size_t count, CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                            size_t numAttrs, size_t* failIdx, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::memcpyBatch<BatchApi>(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
                                        failIdx, hStream, true);
}
CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                            CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs,
                            CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::memcpyBatch<BatchApi>(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
                                        nullptr, hStream, false);
}
CUresult cuMemcpyBatchAsync(PerThread, CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                            size_t count, CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                            size_t numAttrs, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::memcpyBatch<BatchApi>(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
                                        nullptr, hStream, true);
}
CUresult cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList, size_t* failIdx,
                              unsigned long long flags, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::memcpy3DBatch<BatchApi>(numOps, opList, failIdx, flags, hStream, false);
}
CUresult cuMemcpy3DBatchAsync(PerThread, size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                              size_t* failIdx, unsigned long long flags, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::memcpy3DBatch<BatchApi>(numOps, opList, failIdx, flags, hStream, true);
}
CUresult cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                              unsigned long long flags, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::memcpy3DBatch<BatchApi>(numOps, opList, nullptr, flags, hStream, false);
}
CUresult cuMemcpy3DBatchAsync(PerThread, size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                              unsigned long long flags, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::memcpy3DBatch<BatchApi>(numOps, opList, nullptr, flags, hStream, true);
}
CUresult cuMemPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                 CUmemLocation* prefetchLocs, size_t* prefetchLocIdxs,
                                 size_t numPrefetchLocs, unsigned long long flags,
                                 CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::managedBatch<BatchApi>(dptrs, sizes, count, false, prefetchLocs, prefetchLocIdxs,
                                         numPrefetchLocs, flags, hStream, false);
}
CUresult cuMemPrefetchBatchAsync(PerThread, CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                 CUmemLocation* prefetchLocs, size_t* prefetchLocIdxs,
                                 size_t numPrefetchLocs, unsigned long long flags,
                                 CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::managedBatch<BatchApi>(dptrs, sizes, count, false, prefetchLocs, prefetchLocIdxs,
                                         numPrefetchLocs, flags, hStream, true);
}
CUresult cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                unsigned long long flags, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::managedBatch<BatchApi>(dptrs, sizes, count, true, nullptr, nullptr, 0, flags,
                                         hStream, false);
}
CUresult cuMemDiscardBatchAsync(PerThread, CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                unsigned long long flags, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  trace::InternalCalls internal;
  return batched::managedBatch<BatchApi>(dptrs, sizes, count, true, nullptr, nullptr, 0, flags,
                                         hStream, true);
}
CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                           CUmemLocation* prefetchLocs, size_t* prefetchLocIdxs,
                                           size_t numPrefetchLocs, unsigned long long flags,
                                           CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (prefetchLocs == nullptr || numPrefetchLocs == 0) return CUDA_ERROR_INVALID_VALUE;
  trace::InternalCalls internal;
  return batched::managedBatch<BatchApi>(dptrs, sizes, count, true, prefetchLocs, prefetchLocIdxs,
                                         numPrefetchLocs, flags, hStream, false);
}
CUresult cuMemDiscardAndPrefetchBatchAsync(PerThread, CUdeviceptr* dptrs, size_t* sizes,
                                           size_t count, CUmemLocation* prefetchLocs,
                                           size_t* prefetchLocIdxs, size_t numPrefetchLocs,
                                           unsigned long long flags, CUstream hStream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (prefetchLocs == nullptr || numPrefetchLocs == 0) return CUDA_ERROR_INVALID_VALUE;
  trace::InternalCalls internal;
  return batched::managedBatch<BatchApi>(dptrs, sizes, count, true, prefetchLocs, prefetchLocIdxs,
                                         numPrefetchLocs, flags, hStream, true);
}

}  // namespace phos::shim::local
