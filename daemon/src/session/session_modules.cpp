// SPDX-License-Identifier: Apache-2.0
#include "session/session_modules.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <span>

#include "session/launch_validator.h"
#include "session/module_globals.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

std::vector<std::pair<uint64_t, std::vector<char>>> SessionModules::unlisted() const {
  std::vector<std::pair<uint64_t, std::vector<char>>> found;
  for (const auto& [id, rec] : records_) {
    if (rec.globalNames == nullptr) found.emplace_back(id, rec.image);
  }
  return found;
}

void SessionModules::setGlobalNames(uint64_t id,
                                    std::shared_ptr<const std::vector<std::string>> names) {
  // The same module still: ids are never reused.
  if (auto rec = records_.find(id); rec != records_.end())
    rec->second.globalNames = std::move(names);
}

void SessionModules::forgetContext(uint64_t context) {
  for (auto& [kernel, contexts] : kernelFunctions_) contexts.erase(context);
}

// ---- at a checkpoint ---------------------------------------------------------

class SessionModules::Saver {
 public:
  Saver(const SessionModules& modules, SessionScope& scope, const SaveTo& to, json& state)
      : modules_(modules), scope_(scope), d_(scope.driver), to_(to), state_(state) {}

  Status run() {
    RETURN_IF_ERROR(modules());
    libraryModules();
    functions();
    kernels();
    return Status::ok();
  }

 private:
  Status modules() {
    json modules = json::array();
    for (const auto& [id, rec] : modules_.records_) records_.emplace_back(id, &rec);
    std::sort(records_.begin(), records_.end(), [](const auto& a, const auto& b) {
      return HandleTable::serialOf(a.first) < HandleTable::serialOf(b.first);
    });
    for (const auto& [id, rec] : records_) {
      const HandleType type = rec->library ? HandleType::kCUlib_st : HandleType::kCUmod_st;
      void* real = scope_.handles.resolve(type, id);
      if (real == nullptr) continue;
      std::string name = fmt::format("module/{}", hex(id));
      ASSIGN_OR_RETURN(size_t imageBlob,
                       to_.writer.addBlob(name, "module-image", rec->image.size(),
                                          {{"module", id}, {"library", rec->library}}));
      RETURN_IF_ERROR(to_.writer.writeBlob(imageBlob, std::as_bytes(std::span(rec->image))));
      const int device = scope_.contexts.deviceOf(rec->context, 0);
      json globals = json::array();
      json entry = {{"id", id},
                    {"library", rec->library},
                    {"context", rec->context},
                    {"image", name},
                    {"order", rec->order}};
      if (!rec->jitOptions.empty()) entry["jit_options"] = rec->jitOptions;
      // Every global of every kind of image (PTX, fatbin, cubin), in every
      // context that has its own copy: a module's, or, for a library
      // (context-independent), each context of the session's.
      std::shared_ptr<const std::vector<std::string>> names = rec->globalNames;
      if (names == nullptr) {  // loaded since listModuleGlobals ran
        auto listed = moduleGlobalNames(rec->image);
        if (!listed.isOk()) {
          return makeError(Code::kNotSupported,
                           "the globals of module {} cannot be listed, so they cannot be saved: {}",
                           hex(id), listed.status().message());
        }
        names = std::make_shared<const std::vector<std::string>>(std::move(*listed));
      }
      std::vector<uint64_t> holders;
      if (rec->library) {
        for (const auto& [cid, ctx] : scope_.contexts) holders.push_back(cid);
      } else {
        holders.push_back(rec->context);
      }
      for (uint64_t holder : holders) {
        const SessionContext* ctx = scope_.contexts.find(holder);
        if (ctx == nullptr) continue;
        PHOS_DRIVER(d_, CtxSetCurrent)(ctx->real);
        for (const std::string& g : *names) {
          CUdeviceptr address = 0;
          size_t bytes = 0;
          CUresult r = rec->library ? PHOS_DRIVER(d_, LibraryGetGlobal)(
                                          &address, &bytes, static_cast<CUlibrary>(real), g.c_str())
                                    : PHOS_DRIVER(d_, ModuleGetGlobal_v2)(
                                          &address, &bytes, static_cast<CUmodule>(real), g.c_str());
          if (r == CUDA_ERROR_NO_BINARY_FOR_GPU) {
            break;  // no code for this device: nothing runs, nothing to save
          }
          if (r == CUDA_ERROR_NOT_FOUND && isStringLiteral(g)) {
            continue;  // comes back with the module
          }
          if (r != CUDA_SUCCESS) {
            return makeError(Code::kNotSupported,
                             "global {} of module {} cannot be read (CUresult {})", g, hex(id),
                             static_cast<int>(r));
          }
          if (bytes == 0) continue;
          const Allocation* taken = to_.memory.find(address);
          std::string blobName = fmt::format("global/{}/{}/{}", hex(id), hex(holder), g);
          ASSIGN_OR_RETURN(size_t blob,
                           to_.writer.addBlob(blobName, "module-global", bytes,
                                              {{"module", id}, {"name", g}, {"address", address}}));
          to_.copies.push_back({blob, address, bytes, nullptr, ctx->device});
          globals.push_back({{"name", g},
                             {"context", holder},
                             {"address", address},
                             {"bytes", bytes},
                             {"blob", blobName},
                             {"taken", taken != nullptr && taken->address == address}});
        }
      }
      entry["globals_enumerated"] = true;
      entry["globals"] = globals;
      entry["device"] = device;
      modules.push_back(entry);
    }
    state_["modules"] = modules;
    return Status::ok();
  }

