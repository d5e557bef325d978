// SPDX-License-Identifier: Apache-2.0
// `phos policy INPUT.json`: prints the optimal checkpoint frequency and multi-level intervals.
#include <cstdio>
#include <memory>
#include <string>

#include "phos/policy/policy_input.h"
#include "subcommands.h"

namespace phos::cli {
namespace {

int runPolicy(const std::string& path) {
  auto input = policy::loadPolicyInput(path);
  if (!input) {
    // Missing, unreadable, malformed or out-of-range input: all the user's to fix.
    std::fprintf(stderr, "phos policy: %s\n", input.status().message().c_str());
    return kExitBadInput;
  }
  auto output = policy::computePolicy(*input);
  if (!output) {
    // FAILED_PRECONDITION: valid input describing a job that cannot make
    // progress; that is an answer, not a typo, so it is not exit code 2.
    std::fprintf(stderr, "phos policy: %s: %s\n", path.c_str(),
                 output.status().message().c_str());
    return output.status().code() == Code::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  std::puts(policy::renderPolicyOutput(*input, *output).c_str());
  return kExitOk;
}

}  // namespace

void addPolicy(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand(
      "policy", "Print the optimal checkpoint frequency and multi-level intervals as JSON");
  auto path = std::make_shared<std::string>();
  cmd->add_option("input", *path,
                  "JSON file: gpus, failures_per_gpu_hour, checkpoint_overhead_seconds, "
                  "restore_seconds, levels (see docs/policy.md)")
      ->required();
  cmd->callback([&runner, path] { runner = [path] { return runPolicy(*path); }; });
}

}  // namespace phos::cli
