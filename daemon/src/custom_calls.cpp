// SPDX-License-Identifier: Apache-2.0
// The handwritten server functions: entry points whose data a generic
// encoding cannot describe (kernel parameters, module images, application
// memory, pinned memory) or that phosd answers itself (contexts from the
// pool, per-session primary contexts). Their wire formats are written next
// to each function and mirrored in shim/src/custom_calls.cpp.
#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
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
  s.contexts()[id] = SessionContext{real, device, primary};
  return id;
}

// cuCtxCreate (all revisions): u32 flags, i32 device. Reply: u64 context.
void serveCtxCreate(ServerCall& c) {
  auto flags = c.args().u32();
  auto device = c.args().value<int32_t>();
  if (!c.argumentsComplete()) return;
  int count = 0;
  PHOS_DRIVER(drv(c), DeviceGetCount)(&count);
  if (device < 0 || device >= count) return replyResult(c, CUDA_ERROR_INVALID_DEVICE);
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
  if (it == contexts.end()) return replyResult(c, id == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_CONTEXT);
  if (it->second.primary) return replyResult(c, CUDA_ERROR_INVALID_CONTEXT);
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
    }
  }
  ++st.refs;
  c.reply(CUDA_SUCCESS).u64(st.id);
  c.send();
}

// Destroys the driver context; the virtual id stays (a later retain re-binds it).
void releasePrimary(Session& s, PrimaryContext& st) {
  if (s.contexts().count(st.id) != 0) s.destroyContext(st.id);
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
  const unsigned known = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_COREDUMP_ENABLE |
                         CU_CTX_USER_COREDUMP_ENABLE | CU_CTX_SYNC_MEMOPS;
  if ((flags & ~known) != 0) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
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
  CUresult r = PHOS_DRIVER(drv(c), FuncGetName)(&name, f);
  auto& w = c.reply(r);
  w.string(r == CUDA_SUCCESS ? name : nullptr);
  c.send();
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
  CUresult r = PHOS_DRIVER(drv(c), ModuleLoadData)(&m, image.data());
  if (r == CUDA_SUCCESS) c.session().noteModule(+1);
  c.reply(r).u64(c.exportHandle(HandleType::kCUmod_st, r, m));
  c.send();
}

void serveLibraryLoad(ServerCall& c) {
  std::vector<char> image;
  if (!readImage(c, &image)) return;
  CUlibrary lib = nullptr;
  CUresult r = PHOS_DRIVER(drv(c), LibraryLoadData)(&lib, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (r == CUDA_SUCCESS) c.session().noteModule(+1);
  c.reply(r).u64(c.exportHandle(HandleType::kCUlib_st, r, lib));
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
  }
  return true;
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
  if (!resolveFunction(c, fid, &f) || !c.resolveStream(sid, perThread, &s)) return;
  void** kernelParams = params.useExtra ? nullptr : params.pointers.data();
  void** extra = params.useExtra ? params.extra : nullptr;
  CUresult r;
  if constexpr (kCooperative) {
    r = PHOS_DRIVER(drv(c), LaunchCooperativeKernel)(f, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6],
                                                     s, kernelParams);
  } else {
    r = PHOS_DRIVER(drv(c), LaunchKernel)(f, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], s,
                                          kernelParams, extra);
  }
  if (r == CUDA_SUCCESS) c.session().noteLaunch(fid);
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
  if (!resolveFunction(c, fid, &f) || !c.resolveStream(sid, perThread, &config.hStream)) return;
  config.attrs = attrs.empty() ? nullptr : attrs.data();
  config.numAttrs = attrCount;
  CUresult r = PHOS_DRIVER(drv(c), LaunchKernelEx)(&config, f, params.useExtra ? nullptr : params.pointers.data(),
                                                   params.useExtra ? params.extra : nullptr);
  if (r == CUDA_SUCCESS) c.session().noteLaunch(fid);
  replyResult(c, r);
}

// ---- device memory -------------------------------------------------------
// cuMemAlloc: u64 bytes. Reply: u64 address.
void serveMemAlloc(ServerCall& c) {
  auto bytes = c.args().u64();
  if (!c.argumentsComplete()) return;
  CUdeviceptr p = 0;
  CUresult r = PHOS_DRIVER(drv(c), MemAlloc_v2)(&p, bytes);
  if (r == CUDA_SUCCESS) c.session().addAllocation({p, bytes, c.session().currentContext()});
  c.reply(r).u64(r == CUDA_SUCCESS ? p : 0);
  c.send();
}

