// SPDX-License-Identifier: Apache-2.0
// Server hooks for contexts: created from the worker's pool, and primary
// contexts per session (the driver's primary context is one per process).
#include <cuda.h>

#include "phos/cuda_api/server_hooks.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

uint64_t adoptContext(Session& s, CUcontext real, int device, bool primary) {
  uint64_t id = s.handles().exportHandle(HandleType::kCUctx_st, real);
  s.captureOutput(real);
  s.contexts().adopt(id, SessionContext{real, device, primary});
  return id;
}

// Context flags: only those cuda.h defines, and one scheduling policy at most.
bool validContextFlags(unsigned flags) {
  const unsigned known = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_COREDUMP_ENABLE |
                         CU_CTX_USER_COREDUMP_ENABLE | CU_CTX_SYNC_MEMOPS;
  const unsigned sched = flags & CU_CTX_SCHED_MASK;
  return (flags & ~known) == 0 && (sched == CU_CTX_SCHED_AUTO || sched == CU_CTX_SCHED_SPIN ||
                                   sched == CU_CTX_SCHED_YIELD || sched == CU_CTX_SCHED_BLOCKING_SYNC);
}

bool validDevice(ServerCall& c, int device) {
  int count = 0;
  PHOS_DRIVER(c.driverTable(), DeviceGetCount)(&count);
  return device >= 0 && device < count;
}

// Destroys the driver context; the virtual id stays (a later retain re-binds it).
void releasePrimary(Session& s, PrimaryContext& st) {
  if (s.contexts().contains(st.id)) {
    s.passGate({.everything = true});  // its memory goes with it
    s.destroyContext(st.id);
  }
  st.refs = 0;
}

}  // namespace

CUresult cuCtxCreate(ServerCall& c, uint64_t* pctx, unsigned int flags, CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(c, dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (!validContextFlags(flags)) return CUDA_ERROR_INVALID_VALUE;
  auto ctx = c.session().pool().take(dev, flags);
  if (!ctx.isOk()) return CUDA_ERROR_OUT_OF_MEMORY;
  *pctx = adoptContext(c.session(), *ctx, dev, false);
  return CUDA_SUCCESS;
}

CUresult cuCtxCreate(ServerCall& c, uint64_t* pctx, std::span<const CUexecAffinityParam> paramsArray, int numParams,
                     unsigned int flags, CUdevice dev) {
  if (numParams < 0 || paramsArray.size() != static_cast<size_t>(numParams)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!paramsArray.empty()) return CUDA_ERROR_NOT_SUPPORTED;  // execution affinity is not remoted yet
  return cuCtxCreate(c, pctx, flags, dev);
}

CUresult cuCtxCreate(ServerCall& c, uint64_t* pctx, const CUctxCreateParams* params, unsigned int flags,
                     CUdevice dev) {
  if (params != nullptr && (params->execAffinityParams != nullptr || params->cigParams != nullptr)) {
    return CUDA_ERROR_NOT_SUPPORTED;  // affinity and CIG contexts are not remoted yet
  }
  return cuCtxCreate(c, pctx, flags, dev);
}

CUresult cuCtxDestroy(ServerCall& c, Handle<CUcontext> ctx) {
  const SessionContext* context = c.session().contexts().find(ctx.id);
  if (context == nullptr || context->primary) return CUDA_ERROR_INVALID_CONTEXT;
  c.session().passGate({.everything = true});
  c.session().destroyContext(ctx.id);  // synchronizes it first
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetLuid(ServerCall& c, AttributeValue* luid, unsigned int* deviceNodeMask,
                         CUdevice dev) {
  if (!c.driverTable().has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  if (luid == nullptr || deviceNodeMask == nullptr) return CUDA_ERROR_INVALID_VALUE;
  luid->size = 8;
  return PHOS_DRIVER(c.driverTable(), DeviceGetLuid)(reinterpret_cast<char*>(luid->bytes.data()),
                                                     deviceNodeMask, dev);
}

CUresult cuDevicePrimaryCtxRetain(ServerCall& c, uint64_t* pctx, CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(c, dev)) return CUDA_ERROR_INVALID_DEVICE;
  Session& s = c.session();
  PrimaryContext& st = s.primary(dev);
  if (st.id == 0 || !s.contexts().contains(st.id)) {
    auto ctx = s.pool().take(dev, st.flags);
    if (!ctx.isOk()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (st.id == 0) {
      st.id = adoptContext(s, *ctx, dev, true);
    } else {
      // Released earlier: the same virtual id, a new driver context.
      s.handles().bind(HandleType::kCUctx_st, st.id, *ctx);
      s.contexts().adopt(st.id, SessionContext{*ctx, dev, true});
      s.captureOutput(*ctx);
    }
  }
  ++st.refs;
  *pctx = st.id;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(ServerCall& c, CUdevice dev) {
  if (!validDevice(c, dev)) return CUDA_ERROR_INVALID_DEVICE;
  PrimaryContext& st = c.session().primary(dev);
  if (st.refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--st.refs == 0) releasePrimary(c.session(), st);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(ServerCall& c, CUdevice dev) {
  if (!validDevice(c, dev)) return CUDA_ERROR_INVALID_DEVICE;
  PrimaryContext& st = c.session().primary(dev);
  releasePrimary(c.session(), st);
  st.flags = 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(ServerCall& c, CUdevice dev, unsigned int flags) {
  if (!validDevice(c, dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (!validContextFlags(flags)) return CUDA_ERROR_INVALID_VALUE;
  c.session().primary(dev).flags = flags;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(ServerCall& c, CUdevice dev, unsigned int* flags, int* active) {
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(c, dev)) return CUDA_ERROR_INVALID_DEVICE;
  const PrimaryContext& st = c.session().primary(dev);
  *flags = st.flags;
  *active = st.refs > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

}  // namespace phos::daemon::hooks
