// SPDX-License-Identifier: Apache-2.0
// The engine's ProgramLoader: parses PTX, places module globals in device memory,
// lowers the code and runs launches.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "code.h"
#include "interpreter.h"
#include "lower.h"
#include "phos/common/log.h"
#include "phos/ptx/params.h"
#include "phos/ptx/parser.h"
#include "phos/vgpu/engine.h"

namespace phos::vgpu::engine {
namespace detail {
namespace {

// Read once: hardware_concurrency() opens and parses a sysfs file, which was
// half the cost of launching an empty kernel when asked at every launch.
uint32_t defaultWorkers() {
  static const uint32_t workers = [] {
    if (const char* env = std::getenv("PHOS_VGPU_THREADS")) {
      long v = std::strtol(env, nullptr, 10);
      if (v > 0 && v <= 1024) return static_cast<uint32_t>(v);
    }
    return std::max(1u, std::thread::hardware_concurrency());
  }();
  return workers;
}

// Flattens a (possibly nested) initializer into bytes of `elemSize` elements.
Status appendInitializer(const ptx::Operand& init, uint32_t elemSize, ptx::Type type,
                         const std::unordered_map<std::string, uint64_t>& addresses,
                         const std::unordered_map<std::string, uint64_t>& functions,
                         std::vector<std::byte>& out) {
  if (init.kind == ptx::OperandKind::kVector) {
    for (const ptx::Operand& e : init.elements) {
      RETURN_IF_ERROR(appendInitializer(e, elemSize, type, addresses, functions, out));
    }
    return Status::ok();
  }
  uint64_t value = 0;
  switch (init.kind) {
    case ptx::OperandKind::kImmInt:
      value = static_cast<uint64_t>(init.value);
      if (type == ptx::Type::kF32) {
        float f = static_cast<float>(init.value);
        uint32_t b;
        std::memcpy(&b, &f, 4);
        value = b;
      } else if (type == ptx::Type::kF64) {
        double d = static_cast<double>(init.value);
        std::memcpy(&value, &d, 8);
      }
      break;
    case ptx::OperandKind::kImmFloat:
      value = init.floatBits;
      if (init.floatWidth == 64 && type == ptx::Type::kF32) {
        double d;
        std::memcpy(&d, &init.floatBits, 8);
        float f = static_cast<float>(d);
        uint32_t b;
        std::memcpy(&b, &f, 4);
        value = b;
      }
      break;
    case ptx::OperandKind::kSymbol: case ptx::OperandKind::kRegister: {
      if (auto it = addresses.find(init.name); it != addresses.end()) {
        value = it->second + static_cast<uint64_t>(init.value);
      } else if (auto fit = functions.find(init.name); fit != functions.end()) {
        value = fit->second;
      } else {
        return makeError(Code::kInvalidArgument, "initializer refers to unknown symbol {}",
                         init.name);
      }
      break;
    }
    default:
      return makeError(Code::kNotSupported, "unsupported initializer element");
  }
  size_t at = out.size();
  out.resize(at + elemSize);
  std::memcpy(out.data() + at, &value, std::min<uint32_t>(elemSize, 8));
  return Status::ok();
}

class EngineProgram final : public Program {
 public:
  const std::vector<FunctionInfo>& functions() const override { return functions_; }
  const std::vector<GlobalInfo>& globals() const override { return globals_; }

