// SPDX-License-Identifier: Apache-2.0
// Entry points: streams, events, host functions and stream callbacks.
#include <algorithm>

#include "entry.h"
#include "phos/common/launch_attributes.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::requireNonNull;

PHOS_CU_EXPORT CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void* userData,
                                                         unsigned int flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData);
PHOS_CU_EXPORT CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream hStream, int* priority);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetAttribute_ptsz(CUstream hStream, CUstreamAttrID attr,
                                                          CUstreamAttrValue* value_out);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamSetAttribute_ptsz(CUstream hStream, CUstreamAttrID attr,
                                                          const CUstreamAttrValue* value);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamCopyAttributes_ptsz(CUstream dst, CUstream src);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetId_ptsz(CUstream hStream, unsigned long long* streamId);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetDevice_ptsz(CUstream hStream, CUdevice* device);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext* pCtx,
                                                       CUgreenCtx* pGreenCtx);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamWaitValue32_v2_ptsz(CUstream stream, CUdeviceptr addr,
                                                            cuuint32_t value, unsigned int flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamWaitValue64_v2_ptsz(CUstream stream, CUdeviceptr addr,
                                                            cuuint64_t value, unsigned int flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamWriteValue32_v2_ptsz(CUstream stream, CUdeviceptr addr,
                                                             cuuint32_t value, unsigned int flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamWriteValue64_v2_ptsz(CUstream stream, CUdeviceptr addr,
                                                             cuuint64_t value, unsigned int flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamBatchMemOp_v2_ptsz(CUstream stream, unsigned int count,
                                                           CUstreamBatchMemOpParams* paramArray,
                                                           unsigned int flags);

namespace {

CUresult streamQuery(const char* name, CUstream hStream, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    RETURN_IF_ERROR(ref.context->usable());
    RETURN_IF_ERROR(d.refuseInCapture(ref, "cuStreamQuery"));
    // "Returns CUDA_SUCCESS if all operations in the stream specified by hStream
    // have completed, or CUDA_ERROR_NOT_READY if not."
    if (!ref.stream->isComplete(ref.stream->lastEnqueued())) {
      return cuError(CUDA_ERROR_NOT_READY, "the stream has pending work");
    }
    return Status::ok();
  });
}

CUresult streamSynchronize(const char* name, CUstream hStream, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    return d.synchronizeStream(ref);
  });
}

CUresult streamWaitEvent(const char* name, CUstream hStream, CUevent hEvent, unsigned int flags, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    // "flags: See CUevent_capture_flags": CU_EVENT_WAIT_DEFAULT or CU_EVENT_WAIT_EXTERNAL.
    if (flags != CU_EVENT_WAIT_DEFAULT && flags != CU_EVENT_WAIT_EXTERNAL) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "wait flags 0x{:x} are invalid", flags);
    }
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    return d.waitEvent(ref, hEvent);
  });
}

CUresult launchHostFunc(const char* name, CUstream hStream, CUhostFn fn, void* userData, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(reinterpret_cast<const void*>(fn), "fn"));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    return ref.context
        ->submit(
            ref.stream,
            [fn, userData] {
              fn(userData);
              return Status::ok();
            },
            {},
            [&] {
              NodeInfo info{CU_GRAPH_NODE_TYPE_HOST, std::nullopt};
              info.host = CUDA_HOST_NODE_PARAMS{fn, userData};
              return info;
            }())
        .status();
  });
}

CUresult streamAddCallback(const char* name, CUstream hStream, CUstreamCallback callback, void* userData,
                           unsigned int flags, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(reinterpret_cast<const void*>(callback), "callback"));
    // "flags: Reserved for future use, must be 0".
    if (flags != 0) return cuError(CUDA_ERROR_INVALID_VALUE, "flags must be 0");
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    // A callback gets the stream's status, which a graph node has not: host
    // functions (cuLaunchHostFunc) are what captures take.
    RETURN_IF_ERROR(d.refuseInCapture(ref, "cuStreamAddCallback"));
    std::weak_ptr<Context> weakContext = ref.context;
    return ref.context
        ->submit(ref.stream,
                 [callback, userData, hStream, weakContext] {
                   // "status: CUDA_SUCCESS or any persistent error on the stream".
                   CUresult status = CUDA_SUCCESS;
                   if (auto context = weakContext.lock()) status = context->stickyError();
                   callback(hStream, status, userData);
                   return Status::ok();
                 })
        .status();
  });
}

