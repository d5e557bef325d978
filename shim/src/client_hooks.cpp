// SPDX-License-Identifier: Apache-2.0
// What libphos.so does around the generated calls (apigen/remoting.json
// "client"): checks CUDA reports at the call itself (prologues), what the
// shim keeps of the session after a reply (context stacks, pinned mappings,
// the host-call queue, JIT option answers: epilogues), and which calls need
// not wait for phosd (posted).
#include "phos/cuda_api/client_hooks.h"

#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "api_trace.h"
#include "client_call.h"
#include "connection.h"
#include "managed_memory.h"
#include "phos/common/ipc/host_calls.h"
#include "phos/common/log.h"
#include "phos/common/unique_fd.h"
#include "phos/export_tables/export_tables.h"
#include "registered_memory.h"

namespace phos::shim {
namespace {

Connection& conn() { return Connection::instance(); }
bool initialized() { return conn().connected(); }

bool validGeometry(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {
  return gx != 0 && gy != 0 && gz != 0 && bx != 0 && by != 0 && bz != 0;
}

// A launch's errors CUDA reports at the call (the launch itself is posted):
// no driver, no function, an empty grid or block.
std::optional<CUresult> launchChecks(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!validGeometry(gx, gy, gz, bx, by, bz)) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

std::optional<CUresult> hostBuffer(const void* host, size_t bytes) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (host == nullptr && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

// ---- pinned host memory and managed memory ---------------------------------------
// phosd created a shared-memory file and mapped it; the shim maps it at the
// same address, so the pointer means the same memory in both processes.
// Managed memory is such memory too (docs/remoting.md), freed with cuMemFree.
CUresult mapPinned(CUresult result, uint64_t address, uint64_t mapped, std::string_view pathText,
                   void** pp, size_t bytes, bool managed = false) {
  if (result != CUDA_SUCCESS) return result;
  // Ranges phosd freed with their context (cuCtxDestroy) are still mapped
  // here; phosd reuses their addresses.
  for (const Connection::Pinned& stale : conn().removePinnedWithin(address, mapped)) {
    munmap(reinterpret_cast<void*>(stale.address), stale.mapped);
    managed::advice().remove(stale.address);
  }
  const std::string path(pathText);
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  void* p = MAP_FAILED;
  if (fd) {
    p = mmap(reinterpret_cast<void*>(address), mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE,
             fd.get(), 0);
    fd.reset();
  }
  if (p == MAP_FAILED || p != reinterpret_cast<void*>(address)) {
    log::get("shim")->error("cannot map pinned memory {} at {:#x}: {}", path, address, std::strerror(errno));
    if (p != MAP_FAILED) munmap(p, mapped);
    trace::InternalCalls internal;
    if (managed) {
      (void)::cuMemFree(address);
    } else {
      (void)::cuMemFreeHost(reinterpret_cast<void*>(address));
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  conn().addPinned({address, bytes, mapped});
  if (managed) managed::advice().add(address, bytes);
  *pp = p;
  return CUDA_SUCCESS;
}

std::optional<CUresult> pinnedChecks(void** pp, size_t bytes) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

// ---- the application's memory, registered ------------------------------------------------
// phosd maps a file at the pages' address, and the shim moves it over them
// with their bytes (registered_memory.h).

size_t pageSize() {
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}
uintptr_t pageOf(const void* p) {
  return reinterpret_cast<uintptr_t>(p) / pageSize() * pageSize();
}

// ---- host functions ---------------------------------------------------------------------
// phosd's stream threads post the application's host functions to the
// session's host-call queue; a thread of the shim runs each on a thread of
// its own: CUDA runs the host functions of different streams independently,
// so one that blocks must not hold up another stream's.
void runHostCall(ipc::HostCallSlot* slot) {
  if (slot->kind == ipc::kStreamCallback) {
    auto fn = reinterpret_cast<CUstreamCallback>(slot->function);
    fn(reinterpret_cast<CUstream>(slot->stream), static_cast<CUresult>(slot->status),
       reinterpret_cast<void*>(slot->userData));
  } else {
    auto fn = reinterpret_cast<CUhostFn>(slot->function);
    fn(reinterpret_cast<void*>(slot->userData));
  }
  slot->state.store(ipc::kHostCallDone, std::memory_order_release);
  ipc::futexWake(&slot->state);
}

[[noreturn]] void dispatchHostCalls(ipc::HostCallQueue* queue) {
  for (;;) {
    const uint32_t bell = queue->doorbell.load();
    for (auto& slot : queue->slots) {
      uint32_t expected = ipc::kHostCallRequested;
      if (slot.state.compare_exchange_strong(expected, ipc::kHostCallRunning)) {
        try {
          std::thread(runHostCall, &slot).detach();
        } catch (const std::system_error&) {
          runHostCall(&slot);  // no thread to spare: run it here, in order
        }
      }
    }
    ipc::futexWait(&queue->doorbell, bell, std::chrono::seconds(1));
  }
}

// Maps the session's queue and starts its dispatcher, once per queue (a
// forked child attached to a new session gets a new one).
bool serveHostCallQueue(const std::string& path) {
  static std::mutex mutex;
  static std::string served;
  std::lock_guard lock(mutex);
  if (path == served) return true;
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) {
    log::get("shim")->error("cannot open the host-call queue {}: {}", path, std::strerror(errno));
    return false;
  }
  void* p = mmap(nullptr, sizeof(ipc::HostCallQueue), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  fd.reset();
  if (p == MAP_FAILED) {
    log::get("shim")->error("cannot map the host-call queue {}: {}", path, std::strerror(errno));
    return false;
  }
  try {
    std::thread(dispatchHostCalls, static_cast<ipc::HostCallQueue*>(p)).detach();
  } catch (const std::system_error& e) {
    log::get("shim")->error("cannot start the host-call thread: {}", e.what());
    munmap(p, sizeof(ipc::HostCallQueue));
    return false;
  }
  served = path;
  return true;
}

CUresult hostCallQueue(CUresult result, std::string_view queue) {
  if (result != CUDA_SUCCESS) return result;
  // Enqueued already: a queue the shim cannot serve would block the stream forever.
  return serveHostCallQueue(std::string(queue)) ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

CUresult contextCreated(CUresult result, CUcontext* pctx, CUdevice device) {
  if (result != CUDA_SUCCESS) return result;
  const uint64_t id = ClientCall::handleId(*pctx);
  conn().addContext(id, device);
  // "The context is created with a usage count of 1 ... and made current."
  contextStack().push_back(id);
  return CUDA_SUCCESS;
}

}  // namespace

// ---- prologues ------------------------------------------------------------------------
namespace prologue {

std::optional<CUresult> cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = conn().connect(); r != CUDA_SUCCESS) return r;
  return std::nullopt;
}

std::optional<CUresult> cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Works before cuInit, as in CUDA; "0 if no driver is installed".
  if (conn().connect() != CUDA_SUCCESS) {
    *version = 0;
    return CUDA_SUCCESS;
  }
  return std::nullopt;
}

// A context's device, known since the shim saw it made (PyTorch asks 840
// times a step); a context the shim does not know (destroyed, or another
// thread's mistake) goes to phosd, which names the error.
std::optional<CUresult> contextDeviceHere(CUdevice* device, CUcontext ctx) {
  if (device == nullptr) return std::nullopt;
  const uint64_t id = ctx != nullptr ? ClientCall::handleId(ctx) : currentContext();
  std::optional<int> known = conn().contextDevice(id);
  if (!known.has_value()) return std::nullopt;
  *device = *known;
  return CUDA_SUCCESS;
}

std::optional<CUresult> cuCtxGetDevice(CUdevice* device) {
  return contextDeviceHere(device, nullptr);
}
std::optional<CUresult> cuCtxGetDevice(CUdevice* device, CUcontext ctx) {
  return contextDeviceHere(device, ctx);
}

// The state phosd last gave, until a call of the application's changes it.
std::optional<CUresult> cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  if (flags == nullptr || active == nullptr) return std::nullopt;
  std::optional<Connection::PrimaryState> state = conn().primaryState(dev);
  if (!state.has_value()) return std::nullopt;
  *flags = state->flags;
  *active = state->active;
  return CUDA_SUCCESS;
}

std::optional<CUresult> cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                       unsigned int by, unsigned int bz, unsigned int, CUstream, void**, void**) {
  return launchChecks(f, gx, gy, gz, bx, by, bz);
}

std::optional<CUresult> cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                  unsigned int bx, unsigned int by, unsigned int bz, unsigned int,
                                                  CUstream, void**) {
  return launchChecks(f, gx, gy, gz, bx, by, bz);
}

std::optional<CUresult> cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void**, void**) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launchChecks(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                      config->blockDimZ);
}

