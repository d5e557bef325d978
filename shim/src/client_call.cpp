// SPDX-License-Identifier: Apache-2.0
// Forwarding one call through the session's ring.
#include "client_call.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "api_trace.h"
#include "connection.h"
#include "phos/common/ipc/transfer_lane.h"
#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "phos/cuda_api/client_hooks.h"
#include "phos/export_tables/driver_logs.h"

namespace phos::shim {
namespace {

// Per thread: one request being built and one reply being read at a time.
// Large enough for any slot phosd configures.
constexpr size_t kBufferBytes = 64 * 1024;

std::span<std::byte> requestBuffer() {
  thread_local std::array<std::byte, kBufferBytes> buffer;
  return buffer;
}
std::span<std::byte> replyBuffer() {
  thread_local std::array<std::byte, kBufferBytes> buffer;
  return buffer;
}

// Once phosd is gone every call fails the same way; say it once.
CUresult daemonGone(const Status& why) {
  if (why.code() == Code::kInvalidArgument || why.code() == Code::kOutOfRange) {
    // Not the daemon: a request or reply larger than a ring slot.
    log::get("shim")->warn("{}", why.message());
    return CUDA_ERROR_INVALID_VALUE;
  }
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) log::get("shim")->error("phosd is gone: {}", why.message());
  return CUDA_ERROR_DEVICE_UNAVAILABLE;
}

// A failure the application sees goes into the driver's error log, as
// NVIDIA's driver puts it there (cuLogs*, CUDA_LOG_FILE). NOT_READY is an
// answer, not a failure; the shim's own calls are not the application's.
CUresult logged(cuda_api::EntryPointId id, CUresult result, std::string_view why = {}) {
  if (result != CUDA_SUCCESS && result != CUDA_ERROR_NOT_READY && !trace::internal()) {
    const char* name = nullptr;
    local::cuGetErrorName(result, &name);
    driver_logs::returning(cuda_api::entryPoint(id).symbol, result, name != nullptr ? name : "?", why);
  }
  return result;
}

}  // namespace

ReplyReader::ReplyReader(std::span<const std::byte> bytes) : result_(CUDA_ERROR_UNKNOWN), ok_(false), decoder_(bytes) {
  auto header = decoder_.value<ipc::ReplyHeader>();
  if (decoder_.ok()) {
    result_ = static_cast<CUresult>(header.result);
    ok_ = true;
  }
}

ClientCall::ClientCall(cuda_api::EntryPointId id) : id_(id), encoder_(requestBuffer()) {
  ipc::CallHeader header;
  header.entry = static_cast<uint32_t>(id);
  header.context = currentContext();
  header.thread = threadId();
  encoder_.value(header);
}

CUresult ClientCall::ready() const {
  if (!Connection::instance().connected()) return CUDA_ERROR_NOT_INITIALIZED;
  if (encoder_.overflow()) {
    log::get("shim")->warn("{}: the call's arguments do not fit a ring slot", cuda_api::entryPoint(id_).symbol);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// Kernel printf output phosd kept for this process: written to the
// application's stdout, as CUDA prints it at a synchronization point. Its own buffers: the caller's reply is still being read.
static void forwardKernelOutput() {
  thread_local std::array<std::byte, kBufferBytes> request, reply;
  for (int round = 0; round < 100000; ++round) {
    ipc::Encoder e(request);
    ipc::CallHeader header;
    header.entry = ipc::kTakeOutputEntry;
    header.thread = threadId();
    e.value(header);
    auto n = Connection::instance().ring().call(e.written(), reply);
    if (!n.isOk()) return;
    ipc::Decoder d(std::span<const std::byte>(reply.data(), *n));
    auto h = d.value<ipc::ReplyHeader>();
    auto text = d.blob();
    auto errors = d.blob();
    if (!d.ok()) return;
    // Through the application's stdio, as vgpu writes it in-process: ordered
    // with what the application itself printed before the synchronization.
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    std::fwrite(errors.data(), 1, errors.size(), stderr);
    std::fflush(stderr);
    if ((h.flags & ipc::kReplyOutputPending) == 0) return;
  }
}

ReplyReader ClientCall::run() {
  if (CUresult r = ready(); r != CUDA_SUCCESS) return ReplyReader(logged(id_, r, "PhOS cannot send the call"));
  auto reply = replyBuffer();
  return finishRun(Connection::instance().ring().call(encoder_.written(), reply), reply);
}

ReplyReader ClientCall::run(const LaneCopy& copy) {
  if (copy.bytes < kLaneMinBytes || ready() != CUDA_SUCCESS) return run();
  Connection& c = Connection::instance();
  auto claimed = c.claimLane();
  if (!claimed || !claimed->lane().carries(copy.bytes)) return run();
  const ipc::TransferLane& lane = claimed->lane();
  // The header leads the request: name the lane in its flags.
  ipc::CallHeader header;
  std::memcpy(&header, requestBuffer().data(), sizeof(header));
  header.flags |= ipc::laneFlags(claimed->index());
  std::memcpy(requestBuffer().data(), &header, sizeof(header));
  ipc::resetLane(lane);
  auto reply = replyBuffer();
  ipc::CallRing& ring = c.ring();
  auto n = ring.call(encoder_.written(), reply, [&](const std::function<bool()>& replied) {
    auto over = [&] { return replied() || !ring.ownerAlive().isOk(); };
    ipc::serveLane(lane, copy.src, copy.dst, copy.bytes, over);
  });
  return finishRun(std::move(n), reply);
}

ReplyReader ClientCall::finishRun(Result<size_t> n, std::span<std::byte> reply) {
  if (!n.isOk()) return ReplyReader(logged(id_, daemonGone(n.status()), n.status().message()));
  ipc::ReplyHeader h{};
  if (*n >= sizeof(h)) {
    std::memcpy(&h, reply.data(), sizeof(h));
    if (h.flags & ipc::kReplyOutputPending) forwardKernelOutput();
    logged(id_, static_cast<CUresult>(h.result));
  }
  return ReplyReader(std::span<const std::byte>(reply.data(), *n));
}

namespace {
std::atomic<uint32_t> capturesActive{0};
}  // namespace

void ClientCall::setCapturesActive(uint32_t captures) {
  capturesActive.store(captures, std::memory_order_relaxed);
}

CUresult ClientCall::post() {
  if (CUresult r = ready(); r != CUDA_SUCCESS) return logged(id_, r, "PhOS cannot send the call");
  // CUDA answers a call a capture refuses at the call itself.
  if (capturesActive.load(std::memory_order_relaxed) != 0) return run().result();
  Status s = Connection::instance().ring().post(encoder_.written());
  return s.isOk() ? CUDA_SUCCESS : logged(id_, daemonGone(s), s.message());
}

}  // namespace phos::shim