CUresult eventRecord(const char* name, CUevent hEvent, CUstream hStream, unsigned int flags, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    if (flags != CU_EVENT_RECORD_DEFAULT && flags != CU_EVENT_RECORD_EXTERNAL) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "record flags 0x{:x} are invalid", flags);
    }
    ASSIGN_OR_RETURN(auto e, d.event(hEvent));
    (void)e;
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    return d.recordEvent(hEvent, ref);
  });
}

template <typename Body>
CUresult streamProperty(const char* name, CUstream hStream, bool perThread, const void* out, Body&& body) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(out, "output"));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    body(ref);
    return Status::ok();
  });
}

Status requireStreamAttribute(CUstreamAttrID attr) {
  if (isStreamAttribute(attr)) return Status::ok();
  return cuErrorf(CUDA_ERROR_INVALID_VALUE, "attribute {} is not a stream attribute",
                  static_cast<int>(attr));
}

// What cuStreamSetAttribute accepts for `attr` on a stream of device
// `device`, as cuda.h documents each member.
Status checkStreamAttribute(Driver& d, int device, CUstreamAttrID attr,
                            const CUstreamAttrValue& v) {
  switch (attr) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW: {
      const CUaccessPolicyWindow& w = v.accessPolicyWindow;
      ASSIGN_OR_RETURN(
          int maxBytes,
          deviceAttribute(d.platform(), device, CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE));
      // "hitRatio specifies percentage of lines assigned hitProp"; missProp
      // "must be either NORMAL or STREAMING".
      if (!(w.hitRatio >= 0.0f && w.hitRatio <= 1.0f)) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                        "access policy window hit ratio {} is outside [0, 1]", w.hitRatio);
      }
      const int hit = static_cast<int>(w.hitProp);
      if (hit < CU_ACCESS_PROPERTY_NORMAL || hit > CU_ACCESS_PROPERTY_PERSISTING ||
          (w.missProp != CU_ACCESS_PROPERTY_NORMAL && w.missProp != CU_ACCESS_PROPERTY_STREAMING)) {
        return cuError(CUDA_ERROR_INVALID_VALUE, "access policy window properties are invalid");
      }
      if (w.num_bytes > static_cast<size_t>(maxBytes)) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                        "access policy window of {} bytes exceeds the device's {}", w.num_bytes,
                        maxBytes);
      }
      return Status::ok();
    }
    case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
      if (static_cast<int>(v.syncPolicy) < CU_SYNC_POLICY_AUTO ||
          v.syncPolicy > CU_SYNC_POLICY_BLOCKING_SYNC) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "synchronization policy {} is invalid",
                        static_cast<int>(v.syncPolicy));
      }
      return Status::ok();
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP: {
      ASSIGN_OR_RETURN(int domains, deviceAttribute(d.platform(), device,
                                                    CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT));
      if (v.memSyncDomainMap.default_ >= domains || v.memSyncDomainMap.remote >= domains) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                        "memory synchronization domain map names a domain beyond the device's {}",
                        domains);
      }
      return Status::ok();
    }
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      if (v.memSyncDomain != CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT &&
          v.memSyncDomain != CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "memory synchronization domain {} is invalid",
                        static_cast<int>(v.memSyncDomain));
      }
      return Status::ok();
    case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING:
      // "Valid values ... are 0 (disabled) and 1 (enabled)."
      if (v.nvlinkUtilCentricScheduling > 1) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "NVLink-centric scheduling {} is neither 0 nor 1",
                        v.nvlinkUtilCentricScheduling);
      }
      return Status::ok();
    default:  // the priority: clamped, as at creation
      return Status::ok();
  }
}

CUresult streamGetAttribute(const char* name, CUstream hStream, CUstreamAttrID attr,
                            CUstreamAttrValue* out, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(out, "value_out"));
    RETURN_IF_ERROR(requireStreamAttribute(attr));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    // Only the member of `attr` is written.
    CUstreamAttrValue v = ref.stream->attribute(attr);
    switch (attr) {
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
        out->accessPolicyWindow = v.accessPolicyWindow;
        break;
      case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
        out->syncPolicy = v.syncPolicy;
        break;
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
        out->priority = ref.stream->priority();
        break;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        out->memSyncDomainMap = v.memSyncDomainMap;
        break;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
        out->memSyncDomain = v.memSyncDomain;
        break;
      default:
        out->nvlinkUtilCentricScheduling = v.nvlinkUtilCentricScheduling;
        break;
    }
    return Status::ok();
  });
}

