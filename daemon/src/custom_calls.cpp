// SPDX-License-Identifier: Apache-2.0
// The handwritten server functions: entry points whose data a generic
// encoding cannot describe (kernel parameters, module images, application
// memory, pinned memory) or that phosd answers itself (contexts from the
// pool, per-session primary contexts). Their wire formats are written next
// to each function and mirrored in shim/src/custom_calls.cpp.
#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "host_calls.h"
#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "phos/instrument/twin.h"
#include "server_call.h"
#include "session.h"

namespace phos::daemon {
namespace {

using cuda_api::EntryPointId;
using ipc::Decoder;

// Marks blob lengths that stand for "the application used `extra`".
constexpr uint32_t kExtraBuffer = 0xfffffffeu;

const DriverTable& drv(ServerCall& c) { return c.driverTable(); }

void replyResult(ServerCall& c, CUresult r) {
  c.reply(r);
  c.send();
}

// ---- init --------------------------------------------------------------
// cuInit: u32 flags.
void serveInit(ServerCall& c) {
  auto flags = c.args().u32();
  if (!c.argumentsComplete()) return;
  replyResult(c, PHOS_DRIVER(drv(c), Init)(flags));
}

// ---- contexts ------------------------------------------------------------
uint64_t adoptContext(Session& s, CUcontext real, int device, bool primary) {
  uint64_t id = s.handles().exportHandle(HandleType::kCUctx_st, real);
  s.captureOutput(real);
  s.contexts()[id] = SessionContext{real, device, primary};
  return id;
}

// Context flags: only those cuda.h defines, and one scheduling policy at most.
bool validContextFlags(unsigned flags) {
  const unsigned known = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_COREDUMP_ENABLE |
                         CU_CTX_USER_COREDUMP_ENABLE | CU_CTX_SYNC_MEMOPS;
  const unsigned sched = flags & CU_CTX_SCHED_MASK;
  return (flags & ~known) == 0 && (sched == CU_CTX_SCHED_AUTO || sched == CU_CTX_SCHED_SPIN ||
                                   sched == CU_CTX_SCHED_YIELD || sched == CU_CTX_SCHED_BLOCKING_SYNC);
}

// cuCtxCreate (all revisions): u32 flags, i32 device. Reply: u64 context.
void serveCtxCreate(ServerCall& c) {
  auto flags = c.args().u32();
  auto device = c.args().value<int32_t>();
  if (!c.argumentsComplete()) return;
  int count = 0;
  PHOS_DRIVER(drv(c), DeviceGetCount)(&count);
  if (device < 0 || device >= count) return replyResult(c, CUDA_ERROR_INVALID_DEVICE);
  if (!validContextFlags(flags)) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  auto ctx = c.session().pool().take(device, flags);
  if (!ctx.isOk()) return replyResult(c, CUDA_ERROR_OUT_OF_MEMORY);
  uint64_t id = adoptContext(c.session(), *ctx, device, false);
  c.reply(CUDA_SUCCESS).u64(id);
  c.send();
}

// cuCtxDestroy: u64 context.
void serveCtxDestroy(ServerCall& c) {
  auto id = c.args().u64();
  if (!c.argumentsComplete()) return;
  auto& contexts = c.session().contexts();
  auto it = contexts.find(id);
  if (it == contexts.end()) return replyResult(c, CUDA_ERROR_INVALID_CONTEXT);
  if (it->second.primary) return replyResult(c, CUDA_ERROR_INVALID_CONTEXT);
  c.session().passGate({.everything = true});
  PHOS_DRIVER(drv(c), CtxSynchronize)();
  c.session().destroyContext(id);
  replyResult(c, CUDA_SUCCESS);
}

bool validDevice(ServerCall& c, int device) {
  int count = 0;
  PHOS_DRIVER(drv(c), DeviceGetCount)(&count);
  return device >= 0 && device < count;
}

// cuDevicePrimaryCtxRetain: i32 device. Reply: u64 context.
void servePrimaryRetain(ServerCall& c) {
  auto device = c.args().value<int32_t>();
  if (!c.argumentsComplete()) return;
  if (!validDevice(c, device)) return replyResult(c, CUDA_ERROR_INVALID_DEVICE);
  Session& s = c.session();
  PrimaryContext& st = s.primary(device);
  auto& contexts = s.contexts();
  if (st.id == 0 || contexts.find(st.id) == contexts.end()) {
    auto ctx = s.pool().take(device, st.flags);
    if (!ctx.isOk()) return replyResult(c, CUDA_ERROR_OUT_OF_MEMORY);
    if (st.id == 0) {
      st.id = adoptContext(s, *ctx, device, true);
    } else {
      // Released earlier: the same virtual id, a new driver context.
      s.handles().bind(HandleType::kCUctx_st, st.id, *ctx);
      contexts[st.id] = SessionContext{*ctx, device, true};
      s.captureOutput(*ctx);
    }
  }
  ++st.refs;
  c.reply(CUDA_SUCCESS).u64(st.id);
  c.send();
}

// Destroys the driver context; the virtual id stays (a later retain re-binds it).
void releasePrimary(Session& s, PrimaryContext& st) {
  if (s.contexts().count(st.id) != 0) {
    s.passGate({.everything = true});  // its memory goes with it
    s.destroyContext(st.id);
  }
  st.refs = 0;
}

// cuDevicePrimaryCtxRelease / Reset: i32 device.
void servePrimaryRelease(ServerCall& c) {
  auto device = c.args().value<int32_t>();
  if (!c.argumentsComplete()) return;
  if (!validDevice(c, device)) return replyResult(c, CUDA_ERROR_INVALID_DEVICE);
  Session& s = c.session();
  PrimaryContext& st = s.primary(device);
  if (st.refs == 0) return replyResult(c, CUDA_ERROR_INVALID_CONTEXT);
  if (--st.refs == 0) releasePrimary(s, st);
  replyResult(c, CUDA_SUCCESS);
}

void servePrimaryReset(ServerCall& c) {
  auto device = c.args().value<int32_t>();
  if (!c.argumentsComplete()) return;
  if (!validDevice(c, device)) return replyResult(c, CUDA_ERROR_INVALID_DEVICE);
  Session& s = c.session();
  PrimaryContext& st = s.primary(device);
  releasePrimary(s, st);
  st.flags = 0;
  replyResult(c, CUDA_SUCCESS);
}

// cuDevicePrimaryCtxSetFlags: i32 device, u32 flags.
void servePrimarySetFlags(ServerCall& c) {
  auto device = c.args().value<int32_t>();
  auto flags = c.args().u32();
  if (!c.argumentsComplete()) return;
  if (!validDevice(c, device)) return replyResult(c, CUDA_ERROR_INVALID_DEVICE);
  if (!validContextFlags(flags)) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  c.session().primary(device).flags = flags;
  replyResult(c, CUDA_SUCCESS);
}

// cuDevicePrimaryCtxGetState: i32 device. Reply: u32 flags, i32 active.
void servePrimaryGetState(ServerCall& c) {
  auto device = c.args().value<int32_t>();
  if (!c.argumentsComplete()) return;
  if (!validDevice(c, device)) return replyResult(c, CUDA_ERROR_INVALID_DEVICE);
  const PrimaryContext& st = c.session().primary(device);
  unsigned flags = st.flags;
  int active = st.refs > 0 ? 1 : 0;
  auto& r = c.reply(CUDA_SUCCESS);
  r.u32(flags);
  r.value<int32_t>(active);
  c.send();
}

// ---- strings -------------------------------------------------------------
// cuDeviceGetName / cuDeviceGetPCIBusId: i32 capacity, i32 device. Reply: string.
template <bool kPciBusId>
void serveDeviceString(ServerCall& c) {
  auto len = c.args().value<int32_t>();
  auto device = c.args().value<int32_t>();
  if (!c.argumentsComplete()) return;
  if (len <= 0 || len > 4096) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  std::vector<char> buf(static_cast<size_t>(len), '\0');
  CUresult r = kPciBusId ? PHOS_DRIVER(drv(c), DeviceGetPCIBusId)(buf.data(), len, device)
                         : PHOS_DRIVER(drv(c), DeviceGetName)(buf.data(), len, device);
  auto& w = c.reply(r);
  w.blob(buf.data(), strnlen(buf.data(), buf.size()));
  c.send();
}

// cuFuncGetName / cuKernelGetName: u64 handle. Reply: string.
void serveFuncGetName(ServerCall& c) {
  auto id = c.args().u64();
  if (!c.argumentsComplete()) return;
  CUfunction f{};
  if (!c.resolve(HandleType::kCUfunc_st, id, &f)) return;
  const char* name = nullptr;
  // Drivers before CUDA 12.3 have no cuFuncGetName (no call through NULL).
  CUresult r = c.driverTable().has(EntryPointId::kCuFuncGetName) ? PHOS_DRIVER(drv(c), FuncGetName)(&name, f)
                                                                  : CUDA_ERROR_NOT_SUPPORTED;
  auto& w = c.reply(r);
  w.string(r == CUDA_SUCCESS ? name : nullptr);
  c.send();
}

// The functions of a module (kernels of a library) the application may see:
// all the driver lists but the validator twins phosd loaded with them
// (docs/speculation.md), so that counts and enumerations are the module's own.
template <typename Owner, typename Handle, EntryPointId kCountId, EntryPointId kEnumerateId, EntryPointId kNameId>
CUresult applicationHandles(ServerCall& c, Owner owner, std::vector<Handle>* visible) {
  if (!c.driverTable().has(kCountId) || !c.driverTable().has(kEnumerateId)) return CUDA_ERROR_NOT_SUPPORTED;
  unsigned total = 0;
  CUresult r = c.driverTable().get<CUresult (*)(unsigned*, Owner)>(kCountId)(&total, owner);
  if (r != CUDA_SUCCESS) return r;
  std::vector<Handle> all(std::max(1u, total));
  r = c.driverTable().get<CUresult (*)(Handle*, unsigned, Owner)>(kEnumerateId)(all.data(), total, owner);
  if (r != CUDA_SUCCESS) return r;
  all.resize(total);
  visible->clear();
  const bool named = c.driverTable().has(kNameId);
  for (Handle h : all) {
    const char* name = nullptr;
    if (named && c.driverTable().get<CUresult (*)(const char**, Handle)>(kNameId)(&name, h) == CUDA_SUCCESS &&
        name != nullptr && instrument::isTwinName(name)) {
      continue;
    }
    visible->push_back(h);
  }
  return CUDA_SUCCESS;
}

// cuModuleGetFunctionCount / cuLibraryGetKernelCount: present(count), u64
// module or library. Reply: present + u32 count.
template <typename Owner, typename Handle, HandleType kOwnerType, EntryPointId kCountId, EntryPointId kEnumerateId,
          EntryPointId kNameId>
void serveHandleCount(ServerCall& c) {
  const bool wantCount = c.args().present();
  const uint64_t ownerId = c.args().u64();
  if (!c.argumentsComplete()) return;
  if (!c.driverTable().has(kCountId)) return replyResult(c, CUDA_ERROR_NOT_SUPPORTED);
  Owner owner{};
  if (!c.resolve(kOwnerType, ownerId, &owner)) return;
  unsigned count = 0;
  CUresult r;
  if (!wantCount) {
    r = c.driverTable().get<CUresult (*)(unsigned*, Owner)>(kCountId)(nullptr, owner);
  } else if (c.driverTable().has(kEnumerateId)) {
    std::vector<Handle> visible;
    r = applicationHandles<Owner, Handle, kCountId, kEnumerateId, kNameId>(c, owner, &visible);
    count = static_cast<unsigned>(visible.size());
  } else {
    r = c.driverTable().get<CUresult (*)(unsigned*, Owner)>(kCountId)(&count, owner);
  }
  auto& w = c.reply(r);
  w.u8(wantCount);
  if (wantCount) w.value(count);
  c.send();
}

// cuModuleEnumerateFunctions / cuLibraryEnumerateKernels: u64 module or
// library, u32 count (the application's array). Reply: u32 n, n x u64 handle:
// the first min(count, what the module has) handles.
template <typename Owner, typename Handle, HandleType kOwnerType, HandleType kHandleType, EntryPointId kCountId,
          EntryPointId kEnumerateId, EntryPointId kNameId>
void serveEnumerateHandles(ServerCall& c) {
  auto ownerId = c.args().u64();
  auto count = c.args().u32();
  if (!c.argumentsComplete()) return;
  Owner owner{};
  if (!c.resolve(kOwnerType, ownerId, &owner)) return;
  std::vector<Handle> handles;
  CUresult r = applicationHandles<Owner, Handle, kCountId, kEnumerateId, kNameId>(c, owner, &handles);
  const unsigned n = r == CUDA_SUCCESS ? std::min<unsigned>(count, handles.size()) : 0;
  auto& w = c.reply(r);
  w.u32(n);
  for (unsigned i = 0; i < n; ++i) w.u64(c.exportHandle(kHandleType, r, handles[i]));
  c.send();
}

// cuModuleGetGlobal / cuLibraryGetGlobal: present(dptr), present(bytes), u64
// module or library, string name. Reply: present + u64 address, present + u64
// bytes. The global's range becomes memory of the session (copies and memsets
// may name it, as they may on CUDA) until its module or library is unloaded or
// its context destroyed.
template <typename Owner, HandleType kOwnerType, EntryPointId kId>
void serveGetGlobal(ServerCall& c) {
  Decoder& a = c.args();
  const bool wantAddress = a.present();
  const bool wantBytes = a.present();
  const uint64_t ownerId = a.u64();
  bool null = false;
  const std::string name = ServerCall::text(a.blob(&null));
  if (!c.argumentsComplete()) return;
  Owner owner{};
  if (!c.resolve(kOwnerType, ownerId, &owner)) return;
  if (!c.driverTable().has(kId)) return replyResult(c, CUDA_ERROR_NOT_SUPPORTED);
  CUdeviceptr address = 0;
  size_t bytes = 0;
  CUresult r = c.driverTable().get<CUresult (*)(CUdeviceptr*, size_t*, Owner, const char*)>(kId)(
      &address, &bytes, owner, null ? nullptr : name.c_str());
  if (r == CUDA_SUCCESS && bytes > 0) {
    c.session().addAllocation({address, bytes, c.session().contextOf(ownerId), static_cast<void*>(owner)});
  }
  auto& w = c.reply(r);
  w.u8(wantAddress);
  if (wantAddress) w.value(address);
  w.u8(wantBytes);
  if (wantBytes) w.value(bytes);
  c.send();
}

// cuModuleUnload: u64 module. Its globals stop being session memory.
void serveModuleUnload(ServerCall& c) {
  auto id = c.args().u64();
  if (!c.argumentsComplete()) return;
  CUmodule m{};
  if (!c.resolve(HandleType::kCUmod_st, id, &m)) return;
  c.session().passGate({.everything = true});  // its globals
  CUresult r = PHOS_DRIVER(drv(c), ModuleUnload)(m);
  if (r == CUDA_SUCCESS) {
    c.session().validator().forgetModule(m);
    c.session().removeGlobalsOf(m);
    c.session().forgetModule(id);
  }
  replyResult(c, r);
}

// cuLibraryUnload: u64 library. Its globals, and those asked of its module,
// stop being session memory.
void serveLibraryUnload(ServerCall& c) {
  auto id = c.args().u64();
  if (!c.argumentsComplete()) return;
  CUlibrary lib{};
  if (!c.resolve(HandleType::kCUlib_st, id, &lib)) return;
  if (!c.driverTable().has(EntryPointId::kCuLibraryUnload)) return replyResult(c, CUDA_ERROR_NOT_SUPPORTED);
  CUmodule m{};
  if (!c.driverTable().has(EntryPointId::kCuLibraryGetModule) ||
      PHOS_DRIVER(drv(c), LibraryGetModule)(&m, lib) != CUDA_SUCCESS) {
    m = nullptr;
  }
  c.session().passGate({.everything = true});  // its globals
  CUresult r = PHOS_DRIVER(drv(c), LibraryUnload)(lib);
  if (r == CUDA_SUCCESS) {
    c.session().validator().forgetLibrary(lib);
    c.session().removeGlobalsOf(lib);
    c.session().removeGlobalsOf(m);
    c.session().forgetModule(id);
  }
  replyResult(c, r);
}

void serveKernelGetName(ServerCall& c) {
  auto id = c.args().u64();
  if (!c.argumentsComplete()) return;
  CUkernel k{};
  if (!c.resolve(HandleType::kCUkern_st, id, &k)) return;
  const char* name = nullptr;
  CUresult r = c.driverTable().has(EntryPointId::kCuKernelGetName) ? PHOS_DRIVER(drv(c), KernelGetName)(&name, k)
                                                                    : CUDA_ERROR_NOT_SUPPORTED;
  auto& w = c.reply(r);
  w.string(r == CUDA_SUCCESS ? name : nullptr);
  c.send();
}

// ---- modules and libraries ----------------------------------------------
// The image stays in the application; phosd reads it (process_vm_readv).
// cuModuleLoad*, cuLibraryLoad*: u64 address, u64 bytes. Reply: u64 handle.
constexpr size_t kMaxImageBytes = 1ull << 30;

bool readImage(ServerCall& c, std::vector<char>* image) {
  auto address = c.args().u64();
  auto bytes = c.args().u64();
  if (!c.argumentsComplete()) return false;
  if (address == 0 || bytes == 0 || bytes > kMaxImageBytes) {
    c.fail(CUDA_ERROR_INVALID_VALUE);
    return false;
  }
  // One extra NUL: PTX text is NUL-terminated in the application.
  image->assign(bytes + 1, '\0');
  if (Status s = c.session().readApplication(address, image->data(), bytes); !s.isOk()) {
    log::get("daemon")->warn("session {}: module image: {}", c.session().id(), s.message());
    c.fail(CUDA_ERROR_INVALID_VALUE);
    return false;
  }
  return true;
}

void serveModuleLoad(ServerCall& c) {
  std::vector<char> image;
  if (!readImage(c, &image)) return;
  CUmodule m = nullptr;
  std::shared_ptr<const PreparedModule> prepared;
  CUresult r = loadModule(drv(c), image, &m, &prepared);
  if (r == CUDA_SUCCESS) {
    c.session().noteModule(+1);
    c.session().validator().noteModule(m, std::move(prepared));
  }
  const uint64_t id = c.exportHandle(HandleType::kCUmod_st, r, m);
  // Kept for a checkpoint: a restore loads the module again from its image.
  if (r == CUDA_SUCCESS) c.session().recordModule(id, {false, std::move(image), c.session().currentContext()});
  c.reply(r).u64(id);
  c.send();
}

void serveLibraryLoad(ServerCall& c) {
  std::vector<char> image;
  if (!readImage(c, &image)) return;
  CUlibrary lib = nullptr;
  if (!c.driverTable().has(EntryPointId::kCuLibraryLoadData)) return replyResult(c, CUDA_ERROR_NOT_SUPPORTED);
  std::shared_ptr<const PreparedModule> prepared;
  CUresult r = loadLibrary(drv(c), image, &lib, &prepared);
  if (r == CUDA_SUCCESS) {
    c.session().noteModule(+1);
    c.session().validator().noteLibrary(lib, std::move(prepared));
  }
  const uint64_t id = c.exportHandle(HandleType::kCUlib_st, r, lib);
  if (r == CUDA_SUCCESS) c.session().recordModule(id, {true, std::move(image), 0});
  c.reply(r).u64(id);
  c.send();
}

// ---- launches --------------------------------------------------------------
// The function: a CUfunction id, or a CUkernel id ("a CUkernel can be passed
// wherever a CUfunction is expected": resolved in the current context).
bool resolveFunction(ServerCall& c, uint64_t id, CUfunction* out) {
  if (HandleTable::typeOf(id) == HandleType::kCUkern_st) {
    CUkernel k{};
    if (!c.resolve(HandleType::kCUkern_st, id, &k)) return false;
    CUresult r = PHOS_DRIVER(drv(c), KernelGetFunction)(out, k);
    if (r != CUDA_SUCCESS) {
      c.fail(r);
      return false;
    }
    return true;
  }
  if (id == 0) {
    c.fail(CUDA_ERROR_INVALID_HANDLE);
    return false;
  }
  return c.resolve(HandleType::kCUfunc_st, id, out);
}

// Kernel parameters: u32 count, then `count` blobs (one per parameter); or
// kExtraBuffer and one blob (the CU_LAUNCH_PARAM_BUFFER_POINTER contents).
struct KernelParams {
  std::vector<void*> pointers;
  std::vector<size_t> sizes;  // of each pointed-to parameter
  std::vector<std::byte> buffer;
  size_t bufferSize = 0;
  void* extra[5] = {};
  bool useExtra = false;
};

bool decodeParams(Decoder& d, KernelParams* p) {
  uint32_t count = d.u32();
  if (!d.ok()) return false;
  if (count == kExtraBuffer) {
    auto blob = d.blob();
    p->buffer.assign(blob.begin(), blob.end());
    p->bufferSize = p->buffer.size();
    p->extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
    p->extra[1] = p->buffer.data();
    p->extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
    p->extra[3] = &p->bufferSize;
    p->extra[4] = CU_LAUNCH_PARAM_END;
    p->useExtra = true;
    return d.ok();
  }
  if (count > 4096) return false;
  p->pointers.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    auto blob = d.blob();
    if (!d.ok()) return false;
    // The driver reads each parameter through its pointer; the blob lives in
    // the ring slot until the call is finished.
    p->pointers.push_back(const_cast<std::byte*>(blob.data()));
    p->sizes.push_back(blob.size());
  }
  return true;
}

// The driver reads kernelParams[i] for every parameter the kernel declares,
// sizeof(parameter i) bytes each: a client that sends fewer parameters, or
// shorter ones, would make it read past what phosd holds. The parameters must
// be exactly the kernel's (as libphos.so sends them, from cuFuncGetParamInfo).
// The `extra` buffer needs no check: the driver is given its true size.
bool checkParams(ServerCall& c, CUfunction f, const KernelParams& params) {
  if (params.useExtra) return true;
  if (!c.driverTable().has(EntryPointId::kCuFuncGetParamInfo)) {
    c.fail(CUDA_ERROR_NOT_SUPPORTED);
    return false;
  }
  const auto paramInfo = PHOS_DRIVER(drv(c), FuncGetParamInfo);
  for (size_t i = 0; i <= params.sizes.size(); ++i) {
    size_t offset = 0;
    size_t size = 0;
    // Past the last parameter the driver answers CUDA_ERROR_INVALID_VALUE.
    CUresult r = paramInfo(f, i, &offset, &size);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) {
      c.fail(r);
      return false;
    }
    const bool declared = r == CUDA_SUCCESS;
    const bool sent = i < params.sizes.size();
    if (declared != sent || (sent && size != params.sizes[i])) {
      c.fail(CUDA_ERROR_INVALID_VALUE);
      return false;
    }
  }
  return true;
}