std::optional<CUresult> cuMemAllocHost(void** pp, size_t bytes) { return pinnedChecks(pp, bytes); }
std::optional<CUresult> cuMemHostAlloc(void** pp, size_t bytes, unsigned int) { return pinnedChecks(pp, bytes); }
std::optional<CUresult> cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int) {
  return pinnedChecks(reinterpret_cast<void**>(dptr), bytes);
}

std::optional<CUresult> cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  const auto end = reinterpret_cast<uintptr_t>(p) + bytes;
  if (p == nullptr || bytes == 0 || end < bytes || (flags & ~kKnown) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) return std::nullopt;  // phosd names it
  const uintptr_t first = pageOf(p);
  const size_t mapped = (end - first + pageSize() - 1) / pageSize() * pageSize();
  if (conn().overlapsPinned(first, mapped)) {
    log::get("shim")->info(
        "cuMemHostRegister: {}+{}: its pages hold pinned or registered memory already (PhOS "
        "registers whole pages)",
        p, bytes);
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  if (CUresult r = registered::check(first, mapped); r != CUDA_SUCCESS) return r;
  return std::nullopt;
}

std::optional<CUresult> cuGraphDebugDotPrint(CUgraph, const char* path, unsigned int) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

std::optional<CUresult> cuMemcpyHtoD(CUdeviceptr, const void* src, size_t bytes) { return hostBuffer(src, bytes); }
std::optional<CUresult> cuMemcpyHtoDAsync(CUdeviceptr, const void* src, size_t bytes, CUstream) {
  return hostBuffer(src, bytes);
}
std::optional<CUresult> cuMemcpyDtoH(void* dst, CUdeviceptr, size_t bytes) { return hostBuffer(dst, bytes); }
std::optional<CUresult> cuMemcpyDtoHAsync(void* dst, CUdeviceptr, size_t bytes, CUstream) {
  return hostBuffer(dst, bytes);
}