CUresult streamSetAttribute(const char* name, CUstream hStream, CUstreamAttrID attr,
                            const CUstreamAttrValue* value, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value, "value"));
    RETURN_IF_ERROR(requireStreamAttribute(attr));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    RETURN_IF_ERROR(checkStreamAttribute(d, ref.context->device(), attr, *value));
    if (attr == CU_LAUNCH_ATTRIBUTE_PRIORITY) {
      // Clamped to cuCtxGetStreamPriorityRange's [-5, 0], as at creation.
      ref.stream->setPriority(std::clamp(value->priority, -5, 0));
    } else {
      ref.stream->setAttribute(attr, *value);
    }
    return Status::ok();
  });
}

CUresult streamCopyAttributes(const char* name, CUstream dst, CUstream src, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef to, d.stream(dst, perThread));
    ASSIGN_OR_RETURN(StreamRef from, d.stream(src, perThread));
    // "Both streams must have the same context."
    if (to.context != from.context) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "the streams belong to different contexts");
    }
    for (CUstreamAttrID a : kStreamAttributes) {
      if (a == CU_LAUNCH_ATTRIBUTE_PRIORITY) {
        to.stream->setPriority(from.stream->priority());
      } else {
        to.stream->setAttribute(a, from.stream->attribute(a));
      }
    }
    return Status::ok();
  });
}

}  // namespace

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return cuStreamCreateWithPriority(phStream, Flags, 0);
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phStream, "phStream"));
    ASSIGN_OR_RETURN(CUstream stream, d.createStream(flags, priority));
    *phStream = stream;
    return Status::ok();
  });
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  return call(__func__, [&](Driver& d) { return d.destroyStream(hStream); });
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) { return streamQuery(__func__, hStream, false); }
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) { return streamQuery(__func__, hStream, true); }
CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) { return streamSynchronize(__func__, hStream, false); }
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) { return streamSynchronize(__func__, hStream, true); }
CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return streamWaitEvent(__func__, hStream, hEvent, Flags, false);
}
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return streamWaitEvent(__func__, hStream, hEvent, Flags, true);
}
CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  return launchHostFunc(__func__, hStream, fn, userData, false);
}
CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  return launchHostFunc(__func__, hStream, fn, userData, true);
}
CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void* userData, unsigned int flags) {
  return streamAddCallback(__func__, hStream, callback, userData, flags, false);
}
CUresult CUDAAPI cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void* userData,
                                          unsigned int flags) {
  return streamAddCallback(__func__, hStream, callback, userData, flags, true);
}

CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int* priority) {
  return streamProperty(__func__, hStream, false, priority, [&](const StreamRef& r) { *priority = r.stream->priority(); });
}
CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream hStream, int* priority) {
  return streamProperty(__func__, hStream, true, priority, [&](const StreamRef& r) { *priority = r.stream->priority(); });
}
CUresult CUDAAPI cuStreamGetAttribute(CUstream hStream, CUstreamAttrID attr,
                                      CUstreamAttrValue* value_out) {
  return streamGetAttribute(__func__, hStream, attr, value_out, false);
}
CUresult CUDAAPI cuStreamGetAttribute_ptsz(CUstream hStream, CUstreamAttrID attr,
                                           CUstreamAttrValue* value_out) {
  return streamGetAttribute(__func__, hStream, attr, value_out, true);
}
CUresult CUDAAPI cuStreamSetAttribute(CUstream hStream, CUstreamAttrID attr,
                                      const CUstreamAttrValue* value) {
  return streamSetAttribute(__func__, hStream, attr, value, false);
}
CUresult CUDAAPI cuStreamSetAttribute_ptsz(CUstream hStream, CUstreamAttrID attr,
                                           const CUstreamAttrValue* value) {
  return streamSetAttribute(__func__, hStream, attr, value, true);
}
CUresult CUDAAPI cuStreamCopyAttributes(CUstream dst, CUstream src) {
  return streamCopyAttributes(__func__, dst, src, false);
}
CUresult CUDAAPI cuStreamCopyAttributes_ptsz(CUstream dst, CUstream src) {
  return streamCopyAttributes(__func__, dst, src, true);
}
CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  return streamProperty(__func__, hStream, false, flags, [&](const StreamRef& r) { *flags = r.stream->flags(); });
}
CUresult CUDAAPI cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags) {
  return streamProperty(__func__, hStream, true, flags, [&](const StreamRef& r) { *flags = r.stream->flags(); });
}
CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long* streamId) {
  return streamProperty(__func__, hStream, false, streamId, [&](const StreamRef& r) { *streamId = r.stream->id(); });
}
CUresult CUDAAPI cuStreamGetId_ptsz(CUstream hStream, unsigned long long* streamId) {
  return streamProperty(__func__, hStream, true, streamId, [&](const StreamRef& r) { *streamId = r.stream->id(); });
}
CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  return streamProperty(__func__, hStream, false, pctx, [&](const StreamRef& r) { *pctx = r.context->handle(); });
}
CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) {
  return streamProperty(__func__, hStream, true, pctx, [&](const StreamRef& r) { *pctx = r.context->handle(); });
}
// vgpu has no green contexts: the stream's context, and a NULL green context.
CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  return streamProperty(__func__, hStream, false, pCtx, [&](const StreamRef& r) {
    *pCtx = r.context->handle();
    if (pGreenCtx != nullptr) *pGreenCtx = nullptr;
  });
}
CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  return streamProperty(__func__, hStream, true, pCtx, [&](const StreamRef& r) {
    *pCtx = r.context->handle();
    if (pGreenCtx != nullptr) *pGreenCtx = nullptr;
  });
}
CUresult CUDAAPI cuStreamGetDevice(CUstream hStream, CUdevice* device) {
  return streamProperty(__func__, hStream, false, device, [&](const StreamRef& r) { *device = r.context->device(); });
}
CUresult CUDAAPI cuStreamGetDevice_ptsz(CUstream hStream, CUdevice* device) {
  return streamProperty(__func__, hStream, true, device, [&](const StreamRef& r) { *device = r.context->device(); });
}

// --- events ----------------------------------------------------------------------------------

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phEvent, "phEvent"));
    ASSIGN_OR_RETURN(CUevent e, d.createEvent(Flags));
    *phEvent = e;
    return Status::ok();
  });
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  return call(__func__, [&](Driver& d) { return d.destroyEvent(hEvent); });
}

CUresult CUDAAPI cuCtxRecordEvent(CUcontext hCtx, CUevent hEvent) {
  return call(__func__, [&](Driver& d) { return d.recordContextEvent(hCtx, hEvent); });
}
CUresult CUDAAPI cuCtxWaitEvent(CUcontext hCtx, CUevent hEvent) {
  return call(__func__, [&](Driver& d) { return d.contextWaitEvent(hCtx, hEvent); });
}
CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) { return eventRecord(__func__, hEvent, hStream, 0, false); }
CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  return eventRecord(__func__, hEvent, hStream, 0, true);
}
CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return eventRecord(__func__, hEvent, hStream, flags, false);
}
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return eventRecord(__func__, hEvent, hStream, flags, true);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto e, d.event(hEvent));
    auto record = e->record();
    // "If cuEventRecord() has not been called on this event, the function returns CUDA_SUCCESS".
    if (!record || record->completed.load(std::memory_order_acquire)) return Status::ok();
    return cuError(CUDA_ERROR_NOT_READY, "the event's work has not completed");
  });
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto e, d.event(hEvent));
    auto record = e->record();
    if (!record) return Status::ok();
    record->stream->wait(record->seq);
    return Status::ok();
  });
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pMilliseconds, "pMilliseconds"));
    ASSIGN_OR_RETURN(auto start, d.event(hStart));
    ASSIGN_OR_RETURN(auto end, d.event(hEnd));
    // "If either event was created with the CU_EVENT_DISABLE_TIMING flag, then
    // this function will return CUDA_ERROR_INVALID_HANDLE."
    if (((start->flags() | end->flags()) & CU_EVENT_DISABLE_TIMING) != 0) {
      return cuError(CUDA_ERROR_INVALID_HANDLE, "an event was created with CU_EVENT_DISABLE_TIMING");
    }
    auto a = start->record();
    auto b = end->record();
    // "If cuEventRecord() has not been called on either event then
    // CUDA_ERROR_INVALID_HANDLE is returned."
    if (!a || !b) return cuError(CUDA_ERROR_INVALID_HANDLE, "an event has not been recorded");
    // "If cuEventRecord() has been called on both events but one or both of them
    // has not yet been completed ... CUDA_ERROR_NOT_READY is returned."
    if (!a->completed.load(std::memory_order_acquire) || !b->completed.load(std::memory_order_acquire)) {
      return cuError(CUDA_ERROR_NOT_READY, "an event has not completed");
    }
    *pMilliseconds = std::chrono::duration<float, std::milli>(b->time - a->time).count();
    return Status::ok();
  });
}

