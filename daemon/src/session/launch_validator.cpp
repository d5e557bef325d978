// SPDX-License-Identifier: Apache-2.0
// LaunchValidator: module preparation (signatures, twins), speculation of
// launches, and twin launches with their range tables and report buffers.
#include "session/launch_validator.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "session/jit_helper.h"
#include "phos/common/log.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"

namespace phos::daemon {
namespace {

using instrument::Access;
using instrument::Buffer;
using instrument::LaunchAccessSet;
using instrument::RangeEntry;
using instrument::ReportEntry;
using instrument::ReportHeader;

// Room for this many reported accesses per kernel between two collections;
// beyond it accesses are counted, not described.
constexpr uint32_t kReportCapacity = 256;

std::shared_ptr<const instrument::SignatureDatabase>& signatureDatabase() {
  static std::shared_ptr<const instrument::SignatureDatabase> database;
  return database;
}

// PHOS_SPECULATION_BOUNDS=0: speculation per whole buffer, as before access
// bounds (a baseline for benchmarks; docs/speculation.md).
bool boundsEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("PHOS_SPECULATION_BOUNDS");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return enabled;
}

bool looksLikePtx(std::string_view text) {
  return text.find(".version") != std::string_view::npos && text.find(".target") != std::string_view::npos;
}

std::shared_ptr<const PreparedModule> prepareUncached(std::string_view text) {
  auto prepared = std::make_shared<PreparedModule>();
  auto log = log::get("daemon");
  if (!looksLikePtx(text)) {
    // A fatbin or cubin: the driver reads it; phosd has no PTX to analyse.
    prepared->note = "not PTX text (fatbin or cubin): no signatures, no twins";
    return prepared;
  }
  auto module = ptx::parseModule(text, "module image");
  if (!module.isOk()) {
    prepared->note = "PTX that phosd cannot parse: " + module.status().message();
    return prepared;
  }
  if (auto signatures = instrument::analyzeModule(*module); signatures.isOk()) {
    const auto& database = signatureDatabase();
    for (auto& sig : *signatures) {
      if (const instrument::DeclaredKernel* declared = database ? database->find(sig.name) : nullptr) {
        if (Status s = instrument::applyDeclaration(sig, *declared); !s.isOk()) {
          log->warn("signature database entry of {} ignored: {}", sig.name, s.message());
        }
      }
      if (const ptx::Function* f = boundsEnabled() ? module->findFunction(sig.name) : nullptr; f && f->isEntry) {
        auto bounds = instrument::AccessBounds::analyze(*module, *f, sig);
        if (!bounds->useful()) log->debug("{}: speculation stays per buffer: {}", sig.name, bounds->why());
        prepared->bounds.emplace(sig.name, std::move(bounds));
      }
      prepared->signatures.emplace(sig.name, std::move(sig));
    }
  } else {
    prepared->note = "no signatures: " + signatures.status().message();
  }
  // Checkpoint twins and restore twins (they check loads too) in one twin
  // module, loaded beside the program's own.
  auto twin = instrument::buildTwinModule(*module, {instrument::TwinMode::kCheckpoint, true}, &prepared->stats);
  if (twin.isOk()) {
    prepared->twinText = ptx::print(*twin);
  } else {
    prepared->note += (prepared->note.empty() ? "" : "; ") + ("no twins: " + twin.status().message());
  }
  return prepared;
}

}  // namespace

void setSignatureDatabase(std::shared_ptr<const instrument::SignatureDatabase> database) {
  signatureDatabase() = std::move(database);
}

std::shared_ptr<const PreparedModule> prepareModule(std::span<const char> image) {
  std::string_view text(image.data(), strnlen(image.data(), image.size()));
  // Modules are immutable and often loaded again (per context, at restore).
  static std::mutex mutex;
  static std::map<XXH64_hash_t, std::weak_ptr<const PreparedModule>> cache;
  const XXH64_hash_t key = XXH3_64bits(text.data(), text.size());
  {
    std::lock_guard lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) {
      if (auto hit = it->second.lock()) return hit;
    }
  }
  auto prepared = prepareUncached(text);
  std::lock_guard lock(mutex);
  cache[key] = prepared;
  return prepared;
}

