// SPDX-License-Identifier: Apache-2.0
// The handwritten shim entry points: what the shim answers itself (context
// stacks, error strings, cuGetProcAddress) and calls whose data a generic
// encoding cannot describe. Wire formats mirror daemon/src/custom_calls.cpp.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "client_call.h"
#include "connection.h"
#include "module_image.h"
#include "phos/common/ipc/host_calls.h"
#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "phos/cuda_api/proc_address.h"

namespace phos::shim {
namespace {

using cuda_api::EntryPointId;
constexpr uint32_t kExtraBuffer = 0xfffffffeu;

Connection& conn() { return Connection::instance(); }

// A call whose only output is its result.
CUresult resultOf(ClientCall& call) {
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  return reply.finish();
}

// ---- initialization, versions, errors -----------------------------------
CUresult initImpl(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = conn().connect(); r != CUDA_SUCCESS) return r;
  ClientCall call(EntryPointId::kCuInit);
  call.args().u32(flags);
  return resultOf(call);
}

CUresult driverGetVersionImpl(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Works before cuInit, as in CUDA; "0 if no driver is installed".
  if (conn().connect() != CUDA_SUCCESS) {
    *version = 0;
    return CUDA_SUCCESS;
  }
  ClientCall call(EntryPointId::kCuDriverGetVersion);
  call.args().outPointer(version);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  reply.out(version);
  return reply.finish();
}

struct ErrorText {
  int value;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
#include "cu_error_table.inc"
};

const ErrorText* findError(CUresult r) {
  for (const auto& e : kErrors) {
    if (e.value == static_cast<int>(r)) return &e;
  }
  return nullptr;
}

CUresult getErrorNameImpl(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *str = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult getErrorStringImpl(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findError(error);
  *str = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult getExportTableImpl(const void** table, const CUuuid* id) {
  if (table == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // NVIDIA's private tables: no driver but NVIDIA's has them.
  *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

// cuGetProcAddress: every pointer handed out is one of the shim's trampolines.
CUresult getProcAddressCommon(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                              CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~known) != 0 || cudaVersion > cuda_api::headerCudaVersion()) return CUDA_ERROR_INVALID_VALUE;
  auto found = cuda_api::lookupProcAddress(symbol, cudaVersion, flags);
  if (status != nullptr) *status = static_cast<CUdriverProcAddressQueryResult>(found.status);
  *pfn = found.found() ? reinterpret_cast<void*>(cuda_api::trampoline(found.entry)) : nullptr;
  return CUDA_SUCCESS;
}

CUresult getProcAddressV2Impl(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                              CUdriverProcAddressQueryResult* status) {
  return getProcAddressCommon(symbol, pfn, cudaVersion, flags, status);
}

CUresult getProcAddressV1Impl(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  // The CUDA 11 ABI has no status output: a symbol it cannot hand out is
  // CUDA_ERROR_NOT_FOUND.
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult r = getProcAddressCommon(symbol, pfn, cudaVersion, flags, &status);
  if (r != CUDA_SUCCESS) return r;
  return status == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

// ---- contexts ----------------------------------------------------------------
// The stack of current contexts is the calling thread's and lives here; every
// call carries the top of it to phosd.
bool initialized() { return conn().connected(); }

CUresult ctxGetCurrentImpl(CUcontext* pctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(currentContext());
  return CUDA_SUCCESS;
}

CUresult ctxSetCurrentImpl(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto& stack = contextStack();
  uint64_t id = ClientCall::handleId(ctx);
  if (id == 0) {
    // "equivalent to popping the top of the calling thread's stack"
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!conn().knownContext(id)) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack.empty()) {
    stack.push_back(id);
  } else {
    stack.back() = id;
  }
  return CUDA_SUCCESS;
}

CUresult ctxPushCurrentImpl(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  uint64_t id = ClientCall::handleId(ctx);
  if (id == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!conn().knownContext(id)) return CUDA_ERROR_INVALID_CONTEXT;
  contextStack().push_back(id);
  return CUDA_SUCCESS;
}

CUresult ctxPopCurrentImpl(CUcontext* pctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto& stack = contextStack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(stack.back());
  stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult ctxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(EntryPointId::kCuCtxCreate_v2);
  call.args().u32(flags);
  call.args().value<int32_t>(dev);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint64_t id = reply.decoder().u64();
  CUresult r = reply.finish();
  if (r != CUDA_SUCCESS) return r;
  conn().addContext(id);
  // "The context is created with a usage count of 1 ... and made current."
  contextStack().push_back(id);
  *pctx = reinterpret_cast<CUcontext>(id);
  return CUDA_SUCCESS;
}

CUresult ctxCreateV3Impl(CUcontext* pctx, CUexecAffinityParam* params, int numParams, unsigned int flags,
                         CUdevice dev) {
  if (numParams < 0 || (numParams > 0 && params == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (numParams > 0) return CUDA_ERROR_NOT_SUPPORTED;  // execution affinity is not remoted yet
  return ctxCreate(pctx, flags, dev);
}

CUresult ctxCreateV4Impl(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
  if (params != nullptr && (params->execAffinityParams != nullptr || params->cigParams != nullptr)) {
    return CUDA_ERROR_NOT_SUPPORTED;  // affinity and CIG contexts are not remoted yet
  }
  return ctxCreate(pctx, flags, dev);
}

CUresult ctxDestroyImpl(CUcontext ctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  uint64_t id = ClientCall::handleId(ctx);
  ClientCall call(EntryPointId::kCuCtxDestroy_v2);
  call.args().u64(id);
  CUresult r = resultOf(call);
  if (r == CUDA_SUCCESS) {
    conn().removeContext(id);
    auto& stack = contextStack();
    stack.erase(std::remove(stack.begin(), stack.end(), id), stack.end());
  }
  return r;
}

CUresult primaryRetainImpl(CUcontext* pctx, CUdevice dev) {
  if (pctx == nullptr) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(EntryPointId::kCuDevicePrimaryCtxRetain);
  call.args().value<int32_t>(dev);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint64_t id = reply.decoder().u64();
  CUresult r = reply.finish();
  if (r != CUDA_SUCCESS) return r;
  conn().addContext(id);
  *pctx = reinterpret_cast<CUcontext>(id);
  return CUDA_SUCCESS;
}

template <EntryPointId kId>
CUresult primaryByDevice(CUdevice dev) {
  ClientCall call(kId);
  call.args().value<int32_t>(dev);
  return resultOf(call);
}

CUresult primarySetFlagsImpl(CUdevice dev, unsigned int flags) {
  ClientCall call(EntryPointId::kCuDevicePrimaryCtxSetFlags_v2);
  call.args().value<int32_t>(dev);
  call.args().u32(flags);
  return resultOf(call);
}

CUresult primaryGetStateImpl(CUdevice dev, unsigned int* flags, int* active) {
  if (flags == nullptr || active == nullptr) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(EntryPointId::kCuDevicePrimaryCtxGetState);
  call.args().value<int32_t>(dev);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint32_t f = reply.decoder().u32();
  int32_t a = reply.decoder().value<int32_t>();
  CUresult r = reply.finish();
  if (r == CUDA_SUCCESS) {
    *flags = f;
    *active = a;
  }
  return r;
}

// ---- strings -----------------------------------------------------------------
template <EntryPointId kId>
CUresult deviceString(char* out, int len, CUdevice dev) {
  if (out == nullptr || len <= 0) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  call.args().value<int32_t>(std::min(len, 4096));
  call.args().value<int32_t>(dev);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  auto text = reply.decoder().blob();
  CUresult r = reply.finish();
  if (r != CUDA_SUCCESS) return r;
  size_t n = std::min(text.size(), static_cast<size_t>(len - 1));
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
  return CUDA_SUCCESS;
}

template <EntryPointId kId, typename Handle>
CUresult handleName(const char** name, Handle h) {
  if (name == nullptr) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  uint64_t id = ClientCall::handleId(h);
  call.args().u64(id);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  bool null = false;
  auto text = reply.decoder().blob(&null);
  CUresult r = reply.finish();
  if (r != CUDA_SUCCESS) return r;
  // The application may keep the pointer: the string lives as long as the process.
  *name = null ? nullptr : conn().keepString(id, std::string(reinterpret_cast<const char*>(text.data()), text.size()));
  return CUDA_SUCCESS;
}

// ---- handle arrays ---------------------------------------------------------------
// cuModuleEnumerateFunctions / cuLibraryEnumerateKernels fill an array of
// `count` handles (the generic encoding knows single outputs only).
template <EntryPointId kId, typename Handle, typename Owner>
CUresult enumerateHandles(Handle* out, unsigned int count, Owner owner) {
  if (out == nullptr) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  call.args().u64(ClientCall::handleId(owner));
  call.args().u32(count);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint32_t n = reply.decoder().u32();
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < n && i < count && reply.decoder().ok(); ++i) ids.push_back(reply.decoder().u64());
  CUresult r = reply.finish();
  if (r != CUDA_SUCCESS) return r;
  for (size_t i = 0; i < ids.size(); ++i) out[i] = reinterpret_cast<Handle>(ids[i]);
  return CUDA_SUCCESS;
}

// Module globals and unloads: phosd records each global's range as session
// memory until its module goes (the wire format is the generic one).
template <EntryPointId kId, typename Owner>
CUresult getGlobal(CUdeviceptr* dptr, size_t* bytes, Owner owner, const char* name) {
  ClientCall call(kId);
  auto& e = call.args();
  e.outPointer(dptr);
  e.outPointer(bytes);
  e.u64(ClientCall::handleId(owner));
  e.string(name);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  reply.out(dptr);
  reply.out(bytes);
  return reply.finish();
}

template <EntryPointId kId, typename Handle>
CUresult unloadImage(Handle h) {
  ClientCall call(kId);
  call.args().u64(ClientCall::handleId(h));
  return resultOf(call);
}

// ---- modules and libraries ----------------------------------------------------
// The image stays where it is; phosd reads it from this process.
template <EntryPointId kId, typename Handle>
CUresult loadImage(Handle* out, const void* data, size_t bytes) {
  if (out == nullptr || data == nullptr) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  if (bytes == 0) return CUDA_ERROR_INVALID_IMAGE;
  ClientCall call(kId);
  call.args().u64(reinterpret_cast<uintptr_t>(data));
  call.args().u64(bytes);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint64_t id = reply.decoder().u64();
  CUresult r = reply.finish();
  if (r == CUDA_SUCCESS) *out = reinterpret_cast<Handle>(id);
  return r;
}

bool readFile(const char* path, std::vector<char>* data) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  data->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  data->push_back('\0');  // PTX files are text without a terminator
  return true;
}

CUresult moduleLoadDataImpl(CUmodule* module, const void* image) {
  ModuleImage m = moduleImage(image);
  return loadImage<EntryPointId::kCuModuleLoadData>(module, m.data, m.bytes);
}

CUresult moduleLoadFatBinaryImpl(CUmodule* module, const void* fatCubin) {
  ModuleImage m = moduleImage(fatCubin);
  return loadImage<EntryPointId::kCuModuleLoadFatBinary>(module, m.data, m.bytes);
}

// JIT options: phosd compiles without them; outputs the application may read
// (log buffers, wall time) are reported empty.
void answerJitOptions(unsigned int count, const CUjit_option* options, void** values) {
  if (options == nullptr || values == nullptr) return;
  for (unsigned i = 0; i < count; ++i) {
    switch (options[i]) {
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        values[i] = nullptr;
        break;
      case CU_JIT_INFO_LOG_BUFFER:
      case CU_JIT_ERROR_LOG_BUFFER:
        if (values[i] != nullptr) static_cast<char*>(values[i])[0] = '\0';
        break;
      case CU_JIT_WALL_TIME: {
        float zero = 0;
        std::memcpy(&values[i], &zero, sizeof(zero));
        break;
      }
      default:
        break;
    }
  }
}

CUresult moduleLoadDataExImpl(CUmodule* module, const void* image, unsigned int numOptions, CUjit_option* options,
                              void** optionValues) {
  if (numOptions > 0 && (options == nullptr || optionValues == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  ModuleImage m = moduleImage(image);
  CUresult r = loadImage<EntryPointId::kCuModuleLoadDataEx>(module, m.data, m.bytes);
  answerJitOptions(numOptions, options, optionValues);
  return r;
}

CUresult moduleLoadImpl(CUmodule* module, const char* fname) {
  if (fname == nullptr || module == nullptr) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  std::vector<char> data;
  if (!readFile(fname, &data)) return CUDA_ERROR_FILE_NOT_FOUND;
  ModuleImage m = moduleImage(data.data());
  return loadImage<EntryPointId::kCuModuleLoad>(module, m.data, std::min(m.bytes, data.size()));
}

CUresult libraryLoadDataImpl(CUlibrary* library, const void* code, CUjit_option* jitOptions, void** jitOptionsValues,
                             unsigned int numJitOptions, CUlibraryOption*, void**, unsigned int) {
  ModuleImage m = moduleImage(code);
  CUresult r = loadImage<EntryPointId::kCuLibraryLoadData>(library, m.data, m.bytes);
  answerJitOptions(numJitOptions, jitOptions, jitOptionsValues);
  return r;
}

CUresult libraryLoadFromFileImpl(CUlibrary* library, const char* fileName, CUjit_option* jitOptions,
                                 void** jitOptionsValues, unsigned int numJitOptions, CUlibraryOption*, void**,
                                 unsigned int) {
  if (fileName == nullptr || library == nullptr) return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
  std::vector<char> data;
  if (!readFile(fileName, &data)) return CUDA_ERROR_FILE_NOT_FOUND;
  ModuleImage m = moduleImage(data.data());
  CUresult r = loadImage<EntryPointId::kCuLibraryLoadFromFile>(library, m.data, std::min(m.bytes, data.size()));
  answerJitOptions(numJitOptions, jitOptions, jitOptionsValues);
  return r;
}

// ---- launches ---------------------------------------------------------------
// Kernel parameter sizes, asked once per function (cuFuncGetParamInfo, or
// cuKernelGetParamInfo for a CUkernel passed as a CUfunction).
CUresult paramSizes(CUfunction f, std::vector<uint32_t>* sizes) {
  uint64_t id = ClientCall::handleId(f);
  if (auto cached = conn().paramSizes(id)) {
    *sizes = std::move(*cached);
    return CUDA_SUCCESS;
  }
  std::vector<uint32_t> out;
  bool kernel = false;
  for (size_t i = 0; i < 4096; ++i) {
    size_t offset = 0, size = 0;
    CUresult r = kernel ? ::cuKernelGetParamInfo(reinterpret_cast<CUkernel>(f), i, &offset, &size)
                        : ::cuFuncGetParamInfo(f, i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_HANDLE && i == 0 && !kernel) {
      kernel = true;
      --i;
      continue;
    }
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
    if (r != CUDA_SUCCESS) return r;
    out.push_back(static_cast<uint32_t>(size));
  }
  conn().setParamSizes(id, out);
  *sizes = std::move(out);
  return CUDA_SUCCESS;
}

// Parameters: u32 count and one blob each, or kExtraBuffer and the buffer.
// `sizes` are the function's (paramSizes), unused with `extra`.
CUresult encodeParams(ipc::Encoder& e, const std::vector<uint32_t>& sizes, void** kernelParams, void** extra) {
  if (kernelParams != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (extra != nullptr) {
    const void* buffer = nullptr;
    size_t bytes = 0;
    bool haveSize = false;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (i > 64) return CUDA_ERROR_INVALID_VALUE;
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        buffer = extra[i + 1];
      } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
        if (extra[i + 1] == nullptr) return CUDA_ERROR_INVALID_VALUE;
        bytes = *static_cast<const size_t*>(extra[i + 1]);
        haveSize = true;
      } else {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    if (buffer == nullptr || !haveSize) return CUDA_ERROR_INVALID_VALUE;
    e.u32(kExtraBuffer);
    e.blob(buffer, bytes);
    return CUDA_SUCCESS;
  }
  if (!sizes.empty() && kernelParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  e.u32(static_cast<uint32_t>(sizes.size()));
  for (size_t i = 0; i < sizes.size(); ++i) e.blob(kernelParams[i], sizes[i]);
  return CUDA_SUCCESS;
}

bool validGeometry(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {
  return gx != 0 && gy != 0 && gz != 0 && bx != 0 && by != 0 && bz != 0;
}

template <EntryPointId kId>
CUresult launchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      unsigned shared, CUstream stream, void** kernelParams, void** extra) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!validGeometry(gx, gy, gz, bx, by, bz)) return CUDA_ERROR_INVALID_VALUE;
  // Parameter sizes first: asking for them is a call of its own.
  std::vector<uint32_t> sizes;
  if (extra == nullptr) {
    if (CUresult r = paramSizes(f, &sizes); r != CUDA_SUCCESS) return r;
  }
  ClientCall call(kId);
  auto& e = call.args();
  e.u64(ClientCall::handleId(f));
  for (unsigned v : {gx, gy, gz, bx, by, bz, shared}) e.u32(v);
  e.u64(ClientCall::handleId(stream));
  if (CUresult r = encodeParams(e, sizes, kernelParams, extra); r != CUDA_SUCCESS) return r;
  return call.post();
}

template <EntryPointId kId>
CUresult launchCooperative(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                           unsigned shared, CUstream stream, void** kernelParams) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!validGeometry(gx, gy, gz, bx, by, bz)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint32_t> sizes;
  if (CUresult r = paramSizes(f, &sizes); r != CUDA_SUCCESS) return r;
  ClientCall call(kId);
  auto& e = call.args();
  e.u64(ClientCall::handleId(f));
  for (unsigned v : {gx, gy, gz, bx, by, bz, shared}) e.u32(v);
  e.u64(ClientCall::handleId(stream));
  if (CUresult r = encodeParams(e, sizes, kernelParams, nullptr); r != CUDA_SUCCESS) return r;
  // A cooperative launch that cannot fit the device is refused at launch:
  // wait for the answer.
  return resultOf(call);
}

template <EntryPointId kId>
CUresult launchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!validGeometry(config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                     config->blockDimZ)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint32_t> sizes;
  if (extra == nullptr) {
    if (CUresult r = paramSizes(f, &sizes); r != CUDA_SUCCESS) return r;
  }
  ClientCall call(kId);
  auto& e = call.args();
  e.u64(ClientCall::handleId(f));
  for (unsigned v : {config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                     config->blockDimZ, config->sharedMemBytes}) {
    e.u32(v);
  }
  e.u64(ClientCall::handleId(config->hStream));
  e.u32(config->numAttrs);
  e.blob(config->attrs, sizeof(CUlaunchAttribute) * config->numAttrs);
  if (CUresult r = encodeParams(e, sizes, kernelParams, extra); r != CUDA_SUCCESS) return r;
  return call.post();
}

// ---- occupancy -----------------------------------------------------------------
// cuOccupancyMaxPotentialBlockSize(WithFlags) take a host callback (dynamic
// shared memory per block size), so they are answered here: the callback runs
// in the application, each candidate block size is one remoted
// cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags. The largest block size
// of the highest occupancy wins, as in the driver.
CUresult occupancyMaxPotentialBlockSizeWithFlagsImpl(int* minGridSize, int* blockSize, CUfunction f,
                                                     CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                     size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (minGridSize == nullptr || blockSize == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int maxThreads = 0, multiprocessors = 0, warp = 0;
  CUdevice device = 0;
  if (CUresult r = ::cuFuncGetAttribute(&maxThreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f); r != CUDA_SUCCESS) {
    return r;
  }
  if (CUresult r = ::cuCtxGetDevice(&device); r != CUDA_SUCCESS) return r;
  if (CUresult r = ::cuDeviceGetAttribute(&multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (CUresult r = ::cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, device); r != CUDA_SUCCESS) return r;
  warp = std::max(warp, 1);
  int limit = blockSizeLimit > 0 ? std::min(maxThreads, blockSizeLimit) : maxThreads;
  int bestSize = 0, bestThreads = 0, bestBlocks = 0;
  for (int size = (limit / warp) * warp; size >= warp; size -= warp) {
    size_t shared = blockSizeToDynamicSMemSize != nullptr ? blockSizeToDynamicSMemSize(size) : dynamicSMemSize;
    int blocks = 0;
    CUresult r = ::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, size, shared, flags);
    if (r != CUDA_SUCCESS) return r;
    if (blocks * size > bestThreads) {
      bestThreads = blocks * size;
      bestSize = size;
      bestBlocks = blocks;
    }
  }
  if (bestSize == 0) return CUDA_ERROR_INVALID_VALUE;
  *blockSize = bestSize;
  *minGridSize = bestBlocks * multiprocessors;
  return CUDA_SUCCESS;
}

CUresult occupancyMaxPotentialBlockSizeImpl(int* minGridSize, int* blockSize, CUfunction f,
                                            CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                            int blockSizeLimit) {
  return occupancyMaxPotentialBlockSizeWithFlagsImpl(minGridSize, blockSize, f, blockSizeToDynamicSMemSize,
                                                     dynamicSMemSize, blockSizeLimit, CU_OCCUPANCY_DEFAULT);
}

// ---- device memory -------------------------------------------------------------
CUresult memAllocImpl(CUdeviceptr* dptr, size_t bytes) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(EntryPointId::kCuMemAlloc_v2);
  call.args().u64(bytes);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint64_t p = reply.decoder().u64();
  CUresult r = reply.finish();
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

CUresult memAllocPitchImpl(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int element) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == nullptr || pitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(EntryPointId::kCuMemAllocPitch_v2);
  call.args().u64(width);
  call.args().u64(height);
  call.args().u32(element);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint64_t p = reply.decoder().u64();
  uint64_t pt = reply.decoder().u64();
  CUresult r = reply.finish();
  if (r == CUDA_SUCCESS) {
    *dptr = p;
    *pitch = pt;
  }
  return r;
}

CUresult memFreeImpl(CUdeviceptr p) {
  ClientCall call(EntryPointId::kCuMemFree_v2);
  call.args().u64(p);
  return resultOf(call);
}

// ---- pinned host memory ----------------------------------------------------------
// phosd creates a shared-memory file and maps it; the shim maps it at the same
// address, so the pointer means the same memory in both processes.
CUresult memHostAllocImpl(void** pp, size_t bytes, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(EntryPointId::kCuMemHostAlloc);
  call.args().u64(bytes);
  call.args().u32(flags);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint64_t address = reply.decoder().u64();
  uint64_t mapped = reply.decoder().u64();
  bool null = false;
  auto pathBytes = reply.decoder().blob(&null);
  CUresult r = reply.finish();
  if (r != CUDA_SUCCESS) return r;
  std::string path(reinterpret_cast<const char*>(pathBytes.data()), pathBytes.size());
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  void* p = MAP_FAILED;
  if (fd >= 0) {
    p = mmap(reinterpret_cast<void*>(address), mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    close(fd);
  }
  if (p == MAP_FAILED || p != reinterpret_cast<void*>(address)) {
    log::get("shim")->error("cannot map pinned memory {} at {:#x}: {}", path, address, std::strerror(errno));
    if (p != MAP_FAILED) munmap(p, mapped);
    ClientCall undo(EntryPointId::kCuMemFreeHost);
    undo.args().u64(address);
    (void)resultOf(undo);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  conn().addPinned({address, bytes, mapped});
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult memAllocHostImpl(void** pp, size_t bytes) { return memHostAllocImpl(pp, bytes, 0); }

CUresult memFreeHostImpl(void* p) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto address = reinterpret_cast<uintptr_t>(p);
  ClientCall call(EntryPointId::kCuMemFreeHost);
  call.args().u64(address);
  CUresult r = resultOf(call);
  if (r == CUDA_SUCCESS) {
    if (auto range = conn().removePinned(address)) munmap(p, range->mapped);
  }
  return r;
}

CUresult memHostGetDevicePointerImpl(CUdeviceptr* pdptr, void* p, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(EntryPointId::kCuMemHostGetDevicePointer_v2);
  call.args().u64(reinterpret_cast<uintptr_t>(p));
  call.args().u32(flags);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint64_t d = reply.decoder().u64();
  CUresult r = reply.finish();
  if (r == CUDA_SUCCESS) *pdptr = d;
  return r;
}

CUresult memHostGetFlagsImpl(unsigned int* flags, void* p) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(EntryPointId::kCuMemHostGetFlags);
  call.args().u64(reinterpret_cast<uintptr_t>(p));
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint32_t f = reply.decoder().u32();
  CUresult r = reply.finish();
  if (r == CUDA_SUCCESS) *flags = f;
  return r;
}

// ---- copies and sets ----------------------------------------------------------------
// A copy is asynchronous for the application only when its host side is
// pinned: "for transfers from pageable host memory to device memory, host
// memory is copied to a staging buffer immediately"; the copy then returns.
CUresult copyCall(EntryPointId id, uint64_t dst, uint64_t src, uint64_t bytes, const CUstream* stream, bool post) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(id);
  call.args().u64(dst);
  call.args().u64(src);
  call.args().u64(bytes);
  if (stream != nullptr) call.args().u64(ClientCall::handleId(*stream));
  return post ? call.post() : resultOf(call);
}

template <EntryPointId kId>
CUresult memcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  if (src == nullptr && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  return copyCall(kId, dst, reinterpret_cast<uintptr_t>(src), bytes, nullptr, false);
}

template <EntryPointId kId>
CUresult memcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  if (src == nullptr && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  auto s = reinterpret_cast<uintptr_t>(src);
  return copyCall(kId, dst, s, bytes, &stream, conn().isPinned(s, bytes));
}

template <EntryPointId kId>
CUresult memcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  if (dst == nullptr && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  return copyCall(kId, reinterpret_cast<uintptr_t>(dst), src, bytes, nullptr, false);
}

template <EntryPointId kId>
CUresult memcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  if (dst == nullptr && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  auto d = reinterpret_cast<uintptr_t>(dst);
  return copyCall(kId, d, src, bytes, &stream, conn().isPinned(d, bytes));
}

template <EntryPointId kId>
CUresult memcpySync(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copyCall(kId, dst, src, bytes, nullptr, false);
}

// Device to device, or pinned on the host side: nothing of the application's
// pageable memory is involved, so the application need not wait.
template <EntryPointId kId, bool kDeviceOnly>
CUresult memcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copyCall(kId, dst, src, bytes, &stream, kDeviceOnly);
}

template <EntryPointId kId, typename T>
CUresult memset(CUdeviceptr dst, T value, size_t count) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  call.args().u64(dst);
  call.args().u32(value);
  call.args().u64(count);
  return resultOf(call);
}

