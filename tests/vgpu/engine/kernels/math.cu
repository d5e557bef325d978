// SPDX-License-Identifier: Apache-2.0
// Integer and floating-point semantics: rounding modes, conversions, bit operations.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void intOps(const unsigned* a, const unsigned* b, unsigned* out) {
  int t = threadIdx.x;
  unsigned x = a[t], y = b[t];
  int sx = (int)x, sy = (int)y;
  unsigned* o = out + t * 16;
  o[0] = __umulhi(x, y);
  o[1] = (unsigned)__mulhi(sx, sy);
  o[2] = __brev(x);
  o[3] = __clz(x);
  o[4] = __popc(x);
  o[5] = __byte_perm(x, y, y & 0x7777);
  o[6] = __funnelshift_l(x, y, sy);
  o[7] = __funnelshift_rc(x, y, sy);
  o[8] = y ? x / y : 0;
  o[9] = sy ? (unsigned)(sx % sy) : 0;
  o[10] = (unsigned)__ffs(sx);
  o[11] = (unsigned)(sx >> (y & 31));
  o[12] = __sad(sx, sy, x);
  o[13] = (unsigned)min(sx, sy) ^ max(x, y);
  unsigned long long w = (unsigned long long)x * y + __umul64hi((unsigned long long)x << 32 | y, 0x9e3779b97f4a7c15ull);
  o[14] = (unsigned)w;
  o[15] = (unsigned)(w >> 32);
}

extern "C" __global__ void floatOps(const float* a, const float* b, float* out, int* iout) {
  int t = threadIdx.x;
  float x = a[t], y = b[t];
  float* o = out + t * 16;
  o[0] = __fadd_rn(x, y);
  o[1] = __fadd_rz(x, y);
  o[2] = __fmul_ru(x, y);
  o[3] = __fmul_rd(x, y);
  o[4] = __fdiv_rn(x, y);
  o[5] = __fdiv_rz(x, y);
  o[6] = __fsqrt_rn(fabsf(x));
  o[7] = __fmaf_rz(x, y, 1.0f);
  o[8] = fminf(x, y);
  o[9] = fmaxf(x, y);
  o[10] = __saturatef(x);
  o[11] = __frcp_rn(y);
  o[12] = rintf(x);
  o[13] = truncf(y);
  o[14] = floorf(x) + ceilf(y);
  o[15] = __int2float_rz(__float_as_int(x)) + __uint2float_ru(__float_as_uint(y));
  int* io = iout + t * 6;
  io[0] = __float2int_rn(x * 1e6f);
  io[1] = __float2int_rz(y * 1e9f);
  io[2] = (int)__float2uint_rd(x);
  io[3] = __float2int_ru(y);
  io[4] = (int)__float2ll_rn(x * 1e12f);
  io[5] = __float_as_int(__int_as_float(io[0]) + 0.0f);
}

extern "C" __global__ void doubleOps(const double* a, const double* b, double* out) {
  int t = threadIdx.x;
  double x = a[t], y = b[t];
  double* o = out + t * 8;
  o[0] = __dadd_rz(x, y);
  o[1] = __dmul_ru(x, y);
  o[2] = __ddiv_rd(x, y);
  o[3] = __dsqrt_rn(fabs(x));
  o[4] = __fma_rn(x, y, -x);
  o[5] = fmin(x, y);
  o[6] = (double)__double2float_rz(x);
  o[7] = (double)__ll2double_rd(__double_as_longlong(y));
}

extern "C" __global__ void halfOps(const float* a, const float* b, unsigned short* out) {
  int t = threadIdx.x;
  __half x = __float2half_rn(a[t]), y = __float2half_rz(b[t]);
  __nv_bfloat16 bx = __float2bfloat16_rn(a[t]);
  unsigned short* o = out + t * 6;
  o[0] = __half_as_ushort(x);
  o[1] = __half_as_ushort(y);
  o[2] = __half_as_ushort(__hadd(x, y));
  o[3] = __half_as_ushort(__hmul(x, y));
  o[4] = __bfloat16_as_ushort(bx);
  o[5] = __half_as_ushort(__float2half_rn(__half2float(x) * 3.0f));
}

extern "C" __global__ void approxOps(const float* a, float* out) {
  int t = threadIdx.x;
  float x = a[t];
  out[t * 6] = __expf(x);
  out[t * 6 + 1] = __logf(fabsf(x) + 1.0f);
  out[t * 6 + 2] = __sinf(x);
  out[t * 6 + 3] = __cosf(x);
  out[t * 6 + 4] = rsqrtf(fabsf(x) + 1.0f);
  out[t * 6 + 5] = __fdividef(x, 3.0f);
}
