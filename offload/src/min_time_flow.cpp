// SPDX-License-Identifier: Apache-2.0
// The paper's min-time max-flow scheduler (Algorithm 2) on a LEMON residual graph.
#include <cmath>
#include <functional>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

#include <lemon/smart_graph.h>

#include "phos/offload/schedulers.h"

namespace phos::offload {
namespace {

using Graph = lemon::SmartDigraph;

// The augmented graph of Section IV.B: every arc is paired with a back-arc of
// capacity 0 and negated cost. Costs are seconds per chunk (c / B), so that
// flow * cost is the time an arc is busy. A SmartDigraph numbers arcs in the
// order they are added, so an arc and its partner have ids 2k and 2k+1.
// (Maps of Arc values would also do, but LEMON 1.3's ArrayMap does not
// compile as C++20: it calls std::allocator::construct.)
class ResidualNetwork {
 public:
  ResidualNetwork() : capacity_(graph_), cost_(graph_) {}

  Graph::Node addNode() { return graph_.addNode(); }

  Graph::Arc addArc(Graph::Node u, Graph::Node v, int64_t capacity, double cost) {
    Graph::Arc forward = graph_.addArc(u, v);
    Graph::Arc back = graph_.addArc(v, u);
    capacity_[forward] = capacity;
    capacity_[back] = 0;
    cost_[forward] = cost;
    cost_[back] = -cost;
    return forward;
  }

  Graph::Arc partner(Graph::Arc a) const { return graph_.arcFromId(graph_.id(a) ^ 1); }

  int64_t flow(Graph::Arc forward) const { return capacity_[partner(forward)]; }

  int64_t arcCount() const { return graph_.arcNum(); }

  // One iteration of Algorithm 2's outer loop: the path whose worst arc
  // score (line 11) is least, then one chunk along it. Returns false when the
  // sink is unreachable. The paper calls for Bellman-Ford because back-arcs
  // have negative costs, but line 11 scores every arc >= 0 and a path by its
  // maximum, so a Dijkstra-style search finds the least-score path, and may
  // stop as soon as the sink is settled.
  bool augmentOneChunk(Graph::Node source, Graph::Node sink) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    Graph::NodeMap<double> dist(graph_, kInf);
    Graph::NodeMap<int> parent(graph_, -1);  // arc id
    Graph::NodeMap<bool> settled(graph_, false);
    using Entry = std::pair<double, int>;  // (score, node id)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    dist[source] = 0;  // the printed version leaves it at infinity
    heap.push({0.0, graph_.id(source)});
    while (!heap.empty()) {
      const Graph::Node u = graph_.nodeFromId(heap.top().second);
      heap.pop();
      if (settled[u]) continue;
      settled[u] = true;
      if (u == sink) break;
      // Every residual arc, not only the B_uv > 0 pairs the printed loop names:
      // source, sink, host and back-arcs are not in B.
      for (Graph::OutArcIt a(graph_, u); a != lemon::INVALID; ++a) {
        if (capacity_[a] <= 0) continue;
        const Graph::Node v = graph_.target(a);
        if (settled[v]) continue;
        const double cost = cost_[a];
        // Lines 9-11: for a forward arc, its time once one more chunk is on
        // it; for a back-arc, the time of the arc it relieves.
        const double f = static_cast<double>(cost > 0 ? capacity_[partner(a)] : capacity_[a]);
        const double t = std::max(dist[u], std::abs(f * cost) + cost);
        if (dist[v] > t) {
          dist[v] = t;
          parent[v] = graph_.id(a);
          heap.push({t, graph_.id(v)});
        }
      }
    }
    if (dist[sink] == kInf) return false;
    for (Graph::Node v = sink; v != source;) {
      Graph::Arc a = graph_.arcFromId(parent[v]);
      capacity_[a] -= 1;
      capacity_[partner(a)] += 1;
      v = graph_.source(a);
    }
    return true;
  }

 private:
  Graph graph_;
  Graph::ArcMap<int64_t> capacity_;
  Graph::ArcMap<double> cost_;
};

}  // namespace

Result<Plan> minTimeFlowPlan(const Problem& problem) {
  const int n = problem.gpuCount();
  const double c = static_cast<double>(problem.chunkBytes);
  const int64_t total = problem.totalRemainder();
  ResidualNetwork net;
  const Graph::Node source = net.addNode();
  const Graph::Node sink = net.addNode();
  // The host is a node of its own (Figure 2, edges of cost 1/gamma), which the
  // text of Section IV.B leaves out: without it the remainder that fits on no
  // peer has nowhere to go and the max flow is not the whole remainder.
  const Graph::Node host = net.addNode();
  net.addArc(host, sink, total, 0);

  std::vector<Graph::Node> receiver(n, lemon::INVALID);
  for (int j = 0; j < n; ++j) {
    if (problem.spare[j] <= 0) continue;
    receiver[j] = net.addNode();
    // Ingress limits (our extension) are the receiver->sink arc's time.
    const double cost = problem.ingressLimit[j] > 0 ? c / problem.ingressLimit[j] : 0.0;
    net.addArc(receiver[j], sink, problem.spare[j], cost);
  }

  struct PlannedArc {
    Graph::Arc arc;
    int from;
    int to;
  };
  std::vector<PlannedArc> planned;
  for (int i = 0; i < n; ++i) {
    if (problem.remainder[i] <= 0) continue;
    const Graph::Node sender = net.addNode();
    // The text says "from the source to the receivers"; it must be senders.
    net.addArc(source, sender, problem.remainder[i], 0);
    planned.push_back({net.addArc(sender, host, problem.remainder[i], c / problem.hostBandwidth),
                       i, kHost});
    // Egress limits (our extension): peer traffic leaves through one arc
    // whose time is the GPU's total NVLink egress.
    Graph::Node out = sender;
    if (problem.egressLimit[i] > 0) {
      out = net.addNode();
      net.addArc(sender, out, problem.remainder[i], c / problem.egressLimit[i]);
    }
    for (int j = 0; j < n; ++j) {
      if (receiver[j] == lemon::INVALID || problem.bandwidth[i][j] <= 0) continue;
      planned.push_back(
          {net.addArc(out, receiver[j], problem.spare[j], c / problem.bandwidth[i][j]), i, j});
    }
  }

  // One search over the graph per chunk: refuse what would run for minutes
  // rather than hang (the 128-GPU benchmark instances, about 1e8 chunks x
  // arcs, take a few ms here; the limit is about 300 times that).
  if (total * net.arcCount() > kMaxFlowWork) {
    return makeError(Code::kInvalidArgument,
                     "the min-time max-flow scheduler would search {} paths over {} arcs, more "
                     "than it is allowed ({} arc visits); use a larger chunk_bytes or the exact "
                     "scheduler",
                     total, net.arcCount(), kMaxFlowWork);
  }
  // Lines 16-17: stop when no augmenting path is left. The plan is read after
  // the loop (the printed version returns from inside it) and only from
  // forward sender arcs (the printed loop also walks the back-arcs).
  while (net.augmentOneChunk(source, sink)) {
  }
  std::vector<Transfer> transfers;
  for (const PlannedArc& p : planned) {
    transfers.push_back({p.from, p.to, net.flow(p.arc), 0});
  }
  return finalizePlan(problem, std::move(transfers));
}

}  // namespace phos::offload
