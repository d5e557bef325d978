// SPDX-License-Identifier: Apache-2.0
// The offload schedulers: the paper's baseline, greedy and min-time max-flow, and an exact solver.
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "phos/common/status.h"
#include "phos/offload/plan.h"
#include "phos/offload/problem.h"

namespace phos::offload {

enum class Scheduler {
  kBaseline,  // every sender writes its remainder to the host
  kGreedy,    // Maurya et al., Algorithm 1
  kFlow,      // Maurya et al., Algorithm 2 (min-time max-flow), slips fixed
  kExact,     // binary search on T with a max-flow feasibility test
};
inline constexpr std::array<Scheduler, 4> kAllSchedulers = {
    Scheduler::kBaseline, Scheduler::kGreedy, Scheduler::kFlow, Scheduler::kExact};

std::string_view schedulerName(Scheduler scheduler);
// The scheduler of that name; kInvalidArgument naming the four otherwise.
Result<Scheduler> parseScheduler(std::string_view name);

Plan baselinePlan(const Problem& problem);
Plan greedyPlan(const Problem& problem);
// The paper's algorithm pushes one chunk per path search over the whole
// graph; an instance needing more than kMaxFlowWork arc visits (chunks to
// move x arcs) is refused with kInvalidArgument instead of running for
// minutes.
inline constexpr int64_t kMaxFlowWork = int64_t{1} << 35;
Result<Plan> minTimeFlowPlan(const Problem& problem);
Result<Plan> exactPlan(const Problem& problem);

struct Outcome {
  Scheduler scheduler = Scheduler::kBaseline;
  Plan plan;
  double blockingSeconds = 0;  // blockingTime(problem, plan)
  double solveSeconds = 0;     // wall time the scheduler took
};

Result<Outcome> runScheduler(const Problem& problem, Scheduler scheduler);
Result<std::vector<Outcome>> runAllSchedulers(const Problem& problem);

}  // namespace phos::offload