  // Functions, kernels, library modules, streams and events: how to make
  // each again, by the id the application holds.

  // The library whose module in some context `m` is; 0 for none.
  uint64_t libraryOfModule(CUmodule m) {
    for (const auto& [id, rec] : records_) {
      if (!rec->library) continue;
      auto* lib = static_cast<CUlibrary>(scope_.handles.resolve(HandleType::kCUlib_st, id));
      CUmodule lm = nullptr;
      if (lib != nullptr && PHOS_DRIVER(d_, LibraryGetModule)(&lm, lib) == CUDA_SUCCESS && lm == m)
        return id;
    }
    return 0;
  }

  void libraryModules() {
    json libraryModules = json::array();
    for (uint64_t id : scope_.handles.ids(HandleType::kCUmod_st)) {
      if (modules_.records_.count(id) != 0) continue;
      auto* m = static_cast<CUmodule>(scope_.handles.resolve(HandleType::kCUmod_st, id));
      if (const SessionContext* ctx = scope_.contexts.find(scope_.contextOf(id)); ctx != nullptr) {
        PHOS_DRIVER(d_, CtxSetCurrent)(ctx->real);
      }
      if (uint64_t lib = libraryOfModule(m); lib != 0) {
        libraryModules.push_back({{"id", id}, {"library", lib}, {"context", scope_.contextOf(id)}});
      } else {
        to_.lost.push_back({{"id", id}, {"what", "a module phosd did not load itself"}});
      }
    }
    state_["library_modules"] = libraryModules;
  }

