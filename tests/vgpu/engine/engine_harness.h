// SPDX-License-Identifier: Apache-2.0
// Test harness for the vgpu engine: device memory over host allocations, an address
// checker over them, a printf sink that captures, and a launch helper.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "phos/vgpu/engine.h"
#include "phos/vgpu/program.h"

namespace phos::vgpu::engine::testing {

// Host memory handed out as "device" memory; every allocation is a mapping the
// checker accepts. Addresses are the host addresses, as in the daemon.
class HostDeviceMemory final : public DeviceMemory, public AddressChecker {
 public:
  ~HostDeviceMemory() override {
    for (auto& [addr, size] : allocations_) std::free(reinterpret_cast<void*>(addr));
  }

  Result<std::uint64_t> allocate(std::string_view, std::size_t bytes, std::size_t alignment,
                                 bool) override {
    return allocate(bytes, alignment);
  }
  Result<std::uint64_t> allocate(std::size_t bytes, std::size_t alignment) {
    std::size_t align = std::max<std::size_t>(alignment, 16);
    std::size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (!p) return Status(Code::kResourceExhausted, "host allocation failed");
    std::memset(p, 0, rounded);
    std::lock_guard lock(mutex_);
    allocations_[reinterpret_cast<std::uint64_t>(p)] = bytes;
    return reinterpret_cast<std::uint64_t>(p);
  }

  Status write(std::uint64_t address, std::span<const std::byte> bytes) override {
    if (!isAccessible(address, bytes.size())) {
      return Status(Code::kOutOfRange, "write outside allocations");
    }
    std::memcpy(reinterpret_cast<void*>(address), bytes.data(), bytes.size());
    return Status::ok();
  }
  int device() const override { return 0; }
  int computeCapability() const override { return 80; }

  bool isAccessible(std::uint64_t address, std::size_t size) const override {
    std::lock_guard lock(mutex_);
    auto it = allocations_.upper_bound(address);
    if (it == allocations_.begin()) return false;
    --it;
    return address >= it->first && address + size <= it->first + it->second &&
           address + size >= address;
  }

  // A typed device buffer initialised from host data.
  template <typename T>
  T* alloc(const std::vector<T>& init) {
    auto r = allocate(std::max<std::size_t>(init.size() * sizeof(T), 1), alignof(T) < 16 ? 16 : alignof(T));
    EXPECT_TRUE(r.isOk());
    T* p = reinterpret_cast<T*>(*r);
    if (!init.empty()) std::memcpy(p, init.data(), init.size() * sizeof(T));
    return p;
  }
  template <typename T>
  T* alloc(std::size_t count) {
    return alloc(std::vector<T>(count));
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::size_t> allocations_;
};

class CapturingPrintf final : public PrintfSink {
 public:
  void write(std::string_view text) override {
    std::lock_guard lock(mutex_);
    text_.append(text);
  }
  void writeError(std::string_view text) override {
    std::lock_guard lock(mutex_);
    errors_.append(text);
  }
  std::string text() const {
    std::lock_guard lock(mutex_);
    return text_;
  }
  std::string errors() const {
    std::lock_guard lock(mutex_);
    return errors_;
  }

 private:
  mutable std::mutex mutex_;
  std::string text_;
  std::string errors_;  // what goes to stderr
};

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Packs kernel arguments with the parameter layout the program reports.
class Params {
 public:
  template <typename T>
  Params& add(const T& v) {
    values_.emplace_back(reinterpret_cast<const std::byte*>(&v),
                         reinterpret_cast<const std::byte*>(&v) + sizeof(T));
    return *this;
  }
  std::vector<std::byte> pack(const FunctionInfo& f) const {
    std::vector<std::byte> buf(f.paramBufferSize);
    for (std::size_t i = 0; i < values_.size() && i < f.params.size(); ++i) {
      std::memcpy(buf.data() + f.params[i].offset, values_[i].data(),
                  std::min(values_[i].size(), f.params[i].size));
    }
    return buf;
  }
  std::size_t count() const { return values_.size(); }

 private:
  std::vector<std::vector<std::byte>> values_;
};

// A loaded module plus the memory it lives in.
class Module {
 public:
  Module() = default;
  // A module loaded into another's memory, as two modules of one context are
  // (a twin module beside its original).
  explicit Module(HostDeviceMemory& memory) : memory_(&memory) {}

