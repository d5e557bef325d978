// SPDX-License-Identifier: Apache-2.0
// Kernels the libphos.so test clients launch through phosd (compiled to PTX by nvcc at build time).

extern "C" __global__ void addVectors(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// out[i] = in[i] * factor: in and out may be device memory or mapped pinned memory.
extern "C" __global__ void scale(const float* in, float* out, float factor, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * factor;
}

// The isolation test's probe: reads `src` and writes `dst`, either of which may
// belong to another process.
extern "C" __global__ void copyBytes(const unsigned char* src, unsigned char* dst, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

// A kernel that runs until the host opens its gate (a flag in mapped pinned
// memory): it is certainly still running when the host asks about it, without
// any guess of how long a kernel takes. `limit` bounds the wait so that a
// broken test fails instead of hanging; `done` says how it ended (1: the gate
// opened, 2: the limit was reached).
extern "C" __global__ void gate(const volatile int* open, unsigned long long limit, int* done) {
  unsigned long long i = 0;
  while (*open == 0 && i < limit) ++i;
  *done = *open != 0 ? 1 : 2;
}
