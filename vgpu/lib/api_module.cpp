// SPDX-License-Identifier: Apache-2.0
// Entry points: modules, libraries and kernels, the linker, function attributes, launches, occupancy.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string_view>

#include "entry.h"
#include "fatbin.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::handleOf;
using phos::vgpu::api::requireNonNull;

PHOS_CU_EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                    unsigned int gridDimZ, unsigned int blockDimX,
                                                    unsigned int blockDimY, unsigned int blockDimZ,
                                                    unsigned int sharedMemBytes, CUstream hStream,
                                                    void** kernelParams, void** extra);
PHOS_CU_EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                                      void** extra);
PHOS_CU_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                               unsigned int gridDimY, unsigned int gridDimZ,
                                                               unsigned int blockDimX, unsigned int blockDimY,
                                                               unsigned int blockDimZ, unsigned int sharedMemBytes,
                                                               CUstream hStream, void** kernelParams);

namespace {

template <typename T>
std::uint64_t idOf(T handle) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle));
}

// A load's or a link's JIT options: checked before it, their outputs written
// after it as the documentation says. vgpu's compiler reports only errors: the
// error log holds why a load failed, the info log stays empty; the log sizes
// become "OUT: Amount of log buffer filled with messages" (the terminator
// included); the wall time is the load's. CU_JIT_MAX_REGISTERS caps what
// cuFuncGetAttribute(CU_FUNC_ATTRIBUTE_NUM_REGS) reports, as ptxas's cap
// does; the other options change nothing vgpu runs.
class JitOptions {
 public:
  static Result<JitOptions> of(unsigned count, CUjit_option* options, void** values) {
    if (count > 0 && (options == nullptr || values == nullptr)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} JIT options without option arrays", count);
    }
    for (unsigned i = 0; i < count; ++i) {
      if (options[i] < 0 || options[i] >= CU_JIT_NUM_OPTIONS) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "JIT option {} does not exist",
                        static_cast<int>(options[i]));
      }
    }
    return JitOptions(count, options, values);
  }

  int maxRegisters() const {
    for (unsigned i = 0; i < count_; ++i) {
      if (options_[i] == CU_JIT_MAX_REGISTERS) return static_cast<int>(scalar(i));
    }
    return 0;
  }

  void report(const Status& result) const {
    const std::string error = result.isOk() ? std::string() : result.message();
    auto filled = [&](CUjit_option sizeOption, CUjit_option bufferOption, const std::string& text) {
      const int sized = find(sizeOption);
      const int buffer = find(bufferOption);
      if (sized < 0) return;
      const std::size_t room = scalar(static_cast<unsigned>(sized));
      std::size_t used = 0;  // an empty log fills nothing
      if (buffer >= 0 && values_[buffer] != nullptr && room > 0) {
        const std::size_t copied = std::min(text.size(), room - 1);
        std::memcpy(values_[buffer], text.data(), copied);
        static_cast<char*>(values_[buffer])[copied] = '\0';
        used = copied == 0 ? 0 : copied + 1;
      }
      values_[sized] = reinterpret_cast<void*>(static_cast<std::uintptr_t>(used));
    };
    filled(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER, std::string());
    filled(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER, error);
    if (int wall = find(CU_JIT_WALL_TIME); wall >= 0) {
      // "Overwrites the option value with the total wall clock time, in milliseconds".
      const float ms =
          std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - start_)
              .count();
      values_[wall] = nullptr;
      std::memcpy(&values_[wall], &ms, sizeof(ms));
    }
  }

 private:
  JitOptions(unsigned count, CUjit_option* options, void** values)
      : count_(count),
        options_(options),
        values_(values),
        start_(std::chrono::steady_clock::now()) {}
  int find(CUjit_option option) const {
    for (unsigned i = 0; i < count_; ++i) {
      if (options_[i] == option) return static_cast<int>(i);
    }
    return -1;
  }
  std::size_t scalar(unsigned i) const {
    return static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(values_[i]) & 0xffffffffu);
  }

  unsigned count_;
  CUjit_option* options_;
  void** values_;
  std::chrono::steady_clock::time_point start_;
};

CUresult moduleOut(const char* name, CUmodule* module, const std::function<Result<CUmodule>(Driver&)>& load) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(module, "module"));
    ASSIGN_OR_RETURN(CUmodule m, load(d));
    *module = m;
    return Status::ok();
  });
}

Result<const FunctionInfo*> infoOf(const std::shared_ptr<Function>& f) {
  return &f->program->functions().at(f->index);
}

