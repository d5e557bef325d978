// SPDX-License-Identifier: Apache-2.0
// A loop whose step is a captured graph holding a cooperative launch (two
// phases with cooperative groups' grid.sync() between them) and a kernel node
// given a launch attribute (a priority) after the capture. A restore must
// make the nodes again with their attributes: the cooperative kernel's
// grid.sync() has no grid workspace in a plain launch. Prints per step a
// checksum of the state, then the priority the node answers and OK; all
// deterministic, so a restored run prints the same bytes as an uninterrupted
// one.
//   graph_coop [--steps N] [--sleep-ms MS]
#include <cooperative_groups.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

namespace cg = cooperative_groups;

constexpr int kBlocks = 4;
constexpr int kThreads = 128;
constexpr int kN = 8192;

// Each block sums its share of x into partial[block]; after the grid-wide
// barrier every thread folds the same total (summed in block order) into x.
__global__ void twoPhase(float* x, float* partial, int n) {
  cg::grid_group grid = cg::this_grid();
  __shared__ float sums[kThreads];
  float v = 0;
  for (int i = static_cast<int>(grid.thread_rank()); i < n; i += static_cast<int>(grid.size())) {
    v += x[i];
  }
  sums[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sums[threadIdx.x] += sums[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
  grid.sync();
  float total = 0;
  for (int b = 0; b < static_cast<int>(gridDim.x); ++b) total += partial[b];
  for (int i = static_cast<int>(grid.thread_rank()); i < n; i += static_cast<int>(grid.size())) {
    x[i] = x[i] * 0.5f + total * 0.001f + static_cast<float>(i % 7);
  }
}

__global__ void bump(float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    x[i] += 1.0f;
  }
}

int main(int argc, char** argv) {
  int steps = 12, sleepMs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::atoi(argv[i + 1]);
  }
  float *x = nullptr, *partial = nullptr;
  CHECK(cudaMalloc(&x, kN * sizeof(float)));
  CHECK(cudaMalloc(&partial, kBlocks * sizeof(float)));
  std::vector<float> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = static_cast<float>(i % 13) * 0.25f;
  CHECK(cudaMemcpy(x, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
  // A pageable upload may still be in flight when cudaMemcpy returns, and the
  // non-blocking streams below do not wait for the legacy stream.
  CHECK(cudaDeviceSynchronize());
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  int n = kN;
  void* args[] = {&x, &partial, &n};
  CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(twoPhase), kBlocks, kThreads, args, 0,
                                    stream));
  bump<<<2, 64, 0, stream>>>(x, kN);
  CHECK(cudaStreamEndCapture(stream, &graph));
  // The bump node (the one not cooperative) gets a priority.
  size_t count = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  cudaGraphNode_t bumpNode = nullptr;
  int cooperativeNodes = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaLaunchAttributeValue v{};
    CHECK(cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeCooperative, &v));
    if (v.cooperative != 0) {
      ++cooperativeNodes;
    } else {
      bumpNode = node;
    }
  }
  if (count != 2 || cooperativeNodes != 1 || bumpNode == nullptr) {
    std::printf("the capture made %zu nodes, %d cooperative: WRONG\n", count, cooperativeNodes);
    return 1;
  }
  // The device's highest priority (-5 on vgpu and an H200): NVIDIA's driver
  // clamps one outside the range the device reports.
  int least = 0, greatest = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaLaunchAttributeValue priority{};
  priority.priority = greatest;
  CHECK(cudaGraphKernelNodeSetAttribute(bumpNode, cudaLaunchAttributePriority, &priority));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (int s = 0; s < steps; ++s) {
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaMemcpyAsync(host.data(), x, kN * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::printf("step %d state %016llx\n", s, checksum(host.data(), host.size() * sizeof(float)));
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  cudaLaunchAttributeValue got{};
  CHECK(cudaGraphKernelNodeGetAttribute(bumpNode, cudaLaunchAttributePriority, &got));
  std::printf("bump priority %d %s\n", got.priority, got.priority == greatest ? "OK" : "WRONG");
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  return got.priority == greatest ? 0 : 1;
}
