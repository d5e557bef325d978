// SPDX-License-Identifier: Apache-2.0
// Shared by vgpu's Driver API tests: CUresult matchers, a context fixture and a recording ProgramLoader.
#pragma once

#include <cuda.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "phos/vgpu/export_table.h"
#include "phos/vgpu/program.h"

namespace phos::vgpu::testing {

inline std::string resultName(CUresult r) {
  const char* name = nullptr;
  return cuGetErrorName(r, &name) == CUDA_SUCCESS ? name : "CUresult " + std::to_string(static_cast<int>(r));
}

// EXPECT_CU(cuFoo(...)) and EXPECT_CU_ERR(CUDA_ERROR_X, cuFoo(...)) print names.
#define EXPECT_CU(expr) EXPECT_EQ(::phos::vgpu::testing::resultName(expr), "CUDA_SUCCESS")
#define ASSERT_CU(expr) ASSERT_EQ(::phos::vgpu::testing::resultName(expr), "CUDA_SUCCESS")
#define EXPECT_CU_ERR(code, expr) \
  EXPECT_EQ(::phos::vgpu::testing::resultName(expr), ::phos::vgpu::testing::resultName(code))

inline const ExportTable* exportTable() {
  const void* table = nullptr;
  if (cuGetExportTable(&table, &kExportTableId) != CUDA_SUCCESS) return nullptr;
  return static_cast<const ExportTable*>(table);
}

// One launch as the driver handed it to Program::launch.
struct RecordedLaunch {
  std::string kernel;
  LaunchConfig config;
  std::vector<std::byte> params;
  int device = 0;
};

// What a test module looks like: kernels with their parameter layout, globals
// with initial bytes, and optional host-side behaviour for a kernel.
struct FakeKernel {
  FunctionInfo info;
  // Runs inside Program::launch on the stream's worker; may fault.
  std::function<Status(const LaunchConfig&, std::span<const std::byte>, const LaunchContext&)> body;
};
struct FakeGlobal {
  std::string name;
  std::vector<std::byte> initial;
};
struct FakeModule {
  std::vector<FakeKernel> kernels;
  std::vector<FakeGlobal> globals;
};

// A ProgramLoader that parses nothing: every load yields `module`, and it keeps
// the PTX text it was given and every launch, so tests check exactly what the
// driver extracted, validated and packed.
class RecordingLoader final : public ProgramLoader {
 public:
  class FakeProgram final : public Program {
   public:
    FakeProgram(RecordingLoader& owner, FakeModule module, std::vector<GlobalInfo> globals)
        : owner_(owner), module_(std::move(module)), globals_(std::move(globals)) {
      for (const FakeKernel& k : module_.kernels) functions_.push_back(k.info);
    }
    const std::vector<FunctionInfo>& functions() const override { return functions_; }
    const std::vector<GlobalInfo>& globals() const override { return globals_; }
    Status launch(std::size_t function, const LaunchConfig& config, std::span<const std::byte> params,
                  const LaunchContext& context) override {
      {
        std::lock_guard lock(owner_.mutex_);
        owner_.launches_.push_back(RecordedLaunch{functions_.at(function).name, config,
                                                  std::vector<std::byte>(params.begin(), params.end()),
                                                  context.device});
      }
      const FakeKernel& k = module_.kernels.at(function);
      return k.body ? k.body(config, params, context) : Status::ok();
    }

   private:
    RecordingLoader& owner_;
    FakeModule module_;
    std::vector<FunctionInfo> functions_;
    std::vector<GlobalInfo> globals_;
  };

  explicit RecordingLoader(FakeModule module) : module_(std::move(module)) {}

  Result<std::unique_ptr<Program>> load(std::string_view ptx, DeviceMemory& memory) override {
    {
      std::lock_guard lock(mutex_);
      loadedPtx_.emplace_back(ptx);
    }
    if (failWith_.has_value()) return *failWith_;
    std::vector<GlobalInfo> globals;
    for (const FakeGlobal& g : module_.globals) {
      auto address = memory.allocate(g.name, g.initial.size(), 8, false);
      if (!address.isOk()) return address.status();
      Status written = memory.write(*address, g.initial);
      if (!written.isOk()) return written;
      globals.push_back(GlobalInfo{g.name, *address, g.initial.size()});
    }
    return std::unique_ptr<Program>(std::make_unique<FakeProgram>(*this, module_, std::move(globals)));
  }

  void failLoadsWith(Status status) { failWith_ = std::move(status); }
  std::vector<RecordedLaunch> launches() const {
    std::lock_guard lock(mutex_);
    return launches_;
  }
  std::vector<std::string> loadedPtx() const {
    std::lock_guard lock(mutex_);
    return loadedPtx_;
  }

 private:
  FakeModule module_;
  std::optional<Status> failWith_;
  mutable std::mutex mutex_;
  std::vector<RecordedLaunch> launches_;
  std::vector<std::string> loadedPtx_;
};

// A minimal PTX text: the recording loader ignores it, the driver only checks
// that it looks like PTX.
inline const char* kTinyPtx =
    ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n";

// A host function that blocks its stream until the test opens the gate.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  static void CUDA_CB wait(void* self) {
    auto* g = static_cast<Gate*>(self);
    std::unique_lock lock(g->mutex);
    g->cv.wait(lock, [&] { return g->open; });
  }
  void release() {
    {
      std::lock_guard lock(mutex);
      open = true;
    }
    cv.notify_all();
  }
};

// cuInit, a fresh context current on the test's thread (destroyed afterwards).
class DriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&device_, 0));
    ASSERT_CU(cuCtxCreate(&context_, nullptr, 0, device_));
  }
  void TearDown() override {
    if (context_ != nullptr) (void)cuCtxDestroy(context_);
    if (const ExportTable* table = exportTable()) table->setProgramLoader(nullptr);
  }

  std::shared_ptr<RecordingLoader> installLoader(FakeModule module) {
    auto loader = std::make_shared<RecordingLoader>(std::move(module));
    const ExportTable* table = exportTable();
    EXPECT_NE(table, nullptr);
    if (table != nullptr) table->setProgramLoader(loader);
    return loader;
  }

  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

}  // namespace phos::vgpu::testing