  void functions() {
    json functions = json::array();
    for (uint64_t id : scope_.handles.ids(HandleType::kCUfunc_st)) {
      auto* f = static_cast<CUfunction>(scope_.handles.resolve(HandleType::kCUfunc_st, id));
      const char* fname = nullptr;
      CUmodule m = nullptr;
      if (PHOS_DRIVER(d_, FuncGetName)(&fname, f) != CUDA_SUCCESS ||
          PHOS_DRIVER(d_, FuncGetModule)(&m, f) != CUDA_SUCCESS) {
        to_.lost.push_back({{"id", id}, {"what", "a function the driver cannot name"}});
        continue;
      }
      json entry = {{"id", id}, {"name", fname}, {"context", scope_.contextOf(id)}};
      if (uint64_t mid = scope_.handles.idOf(m);
          mid != 0 && HandleTable::typeOf(mid) == HandleType::kCUmod_st) {
        entry["module"] = mid;
      } else if (uint64_t lib = libraryOfModule(m); lib != 0) {
        entry["library"] = lib;  // cuKernelGetFunction: the library's module in this context
      } else {
        to_.lost.push_back(
            {{"id", id},
             {"what", fmt::format("function {} of a module phosd did not load", fname)}});
        continue;
      }
      json attributes = settableAttributes([&](CUfunction_attribute a, int* v) {
        return PHOS_DRIVER(d_, FuncGetAttribute)(v, a, f);
      });
      if (!attributes.empty()) entry["attributes"] = attributes;
      functions.push_back(entry);
    }
    state_["functions"] = functions;
  }

  void kernels() {
    json kernels = json::array();
    for (uint64_t id : scope_.handles.ids(HandleType::kCUkern_st)) {
      auto* k = static_cast<CUkernel>(scope_.handles.resolve(HandleType::kCUkern_st, id));
      const char* kname = nullptr;
      CUlibrary lib = nullptr;
      if (PHOS_DRIVER(d_, KernelGetName)(&kname, k) != CUDA_SUCCESS ||
          PHOS_DRIVER(d_, KernelGetLibrary)(&lib, k) != CUDA_SUCCESS) {
        to_.lost.push_back({{"id", id}, {"what", "a kernel the driver cannot name"}});
        continue;
      }
      // Per device: cuKernelSetAttribute applies to the kernel's functions in
      // every context of one device.
      json perDevice = json::object();
      for (int dev = 0; dev < to_.deviceCount; ++dev) {
        json attributes = settableAttributes([&](CUfunction_attribute a, int* v) {
          return PHOS_DRIVER(d_, KernelGetAttribute)(v, a, k, dev);
        });
        if (!attributes.empty()) perDevice[std::to_string(dev)] = attributes;
      }
      // The kernel's function in a context where the program set attributes
      // of its own (cuFuncSetAttribute on the kernel's handle): those that
      // differ from the kernel's on that device. They override the kernel's,
      // whenever the program set them (cuKernelSetAttribute's documentation).
      json ownFunctions = json::array();
      if (auto used = modules_.kernelFunctions_.find(id); used != modules_.kernelFunctions_.end()) {
        for (uint64_t context : used->second) {
          const SessionContext* ctx = scope_.contexts.find(context);
          CUfunction f = nullptr;
          if (ctx == nullptr || PHOS_DRIVER(d_, CtxSetCurrent)(ctx->real) != CUDA_SUCCESS ||
              PHOS_DRIVER(d_, KernelGetFunction)(&f, k) != CUDA_SUCCESS) {
            continue;
          }
          const json kernelLevel = perDevice.value(std::to_string(ctx->device), json::object());
          const json now = settableAttributes([&](CUfunction_attribute a, int* v) {
            return PHOS_DRIVER(d_, FuncGetAttribute)(v, a, f);
          });
          json own = json::object();
          for (const auto& [name, value] : now.items()) {
            if (kernelLevel.value(name, json()) != value) own[name] = value;
          }
          if (!own.empty()) ownFunctions.push_back({{"context", context}, {"attributes", own}});
        }
      }
      json entry = {{"id", id},
                    {"library", scope_.handles.idOf(lib)},
                    {"name", kname},
                    {"attributes", perDevice}};
      if (!ownFunctions.empty()) entry["functions"] = ownFunctions;
      kernels.push_back(entry);
    }
    state_["kernels"] = kernels;
  }

  const SessionModules& modules_;
  SessionScope& scope_;
  const DriverTable& d_;
  const SaveTo& to_;
  json& state_;
  std::vector<std::pair<uint64_t, const ModuleRecord*>>
      records_;  // modules and libraries, in creation order
};