std::optional<CUresult> cuLaunchHostFunc(CUstream, CUhostFn fn, void*) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

std::optional<CUresult> cuStreamAddCallback(CUstream, CUstreamCallback callback, void*, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  // "flags: Reserved for future use, must be 0".
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

// Posted: the application does not wait, so the flags are checked here,
// where CUDA reports them.
std::optional<CUresult> cuEventRecordWithFlags(CUevent, CUstream, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

std::optional<CUresult> cuStreamWaitEvent(CUstream, CUevent, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

// phosd encodes into a copy of its own: the application's descriptor's
// alignment ("tensorMap address must be aligned to 64 bytes") is checked
// here, and the arrays are read only for a rank the driver takes (1 to 5).
std::optional<CUresult> tensorMapRequest(const CUtensorMap* tensorMap, cuuint32_t tensorRank) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (tensorMap == nullptr || reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (tensorRank == 0 || tensorRank > 5) return CUDA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

std::optional<CUresult> cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType,
                                               cuuint32_t tensorRank, void*, const cuuint64_t*,
                                               const cuuint64_t*, const cuuint32_t*,
                                               const cuuint32_t*, CUtensorMapInterleave,
                                               CUtensorMapSwizzle, CUtensorMapL2promotion,
                                               CUtensorMapFloatOOBfill) {
  return tensorMapRequest(tensorMap, tensorRank);
}

std::optional<CUresult> cuTensorMapEncodeIm2col(CUtensorMap* tensorMap, CUtensorMapDataType,
                                                cuuint32_t tensorRank, void*, const cuuint64_t*,
                                                const cuuint64_t*, const int*, const int*,
                                                cuuint32_t, cuuint32_t, const cuuint32_t*,
                                                CUtensorMapInterleave, CUtensorMapSwizzle,
                                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return tensorMapRequest(tensorMap, tensorRank);
}

std::optional<CUresult> cuTensorMapEncodeIm2colWide(
    CUtensorMap* tensorMap, CUtensorMapDataType, cuuint32_t tensorRank, void*, const cuuint64_t*,
    const cuuint64_t*, int, int, cuuint32_t, cuuint32_t, const cuuint32_t*, CUtensorMapInterleave,
    CUtensorMapIm2ColWideMode, CUtensorMapSwizzle, CUtensorMapL2promotion,
    CUtensorMapFloatOOBfill) {
  return tensorMapRequest(tensorMap, tensorRank);
}

std::optional<CUresult> cuTensorMapReplaceAddress(CUtensorMap* tensorMap, void*) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (tensorMap == nullptr || reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return std::nullopt;
}

}  // namespace prologue

// ---- epilogues --------------------------------------------------------------------------
namespace epilogue {

CUresult cuCtxCreate(CUresult result, CUcontext* pctx, unsigned int, CUdevice dev) {
  return contextCreated(result, pctx, dev);
}
CUresult cuCtxCreate(CUresult result, CUcontext* pctx, CUexecAffinityParam*, int, unsigned int,
                     CUdevice dev) {
  return contextCreated(result, pctx, dev);
}
CUresult cuCtxCreate(CUresult result, CUcontext* pctx, CUctxCreateParams*, unsigned int,
                     CUdevice dev) {
  return contextCreated(result, pctx, dev);
}

// The application's pages registered in a context phosd destroyed become
// its private memory again, with their bytes, as cuMemHostUnregister leaves them.
void registrationsEnded(uint64_t context) {
  for (const Connection::Pinned& range : conn().removeRegisteredIn(context)) {
    (void)registered::release(range.address, range.mapped);
  }
}

CUresult cuCtxDestroy(CUresult result, CUcontext ctx) {
  if (result != CUDA_SUCCESS) return result;
  const uint64_t id = ClientCall::handleId(ctx);
  registrationsEnded(id);
  conn().removeContext(id);
  auto& stack = contextStack();
  stack.erase(std::remove(stack.begin(), stack.end(), id), stack.end());
  export_tables::contextDestroyed(ctx);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUresult result, CUcontext* pctx, CUdevice dev) {
  if (result != CUDA_SUCCESS) return result;
  conn().addContext(ClientCall::handleId(*pctx), dev);
  conn().primaryRetained(dev, ClientCall::handleId(*pctx));
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUresult result, CUdevice dev, unsigned int* flags,
                                    int* active) {
  if (result == CUDA_SUCCESS) conn().setPrimaryState(dev, {*flags, *active});
  return result;
}

CUresult cuDevicePrimaryCtxSetFlags(CUresult result, CUdevice dev, unsigned int) {
  conn().forgetPrimaryState(dev);
  return result;
}

// phosd destroys a primary context when its last reference goes, or when it
// is reset: the runtime's state kept for it goes too.
CUresult cuDevicePrimaryCtxRelease(CUresult result, CUdevice dev) {
  if (result != CUDA_SUCCESS) return result;
  if (uint64_t gone = conn().primaryReleased(dev); gone != 0) {
    registrationsEnded(gone);
    export_tables::contextDestroyed(reinterpret_cast<CUcontext>(gone));
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUresult result, CUdevice dev) {
  if (result != CUDA_SUCCESS) return result;
  if (uint64_t gone = conn().primaryReset(dev); gone != 0) {
    registrationsEnded(gone);
    export_tables::contextDestroyed(reinterpret_cast<CUcontext>(gone));
  }
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost(CUresult result, uint64_t address, uint64_t mapped, std::string_view path, void** pp,
                        size_t bytes) {
  return mapPinned(result, address, mapped, path, pp, bytes);
}

CUresult cuMemHostAlloc(CUresult result, uint64_t address, uint64_t mapped, std::string_view path, void** pp,
                        size_t bytes, unsigned int) {
  return mapPinned(result, address, mapped, path, pp, bytes);
}

CUresult cuMemFreeHost(CUresult result, void* p) {
  if (result != CUDA_SUCCESS) return result;
  if (auto range = conn().removePinned(reinterpret_cast<uintptr_t>(p))) munmap(p, range->mapped);
  return CUDA_SUCCESS;
}

CUresult cuMemHostRegister(CUresult result, uint64_t address, uint64_t mapped,
                           std::string_view path, void* p, size_t, unsigned int) {
  if (result != CUDA_SUCCESS) return result;
  if (!registered::adopt(std::string(path), address, mapped)) {
    trace::InternalCalls internal;
    (void)::cuMemHostUnregister(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  conn().addPinned({address, mapped, mapped, currentContext()});  // whole pages, as phosd's
  return CUDA_SUCCESS;
}

// phosd has unregistered the pages and removed its file: they become the
// application's private memory again, with their bytes.
CUresult cuMemHostUnregister(CUresult result, void* p) {
  if (result != CUDA_SUCCESS) return result;
  if (auto range = conn().removePinned(pageOf(p))) {
    (void)registered::release(range->address, range->mapped);
  }
  return CUDA_SUCCESS;
}

// phosd's driver wrote the DOT file into a file of the session's own: copied
// where the application asked, as the application (it may write there), and
// removed.
CUresult cuGraphDebugDotPrint(CUresult result, std::string_view dot, CUgraph, const char* path,
                              unsigned int) {
  if (result != CUDA_SUCCESS) return result;
  const std::string from(dot);
  UniqueFd in(open(from.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  (void)unlink(from.c_str());
  UniqueFd out(open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  if (!in || !out) {
    log::get("shim")->warn("cuGraphDebugDotPrint: cannot copy {} to {}: {}", from, path,
                           std::strerror(errno));
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  char buffer[65536];
  for (;;) {
    const ssize_t n = read(in.get(), buffer, sizeof(buffer));
    if (n == 0) return CUDA_SUCCESS;
    if (n < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = write(out.get(), buffer + done, static_cast<size_t>(n - done));
      if (w <= 0) return CUDA_ERROR_OPERATING_SYSTEM;
      done += w;
    }
  }
}

CUresult cuMemAllocManaged(CUresult result, uint64_t address, uint64_t mapped,
                           std::string_view path, CUdeviceptr* dptr, size_t bytesize,
                           unsigned int) {
  void* p = nullptr;
  CUresult r = mapPinned(result, address, mapped, path, &p, bytesize, true);
  if (r == CUDA_SUCCESS) *dptr = reinterpret_cast<CUdeviceptr>(p);
  return r;
}

// phosd frees only managed memory of what the shim maps with cuMemFree.
CUresult cuMemFree(CUresult result, CUdeviceptr dptr) {
  if (result != CUDA_SUCCESS) return result;
  if (auto range = conn().removePinned(dptr)) {
    munmap(reinterpret_cast<void*>(dptr), range->mapped);
    managed::advice().remove(dptr);
  }
  return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUresult result, std::string_view queue, CUstream, CUhostFn, void*) {
  return hostCallQueue(result, queue);
}

CUresult cuStreamAddCallback(CUresult result, std::string_view queue, CUstream, CUstreamCallback, void*,
                             unsigned int) {
  return hostCallQueue(result, queue);
}

// A user object's destructor runs in the application through the same queue.
CUresult cuUserObjectCreate(CUresult result, std::string_view queue, CUuserObject*, void*, CUhostFn,
                            unsigned int, unsigned int) {
  return hostCallQueue(result, queue);
}

// A graph's host node runs the application's function through the same queue.
CUresult cuGraphAddHostNode(CUresult result, std::string_view queue, CUgraphNode*, CUgraph,
                            const CUgraphNode*, size_t, const CUDA_HOST_NODE_PARAMS*) {
  return hostCallQueue(result, queue);
}

}  // namespace epilogue

// ---- posted -------------------------------------------------------------------------------
// A copy is asynchronous for the application only when its host side is
// pinned: "for transfers from pageable host memory to device memory, host
// memory is copied to a staging buffer immediately"; the copy then returns.
namespace posted {

bool cuMemcpyHtoDAsync(CUdeviceptr, const void* src, size_t bytes, CUstream) {
  return conn().isPinned(reinterpret_cast<uintptr_t>(src), bytes);
}

bool cuMemcpyDtoHAsync(void* dst, CUdeviceptr, size_t bytes, CUstream) {
  return conn().isPinned(reinterpret_cast<uintptr_t>(dst), bytes);
}

}  // namespace posted
}  // namespace phos::shim
