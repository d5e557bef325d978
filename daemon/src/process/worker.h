// SPDX-License-Identifier: Apache-2.0
// A phosd worker: a process forked from the daemon's main process that loads
// the driver, pre-creates its contexts and serves at most one session, so that
// a session's device memory (mapped per process with the VMM API) is never
// reachable from another client's contexts. Also the channel main and its
// workers talk on.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <string>

#include "phos/common/ipc/call_ring.h"
#include "phos/common/status.h"
#include "phos/common/unique_fd.h"

namespace phos::daemon {

// What a worker needs to know; main fills it before fork().
struct WorkerConfig {
  pid_t mainPid = 0;       // the worker exits when this process is gone
  std::string driverPath;  // already chosen by main (chooseDriver)
  std::string runtimeDir;
  int contextsPerDevice = 1;
  ipc::RingGeometry ring{256, 16384};
  std::string cli;  // the phos binary, which runs `phos jit` helpers; empty: the driver compiles in the worker
};

// A worker exits with status 0 when it stopped its session (its files are
// removed); any other end (a signal, another status) leaves files for main
// to remove.
//
// Runs in the child right after fork(), with `channel` its end of the
// socketpair (every other descriptor of main already closed). Never returns.
//
// Messages on the channel (one JSON object per SOCK_SEQPACKET datagram):
//   worker -> main  {"event": "ready", "driver", "version", "pool", "misses"}
//                   {"event": "failed", "error"}          (then it exits)
//                   {"event": "pool", "pool", "misses"}   (when they change)
//                   {"event": "restored", "session", "pid", "uid", "ring"}
//                   {"op": "adopt", "id", "session", "pid"}   main answers
//                   {"reply_to": id, "ok", ...}          answers to main's ops
//   main -> worker  {"op": "assign", "id", "session", "pid", "uid"}
//                     -> {"ok", "ring"}; a worker whose session failed to start exits
//                   {"op": "info", "id"} -> {"ok", "pool", "misses", "session": {...}}
//                   {"op": "checkpoint", "request"} + the client's connection
//                   {"op": "restore", "session", "peer_uid", "request"} + the connection
//                   {"op": "end"}  the client is gone or the daemon stops: finish
//                                  a running checkpoint, stop the session, exit
//                   {"reply_to": id, "ok", "error"}      answers to the worker's ops
[[noreturn]] void runWorker(const WorkerConfig& config, int channel);

namespace detail {

// At most this much JSON per datagram: under the default socket buffer
// (net.core.wmem_default), which bounds a SOCK_SEQPACKET message.
inline constexpr size_t kMaxChannelMessage = 160u << 10;

// Sends one message, with `fd` (if >= 0) attached as SCM_RIGHTS. `wait`
// false: fails with kUnavailable instead of blocking on a full channel.
Status sendMessage(int channel, const nlohmann::json& message, int fd = -1, bool wait = true);

struct Message {
  nlohmann::json body;
  UniqueFd fd;  // a descriptor that came with it, if any
};
// The next message. kUnavailable at end of file (the peer is gone), and
// when `wait` is false and none is queued (then `empty` is set).
Result<Message> receiveMessage(int channel, bool wait, bool* empty = nullptr);

// Writes `line` and a newline to a client's connection; false if it cannot
// (the client is gone or stopped reading).
bool writeLine(int fd, const nlohmann::json& line);

}  // namespace detail

}  // namespace phos::daemon