// Counts a served launch; the first launch of a function also records its
// name, which `phos ps` lists.
void noteLaunch(ServerCall& c, uint64_t fid, CUfunction f) {
  Session& s = c.session();
  const char* name = nullptr;
  if (s.functionName(fid) == nullptr && c.driverTable().has(EntryPointId::kCuFuncGetName) &&
      PHOS_DRIVER(drv(c), FuncGetName)(&name, f) == CUDA_SUCCESS && name != nullptr) {
    s.setFunctionName(fid, name);
  }
  s.noteLaunch(fid);
}

// Launches `f` through `launch`; while the session validates, its twin runs
// instead, checked against the buffers speculation expects it to touch
// (docs/speculation.md). Without a twin the original runs.
CUresult validatedLaunch(ServerCall& c, CUfunction f, KernelParams& params, CUstream stream,
                         const LaunchValidator::LaunchFn& launch) {
  void** kernelParams = params.useExtra ? nullptr : params.pointers.data();
  void** extra = params.useExtra ? params.extra : nullptr;
  LaunchValidator& validator = c.session().validator();
  Session& session = c.session();
  const bool validating = validator.mode() != ValidationMode::kOff;
  if (!validating && !session.hasAccessGate()) return launch(f, kernelParams, extra);
  auto sets = validator.speculate(f, kernelParams, params.useExtra ? std::span<const std::byte>(params.buffer)
                                                                    : std::span<const std::byte>{},
                                  [&](uint64_t address) { return session.bufferAt(address); });
  const CallAccess access{sets.reads, sets.writes, true, sets.incomplete, !validating || !validator.hasTwin(f)};
  session.passGate(access);
  // A call that may touch anything passes a protocol's gate only once every
  // buffer is safe from it (copied, loaded): its twin would report what
  // speculation cannot name, and nothing needs checking.
  if (!validating) return launch(f, kernelParams, extra);
  if (session.hasAccessGate() && access.mayWriteAnything()) {
    validator.noteLaunch(false, sets.incomplete);
    return launch(f, kernelParams, extra);
  }
  CUresult r = validator.launchTwin(f, kernelParams, params.useExtra ? std::span<const std::byte>(params.buffer)
                                                                       : std::span<const std::byte>{},
                                    stream, sets, launch);
  const bool twin = r != CUDA_ERROR_NOT_FOUND;
  validator.noteLaunch(twin, sets.incomplete);
  return twin ? r : launch(f, kernelParams, extra);
}

