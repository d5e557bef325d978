// SPDX-License-Identifier: Apache-2.0
// The program's own virtual memory management, as PyTorch's expandable
// segments use it: one reserved range that grows by chunks of physical memory
// (cuMemCreate, cuMemMap, cuMemSetAccess, the handle released at once, the
// mapping keeping the memory) and shrinks by unmapping its last chunk. Kernels
// launched with the runtime work on the whole segment through one pointer.
// Prints per step the chunk count and a checksum of the segment, all
// deterministic, so a restored run prints the same bytes as an uninterrupted
// one. Built with plain nvcc and -lcuda.
//   vmm_grow [--steps N] [--sleep-ms MS] [--keep-unmapped] | --refusals
// --keep-unmapped: the chunk unmapped at step 4 keeps its handle (and bytes)
// for good, which a checkpoint cannot save. --refusals: asks for memory with a
// shareable handle and for host memory, prints what each call returned.
#include <cuda.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kMaxChunks = 6;
constexpr int kWordsPerChunk = 4096;  // of each chunk, the words the kernels use

// Word i of chunk c sits at c * stride + i: the segment is one range.
__global__ void initChunk(unsigned* segment, size_t stride, int chunk) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kWordsPerChunk;
       i += gridDim.x * blockDim.x) {
    segment[chunk * stride + i] =
        static_cast<unsigned>(i) * 2654435761u + static_cast<unsigned>(chunk);
  }
}

__global__ void step(unsigned* segment, size_t stride, int chunks, unsigned s) {
  const int n = chunks * kWordsPerChunk;
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
    const int c = k / kWordsPerChunk, i = k % kWordsPerChunk;
    unsigned& w = segment[c * stride + i];
    w = w * 31u + s * 40503u + static_cast<unsigned>(c);
  }
}

int main(int argc, char** argv) {
  int steps = 12, sleepMs = 0;
  bool keepUnmapped = false, refusals = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0 && i + 1 < argc) sleepMs = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--keep-unmapped") == 0) keepUnmapped = true;
    if (std::strcmp(argv[i], "--refusals") == 0) refusals = true;
  }
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // the primary context, current

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t chunkBytes = 0;
  CHECK_CU(cuMemGetAllocationGranularity(&chunkBytes, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (refusals) {
    CUmemAllocationProp shareable = prop, host = prop;
    shareable.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    host.location.type = CU_MEM_LOCATION_TYPE_HOST;
    for (auto [name, p] :
         {std::make_pair("shareable", &shareable), std::make_pair("host", &host)}) {
      CUmemGenericAllocationHandle h = 0;
      const char* error = nullptr;
      cuGetErrorName(cuMemCreate(&h, chunkBytes, p, 0), &error);
      std::printf("%s %s\n", name, error);
    }
    return 0;
  }
  CUdeviceptr base = 0;
  CHECK_CU(cuMemAddressReserve(&base, kMaxChunks * chunkBytes, 0, 0, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  unsigned* segment = reinterpret_cast<unsigned*>(base);
  const size_t stride = chunkBytes / sizeof(unsigned);

  int chunks = 0;
  auto grow = [&] {
    CUmemGenericAllocationHandle h = 0;
    CHECK_CU(cuMemCreate(&h, chunkBytes, &prop, 0));
    CHECK_CU(cuMemMap(base + chunks * chunkBytes, chunkBytes, 0, h, 0));
    CHECK_CU(cuMemRelease(h));  // the mapping keeps the memory
    CHECK_CU(cuMemSetAccess(base + chunks * chunkBytes, chunkBytes, &access, 1));
    initChunk<<<4, 128>>>(segment, stride, chunks);
    ++chunks;
  };
  CUmemGenericAllocationHandle kept = 0;
  auto shrink = [&] {
    const CUdeviceptr last = base + (chunks - 1) * chunkBytes;
    CUmemGenericAllocationHandle h = 0;
    CHECK_CU(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(last + 64)));
    CUmemAllocationProp got{};
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&got, h));
    if (got.location.id != 0 || got.type != CU_MEM_ALLOCATION_TYPE_PINNED) {
      std::printf("wrong properties of the retained handle\n");
      std::exit(1);
    }
    CHECK(cudaDeviceSynchronize());
    if (keepUnmapped && kept == 0) {
      kept = h;
    } else {
      CHECK_CU(cuMemRelease(h));
    }
    CHECK_CU(cuMemUnmap(last, chunkBytes));
    --chunks;
  };

  std::vector<unsigned> host(kWordsPerChunk);
  for (int s = 0; s < steps; ++s) {
    if (s % 3 == 0 && chunks < kMaxChunks) grow();
    if (s == 4 || s == 10) shrink();
    step<<<8, 128>>>(segment, stride, chunks, static_cast<unsigned>(s));
    CHECK(cudaDeviceSynchronize());
    unsigned long long sum = 0;
    for (int c = 0; c < chunks; ++c) {
      CHECK(cudaMemcpy(host.data(), segment + c * stride, kWordsPerChunk * sizeof(unsigned),
                       cudaMemcpyDeviceToHost));
      sum = sum * 1099511628211ull + checksum(host.data(), host.size() * sizeof(unsigned));
    }
    unsigned long long flags = 0;
    CHECK_CU(cuMemGetAccess(&flags, &prop.location, base));
    std::printf("step %d chunks %d segment %016llx access %s\n", s, chunks, sum,
                flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "rw" : "other");
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  // What the documentation refuses: unmapping part of a mapping, freeing a
  // range that is still mapped.
  const bool refused = cuMemUnmap(base, chunkBytes / 2) == CUDA_ERROR_INVALID_VALUE &&
                       cuMemAddressFree(base, kMaxChunks * chunkBytes) != CUDA_SUCCESS;
  while (chunks > 0) {
    --chunks;
    CHECK_CU(cuMemUnmap(base + chunks * chunkBytes, chunkBytes));
  }
  if (kept != 0) CHECK_CU(cuMemRelease(kept));
  CHECK_CU(cuMemAddressFree(base, kMaxChunks * chunkBytes));
  std::printf("vmm %s\n", refused ? "OK" : "WRONG: a wrong call was accepted");
  return refused ? 0 : 1;
}
