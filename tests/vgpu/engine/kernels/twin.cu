// SPDX-License-Identifier: Apache-2.0
// Kernels whose validator twins must compute exactly what they do (twin_equivalence_test).

extern "C" __global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void histogram(const unsigned* in, int n, unsigned* bins, int nbins) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    atomicAdd(&bins[in[i] % nbins], 1u);
  }
}

// Kept out of line so the store happens in a .func the twin must follow.
__device__ __noinline__ void putScaled(float* out, int i, float v, float s) {
  out[i] = v * s;
}

extern "C" __global__ void scale_via_device_function(const float* in, float* out, int n, float s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) putScaled(out, i, in[i], s);
}

// A generic pointer that points to shared memory when `viaShared` is set (as the
// test does): the store through it is a generic st, not st.shared.
__device__ __noinline__ void storeGeneric(float* p, float v) { *p = v; }

extern "C" __global__ void reverse_through_shared(const float* in, float* out, int viaShared) {
  __shared__ float tile[128];
  int t = threadIdx.x;
  int i = blockIdx.x * blockDim.x + t;
  float* p = viaShared ? &tile[t] : &out[i];
  storeGeneric(p, in[i]);
  __syncthreads();
  if (viaShared) out[i] = tile[blockDim.x - 1 - t];
}

extern "C" __global__ void scatter(int* out, const int* index, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[index[i]] = i;
}

// Module-scope variables the twins must share with the program's module, not
// copy: a __device__ pointer one kernel sets and another stores through, a
// __device__ counter, __constant__ data read with and without an index.
__device__ float* g_target;
__device__ unsigned g_hits;
__constant__ float c_weights[8];
__constant__ int c_count;

extern "C" __global__ void set_target(float* p) { g_target = p; }

extern "C" __global__ void weigh_into_target(const float* in) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < c_count) {
    g_target[i] = in[i] * c_weights[i & 7];
    atomicAdd(&g_hits, 1u);
  }
}
