// SPDX-License-Identifier: Apache-2.0
// ServerCall: decoding checks, handle translation and replies.
// handleTypeName() is defined here: before any header includes handle_types.h.
#define PHOS_HANDLE_TYPE_NAMES
#include "session/server_call.h"

#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "phos/cuda_api/handle_types.h"
#include "session/handle_table.h"
#include "session/session.h"

namespace phos::daemon {
namespace {

// Where CUDA reports the errors of asynchronous work: the synchronizing calls.
bool synchronizing(cuda_api::EntryPointId id) {
  if (static_cast<size_t>(id) >= cuda_api::kEntryPointCount) return false;
  std::string_view name = cuda_api::entryPoint(id).publicName;
  return name == "cuCtxSynchronize" || name == "cuStreamSynchronize" || name == "cuEventSynchronize" ||
         name == "cuMemcpyDtoH" || name == "cuMemcpyHtoD" || name == "cuMemcpy" || name == "cuMemcpyDtoD";
}

}  // namespace

ServerCall::ServerCall(Session& session, const ipc::CallHeader& header, std::span<const std::byte> args,
                       bool expectsReply, std::span<std::byte> replyBuffer)
    : session_(session), driver_(session.driver()), header_(header), args_(args), expectsReply_(expectsReply),
      replyBuffer_(replyBuffer), replyEncoder_(replyBuffer) {}

bool ServerCall::argumentsComplete() {
  if (args_.ok() && args_.atEnd()) return true;
  log::get("daemon")->warn("session {}: malformed arguments of {} ({} bytes left)", session_.id(),
                           cuda_api::entryPoint(entry()).symbol, args_.remaining());
  fail(CUDA_ERROR_INVALID_VALUE);
  return false;
}

bool ServerCall::resolveRaw(HandleType type, uint64_t id, void** out) {
  if (id == 0) {
    *out = nullptr;
    return true;
  }
  void* real = nullptr;
  if (type == HandleType::kCUctx_st) {
    const SessionContext* context = session_.contexts().find(id);
    real = context != nullptr ? context->real : nullptr;
  } else {
    real = session_.handles().resolve(type, id);
  }
  if (real == nullptr) {
    // What the driver answers for a handle that names nothing: memory pools'
    // and graphs' entry points document INVALID_VALUE only.
    const bool valueOnly = type == HandleType::kCUmemPoolHandle_st ||
                           type == HandleType::kCUgraph_st || type == HandleType::kCUgraphExec_st ||
                           type == HandleType::kCUgraphNode_st;
    fail(type == HandleType::kCUctx_st ? CUDA_ERROR_INVALID_CONTEXT
         : valueOnly                   ? CUDA_ERROR_INVALID_VALUE
                                       : CUDA_ERROR_INVALID_HANDLE);
    return false;
  }
  *out = real;
  return true;
}

bool ServerCall::resolveStream(uint64_t id, bool perThreadVariant, CUstream* out) {
  const auto legacy = reinterpret_cast<uint64_t>(CU_STREAM_LEGACY);
  const auto perThread = reinterpret_cast<uint64_t>(CU_STREAM_PER_THREAD);
  if (id == perThread || (id == 0 && perThreadVariant)) {
    auto s = session_.streamsAndEvents().perThreadStream(session_.driver(), header_.thread, session_.currentContext());
    if (!s.isOk()) {
      fail(CUDA_ERROR_OUT_OF_MEMORY);
      return false;
    }
    *out = *s;
    return true;
  }
  if (id == 0 || id == legacy) {
    *out = reinterpret_cast<CUstream>(id);
    return true;
  }
  return resolve(HandleType::kCUstream_st, id, out);
}

bool ServerCall::resolveFunction(uint64_t id, CUfunction* out) {
  if (HandleTable::typeOf(id) == HandleType::kCUkern_st) {
    CUkernel k{};
    if (!resolve(HandleType::kCUkern_st, id, &k)) return false;
    CUresult r = PHOS_DRIVER(driver_, KernelGetFunction)(out, k);
    if (r != CUDA_SUCCESS) {
      fail(r);
      return false;
    }
    if (entry() == cuda_api::EntryPointId::kCuFuncSetAttribute) {
      session_.noteKernelFunction(id);
    }
    return true;
  }
  return resolve(HandleType::kCUfunc_st, id, out);
}

bool ServerCall::perThreadEntry() const {
  return static_cast<size_t>(entry()) < cuda_api::kEntryPointCount &&
         cuda_api::entryPoint(entry()).origin == cuda_api::EntryPointOrigin::kPerThread;
}

bool ServerCall::checkDevicePointer(CUdeviceptr p) {
  if (p == 0 || session_.memory().find(p) != nullptr || session_.findPinned(p) != nullptr) return true;
  // cuMemGetAddressRange documents CUDA_ERROR_NOT_FOUND for an address no
  // allocation contains.
  const bool lookup = cuda_api::entryPoint(entry()).publicName == std::string_view("cuMemGetAddressRange");
  fail(lookup ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_VALUE);
  return false;
}

bool ServerCall::checkDeviceRange(CUdeviceptr p, size_t bytes) {
  if (bytes == 0 || session_.ownsRange(p, bytes)) return true;
  fail(CUDA_ERROR_INVALID_VALUE);
  return false;
}

ipc::Encoder& ServerCall::reply(CUresult result) {
  if (expectsReply_ && result == CUDA_SUCCESS && synchronizing(entry())) {
    result = session_.takeDeferredError();
  }
  // A call that needed the current context while the thread's current one
  // had been destroyed (on another thread): CUDA says so.
  if (result == CUDA_ERROR_INVALID_CONTEXT && session_.contextDestroyed(header_.context)) {
    result = CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }
  result_ = result;
  replyEncoder_ = ipc::Encoder(replyBuffer_);
  ipc::ReplyHeader h;
  h.result = static_cast<int32_t>(result);
  // Kernel printf output reaches the application at synchronization points,
  // as CUDA flushes it.
  if (expectsReply_ && synchronizing(entry()) && session_.outputPending()) h.flags |= ipc::kReplyOutputPending;
  replyEncoder_.value(h);
  return replyEncoder_;
}

uint64_t ServerCall::exportHandle(HandleType type, CUresult result, void* real) {
  if (result != CUDA_SUCCESS) return 0;
  const uint64_t id = session_.handles().exportHandle(type, real);
  session_.noteContextObject(type, id);
  return id;
}

std::optional<ipc::TransferLane> ServerCall::lane() const {
  if ((header_.flags & ipc::kCallThroughLane) == 0) return std::nullopt;
  return session_.transferLane(ipc::callLane(header_.flags));
}

std::optional<CUresult> ServerCall::refuseInCapture(CUstream stream) {
  if (session_.captures().active() == 0) return std::nullopt;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = PHOS_DRIVER(driver_, StreamIsCapturing)(stream, &status);
  if (r == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_NONE) return std::nullopt;
  // Querying a capturing stream is illegal: the driver invalidates its capture.
  (void)PHOS_DRIVER(driver_, StreamQuery)(stream);
  if (r != CUDA_SUCCESS) return r;  // the legacy stream beside a capture: CUDA's own answer
  return status == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                                        : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

bool ServerCall::capturing(CUstream stream) {
  if (session_.captures().active() == 0) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return PHOS_DRIVER(driver_, StreamIsCapturing)(stream, &status) != CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

std::optional<CUresult> ServerCall::refuseUnsafeInCapture() {
  const StreamCaptures& captures = session_.captures();
  if (captures.active() == 0 || !captures.prohibited(header_.thread)) return std::nullopt;
  for (CUstream origin : captures.ownStrictCaptures(header_.thread)) {
    (void)PHOS_DRIVER(driver_, StreamQuery)(origin);
  }
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

void ServerCall::send() {
  if (sent_) return;
  sent_ = true;
  if (!expectsReply_ && result_ != CUDA_SUCCESS) session_.deferError(result_);
  if (replyEncoder_.overflow()) {
    // Outputs larger than a slot: a bug in the server function, not the client's.
    log::get("daemon")->error("reply of {} does not fit a ring slot", cuda_api::entryPoint(entry()).symbol);
    reply(CUDA_ERROR_UNKNOWN);
  }
}

void ServerCall::fail(CUresult result) {
  reply(result);
  send();
}

}  // namespace phos::daemon