namespace {

// Loads the program's own image, unchanged: outside checkpoint windows the
// program runs its own code, whatever phosd made of it. The preparation comes
// along for the signatures and for the twin module loaded beside it later.
template <typename Load>
CUresult loadPrepared(const std::vector<char>& image, std::shared_ptr<const PreparedModule>* prepared, Load load) {
  CUresult r = load(image.data());
  if (r != CUDA_SUCCESS) return r;
  auto p = prepareModule(image);
  if (p->twinText.empty() && !p->note.empty()) log::get("daemon")->debug("module without validator twins: {}", p->note);
  *prepared = std::move(p);
  return r;
}

}  // namespace

CUresult loadModule(const DriverTable& driver, const std::vector<char>& image, CUmodule* module,
                    std::shared_ptr<const PreparedModule>* prepared, DriverJitOptions* jit) {
  return loadPrepared(image, prepared, [&](const char* text) {
    if (jit == nullptr || jit->count() == 0)
      return PHOS_DRIVER(driver, ModuleLoadData)(module, text);
    return PHOS_DRIVER(driver, ModuleLoadDataEx)(module, text, jit->count(), jit->options(),
                                                 jit->values());
  });
}

CUresult loadLibrary(const DriverTable& driver, const std::vector<char>& image, CUlibrary* library,
                     std::shared_ptr<const PreparedModule>* prepared, DriverJitOptions* jit) {
  return loadPrepared(image, prepared, [&](const char* text) {
    const bool none = jit == nullptr || jit->count() == 0;
    return PHOS_DRIVER(driver, LibraryLoadData)(library, text, none ? nullptr : jit->options(),
                                                none ? nullptr : jit->values(),
                                                none ? 0 : jit->count(), nullptr, nullptr, 0);
  });
}

LaunchValidator::~LaunchValidator() = default;

void LaunchValidator::noteModule(CUmodule module, std::shared_ptr<const PreparedModule> prepared) {
  modules_[module] = std::move(prepared);
  PHOS_DRIVER(driver_, CtxGetCurrent)(&moduleContexts_[module]);
}

void LaunchValidator::noteLibrary(CUlibrary library, std::shared_ptr<const PreparedModule> prepared) {
  libraries_[library] = std::move(prepared);
  PHOS_DRIVER(driver_, CtxGetCurrent)(&libraryContexts_[library]);
}

void LaunchValidator::forgetModule(CUmodule module) {
  dropKernelsOf(module);
  unloadTwinModules([&](const TwinModule& t) { return t.owner == module; });
  modules_.erase(module);
  moduleContexts_.erase(module);
}

void LaunchValidator::forgetLibrary(CUlibrary library) {
  dropKernelsOf(library);
  unloadTwinModules([&](const TwinModule& t) { return t.owner == library; });
  libraries_.erase(library);
  libraryContexts_.erase(library);
}

