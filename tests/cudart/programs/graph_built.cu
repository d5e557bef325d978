// SPDX-License-Identifier: Apache-2.0
// A training loop on a CUDA graph built node by node with the explicit API,
// as NVIDIA's simpleCudaGraphs and jacobiCudaGraphs samples build theirs:
// linear regression with momentum, one step a graph of a memset (the loss
// cleared), the gradient and the momentum's decay side by side, the update,
// a copy of the loss into pinned memory and a host node that keeps it in the
// program's history; one more kernel node that would spoil the weights is
// disabled in the executable graph. Between steps the executable graph is
// changed the two ways the samples change theirs: the decay's factor with
// cudaGraphExecKernelNodeSetParams, the learning rate in the graph and then
// cudaGraphExecUpdate. Each step must give, bit for bit, the loss of the
// same step run on a stream; the changes for step i+1 are made right after
// step i, so a checkpoint between steps holds an executable graph that no
// longer matches its graph as instantiated. Deterministic, so that a
// restored run prints the same bytes as an uninterrupted one.
//   graph_built [--steps N] [--sleep-ms MS] [--child-graph] [--child-handle] [--pageable-copy]
// (--child-graph: the loss's copy is the node of a child graph;
// --child-handle: the program also asks for that child graph's handle;
// --pageable-copy: the loss is copied into pageable memory, which CUDA
// allows in a copy node. PhOS refuses a checkpoint of the second and the
// call of the third.)
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kFeatures = 32;
constexpr int kSamples = 256;

__global__ void gradient(const float* x, const float* y, const float* w, float* grad, float* loss) {
  int f = threadIdx.x;
  float g = 0, l = 0;
  for (int i = 0; i < kSamples; ++i) {
    float pred = 0;
    for (int k = 0; k < kFeatures; ++k) pred += x[i * kFeatures + k] * w[k];
    float err = pred - y[i];
    g += err * x[i * kFeatures + f];
    l += err * err;
  }
  grad[f] = 2 * g / kSamples;
  if (f == 0) *loss += l / kSamples;
}

__global__ void decay(float* momentum, float factor) {
  momentum[threadIdx.x] *= factor;
}

__global__ void update(float* w, float* momentum, const float* grad, float rate) {
  momentum[threadIdx.x] += grad[threadIdx.x];
  w[threadIdx.x] -= rate * momentum[threadIdx.x];
}

__global__ void spoil(float* w) {
  w[threadIdx.x] += 100.0f;
}

struct State {
  float *x, *y, *w, *momentum, *grad, *loss;
};

float factorOf(int step) {
  return 0.5f + 0.02f * static_cast<float>(step % 7);
}
float rateOf(int step) {
  return 0.05f / (1.0f + 0.1f * static_cast<float>(step));
}

// The history the graph's host node appends to: the program's own memory.
struct History {
  const float* loss = nullptr;  // pinned
  std::vector<float> values;
};
void CUDART_CB keepLoss(void* data) {
  auto* h = static_cast<History*>(data);
  h->values.push_back(*h->loss);
}

void reset(const State& s, cudaStream_t stream) {
  CHECK(cudaMemsetAsync(s.w, 0, kFeatures * sizeof(float), stream));
  CHECK(cudaMemsetAsync(s.momentum, 0, kFeatures * sizeof(float), stream));
  CHECK(cudaStreamSynchronize(stream));
}

