// SPDX-License-Identifier: Apache-2.0
// Tensor-core matrix multiply through wmma (nvcuda::wmma, sm_80): one warp per
// 16x16 (or MxN) tile of D = alpha * (A x B) + C, looping over K, for every
// element type and shape wmma offers below sub-byte.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;

// D (row-major, ld n) = alpha * (A (row-major, ld k) x B (col-major, ld k)) + C (row-major, ld n);
// one warp per M x N tile; the grid's x covers tiles of columns, y of rows.
template <int M, int N, int K, typename In, typename Acc>
__device__ void gemm(const In* a, const In* b, const Acc* c, Acc* d, int m, int n, int k, Acc alpha) {
  const int tileRow = blockIdx.y * M, tileCol = blockIdx.x * N;
  wmma::fragment<wmma::matrix_a, M, N, K, In, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, M, N, K, In, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, M, N, K, Acc> acc, fc;
  wmma::fill_fragment(acc, Acc(0));
  for (int kk = 0; kk < k; kk += K) {
    wmma::load_matrix_sync(fa, a + tileRow * k + kk, k);
    wmma::load_matrix_sync(fb, b + tileCol * k + kk, k);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::load_matrix_sync(fc, c + tileRow * n + tileCol, n, wmma::mem_row_major);
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = alpha * acc.x[i] + fc.x[i];
  wmma::store_matrix_sync(d + tileRow * n + tileCol, acc, n, wmma::mem_row_major);
}

extern "C" __global__ void gemm_f16_f32(const half* a, const half* b, const float* c, float* d, int m, int n, int k,
                                        float alpha) {
  gemm<16, 16, 16>(a, b, c, d, m, n, k, alpha);
}
extern "C" __global__ void gemm_f16_f16(const half* a, const half* b, const half* c, half* d, int m, int n, int k,
                                        half alpha) {
  gemm<16, 16, 16>(a, b, c, d, m, n, k, alpha);
}
extern "C" __global__ void gemm_m32n8_f16(const half* a, const half* b, const float* c, float* d, int m, int n, int k,
                                          float alpha) {
  gemm<32, 8, 16>(a, b, c, d, m, n, k, alpha);
}
extern "C" __global__ void gemm_m8n32_f16(const half* a, const half* b, const float* c, float* d, int m, int n, int k,
                                          float alpha) {
  gemm<8, 32, 16>(a, b, c, d, m, n, k, alpha);
}
extern "C" __global__ void gemm_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d, int m,
                                     int n, int k, float alpha) {
  gemm<16, 16, 16>(a, b, c, d, m, n, k, alpha);
}
extern "C" __global__ void gemm_s8(const signed char* a, const signed char* b, const int* c, int* d, int m, int n,
                                   int k, int alpha) {
  gemm<16, 16, 16>(a, b, c, d, m, n, k, alpha);
}
extern "C" __global__ void gemm_f64(const double* a, const double* b, const double* c, double* d, int m, int n, int k,
                                    double alpha) {
  gemm<8, 8, 4>(a, b, c, d, m, n, k, alpha);
}

// tf32: the inputs are f32 in memory, rounded to tf32 (cvt.rna.tf32.f32) in the fragments.
extern "C" __global__ void gemm_tf32(const float* a, const float* b, const float* c, float* d, int m, int n, int k,
                                     float alpha) {
  const int tileRow = blockIdx.y * 16, tileCol = blockIdx.x * 16;
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc, fc;
  wmma::fill_fragment(acc, 0.0f);
  for (int kk = 0; kk < k; kk += 8) {
    wmma::load_matrix_sync(fa, a + tileRow * k + kk, k);
    wmma::load_matrix_sync(fb, b + tileCol * k + kk, k);
    for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
    for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::load_matrix_sync(fc, c + tileRow * n + tileCol, n, wmma::mem_row_major);
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = alpha * acc.x[i] + fc.x[i];
  wmma::store_matrix_sync(d + tileRow * n + tileCol, acc, n, wmma::mem_row_major);
}
