// SPDX-License-Identifier: Apache-2.0
// The process's dispatch table and the default "not supported" implementation of every entry point.
#include "phos/cuda_api/dispatch.h"

#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"

namespace phos::cuda_api {
namespace {

constinit Dispatch gDispatch;
// One flag per entry point: the first unsupported call logs, later ones do not.
constinit std::atomic<bool> gReported[kEntryPointCount]{};

}  // namespace

Dispatch& dispatch() { return gDispatch; }

CUresult notSupported(EntryPointId id) {
  auto index = static_cast<std::size_t>(id);
  if (index < kEntryPointCount && !gReported[index].exchange(true, std::memory_order_relaxed)) {
    log::get("shim")->warn("{} is not supported by PhOS yet: returning CUDA_ERROR_NOT_SUPPORTED",
                           entryPoint(id).symbol);
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace phos::cuda_api
