// SPDX-License-Identifier: Apache-2.0
// Engine throughput: dynamic lane- and warp-instructions per second on saxpy, a tiled
// matmul and a warp-shuffle reduction, with 1 and 2 worker threads.
//
//   vgpu_engine_bench BASIC_PTX [--output bench/results/vgpu_engine.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "phos/vgpu/engine.h"
#include "phos/vgpu/program.h"

namespace {

using namespace phos;
using namespace phos::vgpu;

class HostMemory final : public DeviceMemory, public AddressChecker {
 public:
  ~HostMemory() override {
    for (auto& [a, s] : blocks_) std::free(reinterpret_cast<void*>(a));
  }
  Result<uint64_t> allocate(std::string_view, size_t bytes, size_t alignment, bool) override {
    return allocate(bytes, alignment);
  }
  Result<uint64_t> allocate(size_t bytes, size_t alignment) {
    size_t align = std::max<size_t>(alignment, 64);
    void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (!p) return Status(Code::kResourceExhausted, "out of host memory");
    std::memset(p, 0, bytes);
    blocks_[reinterpret_cast<uint64_t>(p)] = bytes;
    return reinterpret_cast<uint64_t>(p);
  }
  Status write(uint64_t address, std::span<const std::byte> bytes) override {
    std::memcpy(reinterpret_cast<void*>(address), bytes.data(), bytes.size());
    return Status::ok();
  }
  int device() const override { return 0; }
  int computeCapability() const override { return 80; }
  bool isAccessible(uint64_t address, size_t size) const override {
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return false;
    --it;
    return address + size <= it->first + it->second;
  }
  template <typename T>
  T* alloc(size_t n, T fill) {
    T* p = reinterpret_cast<T*>(*allocate(n * sizeof(T), 64));
    std::fill(p, p + n, fill);
    return p;
  }

 private:
  std::map<uint64_t, size_t> blocks_;
};

class NullPrintf final : public PrintfSink {
 public:
  void write(std::string_view) override {}
};

struct Case {
  std::string name;
  std::string kernel;
  Dim3 grid, block;
  std::vector<std::byte> params;
};

template <typename T>
void put(std::vector<std::byte>& buf, size_t offset, T v) {
  if (buf.size() < offset + sizeof(T)) buf.resize(offset + sizeof(T));
  std::memcpy(buf.data() + offset, &v, sizeof(T));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s BASIC_PTX [--output FILE]\n", argv[0]);
    return 2;
  }
  std::string output;
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--output") == 0) output = argv[i + 1];
  }
  std::ifstream in(argv[1]);
  std::stringstream ss;
  ss << in.rdbuf();
  HostMemory memory;
  auto loaded = engine::makeProgramLoader()->load(ss.str(), memory);
  if (!loaded.isOk()) {
    std::fprintf(stderr, "load failed: %s\n", loaded.status().toString().c_str());
    return 1;
  }
  std::unique_ptr<Program> program = std::move(loaded).value();
  auto index = [&](const std::string& name) {
    const auto& fs = program->functions();
    for (size_t i = 0; i < fs.size(); ++i) if (fs[i].name == name) return i;
    std::fprintf(stderr, "no kernel %s\n", name.c_str());
    std::exit(1);
  };

  const int n = 1 << 20, m = 256;
  float* x = memory.alloc<float>(n, 1.5f);
  float* y = memory.alloc<float>(n, 2.0f);
  float* a = memory.alloc<float>(m * m, 0.25f);
  float* b = memory.alloc<float>(m * m, 0.5f);
  float* c = memory.alloc<float>(m * m, 0.0f);
  float* out = memory.alloc<float>(n / 256, 0.0f);

  std::vector<Case> cases;
  {
    Case s{"saxpy", "saxpy", {n / 256, 1, 1}, {256, 1, 1}, {}};
    put(s.params, 0, n);
    put(s.params, 4, 3.0f);
    put(s.params, 8, x);
    put(s.params, 16, y);
    cases.push_back(s);
    Case mm{"matmul", "matmul", {m / 16, m / 16, 1}, {16, 16, 1}, {}};
    put(mm.params, 0, a);
    put(mm.params, 8, b);
    put(mm.params, 16, c);
    put(mm.params, 24, m);
    cases.push_back(mm);
    Case r{"shuffle_reduction", "warpSumF", {n / 256, 1, 1}, {256, 1, 1}, {}};
    put(r.params, 0, x);
    put(r.params, 8, out);
    cases.push_back(r);
  }

  NullPrintf sink;
  LaunchContext context;
  context.memory = &memory;
  context.printf = &sink;
  std::string json = "{\n  \"benchmark\": \"vgpu_engine\",\n  \"cases\": [\n";
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& k = cases[ci];
    size_t fi = index(k.kernel);
    std::vector<std::byte> params = k.params;
    params.resize(std::max(params.size(), program->functions()[fi].paramBufferSize));
    double rate[3] = {0, 0, 0};
    engine::LaunchStats stats;
    for (uint32_t workers : {1u, 2u}) {
      engine::setWorkerThreads(*program, workers);
      LaunchConfig config{k.grid, k.block, 0};
      // One warm-up launch, then the best of three.
      double best = 1e30;
      for (int rep = 0; rep < 4; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        Status st = program->launch(fi, config, params, context);
        auto t1 = std::chrono::steady_clock::now();
        if (!st.isOk()) {
          std::fprintf(stderr, "%s: %s\n", k.name.c_str(), st.toString().c_str());
          return 1;
        }
        if (rep > 0) best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
      }
      stats = engine::lastLaunchStats(*program);
      rate[workers] = static_cast<double>(stats.laneInstructions) / best;
      std::printf("%-18s workers=%u  %8.3f s  %7.1f M lane-inst/s  %6.2f M warp-inst/s\n",
                  k.name.c_str(), workers, best, rate[workers] / 1e6,
                  static_cast<double>(stats.warpInstructions) / best / 1e6);
    }
    double speedup = rate[2] / rate[1];
    std::printf("%-18s speed-up with 2 threads: %.2fx\n", k.name.c_str(), speedup);
    json += "    {\"name\": \"" + k.name + "\", \"lane_instructions\": " +
            std::to_string(stats.laneInstructions) + ", \"warp_instructions\": " +
            std::to_string(stats.warpInstructions) +
            ", \"lane_inst_per_s_1_thread\": " + std::to_string(rate[1]) +
            ", \"lane_inst_per_s_2_threads\": " + std::to_string(rate[2]) +
            ", \"speedup_2_threads\": " + std::to_string(speedup) + "}" +
            (ci + 1 < cases.size() ? ",\n" : "\n");
  }
  json += "  ]\n}\n";
  if (!output.empty()) {
    std::ofstream o(output);
    o << json;
    if (!o) {
      std::fprintf(stderr, "cannot write %s\n", output.c_str());
      return 1;
    }
  }
  return 0;
}
