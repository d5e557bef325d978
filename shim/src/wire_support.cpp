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
  module_image::Extent e;
  if (CUresult r = imageExtent(keep->data.data(), &e); r != CUDA_SUCCESS) return r;
  *out = {reinterpret_cast<uintptr_t>(e.data), std::min(e.bytes, keep->data.size())};
  return CUDA_SUCCESS;
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