// Registers per thread of `f`: its program's, capped by the
// CU_JIT_MAX_REGISTERS its module was loaded with.
int registersOf(const Function& f, const FunctionInfo& info) {
  auto m = f.module.lock();
  return m && m->maxRegisters > 0 ? std::min(info.registersPerThread, m->maxRegisters)
                                  : info.registersPerThread;
}

// A kernel's function where it is asked of a kernel without a context (its
// name, its parameters): the current context's, else where the library loaded.
Result<std::shared_ptr<Function>> kernelFunction(Driver& d, CUkernel kernel) {
  return d.kernelFunction(kernel, false);
}

Status moduleHasCode(const Module& m) {
  if (m.program) return Status::ok();
  return cuError(CUDA_ERROR_NO_BINARY_FOR_GPU, m.noBinary);
}

Status globalOf(const std::shared_ptr<Module>& m, const char* name, CUdeviceptr* dptr, size_t* bytes) {
  RETURN_IF_ERROR(requireNonNull(name, "name"));
  RETURN_IF_ERROR(moduleHasCode(*m));
  for (const GlobalInfo& g : m->program->globals()) {
    if (g.name != name) continue;
    // "Both parameters dptr and bytes are optional."
    if (dptr != nullptr) *dptr = g.address;
    if (bytes != nullptr) *bytes = g.size;
    return Status::ok();
  }
  return cuErrorf(CUDA_ERROR_NOT_FOUND, "module has no global named '{}'", name);
}

Status functionAttribute(Driver& d, int* pi, CUfunction_attribute attrib, const std::shared_ptr<Function>& f) {
  RETURN_IF_ERROR(requireNonNull(pi, "pi"));
  ASSIGN_OR_RETURN(const FunctionInfo* info, infoOf(f));
  auto m = f->module.lock();
  const DeviceProfile& profile = d.platform().devices.at(static_cast<std::size_t>(m ? m->device : 0));
  int cc = profile.ccMajor * 10 + profile.ccMinor;
  int optIn = f->dynamicSharedOptIn();
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = std::min(1024, info->maxThreadsPerBlock); break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *pi = static_cast<int>(info->staticSharedBytes); break;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *pi = 0; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *pi = static_cast<int>(info->localBytesPerThread); break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      *pi = registersOf(*f, *info);
      break;
    // "The PTX virtual architecture version for which the function was compiled"
    // (80 for compute_80 PTX); the binary is what the driver JIT-compiled it
    // to: the device's own architecture.
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = m && m->ptxArchitecture > 0 ? m->ptxArchitecture : cc; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = cc; break;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = 0; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      *pi = optIn >= 0 ? optIn : std::max(0, 48 * 1024 - static_cast<int>(info->staticSharedBytes));
      break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = -1; break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: *pi = 0; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: *pi = static_cast<int>(info->requiredCluster[0]); break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: *pi = static_cast<int>(info->requiredCluster[1]); break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: *pi = static_cast<int>(info->requiredCluster[2]); break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: *pi = 0; break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *pi = CU_CLUSTER_SCHEDULING_POLICY_DEFAULT; break;
    default:
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "function attribute {} does not exist", static_cast<int>(attrib));
  }
  return Status::ok();
}

Status setFunctionAttribute(Driver& d, const std::shared_ptr<Function>& f, CUfunction_attribute attrib, int value) {
  ASSIGN_OR_RETURN(const FunctionInfo* info, infoOf(f));
  auto m = f->module.lock();
  const DeviceProfile& profile = d.platform().devices.at(static_cast<std::size_t>(m ? m->device : 0));
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: {
      // "The sum of this value and the function attribute SHARED_SIZE_BYTES cannot
      // exceed the device attribute MAX_SHARED_MEMORY_PER_BLOCK_OPTIN."
      long long limit = static_cast<long long>(profile.maxSharedPerBlockOptin) -
                        static_cast<long long>(info->staticSharedBytes);
      if (value < 0 || value > limit) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} bytes of dynamic shared memory exceed the opt-in limit {}",
                        value, limit);
      }
      f->maxDynamicShared = value;
      return Status::ok();
    }
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      if (value < -1 || value > 100) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "carveout {} is outside -1..100", value);
      return Status::ok();  // a hint; vgpu has no L1/shared split
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      return cuError(CUDA_ERROR_NOT_SUPPORTED, "thread block clusters are not supported by vgpu");
    default:
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "function attribute {} cannot be set", static_cast<int>(attrib));
  }
}

