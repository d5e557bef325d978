// SPDX-License-Identifier: Apache-2.0
// The checkpoint/restore engine of a phosd worker (engine.h).
#include "engine.h"

#include "session.h"

namespace phos::daemon {

nlohmann::json checkpointSession(Session&, const nlohmann::json&, const ProgressFn&) {
  return {{"ok", false}, {"error", "GPU checkpoints are being built (issue 7)"}, {"code", "unsupported"}};
}

Result<std::unique_ptr<Session>> restoreSession(uint64_t, const DriverTable&, ContextPool&,
                                                const ServerTable&, const std::string&,
                                                const nlohmann::json&, const ProgressFn&) {
  return makeError(Code::kNotSupported, "GPU restores are being built (issue 7)");
}

}  // namespace phos::daemon
