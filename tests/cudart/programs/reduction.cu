// SPDX-License-Identifier: Apache-2.0
// A two-pass tree reduction in shared memory (deterministic order).
#include <vector>

#include "common.h"

__global__ void partialSums(const long long* in, long long* out, int n) {
  extern __shared__ long long cache[];
  int i = blockIdx.x * blockDim.x * 2 + threadIdx.x;
  long long v = 0;
  if (i < n) v += in[i];
  if (i + blockDim.x < n) v += in[i + blockDim.x];
  cache[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) cache[threadIdx.x] += cache[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = cache[0];
}

int main() {
  const int n = 1 << 18, threads = 256;
  std::vector<long long> host(n);
  long long ref = 0;
  for (int i = 0; i < n; ++i) ref += host[i] = (i * 2654435761ll) % 100003;
  long long *in, *partial;
  int blocks = (n + threads * 2 - 1) / (threads * 2);
  CHECK(cudaMalloc(&in, n * sizeof(long long)));
  CHECK(cudaMalloc(&partial, blocks * sizeof(long long)));
  CHECK(cudaMemcpy(in, host.data(), n * sizeof(long long), cudaMemcpyHostToDevice));
  partialSums<<<blocks, threads, threads * sizeof(long long)>>>(in, partial, n);
  partialSums<<<1, threads, threads * sizeof(long long)>>>(partial, partial, blocks);
  CHECK(cudaGetLastError());
  long long sum = 0;
  CHECK(cudaMemcpy(&sum, partial, sizeof(sum), cudaMemcpyDeviceToHost));
  if (sum != ref) return std::printf("MISMATCH %lld != %lld\n", sum, ref), 1;
  std::printf("reduction OK %lld\n", sum);
  return 0;
}