Status paramInfo(const std::shared_ptr<Function>& f, size_t paramIndex, size_t* paramOffset, size_t* paramSize) {
  RETURN_IF_ERROR(requireNonNull(paramOffset, "paramOffset"));
  ASSIGN_OR_RETURN(const FunctionInfo* info, infoOf(f));
  if (paramIndex >= info->params.size()) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "kernel '{}' has {} parameters, index {} is out of range", info->name,
                    info->params.size(), paramIndex);
  }
  *paramOffset = info->params[paramIndex].offset;
  if (paramSize != nullptr) *paramSize = info->params[paramIndex].size;
  return Status::ok();
}

// Resident blocks per multiprocessor of `f`, from the limits real GPUs of the profile have.
int activeBlocksPerSm(const DeviceProfile& p, const Function& f, const FunctionInfo& info,
                      int blockSize, size_t dynamicSmem) {
  if (blockSize <= 0 || blockSize > std::min(1024, info.maxThreadsPerBlock)) return 0;
  int warps = (blockSize + 31) / 32;
  int byThreads = p.maxThreadsPerMultiprocessor / 32 / warps;
  int regsPerWarp = ((std::max(1, registersOf(f, info)) * 32 + 255) / 256) * 256;
  int byRegs = 65536 / (regsPerWarp * warps);
  size_t smem = info.staticSharedBytes + dynamicSmem + 1024;  // 1 KiB reserved per block
  int bySmem = static_cast<int>(static_cast<size_t>(p.maxSharedPerMultiprocessor) / smem);
  return std::max(0, std::min({p.maxBlocksPerMultiprocessor, byThreads, byRegs, bySmem}));
}

Status occupancy(Driver& d, int* numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize) {
  RETURN_IF_ERROR(requireNonNull(numBlocks, "numBlocks"));
  ASSIGN_OR_RETURN(auto f, d.function(func));
  ASSIGN_OR_RETURN(const FunctionInfo* info, infoOf(f));
  auto m = f->module.lock();
  const DeviceProfile& p = d.platform().devices.at(static_cast<std::size_t>(m ? m->device : 0));
  *numBlocks = activeBlocksPerSm(p, *f, *info, blockSize, dynamicSMemSize);
  return Status::ok();
}

Status potentialBlockSize(Driver& d, int* minGridSize, int* blockSize, CUfunction func,
                          CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize, int blockSizeLimit) {
  RETURN_IF_ERROR(requireNonNull(minGridSize, "minGridSize"));
  RETURN_IF_ERROR(requireNonNull(blockSize, "blockSize"));
  ASSIGN_OR_RETURN(auto f, d.function(func));
  ASSIGN_OR_RETURN(const FunctionInfo* info, infoOf(f));
  auto m = f->module.lock();
  const DeviceProfile& p = d.platform().devices.at(static_cast<std::size_t>(m ? m->device : 0));
  int limit = std::min(1024, info->maxThreadsPerBlock);
  if (blockSizeLimit > 0) limit = std::min(limit, blockSizeLimit);
  int bestSize = 0, bestThreads = 0;
  for (int size = (limit / 32) * 32; size >= 32; size -= 32) {
    size_t smem = blockSizeToDynamicSMemSize != nullptr ? blockSizeToDynamicSMemSize(size) : dynamicSMemSize;
    int threads = activeBlocksPerSm(p, *f, *info, size, smem) * size;
    if (threads > bestThreads) {
      bestThreads = threads;
      bestSize = size;
    }
  }
  if (bestSize == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "no block size fits on a multiprocessor");
  *blockSize = bestSize;
  *minGridSize = (bestThreads / bestSize) * p.multiprocessors;
  return Status::ok();
}

CUresult launchKernel(const char* name, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned sharedMemBytes, CUstream hStream, void** kernelParams, void** extra,
                      bool perThread, bool cooperative) {
  return call(name, [&](Driver& d) -> Status {
    LaunchConfig config{{gx, gy, gz}, {bx, by, bz}, sharedMemBytes, cooperative};
    if (cooperative) {
      ASSIGN_OR_RETURN(auto fn, d.function(f));
      ASSIGN_OR_RETURN(const FunctionInfo* info, infoOf(fn));
      auto m = fn->module.lock();
      const DeviceProfile& p = d.platform().devices.at(static_cast<std::size_t>(m ? m->device : 0));
      std::uint64_t blocks = std::uint64_t{gx} * gy * gz;
      int perSm = activeBlocksPerSm(
          p, *fn, *info,
          static_cast<int>(std::min<std::uint64_t>(std::uint64_t{bx} * by * bz, 1u << 20)),
          sharedMemBytes);
      // Every block of a cooperative grid must be resident at once.
      if (perSm > 0 && blocks > static_cast<std::uint64_t>(perSm) * static_cast<std::uint64_t>(p.multiprocessors)) {
        return cuErrorf(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "{} blocks exceed the {} that can be resident",
                        blocks, perSm * p.multiprocessors);
      }
    }
    return d.launch(f, config, hStream, perThread, kernelParams, extra);
  });
}

