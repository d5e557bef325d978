// SPDX-License-Identifier: Apache-2.0
// Plan assembly, the blocking-time model, and plan validation.
#include "phos/offload/plan.h"

#include <algorithm>
#include <limits>
#include <map>

namespace phos::offload {

Plan finalizePlan(const Problem& problem, std::vector<Transfer> transfers) {
  std::map<std::pair<int, int>, int64_t> merged;
  for (const Transfer& t : transfers) {
    if (t.chunks > 0) merged[{t.from, t.to}] += t.chunks;
  }
  Plan plan;
  for (const auto& [key, chunks] : merged) {
    plan.transfers.push_back({key.first, key.second, chunks, chunks * problem.chunkBytes});
  }
  // std::map orders kHost (-1) first among a sender's transfers, so the first
  // transfer of each sender is its host transfer when it has one.
  int last = -1;
  for (Transfer& t : plan.transfers) {
    if (t.from != last) {
      t.bytes -= problem.tailShortfall[t.from];
      last = t.from;
    }
  }
  return plan;
}

double blockingTime(const Problem& problem, const Plan& plan) {
  const int n = problem.gpuCount();
  const double c = static_cast<double>(problem.chunkBytes);
  std::vector<int64_t> egress(n, 0), ingress(n, 0);
  double t = 0;
  for (const Transfer& x : plan.transfers) {
    if (x.chunks <= 0) continue;
    const double bytes = static_cast<double>(x.chunks) * c;
    if (x.to == kHost) {
      t = std::max(t, bytes / problem.hostBandwidth);
      continue;
    }
    const double b = problem.bandwidth[x.from][x.to];
    if (b <= 0) return std::numeric_limits<double>::infinity();
    t = std::max(t, bytes / b);
    egress[x.from] += x.chunks;
    ingress[x.to] += x.chunks;
  }
  for (int i = 0; i < n; ++i) {
    if (problem.egressLimit[i] > 0) {
      t = std::max(t, static_cast<double>(egress[i]) * c / problem.egressLimit[i]);
    }
    if (problem.ingressLimit[i] > 0) {
      t = std::max(t, static_cast<double>(ingress[i]) * c / problem.ingressLimit[i]);
    }
  }
  return t;
}

Status verifyPlan(const Problem& problem, const Plan& plan) {
  const int n = problem.gpuCount();
  const int64_t c = problem.chunkBytes;
  std::vector<int64_t> sentChunks(n, 0), sentBytes(n, 0), gotChunks(n, 0), gotBytes(n, 0);
  for (const Transfer& t : plan.transfers) {
    if (t.from < 0 || t.from >= n || t.to < kHost || t.to >= n || t.to == t.from) {
      return makeError(Code::kInternal, "transfer {} -> {} names no valid GPU pair", t.from, t.to);
    }
    if (t.chunks <= 0) {
      return makeError(Code::kInternal, "transfer {} -> {} has {} chunks", t.from, t.to, t.chunks);
    }
    // Chunk granularity: whole chunks, except the one shorter last chunk.
    const int64_t shortBy = t.chunks * c - t.bytes;
    if (shortBy != 0 && shortBy != problem.tailShortfall[t.from]) {
      return makeError(Code::kInternal, "transfer {} -> {} of {} bytes is not {} chunks of {}",
                       t.from, t.to, t.bytes, t.chunks, c);
    }
    if (t.to != kHost) {
      if (problem.bandwidth[t.from][t.to] <= 0) {
        return makeError(Code::kInternal, "transfer {} -> {} uses a link that does not exist",
                         t.from, t.to);
      }
      gotChunks[t.to] += t.chunks;
      gotBytes[t.to] += t.bytes;
    }
    sentChunks[t.from] += t.chunks;
    sentBytes[t.from] += t.bytes;
  }
  for (int i = 0; i < n; ++i) {
    if (sentChunks[i] != problem.remainder[i]) {
      return makeError(Code::kInternal, "GPU {} moves {} chunks, its remainder is {}", i,
                       sentChunks[i], problem.remainder[i]);
    }
    const int64_t local = problem.checkpointBytes[i] - sentBytes[i];
    if (local < 0 || local > problem.freeBytes[i]) {
      return makeError(Code::kInternal,
                       "GPU {} keeps {} of its {} checkpoint bytes but has {} bytes free", i,
                       local, problem.checkpointBytes[i], problem.freeBytes[i]);
    }
    if (gotChunks[i] > problem.spare[i]) {
      return makeError(Code::kInternal, "GPU {} receives {} chunks but has {} spare slots", i,
                       gotChunks[i], problem.spare[i]);
    }
    if (gotChunks[i] > 0 && gotBytes[i] + problem.checkpointBytes[i] > problem.freeBytes[i]) {
      return makeError(Code::kInternal,
                       "GPU {} receives {} bytes on top of its {} byte checkpoint, {} bytes free",
                       i, gotBytes[i], problem.checkpointBytes[i], problem.freeBytes[i]);
    }
  }
  return Status::ok();
}

}  // namespace phos::offload