  Status launch(std::size_t function, const LaunchConfig& config,
                std::span<const std::byte> params, const LaunchContext& context) override {
    if (function >= functions_.size()) {
      return makeError(Code::kOutOfRange, "no kernel {} (module has {})", function,
                       functions_.size());
    }
    const FunctionInfo& info = functions_[function];
    if (params.size() < info.paramBufferSize) {
      return makeError(Code::kInvalidArgument, "{} needs {} parameter bytes, got {}", info.name,
                       info.paramBufferSize, params.size());
    }
    const Dim3& b = config.block;
    const Dim3& g = config.grid;
    uint64_t threads = uint64_t{b.x} * b.y * b.z;
    if (threads == 0 || threads > 1024 || g.x == 0 || g.y == 0 || g.z == 0) {
      return makeError(Code::kInvalidArgument, "invalid launch of {}: grid ({},{},{}) block ({},{},{})",
                       info.name, g.x, g.y, g.z, b.x, b.y, b.z);
    }
    if (context.memory == nullptr || context.printf == nullptr) {
      return makeError(Code::kInvalidArgument, "launch of {} without memory or printf sink",
                       info.name);
    }
    KernelLaunch launch;
    launch.code = code_.get();
    launch.function = kernelIndex_[function];
    launch.config = config;
    launch.params = params;
    launch.context = context;
    launch.workers = workers_ ? workers_ : defaultWorkers();
    AccessRecord record;
    if (recordAccesses_ || context.accesses != nullptr) launch.record = &record;
    LaunchStats stats;
    Status st = runKernel(launch, &stats);
    if (!st.isOk()) {
      // The fault names the instruction, the address and the thread.
      log::get("vgpu-engine")->warn("launch of {} ended: {}", info.name, st.message());
    }
    if (context.accesses != nullptr) {
      *context.accesses = record;
      context.accesses->recorded = true;
    }
    {
      std::lock_guard lock(statsMutex_);
      stats_ = stats;
      if (recordAccesses_) {
        record.recorded = true;
        accesses_ = std::move(record);
      } else {
        accesses_ = {};
      }
    }
    return st;
  }

  AccessRecord accesses() const {
    std::lock_guard lock(statsMutex_);
    return accesses_;
  }
  void setRecordAccesses(bool enabled) { recordAccesses_ = enabled; }

  LaunchStats stats() const {
    std::lock_guard lock(statsMutex_);
    return stats_;
  }
  void setWorkers(uint32_t workers) { workers_ = workers; }

  std::unique_ptr<ExecModule> code_;
  std::vector<FunctionInfo> functions_;
  std::vector<uint32_t> kernelIndex_;
  std::vector<GlobalInfo> globals_;

