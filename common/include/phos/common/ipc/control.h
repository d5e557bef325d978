// SPDX-License-Identifier: Apache-2.0
// The control socket of phosd: where it listens, and one request/response
// exchange on it (a JSON object per line each way).
//
// Requests ({"op": ...}):
//   attach  {"pid": P}           a client process (libphos.so) asks for a session;
//                                the answer names its ring: {"session", "ring", "daemon_pid"}
//   ps      {}                   sessions the caller may see: {"sessions": [...]}
//   ping    {}                   {"daemon_pid", "driver", "driver_version", "pool": [...]}
//   stop    {}                   the daemon exits (root or the daemon's own user)
// Every answer has "ok"; a refused request has "ok": false and "error".
#pragma once

#include <chrono>
#include <string>

#include "phos/common/status.h"

namespace phos::ipc {

// The directory of this user's daemon: $PHOS_RUNTIME_DIR, else /run/phos for
// root, else $XDG_RUNTIME_DIR/phos, else /tmp/phos-<uid>.
std::string runtimeDir();
// Its control socket: runtimeDir()/phosd.sock.
std::string controlSocketPath(const std::string& runtimeDirectory);

// Connects to `socketPath`, sends `request` (one line) and returns the
// answer line. kUnavailable when nothing listens there.
Result<std::string> controlRequest(const std::string& socketPath, const std::string& request,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(10));

inline constexpr size_t kMaxControlMessage = 1 << 20;

}  // namespace phos::ipc