// cuLaunchKernel / cuLaunchCooperativeKernel (and _ptsz): u64 function, u32
// grid x/y/z, u32 block x/y/z, u32 shared bytes, u64 stream, parameters.
template <bool kCooperative>
void serveLaunch(ServerCall& c) {
  Decoder& d = c.args();
  auto fid = d.u64();
  uint32_t dims[7];
  for (auto& v : dims) v = d.u32();
  auto sid = d.u64();
  KernelParams params;
  if (!decodeParams(d, &params)) d.fail();
  if (!c.argumentsComplete()) return;
  const bool perThread = cuda_api::entryPoint(c.entry()).origin == cuda_api::EntryPointOrigin::kPerThread;
  CUfunction f{};
  CUstream s{};
  if (!resolveFunction(c, fid, &f) || !c.resolveStream(sid, perThread, &s) || !checkParams(c, f, params)) return;
  auto launch = [&](CUfunction fn, void** kernelParams, void** extra) {
    if constexpr (kCooperative) {
      return PHOS_DRIVER(drv(c), LaunchCooperativeKernel)(fn, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5],
                                                          dims[6], s, kernelParams);
    } else {
      return PHOS_DRIVER(drv(c), LaunchKernel)(fn, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], s,
                                               kernelParams, extra);
    }
  };
  CUresult r = validatedLaunch(c, f, params, s, launch);
  if (r == CUDA_SUCCESS) noteLaunch(c, fid, f);
  replyResult(c, r);
}

// cuLaunchKernelEx: u64 function, u32 grid x/y/z, block x/y/z, shared bytes,
// u64 stream, u32 attribute count + blob of CUlaunchAttribute, parameters.
void serveLaunchEx(ServerCall& c) {
  Decoder& d = c.args();
  auto fid = d.u64();
  CUlaunchConfig config{};
  config.gridDimX = d.u32();
  config.gridDimY = d.u32();
  config.gridDimZ = d.u32();
  config.blockDimX = d.u32();
  config.blockDimY = d.u32();
  config.blockDimZ = d.u32();
  config.sharedMemBytes = d.u32();
  auto sid = d.u64();
  auto attrCount = d.u32();
  auto attrBytes = d.blob();
  KernelParams params;
  if (!decodeParams(d, &params)) d.fail();
  if (attrBytes.size() != static_cast<size_t>(attrCount) * sizeof(CUlaunchAttribute)) d.fail();
  if (!c.argumentsComplete()) return;
  std::vector<CUlaunchAttribute> attrs(attrCount);
  if (attrCount != 0) std::memcpy(attrs.data(), attrBytes.data(), attrBytes.size());
  for (const auto& a : attrs) {
    // Attributes naming events would carry the application's virtual event ids.
    if (a.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT || a.id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) {
      return replyResult(c, CUDA_ERROR_NOT_SUPPORTED);
    }
  }
  const bool perThread = cuda_api::entryPoint(c.entry()).origin == cuda_api::EntryPointOrigin::kPerThread;
  CUfunction f{};
  if (!resolveFunction(c, fid, &f) || !c.resolveStream(sid, perThread, &config.hStream) ||
      !checkParams(c, f, params)) {
    return;
  }
  if (!c.driverTable().has(EntryPointId::kCuLaunchKernelEx)) return replyResult(c, CUDA_ERROR_NOT_SUPPORTED);
  config.attrs = attrs.empty() ? nullptr : attrs.data();
  config.numAttrs = attrCount;
  auto launch = [&](CUfunction fn, void** kernelParams, void** extra) {
    return PHOS_DRIVER(drv(c), LaunchKernelEx)(&config, fn, kernelParams, extra);
  };
  CUresult r = validatedLaunch(c, f, params, config.hStream, launch);
  if (r == CUDA_SUCCESS) noteLaunch(c, fid, f);
  replyResult(c, r);
}

// ---- device memory -------------------------------------------------------
// Device memory comes from the session's heap, at addresses a restore can
// give back (device_heap.h), not from cuMemAlloc.
// cuMemAlloc: u64 bytes. Reply: u64 address.
void serveMemAlloc(ServerCall& c) {
  auto bytes = c.args().u64();
  if (!c.argumentsComplete()) return;
  Session& s = c.session();
  if (s.currentContext() == 0) return replyResult(c, CUDA_ERROR_INVALID_CONTEXT);
  CUdeviceptr p = 0;
  const int device = s.currentDevice();
  CUresult r = s.allocateDevice(device, bytes, &p);
  if (r == CUDA_SUCCESS) s.addAllocation({p, bytes, s.currentContext(), nullptr, device});
  c.reply(r).u64(r == CUDA_SUCCESS ? p : 0);
  c.send();
}

