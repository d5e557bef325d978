// SPDX-License-Identifier: Apache-2.0
// The shim's side of the wire encodings that need its state (wire_support.h).
#include "wire_support.h"

#include <fstream>
#include <iterator>

#include "api_trace.h"
#include "client_call.h"
#include "connection.h"
#include "phos/common/log.h"
#include "phos/common/module_image.h"

namespace phos::shim {
namespace {

Connection& conn() { return Connection::instance(); }

// A module image's extent, or the CUresult a driver gives for such an image.
CUresult imageExtent(const void* image, module_image::Extent* out) {
  auto e = module_image::extent(image);
  if (!e.isOk()) {
    log::get("shim")->debug("module image: {}", e.status().message());
    return e.status().code() == Code::kInvalidArgument ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_IMAGE;
  }
  *out = *e;
  return CUDA_SUCCESS;
}

// CUDA reports an uninitialized driver before looking at the arguments.
bool initialized() { return conn().connected(); }

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
  trace::InternalCalls internal;
  for (size_t i = 0; i < ipc::KernelArgs::kMaxParams; ++i) {
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

}  // namespace

CUresult imageRef(const void* image, ipc::ImageRef* out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  module_image::Extent e;
  if (CUresult r = imageExtent(image, &e); r != CUDA_SUCCESS) return r;
  *out = {reinterpret_cast<uintptr_t>(e.data), e.bytes};
  return CUDA_SUCCESS;
}

CUresult readImageFile(const char* path, ImageFile* keep, ipc::ImageRef* out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::ifstream in(path, std::ios::binary);
  if (!in) return CUDA_ERROR_FILE_NOT_FOUND;
  keep->data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  keep->data.push_back('\0');  // PTX files are text without a terminator
  // A file in a format the shim cannot size (a linker input: an archive, an
  // object, LTO-IR) goes whole: the driver judges it.
  module_image::Extent e;
  if (imageExtent(keep->data.data(), &e) != CUDA_SUCCESS) {
    *out = {reinterpret_cast<uintptr_t>(keep->data.data()), keep->data.size() - 1};
    return keep->data.size() > 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
  }
  *out = {reinterpret_cast<uintptr_t>(e.data), std::min(e.bytes, keep->data.size())};
  return CUDA_SUCCESS;
}

CUresult encodeJitOptions(unsigned count, const CUjit_option* options, void* const* values,
                          JitOptionArrays* keep, ipc::JitOptions* out) {
  if (count == 0) return CUDA_SUCCESS;
  if (options == nullptr || values == nullptr || count > ipc::kMaxJitOptions)
    return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    uint64_t value = 0;
    switch (ipc::jitValue(options[i])) {
      case ipc::JitValue::kScalar:
      case ipc::JitValue::kOutput:
        std::memcpy(&value, &values[i], sizeof(values[i]));
        break;
      case ipc::JitValue::kInfoLog:
      case ipc::JitValue::kErrorLog:
        break;  // phosd lends the driver its own buffers
      case ipc::JitValue::kPointer:
        log::get("shim")->error("JIT option {} (arrays of names or addresses) is not remoted yet",
                                static_cast<int>(options[i]));
        return CUDA_ERROR_NOT_SUPPORTED;
      case ipc::JitValue::kUnknown:
        return CUDA_ERROR_INVALID_VALUE;
    }
    keep->options.push_back(options[i]);
    keep->values.push_back(value);
  }
  out->options = ipc::Blob::of(keep->options.data(), keep->options.size() * sizeof(int32_t));
  out->values = ipc::Blob::of(keep->values.data(), keep->values.size() * sizeof(uint64_t));
  return CUDA_SUCCESS;
}

void applyJitOutputs(const ipc::JitOutputs& outputs, unsigned count, const CUjit_option* options,
                     void** values) {
  std::vector<uint64_t> after;
  if (count == 0 || options == nullptr || values == nullptr ||
      !outputs.values.copyTo(&after, count))
    return;
  auto capacity = [&](CUjit_option sizeOption) -> size_t {
    for (unsigned i = 0; i < count; ++i) {
      if (options[i] == sizeOption)
        return static_cast<size_t>(reinterpret_cast<uintptr_t>(values[i]) & 0xffffffffu);
    }
    return 0;
  };
  // The logs first: their capacities are the sizes' values before the call.
  for (unsigned i = 0; i < count; ++i) {
    const ipc::JitValue kind = ipc::jitValue(options[i]);
    if (kind != ipc::JitValue::kInfoLog && kind != ipc::JitValue::kErrorLog) continue;
    const size_t room =
        capacity(kind == ipc::JitValue::kInfoLog ? CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES
                                                 : CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
    copyString(kind == ipc::JitValue::kInfoLog ? outputs.infoLog : outputs.errorLog,
               static_cast<char*>(values[i]), static_cast<int>(room));
  }
  for (unsigned i = 0; i < count; ++i) {
    if (ipc::jitValue(options[i]) != ipc::JitValue::kOutput) continue;
    uint64_t value = after[i];
    // The driver filled phosd's buffer, which may be smaller than the program's.
    if (options[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ||
        options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
      value = std::min<uint64_t>(value, capacity(options[i]));
    }
    std::memcpy(&values[i], &value, sizeof(values[i]));
  }
}

CUresult kernelArgs(CUfunction f, void** kernelParams, void** extra, KernelArgBuffer* keep, ipc::KernelArgs* out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
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
    out->useExtra = true;
    out->buffer = buffer;
    out->bufferBytes = bytes;
    return CUDA_SUCCESS;
  }
  // Asking for the sizes is a call of its own, before the launch's.
  if (CUresult r = paramSizes(f, &keep->sizes); r != CUDA_SUCCESS) return r;
  if (!keep->sizes.empty() && kernelParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  out->useExtra = false;
  out->count = static_cast<uint32_t>(keep->sizes.size());
  out->sizes = keep->sizes.data();
  out->params = kernelParams;
  return CUDA_SUCCESS;
}

namespace {

template <typename Params>
void kernelNodeGeometry(const Params& p, ipc::KernelNode* out) {
  out->present = true;
  out->function = ClientCall::handleId(p.func);
  out->gridDimX = p.gridDimX;
  out->gridDimY = p.gridDimY;
  out->gridDimZ = p.gridDimZ;
  out->blockDimX = p.blockDimX;
  out->blockDimY = p.blockDimY;
  out->blockDimZ = p.blockDimZ;
  out->sharedMemBytes = p.sharedMemBytes;
}

}  // namespace

CUresult kernelNode(const CUDA_KERNEL_NODE_PARAMS_v1* params, KernelArgBuffer* keep,
                    ipc::KernelNode* out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (params == nullptr) return CUDA_SUCCESS;  // phosd answers as CUDA does
  kernelNodeGeometry(*params, out);
  return kernelArgs(params->func, params->kernelParams, params->extra, keep, &out->args);
}

CUresult kernelNode(const CUDA_KERNEL_NODE_PARAMS* params, KernelArgBuffer* keep,
                    ipc::KernelNode* out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (params == nullptr) return CUDA_SUCCESS;
  kernelNodeGeometry(*params, out);
  // "kern: ... only referenced if func is NULL"; the driver keeps both.
  out->kernel = ClientCall::handleId(params->kern);
  out->context = ClientCall::handleId(params->ctx);
  CUfunction sized =
      params->func != nullptr ? params->func : reinterpret_cast<CUfunction>(params->kern);
  if (sized == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return kernelArgs(sized, params->kernelParams, params->extra, keep, &out->args);
}

CUresult launchConfig(const CUlaunchConfig* config, ipc::LaunchConfig* out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
  out->gridDimX = config->gridDimX;
  out->gridDimY = config->gridDimY;
  out->gridDimZ = config->gridDimZ;
  out->blockDimX = config->blockDimX;
  out->blockDimY = config->blockDimY;
  out->blockDimZ = config->blockDimZ;
  out->sharedMemBytes = config->sharedMemBytes;
  out->stream = ClientCall::handleId(config->hStream);
  out->attributes = ipc::Blob::of(config->attrs, sizeof(CUlaunchAttribute) * config->numAttrs);
  return CUDA_SUCCESS;
}

void wantedFlags(void** data, unsigned count, std::vector<uint8_t>* out) {
  out->assign(count, 0);
  if (data == nullptr) return;
  for (unsigned i = 0; i < count; ++i) (*out)[i] = data[i] != nullptr;
}

void copyValues(const ipc::BlobList& values, void** data, unsigned count) {
  if (data == nullptr) return;
  for (unsigned i = 0; i < count && i < values.items.size(); ++i) {
    if (data[i] != nullptr) std::memcpy(data[i], values.items[i].bytes.data(), values.items[i].size());
  }
}

void copyString(const ipc::Text& text, char* out, int capacity) {
  if (out == nullptr || capacity <= 0) return;
  const size_t n = std::min<size_t>(text.size, static_cast<size_t>(capacity - 1));
  if (n != 0) std::memcpy(out, text.data, n);
  out[n] = '\0';
}

const char* intern(std::string_view text) { return conn().intern(text); }

}  // namespace phos::shim
