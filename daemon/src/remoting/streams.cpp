// SPDX-License-Identifier: Apache-2.0
// Server hooks for streams and what runs in stream order beside kernels: the
// application's host functions (run in the application through the session's
// host-call queue), stream attributes, and events, whose flags a restore needs.
#include <cuda.h>
#include <fmt/format.h>

#include <memory>

#include "phos/common/log.h"
#include "phos/cuda_api/server_hooks.h"
#include "session/host_calls.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

// The driver runs phosd's trampoline in stream order; it has the application
// run its function and returns when that has returned.
void CUDA_CB runHostFunction(void* p) {
  std::unique_ptr<PendingHostCall> call(static_cast<PendingHostCall*>(p));
  call->channel->run(ipc::kHostFunction, call->function, call->userData, call->stream, CUDA_SUCCESS);
}

void CUDA_CB runStreamCallback(CUstream, CUresult status, void* p) {
  std::unique_ptr<PendingHostCall> call(static_cast<PendingHostCall*>(p));
  call->channel->run(ipc::kStreamCallback, call->function, call->userData, call->stream, status);
}

// Enqueues phosd's trampoline for the application's function; `queue` is the
// path of the session's host-call queue (the shim maps it and runs what it
// is asked to).
template <typename Enqueue>
CUresult hostCall(ServerCall& c, Handle<CUstream> stream, uint64_t function, uint64_t userData, std::string* queue,
                  Enqueue&& enqueue) {
  if (function == 0) return CUDA_ERROR_INVALID_VALUE;
  auto channel = c.session().hostCalls();
  if (!channel.isOk()) {
    log::get("daemon")->warn("session {}: {}", c.session().id(), channel.status().message());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // The stream handle the application passed is what its callback receives.
  auto pending = std::make_unique<PendingHostCall>(PendingHostCall{*channel, function, userData, stream.id});
  CUresult r = enqueue(pending.get());
  if (r == CUDA_SUCCESS) (void)pending.release();  // the trampoline owns it now
  *queue = (*channel)->path();
  return r;
}

}  // namespace