// cuMemAllocPitch: u64 width, u64 height, u32 element bytes. Reply: u64 address, u64 pitch.
// The driver chooses the pitch (and checks the arguments): asked with a
// throw-away allocation, then the memory comes from the heap.
void serveMemAllocPitch(ServerCall& c) {
  auto width = c.args().u64();
  auto height = c.args().u64();
  auto element = c.args().u32();
  if (!c.argumentsComplete()) return;
  Session& s = c.session();
  if (s.currentContext() == 0) return replyResult(c, CUDA_ERROR_INVALID_CONTEXT);
  CUdeviceptr probe = 0;
  size_t pitch = 0;
  CUresult r = PHOS_DRIVER(drv(c), MemAllocPitch_v2)(&probe, &pitch, width, height, element);
  if (r == CUDA_SUCCESS) PHOS_DRIVER(drv(c), MemFree_v2)(probe);
  CUdeviceptr p = 0;
  const int device = s.currentDevice();
  if (r == CUDA_SUCCESS) r = s.allocateDevice(device, pitch * height, &p);
  if (r == CUDA_SUCCESS) s.addAllocation({p, pitch * height, s.currentContext(), nullptr, device});
  auto& w = c.reply(r);
  w.u64(r == CUDA_SUCCESS ? p : 0);
  w.u64(r == CUDA_SUCCESS ? pitch : 0);
  c.send();
}

// A free ends a buffer's contents: for the protocols, a write of all of it.
void passFreeGate(Session& s, uint64_t address) {
  const Allocation* a = s.findAllocation(address);
  if (a != nullptr && a->address == address) s.passGate({.writes = {{a->address, a->bytes}}, .ends = true});
}

// cuMemFree: u64 address.
void serveMemFree(ServerCall& c) {
  auto p = c.args().u64();
  if (!c.argumentsComplete()) return;
  passFreeGate(c.session(), p);
  replyResult(c, c.session().freeDevice(p));
}

// ---- events --------------------------------------------------------------
// cuEventCreate, the generated wire format (present(event), u32 flags; reply
// u8 present + u64 event), served here to keep the flags: the driver has no
// query for them, and a restore creates the event again with them.
void serveEventCreate(ServerCall& c) {
  Decoder& a = c.args();
  const bool wantEvent = a.present();
  const auto flags = a.value<unsigned>();
  if (!c.argumentsComplete()) return;
  CUevent e = nullptr;
  CUresult r = PHOS_DRIVER(drv(c), EventCreate)(wantEvent ? &e : nullptr, flags);
  auto& w = c.reply(r);
  w.u8(wantEvent);
  if (wantEvent) {
    const uint64_t id = c.exportHandle(HandleType::kCUevent_st, r, e);
    if (r == CUDA_SUCCESS) c.session().recordEventFlags(id, flags);
    w.u64(id);
  }
  c.send();
}

// ---- pinned host memory ----------------------------------------------------
// cuMemHostAlloc / cuMemAllocHost: u64 bytes, u32 flags. Reply: u64 address, string path.
void serveMemHostAlloc(ServerCall& c) {
  auto bytes = c.args().u64();
  auto flags = c.args().u32();
  if (!c.argumentsComplete()) return;
  const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if ((flags & ~known) != 0 || bytes == 0) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  if (c.session().currentContext() == 0) return replyResult(c, CUDA_ERROR_INVALID_CONTEXT);
  auto range = c.session().createPinned(bytes, flags);
  if (!range.isOk()) {
    log::get("daemon")->warn("session {}: {}", c.session().id(), range.status().message());
    return replyResult(c, CUDA_ERROR_OUT_OF_MEMORY);
  }
  // Registered with the driver so that copies from it are asynchronous and
  // kernels may use it (it is mapped: unified addressing).
  CUresult r = PHOS_DRIVER(drv(c), MemHostRegister_v2)(reinterpret_cast<void*>(range->address), range->mapped,
                                                       CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r != CUDA_SUCCESS) {
    (void)c.session().freePinned(range->address);
    return replyResult(c, r);
  }
  auto& w = c.reply(CUDA_SUCCESS);
  w.u64(range->address);
  w.u64(range->mapped);
  w.string(range->path.c_str());
  c.send();
}

// cuMemFreeHost: u64 address.
void serveMemFreeHost(ServerCall& c) {
  auto p = c.args().u64();
  if (!c.argumentsComplete()) return;
  const PinnedRange* range = c.session().findPinned(p);
  if (range == nullptr || range->address != p) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  // Work that still reads it must finish first (as cuMemFreeHost does).
  PHOS_DRIVER(drv(c), CtxSynchronize)();
  c.session().unregisterPinned(*range);
  (void)c.session().freePinned(p);
  replyResult(c, CUDA_SUCCESS);
}

// cuMemHostGetDevicePointer: u64 address, u32 flags. Reply: u64 device pointer.
void serveMemHostGetDevicePointer(ServerCall& c) {
  auto p = c.args().u64();
  auto flags = c.args().u32();
  if (!c.argumentsComplete()) return;
  if (flags != 0 || c.session().findPinned(p) == nullptr) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr d = 0;
  CUresult r = PHOS_DRIVER(drv(c), MemHostGetDevicePointer_v2)(&d, reinterpret_cast<void*>(p), 0);
  c.reply(r).u64(d);
  c.send();
}

// cuMemHostGetFlags: u64 address. Reply: u32 flags.
void serveMemHostGetFlags(ServerCall& c) {
  auto p = c.args().u64();
  if (!c.argumentsComplete()) return;
  const PinnedRange* range = c.session().findPinned(p);
  if (range == nullptr) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  // With unified addressing every page-locked allocation is mapped: the
  // driver reports DEVICEMAP whether or not it was asked for.
  c.reply(CUDA_SUCCESS).u32(range->flags | CU_MEMHOSTALLOC_DEVICEMAP);
  c.send();
}

// ---- copies ----------------------------------------------------------------
// Where one side of a copy is: the session's device or pinned memory (an
// address phosd can use as is), or the application's pageable memory.
bool isSessionMemory(Session& s, uint64_t p, uint64_t bytes) { return s.ownsRange(p, bytes); }

// Copies between the application's pageable memory and device memory go
// through the current context's two staging buffers, pipelined: while the
// driver copies one chunk, phosd reads (or writes) the application's memory
// of the next with process_vm_readv/writev. All chunks are enqueued on
// `stream` in order and complete before the call returns (the buffers are
// reused by the next call, and CUDA returns from copies of pageable memory
// once the host side is done).
class StagedCopy {
 public:
  StagedCopy(ServerCall& c, CopyStaging& staging, CUstream stream) : c_(c), st_(staging), stream_(stream) {}
  ~StagedCopy() { (void)drain(); }

  // Waits until buffer k is free again.
  CUresult acquire(int k) {
    if (!st_.pending[k]) return CUDA_SUCCESS;
    st_.pending[k] = false;
    return PHOS_DRIVER(c_.driverTable(), EventSynchronize)(st_.done[k]);
  }
  CUresult release(int k) {
    CUresult r = PHOS_DRIVER(c_.driverTable(), EventRecord)(st_.done[k], stream_);
    st_.pending[k] = r == CUDA_SUCCESS;
    return r;
  }
  CUresult drain() {
    CUresult first = CUDA_SUCCESS;
    for (int k = 0; k < 2; ++k) {
      CUresult r = acquire(k);
      if (first == CUDA_SUCCESS) first = r;
    }
    return first;
  }

 private:
  ServerCall& c_;
  CopyStaging& st_;
  CUstream stream_;
};

CUresult copyFromApplication(ServerCall& c, CUdeviceptr dst, uint64_t src, uint64_t bytes, CUstream stream) {
  Session& s = c.session();
  CopyStaging* st = s.staging();
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  StagedCopy copy(c, *st, stream);
  int k = 0;
  for (uint64_t done = 0; done < bytes; done += st->bytes, k ^= 1) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, st->bytes));
    if (CUresult r = copy.acquire(k); r != CUDA_SUCCESS) return r;
    if (!s.readApplication(src + done, st->buffers[k], n).isOk()) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = PHOS_DRIVER(drv(c), MemcpyHtoDAsync_v2)(dst + done, st->buffers[k], n, stream);
    if (r == CUDA_SUCCESS) r = copy.release(k);
    if (r != CUDA_SUCCESS) return r;
  }
  return copy.drain();
}

CUresult copyToApplication(ServerCall& c, uint64_t dst, CUdeviceptr src, uint64_t bytes, CUstream stream) {
  Session& s = c.session();
  CopyStaging* st = s.staging();
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  StagedCopy copy(c, *st, stream);
  const uint64_t chunks = (bytes + st->bytes - 1) / st->bytes;
  auto enqueue = [&](uint64_t i) {
    const uint64_t off = i * st->bytes;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - off, st->bytes));
    CUresult r = PHOS_DRIVER(drv(c), MemcpyDtoHAsync_v2)(st->buffers[i % 2], src + off, n, stream);
    return r == CUDA_SUCCESS ? copy.release(static_cast<int>(i % 2)) : r;
  };
  if (chunks > 0) {
    if (CUresult r = enqueue(0); r != CUDA_SUCCESS) return r;
  }
  for (uint64_t i = 0; i < chunks; ++i) {
    // The next chunk copies while this one is written to the application.
    if (i + 1 < chunks) {
      if (CUresult r = enqueue(i + 1); r != CUDA_SUCCESS) return r;
    }
    if (CUresult r = copy.acquire(static_cast<int>(i % 2)); r != CUDA_SUCCESS) return r;
    const uint64_t off = i * st->bytes;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - off, st->bytes));
    if (!s.writeApplication(dst + off, st->buffers[i % 2], n).isOk()) return CUDA_ERROR_INVALID_VALUE;
  }
  return copy.drain();
}

// Host to host: CUDA copies it too. Through a staging buffer: `bytes` is the
// client's number, and a buffer of that size could be any size.
CUresult copyWithinApplication(ServerCall& c, uint64_t dst, uint64_t src, uint64_t bytes) {
  Session& s = c.session();
  CopyStaging* st = s.staging();
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  for (uint64_t done = 0; done < bytes;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, st->bytes));
    if (!s.readApplication(src + done, st->buffers[0], n).isOk() ||
        !s.writeApplication(dst + done, st->buffers[0], n).isOk()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    done += n;
  }
  return CUDA_SUCCESS;
}

bool perThreadEntry(ServerCall& c) {
  return cuda_api::entryPoint(c.entry()).origin == cuda_api::EntryPointOrigin::kPerThread;
}

