// SPDX-License-Identifier: Apache-2.0
// The trace-replay simulator and its summary statistics.
#include "phos/offload/simulator.h"

#include <algorithm>
#include <map>
#include <string>

namespace phos::offload {

Result<std::vector<SimulationRecord>> simulate(const Trace& trace, const Topology& topology,
                                               std::span<const int64_t> freeBytes,
                                               int64_t chunkBytes) {
  ASSIGN_OR_RETURN(std::vector<Snapshot> snapshots, snapshotsOf(trace, topology.gpuCount));
  std::vector<SimulationRecord> records;
  for (const Snapshot& snap : snapshots) {
    for (int64_t free : freeBytes) {
      ASSIGN_OR_RETURN(Problem problem, makeProblem(makeInstance(topology, snap.checkpointBytes,
                                                                 free, chunkBytes)));
      auto outcomes = runAllSchedulers(problem);
      if (!outcomes) {
        return std::move(outcomes).status().withContext(
            fmt::format("snapshot {}, {} bytes free", snap.id, free));
      }
      for (const Outcome& o : *outcomes) {
        records.push_back({snap.id, free, o.scheduler, o.blockingSeconds, o.solveSeconds});
      }
    }
  }
  return records;
}

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[k];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

nlohmann::json summarize(const std::vector<SimulationRecord>& records) {
  // exact's time per (free, snapshot), the reference for the ratios.
  std::map<std::pair<int64_t, int>, double> exact;
  for (const SimulationRecord& r : records) {
    if (r.scheduler == Scheduler::kExact) exact[{r.freeBytes, r.snapshot}] = r.blockingSeconds;
  }
  struct Series {
    std::vector<double> blocking, ratio, solve;
  };
  std::map<int64_t, std::map<Scheduler, Series>> series;
  for (const SimulationRecord& r : records) {
    Series& s = series[r.freeBytes][r.scheduler];
    s.blocking.push_back(r.blockingSeconds);
    s.solve.push_back(r.solveSeconds);
    const double ref = exact[{r.freeBytes, r.snapshot}];
    s.ratio.push_back(ref > 0 ? r.blockingSeconds / ref : 1.0);
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [free, bySched] : series) {
    nlohmann::json entry = {{"free_bytes", free}, {"schedulers", nlohmann::json::object()}};
    for (const auto& [sched, s] : bySched) {
      entry["schedulers"][std::string(schedulerName(sched))] = {
          {"snapshots", s.blocking.size()},
          {"mean_blocking_seconds", mean(s.blocking)},
          {"mean_ratio_to_exact", mean(s.ratio)},
          {"p95_ratio_to_exact", percentile(s.ratio, 0.95)},
          {"max_ratio_to_exact", percentile(s.ratio, 1.0)},
          {"mean_solve_seconds", mean(s.solve)},
          {"median_solve_seconds", percentile(s.solve, 0.5)},
          {"max_solve_seconds", percentile(s.solve, 1.0)},
      };
    }
    out.push_back(entry);
  }
  return out;
}

}  // namespace phos::offload
