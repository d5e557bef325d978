// SPDX-License-Identifier: Apache-2.0
// The exact scheduler: the least blocking time T whose max-flow network (capacities T*B) carries every chunk.
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include <lemon/preflow.h>
#include <lemon/smart_graph.h>

#include "phos/offload/schedulers.h"

namespace phos::offload {
namespace {

using Graph = lemon::SmartDigraph;

// How many whole chunks a resource of bandwidth `b` moves within `t` seconds.
// A t that is k*c/b up to rounding counts as exactly k, so that a candidate
// time computed from k is never judged one chunk short.
int64_t chunksWithin(double t, double b, double c) {
  const double x = t * b / c;
  const double k = std::round(x);
  if (std::abs(x - k) <= 1e-9 * std::max(1.0, x)) return static_cast<int64_t>(k);
  return static_cast<int64_t>(std::floor(x));
}

// The feasibility network: source -> sender i (remainder_i) -> host (T*B_h)
// and -> [egress node (T*E_i)] -> receiver j (min(spare_j, T*B_ij)) ->
// sink (min(spare_j, T*I_j)); host -> sink unbounded. Every resource of the
// blocking-time model is exactly one arc, so "a flow carries every chunk"
// is "a plan with blockingTime() <= T exists". Built once; only the
// capacities that depend on T change between tests.
class FeasibilityNetwork {
 public:
  explicit FeasibilityNetwork(const Problem& problem) : problem_(problem), capacity_(graph_) {
    const int n = problem.gpuCount();
    source_ = graph_.addNode();
    sink_ = graph_.addNode();
    Graph::Node host = graph_.addNode();
    addArc(host, sink_, problem.totalRemainder(), 0.0);
    std::vector<Graph::Node> receiver(n, lemon::INVALID);
    for (int j = 0; j < n; ++j) {
      if (problem.spare[j] <= 0) continue;
      receiver[j] = graph_.addNode();
      addArc(receiver[j], sink_, problem.spare[j], problem.ingressLimit[j]);
    }
    for (int i = 0; i < n; ++i) {
      if (problem.remainder[i] <= 0) continue;
      Graph::Node sender = graph_.addNode();
      addArc(source_, sender, problem.remainder[i], 0.0);
      plan_.push_back(
          {addArc(sender, host, problem.remainder[i], problem.hostBandwidth), i, kHost});
      Graph::Node out = sender;
      if (problem.egressLimit[i] > 0) {
        out = graph_.addNode();
        addArc(sender, out, problem.remainder[i], problem.egressLimit[i]);
      }
      for (int j = 0; j < n; ++j) {
        if (receiver[j] == lemon::INVALID || problem.bandwidth[i][j] <= 0) continue;
        plan_.push_back(
            {addArc(out, receiver[j], problem.spare[j], problem.bandwidth[i][j]), i, j});
      }
    }
    for (const Limited& l : limited_) bandwidths_.insert(l.bandwidth);
  }

  // Distinct bandwidths of the timed resources: the optimum is k*c/b for one
  // of them, since feasibility only changes where some floor(T*b/c) steps.
  const std::set<double>& bandwidths() const { return bandwidths_; }

  // Runs the max flow with every resource allowed `t` seconds; true if every
  // chunk finds a place. The flow is kept for plan().
  bool feasible(double t) {
    const double c = static_cast<double>(problem_.chunkBytes);
    for (const Limited& l : limited_) {
      capacity_[l.arc] = std::min(l.bound, chunksWithin(t, l.bandwidth, c));
    }
    preflow_ = std::make_unique<lemon::Preflow<Graph, Graph::ArcMap<int64_t>>>(
        graph_, capacity_, source_, sink_);
    preflow_->run();
    return preflow_->flowValue() == problem_.totalRemainder();
  }

  Plan plan() const {
    std::vector<Transfer> transfers;
    for (const PlannedArc& p : plan_) {
      transfers.push_back({p.from, p.to, preflow_->flow(p.arc), 0});
    }
    return finalizePlan(problem_, std::move(transfers));
  }

 private:
  struct Limited {
    Graph::Arc arc;
    int64_t bound;     // capacity regardless of time (chunks, slots)
    double bandwidth;  // bytes per second
  };
  struct PlannedArc {
    Graph::Arc arc;
    int from;
    int to;
  };