// One of the application's transfers between its memory and the device,
// from its issue to its return (TransferTracker: the protocols' copies give
// way to it).
class TransferScope {
 public:
  TransferScope(Session& session, bool async, CUstream stream)
      : tracker_(session.transfers()), async_(async), stream_(stream) {
    tracker_.begin();
  }
  ~TransferScope() { tracker_.end(async_, stream_); }
  TransferScope(const TransferScope&) = delete;
  TransferScope& operator=(const TransferScope&) = delete;

 private:
  TransferTracker& tracker_;
  bool async_;
  CUstream stream_;
};

// A copy's sides that are GPU state of the session: device memory and pinned
// ranges (pageable application memory is CPU state). Exact byte ranges.
void passCopyGate(Session& s, uint64_t dst, uint64_t src, uint64_t bytes) {
  if (bytes == 0) return;
  CallAccess access;
  if (s.ownsRange(src, bytes)) access.reads.push_back({src, bytes});
  if (s.ownsRange(dst, bytes)) access.writes.push_back({dst, bytes});
  if (!access.reads.empty() || !access.writes.empty()) s.passGate(access);
}

// cuMemcpyHtoD[Async]: u64 dst, u64 src (application address), u64 bytes[, u64 stream].
template <bool kAsync>
void serveMemcpyHtoD(ServerCall& c) {
  auto dst = c.args().u64();
  auto src = c.args().u64();
  auto bytes = c.args().u64();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (!c.argumentsComplete()) return;
  // A synchronous copy runs on the default stream of its variant (legacy, or
  // the calling thread's for _ptds) and waits for itself.
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  if (!c.checkDeviceRange(dst, bytes)) return;
  passCopyGate(c.session(), dst, src, bytes);
  TransferScope transfer(c.session(), kAsync, s);
  CUresult r;
  if (isSessionMemory(c.session(), src, bytes)) {
    // Pinned memory: the same address in phosd.
    r = PHOS_DRIVER(drv(c), MemcpyHtoDAsync_v2)(dst, reinterpret_cast<void*>(src), bytes, s);
    if (r == CUDA_SUCCESS && !kAsync) r = PHOS_DRIVER(drv(c), StreamSynchronize)(s);
  } else {
    r = copyFromApplication(c, dst, src, bytes, s);
  }
  replyResult(c, r);
}

// cuMemcpyDtoH[Async]: u64 dst (application address), u64 src, u64 bytes[, u64 stream].
template <bool kAsync>
void serveMemcpyDtoH(ServerCall& c) {
  auto dst = c.args().u64();
  auto src = c.args().u64();
  auto bytes = c.args().u64();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (!c.argumentsComplete()) return;
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  if (!c.checkDeviceRange(src, bytes)) return;
  passCopyGate(c.session(), dst, src, bytes);
  TransferScope transfer(c.session(), kAsync, s);
  CUresult r;
  if (isSessionMemory(c.session(), dst, bytes)) {
    r = PHOS_DRIVER(drv(c), MemcpyDtoHAsync_v2)(reinterpret_cast<void*>(dst), src, bytes, s);
    if (r == CUDA_SUCCESS && !kAsync) r = PHOS_DRIVER(drv(c), StreamSynchronize)(s);
  } else {
    r = copyToApplication(c, dst, src, bytes, s);
  }
  replyResult(c, r);
}

// cuMemcpy[Async] and cuMemcpyDtoD[Async] (unified addressing): u64 dst,
// u64 src, u64 bytes[, u64 stream]. Either side may be application memory.
template <bool kAsync, bool kDeviceOnly>
void serveMemcpy(ServerCall& c) {
  auto dst = c.args().u64();
  auto src = c.args().u64();
  auto bytes = c.args().u64();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (!c.argumentsComplete()) return;
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  Session& session = c.session();
  const bool dstOurs = isSessionMemory(session, dst, bytes);
  const bool srcOurs = isSessionMemory(session, src, bytes);
  if (bytes == 0) return replyResult(c, CUDA_SUCCESS);
  if (!kDeviceOnly || (dstOurs && srcOurs)) passCopyGate(session, dst, src, bytes);
  // Between host memory (the application's, or pinned) and the device: one
  // of its transfers.
  std::optional<TransferScope> transfer;
  if (session.findAllocation(dst) == nullptr || session.findAllocation(src) == nullptr) {
    transfer.emplace(session, kAsync, s);
  }
  CUresult r;
  if (dstOurs && srcOurs) {
    r = PHOS_DRIVER(drv(c), MemcpyAsync)(dst, src, bytes, s);
    if (r == CUDA_SUCCESS && !kAsync) r = PHOS_DRIVER(drv(c), StreamSynchronize)(s);
  } else if (kDeviceOnly) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (dstOurs) {
    r = copyFromApplication(c, dst, src, bytes, s);
  } else if (srcOurs) {
    r = copyToApplication(c, dst, src, bytes, s);
  } else {
    r = copyWithinApplication(c, dst, src, bytes);
  }
  replyResult(c, r);
}

// cuMemsetD8/16/32[Async]: u64 dst, u32 value, u64 count[, u64 stream].
template <int kBytes, bool kAsync>
void serveMemset(ServerCall& c) {
  auto dst = c.args().u64();
  auto value = c.args().u32();
  auto count = c.args().u64();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (!c.argumentsComplete()) return;
  // "Memset functions are asynchronous with respect to the host" for device
  // memory: the synchronous variants only differ in their stream (the
  // default stream of the variant, legacy or the calling thread's).
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  if (count > (~0ull) / kBytes) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  if (!c.checkDeviceRange(dst, count * kBytes)) return;
  c.session().passGate({{}, {{dst, count * kBytes}}});
  CUresult r;
  if constexpr (kBytes == 1) {
    r = PHOS_DRIVER(drv(c), MemsetD8Async)(dst, static_cast<unsigned char>(value), count, s);
  } else if constexpr (kBytes == 2) {
    r = PHOS_DRIVER(drv(c), MemsetD16Async)(dst, static_cast<unsigned short>(value), count, s);
  } else {
    r = PHOS_DRIVER(drv(c), MemsetD32Async)(dst, value, count, s);
  }
  replyResult(c, r);
}

// ---- 2D sets ----------------------------------------------------------------
// cuMemsetD2D8/16/32[Async]: u64 dst, u64 pitch, u32 value, u64 width
// (elements), u64 height[, u64 stream]. Every row must lie in one allocation
// of the session: the last one ends pitch * (height - 1) + width * element
// bytes after dst.
template <int kBytes, bool kAsync>
void serveMemset2D(ServerCall& c) {
  auto dst = c.args().u64();
  auto pitch = c.args().u64();
  auto value = c.args().u32();
  auto width = c.args().u64();
  auto height = c.args().u64();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (!c.argumentsComplete()) return;
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  const uint64_t kMax = ~0ull;
  if (width > kMax / kBytes) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  const uint64_t row = width * kBytes;
  if (height > 1 && pitch != 0 && height - 1 > (kMax - row) / pitch) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  const uint64_t extent = height == 0 ? 0 : pitch * (height - 1) + row;
  if (!c.checkDeviceRange(dst, extent)) return;
  // The rows and the gaps between them: the gaps are not written, but a
  // protocol copies whole buffers anyway.
  c.session().passGate({{}, {{dst, extent}}});
  // Like the 1D sets, the synchronous variants run on their default stream.
  CUresult r;
  if constexpr (kBytes == 1) {
    r = PHOS_DRIVER(drv(c), MemsetD2D8Async)(dst, pitch, static_cast<unsigned char>(value), width, height, s);
  } else if constexpr (kBytes == 2) {
    r = PHOS_DRIVER(drv(c), MemsetD2D16Async)(dst, pitch, static_cast<unsigned short>(value), width, height, s);
  } else {
    r = PHOS_DRIVER(drv(c), MemsetD2D32Async)(dst, pitch, value, width, height, s);
  }
  replyResult(c, r);
}

// ---- peer copies --------------------------------------------------------------
// cuMemcpyPeer[Async]: u64 dst, u64 dst context, u64 src, u64 src context,
// u64 bytes[, u64 stream]. Both ranges in the session's allocations.
template <bool kAsync>
void serveMemcpyPeer(ServerCall& c) {
  auto dst = c.args().u64();
  auto dstContext = c.args().u64();
  auto src = c.args().u64();
  auto srcContext = c.args().u64();
  auto bytes = c.args().u64();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (!c.argumentsComplete()) return;
  CUcontext dctx{};
  CUcontext sctx{};
  CUstream s{};
  if (!c.resolve(HandleType::kCUctx_st, dstContext, &dctx) || !c.resolve(HandleType::kCUctx_st, srcContext, &sctx) ||
      !c.resolveStream(sid, perThreadEntry(c), &s)) {
    return;
  }
  if (dctx == nullptr || sctx == nullptr) return replyResult(c, CUDA_ERROR_INVALID_CONTEXT);
  if (!c.checkDeviceRange(dst, bytes) || !c.checkDeviceRange(src, bytes)) return;
  passCopyGate(c.session(), dst, src, bytes);
  CUresult r = PHOS_DRIVER(drv(c), MemcpyPeerAsync)(dst, dctx, src, sctx, bytes, s);
  if (r == CUDA_SUCCESS && !kAsync) r = PHOS_DRIVER(drv(c), StreamSynchronize)(s);
  replyResult(c, r);
}

// ---- stream-ordered allocations ------------------------------------------------
// cuMemAllocAsync: u64 bytes, u64 stream. Reply: u64 address. Recorded when
// enqueued: work the application enqueues later may name it, and the stream
// orders that work after the allocation.
void serveMemAllocAsync(ServerCall& c) {
  auto bytes = c.args().u64();
  auto sid = c.args().u64();
  if (!c.argumentsComplete()) return;
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  CUdeviceptr p = 0;
  CUresult r = PHOS_DRIVER(drv(c), MemAllocAsync)(&p, bytes, s);
  if (r == CUDA_SUCCESS) c.session().addAllocation({p, bytes, c.session().currentContext()});
  c.reply(r).u64(r == CUDA_SUCCESS ? p : 0);
  c.send();
}

// cuMemFreeAsync: u64 address, u64 stream.
void serveMemFreeAsync(ServerCall& c) {
  auto p = c.args().u64();
  auto sid = c.args().u64();
  if (!c.argumentsComplete()) return;
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  const Allocation* a = c.session().findAllocation(p);
  if (a == nullptr || a->address != p || a->module != nullptr) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  passFreeGate(c.session(), p);
  CUresult r = PHOS_DRIVER(drv(c), MemFreeAsync)(p, s);
  if (r == CUDA_SUCCESS) c.session().removeAllocation(p);
  replyResult(c, r);
}

