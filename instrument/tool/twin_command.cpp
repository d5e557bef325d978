// SPDX-License-Identifier: Apache-2.0
// The twin subcommand: writes a PTX module with a validator twin of every kernel.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "phos/instrument/twin.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "subcommands.h"

namespace phos::instrument_tool {
namespace {

nlohmann::json statsJson(const instrument::TwinStats& s) {
  return {{"kernels", s.kernels},
          {"functions", s.functions},
          {"checked_stores", s.checkedStores},
          {"checked_loads", s.checkedLoads},
          {"unchecked_calls", s.uncheckedCalls},
          {"unchecked_accesses", s.uncheckedAccesses},
          {"kernels_with_unchecked_calls", s.kernelsWithUncheckedCalls}};
}

}  // namespace

Action addTwinCommand(CLI::App& app) {
  struct Options {
    std::string input;
    std::string output;
    std::string mode = "checkpoint";
    bool stats = false;
    std::string statsFile;
  };
  auto opts = std::make_shared<Options>();
  app.add_option("file", opts->input, "PTX file ('-' for standard input)")->required();
  app.add_option("-o,--output", opts->output, "write here instead of standard output");
  app.add_option("--mode", opts->mode,
                 "checkpoint: check stores, atomics, reductions; restore: loads as well")
      ->check(CLI::IsMember({"checkpoint", "restore"}));
  app.add_flag("--stats", opts->stats, "print what was instrumented as JSON on stderr");
  app.add_option("--stats-file", opts->statsFile, "write the statistics JSON to this file");
  return [opts]() -> Status {
    ASSIGN_OR_RETURN(std::string text, readInput(opts->input));
    ASSIGN_OR_RETURN(ptx::Module mod, ptx::parseModule(text, opts->input));
    instrument::TwinOptions options;
    options.mode = opts->mode == "restore" ? instrument::TwinMode::kRestore
                                           : instrument::TwinMode::kCheckpoint;
    instrument::TwinStats stats;
    Result<ptx::Module> twin = instrument::buildTwinModule(mod, options, &stats);
    if (!twin.isOk()) return twin.status().withContext(opts->input);
    RETURN_IF_ERROR(writeOutput(opts->output, ptx::print(*twin)));
    std::string json = statsJson(stats).dump(2) + "\n";
    if (opts->stats) std::fputs(json.c_str(), stderr);
    if (!opts->statsFile.empty()) RETURN_IF_ERROR(writeOutput(opts->statsFile, json));
    return Status::ok();
  };
}

}  // namespace phos::instrument_tool
