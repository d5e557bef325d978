// SPDX-License-Identifier: Apache-2.0
// A __managed__ variable: the host sets it before any launch and reads it
// after, the kernels add to it and scale an initialised array (block 0 of
// each launch doubles it: two blocks doubling the same words would race).
// Prints both and OK.
#include "common.h"

__managed__ int counter;
__managed__ float weights[4] = {1.0f, 2.0f, 3.0f, 4.0f};

__global__ void bump(int steps) {
  atomicAdd(&counter, steps);
  if (blockIdx.x == 0 && threadIdx.x < 4) weights[threadIdx.x] *= 2.0f;
}

int main() {
  counter = 5;
  bump<<<1, 32>>>(1);
  CHECK(cudaDeviceSynchronize());
  bump<<<2, 32>>>(2);
  CHECK(cudaDeviceSynchronize());
  const bool ok = counter == 5 + 32 + 2 * 64 && weights[0] == 4.0f && weights[3] == 16.0f;
  std::printf("counter %d weights %g %g %g %g %s\n", counter, weights[0], weights[1], weights[2], weights[3],
              ok ? "OK" : "WRONG");
  return ok ? 0 : 1;
}
