// SPDX-License-Identifier: Apache-2.0
// Corpus: integer and float atomics, CAS loops, fences and volatile stores.
__device__ double atomicMaxDouble(double* addr, double val) {
  unsigned long long* p = reinterpret_cast<unsigned long long*>(addr);
  unsigned long long old = *p, assumed;
  do {
    assumed = old;
    if (__longlong_as_double(assumed) >= val) break;
    old = atomicCAS(p, assumed, __double_as_longlong(val));
  } while (assumed != old);
  return __longlong_as_double(old);
}

extern "C" __global__ void histogram(const unsigned char* data, unsigned* bins, int n) {
  __shared__ unsigned local[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    atomicAdd(&local[data[i]], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x) atomicAdd(&bins[b], local[b]);
}

extern "C" __global__ void atomic_mix(int* ints, unsigned long long* u64, float* f, double* d,
                                      int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(&ints[0], i);
  atomicSub(&ints[1], 1);
  atomicMin(&ints[2], i);
  atomicMax(&ints[3], i);
  atomicAnd(&ints[4], ~i);
  atomicOr(&ints[5], i);
  atomicXor(&ints[6], i);
  atomicExch(&ints[7], i);
  atomicInc(reinterpret_cast<unsigned*>(&ints[8]), 100u);
  atomicDec(reinterpret_cast<unsigned*>(&ints[9]), 100u);
  atomicAdd(u64, 1ull);
  atomicAdd(f, 0.5f);
  atomicAdd(d, 0.25);
  atomicMaxDouble(d + 1, (double)i);
  atomicAdd_block(&ints[10], 1);
  atomicAdd_system(&ints[11], 1);
}

__device__ volatile int g_flag;
__device__ unsigned int g_done;

extern "C" __global__ void publish(float* out, float value) {
  if (threadIdx.x == 0) {
    out[blockIdx.x] = value;
    __threadfence();
    unsigned ticket = atomicInc(&g_done, gridDim.x);
    if (ticket == gridDim.x - 1) g_flag = 1;
    __threadfence_block();
    __threadfence_system();
  }
  while (g_flag == 0 && blockIdx.x == 0 && threadIdx.x == 0 && gridDim.x == 1) {
  }
}
