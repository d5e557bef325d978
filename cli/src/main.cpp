// SPDX-License-Identifier: Apache-2.0
// phos: the command-line entry point; one subcommand per file under cli/src/.
#include <CLI/CLI.hpp>

#include "phos/common/log.h"
#include "subcommands.h"

int main(int argc, char** argv) {
  phos::log::setup({.toStderr = true});
  CLI::App app{"PhOS: checkpoint, restore and migrate running GPU processes"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("phos ") + PHOS_VERSION);

  phos::cli::SubcommandRunner runner;
  phos::cli::addDoctor(app, runner);

  CLI11_PARSE(app, argc, argv);
  return runner ? runner() : 0;
}
