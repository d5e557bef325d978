// SPDX-License-Identifier: Apache-2.0
// Kernels for the engine tests: elementwise, shared-memory reductions, dynamic shared.
extern "C" __global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __fmaf_rn(a, x[i], y[i]);
}

extern "C" __global__ void daxpy2d(int w, int h, double a, const double* x, double* y) {
  int cx = blockIdx.x * blockDim.x + threadIdx.x;
  int cy = blockIdx.y * blockDim.y + threadIdx.y;
  if (cx < w && cy < h) y[cy * w + cx] = a * x[cy * w + cx] + y[cy * w + cx];
}

// Tree reduction in shared memory with __syncthreads.
extern "C" __global__ void blockSum(const int* in, int* out, int n) {
  __shared__ int s[256];
  int t = threadIdx.x;
  int i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? in[i] : 0;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// Warp-shuffle reduction of floats: the reference reproduces the tree order.
extern "C" __global__ void warpSumF(const float* in, float* out) {
  float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  __shared__ float partial[32];
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) w += __shfl_xor_sync(0xffffffffu, w, off);
    if (threadIdx.x == 0) out[blockIdx.x] = w;
  }
}

// Dynamic shared memory: reverse a block's elements.
extern "C" __global__ void reverseDyn(int* data) {
  extern __shared__ int buf[];
  int t = threadIdx.x;
  buf[t] = data[blockIdx.x * blockDim.x + t];
  __syncthreads();
  data[blockIdx.x * blockDim.x + t] = buf[blockDim.x - 1 - t];
}

// 3-D block and grid indices.
extern "C" __global__ void indices(unsigned* out) {
  unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  unsigned laneid;
  asm("mov.u32 %0, %%laneid;" : "=r"(laneid));
  unsigned warpid = t / 32;
  out[(block * nt + t) * 2] = (threadIdx.x) | (threadIdx.y << 8) | (threadIdx.z << 16) | (blockIdx.x << 24);
  out[(block * nt + t) * 2 + 1] = laneid | (warpid << 8) | (blockIdx.y << 16) | (blockIdx.z << 24);
}

// Tiled matrix multiply (n multiple of 16), the bench's workload.
extern "C" __global__ void matmul(const float* a, const float* b, float* c, int n) {
  __shared__ float ta[16][16];
  __shared__ float tb[16][16];
  int row = blockIdx.y * 16 + threadIdx.y;
  int col = blockIdx.x * 16 + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += 16) {
    ta[threadIdx.y][threadIdx.x] = a[row * n + k0 + threadIdx.x];
    tb[threadIdx.y][threadIdx.x] = b[(k0 + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < 16; ++k) acc = __fmaf_rn(ta[threadIdx.y][k], tb[k][threadIdx.x], acc);
    __syncthreads();
  }
  c[row * n + col] = acc;
}
