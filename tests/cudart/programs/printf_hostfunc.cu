// SPDX-License-Identifier: Apache-2.0
// Device printf, and host functions in stream order (cudaLaunchHostFunc).
#include <cstdio>

#include "common.h"

__global__ void hello(int step) {
  if (threadIdx.x < 2) printf("hello from thread %d at step %d\n", threadIdx.x, step);
}
__global__ void bump(int* v) { *v += 1; }

// Runs in stream order, after the copy: it sees the value the copy brought.
// (It prints nothing: where device printf output lands relative to it depends
// on when a platform flushes that output.)
int gSeen = 0;
void CUDART_CB onHost(void* data) { gSeen = *static_cast<int*>(data); }

int main() {
  int* value = nullptr;
  CHECK(cudaMallocHost(&value, sizeof(int)));
  *value = 0;
  int* dev = nullptr;
  CHECK(cudaMalloc(&dev, sizeof(int)));
  CHECK(cudaMemset(dev, 0, sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (int step = 0; step < 3; ++step) {
    hello<<<1, 32, 0, s>>>(step);
    bump<<<1, 1, 0, s>>>(dev);
    CHECK(cudaMemcpyAsync(value, dev, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, onHost, value));
    CHECK(cudaStreamSynchronize(s));
    std::printf("host function saw %d\n", gSeen);
  }
  if (gSeen != 3) return std::printf("MISMATCH %d\n", gSeen), 1;
  std::printf("printf_hostfunc OK\n");
  return 0;
}