// cuMemAllocPitch: u64 width, u64 height, u32 element bytes. Reply: u64 address, u64 pitch.
void serveMemAllocPitch(ServerCall& c) {
  auto width = c.args().u64();
  auto height = c.args().u64();
  auto element = c.args().u32();
  if (!c.argumentsComplete()) return;
  CUdeviceptr p = 0;
  size_t pitch = 0;
  CUresult r = PHOS_DRIVER(drv(c), MemAllocPitch_v2)(&p, &pitch, width, height, element);
  if (r == CUDA_SUCCESS) c.session().addAllocation({p, pitch * height, c.session().currentContext()});
  auto& w = c.reply(r);
  w.u64(r == CUDA_SUCCESS ? p : 0);
  w.u64(r == CUDA_SUCCESS ? pitch : 0);
  c.send();
}

// cuMemFree: u64 address.
void serveMemFree(ServerCall& c) {
  auto p = c.args().u64();
  if (!c.argumentsComplete()) return;
  const Allocation* a = c.session().findAllocation(p);
  if (a == nullptr || a->address != p) return replyResult(c, CUDA_ERROR_INVALID_VALUE);
  CUresult r = PHOS_DRIVER(drv(c), MemFree_v2)(p);
  if (r == CUDA_SUCCESS) c.session().removeAllocation(p);
  replyResult(c, r);
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
  PHOS_DRIVER(drv(c), MemHostUnregister)(reinterpret_cast<void*>(p));
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
  c.reply(CUDA_SUCCESS).u32(range->flags);
  c.send();
}

// ---- copies ----------------------------------------------------------------
// Where one side of a copy is: the session's device or pinned memory (an
// address phosd can use as is), or the application's pageable memory.
bool isSessionMemory(Session& s, uint64_t p, uint64_t bytes) { return s.ownsRange(p, bytes); }

// Copies `bytes` from the application's memory at `src` to device memory at
// `dst`, through the staging buffer. `stream` null: synchronous copy.
CUresult copyFromApplication(ServerCall& c, CUdeviceptr dst, uint64_t src, uint64_t bytes, CUstream stream,
                             bool async) {
  Session& s = c.session();
  auto staging = s.staging();
  if (staging.empty()) return CUDA_ERROR_OUT_OF_MEMORY;
  for (uint64_t done = 0; done < bytes;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, staging.size()));
    if (!s.readApplication(src + done, staging.data(), n).isOk()) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = async ? PHOS_DRIVER(drv(c), MemcpyHtoDAsync_v2)(dst + done, staging.data(), n, stream)
                       : PHOS_DRIVER(drv(c), MemcpyHtoD_v2)(dst + done, staging.data(), n);
    // The staging buffer is reused: an asynchronous copy must have read it.
    if (r == CUDA_SUCCESS && async) r = PHOS_DRIVER(drv(c), StreamSynchronize)(stream);
    if (r != CUDA_SUCCESS) return r;
    done += n;
  }
  return CUDA_SUCCESS;
}

CUresult copyToApplication(ServerCall& c, uint64_t dst, CUdeviceptr src, uint64_t bytes, CUstream stream,
                           bool async) {
  Session& s = c.session();
  auto staging = s.staging();
  if (staging.empty()) return CUDA_ERROR_OUT_OF_MEMORY;
  for (uint64_t done = 0; done < bytes;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, staging.size()));
    CUresult r = async ? PHOS_DRIVER(drv(c), MemcpyDtoHAsync_v2)(staging.data(), src + done, n, stream)
                       : PHOS_DRIVER(drv(c), MemcpyDtoH_v2)(staging.data(), src + done, n);
    if (r == CUDA_SUCCESS && async) r = PHOS_DRIVER(drv(c), StreamSynchronize)(stream);
    if (r != CUDA_SUCCESS) return r;
    if (!s.writeApplication(dst + done, staging.data(), n).isOk()) return CUDA_ERROR_INVALID_VALUE;
    done += n;
  }
  return CUDA_SUCCESS;
}

