// SPDX-License-Identifier: Apache-2.0
// fp8 conversions as cuda_fp8.h emits them for sm_89 and later (compiled for
// compute_90): f32 pairs and f16x2 into e4m3x2/e5m2x2, and back into f16x2;
// the .relu forms, which cuda_fp8.h does not offer, in inline PTX.
#include <cuda_fp8.h>

extern "C" __global__ void f32_to_fp8x2(const float* a, const float* b, unsigned short* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // cuda_fp8.h puts .x in the lower byte: cvt's b operand.
  float2 f = make_float2(b[i], a[i]);
  out[i] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
  out[i + n] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E5M2);
  unsigned short r;
  asm("cvt.rn.satfinite.relu.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(a[i]), "f"(b[i]));
  out[i + 2 * n] = r;
  asm("cvt.rn.satfinite.relu.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(a[i]), "f"(b[i]));
  out[i + 3 * n] = r;
}

extern "C" __global__ void f16x2_to_fp8x2(const unsigned* h, unsigned short* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __half2_raw v;
  v.x = static_cast<unsigned short>(h[i]);
  v.y = static_cast<unsigned short>(h[i] >> 16);
  out[i] = __nv_cvt_halfraw2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3);
  out[i + n] = __nv_cvt_halfraw2_to_fp8x2(v, __NV_SATFINITE, __NV_E5M2);
  unsigned short r;
  asm("cvt.rn.satfinite.relu.e4m3x2.f16x2 %0, %1;" : "=h"(r) : "r"(h[i]));
  out[i + 2 * n] = r;
}

extern "C" __global__ void fp8x2_to_f16x2(const unsigned short* v, unsigned* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __half2_raw e4 = __nv_cvt_fp8x2_to_halfraw2(v[i], __NV_E4M3);
  __half2_raw e5 = __nv_cvt_fp8x2_to_halfraw2(v[i], __NV_E5M2);
  out[i] = e4.x | (static_cast<unsigned>(e4.y) << 16);
  out[i + n] = e5.x | (static_cast<unsigned>(e5.y) << 16);
  unsigned r;
  asm("cvt.rn.relu.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v[i]));
  out[i + 2 * n] = r;
  asm("cvt.rn.relu.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"(v[i]));
  out[i + 3 * n] = r;
}
