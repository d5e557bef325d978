// SPDX-License-Identifier: Apache-2.0
// policy_sim: simulates the optimal checkpoint policies of a `phos policy` input against other ones.
//
// Usage: policy_sim INPUT.json [--output FILE] [--failures N] [--replicas N] [--seed S]
//
// For the single-level model (the whole job as one level: cost O, restore R,
// N F failures per hour) and for the multi-level plan, simulates the wasted
// fraction of wall-clock time at the optimal interval, at 1/4 .. 4 times it,
// and at fixed intervals of 1 minute to 1 hour. Every policy meets the same
// failures (same seeds), so the differences between them are paired. Prints a
// table and writes the figures as JSON to --output.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "phos/policy/multi_level.h"
#include "phos/policy/policy_input.h"
#include "phos/policy/simulator.h"
#include "phos/policy/single_level.h"

namespace {

using nlohmann::json;
using phos::Result;
using phos::policy::Level;
using phos::policy::SimulatedPolicy;

constexpr double kScales[] = {0.25, 0.5, 1.0, 2.0, 4.0};
constexpr double kFixedIntervals[] = {60, 300, 900, 1800, 3600};  // seconds

struct Estimate {
  double mean = 0;
  double standardError = 0;
  std::vector<double> replicas;  // one wasted fraction per seed
};

struct Setup {
  std::vector<Level> levels;
  double wallSeconds = 0;  // per replica
  int replicas = 0;
  uint64_t seed = 0;
};

Result<Estimate> simulateReplicas(const Setup& setup, const SimulatedPolicy& policy) {
  std::vector<double> wasted;
  for (int r = 0; r < setup.replicas; ++r) {
    ASSIGN_OR_RETURN(auto result, phos::policy::simulate(setup.levels, policy, setup.wallSeconds,
                                                         setup.seed + static_cast<uint64_t>(r)));
    wasted.push_back(result.wastedFraction());
  }
  Estimate e;
  for (double w : wasted) e.mean += w / setup.replicas;
  double var = 0;
  for (double w : wasted) var += (w - e.mean) * (w - e.mean);
  e.standardError =
      setup.replicas > 1 ? std::sqrt(var / (setup.replicas - 1) / setup.replicas) : 0.0;
  e.replicas = std::move(wasted);
  return e;
}

json row(const std::string& policy, double firstInterval, const Estimate& e, double model) {
  json r = {{"policy", policy},
            {"first_interval_seconds", firstInterval},
            {"simulated_wasted_fraction", e.mean},
            {"standard_error", e.standardError},
            {"replicas", e.replicas}};
  if (std::isfinite(model)) r["model_wasted_fraction"] = model;
  return r;
}

// The optimum and its competitors with the same promotion factors: scaled and
// fixed first intervals. `model` gives the model's waste for a first interval.
template <typename Model>
Result<json> sweep(const Setup& setup, const std::vector<int>& every, double optimalFirst,
                   Model model) {
  json rows = json::array();
  for (double scale : kScales) {
    const double t = optimalFirst * scale;
    ASSIGN_OR_RETURN(Estimate e, simulateReplicas(setup, {t, every}));
    rows.push_back(row(scale == 1.0 ? "optimal" : fmt::format("{}x optimal", scale), t, e,
                       model(t)));
  }
  for (double t : kFixedIntervals) {
    ASSIGN_OR_RETURN(Estimate e, simulateReplicas(setup, {t, every}));
    rows.push_back(row(fmt::format("fixed {} s", t), t, e, model(t)));
  }
  return rows;
}

// Adds to each row its paired difference from the optimal row (same seeds, so
// the same failures) with the standard error of that difference, and returns
// whether the optimum is better than every other row by more than three of them.
bool optimumWins(json& rows, json& others) {
  const json* best = nullptr;
  for (const auto& r : rows) {
    if (r["policy"] == "optimal") best = &r;
  }
  if (best == nullptr) return false;
  const auto bestReplicas = (*best)["replicas"].get<std::vector<double>>();
  bool all = true;
  auto compare = [&](json& r) {
    if (&r == best) return;
    const auto other = r["replicas"].get<std::vector<double>>();
    const auto n = static_cast<double>(other.size());
    double mean = 0;
    for (size_t i = 0; i < other.size(); ++i) mean += (other[i] - bestReplicas[i]) / n;
    double var = 0;
    for (size_t i = 0; i < other.size(); ++i) {
      const double d = other[i] - bestReplicas[i] - mean;
      var += d * d;
    }
    const double se = std::sqrt(var / (n - 1) / n);
    r["paired_difference"] = mean;
    r["paired_standard_error"] = se;
    const bool worse = mean > 3 * se;
    r["optimum_better"] = worse;
    all &= worse || r.value("same_as_optimal", false);
  };
  for (auto& r : rows) compare(r);
  for (auto& r : others) compare(r);
  return all;
}

void printRows(const char* title, const json& rows) {
  std::printf("\n%s\n  %-24s %10s %10s %8s %10s %10s %8s\n", title, "policy", "interval s",
              "simulated", "+-", "model", "vs optimal", "+-");
  for (const auto& r : rows) {
    std::string name = r["policy"].get<std::string>();
    if (r.value("same_as_optimal", false)) name += " (=)";
    std::printf("  %-24s %10.1f %10.5f %8.5f", name.c_str(),
                r["first_interval_seconds"].get<double>(),
                r["simulated_wasted_fraction"].get<double>(), r["standard_error"].get<double>());
    std::printf(" %10.5f", r.value("model_wasted_fraction", NAN));
    if (r.contains("paired_difference")) {
      std::printf(" %+10.5f %8.5f", r["paired_difference"].get<double>(),
                  r["paired_standard_error"].get<double>());
    }
    std::printf("\n");
  }
}

int run(const std::string& path, const std::string& outputPath, double failures, int replicas,
        uint64_t seed) {
  auto input = phos::policy::loadPolicyInput(path);
  if (!input) {
    std::fprintf(stderr, "policy_sim: %s\n", input.status().message().c_str());
    return 2;
  }
  const auto started = std::chrono::steady_clock::now();
  auto output = phos::policy::computePolicy(*input);
  const double solveMicros =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started).count();
  if (!output) {
    std::fprintf(stderr, "policy_sim: %s\n", output.status().message().c_str());
    return 1;
  }
  auto fail = [](const phos::Status& s) {
    std::fprintf(stderr, "policy_sim: %s\n", s.toString().c_str());
    return 1;
  };

