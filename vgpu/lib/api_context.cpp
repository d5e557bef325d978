// SPDX-License-Identifier: Apache-2.0
// Entry points: primary contexts, created contexts, the per-thread context stack, limits, peer access,
// profiler control.
#include "entry.h"

#include "phos/export_tables/export_tables.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::requireNonNull;

namespace {

constexpr unsigned kApiVersion = 13000;

Result<std::shared_ptr<Context>> contextOrCurrent(Driver& d, CUcontext ctx) {
  if (ctx == nullptr) return d.current();
  return d.context(ctx);
}

Status validateLimit(CUlimit limit) {
  switch (limit) {
    case CU_LIMIT_STACK_SIZE:
    case CU_LIMIT_PRINTF_FIFO_SIZE:
    case CU_LIMIT_MALLOC_HEAP_SIZE:
    case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH:
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
      return Status::ok();
    case CU_LIMIT_SHMEM_SIZE:
    case CU_LIMIT_CIG_ENABLED:
    case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED:
      return cuErrorf(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit {} applies to CIG contexts only", static_cast<int>(limit));
    default:
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "limit {} does not exist", static_cast<int>(limit));
  }
}

}  // namespace

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pctx, "pctx"));
    ASSIGN_OR_RETURN(auto context, d.retainPrimary(dev));
    *pctx = context->handle();
    return Status::ok();
  });
}

// The CUDA runtime's context-local storage dies with the context; its
// destructors run outside the driver's locks (they may call the driver).
CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  CUcontext released = nullptr;
  CUresult r = call(__func__, [&](Driver& d) {
    const CUcontext before = d.primaryHandle(dev);
    Status s = d.releasePrimary(dev);
    if (s.isOk() && d.primaryHandle(dev) == nullptr) released = before;
    return s;
  });
  if (released != nullptr) export_tables::contextDestroyed(released);
  return r;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  CUcontext reset = nullptr;
  CUresult r = call(__func__, [&](Driver& d) {
    reset = d.primaryHandle(dev);
    return d.resetPrimary(dev);
  });
  if (r == CUDA_SUCCESS && reset != nullptr) export_tables::contextDestroyed(reset);
  return r;
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  return call(__func__, [&](Driver& d) { return d.setPrimaryFlags(dev, flags); });
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(flags, "flags"));
    RETURN_IF_ERROR(requireNonNull(active, "active"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    d.primaryState(dev, flags, active);
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pctx, "pctx"));
    if (params != nullptr && (params->execAffinityParams != nullptr || params->numExecAffinityParams != 0 ||
                              params->cigParams != nullptr)) {
      return cuError(CUDA_ERROR_NOT_SUPPORTED, "execution affinity and CIG contexts are not supported");
    }
    ASSIGN_OR_RETURN(auto context, d.createContext(dev, flags));
    // "The context is created with a usage count of 1 and ... made current to the calling thread."
    d.pushCurrent(context);
    *pctx = context->handle();
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  CUresult r = call(__func__, [&](Driver& d) { return d.destroyContext(ctx); });
  if (r == CUDA_SUCCESS) export_tables::contextDestroyed(ctx);
  return r;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.context(ctx));
    d.pushCurrent(context);
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.popCurrent());
    if (pctx != nullptr) *pctx = context->handle();
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  return call(__func__, [&](Driver& d) -> Status {
    if (ctx == nullptr) {
      d.setCurrent(nullptr);
      return Status::ok();
    }
    ASSIGN_OR_RETURN(auto context, d.context(ctx));
    d.setCurrent(context);
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pctx, "pctx"));
    auto context = d.currentOrNull();
    *pctx = context ? context->handle() : nullptr;
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(device, "device"));
    ASSIGN_OR_RETURN(auto context, d.current());
    *device = context->device();
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(device, "device"));
    ASSIGN_OR_RETURN(auto context, contextOrCurrent(d, ctx));
    *device = context->device();
    return Status::ok();
  });
}