Status SessionModules::save(SessionScope& scope, const SaveTo& to, json& state) const {
  return Saver(*this, scope, to, state).run();
}

// ---- at a restore --------------------------------------------------------------

namespace {

// This process's mappings that overlap [from, to), as /proc/self/maps lists
// them: what the driver had put where a module's globals were to go
// (docs/gpu.md: where NVIDIA's driver places modules).
std::string mappingsAround(uint64_t from, uint64_t to) {
  std::ifstream maps("/proc/self/maps");
  std::string line, out;
  int shown = 0;
  while (std::getline(maps, line) && shown < 12) {
    uint64_t start = 0, end = 0;
    const char* dash = std::strchr(line.c_str(), '-');
    if (dash == nullptr) continue;
    std::from_chars(line.data(), dash, start, 16);
    std::from_chars(dash + 1, line.data() + line.size(), end, 16);
    if (end <= from || start >= to) continue;
    out += (shown++ == 0 ? "" : ", ") + line.substr(0, line.find(' ', line.find(' ') + 1));
    if (const size_t path = line.find('/'); path != std::string::npos)
      out += " " + line.substr(path);
  }
  return out.empty() ? "none" : out;
}

Status bindLibraryModules(SessionScope& scope, const json& state) {
  const DriverTable& d_ = scope.driver;
  for (const json& m : state.value("library_modules", json::array())) {
    ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(m, "id", "library module"));
    ASSIGN_OR_RETURN(uint64_t lid, field<uint64_t>(m, "library", "library module"));
    const uint64_t context = m.value("context", uint64_t{0});
    if (context != 0) RETURN_IF_ERROR(scope.contexts.makeCurrent(d_, context));
    CUmodule mod = nullptr;
    auto* lib = static_cast<CUlibrary>(scope.handles.resolve(HandleType::kCUlib_st, lid));
    if (lib == nullptr || PHOS_DRIVER(d_, LibraryGetModule)(&mod, lib) != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition, "module {} of library {} cannot be made again",
                       hex(mid), hex(lid));
    }
    scope.handles.bind(HandleType::kCUmod_st, mid, mod);
    if (context != 0) scope.contexts.noteObject(mid, context);
  }
  return Status::ok();
}

Status bindKernels(SessionScope& scope, const json& state, int deviceCount,
                   std::map<uint64_t, std::set<uint64_t>>& kernelFunctions_) {
  const DriverTable& d_ = scope.driver;
  // Kernels before functions: a function's saved attributes are set only
  // where they differ from what it inherits from its kernel.
  for (const json& k : state.value("kernels", json::array())) {
    ASSIGN_OR_RETURN(uint64_t kid, field<uint64_t>(k, "id", "kernel"));
    ASSIGN_OR_RETURN(uint64_t lid, field<uint64_t>(k, "library", "kernel"));
    ASSIGN_OR_RETURN(std::string name, field<std::string>(k, "name", "kernel"));
    auto* lib = static_cast<CUlibrary>(scope.handles.resolve(HandleType::kCUlib_st, lid));
    CUkernel kernel = nullptr;
    if (lib == nullptr ||
        PHOS_DRIVER(d_, LibraryGetKernel)(&kernel, lib, name.c_str()) != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition, "kernel {} ({}) cannot be found again", name,
                       hex(kid));
    }
    const json perDevice = k.value("attributes", json::object());
    for (const auto& [device, attributes] : perDevice.items()) {
      const int dev = std::atoi(device.c_str());
      if (dev < 0 || dev >= deviceCount) {
        return makeError(Code::kFailedPrecondition,
                         "kernel {} ({}) has attributes for device {}, this host has {}", name,
                         hex(kid), device, deviceCount);
      }
      RETURN_IF_ERROR(restoreAttributes(
          attributes, fmt::format("kernel {} ({}) on device {}", name, hex(kid), dev),
          [&](CUfunction_attribute a, int* v) {
            return PHOS_DRIVER(d_, KernelGetAttribute)(v, a, kernel, dev);
          },
          [&](CUfunction_attribute a, int v) {
            return PHOS_DRIVER(d_, KernelSetAttribute)(a, v, kernel, dev);
          }));
    }
    for (const json& own : k.value("functions", json::array())) {
      ASSIGN_OR_RETURN(uint64_t context, field<uint64_t>(own, "context", "kernel function"));
      RETURN_IF_ERROR(scope.contexts.makeCurrent(d_, context));
      CUfunction fn = nullptr;
      RETURN_IF_ERROR(driverStatus(
          PHOS_DRIVER(d_, KernelGetFunction)(&fn, kernel),
          fmt::format("kernel {} ({}) as a function of context {}", name, hex(kid), hex(context))));
      RETURN_IF_ERROR(restoreAttributes(
          own.value("attributes", json::object()),
          fmt::format("kernel {} ({}) in context {}", name, hex(kid), hex(context)),
          [&](CUfunction_attribute a, int* v) {
            return PHOS_DRIVER(d_, FuncGetAttribute)(v, a, fn);
          },
          [&](CUfunction_attribute a, int v) {
            return PHOS_DRIVER(d_, FuncSetAttribute)(fn, a, v);
          }));
      kernelFunctions_[kid].insert(context);
    }
    scope.handles.bind(HandleType::kCUkern_st, kid, kernel);
  }
  return Status::ok();
}

