// SPDX-License-Identifier: Apache-2.0
// Kernel launch latency of a CUDA runtime program built with plain nvcc
// (static cudart, nvcc's fatbin): <<<>>> launches of an empty kernel, each
// asynchronous call timed in batches and as launch + synchronize round trips.
//   cudart_launch [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                                        \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

__global__ void empty() {}

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

int main(int argc, char** argv) {
  constexpr int kBatch = 5000, kBatches = 5, kRoundTrips = 3000;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < 1000; ++i) empty<<<1, 1, 0, stream>>>();
  CHECK(cudaStreamSynchronize(stream));
  std::vector<double> enqueue, perOp, roundTrip;
  for (int b = 0; b < kBatches; ++b) {
    const auto start = Clock::now();
    for (int i = 0; i < kBatch; ++i) {
      const auto t0 = Clock::now();
      empty<<<1, 1, 0, stream>>>();
      enqueue.push_back(us(Clock::now() - t0));
    }
    CHECK(cudaStreamSynchronize(stream));
    perOp.push_back(us(Clock::now() - start) / kBatch);
  }
  CHECK(cudaGetLastError());
  for (int i = 0; i < kRoundTrips; ++i) {
    const auto t0 = Clock::now();
    empty<<<1, 1, 0, stream>>>();
    CHECK(cudaStreamSynchronize(stream));
    roundTrip.push_back(us(Clock::now() - t0));
  }
  const double e = median(enqueue), p = median(perOp), r = median(roundTrip);
  std::printf("empty<<<1,1>>> (microseconds, median): enqueue %.2f, per op in batches of %d %.2f, "
              "launch+sync %.2f\n", e, kBatch, p, r);
  if (argc == 3 && std::strcmp(argv[1], "--out") == 0) {
    std::ofstream(argv[2]) << "{\"enqueue_us\": " << e << ", \"batch_per_op_us\": " << p << ", \"round_trip_us\": " << r
                           << "}\n";
  }
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