// ---- pointer attributes -------------------------------------------------------
// The size of an attribute's value as the driver writes it (0: no such attribute).
size_t pointerAttributeBytes(uint32_t attribute) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
      return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      return sizeof(CUmemoryPool);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      return sizeof(void*);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      return sizeof(int);
    default:
      return 0;
  }
}

// The session's own memory; anything else is unknown memory to it.
bool ownsPointer(Session& s, CUdeviceptr p) { return s.findAllocation(p) != nullptr || s.findPinned(p) != nullptr; }

// Memory from the session's heap is a VMM mapping to the driver, but the
// application allocated it with cuMemAlloc: it answers as such memory does
// (owned by the context it was allocated in, its range the size asked for,
// usable with cuIpcGetMemHandle).
bool heapAllocationAttribute(const Allocation& a, uint32_t attribute, std::byte* value) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      std::memcpy(value, &a.context, sizeof(a.context));
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: {
      const CUdeviceptr start = a.address;
      std::memcpy(value, &start, sizeof(start));
      return true;
    }
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
      const size_t bytes = a.bytes;
      std::memcpy(value, &bytes, sizeof(bytes));
      return true;
    }
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: {
      const int capable = 1;
      std::memcpy(value, &capable, sizeof(capable));
      return true;
    }
    default:
      return false;
  }
}

// Driver objects in a value become what the application may hold.
void virtualizePointerAttribute(Session& s, uint32_t attribute, std::byte* value, CUdeviceptr p) {
  if (const Allocation* a = s.findAllocation(p); a != nullptr && a->module == nullptr) {
    if (heapAllocationAttribute(*a, attribute, value)) return;
  }
  if (attribute == CU_POINTER_ATTRIBUTE_CONTEXT) {
    CUcontext real{};
    std::memcpy(&real, value, sizeof(real));
    uint64_t id = 0;
    for (const auto& [vid, ctx] : s.contexts()) {
      if (real != nullptr && ctx.real == real) id = vid;
    }
    std::memcpy(value, &id, sizeof(id));
  } else if (attribute == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) {
    // Memory pools are not remoted: the application cannot hold one.
    std::memset(value, 0, sizeof(CUmemoryPool));
  }
}

using AttributeValue = std::array<std::byte, 64>;

// cuPointerGetAttribute: u32 attribute, u64 pointer. Reply: blob value.
void servePointerGetAttribute(ServerCall& c) {
  auto attribute = c.args().u32();
  auto p = c.args().u64();
  if (!c.argumentsComplete()) return;
  const size_t bytes = pointerAttributeBytes(attribute);
  if (bytes == 0 || !ownsPointer(c.session(), p)) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  alignas(16) AttributeValue value{};
  CUresult r = PHOS_DRIVER(drv(c), PointerGetAttribute)(value.data(), static_cast<CUpointer_attribute>(attribute), p);
  if (r == CUDA_SUCCESS) virtualizePointerAttribute(c.session(), attribute, value.data(), p);
  c.reply(r).blob(value.data(), r == CUDA_SUCCESS ? bytes : 0);
  c.send();
}

// cuPointerGetAttributes: u64 pointer, u32 count, blob of `count` u32
// attributes, blob of `count` u8 (1: the application wants the value).
// Reply: `count` blobs.
void servePointerGetAttributes(ServerCall& c) {
  constexpr uint32_t kMaxAttributes = 64;
  auto p = c.args().u64();
  auto count = c.args().u32();
  auto attrBytes = c.args().blob();
  auto wanted = c.args().blob();
  if (count > kMaxAttributes || attrBytes.size() != size_t{count} * sizeof(uint32_t) || wanted.size() != count) {
    c.args().fail();
  }
  if (!c.argumentsComplete()) return;
  std::vector<CUpointer_attribute> attributes(count);
  std::vector<AttributeValue> values(count);
  std::vector<void*> data(count);
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t a = 0;
    std::memcpy(&a, attrBytes.data() + i * sizeof(a), sizeof(a));
    if (pointerAttributeBytes(a) == 0) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
    attributes[i] = static_cast<CUpointer_attribute>(a);
    data[i] = wanted[i] != std::byte{0} ? values[i].data() : nullptr;
  }
  // "Unlike cuPointerGetAttribute, this function will not return an error when
  // the ptr encountered is not a valid CUDA pointer": another session's memory
  // is asked as address 0, which nothing is allocated at, so the driver's own
  // defaults for unknown memory answer.
  const CUdeviceptr asked = ownsPointer(c.session(), p) ? p : 0;
  CUresult r = PHOS_DRIVER(drv(c), PointerGetAttributes)(count, attributes.data(), data.data(), asked);
  auto& w = c.reply(r);
  for (uint32_t i = 0; i < count; ++i) {
    const bool give = r == CUDA_SUCCESS && data[i] != nullptr;
    if (give) virtualizePointerAttribute(c.session(), attributes[i], values[i].data(), asked);
    w.blob(values[i].data(), give ? pointerAttributeBytes(attributes[i]) : 0);
  }
  c.send();
}

// cuMemGetAddressRange, the generated wire format (present(base),
// present(size), u64 pointer; reply u8 + base, u8 + size): the session's own
// allocations answer with the range the application asked for (the driver
// would give the heap's mapping, rounded to its granularity).
void serveMemGetAddressRange(ServerCall& c) {
  Decoder& a = c.args();
  const bool wantBase = a.present();
  const bool wantSize = a.present();
  const auto p = a.value<CUdeviceptr>();
  if (!c.argumentsComplete()) return;
  if (!c.checkDevicePointer(p)) return;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = CUDA_SUCCESS;
  if (const Allocation* alloc = c.session().findAllocation(p); alloc != nullptr && alloc->module == nullptr) {
    base = alloc->address;
    size = alloc->bytes;
  } else {
    r = PHOS_DRIVER(drv(c), MemGetAddressRange_v2)(&base, &size, p);
  }
  auto& w = c.reply(r);
  w.u8(wantBase);
  if (wantBase) w.value(base);
  w.u8(wantSize);
  if (wantSize) w.value(size);
  c.send();
}

// cuPointerSetAttribute: u32 attribute, u64 pointer, blob value. "The only
// attribute supported is CU_POINTER_ATTRIBUTE_SYNC_MEMOPS".
void servePointerSetAttribute(ServerCall& c) {
  auto attribute = c.args().u32();
  auto p = c.args().u64();
  auto value = c.args().blob();
  if (!c.argumentsComplete()) return;
  if (!ownsPointer(c.session(), p) || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ||
      value.size() != sizeof(unsigned int)) {
    return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  }
  unsigned int v = 0;
  std::memcpy(&v, value.data(), sizeof(v));
  replyResult(c, PHOS_DRIVER(drv(c), PointerSetAttribute)(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
}

// ---- 2D and 3D copies ---------------------------------------------------------
// One side of a 2D or 3D copy: row (y, z) of the copy starts at
// base + ((z0 + z) * height + y0 + y) * pitch + x0.
struct RowSide {
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  uint64_t base = 0;
  uint64_t x = 0, y = 0, z = 0, pitch = 0, height = 0;
  bool application = false;  // the application's pageable memory
};

uint64_t rowAddress(const RowSide& side, uint64_t y, uint64_t z) {
  return side.base + ((side.z + z) * side.height + side.y + y) * side.pitch + side.x;
}

// Says where a side is: in the session's memory (device or pinned, used as
// is) or the application's pageable memory (copied row by row). The whole
// span of the side's rows must lie in one allocation when it is device
// memory. False: the call was answered.
bool placeSide(ServerCall& c, RowSide& side, uint64_t width, uint64_t rows, uint64_t depth) {
  if (side.type == CU_MEMORYTYPE_ARRAY) {
    c.fail(CUDA_ERROR_NOT_SUPPORTED);  // arrays are not remoted
    return false;
  }
  if (side.type != CU_MEMORYTYPE_HOST && side.type != CU_MEMORYTYPE_DEVICE && side.type != CU_MEMORYTYPE_UNIFIED) {
    c.fail(CUDA_ERROR_INVALID_VALUE);
    return false;
  }
  if (side.base == 0) {
    c.fail(CUDA_ERROR_INVALID_VALUE);
    return false;
  }
  // The client's numbers: bounded first, then the span computed wide, so that
  // no row address can wrap around.
  constexpr uint64_t kLimit = 1ull << 40;
  for (uint64_t v : {side.x, side.y, side.z, side.pitch, side.height, width, rows, depth}) {
    if (v >= kLimit) {
      c.fail(CUDA_ERROR_INVALID_VALUE);
      return false;
    }
  }
  __extension__ using Wide = unsigned __int128;
  const Wide first = (Wide{side.z} * side.height + side.y) * side.pitch + side.x;
  const Wide last = (Wide{side.z + depth - 1} * side.height + side.y + rows - 1) * side.pitch + side.x + width;
  if (Wide{side.base} + last > Wide{~0ull}) {
    c.fail(CUDA_ERROR_INVALID_VALUE);
    return false;
  }
  const auto start = static_cast<uint64_t>(side.base + first);
  if (c.session().ownsRange(start, static_cast<uint64_t>(last - first))) return true;
  if (side.type == CU_MEMORYTYPE_DEVICE) {
    c.fail(CUDA_ERROR_INVALID_VALUE);
    return false;
  }
  side.application = true;
  return true;
}

// Validates as CUDA does, places both sides, and copies: device and pinned
// memory with the driver's own 2D/3D copy (`direct`), anything involving the
// application's pageable memory row by row through the staging buffers (the
// host side is done when the call returns, as CUDA does for pageable memory).
template <typename Direct>
void serveRowCopy(ServerCall& c, RowSide src, RowSide dst, uint64_t width, uint64_t rows, uint64_t depth, CUstream s,
                  bool async, Direct direct) {
  if ((rows > 1 || depth > 1) && (src.pitch < src.x + width || dst.pitch < dst.x + width)) {
    return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  }
  if (depth > 1 && (src.height < src.y + rows || dst.height < dst.y + rows)) {
    return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  }
  if (width == 0 || rows == 0 || depth == 0) return replyResult(c, CUDA_SUCCESS);
  if (!placeSide(c, src, width, rows, depth) || !placeSide(c, dst, width, rows, depth)) return;
  // The span from the first row to the end of the last (placeSide bounded it).
  auto span = [&](const RowSide& side) -> instrument::Buffer {
    const uint64_t first = rowAddress(side, 0, 0);
    return {first, rowAddress(side, rows - 1, depth - 1) + width - first};
  };
  CallAccess access;
  if (!src.application) access.reads.push_back(span(src));
  if (!dst.application) access.writes.push_back(span(dst));
  if (!access.reads.empty() || !access.writes.empty()) c.session().passGate(access);
  CUresult r = CUDA_SUCCESS;
  if (!src.application && !dst.application) {
    r = direct();
    if (r == CUDA_SUCCESS && !async) r = PHOS_DRIVER(drv(c), StreamSynchronize)(s);
    return replyResult(c, r);
  }
  for (uint64_t z = 0; z < depth && r == CUDA_SUCCESS; ++z) {
    for (uint64_t y = 0; y < rows && r == CUDA_SUCCESS; ++y) {
      const uint64_t from = rowAddress(src, y, z);
      const uint64_t to = rowAddress(dst, y, z);
      if (src.application && dst.application) {
        r = copyWithinApplication(c, to, from, width);
      } else if (src.application) {
        r = copyFromApplication(c, to, from, width, s);
      } else {
        r = copyToApplication(c, to, from, width, s);
      }
    }
  }
  replyResult(c, r);
}

// cuMemcpy2D / cuMemcpy2DUnaligned / cuMemcpy2DAsync: blob CUDA_MEMCPY2D[, u64 stream].
template <bool kAsync>
void serveMemcpy2D(ServerCall& c) {
  auto bytes = c.args().blob();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (bytes.size() != sizeof(CUDA_MEMCPY2D)) c.args().fail();
  if (!c.argumentsComplete()) return;
  CUDA_MEMCPY2D p{};
  std::memcpy(&p, bytes.data(), sizeof(p));
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  auto side = [&](CUmemorytype type, const void* host, CUdeviceptr device, size_t x, size_t y, size_t pitch) {
    RowSide r;
    r.type = type;
    r.base = type == CU_MEMORYTYPE_HOST ? reinterpret_cast<uintptr_t>(host) : device;
    r.x = x;
    r.y = y;
    r.height = y + p.Height;
    // A single row needs no pitch.
    r.pitch = p.Height <= 1 ? std::max<uint64_t>(pitch, x + p.WidthInBytes) : pitch;
    return r;
  };
  RowSide src = side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcXInBytes, p.srcY, p.srcPitch);
  RowSide dst = side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstXInBytes, p.dstY, p.dstPitch);
  serveRowCopy(c, src, dst, p.WidthInBytes, p.Height, 1, s, kAsync,
               [&] { return PHOS_DRIVER(drv(c), Memcpy2DAsync_v2)(&p, s); });
}

