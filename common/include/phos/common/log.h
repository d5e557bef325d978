// SPDX-License-Identifier: Apache-2.0
// Logging: one named spdlog logger per component, levels from PHOS_LOG.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "phos/common/status.h"

namespace phos::log {

// Where a process's log lines go. Processes that run inside the user's
// application (the shim) must not write to its stdout/stderr unless the user
// asks for it (PHOS_LOG_STDERR=1), so they pass a file.
struct Sinks {
  bool toStderr = false;
  std::string file;  // empty: no file
};

// Parsed PHOS_LOG: "info" sets every component, "shim:debug,daemon:info"
// sets components, and both mix: "warn,daemon:debug".
struct LevelSpec {
  spdlog::level::level_enum defaultLevel = spdlog::level::info;
  std::map<std::string, spdlog::level::level_enum, std::less<>> components;

  spdlog::level::level_enum levelFor(std::string_view component) const;
};
Result<LevelSpec> parseLevelSpec(std::string_view text);

// The sinks the environment asks for: PHOS_LOG_FILE (a file) and
// PHOS_LOG_STDERR=1 (stderr).
Sinks sinksFromEnvironment();

// Installs the sinks and levels (from PHOS_LOG) for this process. Call once,
// early; later calls replace the configuration. A malformed PHOS_LOG is
// reported as a warning on the configured sinks and otherwise ignored.
void setup(const Sinks& sinks);

// The logger of a component ("shim", "daemon", "vgpu", "cli", ...), created on
// first use with the process's sinks and the component's level.
std::shared_ptr<spdlog::logger> get(std::string_view component);

}  // namespace phos::log