// Each in its context (the caller's stays current).
template <typename Which>
void LaunchValidator::unloadTwinModules(Which which) {
  CUcontext saved = nullptr;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
  for (auto it = twinModules_.begin(); it != twinModules_.end();) {
    if (!which(it->second)) {
      ++it;
      continue;
    }
    if (it->second.module != nullptr) {
      PHOS_DRIVER(driver_, CtxSetCurrent)(it->second.context);
      PHOS_DRIVER(driver_, ModuleUnload)(it->second.module);
    }
    it = twinModules_.erase(it);
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
}

size_t LaunchValidator::twinModuleCount() const {
  auto loaded = [](const auto& e) { return e.second.module != nullptr; };
  return static_cast<size_t>(std::count_if(twinModules_.begin(), twinModules_.end(), loaded));
}

// Its functions die with the module; a later function may get the same handle.
void LaunchValidator::dropKernelsOf(const void* owner) {
  for (auto it = kernels_.begin(); it != kernels_.end();) {
    if (it->second.owner != owner) {
      ++it;
      continue;
    }
    if (it->second.report != 0) PHOS_DRIVER(driver_, MemFree_v2)(it->second.report);
    it = kernels_.erase(it);
  }
}

LaunchValidator::KernelState& LaunchValidator::stateOf(CUfunction function) {
  KernelState& k = kernels_[function];
  if (k.resolved) return k;
  k.resolved = true;
  const char* name = nullptr;
  if (!driver_.has(cuda_api::EntryPointId::kCuFuncGetName) ||
      PHOS_DRIVER(driver_, FuncGetName)(&name, function) != CUDA_SUCCESS || name == nullptr) {
    return k;
  }
  k.name = name;
  if (driver_.has(cuda_api::EntryPointId::kCuFuncGetModule) &&
      PHOS_DRIVER(driver_, FuncGetModule)(&k.module, function) == CUDA_SUCCESS) {
    if (auto it = modules_.find(k.module); it != modules_.end()) {
      k.prepared = it->second;
      k.owner = k.module;
    }
  } else {
    k.module = nullptr;
  }
  if (k.prepared == nullptr) {
    // A library's kernel: its per-context module is not one phosd loaded.
    auto [library, prepared] = libraryOf(k.module, k.name);
    k.prepared = std::move(prepared);
    k.owner = library;
  }
  if (k.prepared == nullptr) return k;
  if (auto it = k.prepared->signatures.find(k.name); it != k.prepared->signatures.end()) k.signature = &it->second;
  if (auto it = k.prepared->bounds.find(k.name); it != k.prepared->bounds.end()) k.bounds = it->second.get();
  return k;
}

std::pair<CUlibrary, std::shared_ptr<const PreparedModule>> LaunchValidator::libraryOf(CUmodule module,
                                                                                        const std::string& kernel) {
  std::pair<CUlibrary, std::shared_ptr<const PreparedModule>> byName{nullptr, nullptr};
  const bool canTell = module != nullptr && driver_.has(cuda_api::EntryPointId::kCuLibraryGetModule);
  for (const auto& [library, prepared] : libraries_) {
    if (prepared->signatures.count(kernel) == 0) continue;
    // Two libraries may have a kernel of that name: the twin module must be
    // built from the very image the kernel came from.
    CUmodule in = nullptr;
    if (canTell && PHOS_DRIVER(driver_, LibraryGetModule)(&in, library) == CUDA_SUCCESS && in == module) {
      return {library, prepared};
    }
    if (byName.second == nullptr) byName = {library, prepared};
  }
  return canTell ? std::pair<CUlibrary, std::shared_ptr<const PreparedModule>>{nullptr, nullptr} : byName;
}

void LaunchValidator::resolveTwin(KernelState& k) {
  if (k.twinResolved) return;
  k.twinResolved = true;
  if (k.prepared == nullptr || k.prepared->twinText.empty() || k.module == nullptr) return;
  // A kernel that calls through a function pointer may store where its twin
  // cannot see: running the twin would vouch for what it never checked.
  const auto& unchecked = k.prepared->stats.kernelsWithUncheckedCalls;
  if (std::find(unchecked.begin(), unchecked.end(), k.name) != unchecked.end()) return;
  CUmodule twins = twinModuleFor(k);
  if (twins == nullptr) return;
  CUfunction twin = nullptr;
  const std::string twinName = instrument::twinName(k.name);
  if (PHOS_DRIVER(driver_, ModuleGetFunction)(&twin, twins, twinName.c_str()) != CUDA_SUCCESS) return;
  size_t offset = 0, size = 0;
  for (size_t i = 0; PHOS_DRIVER(driver_, FuncGetParamInfo)(twin, i, &offset, &size) == CUDA_SUCCESS; ++i) {
    k.twinOffsets.push_back(offset);
    k.twinParamBytes = std::max(k.twinParamBytes, offset + size);
  }
  if (k.twinOffsets.size() < 3) return;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&k.context);
  k.twin = twin;
  const std::string restoreName = instrument::twinName(k.name, instrument::kRestoreTwinSuffix);
  if (PHOS_DRIVER(driver_, ModuleGetFunction)(&twin, twins, restoreName.c_str()) == CUDA_SUCCESS) k.restoreTwin = twin;
}

