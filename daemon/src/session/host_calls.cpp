// SPDX-License-Identifier: Apache-2.0
// The host-call queue of a session: phosd's side.
#include "session/host_calls.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "session/session_files.h"

namespace phos::daemon {
namespace {

// How often a waiting stream thread checks that the application still runs.
constexpr std::chrono::milliseconds kLivenessPeriod{100};

}  // namespace

Result<std::shared_ptr<HostCallChannel>> HostCallChannel::create(const std::string& path, uid_t uid, pid_t pid) {
  ASSIGN_OR_RETURN(void* p, mapSessionFile(path, sizeof(ipc::HostCallQueue), uid));
  // A fresh file reads as zeros: every slot kHostCallFree.
  return std::shared_ptr<HostCallChannel>(new HostCallChannel(path, static_cast<ipc::HostCallQueue*>(p), pid));
}

Status HostCallChannel::restoreBytes(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(ipc::HostCallQueue)) {
    return makeError(Code::kDataLoss, "the host-call queue of the image has {} bytes, not {}", bytes.size(),
                     sizeof(ipc::HostCallQueue));
  }
  std::memcpy(static_cast<void*>(queue_), bytes.data(), bytes.size());
  return Status::ok();
}

HostCallChannel::~HostCallChannel() {
  munmap(queue_, sizeof(ipc::HostCallQueue));
  unlink(path_.c_str());
}

bool HostCallChannel::gone() const {
  return closed_.load() || (kill(pid_.load(), 0) != 0 && errno == ESRCH);
}

void HostCallChannel::close() {
  closed_.store(true);
  // The file goes with the session even while host functions still queued in
  // a stream keep the mapping. Waiters poll: they notice within kLivenessPeriod.
  unlink(path_.c_str());
}

void HostCallChannel::run(ipc::HostCallKind kind, uint64_t function, uint64_t userData, uint64_t stream,
                          int32_t status) {
  ipc::HostCallSlot* slot = nullptr;
  while (slot == nullptr) {
    if (gone()) return;
    for (auto& s : queue_->slots) {
      uint32_t expected = ipc::kHostCallFree;
      if (s.state.compare_exchange_strong(expected, ipc::kHostCallClaimed)) {
        slot = &s;
        break;
      }
    }
    // Every slot holds a running host function (as many as streams): wait for one.
    if (slot == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  slot->kind = kind;
  slot->status = status;
  slot->function = function;
  slot->userData = userData;
  slot->stream = stream;
  slot->state.store(ipc::kHostCallRequested, std::memory_order_release);
  queue_->doorbell.fetch_add(1);
  ipc::futexWake(&queue_->doorbell);
  for (;;) {
    uint32_t state = slot->state.load(std::memory_order_acquire);
    if (state == ipc::kHostCallDone) break;
    // The application is gone: its slot is never released, the queue dies with the session.
    if (gone()) return;
    ipc::futexWait(&slot->state, state, kLivenessPeriod);
  }
  slot->state.store(ipc::kHostCallFree, std::memory_order_release);
}

void CUDA_CB runHostNode(void* call) {
  const auto* c = static_cast<const PendingHostCall*>(call);
  c->channel->run(ipc::kHostFunction, c->function, c->userData, c->stream, CUDA_SUCCESS);
}

}  // namespace phos::daemon
