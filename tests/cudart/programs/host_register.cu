// SPDX-License-Identifier: Apache-2.0
// The program's own memory made page-locked with cudaHostRegister, as codes
// that pin buffers they already have do (numba's cuda.pinned, MPI codes): a
// std::vector the host fills each step, read by the kernel in place through
// its mapped device pointer (zero-copy), and a second registered buffer the
// state is copied back into asynchronously. The registered ranges start and
// end inside pages that also hold the program's other data (guard words it
// updates every step). Each step prints a checksum of the state, the result
// buffer and the guards, checked against a CPU reference. At the end the
// buffers are unregistered and must keep their bytes as ordinary memory.
//   host_register [--steps N] [--sleep-ms MS] | --refusals
// --refusals: what registration refuses (a range registered twice, an
// unregistration of memory never registered, a file's pages: PhOS does not
// serve those); prints each error's name.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kN = 5000;  // not a page multiple: the ranges share their last page

// Integers, so that the CPU reference is exact.
__host__ __device__ int next(int state, int input, int k) {
  return (state * 3 + input * (k % 5 + 1)) % 100003;
}

__global__ void step(int n, int* state, const int* input, int k) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    state[i] = next(state[i], input[i], k);
  }
}

static int refusals() {
  std::vector<float> buffer(4096);
  CHECK(cudaHostRegister(buffer.data(), buffer.size() * sizeof(float), cudaHostRegisterDefault));
  cudaError_t twice = cudaHostRegister(buffer.data() + 16, 64, cudaHostRegisterDefault);
  std::printf("twice %s\n", cudaGetErrorName(twice));
  CHECK(cudaHostUnregister(buffer.data()));
  std::vector<float> other(16);
  cudaError_t never = cudaHostUnregister(other.data());
  std::printf("never %s\n", cudaGetErrorName(never));
  // A file's pages: a memory-mapped array.
  char path[] = "/tmp/host_register.XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || ftruncate(fd, 1 << 16) != 0) return 1;
  void* file = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  unlink(path);
  close(fd);
  if (file == MAP_FAILED) return 1;
  cudaError_t mapped = cudaHostRegister(file, 1 << 16, cudaHostRegisterDefault);
  std::printf("file %s\n", cudaGetErrorName(mapped));
  if (mapped == cudaSuccess) CHECK(cudaHostUnregister(file));
  munmap(file, 1 << 16);
  return 0;
}

int main(int argc, char** argv) {
  int steps = 20, sleepMs = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0 && i + 1 < argc) sleepMs = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--refusals") == 0) return refusals();
  }
  // [guard | input (kN ints) | guard | a page | guard | results | guard]:
  // each registration starts one int in, so it starts and ends mid-page. A
  // page apart: PhOS registers whole pages, and refuses two registrations
  // that share one (docs/remoting.md).
  constexpr int kGap = 4096 / sizeof(int);
  std::vector<int> buffer(2 * (kN + 2) + kGap);
  int* in = buffer.data();
  int* out = buffer.data() + kN + 2 + kGap;
  int* input = in + 1;
  int* result = out + 1;
  const size_t bytes = kN * sizeof(int);
  CHECK(cudaHostRegister(input, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  CHECK(cudaHostRegister(result, bytes, cudaHostRegisterDefault));
  int* inputOnDevice = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&inputOnDevice), input, 0));
  int* state = nullptr;
  CHECK(cudaMalloc(&state, bytes));
  CHECK(cudaMemset(state, 0, bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));

  std::vector<int> reference(kN, 0);
  for (int k = 0; k < steps; ++k) {
    for (int i = 0; i < kN; ++i) input[i] = (i * 7 + k * 13) % 101;
    in[0] = k;
    in[kN + 1] = -k;
    out[0] = 2 * k;
    out[kN + 1] = 3 * k;
    step<<<8, 128, 0, stream>>>(kN, state, inputOnDevice, k);
    CHECK(cudaMemcpyAsync(result, state, bytes, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < kN; ++i) reference[i] = next(reference[i], input[i], k);
    const bool ok =
        std::memcmp(reference.data(), result, bytes) == 0 && in[0] == k && out[kN + 1] == 3 * k;
    std::printf("step %d state %016llx guards %016llx %s\n", k, checksum(result, bytes),
                checksum(out, sizeof(int)) ^ checksum(in + kN + 1, sizeof(int)),
                ok ? "OK" : "WRONG");
    std::fflush(stdout);
    if (!ok) return 1;
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  CHECK(cudaHostUnregister(input));
  CHECK(cudaHostUnregister(result));
  // Ordinary memory again, with every byte it had.
  const unsigned long long before = checksum(buffer.data(), buffer.size() * sizeof(int));
  out[kN / 2] += 1;
  out[kN / 2] -= 1;
  const bool kept = std::memcmp(reference.data(), result, bytes) == 0 &&
                    checksum(buffer.data(), buffer.size() * sizeof(int)) == before;
  cudaError_t again = cudaHostUnregister(input);
  std::printf("unregistered %s, again %s\n", kept ? "OK" : "WRONG", cudaGetErrorName(again));
  CHECK(cudaFree(state));
  return kept ? 0 : 1;
}
