// SPDX-License-Identifier: Apache-2.0
// Offload plans, and the one function that says how long a plan blocks the application.
#pragma once

#include <cstdint>
#include <vector>

#include "phos/common/status.h"
#include "phos/offload/problem.h"

namespace phos::offload {

inline constexpr int kHost = -1;

struct Transfer {
  int from = 0;
  int to = kHost;  // a GPU index, or kHost
  int64_t chunks = 0;
  int64_t bytes = 0;  // chunks * chunkBytes, less the tail shortfall on one transfer
  friend bool operator==(const Transfer&, const Transfer&) = default;
};

struct Plan {
  std::vector<Transfer> transfers;  // at most one per (from, to), sorted by (from, to)
};

// Builds a plan from per-(from, to) chunk counts: merges duplicates, drops
// empty entries, sorts, and fills in bytes (the shorter last chunk of a GPU
// that has no slot of its own is charged to its host transfer if any).
Plan finalizePlan(const Problem& problem, std::vector<Transfer> transfers);

// The blocking time of the model (docs/offload.md): every transfer starts at
// once and runs at a constant rate; each directed peer link, each GPU's host
// link, and each GPU's egress and ingress limit is a resource whose busy time
// is its chunk count times chunkBytes over its bandwidth; the application is
// blocked until the busiest resource is done. Every scheduler, the simulator
// and the benchmark use this function, and nothing else, to time a plan.
double blockingTime(const Problem& problem, const Plan& plan);

// A plan is valid when every GPU moves exactly its remainder (in chunks and
// in bytes: what stays local plus what leaves is its checkpoint), only over
// existing links, and no receiver gets more chunks than its spare slots (so
// no more bytes than its free memory).
Status verifyPlan(const Problem& problem, const Plan& plan);

}  // namespace phos::offload
