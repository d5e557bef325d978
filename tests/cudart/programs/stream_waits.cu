// SPDX-License-Identifier: Apache-2.0
// Stream memory operations as a producer-consumer pipeline uses them: a work
// stream waits (cuStreamWaitValue32) for a flag that a second application
// thread writes with cuStreamWriteValue32 on its own stream, while the main
// thread already waits in cudaStreamSynchronize for the work stream. A 64-bit
// wait on pinned host memory is released by a store of the host, and a batch
// (cuStreamBatchMemOp) writes a 64-bit step counter and waits for it. Each
// step prints the buffer's checksum and the words the operations wrote,
// checked against a CPU replay.
//   stream_waits [--steps N] [--sleep-ms MS] [--hold-at STEP] [--hold-ms MS] [--legacy] [--free]
// --legacy: the work stream is a blocking stream, and the main thread waits
// for it with a cudaMemcpy on the legacy stream (which waits for every
// blocking stream) instead of cudaStreamSynchronize.
// --free: before it synchronizes, the main thread frees a buffer it allocated
// (cudaFree waits for the device's work, so for the waits too) and pinned
// memory (cudaFreeHost), while the producer has not written its flag yet.
// --hold-at: at that step the host stores its word only after --hold-ms
// (default 4000), and prints "holding" first: a checkpoint meanwhile finds a
// stream held by a wait. --refusals: operations on memory that is not the
// program's, with invalid flags or counts; prints what each call returned.
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kN = 8192;

__global__ void bump(unsigned* a, int n, unsigned step) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = a[i] * 2654435761u + step * 40503u + static_cast<unsigned>(i);
}

const char* name(CUresult r) {
  const char* n = nullptr;
  cuGetErrorName(r, &n);
  return n != nullptr ? n : "?";
}

int refusals() {
  CHECK(cudaFree(nullptr));  // the primary context
  unsigned* word = nullptr;
  CHECK(cudaMalloc(&word, sizeof(unsigned)));
  const auto mine = reinterpret_cast<CUdeviceptr>(word);
  unsigned onStack = 0;
  std::printf("write to memory not allocated %s\n",
              name(cuStreamWriteValue32(nullptr, 0x10000, 1, 0)));
  std::printf("write to the host stack %s\n",
              name(cuStreamWriteValue32(nullptr, reinterpret_cast<CUdeviceptr>(&onStack), 1, 0)));
  std::printf("wait with invalid flags %s\n", name(cuStreamWaitValue32(nullptr, mine, 0, 0x7)));
  CUstreamBatchMemOpParams op = {};
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = mine;
  std::printf("batch of none %s\n", name(cuStreamBatchMemOp(nullptr, 0, &op, 0)));
  std::printf("batch with flags %s\n", name(cuStreamBatchMemOp(nullptr, 1, &op, 1)));
  std::printf("batch of one %s\n", name(cuStreamBatchMemOp(nullptr, 1, &op, 0)));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(word));
  return 0;
}

