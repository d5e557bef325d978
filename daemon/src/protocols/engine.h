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
#include <nlohmann/json.hpp>
#include <string>

#include "phos/common/status.h"
#include "phos/criu/checkpoint.h"
#include "protocols/progress.h"
#include "session/launch_validator.h"
#include "session/server_call.h"

namespace phos::daemon {

class ContextPool;
class DriverTable;
class OnDemandRestore;
class Session;

// Request: {"op": "checkpoint", "pid", "image", "leave_running", "compress"}.
// Returns the final answer line: {"ok": true, "report": {...}} or
// {"ok": false, "error": "...", "code": "..."}. On failure nothing is left at
// "image" and the process keeps running with its session.
// With "criu_plugin": true, CRIU is not run here: PhOS's CRIU plugin, loaded
// by whoever runs CRIU, reports its steps through `plugin`
// (checkpoint::checkpointForPlugin, docs/containers.md).
nlohmann::json checkpointSession(Session& session, const nlohmann::json& request,
                                 const ProgressFn& progress,
                                 const checkpoint::PluginSteps* plugin = nullptr);

// A re-created session and, for a concurrent restore, its device memory
// still to load.
struct RestoredSession {
  std::unique_ptr<Session> session;
  std::shared_ptr<OnDemandRestore> loading;  // null: everything is on the device
  ValidationMode validation = ValidationMode::kOff;  // the session's own, once loaded
};

// Request: {"op": "restore", "image", "eager"}. Re-creates the session of the
// image (contexts from `pool`, allocations at their addresses, modules,
// streams, events, pinned memory and the ring file at their paths), ready to
// serve once its process is back. The session's id is `id`. With "eager",
// device memory is loaded before this returns; without, only mapped: the
// session's gate makes its calls wait for what they touch, and
// loadConcurrently() loads the rest once the session serves.
//
// `requester` is the uid that asked (SO_PEERCRED of its control connection):
// the image is untrusted input (docs/security.md). Another uid than root may
// restore only an image directory it owns and no one else may write, whose
// manifest names that same uid; the session is the requester's. Root may
// restore any image, as the uid its manifest names. All of this is decided
// before any file of the image but the manifest is read.
Result<RestoredSession> restoreSession(uint64_t id, const DriverTable& driver, ContextPool& pool,
                                       const ServerTable& servers, const std::string& runtimeDir,
                                       const nlohmann::json& request, uid_t requester, const ProgressFn& progress);

// The window of a concurrent restore, on the worker's control thread while
// the session serves: loads every buffer, then reads the restore twins'
// reports and returns the session to its own validation mode. `report` gets
// the figures ({"chunks", "demanded_chunks", ..., "misspeculations"}). Fails
// when a load failed or a launch read or wrote outside its speculated buffers
// (report["misspeculations"] > 0): the application may have run on memory
// that was not loaded yet, and must be restored again eagerly.
Status loadConcurrently(Session& session, OnDemandRestore& loading, ValidationMode validation,
                        const std::function<bool()>& cancelled, nlohmann::json& report);

}  // namespace phos::daemon