CUresult launchKernelEx(const char* name, const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                        void** extra, bool perThread) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool cooperative = false;
  if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& a = config->attrs[i];
    switch (a.id) {
      case CU_LAUNCH_ATTRIBUTE_IGNORE:
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
      case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        break;  // scheduling hints: no effect on a CPU
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
        cooperative = a.value.cooperative != 0;
        break;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
        if (a.value.clusterDim.x * a.value.clusterDim.y * a.value.clusterDim.z > 1) {
          return api::call(name, [](Driver&) {
            return cuError(CUDA_ERROR_NOT_SUPPORTED, "thread block clusters are not supported by vgpu");
          });
        }
        break;
      default:
        return api::call(name, [&](Driver&) {
          return cuErrorf(CUDA_ERROR_NOT_SUPPORTED, "launch attribute {} is not supported by vgpu",
                          static_cast<int>(a.id));
        });
    }
  }
  return launchKernel(name, f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                      config->blockDimY, config->blockDimZ, config->sharedMemBytes, config->hStream, kernelParams,
                      extra, perThread, cooperative);
}

// --- the linker ----------------------------------------------------------------------------

// vgpu "links" by keeping the PTX: the image cuLinkComplete returns is that PTX
// text, which cuModuleLoadData accepts. One PTX input is what numba and NVRTC
// users produce; PTX modules that reference each other need a real linker.
struct LinkState {
  std::vector<std::string> ptx;
  std::string image;
  std::optional<JitOptions> options;  // cuLinkCreate's: reported after each input and at completion
};

std::mutex& linkMutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<LinkState*>& linkStates() {
  static std::set<LinkState*> states;
  return states;
}

Result<LinkState*> linkState(CUlinkState state) {
  auto* s = reinterpret_cast<LinkState*>(state);
  std::lock_guard lock(linkMutex());
  if (s == nullptr || !linkStates().contains(s)) {
    return cuError(CUDA_ERROR_INVALID_HANDLE, "not a live linker state");
  }
  return s;
}

// PTX is compiled as it is added, as NVIDIA's JIT does: an input that would
// not load fails here, with the compiler's reason in the error log. vgpu
// compiles by loading it once in the current context.
Status compiles(Driver& d, const std::string& ptx) {
  ASSIGN_OR_RETURN(CUmodule probe, d.loadModule(ptx.c_str()));
  return d.unloadModule(probe);
}

Status addLinkInput(Driver& d, LinkState& s, CUjitInputType type, const void* data, size_t size) {
  switch (type) {
    case CU_JIT_INPUT_PTX: {
      std::string text(static_cast<const char*>(data), size);
      if (auto nul = text.find('\0'); nul != std::string::npos) text.resize(nul);
      if (text.find(".version") == std::string::npos) {
        return cuError(CUDA_ERROR_INVALID_PTX, "linker input is not PTX (no .version directive)");
      }
      RETURN_IF_ERROR(compiles(d, text));
      s.ptx.push_back(std::move(text));
      return Status::ok();
    }
    case CU_JIT_INPUT_FATBINARY: {
      ASSIGN_OR_RETURN(auto context, d.current());
      const DeviceProfile& p = d.platform().devices.at(static_cast<std::size_t>(context->device()));
      ASSIGN_OR_RETURN(std::string ptx, extractPtx(data, p.ccMajor * 10 + p.ccMinor));
      RETURN_IF_ERROR(compiles(d, ptx));
      s.ptx.push_back(std::move(ptx));
      return Status::ok();
    }
    case CU_JIT_INPUT_CUBIN: {
      // vgpu's NVRTC and nvJitLink hand out PTX where a cubin is asked for; given
      // back as a cubin, it is PTX text (no ELF header).
      std::string_view text(static_cast<const char*>(data), size);
      if (auto nul = text.find('\0'); nul != std::string_view::npos) text = text.substr(0, nul);
      if (!text.starts_with("\x7f" "ELF") && text.find(".version") != std::string_view::npos) {
        RETURN_IF_ERROR(compiles(d, std::string(text)));
        s.ptx.emplace_back(text);
        return Status::ok();
      }
      return cuError(CUDA_ERROR_NO_BINARY_FOR_GPU, "a cubin is machine code; vgpu runs PTX only");
    }
    default:
      return cuErrorf(CUDA_ERROR_NOT_SUPPORTED, "linker input type {} is not supported by vgpu",
                      static_cast<int>(type));
  }
}

