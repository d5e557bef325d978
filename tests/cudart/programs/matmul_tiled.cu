// SPDX-License-Identifier: Apache-2.0
// Tiled matrix multiply through shared memory, integers so that the result is exact.
#include <vector>

#include "common.h"

constexpr int kTile = 16;

__global__ void matmul(const int* a, const int* b, int* c, int n) {
  __shared__ int ta[kTile][kTile];
  __shared__ int tb[kTile][kTile];
  int row = blockIdx.y * kTile + threadIdx.y, col = blockIdx.x * kTile + threadIdx.x;
  int sum = 0;
  for (int t = 0; t < n / kTile; ++t) {
    ta[threadIdx.y][threadIdx.x] = a[row * n + t * kTile + threadIdx.x];
    tb[threadIdx.y][threadIdx.x] = b[(t * kTile + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < kTile; ++k) sum += ta[threadIdx.y][k] * tb[k][threadIdx.x];
    __syncthreads();
  }
  c[row * n + col] = sum;
}

int main() {
  const int n = 64;
  std::vector<int> a(n * n), b(n * n), c(n * n), ref(n * n, 0);
  for (int i = 0; i < n * n; ++i) {
    a[i] = (i * 7) % 13 - 6;
    b[i] = (i * 5) % 11 - 5;
  }
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j) ref[i * n + j] += a[i * n + k] * b[k * n + j];
  int *da, *db, *dc;
  const size_t bytes = n * n * sizeof(int);
  CHECK(cudaMalloc(&da, bytes));
  CHECK(cudaMalloc(&db, bytes));
  CHECK(cudaMalloc(&dc, bytes));
  CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
  matmul<<<dim3(n / kTile, n / kTile), dim3(kTile, kTile)>>>(da, db, dc, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
  if (c != ref) {
    std::printf("MISMATCH\n");
    return 1;
  }
  std::printf("matmul_tiled OK %016llx\n", checksum(c.data(), bytes));
  return 0;
}
