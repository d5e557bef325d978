// SPDX-License-Identifier: Apache-2.0
// Corpus: block reductions with warp shuffles, vote/ballot and cooperative groups.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

__device__ __forceinline__ float warpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

extern "C" __global__ void block_sum(const float* in, float* out, int n) {
  __shared__ float partial[32];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? in[i] : 0.0f;
  v = warpSum(v);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (blockDim.x + 31) / 32 ? partial[lane] : 0.0f;
    v = warpSum(v);
    if (lane == 0) atomicAdd(out, v);
  }
}

extern "C" __global__ void vote_stats(const int* in, unsigned* ballots, int* flags, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  bool pred = i < n && in[i] > 0;
  unsigned b = __ballot_sync(0xffffffffu, pred);
  int all = __all_sync(0xffffffffu, pred);
  int any = __any_sync(0xffffffffu, pred);
  unsigned active = __activemask();
  int lane = threadIdx.x & 31;
  int upv = __shfl_up_sync(0xffffffffu, lane, 1);
  int xv = __shfl_xor_sync(0xffffffffu, lane, 4);
  int iv = __shfl_sync(0xffffffffu, lane, 0);
  if (lane == 0) {
    ballots[i / 32] = b ^ active;
    flags[i / 32] = all * 4 + any * 2 + __popc(b) + upv + xv + iv;
  }
}

__global__ void cg_reduce(const int* in, int* out, int n) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
  int i = block.group_index().x * block.size() + block.thread_rank();
  int v = i < n ? in[i] : 0;
  int s = cg::reduce(tile, v, cg::plus<int>());
  int m = cg::reduce(tile, v, cg::greater<int>());
  block.sync();
  if (tile.thread_rank() == 0) {
    atomicAdd(out, s);
    atomicMax(out + 1, m);
  }
}
