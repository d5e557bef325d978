// SPDX-License-Identifier: Apache-2.0
// HostCallChannel: how a session's streams run the application's host
// functions (cuLaunchHostFunc, cuStreamAddCallback) in the application.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "phos/common/ipc/host_calls.h"
#include "phos/common/status.h"

namespace phos::daemon {

class HostCallChannel {
 public:
  // Creates the queue file (owned by `uid`, mode 0600) and maps it.
  static Result<std::shared_ptr<HostCallChannel>> create(const std::string& path, uid_t uid, pid_t pid);
  ~HostCallChannel();
  HostCallChannel(const HostCallChannel&) = delete;
  HostCallChannel& operator=(const HostCallChannel&) = delete;

  const std::string& path() const { return path_; }
  // The queue's bytes, for a checkpoint (taken while the application is
  // frozen and no host function is pending), and writing them back at restore.
  std::span<const std::byte> bytes() const {
    return {reinterpret_cast<const std::byte*>(queue_), sizeof(ipc::HostCallQueue)};
  }
  Status restoreBytes(std::span<const std::byte> bytes);

  // Runs one host function in the application and returns when it has
  // returned (or the application or the session is gone). Called on the
  // driver's stream threads.
  void run(ipc::HostCallKind kind, uint64_t function, uint64_t userData, uint64_t stream, int32_t status);
  // The session ends: waiting and future host functions return at once.
  void close();
  // The application is now this pid (Session::adoptedBy).
  void setPid(pid_t pid) { pid_.store(pid); }

 private:
  HostCallChannel(std::string path, ipc::HostCallQueue* queue, pid_t pid)
      : path_(std::move(path)), queue_(queue), pid_(pid) {}
  bool gone() const;

  std::string path_;
  ipc::HostCallQueue* queue_;
  std::atomic<pid_t> pid_;
  std::atomic<bool> closed_{false};
};

// What a driver host function of phosd carries: the channel (kept alive while
// the function is queued in a stream) and the application's function.
struct PendingHostCall {
  std::shared_ptr<HostCallChannel> channel;
  uint64_t function = 0;
  uint64_t userData = 0;
  uint64_t stream = 0;
};

// A graph's host node's function (SessionGraphs::hostNode): runs the
// application's function each time the node runs, and frees nothing.
void CUDA_CB runHostNode(void* call);

}  // namespace phos::daemon
