// SPDX-License-Identifier: Apache-2.0
// GPU interconnect topologies for the offload simulator: DGX-1 hybrid cube-mesh and NVSwitch all-to-all.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"
#include "phos/offload/problem.h"

namespace phos::offload {

// The paper's figures: one NVLink 2.0 brick moves 24 GB/s per direction,
// a GPU's PCIe 3.0 x16 link to the host 12 GB/s.
inline constexpr double kNvlinkBandwidth = 24e9;
inline constexpr double kPcieBandwidth = 12e9;

struct Topology {
  std::string name;
  int gpuCount = 0;
  double hostBandwidth = kPcieBandwidth;
  std::vector<Link> links;
  std::optional<double> egressLimit;  // per GPU, NVSwitch only
  std::optional<double> ingressLimit;
};

// DGX-1 (V100): eight GPUs in a hybrid cube-mesh, six NVLink bricks each,
// single (24 GB/s) or dual (48 GB/s) links; the table is in topology.cpp.
Topology dgx1();

inline constexpr int kMaxTopologyGpus = 1024;

// DGX-2 style: every GPU has six NVLinks into the NVSwitch fabric, so any
// pair can talk at up to 6 bricks (144 GB/s), and a GPU's total peer traffic
// in each direction is capped at the same 6 bricks (egress/ingress limits).
Result<Topology> nvswitch(int gpuCount);

// The paper's scalability setting as its model reads: every pair linked at
// 6 bricks, each link independent, no per-GPU cap (an idealized switch).
Result<Topology> allToAll(int gpuCount);

// "dgx1", "nvswitch:N" or "alltoall:N" (2 <= N <= 1024).
Result<Topology> topologyByName(std::string_view name);

Instance makeInstance(const Topology& topology, std::span<const int64_t> checkpointBytes,
                      int64_t freeBytes, int64_t chunkBytes);

}  // namespace phos::offload
