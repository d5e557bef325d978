// SPDX-License-Identifier: Apache-2.0
// The DGX-1 and NVSwitch topologies, and instances built on them.
#include "phos/offload/topology.h"

#include <charconv>

namespace phos::offload {

Topology dgx1() {
  // NVLink bricks between GPU pairs of a DGX-1 with V100 (hybrid cube-mesh,
  // NVIDIA's DGX-1 V100 white paper, Figure 5, and nvidia-smi topo -m: NV1 /
  // NV2). Each GPU has 6 bricks; pairs not listed go through PCIe and the
  // CPUs, which the paper treats as "not linked" (B_ij = 0).
  struct Pair {
    int a, b, bricks;
  };
  static constexpr Pair kPairs[] = {
      {0, 1, 1}, {0, 2, 1}, {0, 3, 2}, {0, 4, 2},  //
      {1, 2, 2}, {1, 3, 1}, {1, 5, 2},             //
      {2, 3, 2}, {2, 6, 1},                        //
      {3, 7, 1},                                   //
      {4, 5, 1}, {4, 6, 1}, {4, 7, 2},             //
      {5, 6, 2}, {5, 7, 1},                        //
      {6, 7, 2},
  };
  Topology t;
  t.name = "dgx1";
  t.gpuCount = 8;
  for (const Pair& p : kPairs) t.links.push_back({p.a, p.b, p.bricks * kNvlinkBandwidth});
  return t;
}

namespace {

Result<Topology> allPairs(std::string_view kind, int gpuCount, bool perGpuLimits) {
  if (gpuCount < 2 || gpuCount > kMaxTopologyGpus) {
    return makeError(Code::kInvalidArgument, "an {} system has 2 to {} GPUs, not {}", kind,
                     kMaxTopologyGpus, gpuCount);
  }
  constexpr double kPerGpu = 6 * kNvlinkBandwidth;
  Topology t;
  t.name = fmt::format("{}:{}", kind, gpuCount);
  t.gpuCount = gpuCount;
  if (perGpuLimits) {
    t.egressLimit = kPerGpu;
    t.ingressLimit = kPerGpu;
  }
  for (int a = 0; a < gpuCount; ++a) {
    for (int b = a + 1; b < gpuCount; ++b) t.links.push_back({a, b, kPerGpu});
  }
  return t;
}

}  // namespace

Result<Topology> nvswitch(int gpuCount) { return allPairs("nvswitch", gpuCount, true); }

Result<Topology> allToAll(int gpuCount) { return allPairs("alltoall", gpuCount, false); }

Result<Topology> topologyByName(std::string_view name) {
  if (name == "dgx1") return dgx1();
  for (std::string_view kind : {"nvswitch", "alltoall"}) {
    if (name.size() <= kind.size() + 1 || name.substr(0, kind.size()) != kind ||
        name[kind.size()] != ':') {
      continue;
    }
    std::string_view digits = name.substr(kind.size() + 1);
    int n = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec != std::errc() || end != digits.data() + digits.size()) break;
    return kind == "nvswitch" ? nvswitch(n) : allToAll(n);
  }
  return makeError(Code::kInvalidArgument,
                   "unknown topology '{}' (dgx1, nvswitch:N or alltoall:N)", name);
}

Instance makeInstance(const Topology& topology, std::span<const int64_t> checkpointBytes,
                      int64_t freeBytes, int64_t chunkBytes) {
  Instance in;
  in.chunkBytes = chunkBytes;
  in.hostBandwidth = topology.hostBandwidth;
  in.links = topology.links;
  for (int64_t bytes : checkpointBytes) {
    GpuState g;
    g.checkpointBytes = bytes;
    g.freeBytes = freeBytes;
    g.egressLimit = topology.egressLimit;
    g.ingressLimit = topology.ingressLimit;
    in.gpus.push_back(g);
  }
  return in;
}

}  // namespace phos::offload