  Status load(const std::string& ptx) {
    auto loader = makeProgramLoader();
    auto r = loader->load(ptx, *memory_);
    if (!r.isOk()) return r.status();
    program_ = std::move(r).value();
    return Status::ok();
  }
  Status loadFile(const std::string& path) { return load(readFile(path)); }

  // Finds a kernel whose (mangled) name contains `name`.
  std::size_t kernel(const std::string& name) const {
    const auto& fs = program_->functions();
    for (std::size_t i = 0; i < fs.size(); ++i) {
      if (fs[i].name == name) return i;
    }
    for (std::size_t i = 0; i < fs.size(); ++i) {
      if (fs[i].name.find(name) != std::string::npos) return i;
    }
    ADD_FAILURE() << "no kernel named like " << name;
    return 0;
  }

  Status launch(const std::string& name, Dim3 grid, Dim3 block, const Params& params,
                std::uint32_t dynamicShared = 0, bool cooperative = false) {
    std::size_t k = kernel(name);
    const FunctionInfo& f = program_->functions()[k];
    EXPECT_EQ(params.count(), f.params.size()) << "argument count of " << f.name;
    std::vector<std::byte> buf = params.pack(f);
    LaunchConfig config;
    config.grid = grid;
    config.block = block;
    config.dynamicSharedBytes = dynamicShared;
    config.cooperative = cooperative;
    LaunchContext context;
    context.memory = memory_;
    context.printf = &printf_;
    context.textures = textures_;
    return program_->launch(k, config, buf, context);
  }

  HostDeviceMemory& memory() { return *memory_; }
  Program& program() { return *program_; }
  // The texture and surface objects launches see (none by default).
  void setTextures(const TextureTable* textures) { textures_ = textures; }
  std::string printed() const { return printf_.text(); }
  std::string printedErrors() const { return printf_.errors(); }

  // Where the loader placed the module-scope variable `name` (cuModuleGetGlobal);
  // 0 when the module has none.
  std::uint64_t global(const std::string& name) const {
    for (const GlobalInfo& g : program_->globals()) {
      if (g.name == name) return g.address;
    }
    return 0;
  }

 private:
  HostDeviceMemory ownMemory_;
  HostDeviceMemory* memory_ = &ownMemory_;
  CapturingPrintf printf_;
  std::unique_ptr<Program> program_;
  const TextureTable* textures_ = nullptr;
};

// Texture and surface objects by handle, for tests.
class TestTextures final : public TextureTable {
 public:
  std::map<std::uint64_t, TextureView> textures, surfaces;
  std::optional<TextureView> texture(std::uint64_t handle) const override {
    return find(textures, handle);
  }
  std::optional<TextureView> surface(std::uint64_t handle) const override {
    return find(surfaces, handle);
  }

 private:
  static std::optional<TextureView> find(const std::map<std::uint64_t, TextureView>& m,
                                         std::uint64_t handle) {
    auto it = m.find(handle);
    return it == m.end() ? std::nullopt : std::optional<TextureView>(it->second);
  }
};

#ifdef PHOS_ENGINE_PTX_DIR
inline std::string ptxPath(const std::string& name) {
  return std::string(PHOS_ENGINE_PTX_DIR) + "/" + name + ".ptx";
}
#endif

// Wraps `body` in a kernel `k(.param .u64 out, .param .u64 in)` for `target`:
// %rd1 = out, %rd2 = in (both generic), %r0 = %tid.x; registers %r<64>,
// %rd<32>, %f<32>, %fd<16>, %p<16>, %h<8>. Without a prelude, `body` starts
// on line 16.
inline std::string kernel(const std::string& body, const std::string& prelude = "",
                          const std::string& target = "sm_80") {
  return ".version 8.0\n.target " + target + "\n.address_size 64\n" + prelude + R"(
.visible .entry k(.param .u64 k_out, .param .u64 k_in)
{
  .reg .pred %p<16>;
  .reg .b16 %h<8>;
  .reg .b32 %r<64>;
  .reg .b64 %rd<32>;
  .reg .f32 %f<32>;
  .reg .f64 %fd<16>;
  ld.param.u64 %rd1, [k_out];
  ld.param.u64 %rd2, [k_in];
  mov.u32 %r0, %tid.x;
)" + body + R"(
  ret;
}
)";
}

}  // namespace phos::vgpu::engine::testing