template <EntryPointId kId, typename T>
CUresult memsetAsync(CUdeviceptr dst, T value, size_t count, CUstream stream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  call.args().u64(dst);
  call.args().u32(value);
  call.args().u64(count);
  call.args().u64(ClientCall::handleId(stream));
  return call.post();
}

// ---- 2D sets, peer copies, stream-ordered allocations ---------------------------------
template <EntryPointId kId, typename T>
CUresult memset2D(CUdeviceptr dst, size_t pitch, T value, size_t width, size_t height) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  for (uint64_t v : {uint64_t{dst}, uint64_t{pitch}}) call.args().u64(v);
  call.args().u32(value);
  call.args().u64(width);
  call.args().u64(height);
  return resultOf(call);
}

template <EntryPointId kId, typename T>
CUresult memset2DAsync(CUdeviceptr dst, size_t pitch, T value, size_t width, size_t height, CUstream stream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  for (uint64_t v : {uint64_t{dst}, uint64_t{pitch}}) call.args().u64(v);
  call.args().u32(value);
  call.args().u64(width);
  call.args().u64(height);
  call.args().u64(ClientCall::handleId(stream));
  return call.post();
}

template <EntryPointId kId>
CUresult memcpyPeer(CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src, CUcontext srcContext, size_t bytes) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  for (uint64_t v : {uint64_t{dst}, ClientCall::handleId(dstContext), uint64_t{src}, ClientCall::handleId(srcContext),
                     uint64_t{bytes}}) {
    call.args().u64(v);
  }
  return resultOf(call);
}

