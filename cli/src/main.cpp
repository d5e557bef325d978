// SPDX-License-Identifier: Apache-2.0
// phos: the command-line entry point; one subcommand per file under cli/src/.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "phos/common/log.h"
#include "subcommands.h"

int main(int argc, char** argv) {
  phos::log::setup({.toStderr = true});
  CLI::App app{"PhOS: checkpoint, restore and migrate running GPU processes"};
  app.set_version_flag("--version", std::string("phos ") + PHOS_VERSION);
  phos::cli::SubcommandRunner runner;
  phos::cli::addDoctor(app, runner);
  phos::cli::addCheckpoint(app, runner);
  phos::cli::addRestore(app, runner);
  phos::cli::addInspect(app, runner);
  phos::cli::addVerify(app, runner);
#ifdef PHOS_HAVE_OFFLOAD_PLAN
  phos::cli::addOffloadPlan(app, runner);
#endif
#ifdef PHOS_HAVE_POLICY
  phos::cli::addPolicy(app, runner);
#endif
#ifdef PHOS_HAVE_DAEMON_COMMANDS
  phos::cli::addDaemon(app, runner);
  phos::cli::addRun(app, runner);
  phos::cli::addJit(app, runner);
  phos::cli::addValidate(app, runner);
  phos::cli::addPs(app, runner);
  phos::cli::addMigrate(app, runner);
#endif

  // Unknown words are kept so that the error can name them; CLI11 would
  // otherwise only say that a subcommand is required. Set after the
  // subcommands are added: they copy the setting, and must stay strict.
  app.allow_extras();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // prints help/version or the error
    return rc == 0 ? phos::cli::kExitOk : phos::cli::kExitBadInput;
  }
  if (!runner) {
    if (!app.remaining().empty()) {
      std::fprintf(stderr, "phos: unknown command '%s' (see phos --help)\n",
                   app.remaining().front().c_str());
    } else {
      std::fprintf(stderr, "phos: a command is required (see phos --help)\n");
    }
    return phos::cli::kExitBadInput;
  }
  return runner();
}
