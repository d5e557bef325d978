// SPDX-License-Identifier: Apache-2.0
// `phos doctor`: checks that this host has what PhOS needs (CRIU, CUDA toolkit).
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/common/subprocess.h"
#include "phos/criu/criu.h"
#include "subcommands.h"

namespace phos::cli {
namespace {

struct Check {
  std::string name;
  bool ok = false;
  bool required = true;
  std::string detail;
};

Check checkCriu(const Result<criu::CriuBinary>& criu) {
  Check c{"criu", false, true, ""};
  if (!criu) {
    c.detail = criu.status().message();
    return c;
  }
  Status s = criu::check(*criu);
  c.ok = s.isOk();
  c.detail = c.ok ? fmt::format("{} {}: criu check: Looks good", criu->path, criu->version)
                  : s.message();
  return c;
}

// Not required: without it a concurrent restore loads the CPU memory before
// the job runs.
Check checkLazyPages(const Result<criu::CriuBinary>& criu) {
  Check c{"lazy", false, false, ""};
  if (!criu) {
    c.detail = criu.status().message();
    return c;
  }
  Status s = criu::checkLazyPages(*criu);
  c.ok = s.isOk();
  c.detail = c.ok ? "CRIU loads a restored process's memory while it runs (lazy pages, userfaultfd)"
                  : s.message() + "; restores load it before the process runs";
  return c;
}

// A toolkit program, found through the configured CUDA root or PATH.
Check checkTool(const std::string& name, const std::string& path, bool required) {
  Check c{name, false, required, ""};
  auto run = runCapture({path, "--version"});
  if (!run) {
    c.detail = run.status().message();
    return c;
  }
  c.ok = run->exitCode == 0;
  std::string out = run->out;
  // The last non-empty line carries the release ("Build cuda_13.0...").
  while (!out.empty() && out.back() == '\n') out.pop_back();
  c.detail = path + ": " + out.substr(out.rfind('\n') + 1);
  return c;
}

int runDoctor(bool json) {
  std::vector<Check> checks;
  const auto criu = criu::locate();
  checks.push_back(checkCriu(criu));
  checks.push_back(checkLazyPages(criu));
  checks.push_back(checkTool("nvcc", PHOS_CUDA_ROOT "/bin/nvcc", false));
  checks.push_back(checkTool("ptxas", PHOS_CUDA_ROOT "/bin/ptxas", false));

  bool allRequired = true;
  for (const auto& c : checks) allRequired &= c.ok || !c.required;
  if (json) {
    nlohmann::json out = {{"ok", allRequired}, {"checks", nlohmann::json::array()}};
    for (const auto& c : checks) {
      out["checks"].push_back(
          {{"name", c.name}, {"ok", c.ok}, {"required", c.required}, {"detail", c.detail}});
    }
    std::puts(out.dump(2).c_str());
  } else {
    for (const auto& c : checks) {
      const char* mark = c.ok ? "ok  " : (c.required ? "FAIL" : "warn");
      std::printf("%s %-6s %s\n", mark, c.name.c_str(), c.detail.c_str());
    }
  }
  return allRequired ? kExitOk : kExitFailure;
}

}  // namespace

void addDoctor(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("doctor", "Check that this host has what PhOS needs");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print the checks as JSON");
  cmd->callback([&runner, json] { runner = [json] { return runDoctor(*json); }; });
}

}  // namespace phos::cli
