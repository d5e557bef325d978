// SPDX-License-Identifier: Apache-2.0
// Validation of offload instances and their conversion to chunk units.
#include "phos/offload/problem.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace phos::offload {
namespace {

// Bandwidths are bytes per second; below 1 B/s a chunk's time overflows.
bool validBandwidth(double v) { return std::isfinite(v) && v >= 1; }

}  // namespace

Status validate(const Instance& instance) {
  if (instance.chunkBytes <= 0) {
    return makeError(Code::kInvalidArgument, "chunk_bytes must be positive, got {}",
                     instance.chunkBytes);
  }
  if (!validBandwidth(instance.hostBandwidth)) {
    return makeError(Code::kInvalidArgument, "host_bandwidth must be at least 1 byte/s, got {}",
                     instance.hostBandwidth);
  }
  if (instance.gpus.empty()) return makeError(Code::kInvalidArgument, "gpus is empty");
  if (instance.gpus.size() > static_cast<size_t>(kMaxGpus)) {
    return makeError(Code::kInvalidArgument, "{} GPUs given, at most {} are supported",
                     instance.gpus.size(), kMaxGpus);
  }
  for (size_t i = 0; i < instance.gpus.size(); ++i) {
    const GpuState& g = instance.gpus[i];
    if (g.checkpointBytes < 0) {
      return makeError(Code::kInvalidArgument, "gpus[{}].checkpoint_bytes is negative ({})", i,
                       g.checkpointBytes);
    }
    if (g.freeBytes < 0) {
      return makeError(Code::kInvalidArgument, "gpus[{}].free_bytes is negative ({})", i,
                       g.freeBytes);
    }
    if (g.egressLimit && !validBandwidth(*g.egressLimit)) {
      return makeError(Code::kInvalidArgument, "gpus[{}].egress_limit must be at least 1 byte/s, got {}",
                       i, *g.egressLimit);
    }
    if (g.ingressLimit && !validBandwidth(*g.ingressLimit)) {
      return makeError(Code::kInvalidArgument, "gpus[{}].ingress_limit must be at least 1 byte/s, got {}",
                       i, *g.ingressLimit);
    }
  }
  const int n = static_cast<int>(instance.gpus.size());
  std::vector<std::vector<bool>> seen(n, std::vector<bool>(n, false));
  for (size_t k = 0; k < instance.links.size(); ++k) {
    const Link& l = instance.links[k];
    for (int end : {l.a, l.b}) {
      if (end < 0 || end >= n) {
        return makeError(Code::kInvalidArgument,
                         "links[{}] names GPU {}, but there are only {} GPUs (0..{})", k, end, n,
                         n - 1);
      }
    }
    if (l.a == l.b) {
      return makeError(Code::kInvalidArgument, "links[{}] connects GPU {} to itself", k, l.a);
    }
    if (!validBandwidth(l.bandwidth)) {
      return makeError(Code::kInvalidArgument, "links[{}].bandwidth must be at least 1 byte/s, got {}", k,
                       l.bandwidth);
    }
    if (seen[l.a][l.b]) {
      return makeError(Code::kInvalidArgument,
                       "links[{}] repeats the link between GPUs {} and {}", k, l.a, l.b);
    }
    seen[l.a][l.b] = seen[l.b][l.a] = true;
  }
  return Status::ok();
}

int64_t Problem::totalRemainder() const {
  return std::accumulate(remainder.begin(), remainder.end(), int64_t{0});
}

Result<Problem> makeProblem(const Instance& instance) {
  RETURN_IF_ERROR(validate(instance));
  const int n = static_cast<int>(instance.gpus.size());
  const int64_t c = instance.chunkBytes;
  Problem p;
  p.chunkBytes = c;
  p.hostBandwidth = instance.hostBandwidth;
  p.bandwidth.assign(n, std::vector<double>(n, 0.0));
  int64_t moved = 0;
  for (size_t i = 0; i < instance.gpus.size(); ++i) {
    const GpuState& g = instance.gpus[i];
    const int64_t chunks = g.checkpointBytes / c + (g.checkpointBytes % c != 0 ? 1 : 0);
    const int64_t slots = g.freeBytes / c;
    p.checkpointBytes.push_back(g.checkpointBytes);
    p.freeBytes.push_back(g.freeBytes);
    p.remainder.push_back(std::max<int64_t>(0, chunks - slots));
    p.spare.push_back(std::max<int64_t>(0, slots - chunks));
    // With at least one slot the GPU keeps its shorter last chunk; with none,
    // every chunk travels and the last one is short by this much.
    p.tailShortfall.push_back(slots == 0 ? chunks * c - g.checkpointBytes : 0);
    p.egressLimit.push_back(g.egressLimit.value_or(0.0));
    p.ingressLimit.push_back(g.ingressLimit.value_or(0.0));
    moved += p.remainder.back();
    if (moved > kMaxMovedChunks) {
      return makeError(Code::kInvalidArgument,
                       "the GPUs up to gpus[{}] already have {} chunks of {} bytes to move off, "
                       "more than the {} the schedulers accept; use a larger chunk_bytes",
                       i, moved, c, kMaxMovedChunks);
    }
  }
  for (const Link& l : instance.links) {
    p.bandwidth[l.a][l.b] = l.bandwidth;
    p.bandwidth[l.b][l.a] = l.bandwidth;
  }
  return p;
}

}  // namespace phos::offload
