// SPDX-License-Identifier: Apache-2.0
// Kernels of checkpoint_client (compiled to PTX by nvcc at build time): integer
// arithmetic only, so every run, and every restored run, computes the same bits.
extern "C" {

// Module globals a restore must bring back with their contents: `salt` is
// written once by the host (cuModuleGetGlobal + cuMemcpyHtoD) and read by
// every mix; `launches` counts the kernels that ran, and the host prints it;
// `spread` is __constant__ data the host writes once and mix reads at an index
// it computes (validator twins, in a module of their own, must read the
// program's: docs/twins.md).
__device__ unsigned long long launches;
__device__ unsigned int salt;
__constant__ unsigned int spread[8];

// state[i] = f(state[i], input[i]): one iteration of a worker's work.
__global__ void mix(unsigned int* state, const unsigned int* input, int n, unsigned int tag) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) atomicAdd(&launches, 1ull);
  if (i >= n) return;
  unsigned int v = (state[i] ^ input[i]) * 0x9e3779b1u + salt + tag + spread[(state[i] + i) & 7];
  state[i] = v ^ (v >> 16);
}

// `rounds` steps of a hash chain on every word: the long-running kernel of
// --inflight, queued many times before one synchronizing call.
__global__ void churn(unsigned int* state, int n, int rounds) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) atomicAdd(&launches, 1ull);
  if (i >= n) return;
  unsigned int v = state[i];
  for (int r = 0; r < rounds; ++r) {
    v = v * 1664525u + 1013904223u;
    v ^= v >> 13;
  }
  state[i] = v;
}

// out[i] = state[i] ^ state[i + half]: the consumer of --events, on another
// stream than the one that wrote `state`, ordered after it by an event only.
__global__ void fold(const unsigned int* state, unsigned int* out, int half) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) atomicAdd(&launches, 1ull);
  if (i < half) out[i] = state[i] ^ state[i + half];
}

}  // extern "C"
