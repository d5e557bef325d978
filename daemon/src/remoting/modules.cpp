// SPDX-License-Identifier: Apache-2.0
// Server hooks for modules and libraries: images read from the application,
// recorded for a restore, loaded as they are (the validator twins go in a
// module of their own beside them, docs/twins.md); globals that become session
// memory; enumerations that leave out any twin name.
#include <cuda.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "phos/cuda_api/server_hooks.h"
#include "phos/instrument/twin.h"
#include "remoting/application_image.h"
#include "session/launch_validator.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

using cuda_api::EntryPointId;

// The functions of a module (kernels of a library) the application may see:
// all the driver lists but validator twins. phosd loads its twins in modules of
// their own now (docs/twins.md); the filter stays so that no driver or loader
// that merges modules can ever show one to the program.
template <typename Owner, typename Handle>
CUresult applicationHandles(ServerCall& c, EntryPointId countId, EntryPointId enumerateId, EntryPointId nameId,
                            Owner owner, std::vector<Handle>* visible) {
  const DriverTable& d = c.driverTable();
  if (!d.has(countId) || !d.has(enumerateId)) return CUDA_ERROR_NOT_SUPPORTED;
  unsigned total = 0;
  CUresult r = d.get<CUresult (*)(unsigned*, Owner)>(countId)(&total, owner);
  if (r != CUDA_SUCCESS) return r;
  std::vector<Handle> all(std::max(1u, total));
  r = d.get<CUresult (*)(Handle*, unsigned, Owner)>(enumerateId)(all.data(), total, owner);
  if (r != CUDA_SUCCESS) return r;
  all.resize(total);
  visible->clear();
  const bool named = d.has(nameId);
  for (Handle h : all) {
    const char* name = nullptr;
    if (named && d.get<CUresult (*)(const char**, Handle)>(nameId)(&name, h) == CUDA_SUCCESS && name != nullptr &&
        instrument::isTwinName(name)) {
      continue;
    }
    visible->push_back(h);
  }
  return CUDA_SUCCESS;
}

template <typename Owner, typename Handle>
CUresult handleCount(ServerCall& c, EntryPointId countId, EntryPointId enumerateId, EntryPointId nameId,
                     unsigned* count, Owner owner) {
  const DriverTable& d = c.driverTable();
  if (!d.has(countId)) return CUDA_ERROR_NOT_SUPPORTED;
  if (count == nullptr) return d.get<CUresult (*)(unsigned*, Owner)>(countId)(nullptr, owner);
  if (!d.has(enumerateId)) return d.get<CUresult (*)(unsigned*, Owner)>(countId)(count, owner);
  std::vector<Handle> visible;
  CUresult r = applicationHandles<Owner, Handle>(c, countId, enumerateId, nameId, owner, &visible);
  *count = static_cast<unsigned>(visible.size());
  return r;
}

template <typename Owner, typename Handle>
CUresult enumerateHandles(ServerCall& c, EntryPointId countId, EntryPointId enumerateId, EntryPointId nameId,
                          HandleType type, std::vector<uint64_t>* out, unsigned capacity, Owner owner) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<Handle> handles;
  CUresult r = applicationHandles<Owner, Handle>(c, countId, enumerateId, nameId, owner, &handles);
  if (r != CUDA_SUCCESS) return r;
  handles.resize(std::min<size_t>(capacity, handles.size()));
  for (Handle h : handles) out->push_back(c.exportHandle(type, r, h));
  return CUDA_SUCCESS;
}