  // bandwidth 0: the arc is not a timed resource.
  Graph::Arc addArc(Graph::Node u, Graph::Node v, int64_t bound, double bandwidth) {
    Graph::Arc a = graph_.addArc(u, v);
    capacity_[a] = bound;
    if (bandwidth > 0) limited_.push_back({a, bound, bandwidth});
    return a;
  }

  const Problem& problem_;
  Graph graph_;
  Graph::ArcMap<int64_t> capacity_;
  Graph::Node source_, sink_;
  std::vector<Limited> limited_;
  std::vector<PlannedArc> plan_;
  std::set<double> bandwidths_;
  std::unique_ptr<lemon::Preflow<Graph, Graph::ArcMap<int64_t>>> preflow_;
};

// A time below which no plan exists: the busiest sender cannot move its
// remainder even with every one of its links and its host link at full
// speed. Lowered a little so that it is infeasible despite chunksWithin()'s
// rounding tolerance.
double lowerBound(const Problem& problem) {
  const double c = static_cast<double>(problem.chunkBytes);
  double lo = 0;
  for (int i = 0; i < problem.gpuCount(); ++i) {
    if (problem.remainder[i] == 0) continue;
    double out = 0;
    for (int j = 0; j < problem.gpuCount(); ++j) {
      if (problem.spare[j] > 0) out += problem.bandwidth[i][j];
    }
    if (problem.egressLimit[i] > 0) out = std::min(out, problem.egressLimit[i]);
    out += problem.hostBandwidth;
    lo = std::max(lo, static_cast<double>(problem.remainder[i]) * c / out);
  }
  return lo * (1 - 1e-6);
}

}  // namespace

Result<Plan> exactPlan(const Problem& problem) {
  if (problem.totalRemainder() == 0) return finalizePlan(problem, {});
  const double c = static_cast<double>(problem.chunkBytes);
  FeasibilityNetwork net(problem);

  // Invariant: no plan finishes within lo; `best` finishes in bestTime; a
  // plan finishing within hi exists. The baseline always exists.
  Plan best = baselinePlan(problem);
  double bestTime = blockingTime(problem, best);
  double hi = bestTime;
  double lo = lowerBound(problem);

  // Phase 1: geometric bisection, until the fastest resource has at most
  // two candidate times k*c/b left inside (lo, hi) (or the bracket is
  // narrower than rounding).
  const double fastest = *net.bandwidths().rbegin();
  while (hi > lo * (1 + 1e-9) && (hi - lo) * fastest / c > 2) {
    const double t = std::sqrt(lo * hi);
    if (net.feasible(t)) {
      Plan plan = net.plan();
      const double time = blockingTime(problem, plan);
      hi = std::min(t, time);
      if (time < bestTime) {
        bestTime = time;
        best = std::move(plan);
      }
    } else {
      lo = t;
    }
  }

  // Phase 2: the optimum is a candidate time k*c/b in (lo, bestTime], and
  // after phase 1 there are at most a few of them. For each resource
  // bandwidth, binary-search the least feasible k in that window.
  for (double b : net.bandwidths()) {
    int64_t kLo = chunksWithin(lo, b, c);        // k*c/b <= lo: infeasible
    int64_t kHi = chunksWithin(bestTime, b, c);  // k*c/b >= bestTime: no gain
    if (static_cast<double>(kHi) * c / b < bestTime * (1 - 1e-12)) ++kHi;
    std::optional<Plan> found;
    while (kHi - kLo > 1) {
      const int64_t mid = kLo + (kHi - kLo) / 2;
      if (net.feasible(static_cast<double>(mid) * c / b)) {
        kHi = mid;
        found = net.plan();
      } else {
        kLo = mid;
      }
    }
    if (found) {
      const double time = blockingTime(problem, *found);
      if (time < bestTime) {
        bestTime = time;
        best = std::move(*found);
      }
    }
  }
  if (!std::isfinite(bestTime)) {
    return makeError(Code::kInternal, "exact offload search found no finite plan");
  }
  return best;
}

}  // namespace phos::offload