std::vector<LaunchValidator::TwinLoad> LaunchValidator::twinLoadsPending() {
  auto what = [](const PreparedModule& p) {
    return p.signatures.empty() ? std::string("a module") : p.signatures.begin()->first;
  };
  std::vector<TwinLoad> pending;
  CUcontext saved = nullptr;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
  for (const auto& [module, prepared] : modules_) {
    auto context = moduleContexts_.find(module);
    if (prepared->twinText.empty() || context == moduleContexts_.end() || context->second == nullptr ||
        twinModules_.count(module) != 0) {
      continue;
    }
    pending.push_back({module, module, context->second, prepared, what(*prepared)});
  }
  for (const auto& [library, prepared] : libraries_) {
    auto context = libraryContexts_.find(library);
    if (prepared->twinText.empty() || context == libraryContexts_.end() || context->second == nullptr ||
        !driver_.has(cuda_api::EntryPointId::kCuLibraryGetModule)) {
      continue;
    }
    PHOS_DRIVER(driver_, CtxSetCurrent)(context->second);
    CUmodule module = nullptr;
    if (PHOS_DRIVER(driver_, LibraryGetModule)(&module, library) == CUDA_SUCCESS && twinModules_.count(module) == 0) {
      pending.push_back({module, library, context->second, prepared, what(*prepared)});
    }
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
  return pending;
}

// Called while the application runs (before a checkpoint's window, or as
// validation begins): the PTX is compiled by a helper process, and this
// worker's driver only loads the image, so the job's launches never wait for
// a compilation (jit_helper.h). Without a helper, or if it fails, the driver
// compiles the PTX here.
void LaunchValidator::loadTwins(TwinLoad& load) const {
  CUcontext saved = nullptr;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
  PHOS_DRIVER(driver_, CtxSetCurrent)(load.context);
  CUdevice device = 0;
  if (load.image.empty() && PHOS_DRIVER(driver_, CtxGetDevice)(&device) == CUDA_SUCCESS) {
    if (auto image = compileOutOfProcess(static_cast<int>(device), load.prepared->twinText); image.isOk()) {
      load.image = std::move(*image);
    } else if (image.status().code() != Code::kUnavailable) {
      log::get("daemon")->warn("the validator twins of the module of {} are compiled in the worker: {}", load.what,
                               image.status().message());
    }
  }
  load.twins = compileTwins(load.module, *load.prepared, load.what, load.image.empty() ? nullptr : &load.image);
  load.loaded = true;
  PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
}

void LaunchValidator::keepTwins(const TwinLoad& load) {
  if (!load.loaded) return;
  // The program may have unloaded its module meanwhile, or a launch loaded
  // the twins itself.
  const auto library = static_cast<CUlibrary>(const_cast<void*>(load.owner));
  const bool alive =
      load.owner == load.module ? modules_.count(load.module) != 0 : libraries_.count(library) != 0;
  if (!alive || twinModules_.count(load.module) != 0) {
    if (load.twins != nullptr) {
      CUcontext saved = nullptr;
      PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
      PHOS_DRIVER(driver_, CtxSetCurrent)(load.context);
      PHOS_DRIVER(driver_, ModuleUnload)(load.twins);
      PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
    }
    return;
  }
  twinModules_[load.module] = {load.twins, load.owner, load.context};
}

void LaunchValidator::loadTwinModules() {
  for (TwinLoad& load : twinLoadsPending()) {
    loadTwins(load);
    keepTwins(load);
  }
}

// Loaded when a twin of it first runs, not with the program's module: a
// program that is never checkpointed never pays for compiling its twins. The
// current context is the kernel's (a launch's function is of it).
CUmodule LaunchValidator::twinModuleFor(const KernelState& k) {
  return twinModuleFor(k.module, k.owner, *k.prepared, k.name);
}

// The twin module beside `module` in the current context; `what` names it in
// the log (one of its kernels).
CUmodule LaunchValidator::twinModuleFor(CUmodule module, const void* owner, const PreparedModule& prepared,
                                        std::string_view what) {
  if (auto it = twinModules_.find(module); it != twinModules_.end()) return it->second.module;
  TwinModule entry{nullptr, owner, nullptr};
  PHOS_DRIVER(driver_, CtxGetCurrent)(&entry.context);
  entry.module = compileTwins(module, prepared, what);
  twinModules_[module] = entry;
  return entry.module;
}

// Driver calls only (no state of the validator): the twin module of
// `prepared` loaded in the current context (from `image`, the JIT helper's
// code, when given; else its PTX), its table filled from `module`'s
// variables; null (said in the log) when the driver refuses it.
CUmodule LaunchValidator::compileTwins(CUmodule module, const PreparedModule& prepared, std::string_view what,
                                       const std::string* image) const {
  auto log = log::get("daemon");
  CUmodule twins = nullptr;
  const void* code = image != nullptr ? image->data() : prepared.twinText.c_str();
  if (CUresult r = PHOS_DRIVER(driver_, ModuleLoadData)(&twins, code); r != CUDA_SUCCESS) {
    log->warn("the driver refused the validator twins of the module of {} (CUresult {}): its kernels run without "
              "twins",
              what, static_cast<int>(r));
    return nullptr;
  }
  if (Status s = fillGlobalTable(twins, module, prepared.stats.globals); !s.isOk()) {
    log->warn("validator twins of the module of {} unusable, its kernels run without twins: {}", what, s.message());
    PHOS_DRIVER(driver_, ModuleUnload)(twins);
    return nullptr;
  }
  log->info("validator twins of the module of {} loaded beside it, {} of its variables shared{}", what,
            prepared.stats.globals.size(), image != nullptr ? " (compiled by the JIT helper)" : "");
  return twins;
}

// The twins use the program's variables, not copies of their own
// (docs/twins.md): slot i of the twin module's table gets the address of
// globals[i] in the program's module.
Status LaunchValidator::fillGlobalTable(CUmodule twins, CUmodule original,
                                       const std::vector<std::string>& globals) const {
  if (globals.empty()) return Status::ok();
  std::vector<uint64_t> addresses;
  for (const std::string& name : globals) {
    CUdeviceptr address = 0;
    size_t bytes = 0;
    if (CUresult r = PHOS_DRIVER(driver_, ModuleGetGlobal_v2)(&address, &bytes, original, name.c_str());
        r != CUDA_SUCCESS) {
      return makeError(Code::kNotFound, "the program's module has no variable {} (CUresult {})", name,
                       static_cast<int>(r));
    }
    addresses.push_back(address);
  }
  const std::string tableName(instrument::kGlobalTable);
  CUdeviceptr table = 0;
  size_t bytes = 0;
  if (CUresult r = PHOS_DRIVER(driver_, ModuleGetGlobal_v2)(&table, &bytes, twins, tableName.c_str());
      r != CUDA_SUCCESS || bytes != addresses.size() * sizeof(uint64_t)) {
    return makeError(Code::kInternal, "the twin module's {} is missing or has {} bytes, not {} (CUresult {})",
                     tableName, bytes, addresses.size() * sizeof(uint64_t), static_cast<int>(r));
  }
  if (CUresult r = PHOS_DRIVER(driver_, MemcpyHtoD_v2)(table, addresses.data(), bytes); r != CUDA_SUCCESS) {
    return makeError(Code::kInternal, "writing the twin module's {} failed (CUresult {})", tableName,
                     static_cast<int>(r));
  }
  // From pageable memory the copy may still be in flight when the call
  // returns; a twin launched on a non-blocking stream must not overtake it.
  if (CUresult r = PHOS_DRIVER(driver_, StreamSynchronize)(nullptr); r != CUDA_SUCCESS) {
    return makeError(Code::kInternal, "waiting for the twin module's {} failed (CUresult {})", tableName,
                     static_cast<int>(r));
  }
  return Status::ok();
}

const instrument::KernelSignature* LaunchValidator::signatureOf(CUfunction function) {
  return stateOf(function).signature;
}

LaunchAccessSet LaunchValidator::speculate(CUfunction function, void** kernelParams,
                                           std::span<const std::byte> packed,
                                           const instrument::BufferLookup& buffers,
                                           const instrument::LaunchShape* shape) {
  const KernelState& k = stateOf(function);
  std::vector<std::byte> bytes;
  if (!packed.empty()) {
    bytes.assign(packed.begin(), packed.end());
  } else if (kernelParams != nullptr) {
    // Pack the parameters as the kernel lays them out (cuFuncGetParamInfo).
    size_t offset = 0, size = 0;
    for (size_t i = 0; PHOS_DRIVER(driver_, FuncGetParamInfo)(function, i, &offset, &size) == CUDA_SUCCESS; ++i) {
      if (bytes.size() < offset + size) bytes.resize(offset + size);
      std::memcpy(bytes.data() + offset, kernelParams[i], size);
    }
  }
  if (k.signature == nullptr || bytes.size() < k.signature->paramBytes) {
    return instrument::speculateOpaqueLaunch(bytes, buffers);
  }
  CUmodule module = nullptr;
  PHOS_DRIVER(driver_, FuncGetModule)(&module, function);
  instrument::GlobalLookup globals = [&](std::string_view name) -> std::optional<Buffer> {
    CUdeviceptr address = 0;
    size_t size = 0;
    std::string n(name);
    if (module == nullptr || PHOS_DRIVER(driver_, ModuleGetGlobal_v2)(&address, &size, module, n.c_str()) != CUDA_SUCCESS) {
      return std::nullopt;
    }
    return Buffer{address, size};
  };
  LaunchAccessSet sets = instrument::speculateLaunch(*k.signature, bytes, buffers, globals);
  if (k.bounds != nullptr && shape != nullptr) k.bounds->narrow(sets, bytes, *shape, buffers, globals);
  return sets;
}

CUresult LaunchValidator::launchTwin(CUfunction function, void** kernelParams, std::span<const std::byte> packed,
                                     CUstream stream, const LaunchAccessSet& sets, const LaunchFn& launch) {
  KernelState& k = stateOf(function);
  CUfunction twin = twinFor(k);
  if (twin == nullptr) return CUDA_ERROR_NOT_FOUND;
  // The twin runs with the original's launch configuration, so with the
  // dynamic shared memory the program opted the original into (which it may
  // change at any time): without it, a launch asking for more than 48 KiB
  // fails on the twin alone.
  int want = 0, have = 0;
  if (PHOS_DRIVER(driver_, FuncGetAttribute)(&want, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, function) ==
          CUDA_SUCCESS &&
      PHOS_DRIVER(driver_, FuncGetAttribute)(&have, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, twin) ==
          CUDA_SUCCESS &&
      want != have) {
    // A twin with more static shared memory may not get as much: then the
    // launch fails as it would have.
    PHOS_DRIVER(driver_, FuncSetAttribute)(twin, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, want);
  }
  if (k.report == 0) {
    const size_t bytes = sizeof(ReportHeader) + size_t{kReportCapacity} * sizeof(ReportEntry);
    if (CUresult r = PHOS_DRIVER(driver_, MemAlloc_v2)(&k.report, bytes); r != CUDA_SUCCESS) return r;
    ReportHeader header{0, kReportCapacity};
    if (CUresult r = PHOS_DRIVER(driver_, MemsetD8_v2)(k.report, 0, bytes); r != CUDA_SUCCESS) return r;
    if (CUresult r = PHOS_DRIVER(driver_, MemcpyHtoD_v2)(k.report, &header, sizeof(header)); r != CUDA_SUCCESS) {
      return r;
    }
  }
  const std::vector<RangeEntry> table = instrument::rangeTable(sets);
  // The table lives as long as the launch may run: it is freed with the
  // stream-ordered allocator after it, or kept until the kernel's report is
  // collected when that allocator is missing.
  CUdeviceptr tableAddress = 0;
  const size_t tableBytes = std::max<size_t>(1, table.size()) * sizeof(RangeEntry);
  if (CUresult r = PHOS_DRIVER(driver_, MemAllocAsync)(&tableAddress, tableBytes, stream); r != CUDA_SUCCESS) return r;
  if (!table.empty()) {
    // From pageable memory: the call returns once the table is staged, so the
    // vector may go away.
    if (CUresult r = PHOS_DRIVER(driver_, MemcpyHtoDAsync_v2)(tableAddress, table.data(), tableBytes, stream);
        r != CUDA_SUCCESS) {
      PHOS_DRIVER(driver_, MemFreeAsync)(tableAddress, stream);
      return r;
    }
  }
  uint64_t ranges64 = tableAddress;
  uint32_t count = static_cast<uint32_t>(table.size());
  uint64_t report = k.report;
  CUresult r;
  if (packed.empty()) {
    const size_t original = k.twinOffsets.size() - 3;
    std::vector<void*> params(kernelParams, kernelParams + original);
    params.push_back(&ranges64);
    params.push_back(&count);
    params.push_back(&report);
    r = launch(twin, params.data(), nullptr);
  } else {
    std::vector<std::byte> buffer(packed.begin(), packed.end());
    buffer.resize(std::max(buffer.size(), k.twinParamBytes));
    const size_t n = k.twinOffsets.size();
    std::memcpy(buffer.data() + k.twinOffsets[n - 3], &ranges64, sizeof(ranges64));
    std::memcpy(buffer.data() + k.twinOffsets[n - 2], &count, sizeof(count));
    std::memcpy(buffer.data() + k.twinOffsets[n - 1], &report, sizeof(report));
    size_t bufferSize = buffer.size();
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(), CU_LAUNCH_PARAM_BUFFER_SIZE, &bufferSize,
                     CU_LAUNCH_PARAM_END};
    r = launch(twin, nullptr, extra);
  }
  PHOS_DRIVER(driver_, MemFreeAsync)(tableAddress, stream);
  return r;
}

