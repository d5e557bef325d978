// SPDX-License-Identifier: Apache-2.0
// Kernels for divergence/reconvergence, recursion, local memory and printf.
#include <cstdio>

// Data-dependent loops, break/continue and nested branches per lane.
extern "C" __global__ void collatz(const unsigned* in, unsigned* steps, unsigned* maxv) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned x = in[i];
  unsigned n = 0, m = x;
  while (x != 1) {
    if (x & 1) {
      x = 3 * x + 1;
    } else {
      x >>= 1;
      if (n > 1000) break;
    }
    if (x > m) m = x;
    ++n;
  }
  steps[i] = n;
  maxv[i] = m;
}

// Reconvergence check: after a divergent region every lane sees the full mask.
extern "C" __global__ void reconverge(unsigned* inside, unsigned* after) {
  unsigned lane = threadIdx.x & 31;
  unsigned v;
  if (lane % 3 == 0) {
    v = __activemask();
  } else if (lane % 3 == 1) {
    v = __activemask() | 0x80000000u;
  } else {
    for (unsigned k = 0; k < lane; ++k) __nanosleep(0);
    v = __activemask() ^ 1u;
  }
  inside[threadIdx.x] = v;
  __syncwarp();
  after[threadIdx.x] = __activemask();
}

extern "C" __global__ void earlyExit(int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (i % 5 == 0) { out[i] = -1; return; }
  int s = 0;
  for (int k = 0; k <= i % 7; ++k) {
    if (k == 3) continue;
    s += k * i;
  }
  out[i] = s;
}

__device__ __noinline__ int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__device__ __noinline__ unsigned long long ackLike(unsigned depth, unsigned long long acc) {
  unsigned long long local[8];
  for (int k = 0; k < 8; ++k) local[k] = acc * (k + 1) + depth;
  if (depth == 0) return local[acc & 7];
  return local[depth & 7] ^ ackLike(depth - 1, acc + local[(acc + depth) & 7]);
}

extern "C" __global__ void recursion(const int* n, int* fibOut, unsigned long long* ack) {
  int t = threadIdx.x;
  fibOut[t] = fib(n[t]);
  ack[t] = ackLike(t % 6, t);
}

// A local array indexed by data: lives in the .local depot.
extern "C" __global__ void localArray(const int* idx, int* out) {
  int a[32];
  int t = threadIdx.x;
  for (int k = 0; k < 32; ++k) a[k] = k * k + t;
  out[t] = a[idx[t] & 31] + a[(idx[t] >> 5) & 31];
}

extern "C" __global__ void hello(int base) {
  int t = threadIdx.x;
  if (t < 3) printf("thread %d: %d %5.2f %s %c %x %lld\n", t, base + t, 1.5 * t, "ok", 'A' + t,
                    255u + t, -1234567890123LL);
}
