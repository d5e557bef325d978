// SPDX-License-Identifier: Apache-2.0
// A device-side assert: a kernel whose assertion holds runs; one whose
// assertion fails prints where and why, and the context is then unusable
// (cudaErrorAssert is sticky), as on a GPU.
#include <cassert>

#include "common.h"

__global__ void bump(int* v, int forbidden) {
  int i = threadIdx.x;
  assert(v[i] != forbidden);
  v[i] += 1;
}

int main() {
  int* d = nullptr;
  CHECK(cudaMalloc(&d, 32 * sizeof(int)));
  CHECK(cudaMemset(d, 0, 32 * sizeof(int)));
  bump<<<1, 32>>>(d, 5);
  CHECK(cudaDeviceSynchronize());
  int first = -1;
  CHECK(cudaMemcpy(&first, d, sizeof(first), cudaMemcpyDeviceToHost));
  std::printf("assertion held: v[0] = %d\n", first);
  std::fflush(stdout);
  bump<<<1, 32>>>(d, 1);
  const cudaError_t failed = cudaDeviceSynchronize();
  const cudaError_t after = cudaMemset(d, 0, sizeof(int));
  std::printf("assertion failed: %s, then %s\n", cudaGetErrorName(failed), cudaGetErrorName(after));
  if (failed != cudaErrorAssert || after != cudaErrorAssert) return 1;
  std::printf("device_assert OK\n");
  return 0;
}
