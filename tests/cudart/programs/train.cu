// SPDX-License-Identifier: Apache-2.0
// A small training loop: linear regression by gradient descent on the GPU,
// printing its loss every step. Deterministic (a fixed-order reduction), so
// that a restored run prints the same bytes as an uninterrupted one.
//   train [--steps N] [--sleep-ms MS]
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kFeatures = 32;

// State outside cudaMalloc: a step counter the step kernel keeps, and the
// learning rate in constant memory (module globals of nvcc's fatbin).
__device__ int gSteps;
__constant__ float kLearningRate;

__global__ void gradient(const float* x, const float* y, const float* w, float* grad, float* loss, int n) {
  // One block: each thread owns a feature and walks the samples in order.
  int f = threadIdx.x;
  float g = 0, l = 0;
  for (int i = 0; i < n; ++i) {
    float pred = 0;
    for (int k = 0; k < kFeatures; ++k) pred += x[i * kFeatures + k] * w[k];
    float err = pred - y[i];
    g += err * x[i * kFeatures + f];
    l += err * err;
  }
  grad[f] = 2 * g / n;
  if (f == 0) *loss = l / n;
}

__global__ void step(float* w, const float* grad) {
  w[threadIdx.x] -= kLearningRate * grad[threadIdx.x];
  if (threadIdx.x == 0) gSteps += 1;
}

int main(int argc, char** argv) {
  int steps = 20, sleepMs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::atoi(argv[i + 1]);
  }
  const int n = 256;
  std::vector<float> x(n * kFeatures), y(n), truth(kFeatures);
  for (int k = 0; k < kFeatures; ++k) truth[k] = (k % 5) * 0.25f - 0.5f;
  unsigned seed = 12345;
  for (int i = 0; i < n; ++i) {
    float t = 0;
    for (int k = 0; k < kFeatures; ++k) {
      seed = seed * 1103515245u + 12345u;
      x[i * kFeatures + k] = ((seed >> 8) % 2000) / 1000.0f - 1.0f;
      t += x[i * kFeatures + k] * truth[k];
    }
    y[i] = t;
  }
  float *dx, *dy, *dw, *dgrad, *dloss;
  CHECK(cudaMalloc(&dx, x.size() * sizeof(float)));
  CHECK(cudaMalloc(&dy, y.size() * sizeof(float)));
  CHECK(cudaMalloc(&dw, kFeatures * sizeof(float)));
  CHECK(cudaMalloc(&dgrad, kFeatures * sizeof(float)));
  CHECK(cudaMalloc(&dloss, sizeof(float)));
  CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dy, y.data(), y.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dw, 0, kFeatures * sizeof(float)));
  const float lr = 0.1f;
  CHECK(cudaMemcpyToSymbol(kLearningRate, &lr, sizeof(lr)));
  for (int s = 0; s < steps; ++s) {
    gradient<<<1, kFeatures>>>(dx, dy, dw, dgrad, dloss, n);
    step<<<1, kFeatures>>>(dw, dgrad);
    float loss = 0;
    int done = 0;
    CHECK(cudaMemcpy(&loss, dloss, sizeof(loss), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyFromSymbol(&done, gSteps, sizeof(done)));
    std::printf("step %d loss %.9g steps on the device %d\n", s, loss, done);
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  std::vector<float> w(kFeatures);
  CHECK(cudaMemcpy(w.data(), dw, kFeatures * sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("weights checksum %016llx\n", checksum(w.data(), w.size() * sizeof(float)));
  return 0;
}
