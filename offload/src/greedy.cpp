// SPDX-License-Identifier: Apache-2.0
// The paper's baseline (remainder to host) and its greedy scheduler (Algorithm 1).
#include <vector>

#include "phos/offload/schedulers.h"

namespace phos::offload {

Plan baselinePlan(const Problem& problem) {
  std::vector<Transfer> transfers;
  for (int i = 0; i < problem.gpuCount(); ++i) {
    transfers.push_back({i, kHost, problem.remainder[i], 0});
  }
  return finalizePlan(problem, std::move(transfers));
}

// Algorithm 1 with the slips of the printed version fixed (docs/offload.md):
// the host transfer is recorded before the remainder is cleared, and the
// times are not accumulated here but taken from blockingTime() afterwards.
// Ties (equal remainders, equal bandwidths) go to the lowest GPU index so
// that plans are reproducible.
Plan greedyPlan(const Problem& problem) {
  const int n = problem.gpuCount();
  std::vector<int64_t> remainder = problem.remainder;
  std::vector<int64_t> spare = problem.spare;
  std::vector<Transfer> transfers;
  while (true) {
    int i = -1;
    for (int k = 0; k < n; ++k) {
      if (remainder[k] > 0 && (i < 0 || remainder[k] > remainder[i])) i = k;
    }
    if (i < 0) break;
    while (remainder[i] > 0) {
      int j = -1;
      for (int k = 0; k < n; ++k) {
        if (problem.bandwidth[i][k] > 0 && spare[k] > 0 &&
            (j < 0 || problem.bandwidth[i][k] > problem.bandwidth[i][j])) {
          j = k;
        }
      }
      if (j < 0) break;
      const int64_t moved = std::min(remainder[i], spare[j]);
      remainder[i] -= moved;
      spare[j] -= moved;
      transfers.push_back({i, j, moved, 0});
    }
    if (remainder[i] > 0) {
      transfers.push_back({i, kHost, remainder[i], 0});
      remainder[i] = 0;
    }
  }
  return finalizePlan(problem, std::move(transfers));
}

}  // namespace phos::offload
