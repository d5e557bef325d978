// SPDX-License-Identifier: Apache-2.0
// Corpus: newer warp and tensor-core features real libraries emit: wmma (mma.sync),
// cp.async pipelines, redux/match, fp8 conversions, nanosleep, clusters on sm_90.
#include <cuda/pipeline>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cooperative_groups.h>
#include <mma.h>

namespace cg = cooperative_groups;

extern "C" __global__ void wmma_16x16(const half* a, const half* b, float* c) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

extern "C" __global__ void async_copy(const float4* in, float4* out, int n) {
  __shared__ float4 stage[2][128];
  auto block = cg::this_thread_block();
  cuda::pipeline<cuda::thread_scope_thread> pipe = cuda::make_pipeline();
  int t = threadIdx.x;
  for (int base = blockIdx.x * 128, k = 0; base < n; base += gridDim.x * 128, k ^= 1) {
    pipe.producer_acquire();
    if (base + t < n) cuda::memcpy_async(&stage[k][t], &in[base + t], sizeof(float4), pipe);
    pipe.producer_commit();
    pipe.consumer_wait();
    block.sync();
    if (base + t < n) out[base + t] = stage[k][(t + 1) & 127];
    pipe.consumer_release();
  }
}

extern "C" __global__ void warp_reduce_match(const unsigned* in, unsigned* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned v = i < n ? in[i] : 0u;
  unsigned sum = __reduce_add_sync(0xffffffffu, v);
  unsigned mx = __reduce_max_sync(0xffffffffu, v);
  unsigned peers = __match_any_sync(0xffffffffu, v & 7);
  if (__activemask() == 0xffffffffu) __nanosleep(100);
  if (i < n) out[i] = sum ^ mx ^ __popc(peers) ^ __fns(peers, 0, 1);
}

extern "C" __global__ void fp8_convert(const float* in, __nv_fp8_e4m3* q, __half2* h, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __nv_fp8_e4m3 v(in[i]);
  q[i] = v;
  __nv_fp8x2_e5m2 pair(make_float2(in[i], -in[i]));
  h[i] = static_cast<__half2>(pair);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
extern "C" __global__ void __cluster_dims__(2, 1, 1) cluster_sum(const int* in, int* out) {
  __shared__ int local;
  auto cluster = cg::this_cluster();
  if (threadIdx.x == 0) local = in[blockIdx.x];
  cluster.sync();
  int* peer = cluster.map_shared_rank(&local, cluster.block_rank() ^ 1);
  if (threadIdx.x == 0) out[blockIdx.x] = local + *peer;
  cluster.sync();
}
#endif
