// SPDX-License-Identifier: Apache-2.0
// A step that streams its state through shared memory the way tiled kernels do
// on sm_80 and later: cuda::memcpy_async into two buffers, each with its
// cuda::barrier, the next tile copied while the current one is used. Built
// with -arch=sm_90, so the barriers are mbarriers (try_wait) and the copies
// cp.async and cp.async.bulk. Then a cooperative launch mixes each word with
// one of another block across a grid-wide barrier (cooperative groups'
// grid.sync()). Each step is checked against the same computation on the CPU and
// prints a checksum of the state, so a restored run prints the same bytes as
// an uninterrupted one.
//   pipeline [--steps N] [--sleep-ms MS]
#include <cooperative_groups.h>
#include <cuda/barrier>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

namespace cg = cooperative_groups;
using BlockBarrier = cuda::barrier<cuda::thread_scope_block>;

constexpr int kTile = 256;  // words, one per thread
constexpr int kTilesPerBlock = 6;
constexpr int kBlocks = 8;
constexpr int kWords = kTile * kTilesPerBlock * kBlocks;

// out[i] = in[i] * 2654435761 + in[mirror of i in its tile] + step + what the
// thread read from the tile before (its neighbour's word).
__device__ __host__ unsigned mixWord(unsigned own, unsigned mirror, unsigned step, unsigned carry) {
  return own * 2654435761u + mirror + step + carry;
}

__global__ void step(const unsigned* in, unsigned* out, unsigned s) {
  __shared__ alignas(16) unsigned tile[2][kTile];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ BlockBarrier bar[2];
  auto block = cg::this_thread_block();
  if (block.thread_rank() == 0) {
    init(&bar[0], block.size());
    init(&bar[1], block.size());
  }
  block.sync();
  const unsigned* mine = in + blockIdx.x * kTile * kTilesPerBlock;
  unsigned* dst = out + blockIdx.x * kTile * kTilesPerBlock;
  const int t = threadIdx.x;
  unsigned carry = 0;
  // Even tiles as a size the runtime cannot prove aligned (one cp.async per
  // thread), odd ones as 16-byte aligned (one cp.async.bulk for the block).
  auto fetch = [&](int k) {
    if (k % 2 == 0) {
      cuda::memcpy_async(block, tile[k & 1], mine + k * kTile, sizeof(unsigned) * kTile, bar[k & 1]);
    } else {
      cuda::memcpy_async(block, tile[k & 1], mine + k * kTile, cuda::aligned_size_t<16>(sizeof(unsigned) * kTile),
                         bar[k & 1]);
    }
  };
  fetch(0);
  for (int k = 0; k < kTilesPerBlock; ++k) {
    const int cur = k & 1;
    if (k + 1 < kTilesPerBlock) fetch(k + 1);
    bar[cur].arrive_and_wait();
    dst[k * kTile + t] = mixWord(tile[cur][t], tile[cur][kTile - 1 - t], s, carry);
    carry = tile[cur][(t + 1) % kTile];
    block.sync();  // every thread is done with tile[cur] before it is refilled
  }
}

// state[i] ^= state[(i + kTile) % kWords] >> 3, every block reading a word
// of the next block's before any is written.
__global__ void mixBlocks(unsigned* state) {
  cg::grid_group grid = cg::this_grid();
  const unsigned i = static_cast<unsigned>(grid.thread_rank());
  const unsigned other = state[(i + kTile) % kWords];
  grid.sync();
  state[i] ^= other >> 3;
}

void mixBlocksOnHost(std::vector<unsigned>& state) {
  const std::vector<unsigned> before = state;
  for (int i = 0; i < kWords; ++i) state[i] ^= before[(i + kTile) % kWords] >> 3;
}

void stepOnHost(const std::vector<unsigned>& in, std::vector<unsigned>& out, unsigned s) {
  for (int b = 0; b < kBlocks * kTilesPerBlock; b += kTilesPerBlock) {
    for (int t = 0; t < kTile; ++t) {
      unsigned carry = 0;
      for (int k = 0; k < kTilesPerBlock; ++k) {
        const unsigned* tileIn = &in[(b + k) * kTile];
        out[(b + k) * kTile + t] = mixWord(tileIn[t], tileIn[kTile - 1 - t], s, carry);
        carry = tileIn[(t + 1) % kTile];
      }
    }
  }
}

int main(int argc, char** argv) {
  int steps = 12, sleepMs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::atoi(argv[i + 1]);
  }
  unsigned* state[2] = {nullptr, nullptr};
  for (auto& p : state) CHECK(cudaMalloc(&p, kWords * sizeof(unsigned)));
  std::vector<unsigned> host(kWords), next(kWords);
  for (int i = 0; i < kWords; ++i) host[i] = static_cast<unsigned>(i) * 7919u + 13u;
  CHECK(cudaMemcpy(state[0], host.data(), kWords * sizeof(unsigned), cudaMemcpyHostToDevice));
  for (int s = 1; s <= steps; ++s) {
    const int from = (s - 1) % 2;
    step<<<kBlocks, kTile>>>(state[from], state[from ^ 1], static_cast<unsigned>(s));
    CHECK(cudaGetLastError());
    void* args[] = {&state[from ^ 1]};
    CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(mixBlocks), kWords / kTile, kTile, args, 0, nullptr));
    CHECK(cudaMemcpy(host.data(), state[from ^ 1], kWords * sizeof(unsigned), cudaMemcpyDeviceToHost));
    // The CPU follows the device's own state: a restored run checks its steps too.
    std::vector<unsigned> before(kWords);
    CHECK(cudaMemcpy(before.data(), state[from], kWords * sizeof(unsigned), cudaMemcpyDeviceToHost));
    stepOnHost(before, next, static_cast<unsigned>(s));
    mixBlocksOnHost(next);
    if (next != host) {
      std::printf("MISMATCH at step %d\n", s);
      return 1;
    }
    std::printf("step %d state %016llx\n", s, checksum(host.data(), host.size() * sizeof(unsigned)));
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  for (auto& p : state) CHECK(cudaFree(p));
  std::printf("OK\n");
  return 0;
}
