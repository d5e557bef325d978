// SPDX-License-Identifier: Apache-2.0
// The subcommands of phos-instrument; each registers itself on the CLI11 app.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "phos/common/status.h"

namespace phos::instrument_tool {

// A subcommand adds its options to `app` and returns the action run when it is
// selected; the action's Status becomes the exit code (0 ok, 1 error).
using Action = std::function<Status()>;

Action addPrintCommand(CLI::App& app);
Action addParamsCommand(CLI::App& app);
Action addSignaturesCommand(CLI::App& app);  // signatures_command.cpp
Action addTwinCommand(CLI::App& app);        // twin_command.cpp
Action addScanCommand(CLI::App& app);        // scan_command.cpp

// Reads a whole file ("-" is standard input).
Result<std::string> readInput(const std::string& path);
// Writes `text` to a file (empty or "-": standard output).
Status writeOutput(const std::string& path, const std::string& text);

}  // namespace phos::instrument_tool
