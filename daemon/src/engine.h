// SPDX-License-Identifier: Apache-2.0
// The checkpoint/restore engine of a phosd worker: saves a session's GPU state
// (with the process's CPU state, through CRIU) into an image, and re-creates a
// session from an image before CRIU restores its process.
//
// Both run in the worker process that serves (or will serve) the session, on
// the worker's control thread; the session's own serving thread keeps running
// until the engine pauses it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "server_call.h"

namespace phos::daemon {

class ContextPool;
class DriverTable;
class Session;

// Receives {"phase": ..., "bytes": done, "total": of the phase} as work advances.
using ProgressFn = std::function<void(const nlohmann::json& progress)>;

// Request: {"op": "checkpoint", "pid", "image", "leave_running", "compress"}.
// Returns the final answer line: {"ok": true, "report": {...}} or
// {"ok": false, "error": "...", "code": "..."}. On failure nothing is left at
// "image" and the process keeps running with its session.
nlohmann::json checkpointSession(Session& session, const nlohmann::json& request,
                                 const ProgressFn& progress);

// Request: {"op": "restore", "image"}. Re-creates the session of the image
// (contexts from `pool`, allocations at their addresses, modules, streams,
// events, pinned memory and the ring file at their paths), ready to serve
// once its process is back. The session's id is `id`.
Result<std::unique_ptr<Session>> restoreSession(uint64_t id, const DriverTable& driver,
                                                ContextPool& pool, const ServerTable& servers,
                                                const std::string& runtimeDir,
                                                const nlohmann::json& request,
                                                const ProgressFn& progress);

}  // namespace phos::daemon
