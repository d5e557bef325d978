// SPDX-License-Identifier: Apache-2.0
// Multi-level checkpoint intervals: paper 004's Algorithm 1 with the core count fixed.
#include "phos/policy/multi_level.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include <fmt/ranges.h>

#include "phos/common/log.h"

namespace phos::policy {
namespace {

constexpr double kSecondsPerHour = 3600.0;
// Relative change below which the fixed-point iterations stop. The paper uses
// 1e-6 to 1e-12; the iterations are cheap, so take the tight end.
constexpr double kTolerance = 1e-13;
constexpr int kMaxOuterIterations = 1000;
constexpr int kMaxInnerSweeps = 100000;
// Promotion factors beyond this only arise for levels that (almost) never fail;
// capping keeps the products of factors far from overflow.
constexpr int kMaxEvery = 1000000;

double perSecond(const Level& level) { return level.failuresPerHour / kSecondsPerHour; }

bool converged(double before, double after) {
  return std::abs(after - before) <= kTolerance * std::max(std::abs(after), 1e-300);
}

Status infeasible(const std::vector<Level>& levels) {
  double total = 0;
  for (const auto& l : levels) total += l.failuresPerHour;
  return makeError(Code::kFailedPrecondition,
                   "failures ({} per hour over all levels) come faster than the job can "
                   "checkpoint and recover; the model has no steady state",
                   total);
}

// Paper 004's Algorithm 1 for a long job: alternate between the failure counts
// mu_i = lambda_i w (held fixed while the inner problem is solved) and the wall
// time per unit of work w those intervals give, until w stops changing. Its
// fixed point is a stationary point of wallPerWork itself (docs/policy.md).
template <typename InnerSolve>
Result<double> algorithmOne(const std::vector<Level>& levels, std::vector<double>& intervals,
                            InnerSolve innerSolve, std::vector<double>& trace) {
  double wall = 1.0;  // line 2: mu_i from the failure-free length
  trace.clear();
  for (int iteration = 1; iteration <= kMaxOuterIterations; ++iteration) {
    std::vector<double> mu(levels.size());
    for (size_t i = 0; i < levels.size(); ++i) mu[i] = perSecond(levels[i]) * wall;
    RETURN_IF_ERROR(innerSolve(mu, intervals));
    double next = wallPerWork(levels, intervals);
    if (!std::isfinite(next)) return infeasible(levels);
    trace.push_back(next);
    if (converged(wall, next)) return next;
    wall = next;
  }
  return makeError(Code::kInternal, "multi-level intervals did not converge in {} iterations",
                   kMaxOuterIterations);
}

}  // namespace

Status validate(const std::vector<Level>& levels) {
  if (levels.empty()) {
    return makeError(Code::kInvalidArgument, "levels must list at least one level");
  }
  if (levels.size() > static_cast<size_t>(kMaxLevels)) {
    return makeError(Code::kInvalidArgument, "levels has {} entries; at most {} are supported",
                     levels.size(), kMaxLevels);
  }
  std::set<std::string> names;
  for (size_t i = 0; i < levels.size(); ++i) {
    const Level& l = levels[i];
    if (l.name.empty()) {
      return makeError(Code::kInvalidArgument, "levels[{}].name must not be empty", i);
    }
    if (!names.insert(l.name).second) {
      return makeError(Code::kInvalidArgument, "levels[{}].name \"{}\" is used twice", i, l.name);
    }
    // !(x > 0) also rejects NaN.
    if (!(l.checkpointSeconds > 0) || !std::isfinite(l.checkpointSeconds)) {
      return makeError(Code::kInvalidArgument,
                       "levels[{}] (\"{}\").checkpoint_seconds must be a finite number > 0, "
                       "got {}",
                       i, l.name, l.checkpointSeconds);
    }
    if (!(l.restoreSeconds >= 0) || !std::isfinite(l.restoreSeconds)) {
      return makeError(Code::kInvalidArgument,
                       "levels[{}] (\"{}\").restore_seconds must be a finite number >= 0, got {}",
                       i, l.name, l.restoreSeconds);
    }
    if (!(l.failuresPerHour > 0) || !std::isfinite(l.failuresPerHour)) {
      return makeError(Code::kInvalidArgument,
                       "levels[{}] (\"{}\").failures_per_hour must be a finite number > 0 (drop "
                       "a level that protects against nothing), got {}",
                       i, l.name, l.failuresPerHour);
    }
  }
  return Status::ok();
}

double wallPerWork(const std::vector<Level>& levels, const std::vector<double>& intervalSeconds) {
  double numerator = 1.0;
  double lostPerWork = 0.0;
  double lowerCostRate = 0.0;  // sum_{k<=i} C_k / t_k
  for (size_t i = 0; i < levels.size(); ++i) {
    const double t = intervalSeconds[i];
    numerator += levels[i].checkpointSeconds / t;
    lowerCostRate += levels[i].checkpointSeconds / t;
    // Formula (18): half an interval of work, plus the lower-level checkpoints
    // taken in it, plus the restore.
    lostPerWork += perSecond(levels[i]) *
                   (t / 2.0 + lowerCostRate * t / 2.0 + levels[i].restoreSeconds);
  }
  const double denominator = 1.0 - lostPerWork;
  if (!(denominator > 0)) return std::numeric_limits<double>::infinity();
  return numerator / denominator;
}

double firstOrderResidual(const std::vector<Level>& levels,
                          const std::vector<double>& intervalSeconds, double wall, int level) {
  const auto i = static_cast<size_t>(level);
  double lowerCostRate = 0.0;  // sum_{k<i} C_k n_k
  for (size_t k = 0; k < i; ++k) lowerCostRate += levels[k].checkpointSeconds / intervalSeconds[k];
  double higherFailures = 0.0;  // sum_{j>i} mu_j / n_j
  for (size_t j = i + 1; j < levels.size(); ++j) {
    higherFailures += perSecond(levels[j]) * wall * intervalSeconds[j];
  }
  const double ci = levels[i].checkpointSeconds;
  const double ti = intervalSeconds[i];
  const double mui = perSecond(levels[i]) * wall;
  // (23) with x_i = Te n_i and Te factored out: dJ/dn_i.
  return ci - mui * (1.0 + lowerCostRate) * ti * ti / 2.0 + ci / 2.0 * higherFailures;
}

Result<ContinuousSolution> solveContinuous(const std::vector<Level>& levels) {
  RETURN_IF_ERROR(validate(levels));
  const size_t n = levels.size();
  ContinuousSolution sol;
  sol.intervalSeconds.assign(n, 0.0);
  bool first = true;
  auto inner = [&](const std::vector<double>& mu, std::vector<double>& t) -> Status {
    if (first) {
      // Formula (25): Young's interval per level, ignoring the other levels.
      for (size_t i = 0; i < n; ++i) {
        t[i] = std::max(std::sqrt(2.0 * levels[i].checkpointSeconds / mu[i]),
                        levels[i].checkpointSeconds);
      }
      first = false;
    }
    // Coordinate-wise minimization: with the others fixed, the cost in n_i is
    // b n_i + a / n_i, minimized at sqrt(a / b) (condition (23)); the drain bound
    // t_i >= C_i clamps it. The cost is a posynomial, convex in log n, so the
    // sweeps converge to the constrained optimum.
    for (int sweep = 0; sweep < kMaxInnerSweeps; ++sweep) {
      bool stable = true;
      for (size_t i = 0; i < n; ++i) {
        double lowerCostRate = 0.0;
        for (size_t k = 0; k < i; ++k) lowerCostRate += levels[k].checkpointSeconds / t[k];
        double higherFailures = 0.0;
        for (size_t j = i + 1; j < n; ++j) higherFailures += mu[j] * t[j];
        const double a = mu[i] * (1.0 + lowerCostRate) / 2.0;
        const double b = levels[i].checkpointSeconds * (1.0 + higherFailures / 2.0);
        const double next = std::max(std::sqrt(b / a), levels[i].checkpointSeconds);
        stable &= converged(t[i], next);
        t[i] = next;
      }
      if (stable) return Status::ok();
    }
    return makeError(Code::kInternal,
                     "multi-level intervals did not converge in {} sweeps (intervals {})",
                     kMaxInnerSweeps, fmt::join(t, ", "));
  };
  ASSIGN_OR_RETURN(sol.wallPerWork,
                   algorithmOne(levels, sol.intervalSeconds, inner, sol.wallPerIteration));
  sol.outerIterations = static_cast<int>(sol.wallPerIteration.size());
  return sol;
}

Result<NestedSchedule> solveNested(const std::vector<Level>& levels, std::vector<int> every) {
  RETURN_IF_ERROR(validate(levels));
  if (every.size() != levels.size() || every.empty() || every[0] != 1) {
    return makeError(Code::kInvalidArgument,
                     "promotion factors must have one entry per level, the first being 1");
  }
  const size_t n = levels.size();
  // K_i: level i is checkpointed every K_i first-level intervals.
  std::vector<double> multiple(n, 1.0);
  for (size_t i = 0; i < n; ++i) {
    if (every[i] < 1) {
      return makeError(Code::kInvalidArgument, "promotion factor of level {} is {}, must be >= 1",
                       i, every[i]);
    }
    multiple[i] = (i == 0 ? 1.0 : multiple[i - 1]) * every[i];
  }
  double costRate = 0.0;   // sum C_i / K_i
  double shortest = 0.0;   // the drain bounds t_i >= C_i as a bound on t_1
  for (size_t i = 0; i < n; ++i) {
    costRate += levels[i].checkpointSeconds / multiple[i];
    shortest = std::max(shortest, levels[i].checkpointSeconds / multiple[i]);
  }
  auto inner = [&](const std::vector<double>& mu, std::vector<double>& t) -> Status {
    // With the ratios fixed the cost in n_1 is costRate n_1 + (sum mu_i K_i / 2) / n_1.
    double failureWeight = 0.0;
    for (size_t i = 0; i < n; ++i) failureWeight += mu[i] * multiple[i];
    const double first = std::max(std::sqrt(2.0 * costRate / failureWeight), shortest);
    for (size_t i = 0; i < n; ++i) t[i] = first * multiple[i];
    return Status::ok();
  };
  NestedSchedule s;
  s.every = std::move(every);
  s.intervalSeconds.assign(n, 0.0);
  ASSIGN_OR_RETURN(s.wallPerWork,
                   algorithmOne(levels, s.intervalSeconds, inner, s.wallPerIteration));
  return s;
}

std::vector<int> naiveEvery(const ContinuousSolution& continuous) {
  const auto& t = continuous.intervalSeconds;
  std::vector<int> every(t.size(), 1);
  for (size_t i = 1; i < t.size(); ++i) {
    every[i] = static_cast<int>(std::clamp(std::round(t[i] / t[i - 1]), 1.0, double{kMaxEvery}));
  }
  return every;
}

Result<MultiLevelPlan> planMultiLevel(const std::vector<Level>& levels) {
  MultiLevelPlan plan;
  ASSIGN_OR_RETURN(plan.continuous, solveContinuous(levels));
  const size_t n = levels.size();
  const auto& t = plan.continuous.intervalSeconds;

  // Candidates: floor and ceiling of each continuous ratio (at least 1), every
  // combination, each with its first interval re-optimized. Rounding each ratio
  // on its own ignores that the factors multiply along the chain and that the
  // first interval should move to compensate.
  std::vector<std::vector<int>> choices(n, std::vector<int>{1});
  for (size_t i = 1; i < n; ++i) {
    const double ratio = std::clamp(t[i] / t[i - 1], 1.0, double{kMaxEvery});
    choices[i] = {static_cast<int>(std::floor(ratio)), static_cast<int>(std::ceil(ratio))};
    if (choices[i][0] == choices[i][1]) choices[i].pop_back();
  }
  std::optional<NestedSchedule> best;
  Status lastError = Status::ok();
  auto consider = [&](const std::vector<int>& every) {
    auto s = solveNested(levels, every);
    if (!s) {
      lastError = s.status();
      return false;
    }
    if (!best || s->wallPerWork < best->wallPerWork * (1.0 - 1e-15)) {
      best = std::move(s).value();
      return true;
    }
    return false;
  };
  std::vector<size_t> pick(n, 0);
  for (;;) {
    std::vector<int> every(n);
    for (size_t i = 0; i < n; ++i) every[i] = choices[i][pick[i]];
    consider(every);
    size_t i = 1;
    while (i < n && ++pick[i] == choices[i].size()) pick[i++] = 0;
    if (i >= n) break;
  }
  // Then a local search one step at a time, in case the best factor lies
  // outside floor/ceil once the other factors are integers.
  for (bool improved = best.has_value(); improved;) {
    improved = false;
    for (size_t i = 1; i < n && !improved; ++i) {
      for (int step : {-1, 1}) {
        std::vector<int> every = best->every;
        every[i] += step;
        if (every[i] < 1 || every[i] > kMaxEvery) continue;
        if (consider(every)) {
          improved = true;
          break;
        }
      }
    }
  }
  if (!best) return lastError;
  plan.schedule = std::move(*best);
  log::get("policy")->debug(
      "multi-level plan: continuous intervals {} s after {} outer iterations, w = {}; nested "
      "every {} with intervals {} s, w = {}",
      fmt::join(t, ", "), plan.continuous.outerIterations, plan.continuous.wallPerWork,
      fmt::join(plan.schedule.every, ", "), fmt::join(plan.schedule.intervalSeconds, ", "),
      plan.schedule.wallPerWork);
  return plan;
}

}  // namespace phos::policy
