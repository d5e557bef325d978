// SPDX-License-Identifier: Apache-2.0
// A training loop that replays a captured CUDA graph, as PyTorch's
// torch.cuda.graphs and CuPy's capture do: linear regression with momentum,
// one step captured once (the gradient on the main stream while the momentum
// decays on a side stream, forked and joined with events; the update; the
// loss copied into pinned memory) and launched every step. The same steps
// are first run on the streams themselves, and each replayed step must
// give their loss bit for bit. Deterministic, so that a restored run prints
// the same bytes as an uninterrupted one.
//   graph_train [--steps N] [--sleep-ms MS] [--hold-capture-ms MS]
// (--hold-capture-ms: says "capturing" and waits that long before the
// capture ends, for a checkpoint to find it in progress.)
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kFeatures = 32;
constexpr int kSamples = 256;

__device__ int gSteps;  // kept by the update kernel: state outside cudaMalloc

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
  if (f == 0) *loss = l / kSamples;
}

__global__ void decay(float* momentum) { momentum[threadIdx.x] *= 0.5f; }

__global__ void update(float* w, float* momentum, const float* grad) {
  momentum[threadIdx.x] += grad[threadIdx.x];
  w[threadIdx.x] -= 0.05f * momentum[threadIdx.x];
  if (threadIdx.x == 0) gSteps += 1;
}

struct State {
  float *x, *y, *w, *momentum, *grad, *loss;
};

// One step, enqueued on `main` with a fork to `side`; the loss goes to `host`.
void step(const State& s, cudaStream_t main, cudaStream_t side, cudaEvent_t fork, cudaEvent_t join, float* host) {
  CHECK(cudaEventRecord(fork, main));
  CHECK(cudaStreamWaitEvent(side, fork, 0));
  decay<<<1, kFeatures, 0, side>>>(s.momentum);
  CHECK(cudaEventRecord(join, side));
  gradient<<<1, kFeatures, 0, main>>>(s.x, s.y, s.w, s.grad, s.loss);
  CHECK(cudaStreamWaitEvent(main, join, 0));
  update<<<1, kFeatures, 0, main>>>(s.w, s.momentum, s.grad);
  CHECK(cudaMemcpyAsync(host, s.loss, sizeof(float), cudaMemcpyDeviceToHost, main));
}

void reset(const State& s, cudaStream_t main) {
  CHECK(cudaMemsetAsync(s.w, 0, kFeatures * sizeof(float), main));
  CHECK(cudaMemsetAsync(s.momentum, 0, kFeatures * sizeof(float), main));
  CHECK(cudaStreamSynchronize(main));
  const int zero = 0;
  CHECK(cudaMemcpyToSymbol(gSteps, &zero, sizeof(zero)));
}

int main(int argc, char** argv) {
  int steps = 20, sleepMs = 0, holdMs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--hold-capture-ms") == 0) holdMs = std::atoi(argv[i + 1]);
  }
  std::vector<float> x(kSamples * kFeatures), y(kSamples);
  unsigned seed = 4242;
  for (int i = 0; i < kSamples; ++i) {
    float t = 0;
    for (int k = 0; k < kFeatures; ++k) {
      seed = seed * 1103515245u + 12345u;
      x[i * kFeatures + k] = ((seed >> 8) % 2000) / 1000.0f - 1.0f;
      t += x[i * kFeatures + k] * ((k % 7) * 0.125f - 0.375f);
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
  float* host = nullptr;
  CHECK(cudaMallocHost(&host, sizeof(float)));
  cudaStream_t main, side;
  CHECK(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  // The reference: the steps run on the streams.
  reset(s, main);
  std::vector<float> direct;
  for (int i = 0; i < steps; ++i) {
    step(s, main, side, fork, join, host);
    CHECK(cudaStreamSynchronize(main));
    direct.push_back(*host);
  }

  // The step captured once, checked to be a capture while it lasts.
  reset(s, main);
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(main, cudaStreamCaptureModeGlobal));
  step(s, main, side, fork, join, host);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  CHECK(cudaStreamGetCaptureInfo(side, &status, &id));
  if (status != cudaStreamCaptureStatusActive) {
    std::printf("MISMATCH: the side stream is not in the capture\n");
    return 1;
  }
  if (holdMs > 0) {
    std::printf("capturing\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(holdMs));
  }
  CHECK(cudaStreamEndCapture(main, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));  // the executable graph is what a loop keeps

  for (int i = 0; i < steps; ++i) {
    CHECK(cudaGraphLaunch(exec, main));
    CHECK(cudaStreamSynchronize(main));
    int done = 0;
    CHECK(cudaMemcpyFromSymbol(&done, gSteps, sizeof(done)));
    if (std::memcmp(host, &direct[i], sizeof(float)) != 0) {
      std::printf("MISMATCH: step %d loss %.9g, on the streams %.9g\n", i, *host, direct[i]);
      return 1;
    }
    std::printf("step %d loss %.9g steps on the device %d\n", i, *host, done);
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  std::vector<float> w(kFeatures);
  CHECK(cudaMemcpy(w.data(), s.w, kFeatures * sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("graph_train OK, weights checksum %016llx\n", checksum(w.data(), w.size() * sizeof(float)));
  CHECK(cudaGraphExecDestroy(exec));
  return 0;
}
