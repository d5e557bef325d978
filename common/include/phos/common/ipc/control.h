// SPDX-License-Identifier: Apache-2.0
// The control socket of phosd: where it listens, and one request/response
// exchange on it (a JSON object per line each way).
//
// Requests ({"op": ...}). phosd's main process answers the short ones; each
// session runs in a worker process of its own, which answers long operations
// on the client's connection itself (main passes it on with SCM_RIGHTS).
//   attach  {"pid": P}           a client process (libphos.so) asks for a session; P
//                                must be the connecting process (SO_PEERCRED). A spare
//                                worker takes it: {"session", "ring", "daemon_pid",
//                                "worker_pid"}. Waits (up to 30 s) when no worker is ready.
//   ps      {}                   sessions the caller may see (root: all; others: their
//                                own): {"sessions": [{"session", "pid", "uid", "command",
//                                "worker_pid", "device_bytes", "allocations",
//                                "pinned_bytes", "modules", "contexts", "calls",
//                                "launches", "kernels", "busy"}]}. A worker that does not
//                                answer within 1 s leaves its counters 0 and "busy" true.
//   ping    {}                   {"daemon_pid", "driver", "driver_version", "pool": [{"device",
//                                "free", "target"}] (contexts of spare workers), "pool_misses"
//                                (requests that found no spare worker, and contexts
//                                created on demand), "sessions", "spare_workers",
//                                "spare_target", "workers": [{"pid", "state", "session"}]}
//   stop    {}                   the daemon and its workers exit (root or the daemon's
//                                own user)
//
// Long operations keep the connection open (ControlStream): the daemon sends
// any number of {"progress": {...}} lines, then one final line with "ok".
//   checkpoint {"pid", "image", "leave_running", "compress"}
//                                saves the process and its GPU session (root or the
//                                session's user); the final line carries "report". A
//                                pid without a session: {"ok": false, "code":
//                                "no-session"}; another user's: "code": "permission";
//                                while one runs for the session: "code": "busy".
//   migrate    {"pid", "to", "mode"?, "compress"?, "key"?}
//                                moves the process to the phosd at "to" (HOST:PORT,
//                                docs/migration.md) with the daemon's key or the given one
//                                (hex); as checkpoint otherwise, its report with "migration".
//   restore    {"image"}         re-creates the image's GPU session in a spare worker;
//                                the final line is {"ok", "session", "pid"} (the
//                                image's process). The client then runs CRIU and writes
//                                one line back: {"adopt": PID} once the process runs
//                                again, anything else (or closing) abandons the session.
//                                The daemon answers the adopt with a last {"ok"} line.
//                                A failed restore is {"ok": false, "error", "code"}.
// Progress lines: {"progress": {"phase": "gpu-memory"|"pinned"|"cpu"|...,
//                               "bytes": done, "total": of the phase}}.
// Every answer has "ok"; a refused request has "ok": false and "error".
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "phos/common/status.h"
#include "phos/common/unique_fd.h"

namespace phos::ipc {

// The "code" of a refused request ({"ok": false, "code", "error"}): a Status
// code in its wire spelling (wireCode, phos/common/status.h), or one of these,
// which only the control protocol has.
inline constexpr std::string_view kNoSession = "no-session";  // the pid runs without PhOS
inline constexpr std::string_view kBusy = "busy";  // another request holds the job or the image: try again

// Whether a refusal's code says the request itself was wrong (a bad field, a
// pid without a session, an image that is missing, exists already or is
// damaged), not that doing it failed: the CLI exits 2 for those, 1 otherwise.
bool isBadRequest(std::string_view code);

// The directory of this user's daemon: $PHOS_RUNTIME_DIR, else /run/phos for
// root, else $XDG_RUNTIME_DIR/phos, else /tmp/phos-<uid>.
std::string runtimeDir();
// Where phosd keeps its sessions' shared files (rings, pinned memory,
// host-call queues: DIR/phos-WORKER-SESSION...), which applications map:
// $PHOS_SESSION_DIR (absolute; `phos daemon --session-dir` sets it), else
// /dev/shm. A container that shares no /dev/shm with the host mounts this
// directory instead (docs/containers.md).
std::string sessionDir();
// Its control socket: runtimeDir()/phosd.sock.
std::string controlSocketPath(const std::string& runtimeDirectory);

// One daemon per runtime directory: the daemon holds a write lock (fcntl's,
// the process's own) on runtimeDir/phosd.lock for its life, and only the
// holder binds, serves and unlinks the socket there.
std::string daemonLockPath(const std::string& runtimeDirectory);
// Takes the lock for this process; the returned descriptor holds it (close
// it, or exit, to release). kAlreadyExists naming the holder's pid when a
// daemon holds it.
Result<UniqueFd> lockDaemonDirectory(const std::string& runtimeDirectory);
// The pid of the daemon holding the lock, 0 when none does (no daemon, or
// one that died: the kernel drops its lock). Never call it in the daemon's
// own process: closing any descriptor of the file drops that process's lock.
Result<pid_t> daemonHoldingLock(const std::string& runtimeDirectory);

// Connects to `socketPath`, sends `request` (one line) and returns the
// answer line. kUnavailable when nothing listens there.
Result<std::string> controlRequest(const std::string& socketPath, const std::string& request,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(10));

inline constexpr size_t kMaxControlMessage = 1 << 20;

// A control connection kept open for a long operation (checkpoint, restore):
// one request, then lines both ways until either side closes.
class ControlStream {
 public:
  // Connects and sends `request`. kUnavailable when nothing listens there.
  static Result<ControlStream> open(const std::string& socketPath, const std::string& request);

  // The next line (without its newline). Waits as long as the daemon works;
  // kUnavailable when it closed the connection (or died) first.
  Result<std::string> readLine();
  Status writeLine(std::string_view line);
  int fd() const { return fd_.get(); }

 private:
  explicit ControlStream(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
  std::string buffer_;
};

}  // namespace phos::ipc