// Execution affinity: vgpu creates no context with a limited SM count
// (cuCtxCreate refuses affinity parameters), so a context has its device's.
CUresult CUDAAPI cuCtxGetExecAffinity(CUexecAffinityParam* pExecAffinity, CUexecAffinityType type) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pExecAffinity, "pExecAffinity"));
    if (type != CU_EXEC_AFFINITY_TYPE_SM_COUNT) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "execution affinity type {} is invalid",
                      static_cast<int>(type));
    }
    ASSIGN_OR_RETURN(auto context, d.current());
    *pExecAffinity = CUexecAffinityParam{};
    pExecAffinity->type = type;
    pExecAffinity->param.smCount.val = static_cast<unsigned>(
        d.platform().devices.at(static_cast<std::size_t>(context->device())).multiprocessors);
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetExecAffinitySupport(int* pi, CUexecAffinityType type, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pi, "pi"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    if (type != CU_EXEC_AFFINITY_TYPE_SM_COUNT) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "execution affinity type {} is invalid",
                      static_cast<int>(type));
    }
    *pi = 0;  // contexts with an SM count of their own are not supported
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetFlags(unsigned int* flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(flags, "flags"));
    ASSIGN_OR_RETURN(auto context, d.current());
    *flags = context->flags();
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxSetFlags(unsigned int flags) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    unsigned sched = flags & CU_CTX_SCHED_MASK;
    if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0 || sched == 3 || sched > 4) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "context flags 0x{:x} are invalid", flags);
    }
    context->setFlags(flags);
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(ctxId, "ctxId"));
    ASSIGN_OR_RETURN(auto context, contextOrCurrent(d, ctx));
    *ctxId = context->id();
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    return d.synchronizeContext(*context);
  });
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, contextOrCurrent(d, ctx));
    RETURN_IF_ERROR(context->usable());
    return d.synchronizeContext(*context);
  });
}

CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    RETURN_IF_ERROR(validateLimit(limit));
    if (limit == CU_LIMIT_MAX_L2_FETCH_GRANULARITY && value > 128) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "L2 fetch granularity {} is above 128", value);
    }
    std::lock_guard lock(context->mutex());
    context->limits[limit] = value;
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pvalue, "pvalue"));
    ASSIGN_OR_RETURN(auto context, d.current());
    RETURN_IF_ERROR(validateLimit(limit));
    std::lock_guard lock(context->mutex());
    *pvalue = context->limits[limit];
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(version, "version"));
    ASSIGN_OR_RETURN(auto context, contextOrCurrent(d, ctx));
    (void)context;
    *version = kApiVersion;
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    // As on A100/H100: 0 is the least (default) priority, -5 the greatest.
    if (leastPriority != nullptr) *leastPriority = 0;
    if (greatestPriority != nullptr) *greatestPriority = -5;
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxGetCacheConfig(CUfunc_cache* pconfig) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pconfig, "pconfig"));
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    *pconfig = CU_FUNC_CACHE_PREFER_NONE;
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxSetCacheConfig(CUfunc_cache config) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "invalid cache configuration");
    }
    return Status::ok();  // a preference; vgpu has no L1 to split
  });
}

// Shared memory banks (deprecated): fixed at four bytes since Maxwell, so the
// getter answers that and the setter "will do nothing", after checking.
CUresult CUDAAPI cuCtxGetSharedMemConfig(CUsharedconfig* pConfig) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pConfig, "pConfig"));
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    *pConfig = CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE;
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxSetSharedMemConfig(CUsharedconfig config) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    if (config < CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE ||
        config > CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "shared memory configuration {} is invalid",
                      static_cast<int>(config));
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    ASSIGN_OR_RETURN(auto peer, d.context(peerContext));
    // "Flags: Reserved for future use and must be set to 0".
    if (Flags != 0) return cuError(CUDA_ERROR_INVALID_VALUE, "Flags must be 0");
    // "CUDA_ERROR_INVALID_DEVICE if cuDeviceCanAccessPeer() indicates that the
    // CUdevice of the current context cannot directly access memory from the
    // CUdevice of peerContext": never for two distinct vgpu devices.
    if (peer->device() == context->device()) {
      return cuError(CUDA_ERROR_INVALID_DEVICE, "peer access between contexts of the same device");
    }
    if (!context->addPeer(peer->id())) {
      return cuError(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled");
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto context, d.current());
    ASSIGN_OR_RETURN(auto peer, d.context(peerContext));
    if (!context->removePeer(peer->id())) {
      return cuError(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled");
    }
    return Status::ok();
  });
}

// Profiler control (cudaProfiler.h). Start and stop bracket what the active
// profiling tool collects for the current context; vgpu has no profiling tool,
// so with a current context they succeed and change nothing, as they do on a GPU
// with no profiler attached.
CUresult CUDAAPI cuProfilerStart(void) {
  return call(__func__, [&](Driver& d) -> Status { return d.current().status(); });
}

CUresult CUDAAPI cuProfilerStop(void) {
  return call(__func__, [&](Driver& d) -> Status { return d.current().status(); });
}

// "Starting with CUDA 12.0, it always returns error code CUDA_ERROR_NOT_SUPPORTED."
CUresult CUDAAPI cuProfilerInitialize(const char*, const char*, CUoutput_mode) {
  return call(__func__, [&](Driver&) -> Status {
    return makeError(Code::kNotSupported, "cuProfilerInitialize is deprecated: CUDA 12.0 and later do not support it");
  });
}
