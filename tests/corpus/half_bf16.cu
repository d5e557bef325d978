// SPDX-License-Identifier: Apache-2.0
// Corpus: half, half2 and bfloat16 arithmetic and conversions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" __global__ void half_axpy(int n, __half a, const __half* x, __half* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __hfma(a, x[i], y[i]);
}

extern "C" __global__ void half2_ops(int n2, const __half2* x, __half2* y, float* norms) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n2) {
    __half2 v = x[i];
    __half2 w = __hmul2(v, v);
    w = __hadd2(w, __float2half2_rn(1.0f));
    w = h2sqrt(w);
    y[i] = __hmax2(w, __hneg2(v));
    float2 f = __half22float2(w);
    norms[i] = f.x + f.y + __half2float(__hmax(__low2half(v), __high2half(v)));
  }
}

extern "C" __global__ void bf16_ops(int n, const __nv_bfloat16* x, __nv_bfloat16* y,
                                    const __nv_bfloat162* x2, __nv_bfloat162* y2, float s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float f = __bfloat162float(x[i]) * s;
    y[i] = __float2bfloat16(f) + __float2bfloat16_rn(0.5f);
    y2[i] = __hmul2(x2[i], __floats2bfloat162_rn(s, -s));
    __half h = __float2half(f);
    if (__hisnan(h) || __hlt(h, __float2half(0.f))) y[i] = __float2bfloat16(0.f);
  }
}