Result<std::string> readFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return cuErrorf(CUDA_ERROR_FILE_NOT_FOUND, "cannot open '{}'", path);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  data.push_back('\0');
  return data;
}

}  // namespace

// --- modules -----------------------------------------------------------------------------

CUresult CUDAAPI cuModuleLoad(CUmodule* module, const char* fname) {
  return moduleOut(__func__, module, [&](Driver& d) { return d.loadModuleFile(fname); });
}

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  return moduleOut(__func__, module, [&](Driver& d) { return d.loadModule(image); });
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                    CUjit_option* options, void** optionValues) {
  return moduleOut(__func__, module, [&](Driver& d) -> Result<CUmodule> {
    ASSIGN_OR_RETURN(JitOptions jit, JitOptions::of(numOptions, options, optionValues));
    Result<CUmodule> m = d.loadModule(image, jit.maxRegisters());
    jit.report(m.status());
    return m;
  });
}

CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return moduleOut(__func__, module, [&](Driver& d) { return d.loadModule(fatCubin); });
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  return call(__func__, [&](Driver& d) { return d.unloadModule(hmod); });
}

CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  return call(__func__, [&](Driver&) -> Status {
    RETURN_IF_ERROR(requireNonNull(mode, "mode"));
    // As NVIDIA's driver since CUDA 12.2: lazy unless CUDA_MODULE_LOADING says
    // EAGER. vgpu loads everything at once either way; the mode tells the
    // runtime when to load its modules (at its first use of one: after the
    // program's first allocations, as on a GPU).
    const char* loading = std::getenv("CUDA_MODULE_LOADING");
    const bool eager = loading != nullptr && std::string_view(loading) == "EAGER";
    *mode = eager ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
    return Status::ok();
  });
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(hfunc, "hfunc"));
    RETURN_IF_ERROR(requireNonNull(name, "name"));
    ASSIGN_OR_RETURN(CUfunction f, d.function(hmod, name));
    *hfunc = f;
    return Status::ok();
  });
}

CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count, CUmodule mod) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(count, "count"));
    ASSIGN_OR_RETURN(auto m, d.module(mod));
    *count = m->program ? static_cast<unsigned>(m->program->functions().size()) : 0;
    return Status::ok();
  });
}

CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* functions, unsigned int numFunctions, CUmodule mod) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(functions, "functions"));
    ASSIGN_OR_RETURN(auto m, d.module(mod));
    if (!m->program) return Status::ok();  // no code for this device: no functions
    const auto& all = m->program->functions();
    for (unsigned i = 0; i < numFunctions && i < all.size(); ++i) {
      ASSIGN_OR_RETURN(functions[i], d.function(mod, all[i].name.c_str()));
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod, const char* name) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto m, d.module(hmod));
    return globalOf(m, name, dptr, bytes);
  });
}

// --- libraries and kernels ------------------------------------------------------------------

CUresult CUDAAPI cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                                   void** jitOptionsValues, unsigned int numJitOptions,
                                   CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                   unsigned int numLibraryOptions) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(library, "library"));
    RETURN_IF_ERROR(requireNonNull(code, "code"));
    ASSIGN_OR_RETURN(JitOptions jit, JitOptions::of(numJitOptions, jitOptions, jitOptionsValues));
    if (numLibraryOptions > 0 && (libraryOptions == nullptr || libraryOptionValues == nullptr)) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "library options without option arrays");
    }
    Result<CUlibrary> loaded = d.loadLibrary(code, jit.maxRegisters());
    jit.report(loaded.status());
    ASSIGN_OR_RETURN(CUlibrary lib, std::move(loaded));
    *library = lib;
    return Status::ok();
  });
}

CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option* jitOptions,
                                       void** jitOptionsValues, unsigned int numJitOptions,
                                       CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                       unsigned int numLibraryOptions) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(library, "library"));
    RETURN_IF_ERROR(requireNonNull(fileName, "fileName"));
    ASSIGN_OR_RETURN(JitOptions jit, JitOptions::of(numJitOptions, jitOptions, jitOptionsValues));
    if (numLibraryOptions > 0 && (libraryOptions == nullptr || libraryOptionValues == nullptr)) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "library options without option arrays");
    }
    Result<CUlibrary> loaded = d.loadLibraryFile(fileName, jit.maxRegisters());
    jit.report(loaded.status());
    ASSIGN_OR_RETURN(CUlibrary lib, std::move(loaded));
    *library = lib;
    return Status::ok();
  });
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library) {
  return call(__func__, [&](Driver& d) { return d.unloadLibrary(library); });
}

// "Returns a module handle for the library in the current context."
CUresult CUDAAPI cuLibraryGetModule(CUmodule* pMod, CUlibrary library) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pMod, "pMod"));
    ASSIGN_OR_RETURN(auto m, d.libraryModule(library));
    *pMod = handleOf<CUmodule>(m->id);
    return Status::ok();
  });
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pKernel, "pKernel"));
    RETURN_IF_ERROR(requireNonNull(name, "name"));
    ASSIGN_OR_RETURN(*pKernel, d.kernel(library, name));
    return Status::ok();
  });
}

CUresult CUDAAPI cuLibraryGetKernelCount(unsigned int* count, CUlibrary lib) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(count, "count"));
    ASSIGN_OR_RETURN(auto kernels, d.kernels(lib));
    *count = static_cast<unsigned>(kernels.size());
    return Status::ok();
  });
}

CUresult CUDAAPI cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int numKernels, CUlibrary lib) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(kernels, "kernels"));
    ASSIGN_OR_RETURN(auto all, d.kernels(lib));
    for (unsigned i = 0; i < numKernels && i < all.size(); ++i) kernels[i] = all[i];
    return Status::ok();
  });
}

// "Returns a global device pointer ... for the requested library in the current context."
CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library, const char* name) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto m, d.libraryModule(library));
    return globalOf(m, name, dptr, bytes);
  });
}

// A __managed__ variable of the library (.attribute(.managed) in its PTX):
// "One of the parameters dptr or bytes (not both) can be NULL".
CUresult CUDAAPI cuLibraryGetManaged(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                     const char* name) {
  return call(__func__, [&](Driver& d) -> Status {
    if (dptr == nullptr && bytes == nullptr)
      return cuError(CUDA_ERROR_INVALID_VALUE, "dptr and bytes are both null");
    ASSIGN_OR_RETURN(GlobalInfo g, d.libraryManaged(library, name));
    if (dptr != nullptr) *dptr = g.address;
    if (bytes != nullptr) *bytes = g.size;
    return Status::ok();
  });
}

// "Returns the function handle for the kernel for the current context."
CUresult CUDAAPI cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pFunc, "pFunc"));
    ASSIGN_OR_RETURN(auto f, d.kernelFunction(kernel, true));
    *pFunc = handleOf<CUfunction>(f->id);
    return Status::ok();
  });
}

CUresult CUDAAPI cuKernelGetLibrary(CUlibrary* pLib, CUkernel kernel) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pLib, "pLib"));
    ASSIGN_OR_RETURN(auto k, d.kernel(kernel));
    auto lib = k->library.lock();
    if (!lib) return cuError(CUDA_ERROR_INVALID_HANDLE, "the kernel's library was unloaded");
    *pLib = handleOf<CUlibrary>(lib->id);
    return Status::ok();
  });
}

CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel hfunc) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(name, "name"));
    ASSIGN_OR_RETURN(auto k, d.kernel(hfunc));
    *name = k->name.c_str();
    return Status::ok();
  });
}

CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t* paramOffset, size_t* paramSize) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto f, kernelFunction(d, kernel));
    return paramInfo(f, paramIndex, paramOffset, paramSize);
  });
}

CUresult CUDAAPI cuKernelGetAttribute(int* pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(d.checkDevice(dev));
    ASSIGN_OR_RETURN(auto f, kernelFunction(d, kernel));
    RETURN_IF_ERROR(functionAttribute(d, pi, attrib, f));
    ASSIGN_OR_RETURN(auto k, d.kernel(kernel));
    if (auto it = k->maxDynamicShared.find(dev);
        attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && it != k->maxDynamicShared.end()) {
      *pi = it->second;
    }
    return Status::ok();
  });
}

// Per device: the kernel's functions in every context of `dev`, now and later.
CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(d.checkDevice(dev));
    ASSIGN_OR_RETURN(auto f, kernelFunction(d, kernel));
    // Checked against the function (its static shared memory), not applied to it.
    const int before = f->maxDynamicShared.load();
    RETURN_IF_ERROR(setFunctionAttribute(d, f, attrib, val));
    if (attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return Status::ok();
    f->maxDynamicShared = before;
    return d.setKernelMaxDynamicShared(kernel, dev, val);
  });
}

