// SPDX-License-Identifier: Apache-2.0
// Copy bandwidth between the device and pageable or pinned memory, both ways: the same program runs directly on vgpu
// and through libphos.so + phosd.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../vgpu/cu_check.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 256u << 20;
  int reps = 7;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--mib" && i + 1 < argc) bytes = std::strtoull(argv[++i], nullptr, 10) << 20;
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--mib N] [--reps N] [--out FILE]\n", argv[0]);
      return 2;
    }
  }
  CU_CHECK(cuInit(0));
  CUdevice dev = 0;
  CU_CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CU_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU_CHECK(cuCtxSetCurrent(ctx));
  CUdeviceptr d = 0;
  CU_CHECK(cuMemAlloc(&d, bytes));
  std::vector<unsigned char> pageable(bytes);
  for (size_t i = 0; i < bytes; i += 4096) pageable[i] = static_cast<unsigned char>(i >> 12);
  void* pinned = nullptr;
  CU_CHECK(cuMemAllocHost(&pinned, bytes));
  std::memcpy(pinned, pageable.data(), bytes);
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  auto gbps = [&](auto&& copy) {
    copy();  // warm-up: first-touch of device pages, staging buffers
    std::vector<double> samples;
    for (int r = 0; r < reps; ++r) {
      auto t0 = Clock::now();
      copy();
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      samples.push_back(static_cast<double>(bytes) / s / 1e9);
    }
    return median(samples);
  };
  double fromPageable = gbps([&] { CU_CHECK(cuMemcpyHtoD(d, pageable.data(), bytes)); });
  double fromPinned = gbps([&] {
    CU_CHECK(cuMemcpyHtoDAsync(d, pinned, bytes, stream));
    CU_CHECK(cuStreamSynchronize(stream));
  });
  std::vector<unsigned char> back(bytes);
  double toPageable = gbps([&] { CU_CHECK(cuMemcpyDtoH(back.data(), d, bytes)); });
  double toPinned = gbps([&] {
    CU_CHECK(cuMemcpyDtoHAsync(pinned, d, bytes, stream));
    CU_CHECK(cuStreamSynchronize(stream));
  });
  // The data arrived both ways: one byte per page.
  for (size_t i = 0; i < bytes; i += 4096) {
    if (back[i] != pageable[i]) {
      std::fprintf(stderr, "h2d_bandwidth: wrong data at offset %zu\n", i);
      return 1;
    }
  }
  for (size_t i = 0; i < bytes; i += 4096) {
    if (static_cast<unsigned char*>(pinned)[i] != pageable[i]) {
      std::fprintf(stderr, "h2d_bandwidth: wrong data at offset %zu of the pinned copy\n", i);
      return 1;
    }
  }
  std::printf("%zu MiB, median of %d: to the device from pageable %.2f GB/s, from pinned %.2f GB/s; "
              "from the device to pageable %.2f GB/s, to pinned %.2f GB/s\n",
              bytes >> 20, reps, fromPageable, fromPinned, toPageable, toPinned);
  if (!out.empty()) {
    std::ofstream(out) << "{\"bytes\": " << bytes << ", \"reps\": " << reps << ", \"pageable_gbps\": " << fromPageable
                       << ", \"pinned_gbps\": " << fromPinned
                       << ", \"d2h_pageable_gbps\": " << toPageable << ", \"d2h_pinned_gbps\": " << toPinned << "}\n";
  }
  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuMemFreeHost(pinned));
  CU_CHECK(cuMemFree(d));
  CU_CHECK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