CUresult cuLaunchHostFunc(ServerCall& c, Handle<CUstream> hStream, uint64_t fn, uint64_t userData, std::string* queue) {
  // Captured, it becomes a graph's host node, which runs at every launch: the
  // trampoline of a graph's host node, which the session keeps, not one that
  // frees its call when it has run.
  if (c.capturing(hStream.real)) {
    if (fn == 0) return CUDA_ERROR_INVALID_VALUE;
    auto node = c.session().graphHostNode(fn, userData, queue);
    if (!node.isOk()) {
      log::get("daemon")->warn("session {}: {}", c.session().id(), node.status().message());
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return PHOS_DRIVER(c.driverTable(), LaunchHostFunc)(hStream.real, node->fn, node->userData);
  }
  return hostCall(c, hStream, fn, userData, queue, [&](PendingHostCall* pending) {
    return PHOS_DRIVER(c.driverTable(), LaunchHostFunc)(hStream.real, runHostFunction, pending);
  });
}

CUresult cuStreamAddCallback(ServerCall& c, Handle<CUstream> hStream, uint64_t callback, uint64_t userData,
                             unsigned int flags, std::string* queue) {
  return hostCall(c, hStream, callback, userData, queue, [&](PendingHostCall* pending) {
    return PHOS_DRIVER(c.driverTable(), StreamAddCallback)(hStream.real, runStreamCallback, pending, flags);
  });
}

// Destroyed, the handle leaves the session (Session::forgetHandle).
CUresult cuStreamDestroy(ServerCall& c, Handle<CUstream> hStream) {
  CUresult r = PHOS_DRIVER(c.driverTable(), StreamDestroy_v2)(hStream.real);
  if (r == CUDA_SUCCESS) {
    c.session().forgetHandle(hStream.id);
    c.session().captures().end(hStream.real);
  }
  return r;
}

// Only the ids cuda.h marks valid for streams reach the driver: a launch
// attribute's union may hold an event (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT),
// whose bytes here would be the application's handle id, not a driver object.
CUresult cuStreamGetAttribute(ServerCall& c, Handle<CUstream> hStream, CUstreamAttrID attr,
                              CUstreamAttrValue* value_out) {
  if (!isStreamAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
  return PHOS_DRIVER(c.driverTable(), StreamGetAttribute)(hStream.real, attr, value_out);
}

// A created stream's attributes are saved by a checkpoint, which asks the
// driver; a default stream's are not, so the session remembers that one was
// set and a checkpoint refuses, naming it.
CUresult cuStreamSetAttribute(ServerCall& c, Handle<CUstream> hStream, CUstreamAttrID attr,
                              const CUstreamAttrValue* value) {
  if (!isStreamAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_DRIVER(c.driverTable(), StreamSetAttribute)(hStream.real, attr, value);
  if (r == CUDA_SUCCESS && StreamsAndEvents::isDefaultStream(hStream.id)) {
    c.session().streamsAndEvents().noteDefaultStreamAttributes(
        hStream.id, fmt::format("attribute {} set on a default stream", static_cast<int>(attr)));
  }
  return r;
}

// Copied into a default stream, attributes are as unsaved as set ones.
CUresult cuStreamCopyAttributes(ServerCall& c, Handle<CUstream> dst, Handle<CUstream> src) {
  CUresult r = PHOS_DRIVER(c.driverTable(), StreamCopyAttributes)(dst.real, src.real);
  if (r == CUDA_SUCCESS && StreamsAndEvents::isDefaultStream(dst.id)) {
    c.session().streamsAndEvents().noteDefaultStreamAttributes(
        dst.id, "attributes copied into a default stream");
  }
  return r;
}

CUresult cuEventDestroy(ServerCall& c, Handle<CUevent> hEvent) {
  CUresult r = PHOS_DRIVER(c.driverTable(), EventDestroy_v2)(hEvent.real);
  if (r == CUDA_SUCCESS) c.session().forgetHandle(hEvent.id);
  return r;
}

// The driver has no query for an event's flags, and a restore creates the
// event again with them.
CUresult cuEventCreate(ServerCall& c, uint64_t* phEvent, unsigned int flags) {
  CUevent e = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), EventCreate)(phEvent != nullptr ? &e : nullptr, flags);
  if (r != CUDA_SUCCESS || phEvent == nullptr) return r;
  *phEvent = c.exportHandle(HandleType::kCUevent_st, r, e);
  c.session().streamsAndEvents().event(*phEvent).flags = flags;
  return CUDA_SUCCESS;
}

// Recorded now: whatever it was recorded as before a restore is forgotten.
CUresult cuEventRecord(ServerCall& c, Handle<CUevent> hEvent, Handle<CUstream> hStream) {
  CUresult r = PHOS_DRIVER(c.driverTable(), EventRecord)(hEvent.real, hStream.real);
  if (r == CUDA_SUCCESS) {
    EventState& e = c.session().streamsAndEvents().event(hEvent.id);
    e.recorded = true;
    e.restoredMs.reset();
  }
  return r;
}

CUresult cuEventRecordWithFlags(ServerCall& c, Handle<CUevent> hEvent, Handle<CUstream> hStream, unsigned int flags) {
  CUresult r = PHOS_DRIVER(c.driverTable(), EventRecordWithFlags)(hEvent.real, hStream.real, flags);
  if (r == CUDA_SUCCESS) {
    EventState& e = c.session().streamsAndEvents().event(hEvent.id);
    e.recorded = true;
    e.restoredMs.reset();
  }
  return r;
}

namespace {

// When `event` (recorded) happened, in milliseconds after the restore's mark:
// its saved time if it was recorded before the checkpoint, else what the
// driver measures from the mark of its context (or of `fallback`'s, for a
// context created since the restore).
CUresult sinceRestore(ServerCall& c, const Handle<CUevent>& event, uint64_t fallback, double* ms) {
  Session& s = c.session();
  const EventState* state = s.streamsAndEvents().findEvent(event.id);
  if (state == nullptr || !state->recorded) return CUDA_ERROR_INVALID_HANDLE;  // never recorded
  if (state->restoredMs) {
    *ms = *state->restoredMs;
    return CUDA_SUCCESS;
  }
  CUevent mark = s.streamsAndEvents().restoreMark(s.contextOf(event.id));
  if (mark == nullptr) mark = s.streamsAndEvents().restoreMark(fallback);
  if (mark == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  float elapsed = 0;
  CUresult r = PHOS_DRIVER(c.driverTable(), EventElapsedTime_v2)(&elapsed, mark, event.real);
  *ms = elapsed;
  return r;
}

}  // namespace

// Between events recorded in this run the driver measures. An event
// recorded before the checkpoint the session was restored from has no
// driver record any more: its saved time answers, measured from the
// restore's mark, so that two such events give their original interval and
// one across the checkpoint a time (the process frozen in between counts
// as no time).
CUresult cuEventElapsedTime(ServerCall& c, float* pMilliseconds, Handle<CUevent> hStart, Handle<CUevent> hEnd) {
  Session& s = c.session();
  const EventState* start = s.streamsAndEvents().findEvent(hStart.id);
  const EventState* end = s.streamsAndEvents().findEvent(hEnd.id);
  const bool restored = (start != nullptr && start->restoredMs) || (end != nullptr && end->restoredMs);
  if (!restored) return PHOS_DRIVER(c.driverTable(), EventElapsedTime_v2)(pMilliseconds, hStart.real, hEnd.real);
  if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // "If either event was created with the CU_EVENT_DISABLE_TIMING flag, then
  // this function will return CUDA_ERROR_INVALID_HANDLE."
  if ((start != nullptr && (start->flags & CU_EVENT_DISABLE_TIMING)) ||
      (end != nullptr && (end->flags & CU_EVENT_DISABLE_TIMING))) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (start != nullptr && end != nullptr && start->restoredMs && end->restoredMs) {
    // Both from before the checkpoint: what the driver measured then.
    if (auto saved = start->restoredIntervals.find(hEnd.id); saved != start->restoredIntervals.end()) {
      *pMilliseconds = saved->second;
      return CUDA_SUCCESS;
    }
  }
  double from = 0, to = 0;
  if (CUresult r = sinceRestore(c, hStart, s.contextOf(hEnd.id), &from); r != CUDA_SUCCESS) return r;
  if (CUresult r = sinceRestore(c, hEnd, s.contextOf(hStart.id), &to); r != CUDA_SUCCESS) return r;
  *pMilliseconds = static_cast<float>(to - from);
  return CUDA_SUCCESS;
}

}  // namespace phos::daemon::hooks