// Device memory on both sides: the application need not wait.
template <EntryPointId kId>
CUresult memcpyPeerAsync(CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src, CUcontext srcContext, size_t bytes,
                         CUstream stream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  for (uint64_t v : {uint64_t{dst}, ClientCall::handleId(dstContext), uint64_t{src}, ClientCall::handleId(srcContext),
                     uint64_t{bytes}, ClientCall::handleId(stream)}) {
    call.args().u64(v);
  }
  return call.post();
}

template <EntryPointId kId>
CUresult memAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(kId);
  call.args().u64(bytes);
  call.args().u64(ClientCall::handleId(stream));
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  uint64_t p = reply.decoder().u64();
  CUresult r = reply.finish();
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

// Waits for the answer: freeing what the session does not own is refused at once.
template <EntryPointId kId>
CUresult memFreeAsync(CUdeviceptr p, CUstream stream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  ClientCall call(kId);
  call.args().u64(p);
  call.args().u64(ClientCall::handleId(stream));
  return resultOf(call);
}

// ---- pointer attributes ------------------------------------------------------------------
// phosd sends each value with its size (contexts already as virtual ids).
CUresult pointerGetAttributeImpl(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(EntryPointId::kCuPointerGetAttribute);
  call.args().u32(static_cast<uint32_t>(attribute));
  call.args().u64(ptr);
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  auto value = reply.decoder().blob();
  CUresult r = reply.finish();
  if (r == CUDA_SUCCESS) std::memcpy(data, value.data(), value.size());
  return r;
}

