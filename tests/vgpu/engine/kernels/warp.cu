// SPDX-License-Identifier: Apache-2.0
// Warp-synchronous primitives: shuffles, votes, match, activemask.
extern "C" __global__ void shuffles(const int* in, int* up, int* down, int* xr, int* idx,
                                    int* seg) {
  int t = threadIdx.x;
  int v = in[t];
  up[t] = __shfl_up_sync(0xffffffffu, v, 3);
  down[t] = __shfl_down_sync(0xffffffffu, v, 5);
  xr[t] = __shfl_xor_sync(0xffffffffu, v, 9);
  idx[t] = __shfl_sync(0xffffffffu, v, (t * 7) & 31);
  seg[t] = __shfl_sync(0xffffffffu, v, 2, 8) + __shfl_down_sync(0xffffffffu, v, 3, 8) * 1000;
}

extern "C" __global__ void votes(const int* in, unsigned* ballot, int* all, int* any,
                                 unsigned* matchAny, unsigned* partialBallot) {
  int t = threadIdx.x;
  int v = in[t];
  ballot[t] = __ballot_sync(0xffffffffu, v > 10);
  all[t] = __all_sync(0xffffffffu, v > 0);
  any[t] = __any_sync(0xffffffffu, v > 40);
  matchAny[t] = __match_any_sync(0xffffffffu, v & 3);
  unsigned pb = 0;
  if (t & 1) pb = __ballot_sync(0xaaaaaaaau, v > 5);
  partialBallot[t] = pb;
}

extern "C" __global__ void reduxOps(const unsigned* in, unsigned* out) {
  unsigned v = in[threadIdx.x];
  out[threadIdx.x * 3] = __reduce_add_sync(0xffffffffu, v);
  out[threadIdx.x * 3 + 1] = __reduce_max_sync(0xffffffffu, v);
  out[threadIdx.x * 3 + 2] = __reduce_or_sync(0xffffffffu, v);
}