// --- stream memory operations -----------------------------------------------------------------
// The CUDA 11.7 revision (_v2); the first one (without a suffix) needed
// CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, which vgpu's devices report 0.

namespace {

CUresult memOps(const char* name, CUstream hStream, std::vector<CUstreamBatchMemOpParams> ops,
                bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    return d.streamMemOps(ref, std::move(ops), name);
  });
}

// One wait or write of a 32- or 64-bit word, as a batch of one.
template <typename Word>
CUresult oneOp(const char* name, CUstream stream, bool wait, CUdeviceptr addr, Word value,
               unsigned flags, bool perThread) {
  constexpr bool kWide = sizeof(Word) == 8;
  CUstreamBatchMemOpParams op{};
  auto fill = [&](auto& params, CUstreamBatchMemOpType type) {
    params.operation = type;
    params.address = addr;
    params.flags = flags;
    if constexpr (kWide) {
      params.value64 = value;
    } else {
      params.value = value;
    }
  };
  if (wait) {
    fill(op.waitValue, kWide ? CU_STREAM_MEM_OP_WAIT_VALUE_64 : CU_STREAM_MEM_OP_WAIT_VALUE_32);
  } else {
    fill(op.writeValue, kWide ? CU_STREAM_MEM_OP_WRITE_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_32);
  }
  return memOps(name, stream, {op}, perThread);
}

CUresult batchMemOp(const char* name, CUstream stream, unsigned count,
                    const CUstreamBatchMemOpParams* paramArray, unsigned flags, bool perThread) {
  // "flags: Reserved for future expansion; must be 0." "count: ... Must be
  // less than 256."
  if (flags != 0 || paramArray == nullptr || count == 0 || count >= 256) {
    return call(name, [&](Driver&) -> Status {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "flags 0x{:x}, {} operations at {}: flags must be 0, 1 to 255 operations",
                      flags, count, static_cast<const void*>(paramArray));
    });
  }
  return memOps(name, stream, {paramArray, paramArray + count}, perThread);
}

}  // namespace

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                        unsigned int flags) {
  return oneOp(__func__, stream, true, addr, value, flags, false);
}
CUresult CUDAAPI cuStreamWaitValue32_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                             unsigned int flags) {
  return oneOp(__func__, stream, true, addr, value, flags, true);
}
CUresult CUDAAPI cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                        unsigned int flags) {
  return oneOp(__func__, stream, true, addr, value, flags, false);
}
CUresult CUDAAPI cuStreamWaitValue64_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                             unsigned int flags) {
  return oneOp(__func__, stream, true, addr, value, flags, true);
}
CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                         unsigned int flags) {
  return oneOp(__func__, stream, false, addr, value, flags, false);
}
CUresult CUDAAPI cuStreamWriteValue32_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                              unsigned int flags) {
  return oneOp(__func__, stream, false, addr, value, flags, true);
}
CUresult CUDAAPI cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                         unsigned int flags) {
  return oneOp(__func__, stream, false, addr, value, flags, false);
}
CUresult CUDAAPI cuStreamWriteValue64_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                              unsigned int flags) {
  return oneOp(__func__, stream, false, addr, value, flags, true);
}
CUresult CUDAAPI cuStreamBatchMemOp_v2(CUstream stream, unsigned int count,
                                       CUstreamBatchMemOpParams* paramArray, unsigned int flags) {
  return batchMemOp(__func__, stream, count, paramArray, flags, false);
}
CUresult CUDAAPI cuStreamBatchMemOp_v2_ptsz(CUstream stream, unsigned int count,
                                            CUstreamBatchMemOpParams* paramArray,
                                            unsigned int flags) {
  return batchMemOp(__func__, stream, count, paramArray, flags, true);
}