CUresult pointerGetAttributesImpl(unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == 0 || attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint32_t> ids(attributes, attributes + count);
  std::vector<uint8_t> wanted(count);
  for (unsigned i = 0; i < count; ++i) wanted[i] = data[i] != nullptr;
  ClientCall call(EntryPointId::kCuPointerGetAttributes);
  call.args().u64(ptr);
  call.args().u32(count);
  call.args().blob(ids.data(), ids.size() * sizeof(uint32_t));
  call.args().blob(wanted.data(), wanted.size());
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  std::vector<std::span<const std::byte>> values(count);
  for (auto& v : values) v = reply.decoder().blob();
  CUresult r = reply.finish();
  if (r != CUDA_SUCCESS) return r;
  for (unsigned i = 0; i < count; ++i) {
    if (data[i] != nullptr) std::memcpy(data[i], values[i].data(), values[i].size());
  }
  return CUDA_SUCCESS;
}

CUresult pointerSetAttributeImpl(const void* value, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(EntryPointId::kCuPointerSetAttribute);
  call.args().u32(static_cast<uint32_t>(attribute));
  call.args().u64(ptr);
  // Only CU_POINTER_ATTRIBUTE_SYNC_MEMOPS can be set; phosd refuses the rest.
  call.args().blob(value, attribute == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ? sizeof(unsigned int) : 0);
  return resultOf(call);
}