  // The single-level model as a one-level job: all N GPUs stop on any failure.
  const auto& single = input->single;
  Setup one;
  one.levels = {{"job", single.overheadSeconds, single.restoreSeconds,
                 single.gpus * single.failuresPerGpuHour}};
  one.wallSeconds = failures / one.levels[0].failuresPerHour * 3600.0 / replicas;
  one.replicas = replicas;
  one.seed = seed;
  const double singleOptimal = 3600.0 / output->checkpointsPerHour;
  auto singleRows = sweep(one, {1}, singleOptimal, [&](double t) {
    return phos::policy::wastedFraction(single, 3600.0 / t).valueOr(NAN);
  });
  if (!singleRows) return fail(singleRows.status());

  Setup multi;
  multi.levels = input->levels;
  double totalRate = 0;
  for (const auto& l : input->levels) totalRate += l.failuresPerHour;
  multi.wallSeconds = failures / totalRate * 3600.0 / replicas;
  multi.replicas = replicas;
  multi.seed = seed;
  const auto& schedule = output->plan.schedule;
  auto nestedModel = [&](double first) {
    std::vector<double> t(schedule.every.size(), first);
    for (size_t i = 1; i < t.size(); ++i) t[i] = t[i - 1] * schedule.every[i];
    return 1.0 - 1.0 / phos::policy::wallPerWork(input->levels, t);
  };
  auto multiRows = sweep(multi, schedule.every, schedule.intervalSeconds[0], nestedModel);
  if (!multiRows) return fail(multiRows.status());

  // Other ways to use the same levels: rounding each continuous ratio on its
  // own, and writing every checkpoint to every level (each at its own optimum).
  json others = json::array();
  const auto naive = phos::policy::naiveEvery(output->plan.continuous);
  const size_t n = input->levels.size();
  for (const auto& [name, every] :
       {std::pair{std::string("naive rounding"), naive},
        std::pair{std::string("all levels every time"), std::vector<int>(n, 1)}}) {
    auto s = phos::policy::solveNested(input->levels, every);
    if (!s) return fail(s.status());
    auto e = simulateReplicas(multi, {s->intervalSeconds[0], every});
    if (!e) return fail(e.status());
    json r = row(name, s->intervalSeconds[0], *e, 1.0 - 1.0 / s->wallPerWork);
    r["every"] = every;
    // Not a competitor when it picks the same schedule as the plan.
    r["same_as_optimal"] = every == schedule.every;
    others.push_back(std::move(r));
  }
  // Only the most durable level, every failure restoring from it.
  {
    const Level& top = input->levels.back();
    Setup only = multi;
    only.levels = {{top.name, top.checkpointSeconds, top.restoreSeconds, totalRate}};
    auto s = phos::policy::solveNested(only.levels, {1});
    if (!s) return fail(s.status());
    auto e = simulateReplicas(only, {s->intervalSeconds[0], {1}});
    if (!e) return fail(e.status());
    others.push_back(row("only " + top.name, s->intervalSeconds[0], *e,
                         1.0 - 1.0 / s->wallPerWork));
  }

