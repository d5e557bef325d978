// SPDX-License-Identifier: Apache-2.0
// Registration of phos subcommands; each one lives in its own file.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

#include "phos/common/status.h"

namespace phos::cli {

// The chosen subcommand's action, set by its callback; returns the exit code.
using SubcommandRunner = std::function<int()>;

// Exit codes shared by all subcommands.
// Makes sure a daemon serves DIR (phos run, phos restore): one that answers
// is used; one that holds DIR's lock but does not answer yet is busy and
// waited for; else `phos daemon --runtime-dir DIR` starts in the background
// (its own session, its log in DIR/phosd.log) and is waited for.
Status ensureDaemon(const std::string& dir, const std::string& driver);

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;     // the operation failed
inline constexpr int kExitBadInput = 2;    // the user's input was wrong (CLI11 uses 2 too)

void addDoctor(CLI::App& app, SubcommandRunner& runner);
void addCheckpoint(CLI::App& app, SubcommandRunner& runner);  // checkpoint.cpp
void addRestore(CLI::App& app, SubcommandRunner& runner);     // checkpoint.cpp
void addInspect(CLI::App& app, SubcommandRunner& runner);     // image_commands.cpp
void addVerify(CLI::App& app, SubcommandRunner& runner);      // image_commands.cpp
void addOffloadPlan(CLI::App& app, SubcommandRunner& runner);  // offload_plan.cpp
void addPolicy(CLI::App& app, SubcommandRunner& runner);       // policy.cpp
void addDaemon(CLI::App& app, SubcommandRunner& runner);       // daemon_commands.cpp
void addRun(CLI::App& app, SubcommandRunner& runner);          // daemon_commands.cpp
void addJit(CLI::App& app, SubcommandRunner& runner);          // daemon_commands.cpp
void addPs(CLI::App& app, SubcommandRunner& runner);           // daemon_commands.cpp
void addValidate(CLI::App& app, SubcommandRunner& runner);     // daemon_commands.cpp
void addMigrate(CLI::App& app, SubcommandRunner& runner);      // migrate.cpp

}  // namespace phos::cli