Status bindFunctionsOf(SessionScope& scope, const json& state) {
  const DriverTable& d_ = scope.driver;
  for (const json& f : state.value("functions", json::array())) {
    ASSIGN_OR_RETURN(uint64_t fid, field<uint64_t>(f, "id", "function"));
    ASSIGN_OR_RETURN(std::string name, field<std::string>(f, "name", "function"));
    const uint64_t context = f.value("context", uint64_t{0});
    if (context != 0) RETURN_IF_ERROR(scope.contexts.makeCurrent(d_, context));
    CUmodule mod = nullptr;
    if (f.contains("library")) {
      auto* lib = static_cast<CUlibrary>(
          scope.handles.resolve(HandleType::kCUlib_st, f.value("library", uint64_t{0})));
      if (lib != nullptr && PHOS_DRIVER(d_, LibraryGetModule)(&mod, lib) != CUDA_SUCCESS)
        mod = nullptr;
    } else {
      ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(f, "module", "function"));
      mod = static_cast<CUmodule>(scope.handles.resolve(HandleType::kCUmod_st, mid));
    }
    CUfunction fn = nullptr;
    if (mod == nullptr ||
        PHOS_DRIVER(d_, ModuleGetFunction)(&fn, mod, name.c_str()) != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition, "function {} ({}) cannot be found again", name,
                       hex(fid));
    }
    RETURN_IF_ERROR(restoreAttributes(
        f.value("attributes", json::object()), fmt::format("function {} ({})", name, hex(fid)),
        [&](CUfunction_attribute a, int* v) { return PHOS_DRIVER(d_, FuncGetAttribute)(v, a, fn); },
        [&](CUfunction_attribute a, int v) {
          return PHOS_DRIVER(d_, FuncSetAttribute)(fn, a, v);
        }));
    scope.handles.bind(HandleType::kCUfunc_st, fid, fn);
    if (context != 0) scope.contexts.noteObject(fid, context);
  }
  return Status::ok();
}

}  // namespace

// The context whose copy of a global `g` is (images before contexts were
// saved name none).
SessionModules::Load::Load(SessionModules& modules, SessionScope& scope, const image::ImageReader& reader,
                           LaunchValidator& validator, DeviceMemory& memory, std::vector<Copy>& copies)
    : modules_(modules),
      scope_(scope),
      d_(scope.driver),
      reader_(reader),
      validator_(validator),
      memory_(memory),
      copies_(copies) {}

