// SPDX-License-Identifier: Apache-2.0
// Corpus: struct arguments with pointers, globals, printf, 64-bit/double intrinsics,
// a __noinline__ device function with a local array.
#include <cstdint>
#include <cstdio>

struct Buffers {
  const float* in;
  float* out;
  int64_t count;
  double scale;
};

struct Small {
  char tag;
  short s;
  int i;
};

__device__ float g_bias = 1.5f;
__device__ int g_table[8] = {1, 2, 3, 5, 8, 13, 21, 34};
__constant__ float c_coeffs[16];
__constant__ double c_dscale = 2.0;

__device__ __noinline__ float polyLocal(float x, int k) {
  float terms[12];
  float p = 1.f;
  for (int j = 0; j < 12; ++j) {
    terms[j] = p * c_coeffs[j];
    p *= x;
  }
  float acc = 0.f;
  for (int j = 0; j <= (k % 12); ++j) acc += terms[(j * 7 + k) % 12];
  return acc;
}

extern "C" __global__ void struct_args(Buffers b, Small s, const char* label) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < b.count) {
    float v = __ldg(&b.in[i]);
    b.out[i] = polyLocal(v, (int)i) * (float)(b.scale * c_dscale) + g_bias + g_table[i & 7] + s.i;
  }
  if (i == 0) printf("%s: count=%lld tag=%c short=%d scale=%f\n", label, (long long)b.count,
                     s.tag, s.s, b.scale);
}

extern "C" __global__ void bit_ops(const uint32_t* in32, const uint64_t* in64, uint64_t* out,
                                   double* dout, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t a = __ldg(&in32[i]);
  uint64_t b = in64[i];
  uint64_t r = __brev(a) + __popc(a) + __clz(a) + __ffs(a) + __brevll(b) + __popcll(b) +
               __clzll(b) + __funnelshift_l(a, a >> 3, 7) + __byte_perm(a, a ^ 0xff, 0x3210) +
               __umulhi(a, 77u) + __mul64hi(b, 12345ll) + __sad(a, a + 9, 1u);
  out[i] = r * b / (a | 1) + b % 7;
  double d = (double)b;
  dout[i] = sqrt(d) + fma(d, 0.5, 1.0) + rint(d) + floor(d / 3.0) + exp(-d * 1e-9) +
            (double)(int64_t)r * 1e-3;
}

__global__ void clock_and_ids(long long* out, unsigned* ids) {
  long long t0 = clock64();
  unsigned smid, lane;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  __nanosleep(100);
  ids[threadIdx.x] = smid * 64 + lane + threadIdx.y + threadIdx.z + blockIdx.y + blockIdx.z +
                     gridDim.y + gridDim.z + blockDim.y + blockDim.z;
  out[threadIdx.x] = clock64() - t0;
}

extern "C" __global__ void inline_asm_add(const int* a, int* b) {
  int x = a[threadIdx.x], y;
  asm("{\n\t.reg .s32 t;\n\tadd.s32 t, %1, 1;\n\tmul.lo.s32 %0, t, 3;\n\t}" : "=r"(y) : "r"(x));
  b[threadIdx.x] = y;
}
