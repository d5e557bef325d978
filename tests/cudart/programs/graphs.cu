// SPDX-License-Identifier: Apache-2.0
// CUDA graphs as a training loop uses them: one step (two kernels on two
// streams forked and joined with events, a reduction and a copy back) captured
// once and replayed, checked against the same step run on the streams; and a
// graph built node by node with the explicit API.
#include <cstring>
#include <vector>

#include "common.h"

__global__ void axpy(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void decay(float* x, float f, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * f + 0.25f;
}

__global__ void total(const float* y, float* out, int n) {
  __shared__ float part[256];
  float s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += y[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = part[0];
}

struct Buffers {
  float *x, *y, *sum;
};

// One step: x decays on the side stream while y = 0.5 x + y waits for it,
// then the sum of y goes to `host`.
void step(const Buffers& b, int n, cudaStream_t main, cudaStream_t side, cudaEvent_t fork, cudaEvent_t join,
          float* host) {
  CHECK(cudaEventRecord(fork, main));
  CHECK(cudaStreamWaitEvent(side, fork, 0));
  decay<<<(n + 255) / 256, 256, 0, side>>>(b.x, 0.75f, n);
  CHECK(cudaEventRecord(join, side));
  CHECK(cudaStreamWaitEvent(main, join, 0));
  axpy<<<(n + 255) / 256, 256, 0, main>>>(b.y, b.x, 0.5f, n);
  total<<<1, 256, 0, main>>>(b.y, b.sum, n);
  CHECK(cudaMemcpyAsync(host, b.sum, sizeof(float), cudaMemcpyDeviceToHost, main));
}

void reset(const Buffers& b, int n, cudaStream_t s) {
  std::vector<float> init(n);
  for (int i = 0; i < n; ++i) init[i] = static_cast<float>(i % 17) * 0.5f;
  CHECK(cudaMemcpy(b.x, init.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemsetAsync(b.y, 0, n * sizeof(float), s));
  CHECK(cudaStreamSynchronize(s));
}

int main() {
  const int n = 1 << 14, steps = 6;
  Buffers b;
  CHECK(cudaMalloc(&b.x, n * sizeof(float)));
  CHECK(cudaMalloc(&b.y, n * sizeof(float)));
  CHECK(cudaMalloc(&b.sum, sizeof(float)));
  float* host = nullptr;
  CHECK(cudaMallocHost(&host, sizeof(float)));
  cudaStream_t main, side;
  CHECK(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  // The steps run on the streams: the reference.
  reset(b, n, main);
  std::vector<float> direct;
  for (int s = 0; s < steps; ++s) {
    step(b, n, main, side, fork, join, host);
    CHECK(cudaStreamSynchronize(main));
    direct.push_back(*host);
  }

  // The same step captured once and launched `steps` times.
  reset(b, n, main);
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(main, cudaStreamCaptureModeGlobal));
  step(b, n, main, side, fork, join, host);
  CHECK(cudaStreamEndCapture(main, &graph));
  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> replayed;
  for (int s = 0; s < steps; ++s) {
    CHECK(cudaGraphLaunch(exec, main));
    CHECK(cudaStreamSynchronize(main));
    replayed.push_back(*host);
  }
  if (nodes != 4 || std::memcmp(direct.data(), replayed.data(), steps * sizeof(float)) != 0) {
    std::printf("MISMATCH: %zu nodes; step 0 %.6f against %.6f\n", nodes, direct[0], replayed[0]);
    return 1;
  }

  // A graph built node by node: y = 2 x + y after a memset of y, then the sum.
  reset(b, n, main);
  cudaGraph_t built;
  CHECK(cudaGraphCreate(&built, 0));
  cudaGraphNode_t clear, scaled, summed;
  cudaMemsetParams m = {};
  m.dst = b.y;
  m.value = 0;
  m.elementSize = 4;
  m.width = n;
  m.height = 1;
  CHECK(cudaGraphAddMemsetNode(&clear, built, nullptr, 0, &m));
  float a = 2.0f;
  int count = n;
  void* axpyArgs[] = {&b.y, &b.x, &a, &count};
  cudaKernelNodeParams k = {};
  k.func = reinterpret_cast<void*>(axpy);
  k.gridDim = dim3((n + 255) / 256);
  k.blockDim = dim3(256);
  k.kernelParams = axpyArgs;
  CHECK(cudaGraphAddKernelNode(&scaled, built, &clear, 1, &k));
  void* totalArgs[] = {&b.y, &b.sum, &count};
  k.func = reinterpret_cast<void*>(total);
  k.gridDim = dim3(1);
  k.kernelParams = totalArgs;
  CHECK(cudaGraphAddKernelNode(&summed, built, &scaled, 1, &k));
  cudaGraphExec_t builtExec;
  CHECK(cudaGraphInstantiate(&builtExec, built, 0));
  CHECK(cudaGraphLaunch(builtExec, main));
  CHECK(cudaMemcpyAsync(host, b.sum, sizeof(float), cudaMemcpyDeviceToHost, main));
  CHECK(cudaStreamSynchronize(main));
  double expected = 0;
  for (int i = 0; i < n; ++i) expected += 2.0 * (static_cast<float>(i % 17) * 0.5f);
  if (*host != static_cast<float>(expected)) {
    std::printf("MISMATCH: built graph sums %.3f, expected %.3f\n", *host, expected);
    return 1;
  }

  std::printf("graphs OK %zu nodes, %d steps replayed, last sum %.6f, built %.1f\n", nodes, steps, replayed.back(),
              *host);
  CHECK(cudaGraphExecDestroy(builtExec));
  CHECK(cudaGraphDestroy(built));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return 0;
}
