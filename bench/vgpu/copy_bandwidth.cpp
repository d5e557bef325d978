// SPDX-License-Identifier: Apache-2.0
// vgpu copy-engine benchmark: achieved bandwidth per modelled link against its configured value.
#include <cuda.h>

#include "cu_check.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Row {
  std::string link;
  double configuredGBps;
  double achievedGBps;
};

// Copies `bytes` `reps` times on `stream` and returns GB/s (1e9 bytes per second).
template <typename Copy>
double measure(CUstream stream, std::size_t bytes, int reps, Copy copy) {
  copy();  // warm-up: maps pages, starts workers
  CU_CHECK(cuStreamSynchronize(stream));
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) copy();
  CU_CHECK(cuStreamSynchronize(stream));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) * reps / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  // Defaults of docs/vgpu.md: PCIe 25 GB/s, device memory 1500 GB/s, NVLink 50 GB/s.
  setenv("PHOS_VGPU_DEVICES", "2", 0);
  // A copy takes bytes / bandwidth x scale: with scale 20 the modelled links
  // (1.25 GB/s PCIe, 2.5 GB/s NVLink) are slower than this CPU's memcpy, so the
  // model, not the CPU, sets the pace. Device-local copies (75 GB/s modelled)
  // stay bound by memcpy.
  setenv("PHOS_VGPU_BANDWIDTH_SCALE", "20", 0);
  const double scale = std::atof(std::getenv("PHOS_VGPU_BANDWIDTH_SCALE"));
  CU_CHECK(cuInit(0));
  const std::size_t bytes = std::size_t{64} << 20;
  const int reps = 8;
  CUcontext c0 = nullptr, c1 = nullptr;
  CU_CHECK(cuCtxCreate(&c1, nullptr, 0, 1));
  CU_CHECK(cuCtxCreate(&c0, nullptr, 0, 0));
  CUstream s = nullptr;
  CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = 0, b = 0, peer = 0;
  CU_CHECK(cuMemAlloc(&a, bytes));
  CU_CHECK(cuMemAlloc(&b, bytes));
  void* pinned = nullptr;
  CU_CHECK(cuMemAllocHost(&pinned, bytes));
  CU_CHECK(cuCtxPushCurrent(c1));
  CU_CHECK(cuMemAlloc(&peer, bytes));
  CU_CHECK(cuCtxPopCurrent(nullptr));

  std::vector<Row> rows;
  rows.push_back({"host->device (PCIe)", 25.0,
                  measure(s, bytes, reps, [&] { CU_CHECK(cuMemcpyHtoDAsync(a, pinned, bytes, s)); })});
  rows.push_back({"device->host (PCIe)", 25.0,
                  measure(s, bytes, reps, [&] { CU_CHECK(cuMemcpyDtoHAsync(pinned, a, bytes, s)); })});
  rows.push_back({"device->device (local)", 1500.0,
                  measure(s, bytes, reps * 4, [&] { CU_CHECK(cuMemcpyDtoDAsync(b, a, bytes, s)); })});
  rows.push_back({"device0->device1 (NVLink)", 50.0,
                  measure(s, bytes, reps, [&] { CU_CHECK(cuMemcpyPeerAsync(peer, c1, a, c0, bytes, s)); })});

  std::string json = "{\n  \"benchmark\": \"vgpu-copy\",\n  \"bytes\": " + std::to_string(bytes) + ",\n  \"links\": [\n";
  std::printf("bandwidth scale %.1f: modelled = configured / scale\n", scale);
  std::printf("%-28s %12s %12s %8s\n", "link", "modelled", "achieved", "ratio");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    double modelled = scale > 0 ? r.configuredGBps / scale : r.configuredGBps;
    std::printf("%-28s %9.2f GB/s %9.2f GB/s %8.3f\n", r.link.c_str(), modelled, r.achievedGBps,
                r.achievedGBps / modelled);
    json += "    {\"link\": \"" + r.link + "\", \"configured_gbps\": " + std::to_string(r.configuredGBps) +
            ", \"scale\": " + std::to_string(scale) + ", \"achieved_gbps\": " + std::to_string(r.achievedGBps) + "}" + (i + 1 < rows.size() ? "," : "") + "\n";
  }
  json += "  ]\n}\n";
  if (argc == 3 && std::string(argv[1]) == "--out") std::ofstream(argv[2]) << json;
  return 0;
}
