// SPDX-License-Identifier: Apache-2.0
// __constant__ and __device__ variables: set from the host, and a device
// pointer stored by one kernel and used by another.
#include "common.h"

__constant__ int kCoefficients[4];
__device__ int gCounter;
__device__ int* gBuffer;

__global__ void publish(int* buffer) { gBuffer = buffer; }
__global__ void fill(int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) gBuffer[i] = kCoefficients[i % 4] * i;
  if (i == 0) gCounter += 1;
}

int main() {
  const int n = 1024;
  const int coefficients[4] = {2, 3, 5, 7};
  CHECK(cudaMemcpyToSymbol(kCoefficients, coefficients, sizeof(coefficients)));
  const int start = 40;
  CHECK(cudaMemcpyToSymbol(gCounter, &start, sizeof(start)));
  int* buffer = nullptr;
  CHECK(cudaMalloc(&buffer, n * sizeof(int)));
  publish<<<1, 1>>>(buffer);
  fill<<<n / 128, 128>>>(n);
  fill<<<n / 128, 128>>>(n);
  CHECK(cudaGetLastError());
  int counter = 0;
  CHECK(cudaMemcpyFromSymbol(&counter, gCounter, sizeof(counter)));
  int* address = nullptr;
  CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&address), gCounter));
  size_t size = 0;
  CHECK(cudaGetSymbolSize(&size, kCoefficients));
  int out[n];
  CHECK(cudaMemcpy(out, buffer, sizeof(out), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    if (out[i] != coefficients[i % 4] * i) {
      std::printf("MISMATCH at %d\n", i);
      return 1;
    }
  }
  if (counter != 42 || size != sizeof(coefficients) || address == nullptr) {
    std::printf("MISMATCH counter %d size %zu\n", counter, size);
    return 1;
  }
  std::printf("symbols OK %d %016llx\n", counter, checksum(out, sizeof(out)));
  return 0;
}
