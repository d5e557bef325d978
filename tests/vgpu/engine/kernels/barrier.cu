// SPDX-License-Identifier: Apache-2.0
// mbarrier-based synchronisation as programs write it: cuda::barrier with split
// arrive/wait over many phases, cuda::memcpy_async double buffering (cp.async
// with cp.async.mbarrier.arrive), and a producer/consumer pipeline on "full"
// and "empty" mbarriers waited on by phase parity, CUTLASS-style. Built for
// compute_80 (test_wait) and compute_90 (try_wait, expect_tx/complete_tx, and
// the bulk copies cuda::memcpy_async makes of 16-byte aligned sizes). And the
// grid-wide barrier of a cooperative launch.
#include <cooperative_groups.h>
#include <cuda/barrier>
#include <cuda/ptx>

namespace cg = cooperative_groups;
using BlockBarrier = cuda::barrier<cuda::thread_scope_block>;

// Each round every thread reads its right neighbour's value, all wait, then
// each writes its own: two barrier phases per round.
extern "C" __global__ void split_phases(int* out, int rounds) {
  __shared__ int values[256];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ BlockBarrier bar;
  const int t = threadIdx.x, n = blockDim.x;
  if (t == 0) init(&bar, n);
  values[t] = t;
  __syncthreads();
  for (int r = 0; r < rounds; ++r) {
    const int v = values[(t + 1) % n];
    BlockBarrier::arrival_token token = bar.arrive();
    bar.wait(cuda::std::move(token));
    values[t] = v * 3 + r + t;
    bar.arrive_and_wait();
  }
  out[t] = values[t];
}

// out[t] = sum over tiles k of in[k * 256 + (7t + k) % 256]; tiles copied
// into shared memory by cuda::memcpy_async one ahead of their use.
extern "C" __global__ void async_copy_sum(const int* in, int* out, int n) {
  __shared__ alignas(16) int tile[2][256];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ BlockBarrier bar[2];
  auto block = cg::this_thread_block();
  if (block.thread_rank() == 0) {
    init(&bar[0], block.size());
    init(&bar[1], block.size());
  }
  block.sync();
  const int tiles = n / 256;
  int acc = 0;
  cuda::memcpy_async(block, tile[0], in, sizeof(int) * 256, bar[0]);
  for (int k = 0; k < tiles; ++k) {
    const int cur = k & 1;
    if (k + 1 < tiles) {
      cuda::memcpy_async(block, tile[cur ^ 1], in + (k + 1) * 256, sizeof(int) * 256, bar[cur ^ 1]);
    }
    bar[cur].arrive_and_wait();
    acc += tile[cur][(threadIdx.x * 7 + k) % 256];
    block.sync();
  }
  out[threadIdx.x] = acc;
}

__device__ unsigned sharedAddress(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__device__ void mbarrierInit(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(sharedAddress(bar)), "r"(count) : "memory");
}

__device__ void mbarrierArrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(sharedAddress(bar)) : "memory");
}

// Waits until the phase of parity `parity` has completed.
__device__ void mbarrierWaitParity(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done) : "r"(sharedAddress(bar)), "r"(parity) : "memory");
#else
    asm volatile(
        "{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done) : "r"(sharedAddress(bar)), "r"(parity) : "memory");
#endif
  }
}

// Warp 0 produces `iterations` slices of 32 values into a two-slot ring; the
// other warps consume each slice once it is full and free the slot after.
// out[t] (t >= 32) = sum over i of in[i * 32 + t % 32] * (t / 32).
extern "C" __global__ void producer_consumer(const int* in, int* out, int iterations) {
  __shared__ int ring[2][32];
  __shared__ unsigned long long full[2], empty[2];
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const unsigned consumers = blockDim.x - 32;
  if (t == 0) {
    for (int s = 0; s < 2; ++s) {
      mbarrierInit(&full[s], 32);
      mbarrierInit(&empty[s], consumers);
    }
  }
  __syncthreads();
  int acc = 0;
  for (int i = 0; i < iterations; ++i) {
    const int slot = i % 2;
    const unsigned phase = (i / 2) & 1;
    if (warp == 0) {
      mbarrierWaitParity(&empty[slot], phase ^ 1);  // the first wait on each slot passes at once
      ring[slot][lane] = in[i * 32 + lane];
      mbarrierArrive(&full[slot]);
    } else {
      mbarrierWaitParity(&full[slot], phase);
      acc += ring[slot][lane] * warp;
      mbarrierArrive(&empty[slot]);
    }
  }
  out[t] = acc;
}

// A grid-wide barrier (cooperative groups' grid.sync(), which needs a
// cooperative launch): each round every thread reads its right neighbour's
// word across block boundaries, all blocks sync, then each writes its own.
extern "C" __global__ void grid_sync(int* data, int n, int rounds) {
  cg::grid_group grid = cg::this_grid();
  const int i = static_cast<int>(grid.thread_rank());
  if (i < n) data[i] = i;
  for (int r = 0; r < rounds; ++r) {
    grid.sync();
    const int v = i < n ? data[(i + 1) % n] : 0;
    grid.sync();
    if (i < n) data[i] = data[i] * 3 + v + r;
  }
}

#if __CUDA_ARCH__ >= 900
// Transaction counts (sm_90): thread 0 arrives expecting 256 bytes; warp 1
// stores them and reports them done with complete_tx in two halves. The phase
// completes only with both the arrivals and the bytes: every thread then
// reads what warp 1 stored.
extern "C" __global__ void transaction_count(int* out) {
  __shared__ int data[64];
  __shared__ unsigned long long bar;
  const int t = threadIdx.x;
  if (t == 0) mbarrierInit(&bar, blockDim.x);
  __syncthreads();
  const unsigned addr = sharedAddress(&bar);
  unsigned long long state;
  if (t == 0) {
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 %0, [%1], 256;"
                 : "=l"(state) : "r"(addr) : "memory");
  } else {
    asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(addr) : "memory");
  }
  if (t >= 32 && t < 64) {
    data[t - 32] = t * 5;
    data[t] = t * 7;
    __syncwarp();
    if (t == 32) asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], 128;" ::"r"(addr) : "memory");
    __syncwarp();
    if (t == 33) asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], 128;" ::"r"(addr) : "memory");
  }
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(addr), "l"(state) : "memory");
  }
  out[t] = data[t % 64];
}

// Bulk copies (sm_90): a 16-byte aligned cuda::memcpy_async is one
// cp.async.bulk into shared memory whose bytes complete the barrier's phase;
// the result goes back with a bulk copy to global memory.
// out[t] = in[255 - t] * 3.
extern "C" __global__ void bulk_copies(const int* in, int* out) {
  __shared__ alignas(16) int tile[2][256];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ BlockBarrier bar;
  auto block = cg::this_thread_block();
  if (block.thread_rank() == 0) init(&bar, block.size());
  block.sync();
  cuda::memcpy_async(block, tile[0], in, cuda::aligned_size_t<16>(sizeof(int) * 256), bar);
  bar.arrive_and_wait();
  tile[1][threadIdx.x] = tile[0][255 - threadIdx.x] * 3;
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  block.sync();
  if (threadIdx.x == 0) {
    cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, out, tile[1], sizeof(int) * 256);
    cuda::ptx::cp_async_bulk_commit_group();
    cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>());
  }
}
#endif
