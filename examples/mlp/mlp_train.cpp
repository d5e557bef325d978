// SPDX-License-Identifier: Apache-2.0
// mlp-train: a small MLP trained on synthetic data through the CUDA Driver API.
//
// The example GPU job of PhOS: deterministic (every kernel sums in a fixed
// order), so two runs, or a run that was checkpointed and restored, print the
// same losses bit for bit and end with the same weight checksum. The kernels
// are compiled to PTX by nvcc at build time (mlp_kernels.ptx next to this
// program) and loaded with cuModuleLoadData, as a framework's JIT would.
//
// --state-mib N adds N MiB of device memory standing in for optimizer state, so
// that checkpoints of a few GB can be measured: filled on the device (one
// cuMemsetD32 pattern per MiB), one 1 MiB window of it updated by a kernel each
// step from the step's loss and weights, and all of it folded into the final
// checksum, so a wrongly restored byte anywhere in it changes that line. The
// step lines do not depend on it; with N = 0 the output is that of the plain run.
//
// --devices N spreads the state over N devices: the MLP trains on device 0, and
// each device d > 0 holds its own state (--state-mib takes one value per device),
// whose windows a kernel on device d updates each step from the loss and weights
// that device 0 copies to it over the peer link (cuMemcpyPeer). With one device
// the output is that of the plain run.
//
// --checkpoint-at STEP --checkpoint-image DIR asks PhOS, through the application
// SDK (sdk/include/phos/sdk.h), for an asynchronous checkpoint right after that
// step's line: one line of code, and the job runs on.
#include <phos/sdk.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>

namespace {

[[noreturn]] void fail(const char* what, CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = "unknown CUresult";
  std::fprintf(stderr, "mlp-train: %s failed: %s (%d)\n", what, name, static_cast<int>(r));
  std::exit(1);
}

#define CHECK(call)                    \
  do {                                 \
    CUresult r_ = (call);              \
    if (r_ != CUDA_SUCCESS) fail(#call, r_); \
  } while (0)

// A linear congruential generator: the same numbers on every platform.
struct Lcg {
  uint64_t state;
  uint32_t next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  }
  float uniform() { return static_cast<float>(next()) / 2147483648.0f - 1.0f; }  // [-1, 1)
};

std::filesystem::path defaultPtxPath() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path() / "mlp_kernels.ptx";
}

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
};

DeviceBuffer alloc(size_t bytes) {
  DeviceBuffer b{0, bytes};
  CHECK(cuMemAlloc(&b.ptr, bytes));
  return b;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer b = alloc(host.size() * sizeof(T));
  CHECK(cuMemcpyHtoD(b.ptr, host.data(), b.bytes));
  return b;
}

void launch(CUfunction f, unsigned gx, unsigned gy, unsigned bx, unsigned by,
            std::vector<void*> args) {
  CHECK(cuLaunchKernel(f, gx, gy, 1, bx, by, 1, 0, nullptr, args.data(), nullptr));
}

constexpr size_t kMiB = size_t{1} << 20;

// The value of every 32-bit word of MiB `index` of the state before the first step.
unsigned statePattern(size_t index) { return 0x9e3779b9u * static_cast<unsigned>(index + 1); }

unsigned blocks(int n, unsigned per) { return (static_cast<unsigned>(n) + per - 1) / per; }