uint64_t SessionModules::Load::holderOf(const json& g, bool library, uint64_t context) const {
  if (g.contains("context")) return g.value("context", uint64_t{0});
  return library && scope_.contexts.size() != 0 ? scope_.contexts.begin()->first : context;
}

Status SessionModules::Load::module(const json& m,
                                    const std::function<Status(uint64_t order)>& before) {
  const uint64_t order = m.value("order", std::numeric_limits<uint64_t>::max());
  RETURN_IF_ERROR(before(order));
  ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(m, "id", "module"));
  const bool library = m.value("library", false);
  const uint64_t context = m.value("context", uint64_t{0});
  auto imageBlob = reader_.findBlob(m.value("image", std::string()));
  if (!imageBlob) return makeError(Code::kDataLoss, "the image of module {} is missing", hex(mid));
  ModuleRecord rec{library, std::vector<char>(reader_.manifest().blobs[*imageBlob].size), context,
                   order == std::numeric_limits<uint64_t>::max() ? 0 : order};
  RETURN_IF_ERROR(reader_.read(*imageBlob, 0, std::as_writable_bytes(std::span(rec.image))));
  if (rec.image.empty() || rec.image.back() != '\0') rec.image.push_back('\0');
  try {
    rec.jitOptions = m.value("jit_options", std::vector<std::pair<int32_t, uint64_t>>());
  } catch (const json::exception& e) {
    return makeError(Code::kDataLoss, "the JIT options of module {} are malformed: {}", hex(mid),
                     e.what());
  }
  DriverJitOptions jit = DriverJitOptions::of(rec.jitOptions);
  // Each context's copy of the globals goes back where the application
  // knew it: vgpu places them as asked; another driver places them itself,
  // and the check below refuses the restore if one moved.
  std::map<uint64_t, std::map<std::string, uint64_t>>
      placements;  // holder context -> name -> address
  for (const json& g : m.value("globals", json::array())) {
    placements[holderOf(g, library, context)][g.value("name", std::string())] =
        g.value("address", uint64_t{0});
  }
  auto place = [&](uint64_t holder) -> Status {
    const vgpu::ExportTable* vgpu = d_.vgpu();
    auto it = placements.find(holder);
    if (vgpu == nullptr || vgpu->size < sizeof(vgpu::ExportTable) || it == placements.end())
      return Status::ok();
    ASSIGN_OR_RETURN(CUcontext in, scope_.contexts.real(holder));
    return driverStatus(vgpu->placeNextModuleGlobals(in, it->second),
                        fmt::format("placing the globals of module {}", hex(mid)));
  };
  const uint64_t firstHolder =
      library ? (placements.empty() ? 0 : placements.begin()->first) : context;
  if (firstHolder != 0) {
    RETURN_IF_ERROR(scope_.contexts.makeCurrent(d_, firstHolder));
    RETURN_IF_ERROR(place(firstHolder));
  }
  void* real = nullptr;
  CUresult r;
  // As when the application loaded it: its own image; its validator twins
  // are loaded beside it when a twin of it first runs.
  std::shared_ptr<const PreparedModule> prepared;
  if (library) {
    CUlibrary lib = nullptr;
    r = loadLibrary(d_, rec.image, &lib, &prepared, &jit);
    if (r == CUDA_SUCCESS) validator_.noteLibrary(lib, prepared);
    real = lib;
    // The library's module in each other context that held globals.
    for (const auto& [holder, names] : placements) {
      if (r != CUDA_SUCCESS || holder == firstHolder) continue;
      RETURN_IF_ERROR(scope_.contexts.makeCurrent(d_, holder));
      RETURN_IF_ERROR(place(holder));
      CUmodule inHolder = nullptr;
      r = PHOS_DRIVER(d_, LibraryGetModule)(&inHolder, lib);
    }
  } else {
    CUmodule mod = nullptr;
    r = loadModule(d_, rec.image, &mod, &prepared, &jit);
    if (r == CUDA_SUCCESS) validator_.noteModule(mod, prepared);
    real = mod;
  }
  if (r != CUDA_SUCCESS) {
    return makeError(Code::kFailedPrecondition, "the driver refused module {} again (CUresult {})",
                     hex(mid), static_cast<int>(r));
  }
  scope_.handles.bind(library ? HandleType::kCUlib_st : HandleType::kCUmod_st, mid, real);
  if (!library) scope_.contexts.noteObject(mid, context);
  modules_.records_[mid] = std::move(rec);
  return globals(m, mid, library, real, context);
}

