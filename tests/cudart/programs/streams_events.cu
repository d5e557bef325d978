// SPDX-License-Identifier: Apache-2.0
// Two streams, async copies from and to pinned memory, events between them; the
// work bracketed by cudaProfilerStart/Stop as NVIDIA's samples do.
#include <cuda_profiler_api.h>

#include <cstring>

#include "common.h"

__global__ void scale(int* data, int n, int factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = data[i] * factor + i;
}

int main() {
  const int n = 1 << 16;
  int* host = nullptr;
  CHECK(cudaMallocHost(&host, 2 * n * sizeof(int)));
  for (int i = 0; i < 2 * n; ++i) host[i] = i % 1000;
  int* dev = nullptr;
  CHECK(cudaMalloc(&dev, 2 * n * sizeof(int)));
  cudaStream_t s[2];
  cudaEvent_t copied, start, stop;
  for (auto& x : s) CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaProfilerStart());
  CHECK(cudaEventRecord(start, s[0]));
  CHECK(cudaMemcpyAsync(dev, host, 2 * n * sizeof(int), cudaMemcpyHostToDevice, s[0]));
  CHECK(cudaEventRecord(copied, s[0]));
  // The second stream waits for the copy, then both scale their half.
  CHECK(cudaStreamWaitEvent(s[1], copied, 0));
  scale<<<n / 256, 256, 0, s[0]>>>(dev, n, 3);
  scale<<<n / 256, 256, 0, s[1]>>>(dev + n, n, 5);
  CHECK(cudaMemcpyAsync(host, dev, n * sizeof(int), cudaMemcpyDeviceToHost, s[0]));
  CHECK(cudaMemcpyAsync(host + n, dev + n, n * sizeof(int), cudaMemcpyDeviceToHost, s[1]));
  CHECK(cudaEventRecord(stop, s[0]));
  CHECK(cudaStreamSynchronize(s[1]));
  CHECK(cudaEventSynchronize(stop));
  CHECK(cudaProfilerStop());
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  if (ms < 0) return 1;
  CHECK(cudaStreamQuery(s[0]));
  for (int i = 0; i < 2 * n; ++i) {
    int j = i % n, f = i < n ? 3 : 5;
    if (host[i] != (i % 1000) * f + j) {
      std::printf("MISMATCH at %d: %d\n", i, host[i]);
      return 1;
    }
  }
  std::printf("streams_events OK %016llx\n", checksum(host, 2 * n * sizeof(int)));
  for (auto& x : s) CHECK(cudaStreamDestroy(x));
  CHECK(cudaEventDestroy(copied));
  CHECK(cudaFreeHost(host));
  CHECK(cudaFree(dev));
  return 0;
}
