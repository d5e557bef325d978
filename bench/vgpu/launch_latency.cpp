// SPDX-License-Identifier: Apache-2.0
// vgpu kernel launch latency: an empty kernel, launched asynchronously and as a launch+synchronize
// round trip, against a 1-byte memset; and a captured graph of one and of eight such launches,
// launched as one.
#include <cuda.h>

#include "cu_check.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

// Written by hand so the benchmark needs no nvcc: what nvcc emits for
// `extern "C" __global__ void empty() {}`.
constexpr const char* kEmptyKernelPtx =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry empty()\n{\n  ret;\n}\n";

using Clock = std::chrono::steady_clock;

double microseconds(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Summary {
  double median = 0;
  double p99 = 0;
};

Summary summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    std::size_t i = static_cast<std::size_t>(q * static_cast<double>(samples.size() - 1) + 0.5);
    return samples[std::min(i, samples.size() - 1)];
  };
  return {at(0.5), at(0.99)};
}

// One operation measured three ways:
//  - enqueue: the time of each asynchronous call (kBatch calls, then one sync);
//  - batch: (kBatch calls + sync) / kBatch, i.e. the sustained cost per operation
//    including its execution on the stream worker, one sample per batch;
//  - round trip: call + cuStreamSynchronize, one sample each.
struct Row {
  std::string name;
  Summary enqueue;
  Summary batch;
  Summary roundTrip;
};

constexpr int kBatch = 10000;
constexpr int kBatches = 7;
constexpr int kRoundTrips = 5000;

Row measure(const std::string& name, CUstream stream, const std::function<void()>& op) {
  Row row{name, {}, {}, {}};
  for (int i = 0; i < 1000; ++i) op();  // warm-up: the stream worker, allocator, caches
  CU_CHECK(cuStreamSynchronize(stream));

  std::vector<double> enqueue, batch;
  enqueue.reserve(static_cast<std::size_t>(kBatch) * kBatches);
  for (int b = 0; b < kBatches; ++b) {
    Clock::time_point start = Clock::now();
    for (int i = 0; i < kBatch; ++i) {
      Clock::time_point t0 = Clock::now();
      op();
      enqueue.push_back(microseconds(Clock::now() - t0));
    }
    CU_CHECK(cuStreamSynchronize(stream));
    batch.push_back(microseconds(Clock::now() - start) / kBatch);
  }
  row.enqueue = summarize(std::move(enqueue));
  row.batch = summarize(std::move(batch));

  std::vector<double> roundTrip;
  roundTrip.reserve(kRoundTrips);
  for (int i = 0; i < kRoundTrips; ++i) {
    Clock::time_point t0 = Clock::now();
    op();
    CU_CHECK(cuStreamSynchronize(stream));
    roundTrip.push_back(microseconds(Clock::now() - t0));
  }
  row.roundTrip = summarize(std::move(roundTrip));
  return row;
}

std::string json(const Summary& s) {
  return "{\"median_us\": " + std::to_string(s.median) + ", \"p99_us\": " + std::to_string(s.p99) + "}";
}

}  // namespace

int main(int argc, char** argv) {
  setenv("PHOS_VGPU_BANDWIDTH_SCALE", "0", 0);  // the memset baseline: no modelled copy time
  CU_CHECK(cuInit(0));
  CUcontext context = nullptr;
  CU_CHECK(cuCtxCreate(&context, nullptr, 0, 0));
  CUmodule module = nullptr;
  CU_CHECK(cuModuleLoadData(&module, kEmptyKernelPtx));
  CUfunction empty = nullptr;
  CU_CHECK(cuModuleGetFunction(&empty, module, "empty"));
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr byte = 0;
  CU_CHECK(cuMemAlloc(&byte, 1));

  std::vector<Row> rows;
  rows.push_back(measure("cuLaunchKernel empty<<<1,1>>>", stream,
                         [&] { CU_CHECK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr)); }));
  rows.push_back(measure("cuLaunchKernel empty<<<1,256>>>", stream,
                         [&] { CU_CHECK(cuLaunchKernel(empty, 1, 1, 1, 256, 1, 1, 0, stream, nullptr, nullptr)); }));
  rows.push_back(measure("cuMemsetD8Async 1 byte (baseline)", stream,
                         [&] { CU_CHECK(cuMemsetD8Async(byte, 0x5a, 1, stream)); }));
  // Graphs captured from the same launches (what torch.cuda.graphs replays).
  auto captured = [&](int kernels) {
    CU_CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int k = 0; k < kernels; ++k) {
      CU_CHECK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr));
    }
    CUgraph graph = nullptr;
    CU_CHECK(cuStreamEndCapture(stream, &graph));
    CUgraphExec exec = nullptr;
    CU_CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    CU_CHECK(cuGraphDestroy(graph));
    return exec;
  };
  CUgraphExec one = captured(1), eight = captured(8);
  rows.push_back(
      measure("cuGraphLaunch 1 kernel", stream, [&] { CU_CHECK(cuGraphLaunch(one, stream)); }));
  rows.push_back(
      measure("cuGraphLaunch 8 kernels", stream, [&] { CU_CHECK(cuGraphLaunch(eight, stream)); }));

  std::printf("%d batches of %d async operations then a sync; %d launch+sync round trips (microseconds)\n",
              kBatches, kBatch, kRoundTrips);
  std::printf("%-36s %19s %19s %19s\n", "operation", "enqueue med/p99", "batch/op med/p99",
              "round trip med/p99");
  std::string out = "{\n  \"benchmark\": \"vgpu-launch\",\n  \"batch\": " + std::to_string(kBatch) +
                    ",\n  \"batches\": " + std::to_string(kBatches) + ",\n  \"round_trips\": " +
                    std::to_string(kRoundTrips) + ",\n  \"operations\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("%-36s %8.2f / %8.2f %8.2f / %8.2f %8.2f / %8.2f\n", r.name.c_str(), r.enqueue.median,
                r.enqueue.p99, r.batch.median, r.batch.p99, r.roundTrip.median, r.roundTrip.p99);
    out += "    {\"operation\": \"" + r.name + "\", \"enqueue\": " + json(r.enqueue) + ", \"batch_per_op\": " +
           json(r.batch) + ", \"round_trip\": " + json(r.roundTrip) + "}" + (i + 1 < rows.size() ? "," : "") +
           "\n";
  }
  out += "  ]\n}\n";
  if (argc == 3 && std::string(argv[1]) == "--out") std::ofstream(argv[2]) << out;

  CU_CHECK(cuGraphExecDestroy(one));
  CU_CHECK(cuGraphExecDestroy(eight));
  CU_CHECK(cuMemFree(byte));
  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuModuleUnload(module));
  CU_CHECK(cuCtxDestroy(context));
  return 0;
}
