// SPDX-License-Identifier: Apache-2.0
// The shim's side of the wire encodings that need more than the argument
// itself (apigen/remoting.json: image, file_image, kernel_params,
// launch_config, out arrays and strings): the generated calls of
// remote_client.cpp use them to fill requests and apply replies.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "phos/common/ipc/jit_options.h"
#include "phos/common/ipc/value_sizes.h"
#include "phos/common/ipc/wire_codec.h"

namespace phos::shim {

// A module image in this process: its address and size from its format.
// CUDA_ERROR_INVALID_VALUE for NULL, CUDA_ERROR_INVALID_IMAGE for an image
// whose size cannot be told.
CUresult imageRef(const void* image, ipc::ImageRef* out);

// A module image read from a file into `keep` (which outlives the call).
struct ImageFile {
  std::vector<char> data;
};
CUresult readImageFile(const char* path, ImageFile* keep, ipc::ImageRef* out);

// A launch's parameters, sized by the function's signature
// (cuFuncGetParamInfo, asked once per function), or its `extra` buffer.
struct KernelArgBuffer {
  std::vector<uint32_t> sizes;
};
CUresult kernelArgs(CUfunction f, void** kernelParams, void** extra, KernelArgBuffer* keep, ipc::KernelArgs* out);

CUresult launchConfig(const CUlaunchConfig* config, ipc::LaunchConfig* out);

// A kernel node's parameters: the function (or the library kernel and its
// context) as handle ids, its arguments as a launch's (kernelArgs).
CUresult kernelNode(const CUDA_KERNEL_NODE_PARAMS_v1* params, KernelArgBuffer* keep,
                    ipc::KernelNode* out);
CUresult kernelNode(const CUDA_KERNEL_NODE_PARAMS* params, KernelArgBuffer* keep,
                    ipc::KernelNode* out);

// An array of `count` handles as their ids (kept in `ids`); empty for NULL.
template <typename H>
ipc::Blob handleIds(const H* handles, size_t count, std::vector<uint64_t>* ids) {
  if (handles == nullptr) return {};
  ids->resize(count);
  for (size_t i = 0; i < count; ++i) ids->at(i) = reinterpret_cast<uintptr_t>(handles[i]);
  return ipc::Blob::of(ids->data(), ids->size() * sizeof(uint64_t));
}

// JIT options (phos/common/ipc/jit_options.h): the scalars as they are, the
// logs as their capacities. CUDA_ERROR_INVALID_VALUE for missing arrays or
// an option cuda.h lacks; CUDA_ERROR_NOT_SUPPORTED, with a line naming it,
// for options that point to arrays of names (not remoted).
struct JitOptionArrays {
  std::vector<int32_t> options;
  std::vector<uint64_t> values;
};
CUresult encodeJitOptions(unsigned count, const CUjit_option* options, void* const* values,
                          JitOptionArrays* keep, ipc::JitOptions* out);
// What the driver wrote back, into the program's values and log buffers
// (each log cut to its buffer, terminated). Nothing when the driver never ran.
void applyJitOutputs(const ipc::JitOutputs& outputs, unsigned count, const CUjit_option* options,
                     void** values);

// One byte per slot of a batch of outputs: 1 where the application wants a value.
void wantedFlags(void** data, unsigned count, std::vector<uint8_t>* out);
// Values of a batch into the application's slots.
void copyValues(const ipc::BlobList& values, void** data, unsigned count);

// An out array: at most `capacity` elements.
template <typename T, typename N>
void copyArray(const ipc::Blob& items, T* out, N capacity) {
  if (out == nullptr || capacity <= 0) return;
  const size_t n = std::min<size_t>(items.size() / sizeof(T), static_cast<size_t>(capacity));
  if (n != 0) std::memcpy(out, items.bytes.data(), n * sizeof(T));
}
// An out array of handles: virtual ids become the handles the application holds.
template <typename H, typename N>
void copyHandles(const ipc::Blob& ids, H* out, N capacity) {
  if (out == nullptr || capacity <= 0) return;
  const size_t n = std::min<size_t>(ids.size() / sizeof(uint64_t), static_cast<size_t>(capacity));
  for (size_t i = 0; i < n; ++i) {
    uint64_t id = 0;
    std::memcpy(&id, ids.bytes.data() + i * sizeof(id), sizeof(id));
    out[i] = reinterpret_cast<H>(id);
  }
}
// A list whose count the driver updated (cuGraphGetNodes): the handles
// phosd sent, and NULL in the rest of the application's `capacity` entries.
template <typename H>
void copyHandleList(const ipc::Blob& ids, H* out, size_t capacity) {
  if (out == nullptr) return;
  copyHandles(ids, out, capacity);
  for (size_t i = std::min(ids.size() / sizeof(uint64_t), capacity); i < capacity; ++i)
    out[i] = nullptr;
}
// A string into a buffer of `capacity` bytes, always terminated.
void copyString(const ipc::Text& text, char* out, int capacity);

// A string that lives as long as the process (cuFuncGetName's answer).
const char* intern(std::string_view text);

}  // namespace phos::shim
