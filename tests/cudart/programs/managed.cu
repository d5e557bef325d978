// SPDX-License-Identifier: Apache-2.0
// Managed memory as CUDA's introductions teach it (cudaMallocManaged, the
// host reading and writing the same pointers the kernels use), with the
// hints programs add (advice, prefetches, attaching to a stream), then a loop
// whose state lives in managed memory only: the host writes each step's input
// and reads the state back through the pointer, checking it against a CPU
// reference. Prints a checksum of the state every step.
//   managed [--steps N] [--sleep-ms MS]
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kN = 1 << 16;

__global__ void add(int n, const float* x, float* y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] = x[i] + y[i];
}

__global__ void relax(int n, float* state, const float* input, int step, int* counter) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    state[i] = state[i] * 0.5f + input[i] + static_cast<float>(step);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *counter += 1;
}

int main(int argc, char** argv) {
  int steps = 20, sleepMs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::atoi(argv[i + 1]);
  }
  int device = 0, managed = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, device));
  if (!managed) {
    std::fprintf(stderr, "device %d has no managed memory\n", device);
    return 1;
  }
  const size_t bytes = kN * sizeof(float);

  // The introduction's vector add: initialised and checked by the host.
  float *x, *y;
  CHECK(cudaMallocManaged(&x, bytes));
  CHECK(cudaMallocManaged(&y, bytes));
  for (int i = 0; i < kN; ++i) {
    x[i] = 1.0f;
    y[i] = 2.0f;
  }
  cudaMemLocation onDevice{};
  onDevice.type = cudaMemLocationTypeDevice;
  onDevice.id = device;
  CHECK(cudaMemAdvise(x, bytes, cudaMemAdviseSetReadMostly, onDevice));
  CHECK(cudaMemPrefetchAsync(x, bytes, onDevice, 0, nullptr));
  CHECK(cudaMemPrefetchAsync(y, bytes, onDevice, 0, nullptr));
  add<<<64, 256>>>(kN, x, y);
  CHECK(cudaDeviceSynchronize());
  float maxError = 0;
  for (int i = 0; i < kN; ++i) maxError = std::fmax(maxError, std::fabs(y[i] - 3.0f));
  int readMostly = 0;
  CHECK(cudaMemRangeGetAttribute(&readMostly, sizeof(readMostly), cudaMemRangeAttributeReadMostly, x, bytes));
  if (maxError != 0 || readMostly != 1) {
    std::fprintf(stderr, "vector add: max error %g, read-mostly %d\n", maxError, readMostly);
    return 1;
  }
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));

  // The loop: state, input and a counter in managed memory only.
  float *state, *input;
  int* counter;
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  CHECK(cudaMallocManaged(&state, bytes));
  CHECK(cudaMallocManaged(&input, bytes));
  CHECK(cudaMallocManaged(&counter, sizeof(int), cudaMemAttachHost));
  CHECK(cudaStreamAttachMemAsync(stream, counter, 0, cudaMemAttachSingle));
  CHECK(cudaMemset(state, 0, bytes));
  *counter = 0;
  std::vector<float> expected(kN, 0.0f);
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < kN; ++i) input[i] = static_cast<float>((i * (s + 1)) % 7) * 0.125f;
    relax<<<64, 256, 0, stream>>>(kN, state, input, s, counter);
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < kN; ++i) expected[i] = expected[i] * 0.5f + input[i] + static_cast<float>(s);
    if (std::memcmp(expected.data(), state, bytes) != 0 || *counter != s + 1) {
      std::fprintf(stderr, "step %d: the state differs from the CPU's (counter %d)\n", s, *counter);
      return 1;
    }
    std::printf("step %d state %016llx counter %d\n", s, checksum(state, bytes), *counter);
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  std::vector<float> copied(kN);
  CHECK(cudaMemcpy(copied.data(), state, bytes, cudaMemcpyDeviceToHost));
  std::printf("final state %016llx %s\n", checksum(copied.data(), bytes),
              std::memcmp(copied.data(), expected.data(), bytes) == 0 ? "OK" : "MISMATCH");
  CHECK(cudaFree(state));
  CHECK(cudaFree(input));
  CHECK(cudaFree(counter));
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
