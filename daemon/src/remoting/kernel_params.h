// SPDX-License-Identifier: Apache-2.0
// A launch's kernel parameters in phosd (launches.cpp), and a kernel node's
// (graphs.cpp): as the driver takes them, and checked against the kernel's
// signature before the driver reads them.
#pragma once

#include <cuda.h>

#include <span>
#include <vector>

#include "phos/common/ipc/wire_codec.h"
#include "phos/cuda_api/api_table.h"
#include "session/server_call.h"

namespace phos::daemon::hooks {

// Kernel parameters as the driver takes them: pointers into the request (it
// lives until the call is finished), or one `extra` buffer.
struct KernelParams {
  std::vector<void*> pointers;
  std::vector<size_t> sizes;  // of each pointed-to parameter
  std::vector<std::byte> buffer;
  size_t bufferSize = 0;
  void* extra[5] = {};
  bool useExtra = false;

  explicit KernelParams(const ipc::KernelArgs& args) {
    if (args.useExtra) {
      const auto& blob = args.decoded.front();
      buffer.assign(blob.begin(), blob.end());
      bufferSize = buffer.size();
      extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
      extra[1] = buffer.data();
      extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
      extra[3] = &bufferSize;
      extra[4] = CU_LAUNCH_PARAM_END;
      useExtra = true;
      return;
    }
    pointers.reserve(args.decoded.size());
    sizes.reserve(args.decoded.size());
    for (const auto& blob : args.decoded) {
      pointers.push_back(const_cast<std::byte*>(blob.data()));
      sizes.push_back(blob.size());
    }
  }
  void** kernelParams() { return useExtra ? nullptr : pointers.data(); }
  void** extraArgs() { return useExtra ? extra : nullptr; }
  std::span<const std::byte> extraBuffer() const {
    return useExtra ? std::span<const std::byte>(buffer) : std::span<const std::byte>{};
  }
};

// The driver reads kernelParams[i] for every parameter the kernel declares,
// sizeof(parameter i) bytes each: a client that sends fewer parameters, or
// shorter ones, would make it read past what phosd holds. The parameters must
// be exactly the kernel's (as libphos.so sends them, from cuFuncGetParamInfo).
// The `extra` buffer needs no check: the driver is given its true size.
inline CUresult checkParams(ServerCall& c, CUfunction f, const KernelParams& params) {
  if (params.useExtra) return CUDA_SUCCESS;
  if (!c.driverTable().has(cuda_api::EntryPointId::kCuFuncGetParamInfo)) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const auto paramInfo = PHOS_DRIVER(c.driverTable(), FuncGetParamInfo);
  for (size_t i = 0; i <= params.sizes.size(); ++i) {
    size_t offset = 0;
    size_t size = 0;
    // Past the last parameter the driver answers CUDA_ERROR_INVALID_VALUE.
    CUresult r = paramInfo(f, i, &offset, &size);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) return r;
    const bool declared = r == CUDA_SUCCESS;
    const bool sent = i < params.sizes.size();
    if (declared != sent || (sent && size != params.sizes[i])) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

}  // namespace phos::daemon::hooks
