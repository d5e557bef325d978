// SPDX-License-Identifier: Apache-2.0
// A seeded event simulator of a checkpointed job with exponential failures per level.
#pragma once

#include <cstdint>
#include <vector>

#include "phos/common/status.h"
#include "phos/policy/multi_level.h"

namespace phos::policy {

// Checkpoint every firstIntervalSeconds of useful work; checkpoint number q goes
// to the highest level i whose multiple prod(every[1..i]) divides q.
struct SimulatedPolicy {
  double firstIntervalSeconds = 0;
  std::vector<int> every;  // every[0] == 1
};

struct SimulationResult {
  double wallSeconds = 0;
  double workSeconds = 0;        // useful work kept at the end
  double checkpointSeconds = 0;  // time spent writing checkpoints (incl. lost ones)
  double restoreSeconds = 0;     // time spent restoring (incl. interrupted restores)
  uint64_t failures = 0;
  uint64_t checkpoints = 0;
  // Fraction of wall-clock time that did not produce kept work.
  double wastedFraction() const { return 1.0 - workSeconds / wallSeconds; }
};

// Simulates `wallSeconds` of a job. Failures of each level arrive as a Poisson
// process in wall-clock time (during work, checkpoints and restores alike), each
// level from its own generator seeded from `seed`, so two policies simulated
// with the same seed meet the same failures (common random numbers). A failure
// during a checkpoint loses that checkpoint; a failure during a restore restarts
// it from the more durable of the two levels. Deterministic for a given seed.
Result<SimulationResult> simulate(const std::vector<Level>& levels, const SimulatedPolicy& policy,
                                  double wallSeconds, uint64_t seed);

}  // namespace phos::policy