// ---- 2D and 3D copies --------------------------------------------------------------------
// The descriptor goes as it is; phosd places each side. The application waits
// for the answer: a side in its pageable memory is done when the call returns.
template <EntryPointId kId, typename Descriptor>
CUresult memcpyRows(const Descriptor* copy) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (copy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(kId);
  call.args().blob(copy, sizeof(Descriptor));
  return resultOf(call);
}

template <EntryPointId kId, typename Descriptor>
CUresult memcpyRowsAsync(const Descriptor* copy, CUstream stream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (copy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(kId);
  call.args().blob(copy, sizeof(Descriptor));
  call.args().u64(ClientCall::handleId(stream));
  return resultOf(call);
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
  ipc::hostCallWake(&slot->state);
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
    ipc::hostCallWait(&queue->doorbell, bell, std::chrono::seconds(1));
  }
}

// Maps the session's queue and starts its dispatcher, once per queue (a
// forked child attached to a new session gets a new one).
bool serveHostCallQueue(const std::string& path) {
  static std::mutex mutex;
  static std::string served;
  std::lock_guard lock(mutex);
  if (path == served) return true;
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    log::get("shim")->error("cannot open the host-call queue {}: {}", path, std::strerror(errno));
    return false;
  }
  void* p = mmap(nullptr, sizeof(ipc::HostCallQueue), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
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

CUresult hostCallReply(ClientCall& call) {
  ReplyReader reply = call.run();
  if (!reply.ok()) return reply.result();
  auto path = reply.decoder().blob();
  CUresult r = reply.finish();
  if (r != CUDA_SUCCESS) return r;
  // Enqueued already: a queue the shim cannot serve would block the stream forever.
  if (!serveHostCallQueue(std::string(reinterpret_cast<const char*>(path.data()), path.size()))) {
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  return CUDA_SUCCESS;
}

template <EntryPointId kId>
CUresult launchHostFunc(CUstream stream, CUhostFn fn, void* userData) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(kId);
  call.args().u64(ClientCall::handleId(stream));
  call.args().u64(reinterpret_cast<uintptr_t>(fn));
  call.args().u64(reinterpret_cast<uintptr_t>(userData));
  return hostCallReply(call);
}

template <EntryPointId kId>
CUresult streamAddCallback(CUstream stream, CUstreamCallback callback, void* userData, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  // "flags: Reserved for future use, must be 0".
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(kId);
  call.args().u64(ClientCall::handleId(stream));
  call.args().u64(reinterpret_cast<uintptr_t>(callback));
  call.args().u64(reinterpret_cast<uintptr_t>(userData));
  call.args().u32(flags);
  return hostCallReply(call);
}

// ---- events --------------------------------------------------------------------------
// Posted: the application does not wait. Flags are checked here, since CUDA
// reports them from the call itself.
template <EntryPointId kId>
CUresult eventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(kId);
  call.args().u64(ClientCall::handleId(event));
  call.args().u64(ClientCall::handleId(stream));
  call.args().u32(flags);
  return call.post();
}