int main(int argc, char** argv) {
  int steps = 20, sleepMs = 0;
  bool pageable = false, child = false, childHandle = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0 && i + 1 < argc) sleepMs = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--pageable-copy") == 0) pageable = true;
    if (std::strcmp(argv[i], "--child-graph") == 0) child = true;
    if (std::strcmp(argv[i], "--child-handle") == 0) child = childHandle = true;
  }
  std::vector<float> x(kSamples * kFeatures), y(kSamples);
  unsigned seed = 777;
  for (int i = 0; i < kSamples; ++i) {
    float t = 0;
    for (int k = 0; k < kFeatures; ++k) {
      seed = seed * 1103515245u + 12345u;
      x[i * kFeatures + k] = ((seed >> 8) % 2000) / 1000.0f - 1.0f;
      t += x[i * kFeatures + k] * ((k % 5) * 0.25f - 0.5f);
    }
    y[i] = t;
  }
  State s;
  CHECK(cudaMalloc(&s.x, x.size() * sizeof(float)));
  CHECK(cudaMalloc(&s.y, y.size() * sizeof(float)));
  CHECK(cudaMalloc(&s.w, kFeatures * sizeof(float)));
  CHECK(cudaMalloc(&s.momentum, kFeatures * sizeof(float)));
  CHECK(cudaMalloc(&s.grad, kFeatures * sizeof(float)));
  CHECK(cudaMalloc(&s.loss, sizeof(float)));
  CHECK(cudaMemcpy(s.x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(s.y, y.data(), y.size() * sizeof(float), cudaMemcpyHostToDevice));
  // A pageable upload may still be in flight when cudaMemcpy returns, and the
  // non-blocking streams below do not wait for the legacy stream.
  CHECK(cudaDeviceSynchronize());
  float* hostLoss = nullptr;
  static float pageableLoss = 0;
  if (pageable) {
    hostLoss = &pageableLoss;
  } else {
    CHECK(cudaMallocHost(&hostLoss, sizeof(float)));
  }
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // The reference: the steps launched on the stream.
  reset(s, stream);
  std::vector<float> direct;
  for (int i = 0; i < steps; ++i) {
    CHECK(cudaMemsetAsync(s.loss, 0, sizeof(float), stream));
    gradient<<<1, kFeatures, 0, stream>>>(s.x, s.y, s.w, s.grad, s.loss);
    decay<<<1, kFeatures, 0, stream>>>(s.momentum, factorOf(i));
    update<<<1, kFeatures, 0, stream>>>(s.w, s.momentum, s.grad, rateOf(i));
    CHECK(cudaMemcpyAsync(hostLoss, s.loss, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    direct.push_back(*hostLoss);
  }

  // The step as a graph, node by node.
  reset(s, stream);
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphNode_t clear, grad, dec, upd, copy, host, spoiler;
  cudaMemsetParams m = {};
  m.dst = s.loss;
  m.value = 0;
  m.elementSize = 4;
  m.width = 1;
  m.height = 1;
  CHECK(cudaGraphAddMemsetNode(&clear, graph, nullptr, 0, &m));
  void* gradArgs[] = {&s.x, &s.y, &s.w, &s.grad, &s.loss};
  cudaKernelNodeParams k = {};
  k.func = reinterpret_cast<void*>(gradient);
  k.gridDim = dim3(1);
  k.blockDim = dim3(kFeatures);
  k.kernelParams = gradArgs;
  CHECK(cudaGraphAddKernelNode(&grad, graph, &clear, 1, &k));
  float factor = factorOf(0);
  void* decayArgs[] = {&s.momentum, &factor};
  cudaKernelNodeParams d = k;
  d.func = reinterpret_cast<void*>(decay);
  d.kernelParams = decayArgs;
  CHECK(cudaGraphAddKernelNode(&dec, graph, nullptr, 0, &d));
  float rate = rateOf(0);
  void* updateArgs[] = {&s.w, &s.momentum, &s.grad, &rate};
  cudaKernelNodeParams u = k;
  u.func = reinterpret_cast<void*>(update);
  u.kernelParams = updateArgs;
  cudaGraphNode_t updateAfter[] = {grad, dec};
  CHECK(cudaGraphAddKernelNode(&upd, graph, updateAfter, 2, &u));
  if (child) {
    // The copy in a graph of its own, which the node clones.
    cudaGraph_t inner;
    cudaGraphNode_t innerCopy;
    CHECK(cudaGraphCreate(&inner, 0));
    CHECK(cudaGraphAddMemcpyNode1D(&innerCopy, inner, nullptr, 0, hostLoss, s.loss, sizeof(float),
                                   cudaMemcpyDeviceToHost));
    CHECK(cudaGraphAddChildGraphNode(&copy, graph, &upd, 1, inner));
    CHECK(cudaGraphDestroy(inner));
    if (childHandle) {
      cudaGraph_t embedded;
      CHECK(cudaGraphChildGraphNodeGetGraph(copy, &embedded));
      size_t innerNodes = 0;
      CHECK(cudaGraphGetNodes(embedded, nullptr, &innerNodes));
      if (innerNodes != 1) {
        std::printf("MISMATCH: the child graph holds %zu nodes\n", innerNodes);
        return 1;
      }
    }
  } else {
    CHECK(cudaGraphAddMemcpyNode1D(&copy, graph, &upd, 1, hostLoss, s.loss, sizeof(float),
                                   cudaMemcpyDeviceToHost));
  }
  History history;
  history.loss = hostLoss;
  cudaHostNodeParams h = {keepLoss, &history};
  CHECK(cudaGraphAddHostNode(&host, graph, &copy, 1, &h));
  void* spoilArgs[] = {&s.w};
  cudaKernelNodeParams sp = k;
  sp.func = reinterpret_cast<void*>(spoil);
  sp.kernelParams = spoilArgs;
  CHECK(cudaGraphAddKernelNode(&spoiler, graph, &upd, 1, &sp));

  size_t nodes = 0, edges = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  cudaGraphNode_t roots[4] = {};
  size_t rootCount = 4;
  CHECK(cudaGraphGetRootNodes(graph, roots, &rootCount));
  if (nodes != 7 || edges != 6 || rootCount != 2 || roots[2] != nullptr) {
    std::printf("MISMATCH: %zu nodes, %zu edges, %zu roots\n", nodes, edges, rootCount);
    return 1;
  }
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphNodeSetEnabled(exec, spoiler, 0));

  for (int i = 0; i < steps; ++i) {
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    if (std::memcmp(hostLoss, &direct[i], sizeof(float)) != 0 || history.values.size() != 1 ||
        std::memcmp(&history.values[0], hostLoss, sizeof(float)) != 0) {
      std::printf("MISMATCH: step %d loss %.9g, on the stream %.9g, %zu kept\n", i, *hostLoss,
                  direct[i], history.values.size());
      return 1;
    }
    history.values.clear();
    // The next step's decay, in the executable graph only.
    factor = factorOf(i + 1);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, dec, &d));
    // The next step's rate, in the graph, then the executable graph updated from it.
    rate = rateOf(i + 1);
    CHECK(cudaGraphKernelNodeSetParams(upd, &u));
    cudaKernelNodeParams asked = {};
    CHECK(cudaGraphKernelNodeGetParams(upd, &asked));
    if (asked.kernelParams == nullptr ||
        std::memcmp(asked.kernelParams[3], &rate, sizeof(float)) != 0) {
      std::printf("MISMATCH: the update node does not hold its new rate\n");
      return 1;
    }
    cudaGraphExecUpdateResultInfo result = {};
    CHECK(cudaGraphExecUpdate(exec, graph, &result));
    // The update took the graph's decay factor of step 0 back: set it again.
    CHECK(cudaGraphExecKernelNodeSetParams(exec, dec, &d));
    CHECK(cudaGraphNodeSetEnabled(exec, spoiler, 0));
    std::printf("step %d loss %.9g\n", i, *hostLoss);
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  std::vector<float> w(kFeatures);
  CHECK(cudaMemcpy(w.data(), s.w, kFeatures * sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("graph_built OK, weights checksum %016llx\n",
              checksum(w.data(), w.size() * sizeof(float)));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return 0;
}