std::string floatBits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  char text[16];
  std::snprintf(text, sizeof text, "%08x", bits);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small MLP on synthetic data with the CUDA Driver API (deterministic)"};
  int iterations = 30;
  int sleepMs = 0;
  int devices = 1;
  std::vector<int> stateMibs{0};
  int stateTensors = 1;
  int dirtyMib = 1;
  bool dirtySpread = false;
  int hostMib = 0;
  int checkpointAt = -1;
  std::string checkpointImage, checkpointMode = "cow";
  std::string ptxPath = defaultPtxPath().string();
  app.add_option("--iterations", iterations, "training steps")->check(CLI::Range(1, 1000000));
  app.add_option("--sleep-ms", sleepMs, "pause after each step (to checkpoint mid-run)")
      ->check(CLI::Range(0, 60000));
  app.add_option("--devices", devices, "devices used: the MLP trains on device 0, each holds state (default 1)")
      ->check(CLI::Range(1, 16));
  app.add_option("--state-mib", stateMibs,
                 "extra device memory in MiB standing in for optimizer state: filled on the "
                 "device, a 1 MiB window of it updated every step, all of it in the final "
                 "checksum (default 0: none); with --devices, one value per device (or one for all)")
      ->delimiter(',')
      ->check(CLI::Range(0, 65536));
  app.add_option("--state-tensors", stateTensors,
                 "split the state into this many allocations, as a framework's many tensors (the output "
                 "does not change; default 1)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--dirty-mib", dirtyMib,
                 "MiB of the state written per step: that many consecutive 1 MiB windows (default 1; a "
                 "migration's or checkpoint's write rate)")
      ->check(CLI::Range(1, 65536));
  app.add_flag("--dirty-spread", dirtySpread,
               "spread a step's --dirty-mib windows evenly over the state instead of consecutive ones, so that "
               "every step writes all over it, as a full optimizer step does");
  app.add_option("--host-mib", hostMib,
                 "host memory in MiB standing in for a data set held in RAM: filled at start, one 1 MiB batch "
                 "of it read per step, all batches read in the final checksum (default 0: none)")
      ->check(CLI::Range(0, 65536));
  app.add_option("--ptx", ptxPath, "the kernels' PTX (default: next to this program)");
  app.add_option("--checkpoint-at", checkpointAt,
                 "under PhOS: ask for a checkpoint of this process after this step (application SDK)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--checkpoint-image", checkpointImage, "the image directory of --checkpoint-at");
  app.add_option("--checkpoint-mode", checkpointMode, "its protocol: cow (default), recopy or stop")
      ->check(CLI::IsMember({"cow", "recopy", "stop"}));
  CLI11_PARSE(app, argc, argv);
  if (stateMibs.size() == 1) stateMibs.resize(static_cast<size_t>(devices), stateMibs.front());
  if (stateMibs.size() != static_cast<size_t>(devices)) {
    std::fprintf(stderr, "mlp-train: --state-mib has %zu values for %d devices\n", stateMibs.size(), devices);
    return 2;
  }
  for (int mib : stateMibs) {
    if (mib > 0 && stateTensors > mib) {
      std::fprintf(stderr, "mlp-train: --state-tensors %d is more than --state-mib %d\n", stateTensors, mib);
      return 2;
    }
  }
  if (checkpointAt >= 0 && checkpointImage.empty()) {
    std::fprintf(stderr, "mlp-train: --checkpoint-at needs --checkpoint-image\n");
    return 2;
  }

  std::ifstream ptxFile(ptxPath);
  if (!ptxFile) {
    std::fprintf(stderr, "mlp-train: cannot read the kernels' PTX at %s\n", ptxPath.c_str());
    return 2;
  }
  std::stringstream ptx;
  ptx << ptxFile.rdbuf();

  constexpr int kRows = 256, kIn = 32, kHidden = 64, kClasses = 8;
  constexpr float kLearningRate = 0.1f;

  CHECK(cuInit(0));
  int deviceCount = 0;
  CHECK(cuDeviceGetCount(&deviceCount));
  if (devices > deviceCount) {
    std::fprintf(stderr, "mlp-train: --devices %d, but the driver has %d device(s)\n", devices, deviceCount);
    return 2;
  }
  std::vector<CUdevice> deviceIds(static_cast<size_t>(devices));
  std::vector<CUcontext> contexts(static_cast<size_t>(devices));
  for (int d = 0; d < devices; ++d) {
    CHECK(cuDeviceGet(&deviceIds[d], d));
    CHECK(cuDevicePrimaryCtxRetain(&contexts[d], deviceIds[d]));
  }
  CHECK(cuCtxSetCurrent(contexts[0]));
  CUmodule module;
  CHECK(cuModuleLoadData(&module, ptx.str().c_str()));
  auto function = [&](const char* name) {
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, module, name));
    return f;
  };
  CUfunction linearForward = function("linear_forward"), softmaxXent = function("softmax_xent"),
             mean = function("mean_256"), weightGrad = function("weight_grad"),
             biasGrad = function("bias_grad"), hiddenGrad = function("hidden_grad"),
             sgd = function("sgd_step");

  // Synthetic data: each class is a random centre; samples are centre + noise.
  Lcg rng{42};
  std::vector<float> centres(kClasses * kIn);
  for (float& c : centres) c = rng.uniform();
  std::vector<float> x(kRows * kIn);
  std::vector<int> labels(kRows);
  for (int i = 0; i < kRows; ++i) {
    labels[i] = static_cast<int>(rng.next() % kClasses);
    for (int k = 0; k < kIn; ++k) x[i * kIn + k] = centres[labels[i] * kIn + k] + 0.8f * rng.uniform();
  }
  std::vector<float> w1(kIn * kHidden), b1(kHidden, 0.0f), w2(kHidden * kClasses), b2(kClasses, 0.0f);
  for (float& w : w1) w = rng.uniform() * std::sqrt(1.0f / kIn);
  for (float& w : w2) w = rng.uniform() * std::sqrt(1.0f / kHidden);

  DeviceBuffer dX = upload(x), dLabels = upload(labels), dW1 = upload(w1), dB1 = upload(b1),
               dW2 = upload(w2), dB2 = upload(b2);
  DeviceBuffer dH = alloc(kRows * kHidden * 4), dLogits = alloc(kRows * kClasses * 4),
               dDlogits = alloc(kRows * kClasses * 4), dLosses = alloc(kRows * 4),
               dLoss = alloc(4), dGW2 = alloc(dW2.bytes), dGB2 = alloc(dB2.bytes),
               dDh = alloc(kRows * kHidden * 4), dGW1 = alloc(dW1.bytes), dGB1 = alloc(dB1.bytes);

  // The state of each device: its MiB in stateTensors allocations (the first
  // ones one MiB larger when it does not divide), MiB m of it at at(m). A
  // device other than 0 has the kernels loaded in its own context, and its
  // own copies of the loss and first-layer weights that the updates read.
  struct Shard {
    size_t mib = 0;
    std::vector<DeviceBuffer> tensors;
    std::vector<size_t> firstMib;
    CUmodule module = nullptr;
    CUfunction update = nullptr;
    DeviceBuffer loss, w1;
    CUdeviceptr at(size_t m) const {
      size_t t = static_cast<size_t>(std::upper_bound(firstMib.begin(), firstMib.end(), m) - firstMib.begin()) - 1;
      return tensors[t].ptr + (m - firstMib[t]) * kMiB;
    }
  };
  std::vector<Shard> shards(static_cast<size_t>(devices));
  for (int d = 0; d < devices; ++d) {
    Shard& shard = shards[d];
    shard.mib = static_cast<size_t>(stateMibs[d]);
    if (shard.mib == 0) continue;
    CHECK(cuCtxSetCurrent(contexts[d]));
    for (int t = 0, first = 0; t < stateTensors; ++t) {
      const int mib = stateMibs[d] / stateTensors + (t < stateMibs[d] % stateTensors ? 1 : 0);
      shard.tensors.push_back(alloc(static_cast<size_t>(mib) * kMiB));
      shard.firstMib.push_back(static_cast<size_t>(first));
      first += mib;
    }
    // Device d's MiB m starts as MiB m + d * 65536 of one long pattern.
    for (size_t m = 0; m < shard.mib; ++m) {
      CHECK(cuMemsetD32(shard.at(m), statePattern(m + static_cast<size_t>(d) * 65536), kMiB / 4));
    }
    if (d == 0) {
      shard.module = module;
      shard.loss = dLoss;
      shard.w1 = dW1;
    } else {
      CHECK(cuModuleLoadData(&shard.module, ptx.str().c_str()));
      shard.loss = alloc(dLoss.bytes);
      shard.w1 = alloc(dW1.bytes);
    }
    CHECK(cuModuleGetFunction(&shard.update, shard.module, "state_update"));
  }
  CHECK(cuCtxSetCurrent(contexts[0]));
  int windowWords = static_cast<int>(kMiB / 4);

  int rows = kRows, in = kIn, hidden = kHidden, classes = kClasses, one = 1, zero = 0;
  float lr = kLearningRate;
  int nW1 = kIn * kHidden, nB1 = kHidden, nW2 = kHidden * kClasses, nB2 = kClasses;
  // The data set in host memory: deterministic bytes, a batch read per step.
  std::vector<uint64_t> hostData(static_cast<size_t>(hostMib) * kMiB / sizeof(uint64_t));
  for (uint64_t i = 0, bits = 0x9e3779b97f4a7c15u; i < hostData.size(); ++i) {
    bits ^= bits << 13;
    bits ^= bits >> 7;
    bits ^= bits << 17;
    hostData[i] = bits;
  }
  uint64_t batches = 0;  // what the steps read of it
  for (int step = 0; step < iterations; ++step) {
    if (hostMib > 0) {
      const size_t words = kMiB / sizeof(uint64_t);
      const uint64_t* batch = hostData.data() + static_cast<size_t>(step % hostMib) * words;
      batches = XXH3_64bits_withSeed(batch, kMiB, batches);
    }
    // Forward.
    launch(linearForward, blocks(kHidden, 16), blocks(kRows, 16), 16, 16,
           {&dX.ptr, &dW1.ptr, &dB1.ptr, &dH.ptr, &rows, &in, &hidden, &one});
    launch(linearForward, blocks(kClasses, 8), blocks(kRows, 32), 8, 32,
           {&dH.ptr, &dW2.ptr, &dB2.ptr, &dLogits.ptr, &rows, &hidden, &classes, &zero});
    launch(softmaxXent, blocks(kRows, 128), 1, 128, 1,
           {&dLogits.ptr, &dLabels.ptr, &dDlogits.ptr, &dLosses.ptr, &rows, &classes});
    launch(mean, 1, 1, 256, 1, {&dLosses.ptr, &dLoss.ptr, &rows});
    // Backward.
    launch(weightGrad, blocks(kClasses, 8), blocks(kHidden, 32), 8, 32,
           {&dH.ptr, &dDlogits.ptr, &dGW2.ptr, &rows, &hidden, &classes});
    launch(biasGrad, 1, 1, 32, 1, {&dDlogits.ptr, &dGB2.ptr, &rows, &classes});
    launch(hiddenGrad, blocks(kHidden, 16), blocks(kRows, 16), 16, 16,
           {&dDlogits.ptr, &dW2.ptr, &dH.ptr, &dDh.ptr, &rows, &hidden, &classes});
    launch(weightGrad, blocks(kHidden, 16), blocks(kIn, 16), 16, 16,
           {&dX.ptr, &dDh.ptr, &dGW1.ptr, &rows, &in, &hidden});
    launch(biasGrad, blocks(kHidden, 64), 1, 64, 1, {&dDh.ptr, &dGB1.ptr, &rows, &hidden});
    // Update.
    launch(sgd, blocks(nW1, 256), 1, 256, 1, {&dW1.ptr, &dGW1.ptr, &lr, &nW1});
    launch(sgd, 1, 1, 256, 1, {&dB1.ptr, &dGB1.ptr, &lr, &nB1});
    launch(sgd, blocks(nW2, 256), 1, 256, 1, {&dW2.ptr, &dGW2.ptr, &lr, &nW2});
    launch(sgd, 1, 1, 256, 1, {&dB2.ptr, &dGB2.ptr, &lr, &nB2});
    // Device d's windows of the step; its kernels read device d's copies of
    // the loss and weights.
    auto updateState = [&](int d) {
      const Shard& shard = shards[d];
      for (int w = 0; shard.mib > 0 && w < dirtyMib; ++w) {
        const size_t stride = dirtySpread ? std::max<size_t>(1, shard.mib / static_cast<size_t>(dirtyMib)) : 1;
        const size_t first = dirtySpread ? static_cast<size_t>(step) : static_cast<size_t>(step) * dirtyMib;
        CUdeviceptr window = shard.at((first + static_cast<size_t>(w) * stride) % shard.mib);
        CUdeviceptr lossPtr = shard.loss.ptr, w1Ptr = shard.w1.ptr;
        unsigned stepBits = static_cast<unsigned>(step) + (static_cast<unsigned>(d) << 16);
        launch(shard.update, blocks(windowWords / 4, 256), 1, 256, 1,
               {&window, &lossPtr, &w1Ptr, &nW1, &windowWords, &stepBits});
      }
    };
    updateState(0);

    float loss = 0;
    CHECK(cuMemcpyDtoH(&loss, dLoss.ptr, sizeof loss));  // synchronizes the step
    for (int d = 1; d < devices; ++d) {
      if (shards[d].mib == 0) continue;
      CHECK(cuCtxSetCurrent(contexts[d]));
      CHECK(cuMemcpyPeer(shards[d].loss.ptr, contexts[d], dLoss.ptr, contexts[0], dLoss.bytes));
      CHECK(cuMemcpyPeer(shards[d].w1.ptr, contexts[d], dW1.ptr, contexts[0], dW1.bytes));
      updateState(d);
      CHECK(cuCtxSynchronize());
    }
    CHECK(cuCtxSetCurrent(contexts[0]));
    std::printf("step %d loss %.6f (%s)\n", step, static_cast<double>(loss), floatBits(loss).c_str());
    std::fflush(stdout);
    if (step == checkpointAt && phos_checkpoint(checkpointImage.c_str(), checkpointMode.c_str()) != 0) {
      std::fprintf(stderr, "mlp-train: no checkpoint at step %d: %s\n", step,
                   errno == ENOSYS ? "not running under PhOS" : std::strerror(errno));
    }
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }

  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  if (hostMib > 0) {
    XXH3_64bits_update(hash, &batches, sizeof batches);
    XXH3_64bits_update(hash, hostData.data(), hostData.size() * sizeof(uint64_t));
  }
  for (const DeviceBuffer* b : {&dW1, &dB1, &dW2, &dB2}) {
    std::vector<unsigned char> host(b->bytes);
    CHECK(cuMemcpyDtoH(host.data(), b->ptr, b->bytes));
    XXH3_64bits_update(hash, host.data(), host.size());
  }
  // The state after the weights, device by device, read in slices: it may be
  // larger than host memory can spare.
  std::vector<unsigned char> slice(std::min(
      static_cast<size_t>(*std::max_element(stateMibs.begin(), stateMibs.end())) * kMiB, 64 * kMiB));
  for (int d = 0; d < devices; ++d) {
    CHECK(cuCtxSetCurrent(contexts[d]));
    for (const DeviceBuffer& tensor : shards[d].tensors) {
      for (size_t done = 0; done < tensor.bytes; done += slice.size()) {
        size_t n = std::min(slice.size(), tensor.bytes - done);
        CHECK(cuMemcpyDtoH(slice.data(), tensor.ptr + done, n));
        XXH3_64bits_update(hash, slice.data(), n);
      }
    }
    if (d > 0 && shards[d].module != nullptr) CHECK(cuModuleUnload(shards[d].module));
  }
  std::printf("weights checksum %016llx\n",
              static_cast<unsigned long long>(XXH3_64bits_digest(hash)));
  XXH3_freeState(hash);
  CHECK(cuCtxSetCurrent(contexts[0]));
  CHECK(cuModuleUnload(module));
  for (int d = 0; d < devices; ++d) CHECK(cuDevicePrimaryCtxRelease(deviceIds[d]));
  return 0;
}