CUresult CUDAAPI cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(d.checkDevice(dev));
    ASSIGN_OR_RETURN(auto f, kernelFunction(d, kernel));
    (void)f;
    if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "invalid cache configuration");
    }
    return Status::ok();
  });
}

// --- functions --------------------------------------------------------------------------------

CUresult CUDAAPI cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto f, d.function(hfunc));
    return functionAttribute(d, pi, attrib, f);
  });
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto f, d.function(hfunc));
    return setFunctionAttribute(d, f, attrib, value);
  });
}

CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto f, d.function(hfunc));
    (void)f;
    if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "invalid cache configuration");
    }
    return Status::ok();
  });
}

// Deprecated; the banks are fixed at four bytes (cuCtxSetSharedMemConfig).
CUresult CUDAAPI cuFuncSetSharedMemConfig(CUfunction hfunc, CUsharedconfig config) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto f, d.function(hfunc));
    (void)f;
    if (config < CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE ||
        config > CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "shared memory configuration {} is invalid",
                      static_cast<int>(config));
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(name, "name"));
    ASSIGN_OR_RETURN(auto f, d.function(hfunc));
    *name = f->program->functions().at(f->index).name.c_str();
    return Status::ok();
  });
}

CUresult CUDAAPI cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(hmod, "hmod"));
    ASSIGN_OR_RETURN(auto f, d.function(hfunc));
    auto m = f->module.lock();
    if (!m) return cuError(CUDA_ERROR_INVALID_HANDLE, "the function's module was unloaded");
    *hmod = handleOf<CUmodule>(m->id);
    return Status::ok();
  });
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset, size_t* paramSize) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto f, d.function(func));
    return paramInfo(f, paramIndex, paramOffset, paramSize);
  });
}

CUresult CUDAAPI cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction function) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(state, "state"));
    ASSIGN_OR_RETURN(auto f, d.function(function));
    (void)f;
    *state = CU_FUNCTION_LOADING_STATE_LOADED;  // vgpu loads eagerly
    return Status::ok();
  });
}

CUresult CUDAAPI cuFuncLoad(CUfunction function) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto f, d.function(function));
    (void)f;
    return Status::ok();
  });
}

// --- launches -----------------------------------------------------------------------------------

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  return launchKernel(__func__, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                      hStream, kernelParams, extra, false, false);
}
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                     unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                     void** kernelParams, void** extra) {
  return launchKernel(__func__, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                      hStream, kernelParams, extra, true, false);
}
CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  return launchKernelEx(__func__, config, f, kernelParams, extra, false);
}
CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                       void** extra) {
  return launchKernelEx(__func__, config, f, kernelParams, extra, true);
}
CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                           unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                           void** kernelParams) {
  return launchKernel(__func__, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                      hStream, kernelParams, nullptr, false, true);
}
CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                                void** kernelParams) {
  return launchKernel(__func__, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                      hStream, kernelParams, nullptr, true, true);
}

// --- occupancy ------------------------------------------------------------------------------------

CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, CUfunction func, int blockSize,
                                                             size_t dynamicSMemSize) {
  return call(__func__, [&](Driver& d) { return occupancy(d, numBlocks, func, blockSize, dynamicSMemSize); });
}

CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, CUfunction func, int blockSize,
                                                                      size_t dynamicSMemSize, unsigned int flags) {
  return call(__func__, [&](Driver& d) -> Status {
    if (flags != CU_OCCUPANCY_DEFAULT && flags != CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "occupancy flags 0x{:x} are invalid", flags);
    }
    return occupancy(d, numBlocks, func, blockSize, dynamicSMemSize);
  });
}

CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(int* minGridSize, int* blockSize, CUfunction func,
                                                  CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                  size_t dynamicSMemSize, int blockSizeLimit) {
  return call(__func__, [&](Driver& d) {
    return potentialBlockSize(d, minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize,
                              blockSizeLimit);
  });
}

CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(int* minGridSize, int* blockSize, CUfunction func,
                                                           CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                           size_t dynamicSMemSize, int blockSizeLimit,
                                                           unsigned int flags) {
  return call(__func__, [&](Driver& d) -> Status {
    if (flags != CU_OCCUPANCY_DEFAULT && flags != CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "occupancy flags 0x{:x} are invalid", flags);
    }
    return potentialBlockSize(d, minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize,
                              blockSizeLimit);
  });
}

CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t* dynamicSmemSize, CUfunction func, int numBlocks,
                                                         int blockSize) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(dynamicSmemSize, "dynamicSmemSize"));
    ASSIGN_OR_RETURN(auto f, d.function(func));
    ASSIGN_OR_RETURN(const FunctionInfo* info, infoOf(f));
    auto m = f->module.lock();
    const DeviceProfile& p = d.platform().devices.at(static_cast<std::size_t>(m ? m->device : 0));
    if (numBlocks <= 0 || blockSize <= 0 ||
        activeBlocksPerSm(p, *f, *info, blockSize, 0) < numBlocks) {
      *dynamicSmemSize = 0;
      return Status::ok();
    }
    size_t perBlock = static_cast<size_t>(p.maxSharedPerMultiprocessor) / static_cast<size_t>(numBlocks);
    size_t used = info->staticSharedBytes + 1024;
    size_t available = perBlock > used ? perBlock - used : 0;
    *dynamicSmemSize = std::min(available, static_cast<size_t>(p.maxSharedPerBlockOptin) - info->staticSharedBytes);
    return Status::ok();
  });
}

// --- the linker -----------------------------------------------------------------------------------

CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option* options, void** optionValues,
                                 CUlinkState* stateOut) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(stateOut, "stateOut"));
    ASSIGN_OR_RETURN(auto context, d.current());
    (void)context;
    ASSIGN_OR_RETURN(JitOptions jit, JitOptions::of(numOptions, options, optionValues));
    auto* state = new LinkState();
    state->options = jit;
    std::lock_guard lock(linkMutex());
    linkStates().insert(state);
    *stateOut = reinterpret_cast<CUlinkState>(state);
    return Status::ok();
  });
}

CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data, size_t size, const char* name,
                                  unsigned int numOptions, CUjit_option* options, void** optionValues) {
  return call(__func__, [&](Driver& d) -> Status {
    (void)name;
    ASSIGN_OR_RETURN(LinkState * s, linkState(state));
    RETURN_IF_ERROR(requireNonNull(data, "data"));
    if (size == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "size is 0");
    ASSIGN_OR_RETURN(JitOptions jit, JitOptions::of(numOptions, options, optionValues));
    Status added = addLinkInput(d, *s, type, data, size);
    jit.report(added);
    s->options->report(added);
    return added;
  });
}

CUresult CUDAAPI cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char* path, unsigned int numOptions,
                                  CUjit_option* options, void** optionValues) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(LinkState * s, linkState(state));
    RETURN_IF_ERROR(requireNonNull(path, "path"));
    ASSIGN_OR_RETURN(JitOptions jit, JitOptions::of(numOptions, options, optionValues));
    ASSIGN_OR_RETURN(std::string data, readFile(path));
    Status added = addLinkInput(d, *s, type, data.data(), data.size());
    jit.report(added);
    s->options->report(added);
    return added;
  });
}

CUresult CUDAAPI cuLinkComplete(CUlinkState state, void** cubinOut, size_t* sizeOut) {
  return call(__func__, [&](Driver&) -> Status {
    ASSIGN_OR_RETURN(LinkState * s, linkState(state));
    RETURN_IF_ERROR(requireNonNull(cubinOut, "cubinOut"));
    Status linked = [&]() -> Status {
      if (s->ptx.empty()) return cuError(CUDA_ERROR_INVALID_VALUE, "nothing was added to the link");
      if (s->ptx.size() > 1) {
        return cuErrorf(CUDA_ERROR_NOT_SUPPORTED,
                        "linking {} PTX modules together is not supported by vgpu", s->ptx.size());
      }
      return Status::ok();
    }();
    s->options->report(linked);
    RETURN_IF_ERROR(linked);
    // "cubinOut ... is owned by state, so it should be copied if it is to be used
    // after cuLinkDestroy() is called."
    s->image = s->ptx.front();
    s->image.push_back('\0');
    *cubinOut = s->image.data();
    if (sizeOut != nullptr) *sizeOut = s->image.size();
    return Status::ok();
  });
}

CUresult CUDAAPI cuLinkDestroy(CUlinkState state) {
  return call(__func__, [&](Driver&) -> Status {
    ASSIGN_OR_RETURN(LinkState * s, linkState(state));
    {
      std::lock_guard lock(linkMutex());
      linkStates().erase(s);
    }
    delete s;
    return Status::ok();
  });
}
