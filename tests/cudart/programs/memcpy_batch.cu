// SPDX-License-Identifier: Apache-2.0
// cudaMemcpyBatchAsync (CUDA 12.8): two buffers up in one batch, a kernel
// on each, both back in another batch; compared with the CPU.
#include <vector>

#include "common.h"

__global__ void bump(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}

int main() {
  const int n = 1 << 16;
  std::vector<int> a(n), b(n), outA(n), outB(n);
  for (int i = 0; i < n; ++i) {
    a[i] = i;
    b[i] = 3 * i;
  }
  int *da, *db;
  CHECK(cudaMalloc(&da, n * sizeof(int)));
  CHECK(cudaMalloc(&db, n * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* dsts[2] = {da, db};
  const void* srcs[2] = {a.data(), b.data()};
  size_t sizes[2] = {n * sizeof(int), n * sizeof(int)};
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t first = 0;
  CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &first, 1, s));
  bump<<<n / 256, 256, 0, s>>>(da, n);
  bump<<<n / 256, 256, 0, s>>>(db, n);
  void* back[2] = {outA.data(), outB.data()};
  const void* from[2] = {da, db};
  CHECK(cudaMemcpyBatchAsync(back, from, sizes, 2, &attr, &first, 1, s));
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; ++i) {
    if (outA[i] != i + 1 || outB[i] != 3 * i + 1) {
      std::printf("wrong at %d: %d %d\n", i, outA[i], outB[i]);
      return 1;
    }
  }
  std::printf("batched copies: checksum %016llx\nOK\n", checksum(outB.data(), n * sizeof(int)));
  return 0;
}