void LaunchValidator::noteLaunch(bool twin, bool incomplete) {
  ++counters_.launches;
  if (twin) {
    ++counters_.twinLaunches;
  } else {
    ++counters_.unvalidated;
  }
  if (incomplete) ++counters_.incomplete;
}

std::vector<Violation> LaunchValidator::collect() {
  std::vector<Violation> found;
  CUcontext saved = nullptr;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
  for (auto& [function, k] : kernels_) {
    if (k.report == 0) continue;
    PHOS_DRIVER(driver_, CtxSetCurrent)(k.context);
    ReportHeader header{};
    if (PHOS_DRIVER(driver_, MemcpyDtoH_v2)(&header, k.report, sizeof(header)) != CUDA_SUCCESS || header.count == 0) {
      continue;
    }
    counters_.violations += header.count;
    ++counters_.misspeculatedKernels;
    std::vector<ReportEntry> entries(std::min(header.count, kReportCapacity));
    if (PHOS_DRIVER(driver_, MemcpyDtoH_v2)(entries.data(), k.report + sizeof(ReportHeader),
                                            entries.size() * sizeof(ReportEntry)) == CUDA_SUCCESS) {
      for (const auto& e : entries) {
        found.push_back({k.name, e.address, e.instruction, e.function, e.size,
                         static_cast<instrument::ViolationKind>(e.kind)});
      }
    }
    header.count = 0;
    PHOS_DRIVER(driver_, MemcpyHtoD_v2)(k.report, &header, sizeof(header));
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
  return found;
}

void LaunchValidator::releaseReports() {
  CUcontext saved = nullptr;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
  for (auto& [function, k] : kernels_) {
    if (k.report == 0) continue;
    PHOS_DRIVER(driver_, CtxSetCurrent)(k.context);
    PHOS_DRIVER(driver_, MemFree_v2)(k.report);
    k.report = 0;
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
}

nlohmann::json LaunchValidator::report(const std::vector<Violation>& recent) const {
  nlohmann::json violations = nlohmann::json::array();
  for (const auto& v : recent) {
    const char* kind = v.kind == instrument::ViolationKind::kLoad     ? "load"
                       : v.kind == instrument::ViolationKind::kAtomic ? "atomic"
                                                                      : "store";
    violations.push_back({{"kernel", v.kernel}, {"address", fmt::format("{:#x}", v.address)}, {"kind", kind},
                          {"size", v.size}, {"instruction", v.instruction}, {"function", v.function}});
  }
  const char* mode = mode_ == ValidationMode::kValidate          ? "validate"
                     : mode_ == ValidationMode::kValidateRestore ? "validate-restore"
                                                                  : "off";
  return {{"mode", mode},
          {"launches", counters_.launches},
          {"twin_launches", counters_.twinLaunches},
          {"unvalidated_launches", counters_.unvalidated},
          {"incomplete_speculations", counters_.incomplete},
          {"violations", counters_.violations},
          {"misspeculated_kernels", counters_.misspeculatedKernels},
          {"reported", violations}};
}

void LaunchValidator::release(CUcontext context) {
  CUcontext saved = nullptr;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
  for (auto& [function, k] : kernels_) {
    if (k.report == 0 || (context != nullptr && k.context != context)) continue;
    PHOS_DRIVER(driver_, CtxSetCurrent)(k.context);
    PHOS_DRIVER(driver_, MemFree_v2)(k.report);
    k.report = 0;
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
  std::erase_if(kernels_, [&](auto& e) { return context == nullptr || e.second.context == context; });
  unloadTwinModules([&](const TwinModule& t) { return context == nullptr || t.context == context; });
}

}  // namespace phos::daemon
