// SPDX-License-Identifier: Apache-2.0
// phos-instrument: command-line access to the PTX toolkit (print, params, signatures, twin, scan).
#include <cstdio>
#include <vector>

#include "subcommands.h"

int main(int argc, char** argv) {
  using namespace phos::instrument_tool;
  CLI::App app{"phos-instrument: parse, inspect and rewrite PTX"};
  app.require_subcommand(1);

  // One line per subcommand: later issues add theirs here.
  std::vector<std::pair<CLI::App*, Action>> commands;
  auto add = [&](const char* cmdName, const char* description, Action (*factory)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(cmdName, description);
    commands.emplace_back(sub, factory(*sub));
  };
  add("print", "parse a PTX file and print it back", addPrintCommand);
  add("params", "print each kernel's parameter layout as JSON", addParamsCommand);
  add("signatures", "print what speculation knows of each kernel's parameters, as JSON",
      addSignaturesCommand);
  add("twin", "write the module with a validator twin of every kernel", addTwinCommand);
  add("scan", "extract __global__ signatures from .cu sources into a signature database",
      addScanCommand);

  CLI11_PARSE(app, argc, argv);
  for (auto& [sub, action] : commands) {
    if (!sub->parsed()) continue;
    phos::Status s = action();
    if (!s.isOk()) {
      std::fprintf(stderr, "phos-instrument %s: %s\n", sub->get_name().c_str(),
                   s.toString().c_str());
      return 1;
    }
  }
  return 0;
}
