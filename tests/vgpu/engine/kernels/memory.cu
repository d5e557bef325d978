// SPDX-License-Identifier: Apache-2.0
// Atomics under contention, barriers with counts, faulting kernels, and cp.async.
#include <cassert>
#include <cuda_pipeline.h>

extern "C" __global__ void atomics(int* counter, unsigned* maxv, unsigned* inc, float* fsum,
                                   double* dsum, unsigned long long* ull, int* exch,
                                   unsigned* hist, const unsigned* data) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(counter, 1);
  atomicMax(maxv, (unsigned)(t * 2654435761u) >> 8);
  atomicInc(inc, 100);
  atomicAdd(fsum, (float)(t & 7));
  atomicAdd(dsum, 0.5 * (t & 3));
  atomicAdd(ull, (unsigned long long)t << 20);
  atomicExch(exch + (t & 1), t);
  __shared__ unsigned sh[16];
  if (threadIdx.x < 16) sh[threadIdx.x] = 0;
  __syncthreads();
  atomicAdd(&sh[data[t] & 15], 1u);
  __syncthreads();
  if (threadIdx.x < 16) atomicAdd(&hist[threadIdx.x], sh[threadIdx.x]);
}

// A spin lock built on atomicCAS protecting a non-atomic read-modify-write.
extern "C" __global__ void casLock(int* lock, int* value) {
  if (threadIdx.x == 0) {
    while (atomicCAS(lock, 0, 1) != 0) {
    }
    __threadfence();
    *value = *value + (int)blockIdx.x;
    __threadfence();
    atomicExch(lock, 0);
  }
}

extern "C" __global__ void syncCounts(const int* in, int* count, int* all, int* any) {
  int v = in[blockIdx.x * blockDim.x + threadIdx.x];
  int c = __syncthreads_count(v > 0);
  int a = __syncthreads_and(v > 0);
  int o = __syncthreads_or(v > 100);
  if (threadIdx.x == 0) {
    count[blockIdx.x] = c;
    all[blockIdx.x] = a;
    any[blockIdx.x] = o;
  }
}

// Producer/consumer with named barriers: warp 0 produces, warps 1..3 consume.
extern "C" __global__ void namedBarrier(int* out) {
  __shared__ int slot[32];
  int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (warp == 0) {
    slot[lane] = lane * 10;
    asm volatile("bar.arrive 1, 128;" ::: "memory");
  } else {
    asm volatile("bar.sync 1, 128;" ::: "memory");
    out[threadIdx.x - 32] = slot[lane] + warp;
  }
}

extern "C" __global__ void outOfBounds(int* p, long long offset) {
  if (threadIdx.x == 7) p[offset] = 1;
}

extern "C" __global__ void misaligned(char* p) {
  if (threadIdx.x == 0) *reinterpret_cast<int*>(p + 1) = 5;
}

extern "C" __global__ void sharedOutOfBounds(int* out, int index) {
  __shared__ int s[64];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[index + threadIdx.x];
}

extern "C" __global__ void trapKernel(int* p) {
  if (threadIdx.x == 3) __trap();
  p[threadIdx.x] = 1;
}

extern "C" __global__ void assertKernel(const int* p) {
  assert(p[threadIdx.x] < 10);
}

extern "C" __global__ void nullRead(const int* p, int* out) { out[0] = p[threadIdx.x]; }

// Staging through shared memory with cp.async (sm_80, cuda_pipeline.h): each
// block copies tiles of 128 floats, two in flight, the tail's missing elements
// zero-filled without reading them; out[i] = tile[i] + tile[i + 1 mod 128].
extern "C" __global__ void async_tiles(const float* in, float* out, int n) {
  __shared__ float stage[2][128];
  const int t = threadIdx.x;
  auto fetch = [&](int base, int k) {
    const bool inside = base + t < n;
    __pipeline_memcpy_async(&stage[k][t], inside ? &in[base + t] : in, sizeof(float), inside ? 0 : sizeof(float));
    __pipeline_commit();
  };
  const int stride = gridDim.x * 128;
  int base = blockIdx.x * 128, k = 0;
  if (base < n) fetch(base, 0);
  for (; base < n; base += stride, k ^= 1) {
    if (base + stride < n) {
      fetch(base + stride, k ^ 1);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    if (base + t < n) out[base + t] = stage[k][t] + stage[k][(t + 1) & 127];
    __syncthreads();
  }
}
