// SPDX-License-Identifier: Apache-2.0
// Immediate post-dominators by the Cooper-Harvey-Kennedy iteration on the reverse CFG.
#include "postdom.h"

#include <cstddef>
#include <utility>

namespace phos::vgpu::engine::detail {

std::vector<uint32_t> immediatePostDominators(
    const std::vector<std::vector<uint32_t>>& successors) {
  const uint32_t n = static_cast<uint32_t>(successors.size());
  const uint32_t exitNode = n;
  // Predecessors in the forward graph are the successors of the reverse graph.
  std::vector<std::vector<uint32_t>> preds(n + 1);
  for (uint32_t b = 0; b < n; ++b) {
    for (uint32_t s : successors[b]) preds[s].push_back(b);
  }
  // Post-order of the reverse graph from the exit node, iteratively.
  constexpr uint32_t kUnvisited = UINT32_MAX;
  std::vector<uint32_t> order(n + 1, kUnvisited);  // post-order number
  std::vector<uint32_t> postorder;
  postorder.reserve(n + 1);
  std::vector<std::pair<uint32_t, std::size_t>> stack;
  std::vector<bool> seen(n + 1, false);
  stack.emplace_back(exitNode, 0);
  seen[exitNode] = true;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < preds[node].size()) {
      uint32_t p = preds[node][next++];
      if (!seen[p]) {
        seen[p] = true;
        stack.emplace_back(p, 0);
      }
    } else {
      order[node] = static_cast<uint32_t>(postorder.size());
      postorder.push_back(node);
      stack.pop_back();
    }
  }
  std::vector<uint32_t> ipdom(n + 1, kUnvisited);
  ipdom[exitNode] = exitNode;
  auto intersect = [&](uint32_t a, uint32_t b) {
    while (a != b) {
      while (order[a] < order[b]) a = ipdom[a];
      while (order[b] < order[a]) b = ipdom[b];
    }
    return a;
  };
  bool changed = true;
  while (changed) {
    changed = false;
    // Reverse post-order, skipping the root (the last in post-order).
    for (std::size_t i = postorder.size() - 1; i-- > 0;) {
      uint32_t b = postorder[i];
      uint32_t newIdom = kUnvisited;
      const std::vector<uint32_t>& succ = b == exitNode ? preds[b] : successors[b];
      for (uint32_t s : succ) {
        if (ipdom[s] == kUnvisited) continue;
        newIdom = newIdom == kUnvisited ? s : intersect(s, newIdom);
      }
      if (newIdom != kUnvisited && ipdom[b] != newIdom) {
        ipdom[b] = newIdom;
        changed = true;
      }
    }
  }
  std::vector<uint32_t> result(n);
  for (uint32_t b = 0; b < n; ++b) result[b] = ipdom[b] == kUnvisited ? exitNode : ipdom[b];
  return result;
}

}  // namespace phos::vgpu::engine::detail
