// SPDX-License-Identifier: Apache-2.0
// Corpus: kernels for clang's CUDA front end, written against its NVVM builtins so
// they build with -nocudainc (clang 14 cannot parse the CUDA 13 headers).
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))

__device__ static inline unsigned tid() { return __nvvm_read_ptx_sreg_tid_x(); }
__device__ static inline unsigned gid() {
  return __nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() + tid();
}

__device__ float clang_bias = 0.25f;

extern "C" __global__ void clang_scale(float* a, const float* b, int n) {
  __shared__ float s[64];
  unsigned i = gid();
  s[tid() & 63] = i < (unsigned)n ? b[i] : 0.f;
  __syncthreads();
  if (i < (unsigned)n) {
    float v = s[(tid() + 1) & 63] * 2.0f + clang_bias;
    a[i] = v + __nvvm_shfl_sync_down_f32(0xffffffffu, v, 1, 31);
  }
}

extern "C" __global__ void clang_atomics(int* counter, unsigned long long* big, double* d) {
  __nvvm_atom_add_gen_i(counter, 1);
  __nvvm_atom_max_gen_i(counter + 1, (int)gid());
  __nvvm_atom_add_gen_ll((long long*)big, 2);
  __nvvm_atom_add_gen_d(d, 1.0);
  __nvvm_atom_cas_gen_i(counter + 2, 0, (int)tid());
}

template <typename T>
__device__ T clampT(T v, T lo, T hi) { return v < lo ? lo : (v > hi ? hi : v); }

extern "C" __global__ void clang_clamp(double* x, long long n) {
  long long i = gid();
  if (i < n) x[i] = clampT(x[i], -1.0, 1.0) + __nvvm_sqrt_rn_d(x[i] * x[i]);
}
