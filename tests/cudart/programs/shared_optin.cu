// SPDX-License-Identifier: Apache-2.0
// A kernel that needs more dynamic shared memory than the 48 KiB every
// kernel may use: the program opts in once at its start
// (cudaFuncSetAttribute), as kernels with large tiles do, and launches it
// every step. A restored program must still be opted in. Prints per step a
// checksum of the state, deterministic, so a restored run prints the same
// bytes as an uninterrupted one.
//   shared_optin [--steps N] [--sleep-ms MS]
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kTileWords = 16 * 1024;  // 64 KiB of shared memory a block
constexpr int kBlocks = 4;
constexpr int kWords = kTileWords * kBlocks;

// Each block loads its tile into shared memory and writes it back mixed with
// the tile read in reverse: every word depends on another thread's.
__global__ void mix(unsigned* state, unsigned step) {
  extern __shared__ unsigned tile[];
  unsigned* mine = state + blockIdx.x * kTileWords;
  for (int i = threadIdx.x; i < kTileWords; i += blockDim.x) tile[i] = mine[i];
  __syncthreads();
  for (int i = threadIdx.x; i < kTileWords; i += blockDim.x) {
    mine[i] = tile[i] * 2654435761u + tile[kTileWords - 1 - i] + step;
  }
}

int main(int argc, char** argv) {
  int steps = 12, sleepMs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::atoi(argv[i + 1]);
  }
  const int bytes = kTileWords * static_cast<int>(sizeof(unsigned));
  CHECK(cudaFuncSetAttribute(mix, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  unsigned* state = nullptr;
  CHECK(cudaMalloc(&state, kWords * sizeof(unsigned)));
  std::vector<unsigned> host(kWords);
  for (int i = 0; i < kWords; ++i) host[i] = static_cast<unsigned>(i) * 7919u;
  CHECK(cudaMemcpy(state, host.data(), kWords * sizeof(unsigned), cudaMemcpyHostToDevice));
  for (int s = 1; s <= steps; ++s) {
    mix<<<kBlocks, 256, bytes>>>(state, static_cast<unsigned>(s));
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host.data(), state, kWords * sizeof(unsigned), cudaMemcpyDeviceToHost));
    cudaFuncAttributes attributes{};
    CHECK(cudaFuncGetAttributes(&attributes, mix));
    std::printf("step %d state %016llx opted in to %d bytes\n", s, checksum(host.data(), host.size() * sizeof(unsigned)),
                attributes.maxDynamicSharedSizeBytes);
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  CHECK(cudaFree(state));
  std::printf("OK\n");
  return 0;
}
