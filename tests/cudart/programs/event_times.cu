// SPDX-License-Identifier: Apache-2.0
// Event timing across a checkpoint: events recorded once at the start keep
// their interval, and the time since the start only grows, in every step,
// however many restores happen in between. An event created with
// cudaEventDisableTiming gives no time. Prints per step a checksum of a
// buffer the kernels evolve and the verdicts, all deterministic, so a
// restored run prints the same bytes as an uninterrupted one.
//   event_times [--steps N] [--sleep-ms MS]
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kWords = 1 << 15;

__global__ void evolve(unsigned* a, unsigned step, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    a[i] = a[i] * 1103515245u + 12345u + step;
  }
}

int main(int argc, char** argv) {
  int steps = 12, sleepMs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::atoi(argv[i + 1]);
  }
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  unsigned* buffer = nullptr;
  CHECK(cudaMalloc(&buffer, kWords * sizeof(unsigned)));
  CHECK(cudaMemsetAsync(buffer, 0, kWords * sizeof(unsigned), stream));

  cudaEvent_t start, a, b, now, untimed;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventCreate(&now));
  CHECK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
  CHECK(cudaEventRecord(start, stream));
  evolve<<<16, 128, 0, stream>>>(buffer, 0, kWords);
  CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < 8; ++i) evolve<<<16, 128, 0, stream>>>(buffer, 100 + i, kWords);
  CHECK(cudaEventRecord(b, stream));
  CHECK(cudaEventRecord(untimed, stream));
  CHECK(cudaStreamSynchronize(stream));
  float interval = 0;
  CHECK(cudaEventElapsedTime(&interval, a, b));

  std::vector<unsigned> host(kWords);
  float last = 0;
  for (int s = 1; s <= steps; ++s) {
    evolve<<<16, 128, 0, stream>>>(buffer, static_cast<unsigned>(s), kWords);
    CHECK(cudaEventRecord(now, stream));
    CHECK(cudaMemcpyAsync(host.data(), buffer, kWords * sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    float ab = 0, ba = 0, since = 0, sinceB = 0, ignored = 0;
    CHECK(cudaEventElapsedTime(&ab, a, b));
    CHECK(cudaEventElapsedTime(&ba, b, a));
    CHECK(cudaEventElapsedTime(&since, start, now));
    CHECK(cudaEventElapsedTime(&sinceB, b, now));
    const cudaError_t untimedError = cudaEventElapsedTime(&ignored, untimed, now);
    const bool kept = ab == interval && ba == -interval;
    const bool grows = since >= last && since >= sinceB && sinceB >= 0;
    if (!kept || !grows) {
      std::fprintf(stderr, "step %d: interval %g then %g/%g; since start %g after %g, since b %g\n", s, interval,
                   ab, ba, since, last, sinceB);
    }
    last = since;
    std::printf("step %d buffer %016llx interval kept %s, time grows %s, untimed event: %s\n", s,
                checksum(host.data(), host.size() * sizeof(unsigned)), kept ? "yes" : "no", grows ? "yes" : "no",
                cudaGetErrorName(untimedError));
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  for (cudaEvent_t e : {start, a, b, now, untimed}) CHECK(cudaEventDestroy(e));
  CHECK(cudaFree(buffer));
  std::printf("OK\n");
  return 0;
}