// The global's range becomes memory of the session (copies and memsets may
// name it, as they may on CUDA) until its module or library is unloaded or
// its context destroyed.
template <typename Owner>
CUresult getGlobal(ServerCall& c, EntryPointId id, CUdeviceptr* dptr, size_t* bytes, Handle<Owner> owner,
                   const char* name) {
  if (!c.driverTable().has(id)) return CUDA_ERROR_NOT_SUPPORTED;
  CUdeviceptr address = 0;
  size_t size = 0;
  CUresult r = c.driverTable().get<CUresult (*)(CUdeviceptr*, size_t*, Owner, const char*)>(id)(&address, &size,
                                                                                                owner.real, name);
  if (r == CUDA_SUCCESS && size > 0) {
    c.session().memory().add({address, size, c.session().contextOf(owner.id), static_cast<void*>(owner.real)});
  }
  if (dptr != nullptr) *dptr = address;
  if (bytes != nullptr) *bytes = size;
  return r;
}

// With the program's JIT options, if it gave some (`jit`); a restore loads
// the module again with those that shape its code.
CUresult loadModuleImage(ServerCall& c, uint64_t* module, const ipc::ImageRef& ref,
                         DriverJitOptions* jit = nullptr) {
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<char> image;
  if (CUresult r = readImage(c, ref, &image); r != CUDA_SUCCESS) return r;
  CUmodule m = nullptr;
  std::shared_ptr<const PreparedModule> prepared;
  c.session().memory().reserve(c.session().currentDevice());
  auto shaping = jit != nullptr ? jit->codeShaping() : std::vector<std::pair<int32_t, uint64_t>>();
  CUresult r = loadModule(c.driverTable(), image, &m, &prepared, jit);
  if (r != CUDA_SUCCESS) return r;
  c.session().noteModule(+1);
  c.session().validator().noteModule(m, std::move(prepared));
  *module = c.exportHandle(HandleType::kCUmod_st, r, m);
  // Kept for a checkpoint: a restore loads the module again from its image.
  ModuleRecord record{false, std::move(image), c.session().currentContext()};
  record.jitOptions = std::move(shaping);
  c.session().recordModule(*module, std::move(record));
  return CUDA_SUCCESS;
}

CUresult loadLibraryImage(ServerCall& c, uint64_t* library, const ipc::ImageRef& ref,
                          DriverJitOptions* jit) {
  if (library == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!c.driverTable().has(EntryPointId::kCuLibraryLoadData)) return CUDA_ERROR_NOT_SUPPORTED;
  std::vector<char> image;
  if (CUresult r = readImage(c, ref, &image); r != CUDA_SUCCESS) return r;
  CUlibrary lib = nullptr;
  std::shared_ptr<const PreparedModule> prepared;
  c.session().memory().reserve(c.session().currentDevice());
  auto shaping = jit->codeShaping();
  CUresult r = loadLibrary(c.driverTable(), image, &lib, &prepared, jit);
  if (r != CUDA_SUCCESS) return r;
  c.session().noteModule(+1);
  c.session().validator().noteLibrary(lib, std::move(prepared));
  *library = c.exportHandle(HandleType::kCUlib_st, r, lib);
  ModuleRecord record{true, std::move(image), 0};
  record.jitOptions = std::move(shaping);
  c.session().recordModule(*library, std::move(record));
  return CUDA_SUCCESS;
}

}  // namespace

constexpr size_t kMaxImageBytes = 1ull << 30;

