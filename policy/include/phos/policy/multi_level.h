// SPDX-License-Identifier: Apache-2.0
// Multi-level checkpoint intervals (paper 004's model with the core count fixed), nested.
#pragma once

#include <string>
#include <vector>

#include "phos/common/status.h"

namespace phos::policy {

// One storage level, lowest (fastest, least durable) first. A checkpoint promoted
// to level i has been written to every level below it first, so it costs the sum
// of checkpointSeconds of levels 1..i. A failure of level i's class destroys the
// copies in the levels below i and is recovered from the newest checkpoint at
// level i or above.
struct Level {
  std::string name;
  double checkpointSeconds = 0;  // C_i: time to write one checkpoint to this level
  double restoreSeconds = 0;     // R_i: time to restore from this level
  double failuresPerHour = 0;    // lambda_i: job-wide rate of failures of this class
};

inline constexpr int kMaxLevels = 8;

// Rejects level lists the model cannot use; the message names the level and field.
Status validate(const std::vector<Level>& levels);

// E(Tw)/Te of paper 004's formula (21) for a long job, i.e. wall-clock seconds per
// second of useful work, when level i is checkpointed every intervalSeconds[i]
// seconds of useful work. The failure count mu_i is lambda_i E(Tw) (the fixed
// point of the paper's Algorithm 1), which gives the closed form
//   w = (1 + sum C_i/t_i) / (1 - sum lambda_i (t_i/2 + sum_{k<=i} C_k t_i/(2 t_k) + R_i)).
// Returns +infinity where the denominator is not positive: failures come faster
// than the job can recover from them.
double wallPerWork(const std::vector<Level>& levels, const std::vector<double>& intervalSeconds);

// Paper 004's first-order condition (23) for level i, in per-unit-of-work form:
// the derivative of the cost with the failure counts mu_k = lambda_k w held fixed.
// Zero at an unconstrained optimum; used by the tests and by docs/policy.md.
double firstOrderResidual(const std::vector<Level>& levels,
                          const std::vector<double>& intervalSeconds, double wall, int level);

// The optimum without nesting: real intervals, each at least its level's
// checkpoint time. Paper 004's Algorithm 1 (outer loop on the failure counts)
// around a coordinate-wise solution of its conditions (23).
struct ContinuousSolution {
  std::vector<double> intervalSeconds;
  double wallPerWork = 0;
  int outerIterations = 0;
  // w after each outer iteration (line 6 of Algorithm 1), for docs and tests.
  std::vector<double> wallPerIteration;
};
Result<ContinuousSolution> solveContinuous(const std::vector<Level>& levels);

// The best first-level interval for fixed promotion factors (every[0] must be 1;
// level i is checkpointed at every every[i]-th checkpoint of level i-1).
struct NestedSchedule {
  std::vector<int> every;
  std::vector<double> intervalSeconds;
  double wallPerWork = 0;
  std::vector<double> wallPerIteration;  // as in ContinuousSolution
};
Result<NestedSchedule> solveNested(const std::vector<Level>& levels, std::vector<int> every);

// The plan `phos policy` prints: nested integer promotion factors chosen by
// searching around the continuous optimum (see docs/policy.md).
struct MultiLevelPlan {
  NestedSchedule schedule;
  ContinuousSolution continuous;
  // 1 - 1/w: fraction of wall-clock time not spent on useful work.
  double wastedFraction() const { return 1.0 - 1.0 / schedule.wallPerWork; }
};
Result<MultiLevelPlan> planMultiLevel(const std::vector<Level>& levels);

// The promotion factors obtained by rounding each continuous ratio to the nearest
// integer (at least 1), kept for comparison in tests and the simulator.
std::vector<int> naiveEvery(const ContinuousSolution& continuous);

}  // namespace phos::policy