// cuMemcpy3D / cuMemcpy3DAsync: blob CUDA_MEMCPY3D[, u64 stream].
template <bool kAsync>
void serveMemcpy3D(ServerCall& c) {
  auto bytes = c.args().blob();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (bytes.size() != sizeof(CUDA_MEMCPY3D)) c.args().fail();
  if (!c.argumentsComplete()) return;
  CUDA_MEMCPY3D p{};
  std::memcpy(&p, bytes.data(), sizeof(p));
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  // "reserved0/reserved1: Must be NULL"; "srcLOD and dstLOD ... must be set to 0".
  if (p.reserved0 != nullptr || p.reserved1 != nullptr || p.srcLOD != 0 || p.dstLOD != 0) {
    return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  }
  auto side = [&](CUmemorytype type, const void* host, CUdeviceptr device, size_t x, size_t y, size_t z, size_t pitch,
                  size_t height) {
    RowSide r;
    r.type = type;
    r.base = type == CU_MEMORYTYPE_HOST ? reinterpret_cast<uintptr_t>(host) : device;
    r.x = x;
    r.y = y;
    r.z = z;
    // "srcHeight ... may be 0 if Depth==1"; a single row needs no pitch.
    r.height = p.Depth == 1 ? std::max<uint64_t>(height, y + p.Height) : height;
    r.pitch = p.Height <= 1 && p.Depth <= 1 ? std::max<uint64_t>(pitch, x + p.WidthInBytes) : pitch;
    return r;
  };
  RowSide src = side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch, p.srcHeight);
  RowSide dst = side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight);
  serveRowCopy(c, src, dst, p.WidthInBytes, p.Height, p.Depth, s, kAsync,
               [&] { return PHOS_DRIVER(drv(c), Memcpy3DAsync_v2)(&p, s); });
}

// ---- host functions -------------------------------------------------------------
// The driver runs phosd's trampoline in stream order; it has the application
// run its function and returns when that has returned.
void CUDA_CB runHostFunction(void* p) {
  std::unique_ptr<PendingHostCall> call(static_cast<PendingHostCall*>(p));
  call->channel->run(ipc::kHostFunction, call->function, call->userData, call->stream, CUDA_SUCCESS);
}

void CUDA_CB runStreamCallback(CUstream, CUresult status, void* p) {
  std::unique_ptr<PendingHostCall> call(static_cast<PendingHostCall*>(p));
  call->channel->run(ipc::kStreamCallback, call->function, call->userData, call->stream, status);
}

// cuLaunchHostFunc: u64 stream, u64 function, u64 user data.
// cuStreamAddCallback: the same and u32 flags. Reply: string path of the
// session's host-call queue (the shim maps it and runs what it is asked to).
template <bool kCallback>
void serveHostCall(ServerCall& c) {
  auto sid = c.args().u64();
  auto function = c.args().u64();
  auto userData = c.args().u64();
  uint32_t flags = kCallback ? c.args().u32() : 0;
  if (!c.argumentsComplete()) return;
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s)) return;
  if (function == 0) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  auto channel = c.session().hostCalls();
  if (!channel.isOk()) {
    log::get("daemon")->warn("session {}: {}", c.session().id(), channel.status().message());
    return replyResult(c, CUDA_ERROR_OUT_OF_MEMORY);
  }
  // The stream handle the application passed is what its callback receives.
  auto pending = std::make_unique<PendingHostCall>(PendingHostCall{*channel, function, userData, sid});
  CUresult r = kCallback ? PHOS_DRIVER(drv(c), StreamAddCallback)(s, runStreamCallback, pending.get(), flags)
                         : PHOS_DRIVER(drv(c), LaunchHostFunc)(s, runHostFunction, pending.get());
  if (r == CUDA_SUCCESS) (void)pending.release();  // the trampoline owns it now
  c.reply(r).string((*channel)->path().c_str());
  c.send();
}

// ---- events ------------------------------------------------------------------------
// cuEventRecordWithFlags: u64 event, u64 stream, u32 flags. Posted.
void serveEventRecordWithFlags(ServerCall& c) {
  auto eid = c.args().u64();
  auto sid = c.args().u64();
  auto flags = c.args().u32();
  if (!c.argumentsComplete()) return;
  CUevent e{};
  CUstream s{};
  if (!c.resolve(HandleType::kCUevent_st, eid, &e) || !c.resolveStream(sid, perThreadEntry(c), &s)) return;
  replyResult(c, PHOS_DRIVER(drv(c), EventRecordWithFlags)(e, s, flags));
}

// cuStreamWaitEvent: u64 stream, u64 event, u32 flags. Posted.
void serveStreamWaitEvent(ServerCall& c) {
  auto sid = c.args().u64();
  auto eid = c.args().u64();
  auto flags = c.args().u32();
  if (!c.argumentsComplete()) return;
  CUevent e{};
  CUstream s{};
  if (!c.resolveStream(sid, perThreadEntry(c), &s) || !c.resolve(HandleType::kCUevent_st, eid, &e)) return;
  replyResult(c, PHOS_DRIVER(drv(c), StreamWaitEvent)(s, e, flags));
}

}  // namespace