 private:
  mutable std::mutex statsMutex_;
  LaunchStats stats_;
  AccessRecord accesses_;
  std::atomic<bool> recordAccesses_{false};
  uint32_t workers_ = 0;
};

class EngineLoader final : public ProgramLoader {
 public:
  Result<std::unique_ptr<Program>> load(std::string_view ptx, DeviceMemory& memory) override {
    Result<ptx::Module> parsed = ptx::parseModule(ptx);
    if (!parsed.isOk()) {
      return Status(Code::kInvalidArgument, parsed.status().message());
    }
    auto module = std::make_shared<const ptx::Module>(std::move(parsed).value());
    auto program = std::make_unique<EngineProgram>();

    // Function addresses (for initializers holding function pointers).
    std::unordered_map<std::string, uint64_t> functionAddresses;
    {
      uint64_t index = 0;
      for (const ptx::ModuleItem& item : module->items) {
        if (const auto* f = std::get_if<ptx::Function>(&item)) {
          if (!functionAddresses.count(f->name)) {
            functionAddresses[f->name] = kFunctionWindow + index++ * 16;
          }
        }
      }
    }
    // Allocate every .global/.const variable, then write initializers (which may
    // hold the address of any of them).
    std::unordered_map<std::string, uint64_t> addresses;
    std::vector<const ptx::VarDecl*> decls;
    for (const ptx::ModuleItem& item : module->items) {
      const auto* d = std::get_if<ptx::VarDecl>(&item);
      if (!d || (d->space != ptx::StateSpace::kGlobal && d->space != ptx::StateSpace::kConst)) {
        continue;
      }
      if (d->linkage == ptx::Linkage::kExtern) {
        return makeError(Code::kNotSupported, "external variable {} needs linking", d->name);
      }
      uint64_t size = std::max<uint64_t>(d->byteSize(), 1);
      uint64_t align = d->align ? d->align : std::max<uint32_t>(ptx::typeSize(d->type), 1);
      align = std::min<uint64_t>(std::bit_ceil(align), 4096);
      Result<uint64_t> addr = memory.allocate(d->name, size, align, d->managed);
      if (!addr.isOk()) {
        return Status(Code::kResourceExhausted,
                      fmt::format("allocating {} bytes for {}: {}", size, d->name,
                                  addr.status().message()));
      }
      addresses[d->name] = *addr;
      decls.push_back(d);
      program->globals_.push_back({d->name, *addr, static_cast<size_t>(size), d->managed});
    }
    for (const ptx::VarDecl* d : decls) {
      uint64_t size = std::max<uint64_t>(d->byteSize(), 1);
      std::vector<std::byte> bytes;
      if (d->init) {
        RETURN_IF_ERROR_CTX(appendInitializer(*d->init, ptx::typeSize(d->type), d->type,
                                              addresses, functionAddresses, bytes),
                            fmt::format("initializer of {}", d->name));
      }
      bytes.resize(size, std::byte{0});
      RETURN_IF_ERROR_CTX(memory.write(addresses[d->name], bytes),
                          fmt::format("writing initializer of {}", d->name));
    }
    ASSIGN_OR_RETURN(program->code_, lowerModule(module, addresses));
    const ExecModule& code = *program->code_;
    for (size_t i = 0; i < code.functions.size(); ++i) {
      const Function& fn = code.functions[i];
      if (!fn.isEntry || !fn.hasBody) continue;
      const ptx::Function* src = module->findFunction(fn.name);
      FunctionInfo info;
      info.name = fn.name;
      ASSIGN_OR_RETURN(ptx::ParamLayout layout, ptx::computeParamLayout(*src));
      for (const ptx::ParamInfo& p : layout.params) info.params.push_back({p.offset, p.size});
      info.paramBufferSize = layout.totalSize;
      info.staticSharedBytes = code.moduleSharedBytes + fn.scopedSharedBytes;
      info.localBytesPerThread = fn.localBytes;
      for (const ptx::FunctionAttribute& a : src->attributes) {
        if ((a.kind == ptx::FunctionAttribute::Kind::kMaxNtid ||
             a.kind == ptx::FunctionAttribute::Kind::kReqNtid) && !a.values.empty()) {
          uint64_t product = 1;
          for (uint32_t v : a.values) product *= v;
          info.maxThreadsPerBlock = static_cast<int>(std::min<uint64_t>(product, 1024));
        }
        if (a.kind == ptx::FunctionAttribute::Kind::kReqNctaPerCluster) {
          for (size_t d = 0; d < 3; ++d) info.requiredCluster[d] = d < a.values.size() ? a.values[d] : 1;
        }
      }
      program->functions_.push_back(std::move(info));
      program->kernelIndex_.push_back(static_cast<uint32_t>(i));
    }
    return std::unique_ptr<Program>(std::move(program));
  }
};

}  // namespace
}  // namespace detail

std::shared_ptr<ProgramLoader> makeProgramLoader() {
  return std::make_shared<detail::EngineLoader>();
}

LaunchStats lastLaunchStats(const Program& program) {
  if (const auto* p = dynamic_cast<const detail::EngineProgram*>(&program)) return p->stats();
  return {};
}

void setWorkerThreads(Program& program, uint32_t workers) {
  if (auto* p = dynamic_cast<detail::EngineProgram*>(&program)) p->setWorkers(workers);
}

void setRecordAccesses(Program& program, bool enabled) {
  if (auto* p = dynamic_cast<detail::EngineProgram*>(&program)) p->setRecordAccesses(enabled);
}

AccessRecord lastLaunchAccesses(const Program& program) {
  if (const auto* p = dynamic_cast<const detail::EngineProgram*>(&program)) return p->accesses();
  return {};
}

}  // namespace phos::vgpu::engine
