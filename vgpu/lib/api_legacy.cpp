// SPDX-License-Identifier: Apache-2.0
// Entry points exported under older names that keep the current signature (cuCtxDestroy, ...),
// contexts' usage counts and the launch API before CUDA 4.0.
#include "entry.h"
#include "phos/common/context_usage.h"
#include "phos/common/legacy_launch.h"

// cuda.h maps these names to their newest versions; the symbols themselves still
// exist in NVIDIA's libcuda with an unchanged ABI, so vgpu exports them too.
// Older names whose ABI differs (32-bit CUdeviceptr_v1 in cuMemAlloc, cuMemcpyHtoD,
// ...; the old CUDA_MEMCPY2D layout in cuMemcpy2D) cannot be served: vgpu's device
// addresses do not fit in 32 bits. They stay on the NOT_SUPPORTED fallback.
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxSetFlags
#undef cuDeviceGetUuid
#undef cuStreamDestroy
#undef cuEventDestroy
#undef cuEventElapsedTime
#undef cuMemHostRegister
#undef cuStreamGetCaptureInfo
#undef cuStreamBeginCapture
#undef cuStreamUpdateCaptureDependencies

PHOS_CU_EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                                               unsigned int flags, CUdevice dev) {
  CUctxCreateParams params{paramsArray, numParams, nullptr};
  return cuCtxCreate_v4(pctx, (paramsArray != nullptr || numParams != 0) ? &params : nullptr, flags, dev);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }
PHOS_CU_EXPORT CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
PHOS_CU_EXPORT CUresult CUDAAPI cuCtxPopCurrent(CUcontext* pctx) { return cuCtxPopCurrent_v2(pctx); }
PHOS_CU_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
PHOS_CU_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }
PHOS_CU_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream stream) { return cuStreamDestroy_v2(stream); }
PHOS_CU_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent event) { return cuEventDestroy_v2(event); }
PHOS_CU_EXPORT CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return cuEventElapsedTime_v2(ms, start, end);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuMemHostRegister(void* p, size_t bytesize, unsigned int flags) {
  return cuMemHostRegister_v2(p, bytesize, flags);
}
// The 32-bit size is the only difference from cuMemAllocHost_v2.
#undef cuMemAllocHost
PHOS_CU_EXPORT CUresult CUDAAPI cuMemAllocHost(void** pp, unsigned int bytesize) {
  return cuMemAllocHost_v2(pp, bytesize);
}

// CUDA 10.0's capture, before capture modes: the global mode, which 10.1 made the default.
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream) {
  return cuStreamBeginCapture_v2(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream,
                                                             CUstreamCaptureMode mode);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream) {
  return cuStreamBeginCapture_v2_ptsz(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

// CUDA 10's ABI (status and id only); its _ptsz twin is in api_graph.cpp.
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                                       cuuint64_t*) {
  return cuStreamIsCapturing(hStream, captureStatus_out);
}

// CUDA 11.3's form, without edge data (CUDA 12.3's _v2 added it); its _ptsz twin is in
// api_graph.cpp.
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies(CUstream hStream,
                                                                  CUgraphNode* dependencies,
                                                                  size_t numDependencies,
                                                                  unsigned int flags) {
  return cuStreamUpdateCaptureDependencies_v2(hStream, dependencies, nullptr, numDependencies,
                                              flags);
}

// CUDA 12's managed-memory hints, with a device ordinal where CUDA 13 takes a
// CUmemLocation (CU_DEVICE_CPU: the host).
#undef cuMemAdvise
#undef cuMemPrefetchAsync
namespace {
CUmemLocation locationOf(CUdevice device) {
  return device == CU_DEVICE_CPU ? CUmemLocation{CU_MEM_LOCATION_TYPE_HOST, 0}
                                 : CUmemLocation{CU_MEM_LOCATION_TYPE_DEVICE, device};
}
}  // namespace
PHOS_CU_EXPORT CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                            CUdevice device) {
  return cuMemAdvise_v2(devPtr, count, advice, locationOf(device));
}
PHOS_CU_EXPORT CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count,
                                                   CUdevice dstDevice, CUstream hStream) {
  return cuMemPrefetchAsync_v2(devPtr, count, locationOf(dstDevice), 0, hStream);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                                           CUmemLocation location,
                                                           unsigned int flags, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count,
                                                        CUdevice dstDevice, CUstream hStream) {
  return cuMemPrefetchAsync_v2_ptsz(devPtr, count, locationOf(dstDevice), 0, hStream);
}

// The launch API before CUDA 4.0 (phos/common/legacy_launch.h): each launch is
// a cuLaunchKernel with the parameters set piece by piece as one buffer.
PHOS_CU_EXPORT CUresult CUDAAPI cuFuncSetBlockShape(CUfunction hfunc, int x, int y, int z) {
  return phos::legacy_launch::setBlockShape(hfunc, x, y, z);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuFuncSetSharedSize(CUfunction hfunc, unsigned int bytes) {
  return phos::legacy_launch::setSharedSize(hfunc, bytes);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuParamSetSize(CUfunction hfunc, unsigned int numbytes) {
  return phos::legacy_launch::setParamSize(hfunc, numbytes);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuParamSeti(CUfunction hfunc, int offset, unsigned int value) {
  return phos::legacy_launch::setParam(hfunc, offset, &value, sizeof(value));
}
PHOS_CU_EXPORT CUresult CUDAAPI cuParamSetf(CUfunction hfunc, int offset, float value) {
  return phos::legacy_launch::setParam(hfunc, offset, &value, sizeof(value));
}
PHOS_CU_EXPORT CUresult CUDAAPI cuParamSetv(CUfunction hfunc, int offset, void* ptr,
                                            unsigned int numbytes) {
  return phos::legacy_launch::setParam(hfunc, offset, ptr, numbytes);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuLaunch(CUfunction f) {
  return phos::legacy_launch::launch(f, 1, 1, nullptr);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuLaunchGrid(CUfunction f, int grid_width, int grid_height) {
  return phos::legacy_launch::launch(f, grid_width, grid_height, nullptr);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height,
                                                  CUstream hStream) {
  return phos::legacy_launch::launch(f, grid_width, grid_height, hStream);
}

// Contexts' usage counts (phos/common/context_usage.h).
PHOS_CU_EXPORT CUresult CUDAAPI cuCtxAttach(CUcontext* pctx, unsigned int flags) {
  return phos::context_usage::attach(pctx, flags);
}
PHOS_CU_EXPORT CUresult CUDAAPI cuCtxDetach(CUcontext ctx) {
  return phos::context_usage::detach(ctx);
}
