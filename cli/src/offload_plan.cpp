// SPDX-License-Identifier: Apache-2.0
// `phos offload-plan INSTANCE.json`: schedules one peer-offload instance and prints each plan and its blocking time.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "phos/offload/instance_json.h"
#include "phos/offload/schedulers.h"
#include "subcommands.h"

namespace phos::cli {
namespace {

using offload::Outcome;
using offload::Scheduler;

Result<std::string> readInstanceFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return makeError(Code::kInvalidArgument, "cannot read {}: it is a directory", path);
  }
  std::ifstream file(path, std::ios::binary);
  if (!file.is_open()) {
    return makeError(Code::kInvalidArgument, "cannot read {}: {}", path, std::strerror(errno));
  }
  std::string text{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (file.bad()) return makeError(Code::kInvalidArgument, "cannot read {}", path);
  return text;
}

std::string endpoint(int gpu) { return gpu == offload::kHost ? "host" : fmt::format("GPU {}", gpu); }

void printOutcome(const offload::Problem& problem, const Outcome& o) {
  std::printf("%s: blocking %.6f ms, %zu transfer(s), scheduled in %.1f us\n",
              std::string(schedulerName(o.scheduler)).c_str(), o.blockingSeconds * 1e3,
              o.plan.transfers.size(), o.solveSeconds * 1e6);
  for (const offload::Transfer& t : o.plan.transfers) {
    const double bandwidth =
        t.to == offload::kHost ? problem.hostBandwidth : problem.bandwidth[t.from][t.to];
    const double seconds =
        static_cast<double>(t.chunks) * static_cast<double>(problem.chunkBytes) / bandwidth;
    std::printf("  %-7s -> %-7s %8lld chunks %14lld bytes  %.6f ms on the link\n",
                endpoint(t.from).c_str(), endpoint(t.to).c_str(),
                static_cast<long long>(t.chunks), static_cast<long long>(t.bytes),
                seconds * 1e3);
  }
}

int runOffloadPlan(const std::string& path, const std::string& schedulerName, bool json) {
  auto text = readInstanceFile(path);
  if (!text) {
    std::fprintf(stderr, "phos offload-plan: %s\n", text.status().message().c_str());
    return kExitBadInput;
  }
  auto instance = offload::parseInstanceJson(*text);
  Result<offload::Problem> problem =
      instance ? offload::makeProblem(*instance) : Result<offload::Problem>(instance.status());
  if (!problem) {
    std::fprintf(stderr, "phos offload-plan: %s: %s\n", path.c_str(),
                 problem.status().message().c_str());
    return kExitBadInput;
  }

  std::vector<Scheduler> chosen;
  for (Scheduler s : offload::kAllSchedulers) {
    if (schedulerName == "all" || offload::schedulerName(s) == schedulerName) chosen.push_back(s);
  }
  std::vector<Outcome> outcomes;
  for (Scheduler s : chosen) {
    auto outcome = offload::runScheduler(*problem, s);
    Status valid = outcome ? offload::verifyPlan(*problem, outcome->plan) : outcome.status();
    if (!valid.isOk()) {
      std::fprintf(stderr, "phos offload-plan: %s scheduler failed: %s\n",
                   std::string(offload::schedulerName(s)).c_str(), valid.message().c_str());
      return kExitFailure;
    }
    outcomes.push_back(std::move(outcome).value());
  }

  if (json) {
    std::puts(offload::outcomesToJson(outcomes).dump(2).c_str());
    return kExitOk;
  }
  int senders = 0;
  for (int64_t r : problem->remainder) senders += r > 0 ? 1 : 0;
  std::printf("%d GPUs, %d sender(s), %lld chunk(s) of %lld bytes to move off\n",
              problem->gpuCount(), senders, static_cast<long long>(problem->totalRemainder()),
              static_cast<long long>(problem->chunkBytes));
  for (const Outcome& o : outcomes) printOutcome(*problem, o);
  return kExitOk;
}

}  // namespace

void addOffloadPlan(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand(
      "offload-plan",
      "Schedule checkpoint chunks of GPUs short of memory onto NVLink peers and the host, and "
      "print each plan and its blocking time (see docs/offload.md)");
  auto path = std::make_shared<std::string>();
  auto scheduler = std::make_shared<std::string>("all");
  auto json = std::make_shared<bool>(false);
  cmd->add_option("instance", *path,
                  "JSON file: chunk_bytes, host_bandwidth, gpus[{checkpoint_bytes, free_bytes, "
                  "egress_limit?, ingress_limit?}], links[{a, b, bandwidth}]")
      ->required();
  cmd->add_option("--scheduler", *scheduler, "Run only this scheduler (default: all four)")
      ->check(CLI::IsMember({"all", "baseline", "greedy", "flow", "exact"}));
  cmd->add_flag("--json", *json,
                "Print {\"baseline\": {\"blocking_seconds\", \"transfers\"}, ...} as JSON");
  cmd->callback([&runner, path, scheduler, json] {
    runner = [path, scheduler, json] { return runOffloadPlan(*path, *scheduler, *json); };
  });
}

}  // namespace phos::cli