  json noOthers = json::array();
  const bool singleWins = optimumWins(*singleRows, noOthers);
  const bool multiWins = optimumWins(*multiRows, others);
  json levels = json::array();
  for (size_t i = 0; i < n; ++i) {
    levels.push_back({{"name", input->levels[i].name},
                      {"every", schedule.every[i]},
                      {"interval_seconds", schedule.intervalSeconds[i]},
                      {"continuous_interval_seconds", output->plan.continuous.intervalSeconds[i]}});
  }
  json doc = {
      {"input", path},
      {"seed", seed},
      {"replicas", replicas},
      {"solve_microseconds", solveMicros},
      {"single_level",
       {{"checkpoints_per_hour", output->checkpointsPerHour},
        {"interval_seconds", singleOptimal},
        {"model_wasted_fraction", output->wastedFraction},
        {"simulated_hours_per_replica", one.wallSeconds / 3600.0},
        {"rows", *singleRows},
        {"optimum_beats_all", singleWins}}},
      {"multi_level",
       {{"levels", levels},
        {"model_wasted_fraction", output->plan.wastedFraction()},
        {"outer_iterations", output->plan.continuous.outerIterations},
        {"simulated_hours_per_replica", multi.wallSeconds / 3600.0},
        {"rows", *multiRows},
        {"other_policies", others},
        {"optimum_beats_all", multiWins}}},
  };

  std::printf("policy_sim %s: %d replicas, seed %llu, solver %.0f us\n", path.c_str(), replicas,
              static_cast<unsigned long long>(seed), solveMicros);
  std::printf("single level: f* = %.2f/h (every %.1f s), %.1f simulated hours per replica\n",
              output->checkpointsPerHour, singleOptimal, one.wallSeconds / 3600.0);
  printRows("single level, wasted fraction of wall-clock time:", *singleRows);
  std::printf("\nmulti level plan (%.1f simulated hours per replica):\n",
              multi.wallSeconds / 3600.0);
  for (size_t i = 0; i < n; ++i) {
    std::printf("  %-12s every %-4d interval %10.1f s (continuous %10.1f s)\n",
                input->levels[i].name.c_str(), schedule.every[i], schedule.intervalSeconds[i],
                output->plan.continuous.intervalSeconds[i]);
  }
  printRows("multi level, wasted fraction of wall-clock time:", *multiRows);
  printRows("multi level, other uses of the same levels ((=): the plan's own schedule):",
            others);
  std::printf("\noptimum beats all others: single level %s, multi level %s\n",
              doc["single_level"]["optimum_beats_all"].get<bool>() ? "yes" : "NO",
              doc["multi_level"]["optimum_beats_all"].get<bool>() ? "yes" : "NO");

  if (!outputPath.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(outputPath).parent_path(), ec);
    std::ofstream out(outputPath);
    out << doc.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "policy_sim: cannot write %s\n", outputPath.c_str());
      return 1;
    }
    std::printf("figures written to %s\n", outputPath.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Simulate the optimal checkpoint policies of a `phos policy` input"};
  std::string input;
  std::string output;
  double failures = 200000;
  int replicas = 10;
  uint64_t seed = 1;
  app.add_option("input", input, "JSON input of `phos policy`")->required();
  app.add_option("--output", output, "write the figures as JSON to this file");
  app.add_option("--failures", failures, "expected failures over all replicas of one policy")
      ->check(CLI::PositiveNumber);
  app.add_option("--replicas", replicas, "independent replicas per policy")
      ->check(CLI::Range(2, 1000));
  app.add_option("--seed", seed, "seed of the first replica");
  CLI11_PARSE(app, argc, argv);
  return run(input, output, failures, replicas, seed);
}