int main(int argc, char** argv) {
  int steps = 10, sleepMs = 0, holdAt = -1, holdMs = 4000;
  bool legacy = false, freeing = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--refusals") == 0) return refusals();
    if (std::strcmp(argv[i], "--legacy") == 0) legacy = true;
    if (std::strcmp(argv[i], "--free") == 0) freeing = true;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--hold-at") == 0) holdAt = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--hold-ms") == 0) holdMs = std::stoi(argv[i + 1]);
  }
  unsigned* buffer = nullptr;
  unsigned* flags = nullptr;  // [0]: the producer's flag, [1]: the work stream's "done"
  unsigned long long* counter = nullptr;
  CHECK(cudaMalloc(&buffer, kN * sizeof(unsigned)));
  CHECK(cudaMalloc(&flags, 2 * sizeof(unsigned)));
  CHECK(cudaMalloc(&counter, sizeof(unsigned long long)));
  CHECK(cudaMemset(buffer, 0, kN * sizeof(unsigned)));
  CHECK(cudaMemset(flags, 0, 2 * sizeof(unsigned)));
  CHECK(cudaMemset(counter, 0, sizeof(unsigned long long)));
  // The host's word, which the device reads through its mapping.
  volatile unsigned long long* hostWord = nullptr;
  CHECK(cudaHostAlloc(const_cast<unsigned long long**>(&hostWord), sizeof(unsigned long long),
                      cudaHostAllocMapped));
  *hostWord = 0;
  CUdeviceptr hostWordOnDevice = 0;
  CHECK_CU(
      cuMemHostGetDevicePointer(&hostWordOnDevice, const_cast<unsigned long long*>(hostWord), 0));
  CHECK(cudaDeviceSynchronize());
  cudaStream_t work, side;
  CHECK(cudaStreamCreateWithFlags(&work, legacy ? cudaStreamDefault : cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const auto flag = reinterpret_cast<CUdeviceptr>(flags);
  const auto done = flag + sizeof(unsigned);
  const auto count = reinterpret_cast<CUdeviceptr>(counter);

  std::vector<unsigned> host(kN), replay(kN, 0);
  for (int s = 0; s < steps; ++s) {
    const unsigned step = static_cast<unsigned>(s) + 1;
    // The work: wait for the producer's flag and the host's word, bump, say done.
    CHECK_CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(work), flag, step,
                                 CU_STREAM_WAIT_VALUE_GEQ));
    CHECK_CU(cuStreamWaitValue64(reinterpret_cast<CUstream>(work), hostWordOnDevice, step,
                                 CU_STREAM_WAIT_VALUE_EQ));
    bump<<<kN / 256, 256, 0, work>>>(buffer, kN, step);
    CUstreamBatchMemOpParams ops[2] = {};
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    ops[0].writeValue.address = count;
    ops[0].writeValue.value64 = 1000ull * step;
    ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
    ops[1].waitValue.address = count;
    ops[1].waitValue.value64 = 1000ull * step;
    ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    CHECK_CU(cuStreamBatchMemOp(reinterpret_cast<CUstream>(work), 2, ops, 0));
    CHECK_CU(cuStreamWriteValue32(reinterpret_cast<CUstream>(work), done, step, 0));
    // The producer writes its flag a little later, from its own thread and
    // stream, while this thread already waits for the work stream.
    std::thread producer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      CHECK_CU(cuStreamWriteValue32(reinterpret_cast<CUstream>(side), flag, step, 0));
    });
    std::thread storer([&] {
      if (s == holdAt) {
        std::printf("holding\n");
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::milliseconds(holdMs));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      reinterpret_cast<volatile std::atomic<unsigned long long>*>(hostWord)->store(step);
    });
    if (freeing) {
      void* scratch = nullptr;
      void* pinned = nullptr;
      CHECK(cudaMalloc(&scratch, 4096));
      CHECK(cudaMallocHost(&pinned, 4096));
      CHECK(cudaFree(scratch));
      CHECK(cudaFreeHost(pinned));
    }
    if (legacy) {
      unsigned seen[2];
      CHECK(cudaMemcpy(seen, flags, sizeof(seen), cudaMemcpyDeviceToHost));
    } else {
      CHECK(cudaStreamSynchronize(work));
    }
    producer.join();
    storer.join();
    CHECK(cudaStreamSynchronize(side));

    for (int i = 0; i < kN; ++i) {
      replay[i] = replay[i] * 2654435761u + step * 40503u + static_cast<unsigned>(i);
    }
    unsigned words[2];
    unsigned long long counted = 0;
    CHECK(cudaMemcpy(host.data(), buffer, kN * sizeof(unsigned), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(words, flags, sizeof(words), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&counted, counter, sizeof(counted), cudaMemcpyDeviceToHost));
    const bool ok =
        host == replay && words[0] == step && words[1] == step && counted == 1000ull * step;
    std::printf("step %d buffer %016llx flag %u done %u counter %llu %s\n", s,
                checksum(host.data(), kN * sizeof(unsigned)), words[0], words[1], counted,
                ok ? "ok" : "WRONG");
    std::fflush(stdout);
    if (!ok) return 1;
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  CHECK(cudaStreamDestroy(work));
  CHECK(cudaStreamDestroy(side));
  CHECK(cudaFreeHost(const_cast<unsigned long long*>(hostWord)));
  CHECK(cudaFree(counter));
  CHECK(cudaFree(flags));
  CHECK(cudaFree(buffer));
  std::printf("stream_waits OK\n");
  return 0;
}
