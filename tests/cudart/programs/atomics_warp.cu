// SPDX-License-Identifier: Apache-2.0
// Integer atomics, warp shuffles and votes.
#include "common.h"

__global__ void histogram(const int* values, int n, unsigned* bins) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&bins[values[i] % 16], 1u);
}

__global__ void warpSums(const int* values, int* sums, unsigned* ballots) {
  int v = values[blockIdx.x * 32 + threadIdx.x];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  unsigned ballot = __ballot_sync(0xffffffffu, values[blockIdx.x * 32 + threadIdx.x] % 2 == 0);
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = v;
    ballots[blockIdx.x] = ballot;
  }
}

int main() {
  const int n = 4096;
  int host[n];
  for (int i = 0; i < n; ++i) host[i] = (i * 37) % 101;
  int *values, *sums;
  unsigned *bins, *ballots;
  CHECK(cudaMalloc(&values, sizeof(host)));
  CHECK(cudaMalloc(&bins, 16 * sizeof(unsigned)));
  CHECK(cudaMalloc(&sums, (n / 32) * sizeof(int)));
  CHECK(cudaMalloc(&ballots, (n / 32) * sizeof(unsigned)));
  CHECK(cudaMemcpy(values, host, sizeof(host), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(bins, 0, 16 * sizeof(unsigned)));
  histogram<<<n / 256, 256>>>(values, n, bins);
  warpSums<<<n / 32, 32>>>(values, sums, ballots);
  CHECK(cudaGetLastError());
  unsigned gotBins[16], gotBallots[n / 32];
  int gotSums[n / 32];
  CHECK(cudaMemcpy(gotBins, bins, sizeof(gotBins), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(gotSums, sums, sizeof(gotSums), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(gotBallots, ballots, sizeof(gotBallots), cudaMemcpyDeviceToHost));
  unsigned refBins[16] = {};
  for (int i = 0; i < n; ++i) ++refBins[host[i] % 16];
  for (int b = 0; b < 16; ++b)
    if (gotBins[b] != refBins[b]) return std::printf("MISMATCH bin %d\n", b), 1;
  for (int w = 0; w < n / 32; ++w) {
    int sum = 0;
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l) {
      sum += host[w * 32 + l];
      if (host[w * 32 + l] % 2 == 0) ballot |= 1u << l;
    }
    if (gotSums[w] != sum || gotBallots[w] != ballot) return std::printf("MISMATCH warp %d\n", w), 1;
  }
  std::printf("atomics_warp OK %016llx\n", checksum(gotSums, sizeof(gotSums)) ^ checksum(gotBins, sizeof(gotBins)));
  return 0;
}
