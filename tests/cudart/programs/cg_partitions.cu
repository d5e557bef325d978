// SPDX-License-Identifier: Apache-2.0
// Cooperative groups' warp partitions: binary_partition and
// labeled_partition (whose reductions and scans are redux.sync, match.sync
// and shuffles on a membermask per partition), coalesced_threads() for a
// warp-aggregated atomic, and tiled_partition<4> scans; checked against the
// CPU. Built with -arch=sm_90, where cg::reduce is redux.sync.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cooperative_groups/scan.h>

#include "common.h"

namespace cg = cooperative_groups;

constexpr int kThreads = 64;

__global__ void partitions(const int* in, int* out, int* counter) {
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int v = in[threadIdx.x];
  auto parity = cg::binary_partition(warp, v & 1);
  const int sum = cg::reduce(parity, v, cg::plus<int>());
  auto residue = cg::labeled_partition(warp, v % 3);
  const int before = cg::exclusive_scan(residue, v);
  out[threadIdx.x] = sum * 1000 + before;
  auto quad = cg::tiled_partition<4>(warp);
  out[kThreads + threadIdx.x] = cg::inclusive_scan(quad, v);
  if (v % 5 == 0) {
    auto active = cg::coalesced_threads();
    int first = 0;
    if (active.thread_rank() == 0) first = atomicAdd(counter, static_cast<int>(active.size()));
    first = active.shfl(first, 0);
    out[2 * kThreads + threadIdx.x] = first + static_cast<int>(active.thread_rank());
  }
}

int main() {
  int host[kThreads];
  for (int i = 0; i < kThreads; ++i) host[i] = (i * 37) % 50;
  int *in = nullptr, *out = nullptr, *counter = nullptr;
  CHECK(cudaMalloc(&in, sizeof(host)));
  CHECK(cudaMalloc(&out, 3 * sizeof(host)));
  CHECK(cudaMalloc(&counter, sizeof(int)));
  CHECK(cudaMemset(out, 0xff, 3 * sizeof(host)));
  CHECK(cudaMemset(counter, 0, sizeof(int)));
  CHECK(cudaMemcpy(in, host, sizeof(host), cudaMemcpyHostToDevice));
  partitions<<<1, kThreads>>>(in, out, counter);
  CHECK(cudaGetLastError());
  int got[3 * kThreads], total = 0;
  CHECK(cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&total, counter, sizeof(int), cudaMemcpyDeviceToHost));
  int aggregated = 0, tickets = 0;
  for (int t = 0; t < kThreads; ++t) {
    const int w = t / 32 * 32, v = host[t];
    int sum = 0, before = 0, scan = 0;
    for (int j = w; j < w + 32; ++j) sum += (host[j] & 1) == (v & 1) ? host[j] : 0;
    for (int j = w; j < t; ++j) before += host[j] % 3 == v % 3 ? host[j] : 0;
    for (int j = t / 4 * 4; j <= t; ++j) scan += host[j];
    if (got[t] != sum * 1000 + before || got[kThreads + t] != scan) {
      std::printf("MISMATCH at thread %d: %d %d, expected %d %d\n", t, got[t], got[kThreads + t], sum * 1000 + before,
                  scan);
      return 1;
    }
    if (v % 5 == 0) {
      ++aggregated;
      tickets |= 1 << got[2 * kThreads + t];  // every ticket handed out once
    }
  }
  if (total != aggregated || tickets != (1 << aggregated) - 1) {
    std::printf("MISMATCH: %d tickets for %d threads\n", total, aggregated);
    return 1;
  }
  std::printf("cg_partitions OK %016llx\n", checksum(got, 2 * sizeof(host)));
  return 0;
}