// Where each global of module `mid` is now, which must be where it was.
Status SessionModules::Load::globals(const json& m, uint64_t mid, bool library, void* real,
                                     uint64_t context) {
  const int device = m.value("device", 0);
  for (const json& g : m.value("globals", json::array())) {
    // A library's globals are per context: each on its context's device.
    const int globalDevice = scope_.contexts.deviceOf(g.value("context", context), device);
    ASSIGN_OR_RETURN(std::string name, field<std::string>(g, "name", "global"));
    ASSIGN_OR_RETURN(CUdeviceptr was, field<uint64_t>(g, "address", "global"));
    ASSIGN_OR_RETURN(size_t blob, blobOf(reader_, g, "global"));
    CUdeviceptr address = 0;
    size_t bytes = 0;
    CUresult r = CUDA_SUCCESS;
    const uint64_t holder = holderOf(g, library, context);
    if (library) {
      ASSIGN_OR_RETURN(CUcontext in, scope_.contexts.real(holder));
      PHOS_DRIVER(d_, CtxSetCurrent)(in);
      r = PHOS_DRIVER(d_, LibraryGetGlobal)(&address, &bytes, static_cast<CUlibrary>(real),
                                            name.c_str());
    } else {
      r = PHOS_DRIVER(d_, ModuleGetGlobal_v2)(&address, &bytes, static_cast<CUmodule>(real),
                                              name.c_str());
    }
    if (r != CUDA_SUCCESS || bytes != reader_.manifest().blobs[blob].size) {
      return makeError(Code::kFailedPrecondition, "global {} of module {} is not what it was", name,
                       hex(mid));
    }
    if (address != was) {
      // The application, or device memory a kernel wrote, may hold the
      // old address: nothing can make them agree. What holds that address
      // now, when the driver says (docs/gpu.md: where NVIDIA's driver
      // places modules).
      CUdeviceptr base = 0;
      size_t size = 0;
      std::string holds;
      if (PHOS_DRIVER(d_, MemGetAddressRange_v2)(&base, &size, was) == CUDA_SUCCESS) {
        holds = fmt::format("; {} is in a driver allocation of {} bytes at {} now", hex(was), size,
                            hex(base));
      }
      const uint64_t low = std::min<uint64_t>(was, address),
                     high = std::max<uint64_t>(was, address);
      return makeError(
          Code::kFailedPrecondition,
          "global {} of module {} was at {} and the driver placed it at {} now{}{}; this process "
          "maps there: {}",
          name, hex(mid), hex(was), hex(address),
          g.value("taken", false) ? "; the application holds the old address" : "", holds,
          mappingsAround(low - std::min<uint64_t>(low, 4u << 20), high + (4u << 20)));
    }
    if (g.value("taken", false)) {
      memory_.add({address, bytes, holder, real, globalDevice});
    }
    copies_.push_back({holder, globalDevice, blob, address});
  }
  return Status::ok();
}

Status SessionModules::bindFunctions(SessionScope& scope, const json& state, int deviceCount) {
  RETURN_IF_ERROR(bindLibraryModules(scope, state));
  RETURN_IF_ERROR(bindKernels(scope, state, deviceCount, kernelFunctions_));
  return bindFunctionsOf(scope, state);
}

}  // namespace phos::daemon
