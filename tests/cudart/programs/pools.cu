// SPDX-License-Identifier: Apache-2.0
// Stream-ordered allocation, as PyTorch's cudaMallocAsync backend and CuPy's
// MemoryAsyncPool use it: the state of a running sum lives in memory from
// the device's default pool; every step allocates scratch from a pool of its
// own (with a release threshold and a size limit), fills it with a kernel,
// folds it into the state and frees it in stream order. Prints per step a
// checksum of the state and what the pools count, all deterministic, so a
// restored run prints the same bytes as an uninterrupted one.
//   pools [--steps N] [--sleep-ms MS]
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kWords = 1 << 16;

__global__ void fill(unsigned* scratch, unsigned step, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    scratch[i] = (static_cast<unsigned>(i) * 2654435761u) ^ (step * 40503u + 7u);
  }
}

__global__ void fold(unsigned* state, const unsigned* scratch, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    state[i] = state[i] * 31u + scratch[i];
  }
}

unsigned long long poolBytes(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  unsigned long long v = 0;
  CHECK(cudaMemPoolGetAttribute(pool, attr, &v));
  return v;
}

int main(int argc, char** argv) {
  int steps = 12, sleepMs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::atoi(argv[i + 1]);
  }
  int device = 0;
  CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  cudaMemPool_t defaultPool;
  CHECK(cudaDeviceGetDefaultMemPool(&defaultPool, device));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  props.maxSize = 64u << 20;
  cudaMemPool_t scratchPool;
  CHECK(cudaMemPoolCreate(&scratchPool, &props));
  unsigned long long threshold = 16u << 20;
  CHECK(cudaMemPoolSetAttribute(scratchPool, cudaMemPoolAttrReleaseThreshold, &threshold));

  unsigned* state = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&state), kWords * sizeof(unsigned), stream));
  CHECK(cudaMemsetAsync(state, 0, kWords * sizeof(unsigned), stream));
  std::vector<unsigned> host(kWords);
  for (int s = 0; s < steps; ++s) {
    // Two scratch buffers a step, of sizes that change: the pool reuses and
    // returns memory as the frees complete.
    unsigned *a = nullptr, *b = nullptr;
    CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&a), kWords * sizeof(unsigned), scratchPool, stream));
    CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&b), (1 + s % 3) * 4096, scratchPool, stream));
    fill<<<32, 128, 0, stream>>>(a, static_cast<unsigned>(s), kWords);
    CHECK(cudaMemsetAsync(b, s, (1 + s % 3) * 4096, stream));
    fold<<<32, 128, 0, stream>>>(state, a, kWords);
    const unsigned long long usedDuring = poolBytes(scratchPool, cudaMemPoolAttrUsedMemCurrent);
    CHECK(cudaFreeAsync(a, stream));
    CHECK(cudaFreeAsync(b, stream));
    CHECK(cudaMemcpyAsync(host.data(), state, kWords * sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::printf("step %d state %016llx scratch used %llu then %llu, high %llu; state pool used %llu\n", s,
                checksum(host.data(), host.size() * sizeof(unsigned)), usedDuring,
                poolBytes(scratchPool, cudaMemPoolAttrUsedMemCurrent),
                poolBytes(scratchPool, cudaMemPoolAttrUsedMemHigh),
                poolBytes(defaultPool, cudaMemPoolAttrUsedMemCurrent));
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  // Beyond the pool's limit: refused, and nothing leaks.
  void* tooBig = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(&tooBig, 65u << 20, scratchPool, stream);
  std::printf("over the limit: %s\n", cudaGetErrorName(e));
  (void)cudaGetLastError();
  cudaPointerAttributes attributes{};
  CHECK(cudaPointerGetAttributes(&attributes, state));
  std::printf("state is device memory: %d\n", attributes.type == cudaMemoryTypeDevice);
  CHECK(cudaFreeAsync(state, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemPoolDestroy(scratchPool));
  CHECK(cudaStreamDestroy(stream));
  std::printf("pools OK\n");
  return 0;
}
