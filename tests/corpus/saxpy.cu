// SPDX-License-Identifier: Apache-2.0
// Corpus: element-wise kernels (saxpy, grid-stride loops, extern "C" names).
extern "C" __global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void saxpy_grid_stride(size_t n, float a, const float* __restrict__ x,
                                             float* __restrict__ y) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)blockDim.x * gridDim.x) {
    y[i] = fmaf(a, x[i], y[i]);
  }
}

__global__ void daxpy_unrolled(int n, double a, const double* x, double* y) {
  int base = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (base + k < n) y[base + k] += a * x[base + k];
  }
}

extern "C" __global__ void vector_add_float4(const float4* a, const float4* b, float4* c,
                                             int n4) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 x = a[i], y = b[i];
    c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

extern "C" __global__ void fill_u8(unsigned char* p, unsigned char value, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}
