// SPDX-License-Identifier: Apache-2.0
// The checkpoint policy simulator: exponential failures per level, nested checkpoints.
#include "phos/policy/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace phos::policy {
namespace {

constexpr double kSecondsPerHour = 3600.0;
constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr uint64_t kMaxMultiple = uint64_t{1} << 53;

// Exponential variates by inversion from the raw 64-bit output: unlike
// std::exponential_distribution, the sequence is the same with every standard
// library, so a seed means the same failures everywhere.
class FailureClock {
 public:
  FailureClock(double perSecond, uint64_t seed) : rate_(perSecond), engine_(seed) {}
  double nextAfter(double now) {
    if (!(rate_ > 0)) return kNever;
    const double u = static_cast<double>(engine_() >> 11) * 0x1.0p-53;  // [0, 1)
    return now - std::log1p(-u) / rate_;
  }

 private:
  double rate_;
  std::mt19937_64 engine_;
};

}  // namespace

Result<SimulationResult> simulate(const std::vector<Level>& levels, const SimulatedPolicy& policy,
                                  double wallSeconds, uint64_t seed) {
  const size_t n = levels.size();
  if (n == 0) return makeError(Code::kInvalidArgument, "the simulator needs at least one level");
  if (!(policy.firstIntervalSeconds > 0) || !std::isfinite(policy.firstIntervalSeconds)) {
    return makeError(Code::kInvalidArgument, "first interval must be > 0, got {}",
                     policy.firstIntervalSeconds);
  }
  if (policy.every.size() != n || policy.every[0] != 1) {
    return makeError(Code::kInvalidArgument,
                     "promotion factors must have one entry per level, the first being 1");
  }
  if (!(wallSeconds > 0) || !std::isfinite(wallSeconds)) {
    return makeError(Code::kInvalidArgument, "simulated time must be > 0, got {}", wallSeconds);
  }
  for (size_t i = 0; i < n; ++i) {
    // Unlike the planner, the simulator accepts a level that never fails: it is
    // how a failure-free run is checked against hand-computed costs.
    const Level& l = levels[i];
    if (!(l.checkpointSeconds >= 0) || !(l.restoreSeconds >= 0) || !(l.failuresPerHour >= 0) ||
        !std::isfinite(l.checkpointSeconds) || !std::isfinite(l.restoreSeconds) ||
        !std::isfinite(l.failuresPerHour)) {
      return makeError(Code::kInvalidArgument,
                       "level {} (\"{}\") needs finite, non-negative costs and failure rate", i,
                       l.name);
    }
  }
  std::vector<uint64_t> multiple(n, 1);
  for (size_t i = 1; i < n; ++i) {
    if (policy.every[i] < 1) {
      return makeError(Code::kInvalidArgument, "promotion factor of level {} is {}", i,
                       policy.every[i]);
    }
    const auto every = static_cast<uint64_t>(policy.every[i]);
    // Checkpoint numbers are tested against these multiples; keep them exact.
    if (multiple[i - 1] > kMaxMultiple / every) {
      return makeError(Code::kInvalidArgument,
                       "promotion factors multiply to more than {} at level {}", kMaxMultiple, i);
    }
    multiple[i] = multiple[i - 1] * every;
  }
  // Level i's checkpoint costs the writes to levels 0..i.
  std::vector<double> cumulativeCost(n);
  for (size_t i = 0; i < n; ++i) {
    cumulativeCost[i] = (i ? cumulativeCost[i - 1] : 0.0) + levels[i].checkpointSeconds;
  }

  std::vector<FailureClock> clocks;
  std::vector<double> nextFailure(n);
  // Spread the seeds so that level i's stream does not depend on the level count.
  std::vector<uint64_t> seeds(n);
  {
    std::mt19937_64 seeder(seed);
    for (auto& s : seeds) s = seeder();
  }
  for (size_t i = 0; i < n; ++i) {
    clocks.emplace_back(levels[i].failuresPerHour / kSecondsPerHour, seeds[i]);
    nextFailure[i] = clocks[i].nextAfter(0.0);
  }
  auto firstFailure = [&] {
    size_t which = 0;
    for (size_t i = 1; i < n; ++i) {
      if (nextFailure[i] < nextFailure[which]) which = i;
    }
    return which;
  };

  SimulationResult r;
  const double tau = policy.firstIntervalSeconds;
  // Progress is counted in whole intervals: work happens between checkpoint
  // positions q * tau, and a rollback always lands on one.
  uint64_t done = 0;
  std::vector<uint64_t> saved(n, 0);  // newest checkpoint at level >= i; the start counts
  double now = 0.0;
  int restoring = -1;  // level being restored from, or -1 while working

  while (now < wallSeconds) {
    const size_t f = firstFailure();
    if (restoring >= 0) {
      const double end = now + levels[static_cast<size_t>(restoring)].restoreSeconds;
      if (end <= nextFailure[f]) {
        r.restoreSeconds += end - now;
        now = end;
        restoring = -1;
        continue;
      }
    } else {
      const uint64_t q = done + 1;
      size_t level = 0;
      while (level + 1 < n && q % multiple[level + 1] == 0) ++level;
      const double end = now + tau + cumulativeCost[level];
      if (end <= nextFailure[f]) {
        r.checkpointSeconds += cumulativeCost[level];
        ++r.checkpoints;
        now = end;
        done = q;
        for (size_t i = 0; i <= level; ++i) saved[i] = q;
        continue;
      }
      // Interrupted: the partial interval is lost; account the checkpoint part.
      const double checkpointStart = now + tau;
      if (nextFailure[f] > checkpointStart) r.checkpointSeconds += nextFailure[f] - checkpointStart;
    }
    if (restoring >= 0) r.restoreSeconds += nextFailure[f] - now;
    // A failure of level f: copies below f are gone; roll back to level f's.
    now = nextFailure[f];
    nextFailure[f] = clocks[f].nextAfter(now);
    ++r.failures;
    done = saved[f];
    for (size_t i = 0; i < f; ++i) saved[i] = saved[f];
    restoring = std::max(restoring, static_cast<int>(f));
  }
  r.wallSeconds = now;
  r.workSeconds = static_cast<double>(done) * tau;
  return r;
}

}  // namespace phos::policy