void installCustom(ServerTable& t) {
  auto set = [&](EntryPointId id, ServerFn fn) { t[static_cast<size_t>(id)] = fn; };
  set(EntryPointId::kCuInit, serveInit);
  for (auto id : {EntryPointId::kCuCtxCreate, EntryPointId::kCuCtxCreate_v2, EntryPointId::kCuCtxCreate_v3,
                  EntryPointId::kCuCtxCreate_v4}) {
    set(id, serveCtxCreate);
  }
  set(EntryPointId::kCuCtxDestroy, serveCtxDestroy);
  set(EntryPointId::kCuCtxDestroy_v2, serveCtxDestroy);
  set(EntryPointId::kCuDevicePrimaryCtxRetain, servePrimaryRetain);
  set(EntryPointId::kCuDevicePrimaryCtxRelease, servePrimaryRelease);
  set(EntryPointId::kCuDevicePrimaryCtxRelease_v2, servePrimaryRelease);
  set(EntryPointId::kCuDevicePrimaryCtxReset, servePrimaryReset);
  set(EntryPointId::kCuDevicePrimaryCtxReset_v2, servePrimaryReset);
  set(EntryPointId::kCuDevicePrimaryCtxSetFlags, servePrimarySetFlags);
  set(EntryPointId::kCuDevicePrimaryCtxSetFlags_v2, servePrimarySetFlags);
  set(EntryPointId::kCuDevicePrimaryCtxGetState, servePrimaryGetState);
  set(EntryPointId::kCuDeviceGetName, serveDeviceString<false>);
  set(EntryPointId::kCuDeviceGetPCIBusId, serveDeviceString<true>);
  set(EntryPointId::kCuFuncGetName, serveFuncGetName);
  set(EntryPointId::kCuKernelGetName, serveKernelGetName);
  set(EntryPointId::kCuModuleGetGlobal_v2,
      serveGetGlobal<CUmodule, HandleType::kCUmod_st, EntryPointId::kCuModuleGetGlobal_v2>);
  set(EntryPointId::kCuLibraryGetGlobal,
      serveGetGlobal<CUlibrary, HandleType::kCUlib_st, EntryPointId::kCuLibraryGetGlobal>);
  set(EntryPointId::kCuModuleUnload, serveModuleUnload);
  set(EntryPointId::kCuLibraryUnload, serveLibraryUnload);
  set(EntryPointId::kCuModuleGetFunctionCount,
      serveHandleCount<CUmodule, CUfunction, HandleType::kCUmod_st, EntryPointId::kCuModuleGetFunctionCount,
                       EntryPointId::kCuModuleEnumerateFunctions, EntryPointId::kCuFuncGetName>);
  set(EntryPointId::kCuLibraryGetKernelCount,
      serveHandleCount<CUlibrary, CUkernel, HandleType::kCUlib_st, EntryPointId::kCuLibraryGetKernelCount,
                       EntryPointId::kCuLibraryEnumerateKernels, EntryPointId::kCuKernelGetName>);
  set(EntryPointId::kCuModuleEnumerateFunctions,
      serveEnumerateHandles<CUmodule, CUfunction, HandleType::kCUmod_st, HandleType::kCUfunc_st,
                            EntryPointId::kCuModuleGetFunctionCount, EntryPointId::kCuModuleEnumerateFunctions,
                            EntryPointId::kCuFuncGetName>);
  set(EntryPointId::kCuLibraryEnumerateKernels,
      serveEnumerateHandles<CUlibrary, CUkernel, HandleType::kCUlib_st, HandleType::kCUkern_st,
                            EntryPointId::kCuLibraryGetKernelCount, EntryPointId::kCuLibraryEnumerateKernels,
                            EntryPointId::kCuKernelGetName>);
  for (auto id : {EntryPointId::kCuModuleLoad, EntryPointId::kCuModuleLoadData, EntryPointId::kCuModuleLoadDataEx,
                  EntryPointId::kCuModuleLoadFatBinary}) {
    set(id, serveModuleLoad);
  }
  set(EntryPointId::kCuLibraryLoadData, serveLibraryLoad);
  set(EntryPointId::kCuLibraryLoadFromFile, serveLibraryLoad);
  set(EntryPointId::kCuLaunchKernel, serveLaunch<false>);
  set(EntryPointId::kCuLaunchKernel_ptsz, serveLaunch<false>);
  set(EntryPointId::kCuLaunchCooperativeKernel, serveLaunch<true>);
  set(EntryPointId::kCuLaunchCooperativeKernel_ptsz, serveLaunch<true>);
  set(EntryPointId::kCuLaunchKernelEx, serveLaunchEx);
  set(EntryPointId::kCuLaunchKernelEx_ptsz, serveLaunchEx);
  set(EntryPointId::kCuMemAlloc_v2, serveMemAlloc);
  set(EntryPointId::kCuMemAllocPitch_v2, serveMemAllocPitch);
  set(EntryPointId::kCuMemFree_v2, serveMemFree);
  set(EntryPointId::kCuMemHostAlloc, serveMemHostAlloc);
  set(EntryPointId::kCuMemAllocHost_v2, serveMemHostAlloc);
  set(EntryPointId::kCuMemFreeHost, serveMemFreeHost);
  set(EntryPointId::kCuMemHostGetDevicePointer_v2, serveMemHostGetDevicePointer);
  set(EntryPointId::kCuMemHostGetFlags, serveMemHostGetFlags);
  set(EntryPointId::kCuMemcpyHtoD_v2, serveMemcpyHtoD<false>);
  set(EntryPointId::kCuMemcpyHtoD_v2_ptds, serveMemcpyHtoD<false>);
  set(EntryPointId::kCuMemcpyHtoDAsync_v2, serveMemcpyHtoD<true>);
  set(EntryPointId::kCuMemcpyHtoDAsync_v2_ptsz, serveMemcpyHtoD<true>);
  set(EntryPointId::kCuMemcpyDtoH_v2, serveMemcpyDtoH<false>);
  set(EntryPointId::kCuMemcpyDtoH_v2_ptds, serveMemcpyDtoH<false>);
  set(EntryPointId::kCuMemcpyDtoHAsync_v2, serveMemcpyDtoH<true>);
  set(EntryPointId::kCuMemcpyDtoHAsync_v2_ptsz, serveMemcpyDtoH<true>);
  set(EntryPointId::kCuMemcpy, serveMemcpy<false, false>);
  set(EntryPointId::kCuMemcpy_ptds, serveMemcpy<false, false>);
  set(EntryPointId::kCuMemcpyAsync, serveMemcpy<true, false>);
  set(EntryPointId::kCuMemcpyAsync_ptsz, serveMemcpy<true, false>);
  set(EntryPointId::kCuMemcpyDtoD_v2, serveMemcpy<false, true>);
  set(EntryPointId::kCuMemcpyDtoD_v2_ptds, serveMemcpy<false, true>);
  set(EntryPointId::kCuMemcpyDtoDAsync_v2, serveMemcpy<true, true>);
  set(EntryPointId::kCuMemcpyDtoDAsync_v2_ptsz, serveMemcpy<true, true>);
  set(EntryPointId::kCuMemsetD8_v2, serveMemset<1, false>);
  set(EntryPointId::kCuMemsetD8_v2_ptds, serveMemset<1, false>);
  set(EntryPointId::kCuMemsetD16_v2, serveMemset<2, false>);
  set(EntryPointId::kCuMemsetD16_v2_ptds, serveMemset<2, false>);
  set(EntryPointId::kCuMemsetD32_v2, serveMemset<4, false>);
  set(EntryPointId::kCuMemsetD32_v2_ptds, serveMemset<4, false>);
  set(EntryPointId::kCuMemsetD8Async, serveMemset<1, true>);
  set(EntryPointId::kCuMemsetD8Async_ptsz, serveMemset<1, true>);
  set(EntryPointId::kCuMemsetD16Async, serveMemset<2, true>);
  set(EntryPointId::kCuMemsetD16Async_ptsz, serveMemset<2, true>);
  set(EntryPointId::kCuMemsetD32Async, serveMemset<4, true>);
  set(EntryPointId::kCuMemsetD32Async_ptsz, serveMemset<4, true>);
  set(EntryPointId::kCuMemsetD2D8_v2, serveMemset2D<1, false>);
  set(EntryPointId::kCuMemsetD2D8_v2_ptds, serveMemset2D<1, false>);
  set(EntryPointId::kCuMemsetD2D16_v2, serveMemset2D<2, false>);
  set(EntryPointId::kCuMemsetD2D16_v2_ptds, serveMemset2D<2, false>);
  set(EntryPointId::kCuMemsetD2D32_v2, serveMemset2D<4, false>);
  set(EntryPointId::kCuMemsetD2D32_v2_ptds, serveMemset2D<4, false>);
  set(EntryPointId::kCuMemsetD2D8Async, serveMemset2D<1, true>);
  set(EntryPointId::kCuMemsetD2D8Async_ptsz, serveMemset2D<1, true>);
  set(EntryPointId::kCuMemsetD2D16Async, serveMemset2D<2, true>);
  set(EntryPointId::kCuMemsetD2D16Async_ptsz, serveMemset2D<2, true>);
  set(EntryPointId::kCuMemsetD2D32Async, serveMemset2D<4, true>);
  set(EntryPointId::kCuMemsetD2D32Async_ptsz, serveMemset2D<4, true>);
  set(EntryPointId::kCuMemcpyPeer, serveMemcpyPeer<false>);
  set(EntryPointId::kCuMemcpyPeer_ptds, serveMemcpyPeer<false>);
  set(EntryPointId::kCuMemcpyPeerAsync, serveMemcpyPeer<true>);
  set(EntryPointId::kCuMemcpyPeerAsync_ptsz, serveMemcpyPeer<true>);
  set(EntryPointId::kCuMemAllocAsync, serveMemAllocAsync);
  set(EntryPointId::kCuMemAllocAsync_ptsz, serveMemAllocAsync);
  set(EntryPointId::kCuMemFreeAsync, serveMemFreeAsync);
  set(EntryPointId::kCuMemFreeAsync_ptsz, serveMemFreeAsync);
  set(EntryPointId::kCuPointerGetAttribute, servePointerGetAttribute);
  set(EntryPointId::kCuMemGetAddressRange_v2, serveMemGetAddressRange);
  set(EntryPointId::kCuPointerGetAttributes, servePointerGetAttributes);
  set(EntryPointId::kCuPointerSetAttribute, servePointerSetAttribute);
  set(EntryPointId::kCuMemcpy2D_v2, serveMemcpy2D<false>);
  set(EntryPointId::kCuMemcpy2D_v2_ptds, serveMemcpy2D<false>);
  set(EntryPointId::kCuMemcpy2DUnaligned_v2, serveMemcpy2D<false>);
  set(EntryPointId::kCuMemcpy2DUnaligned_v2_ptds, serveMemcpy2D<false>);
  set(EntryPointId::kCuMemcpy2DAsync_v2, serveMemcpy2D<true>);
  set(EntryPointId::kCuMemcpy2DAsync_v2_ptsz, serveMemcpy2D<true>);
  set(EntryPointId::kCuMemcpy3D_v2, serveMemcpy3D<false>);
  set(EntryPointId::kCuMemcpy3D_v2_ptds, serveMemcpy3D<false>);
  set(EntryPointId::kCuMemcpy3DAsync_v2, serveMemcpy3D<true>);
  set(EntryPointId::kCuMemcpy3DAsync_v2_ptsz, serveMemcpy3D<true>);
  set(EntryPointId::kCuLaunchHostFunc, serveHostCall<false>);
  set(EntryPointId::kCuLaunchHostFunc_ptsz, serveHostCall<false>);
  set(EntryPointId::kCuStreamAddCallback, serveHostCall<true>);
  set(EntryPointId::kCuStreamAddCallback_ptsz, serveHostCall<true>);
  set(EntryPointId::kCuEventCreate, serveEventCreate);
  set(EntryPointId::kCuEventRecordWithFlags, serveEventRecordWithFlags);
  set(EntryPointId::kCuEventRecordWithFlags_ptsz, serveEventRecordWithFlags);
  set(EntryPointId::kCuStreamWaitEvent, serveStreamWaitEvent);
  set(EntryPointId::kCuStreamWaitEvent_ptsz, serveStreamWaitEvent);
}

}  // namespace phos::daemon
