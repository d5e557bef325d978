// SPDX-License-Identifier: Apache-2.0
// Replays a checkpoint-size trace on a topology and records each scheduler's blocking time.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "phos/offload/schedulers.h"
#include "phos/offload/topology.h"
#include "phos/offload/trace.h"

namespace phos::offload {

// The paper's GPU checkpoint cache sizes (Section V.C): 80, 128 and 160 MB,
// about the 50th, 75th and 98th percentile of the RTM trace's mean size.
inline constexpr std::array<int64_t, 3> kPaperFreeBytes = {80ll << 20, 128ll << 20,
                                                           160ll << 20};

struct SimulationRecord {
  int snapshot = 0;
  int64_t freeBytes = 0;
  Scheduler scheduler = Scheduler::kBaseline;
  double blockingSeconds = 0;
  double solveSeconds = 0;
};

// Every snapshot x free-space setting x scheduler, each plan verified.
Result<std::vector<SimulationRecord>> simulate(const Trace& trace, const Topology& topology,
                                               std::span<const int64_t> freeBytes,
                                               int64_t chunkBytes);

// Per free-space setting and scheduler: mean blocking time, and the blocking
// time relative to exact (mean, 95th percentile, max of t/t_exact over the
// snapshots where exact blocks at all; snapshots where nobody blocks count
// as 1), and the mean, median and max solve time (the median resists
// a loaded machine's scheduling hiccups).
nlohmann::json summarize(const std::vector<SimulationRecord>& records);

}  // namespace phos::offload