template <EntryPointId kId>
CUresult streamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  ClientCall call(kId);
  call.args().u64(ClientCall::handleId(stream));
  call.args().u64(ClientCall::handleId(event));
  call.args().u32(flags);
  return call.post();
}

}  // namespace

void installCustom(cuda_api::Dispatch& t) {
  using E = EntryPointId;
  auto put = [&](E id, auto fn) { t.install(id, cuda_api::toSlot(fn)); };
#define INSTALL(id, symbol, fn)                                            \
  static_assert(std::is_same_v<decltype(&(fn)), decltype(&::symbol)>);    \
  put(E::id, &(fn))
  INSTALL(kCuInit, cuInit, initImpl);
  INSTALL(kCuDriverGetVersion, cuDriverGetVersion, driverGetVersionImpl);
  INSTALL(kCuGetErrorName, cuGetErrorName, getErrorNameImpl);
  INSTALL(kCuGetErrorString, cuGetErrorString, getErrorStringImpl);
  INSTALL(kCuGetExportTable, cuGetExportTable, getExportTableImpl);
  INSTALL(kCuGetProcAddress, cuGetProcAddress, getProcAddressV1Impl);
  INSTALL(kCuGetProcAddress_v2, cuGetProcAddress_v2, getProcAddressV2Impl);
  INSTALL(kCuCtxGetCurrent, cuCtxGetCurrent, ctxGetCurrentImpl);
  INSTALL(kCuCtxSetCurrent, cuCtxSetCurrent, ctxSetCurrentImpl);
  INSTALL(kCuCtxPushCurrent, cuCtxPushCurrent, ctxPushCurrentImpl);
  INSTALL(kCuCtxPushCurrent_v2, cuCtxPushCurrent_v2, ctxPushCurrentImpl);
  INSTALL(kCuCtxPopCurrent, cuCtxPopCurrent, ctxPopCurrentImpl);
  INSTALL(kCuCtxPopCurrent_v2, cuCtxPopCurrent_v2, ctxPopCurrentImpl);
  INSTALL(kCuCtxCreate, cuCtxCreate, ctxCreate);
  INSTALL(kCuCtxCreate_v2, cuCtxCreate_v2, ctxCreate);
  INSTALL(kCuCtxCreate_v3, cuCtxCreate_v3, ctxCreateV3Impl);
  INSTALL(kCuCtxCreate_v4, cuCtxCreate_v4, ctxCreateV4Impl);
  INSTALL(kCuCtxDestroy, cuCtxDestroy, ctxDestroyImpl);
  INSTALL(kCuCtxDestroy_v2, cuCtxDestroy_v2, ctxDestroyImpl);
  INSTALL(kCuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, primaryRetainImpl);
  INSTALL(kCuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, primaryByDevice<E::kCuDevicePrimaryCtxRelease_v2>);
  INSTALL(kCuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease_v2,
          primaryByDevice<E::kCuDevicePrimaryCtxRelease_v2>);
  INSTALL(kCuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, primaryByDevice<E::kCuDevicePrimaryCtxReset_v2>);
  INSTALL(kCuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset_v2, primaryByDevice<E::kCuDevicePrimaryCtxReset_v2>);
  INSTALL(kCuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags, primarySetFlagsImpl);
  INSTALL(kCuDevicePrimaryCtxSetFlags_v2, cuDevicePrimaryCtxSetFlags_v2, primarySetFlagsImpl);
  INSTALL(kCuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState, primaryGetStateImpl);
  INSTALL(kCuDeviceGetName, cuDeviceGetName, deviceString<E::kCuDeviceGetName>);
  INSTALL(kCuDeviceGetPCIBusId, cuDeviceGetPCIBusId, deviceString<E::kCuDeviceGetPCIBusId>);
  INSTALL(kCuFuncGetName, cuFuncGetName, (handleName<E::kCuFuncGetName, CUfunction>));
  INSTALL(kCuKernelGetName, cuKernelGetName, (handleName<E::kCuKernelGetName, CUkernel>));
  INSTALL(kCuModuleEnumerateFunctions, cuModuleEnumerateFunctions,
          (enumerateHandles<E::kCuModuleEnumerateFunctions, CUfunction, CUmodule>));
  INSTALL(kCuLibraryEnumerateKernels, cuLibraryEnumerateKernels,
          (enumerateHandles<E::kCuLibraryEnumerateKernels, CUkernel, CUlibrary>));
  INSTALL(kCuModuleGetGlobal_v2, cuModuleGetGlobal_v2, (getGlobal<E::kCuModuleGetGlobal_v2, CUmodule>));
  INSTALL(kCuLibraryGetGlobal, cuLibraryGetGlobal, (getGlobal<E::kCuLibraryGetGlobal, CUlibrary>));
  INSTALL(kCuModuleUnload, cuModuleUnload, (unloadImage<E::kCuModuleUnload, CUmodule>));
  INSTALL(kCuLibraryUnload, cuLibraryUnload, (unloadImage<E::kCuLibraryUnload, CUlibrary>));
  INSTALL(kCuOccupancyMaxPotentialBlockSize, cuOccupancyMaxPotentialBlockSize, occupancyMaxPotentialBlockSizeImpl);
  INSTALL(kCuOccupancyMaxPotentialBlockSizeWithFlags, cuOccupancyMaxPotentialBlockSizeWithFlags,
          occupancyMaxPotentialBlockSizeWithFlagsImpl);
  INSTALL(kCuModuleLoad, cuModuleLoad, moduleLoadImpl);
  INSTALL(kCuModuleLoadData, cuModuleLoadData, moduleLoadDataImpl);
  INSTALL(kCuModuleLoadDataEx, cuModuleLoadDataEx, moduleLoadDataExImpl);
  INSTALL(kCuModuleLoadFatBinary, cuModuleLoadFatBinary, moduleLoadFatBinaryImpl);
  INSTALL(kCuLibraryLoadData, cuLibraryLoadData, libraryLoadDataImpl);
  INSTALL(kCuLibraryLoadFromFile, cuLibraryLoadFromFile, libraryLoadFromFileImpl);
  INSTALL(kCuLaunchKernel, cuLaunchKernel, launchKernel<E::kCuLaunchKernel>);
  INSTALL(kCuLaunchKernel_ptsz, cuLaunchKernel_ptsz, launchKernel<E::kCuLaunchKernel_ptsz>);
  INSTALL(kCuLaunchCooperativeKernel, cuLaunchCooperativeKernel, launchCooperative<E::kCuLaunchCooperativeKernel>);
  INSTALL(kCuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel_ptsz,
          launchCooperative<E::kCuLaunchCooperativeKernel_ptsz>);
  INSTALL(kCuLaunchKernelEx, cuLaunchKernelEx, launchKernelEx<E::kCuLaunchKernelEx>);
  INSTALL(kCuLaunchKernelEx_ptsz, cuLaunchKernelEx_ptsz, launchKernelEx<E::kCuLaunchKernelEx_ptsz>);
  INSTALL(kCuMemAlloc_v2, cuMemAlloc_v2, memAllocImpl);
  INSTALL(kCuMemAllocPitch_v2, cuMemAllocPitch_v2, memAllocPitchImpl);
  INSTALL(kCuMemFree_v2, cuMemFree_v2, memFreeImpl);
  INSTALL(kCuMemHostAlloc, cuMemHostAlloc, memHostAllocImpl);
  INSTALL(kCuMemAllocHost_v2, cuMemAllocHost_v2, memAllocHostImpl);
  INSTALL(kCuMemFreeHost, cuMemFreeHost, memFreeHostImpl);
  INSTALL(kCuMemHostGetDevicePointer_v2, cuMemHostGetDevicePointer_v2, memHostGetDevicePointerImpl);
  INSTALL(kCuMemHostGetFlags, cuMemHostGetFlags, memHostGetFlagsImpl);
  INSTALL(kCuMemcpyHtoD_v2, cuMemcpyHtoD_v2, memcpyHtoD<E::kCuMemcpyHtoD_v2>);
  INSTALL(kCuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2_ptds, memcpyHtoD<E::kCuMemcpyHtoD_v2_ptds>);
  INSTALL(kCuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2, memcpyHtoDAsync<E::kCuMemcpyHtoDAsync_v2>);
  INSTALL(kCuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2_ptsz, memcpyHtoDAsync<E::kCuMemcpyHtoDAsync_v2_ptsz>);
  INSTALL(kCuMemcpyDtoH_v2, cuMemcpyDtoH_v2, memcpyDtoH<E::kCuMemcpyDtoH_v2>);
  INSTALL(kCuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2_ptds, memcpyDtoH<E::kCuMemcpyDtoH_v2_ptds>);
  INSTALL(kCuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2, memcpyDtoHAsync<E::kCuMemcpyDtoHAsync_v2>);
  INSTALL(kCuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2_ptsz, memcpyDtoHAsync<E::kCuMemcpyDtoHAsync_v2_ptsz>);
  INSTALL(kCuMemcpy, cuMemcpy, memcpySync<E::kCuMemcpy>);
  INSTALL(kCuMemcpy_ptds, cuMemcpy_ptds, memcpySync<E::kCuMemcpy_ptds>);
  INSTALL(kCuMemcpyDtoD_v2, cuMemcpyDtoD_v2, memcpySync<E::kCuMemcpyDtoD_v2>);
  INSTALL(kCuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2_ptds, memcpySync<E::kCuMemcpyDtoD_v2_ptds>);
  INSTALL(kCuMemcpyAsync, cuMemcpyAsync, (memcpyAsync<E::kCuMemcpyAsync, false>));
  INSTALL(kCuMemcpyAsync_ptsz, cuMemcpyAsync_ptsz, (memcpyAsync<E::kCuMemcpyAsync_ptsz, false>));
  INSTALL(kCuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2, (memcpyAsync<E::kCuMemcpyDtoDAsync_v2, true>));
  INSTALL(kCuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2_ptsz, (memcpyAsync<E::kCuMemcpyDtoDAsync_v2_ptsz, true>));
  INSTALL(kCuMemsetD8_v2, cuMemsetD8_v2, (memset<E::kCuMemsetD8_v2, unsigned char>));
  INSTALL(kCuMemsetD8_v2_ptds, cuMemsetD8_v2_ptds, (memset<E::kCuMemsetD8_v2_ptds, unsigned char>));
  INSTALL(kCuMemsetD16_v2, cuMemsetD16_v2, (memset<E::kCuMemsetD16_v2, unsigned short>));
  INSTALL(kCuMemsetD16_v2_ptds, cuMemsetD16_v2_ptds, (memset<E::kCuMemsetD16_v2_ptds, unsigned short>));
  INSTALL(kCuMemsetD32_v2, cuMemsetD32_v2, (memset<E::kCuMemsetD32_v2, unsigned int>));
  INSTALL(kCuMemsetD32_v2_ptds, cuMemsetD32_v2_ptds, (memset<E::kCuMemsetD32_v2_ptds, unsigned int>));
  INSTALL(kCuMemsetD8Async, cuMemsetD8Async, (memsetAsync<E::kCuMemsetD8Async, unsigned char>));
  INSTALL(kCuMemsetD8Async_ptsz, cuMemsetD8Async_ptsz, (memsetAsync<E::kCuMemsetD8Async_ptsz, unsigned char>));
  INSTALL(kCuMemsetD16Async, cuMemsetD16Async, (memsetAsync<E::kCuMemsetD16Async, unsigned short>));
  INSTALL(kCuMemsetD16Async_ptsz, cuMemsetD16Async_ptsz, (memsetAsync<E::kCuMemsetD16Async_ptsz, unsigned short>));
  INSTALL(kCuMemsetD32Async, cuMemsetD32Async, (memsetAsync<E::kCuMemsetD32Async, unsigned int>));
  INSTALL(kCuMemsetD32Async_ptsz, cuMemsetD32Async_ptsz, (memsetAsync<E::kCuMemsetD32Async_ptsz, unsigned int>));
  INSTALL(kCuMemsetD2D8_v2, cuMemsetD2D8_v2, (memset2D<E::kCuMemsetD2D8_v2, unsigned char>));
  INSTALL(kCuMemsetD2D8_v2_ptds, cuMemsetD2D8_v2_ptds, (memset2D<E::kCuMemsetD2D8_v2_ptds, unsigned char>));
  INSTALL(kCuMemsetD2D16_v2, cuMemsetD2D16_v2, (memset2D<E::kCuMemsetD2D16_v2, unsigned short>));
  INSTALL(kCuMemsetD2D16_v2_ptds, cuMemsetD2D16_v2_ptds, (memset2D<E::kCuMemsetD2D16_v2_ptds, unsigned short>));
  INSTALL(kCuMemsetD2D32_v2, cuMemsetD2D32_v2, (memset2D<E::kCuMemsetD2D32_v2, unsigned int>));
  INSTALL(kCuMemsetD2D32_v2_ptds, cuMemsetD2D32_v2_ptds, (memset2D<E::kCuMemsetD2D32_v2_ptds, unsigned int>));
  INSTALL(kCuMemsetD2D8Async, cuMemsetD2D8Async, (memset2DAsync<E::kCuMemsetD2D8Async, unsigned char>));
  INSTALL(kCuMemsetD2D8Async_ptsz, cuMemsetD2D8Async_ptsz, (memset2DAsync<E::kCuMemsetD2D8Async_ptsz, unsigned char>));
  INSTALL(kCuMemsetD2D16Async, cuMemsetD2D16Async, (memset2DAsync<E::kCuMemsetD2D16Async, unsigned short>));
  INSTALL(kCuMemsetD2D16Async_ptsz, cuMemsetD2D16Async_ptsz,
          (memset2DAsync<E::kCuMemsetD2D16Async_ptsz, unsigned short>));
  INSTALL(kCuMemsetD2D32Async, cuMemsetD2D32Async, (memset2DAsync<E::kCuMemsetD2D32Async, unsigned int>));
  INSTALL(kCuMemsetD2D32Async_ptsz, cuMemsetD2D32Async_ptsz,
          (memset2DAsync<E::kCuMemsetD2D32Async_ptsz, unsigned int>));
  INSTALL(kCuMemcpyPeer, cuMemcpyPeer, memcpyPeer<E::kCuMemcpyPeer>);
  INSTALL(kCuMemcpyPeer_ptds, cuMemcpyPeer_ptds, memcpyPeer<E::kCuMemcpyPeer_ptds>);
  INSTALL(kCuMemcpyPeerAsync, cuMemcpyPeerAsync, memcpyPeerAsync<E::kCuMemcpyPeerAsync>);
  INSTALL(kCuMemcpyPeerAsync_ptsz, cuMemcpyPeerAsync_ptsz, memcpyPeerAsync<E::kCuMemcpyPeerAsync_ptsz>);
  INSTALL(kCuMemAllocAsync, cuMemAllocAsync, memAllocAsync<E::kCuMemAllocAsync>);
  INSTALL(kCuMemAllocAsync_ptsz, cuMemAllocAsync_ptsz, memAllocAsync<E::kCuMemAllocAsync_ptsz>);
  INSTALL(kCuMemFreeAsync, cuMemFreeAsync, memFreeAsync<E::kCuMemFreeAsync>);
  INSTALL(kCuMemFreeAsync_ptsz, cuMemFreeAsync_ptsz, memFreeAsync<E::kCuMemFreeAsync_ptsz>);
  INSTALL(kCuPointerGetAttribute, cuPointerGetAttribute, pointerGetAttributeImpl);
  INSTALL(kCuPointerGetAttributes, cuPointerGetAttributes, pointerGetAttributesImpl);
  INSTALL(kCuPointerSetAttribute, cuPointerSetAttribute, pointerSetAttributeImpl);
  INSTALL(kCuMemcpy2D_v2, cuMemcpy2D_v2, (memcpyRows<E::kCuMemcpy2D_v2, CUDA_MEMCPY2D>));
  INSTALL(kCuMemcpy2D_v2_ptds, cuMemcpy2D_v2_ptds, (memcpyRows<E::kCuMemcpy2D_v2_ptds, CUDA_MEMCPY2D>));
  INSTALL(kCuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2, (memcpyRows<E::kCuMemcpy2DUnaligned_v2, CUDA_MEMCPY2D>));
  INSTALL(kCuMemcpy2DUnaligned_v2_ptds, cuMemcpy2DUnaligned_v2_ptds,
          (memcpyRows<E::kCuMemcpy2DUnaligned_v2_ptds, CUDA_MEMCPY2D>));
  INSTALL(kCuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2, (memcpyRowsAsync<E::kCuMemcpy2DAsync_v2, CUDA_MEMCPY2D>));
  INSTALL(kCuMemcpy2DAsync_v2_ptsz, cuMemcpy2DAsync_v2_ptsz,
          (memcpyRowsAsync<E::kCuMemcpy2DAsync_v2_ptsz, CUDA_MEMCPY2D>));
  INSTALL(kCuMemcpy3D_v2, cuMemcpy3D_v2, (memcpyRows<E::kCuMemcpy3D_v2, CUDA_MEMCPY3D>));
  INSTALL(kCuMemcpy3D_v2_ptds, cuMemcpy3D_v2_ptds, (memcpyRows<E::kCuMemcpy3D_v2_ptds, CUDA_MEMCPY3D>));
  INSTALL(kCuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2, (memcpyRowsAsync<E::kCuMemcpy3DAsync_v2, CUDA_MEMCPY3D>));
  INSTALL(kCuMemcpy3DAsync_v2_ptsz, cuMemcpy3DAsync_v2_ptsz,
          (memcpyRowsAsync<E::kCuMemcpy3DAsync_v2_ptsz, CUDA_MEMCPY3D>));
  INSTALL(kCuLaunchHostFunc, cuLaunchHostFunc, launchHostFunc<E::kCuLaunchHostFunc>);
  INSTALL(kCuLaunchHostFunc_ptsz, cuLaunchHostFunc_ptsz, launchHostFunc<E::kCuLaunchHostFunc_ptsz>);
  INSTALL(kCuStreamAddCallback, cuStreamAddCallback, streamAddCallback<E::kCuStreamAddCallback>);
  INSTALL(kCuStreamAddCallback_ptsz, cuStreamAddCallback_ptsz, streamAddCallback<E::kCuStreamAddCallback_ptsz>);
  INSTALL(kCuEventRecordWithFlags, cuEventRecordWithFlags, eventRecordWithFlags<E::kCuEventRecordWithFlags>);
  INSTALL(kCuEventRecordWithFlags_ptsz, cuEventRecordWithFlags_ptsz,
          eventRecordWithFlags<E::kCuEventRecordWithFlags_ptsz>);
  INSTALL(kCuStreamWaitEvent, cuStreamWaitEvent, streamWaitEvent<E::kCuStreamWaitEvent>);
  INSTALL(kCuStreamWaitEvent_ptsz, cuStreamWaitEvent_ptsz, streamWaitEvent<E::kCuStreamWaitEvent_ptsz>);
#undef INSTALL
}

}  // namespace phos::shim