bool perThreadEntry(ServerCall& c) {
  return cuda_api::entryPoint(c.entry()).origin == cuda_api::EntryPointOrigin::kPerThread;
}

// cuMemcpyHtoD[Async]: u64 dst, u64 src (application address), u64 bytes[, u64 stream].
template <bool kAsync>
void serveMemcpyHtoD(ServerCall& c) {
  auto dst = c.args().u64();
  auto src = c.args().u64();
  auto bytes = c.args().u64();
  uint64_t sid = kAsync ? c.args().u64() : 0;
  if (!c.argumentsComplete()) return;
  CUstream s{};
  if (kAsync && !c.resolveStream(sid, perThreadEntry(c), &s)) return;
  if (!c.checkDeviceRange(dst, bytes)) return;
  CUresult r;
  if (isSessionMemory(c.session(), src, bytes)) {
    // Pinned memory: the same address in phosd.
    r = kAsync ? PHOS_DRIVER(drv(c), MemcpyHtoDAsync_v2)(dst, reinterpret_cast<void*>(src), bytes, s)
               : PHOS_DRIVER(drv(c), MemcpyHtoD_v2)(dst, reinterpret_cast<void*>(src), bytes);
  } else {
    r = copyFromApplication(c, dst, src, bytes, s, kAsync);
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
  if (kAsync && !c.resolveStream(sid, perThreadEntry(c), &s)) return;
  if (!c.checkDeviceRange(src, bytes)) return;
  CUresult r;
  if (isSessionMemory(c.session(), dst, bytes)) {
    r = kAsync ? PHOS_DRIVER(drv(c), MemcpyDtoHAsync_v2)(reinterpret_cast<void*>(dst), src, bytes, s)
               : PHOS_DRIVER(drv(c), MemcpyDtoH_v2)(reinterpret_cast<void*>(dst), src, bytes);
  } else {
    r = copyToApplication(c, dst, src, bytes, s, kAsync);
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
  if (kAsync && !c.resolveStream(sid, perThreadEntry(c), &s)) return;
  Session& session = c.session();
  const bool dstOurs = isSessionMemory(session, dst, bytes);
  const bool srcOurs = isSessionMemory(session, src, bytes);
  if (bytes == 0) return replyResult(c, CUDA_SUCCESS);
  CUresult r;
  if (dstOurs && srcOurs) {
    r = kAsync ? PHOS_DRIVER(drv(c), MemcpyAsync)(dst, src, bytes, s) : PHOS_DRIVER(drv(c), Memcpy)(dst, src, bytes);
  } else if (kDeviceOnly) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (dstOurs) {
    r = copyFromApplication(c, dst, src, bytes, s, kAsync);
  } else if (srcOurs) {
    r = copyToApplication(c, dst, src, bytes, s, kAsync);
  } else {
    // Host to host: CUDA copies it too.
    std::vector<std::byte> tmp(bytes);
    r = session.readApplication(src, tmp.data(), bytes).isOk() && session.writeApplication(dst, tmp.data(), bytes).isOk()
            ? CUDA_SUCCESS
            : CUDA_ERROR_INVALID_VALUE;
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
  CUstream s{};
  if (kAsync && !c.resolveStream(sid, perThreadEntry(c), &s)) return;
  if (count > (~0ull) / kBytes || !c.checkDeviceRange(dst, count * kBytes)) return;
  CUresult r;
  if constexpr (kBytes == 1) {
    r = kAsync ? PHOS_DRIVER(drv(c), MemsetD8Async)(dst, static_cast<unsigned char>(value), count, s)
               : PHOS_DRIVER(drv(c), MemsetD8_v2)(dst, static_cast<unsigned char>(value), count);
  } else if constexpr (kBytes == 2) {
    r = kAsync ? PHOS_DRIVER(drv(c), MemsetD16Async)(dst, static_cast<unsigned short>(value), count, s)
               : PHOS_DRIVER(drv(c), MemsetD16_v2)(dst, static_cast<unsigned short>(value), count);
  } else {
    r = kAsync ? PHOS_DRIVER(drv(c), MemsetD32Async)(dst, value, count, s)
               : PHOS_DRIVER(drv(c), MemsetD32_v2)(dst, value, count);
  }
  replyResult(c, r);
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
}

}  // namespace phos::daemon
