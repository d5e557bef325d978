// SPDX-License-Identifier: Apache-2.0
// Running the offload schedulers by name, timed, and scored with the one blocking-time model.
#include "phos/offload/schedulers.h"

#include <chrono>

#include "phos/common/log.h"

namespace phos::offload {

std::string_view schedulerName(Scheduler scheduler) {
  switch (scheduler) {
    case Scheduler::kBaseline: return "baseline";
    case Scheduler::kGreedy: return "greedy";
    case Scheduler::kFlow: return "flow";
    case Scheduler::kExact: return "exact";
  }
  return "unknown";
}

Result<Scheduler> parseScheduler(std::string_view name) {
  for (Scheduler s : kAllSchedulers) {
    if (schedulerName(s) == name) return s;
  }
  return makeError(Code::kInvalidArgument, "no offload scheduler \"{}\": baseline, greedy, flow or exact", name);
}

Result<Outcome> runScheduler(const Problem& problem, Scheduler scheduler) {
  using Clock = std::chrono::steady_clock;
  Outcome out;
  out.scheduler = scheduler;
  const auto start = Clock::now();
  switch (scheduler) {
    case Scheduler::kBaseline: out.plan = baselinePlan(problem); break;
    case Scheduler::kGreedy: out.plan = greedyPlan(problem); break;
    case Scheduler::kFlow: {
      ASSIGN_OR_RETURN(out.plan, minTimeFlowPlan(problem));
      break;
    }
    case Scheduler::kExact: {
      ASSIGN_OR_RETURN(out.plan, exactPlan(problem));
      break;
    }
  }
  out.solveSeconds = std::chrono::duration<double>(Clock::now() - start).count();
  out.blockingSeconds = blockingTime(problem, out.plan);
  log::get("offload")->debug("{}: {} GPUs, {} chunks to move, blocking {:.6f} s, solved in {:.1f} us",
                             schedulerName(scheduler), problem.gpuCount(),
                             problem.totalRemainder(), out.blockingSeconds,
                             out.solveSeconds * 1e6);
  return out;
}

Result<std::vector<Outcome>> runAllSchedulers(const Problem& problem) {
  std::vector<Outcome> all;
  for (Scheduler s : kAllSchedulers) {
    ASSIGN_OR_RETURN(Outcome o, runScheduler(problem, s));
    RETURN_IF_ERROR_CTX(verifyPlan(problem, o.plan), schedulerName(s));
    all.push_back(std::move(o));
  }
  return all;
}

}  // namespace phos::offload