CUresult readImage(ServerCall& c, const ipc::ImageRef& ref, std::vector<char>* image) {
  if (ref.address == 0 || ref.bytes == 0 || ref.bytes > kMaxImageBytes)
    return CUDA_ERROR_INVALID_VALUE;
  image->assign(ref.bytes + 1, '\0');
  if (Status s = c.session().readApplication(ref.address, image->data(), ref.bytes); !s.isOk()) {
    log::get("daemon")->warn("session {}: image: {}", c.session().id(), s.message());
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunctionCount(ServerCall& c, unsigned int* count, Handle<CUmodule> mod) {
  return handleCount<CUmodule, CUfunction>(c, EntryPointId::kCuModuleGetFunctionCount,
                                           EntryPointId::kCuModuleEnumerateFunctions, EntryPointId::kCuFuncGetName,
                                           count, mod.real);
}

CUresult cuLibraryGetKernelCount(ServerCall& c, unsigned int* count, Handle<CUlibrary> lib) {
  return handleCount<CUlibrary, CUkernel>(c, EntryPointId::kCuLibraryGetKernelCount,
                                          EntryPointId::kCuLibraryEnumerateKernels, EntryPointId::kCuKernelGetName,
                                          count, lib.real);
}

CUresult cuModuleEnumerateFunctions(ServerCall& c, std::vector<uint64_t>* functions, unsigned int numFunctions,
                                    Handle<CUmodule> mod) {
  return enumerateHandles<CUmodule, CUfunction>(c, EntryPointId::kCuModuleGetFunctionCount,
                                                EntryPointId::kCuModuleEnumerateFunctions,
                                                EntryPointId::kCuFuncGetName, HandleType::kCUfunc_st, functions,
                                                numFunctions, mod.real);
}

CUresult cuLibraryEnumerateKernels(ServerCall& c, std::vector<uint64_t>* kernels, unsigned int numKernels,
                                   Handle<CUlibrary> lib) {
  return enumerateHandles<CUlibrary, CUkernel>(c, EntryPointId::kCuLibraryGetKernelCount,
                                               EntryPointId::kCuLibraryEnumerateKernels,
                                               EntryPointId::kCuKernelGetName, HandleType::kCUkern_st, kernels,
                                               numKernels, lib.real);
}

CUresult cuModuleGetGlobal(ServerCall& c, CUdeviceptr* dptr, size_t* bytes, Handle<CUmodule> hmod, const char* name) {
  return getGlobal(c, EntryPointId::kCuModuleGetGlobal_v2, dptr, bytes, hmod, name);
}

CUresult cuLibraryGetGlobal(ServerCall& c, CUdeviceptr* dptr, size_t* bytes, Handle<CUlibrary> library,
                            const char* name) {
  return getGlobal(c, EntryPointId::kCuLibraryGetGlobal, dptr, bytes, library, name);
}

namespace {

// The ids of the application's functions that live in one of `modules`, and
// of the library modules among them: they die with an unload. Asked before
// it (the driver cannot answer for a function of an unloaded module), and
// forgotten after it, so that a checkpoint does not look for them.
std::vector<uint64_t> handlesOf(ServerCall& c, const std::vector<CUmodule>& modules) {
  const DriverTable& d = c.driverTable();
  HandleTable& handles = c.session().handles();
  std::vector<uint64_t> out;
  auto in = [&](CUmodule m) { return std::find(modules.begin(), modules.end(), m) != modules.end(); };
  if (d.has(EntryPointId::kCuFuncGetModule)) {
    for (uint64_t id : handles.ids(HandleType::kCUfunc_st)) {
      CUmodule m = nullptr;
      auto* f = static_cast<CUfunction>(handles.resolve(HandleType::kCUfunc_st, id));
      if (PHOS_DRIVER(d, FuncGetModule)(&m, f) == CUDA_SUCCESS && in(m)) out.push_back(id);
    }
  }
  for (uint64_t id : handles.ids(HandleType::kCUmod_st)) {
    if (in(static_cast<CUmodule>(handles.resolve(HandleType::kCUmod_st, id)))) out.push_back(id);
  }
  return out;
}

}  // namespace

CUresult cuModuleUnload(ServerCall& c, Handle<CUmodule> hmod) {
  // The driver waits for the work of the module's context (the current one, as a rule) first.
  if (c.session().deferBehindStreamWaits(c, c.session().currentDevice())) return CUDA_SUCCESS;
  c.session().passGate({.everything = true});  // its globals
  const std::vector<uint64_t> dying = handlesOf(c, {hmod.real});
  CUresult r = PHOS_DRIVER(c.driverTable(), ModuleUnload)(hmod.real);
  if (r == CUDA_SUCCESS) {
    c.session().validator().forgetModule(hmod.real);
    c.session().memory().removeGlobalsOf(hmod.real);
    c.session().forgetModule(hmod.id);
    for (uint64_t id : dying) c.session().handles().erase(id);
  }
  return r;
}

// Its globals, and those asked of its module, stop being session memory.
CUresult cuLibraryUnload(ServerCall& c, Handle<CUlibrary> library) {
  const DriverTable& d = c.driverTable();
  if (!d.has(EntryPointId::kCuLibraryUnload)) return CUDA_ERROR_NOT_SUPPORTED;
  CUmodule m{};
  if (!d.has(EntryPointId::kCuLibraryGetModule) || PHOS_DRIVER(d, LibraryGetModule)(&m, library.real) != CUDA_SUCCESS) {
    m = nullptr;
  }
  // The driver waits for the work of every context the library is loaded in.
  if (c.session().deferBehindStreamWaits(c, std::nullopt)) return CUDA_SUCCESS;
  c.session().passGate({.everything = true});  // its globals
  // Its kernels, and its module in each of the session's contexts with the
  // functions the application got from them.
  std::vector<uint64_t> dying;
  HandleTable& handles = c.session().handles();
  if (d.has(EntryPointId::kCuKernelGetLibrary)) {
    for (uint64_t id : handles.ids(HandleType::kCUkern_st)) {
      CUlibrary owner = nullptr;
      auto* k = static_cast<CUkernel>(handles.resolve(HandleType::kCUkern_st, id));
      if (PHOS_DRIVER(d, KernelGetLibrary)(&owner, k) == CUDA_SUCCESS && owner == library.real) dying.push_back(id);
    }
  }
  if (d.has(EntryPointId::kCuLibraryGetModule)) {
    std::vector<CUmodule> modules;
    CUcontext current = c.session().currentRealContext();
    for (const auto& [vid, ctx] : c.session().contexts()) {
      CUmodule inContext = nullptr;
      if (ctx.real != nullptr && PHOS_DRIVER(d, CtxSetCurrent)(ctx.real) == CUDA_SUCCESS &&
          PHOS_DRIVER(d, LibraryGetModule)(&inContext, library.real) == CUDA_SUCCESS) {
        modules.push_back(inContext);
      }
    }
    PHOS_DRIVER(d, CtxSetCurrent)(current);
    for (uint64_t id : handlesOf(c, modules)) dying.push_back(id);
  }
  CUresult r = PHOS_DRIVER(d, LibraryUnload)(library.real);
  if (r == CUDA_SUCCESS) {
    c.session().validator().forgetLibrary(library.real);
    c.session().memory().removeGlobalsOf(library.real);
    c.session().memory().removeGlobalsOf(m);
    c.session().forgetModule(library.id);
    for (uint64_t id : dying) handles.erase(id);
  }
  return r;
}

CUresult cuModuleLoad(ServerCall& c, uint64_t* module, const ipc::ImageRef& fname) {
  return loadModuleImage(c, module, fname);
}

CUresult cuModuleLoadData(ServerCall& c, uint64_t* module, const ipc::ImageRef& image) {
  return loadModuleImage(c, module, image);
}

CUresult cuModuleLoadDataEx(ServerCall& c, uint64_t* module, const ipc::ImageRef& image,
                            DriverJitOptions& options) {
  return loadModuleImage(c, module, image, &options);
}

CUresult cuModuleLoadFatBinary(ServerCall& c, uint64_t* module, const ipc::ImageRef& fatCubin) {
  return loadModuleImage(c, module, fatCubin);
}

// Library options (CUlibraryOption) are not forwarded: phosd keeps the
// image itself, so it is preserved whatever the program asked.
CUresult cuLibraryLoadData(ServerCall& c, uint64_t* library, const ipc::ImageRef& code,
                           DriverJitOptions& jitOptions, unsigned int) {
  return loadLibraryImage(c, library, code, &jitOptions);
}

CUresult cuLibraryLoadFromFile(ServerCall& c, uint64_t* library, const ipc::ImageRef& fileName,
                               DriverJitOptions& jitOptions, unsigned int) {
  return loadLibraryImage(c, library, fileName, &jitOptions);
}

}  // namespace phos::daemon::hooks
