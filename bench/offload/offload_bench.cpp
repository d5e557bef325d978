// SPDX-License-Identifier: Apache-2.0
// phos-offload-bench: each offload scheduler's blocking time relative to the exact optimum, and its run time, per topology and free-space setting.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/offload/simulator.h"

namespace {

using namespace phos;
using namespace phos::offload;

constexpr const char* kUsage =
    "usage: phos-offload-bench [--out FILE] [--quick]\n"
    "Replays the RTM-like and the synthetic trace on DGX-1 (free space 80, 128, 160 MiB,\n"
    "1 MiB and 4 MiB chunks) and one synthetic snapshot set on NVSwitch and all-to-all\n"
    "fabrics of 8 to 128 GPUs (160 MiB free), prints each scheduler's blocking time\n"
    "relative to the exact optimum and its run time, and writes them as JSON to FILE.\n"
    "--quick uses fewer snapshots (a smoke test, not figures to quote).\n";

struct Scenario {
  std::string trace;  // "rtm-like" or "synthetic"
  std::string topology;
  int64_t chunkBytes;
  std::vector<int64_t> freeBytes;
  int snapshots;
};

void printSummary(const Scenario& sc, const nlohmann::json& summary) {
  for (const nlohmann::json& setting : summary) {
    const int64_t freeMiB = setting["free_bytes"].get<int64_t>() >> 20;
    std::printf("%-9s %-13s chunk %lld MiB, free %3lld MiB:\n", sc.trace.c_str(),
                sc.topology.c_str(), static_cast<long long>(sc.chunkBytes >> 20),
                static_cast<long long>(freeMiB));
    for (const char* name : {"baseline", "greedy", "flow", "exact"}) {
      const nlohmann::json& s = setting["schedulers"][name];
      std::printf(
          "  %-8s mean blocking %8.3f ms  x optimum: mean %6.3f p95 %6.3f max %6.3f  "
          "run time: median %8.1f us mean %8.1f us\n",
          name, s["mean_blocking_seconds"].get<double>() * 1e3,
          s["mean_ratio_to_exact"].get<double>(), s["p95_ratio_to_exact"].get<double>(),
          s["max_ratio_to_exact"].get<double>(), s["median_solve_seconds"].get<double>() * 1e6,
          s["mean_solve_seconds"].get<double>() * 1e6);
    }
  }
}

int fail(const std::string& message) {
  std::fprintf(stderr, "phos-offload-bench: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      out = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--help") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fputs(kUsage, stderr);
      return 2;
    }
  }

  const std::vector<int64_t> paperFree(kPaperFreeBytes.begin(), kPaperFreeBytes.end());
  const int dgxSnapshots = quick ? 40 : 776;  // the RTM trace's length
  const int fabricSnapshots = quick ? 2 : 20;
  std::vector<Scenario> scenarios;
  for (const char* trace : {"rtm-like", "synthetic"}) {
    for (int64_t chunk : {int64_t{1} << 20, int64_t{4} << 20}) {
      scenarios.push_back({trace, "dgx1", chunk, paperFree, dgxSnapshots});
    }
  }
  for (const char* fabric : {"nvswitch", "alltoall"}) {
    for (int gpus : {8, 16, 32, 64, 128}) {
      scenarios.push_back({"synthetic", fmt::format("{}:{}", fabric, gpus), int64_t{1} << 20,
                           {int64_t{160} << 20}, fabricSnapshots});
    }
  }

  nlohmann::json results = nlohmann::json::array();
  for (const Scenario& sc : scenarios) {
    auto topology = topologyByName(sc.topology);
    if (!topology) return fail(topology.status().message());
    TraceShape shape;
    shape.kind = sc.trace == "rtm-like" ? TraceKind::kRamp : TraceKind::kStationary;
    shape.snapshots = sc.snapshots;
    shape.gpus = topology->gpuCount;
    shape.seed = 1;
    auto records = simulate(generateTrace(shape), *topology, sc.freeBytes, sc.chunkBytes);
    if (!records) return fail(records.status().toString());
    const nlohmann::json summary = summarize(*records);
    printSummary(sc, summary);
    results.push_back({{"trace", sc.trace},
                       {"topology", sc.topology},
                       {"gpus", topology->gpuCount},
                       {"chunk_bytes", sc.chunkBytes},
                       {"snapshots", sc.snapshots},
                       {"settings", summary}});
    std::fflush(stdout);
  }

  if (!out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(out).parent_path(), ec);
    std::ofstream file(out);
    file << nlohmann::json{{"benchmark", "offload"}, {"quick", quick}, {"results", results}}.dump(2)
         << "\n";
    file.close();
    if (!file) return fail("cannot write " + out);
    std::printf("wrote %s\n", out.c_str());
  }
  return 0;
}
