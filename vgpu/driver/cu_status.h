// SPDX-License-Identifier: Apache-2.0
// Carrying a precise CUresult inside a phos::Status, and the CUresult name/description table.
#pragma once

#include <string>
#include <string_view>

#include <cuda.h>
#include <fmt/format.h>

#include "phos/common/status.h"

namespace phos::vgpu {

// A Status for `result`: its Code is the closest canonical code and its message
// starts with the CUresult's name ("CUDA_ERROR_INVALID_CONTEXT: context 0x.. was
// destroyed"), which toCuResult() reads back. Plain Statuses from elsewhere map by
// their Code.
Status cuError(CUresult result, std::string_view message);

template <typename... Args>
Status cuErrorf(CUresult result, fmt::format_string<Args...> f, Args&&... args) {
  return cuError(result, fmt::format(f, std::forward<Args>(args)...));
}

CUresult toCuResult(const Status& status);

// "CUDA_ERROR_INVALID_VALUE" and the first sentence of cuda.h's description; null
// for a value cuda.h does not define.
const char* cuResultName(CUresult result);
const char* cuResultDescription(CUresult result);

// Errors after which a context is unusable ("the process must terminate and relaunch").
bool isStickyError(CUresult result);

}  // namespace phos::vgpu
