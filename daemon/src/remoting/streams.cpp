// SPDX-License-Identifier: Apache-2.0
// Server hooks for what runs in stream order beside kernels: the
// application's host functions (run in the application through the session's
// host-call queue) and events, whose flags a restore needs.
#include <cuda.h>

#include <memory>

#include "host_calls.h"
#include "phos/common/log.h"
#include "phos/cuda_api/server_hooks.h"
#include "session.h"

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

// The driver has no query for an event's flags, and a restore creates the
// event again with them.
CUresult cuEventCreate(ServerCall& c, uint64_t* phEvent, unsigned int flags) {
  CUevent e = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), EventCreate)(phEvent != nullptr ? &e : nullptr, flags);
  if (r != CUDA_SUCCESS || phEvent == nullptr) return r;
  *phEvent = c.exportHandle(HandleType::kCUevent_st, r, e);
  c.session().recordEventFlags(*phEvent, flags);
  return CUDA_SUCCESS;
}

}  // namespace phos::daemon::hooks
