// SPDX-License-Identifier: Apache-2.0
// CUresult <-> Status mapping and the generated CUresult name table.
#include "cu_status.h"

#include <algorithm>
#include <array>


namespace phos::vgpu {
namespace {

struct ErrorRow {
  int value;
  const char* name;
  const char* description;
};

constexpr ErrorRow kErrors[] = {
#include "cu_error_table.inc"
};

const ErrorRow* findRow(int value) {
  for (const ErrorRow& row : kErrors) {
    if (row.value == value) return &row;
  }
  return nullptr;
}

Code codeFor(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS: return Code::kOk;
    case CUDA_ERROR_INVALID_VALUE: return Code::kInvalidArgument;
    case CUDA_ERROR_OUT_OF_MEMORY: return Code::kResourceExhausted;
    case CUDA_ERROR_NOT_FOUND: return Code::kNotFound;
    case CUDA_ERROR_NOT_SUPPORTED: return Code::kNotSupported;
    case CUDA_ERROR_NOT_READY: return Code::kUnavailable;
    case CUDA_ERROR_FILE_NOT_FOUND: return Code::kNotFound;
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return Code::kAlreadyExists;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: return Code::kAlreadyExists;
    default: return Code::kFailedPrecondition;
  }
}

}  // namespace

Status cuError(CUresult result, std::string_view message) {
  const char* name = cuResultName(result);
  return Status(codeFor(result),
                fmt::format("{}: {}", name != nullptr ? name : "CUDA_ERROR_UNKNOWN", message));
}

CUresult toCuResult(const Status& status) {
  if (status.isOk()) return CUDA_SUCCESS;
  std::string_view message = status.message();
  // The CUresult name may sit behind contexts added on the way up ("load: CUDA_ERROR_...").
  if (auto pos = message.find("CUDA_ERROR_"); pos != std::string_view::npos) {
    std::string_view rest = message.substr(pos);
    std::string_view name = rest.substr(0, rest.find(':'));
    for (const ErrorRow& row : kErrors) {
      if (name == row.name) return static_cast<CUresult>(row.value);
    }
  }
  switch (status.code()) {
    case Code::kInvalidArgument: return CUDA_ERROR_INVALID_VALUE;
    case Code::kOutOfRange: return CUDA_ERROR_INVALID_VALUE;
    case Code::kResourceExhausted: return CUDA_ERROR_OUT_OF_MEMORY;
    case Code::kNotFound: return CUDA_ERROR_NOT_FOUND;
    case Code::kNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    case Code::kAlreadyExists: return CUDA_ERROR_INVALID_VALUE;
    case Code::kIo: return CUDA_ERROR_OPERATING_SYSTEM;
    default: return CUDA_ERROR_UNKNOWN;
  }
}

const char* cuResultName(CUresult result) {
  const ErrorRow* row = findRow(static_cast<int>(result));
  return row != nullptr ? row->name : nullptr;
}

const char* cuResultDescription(CUresult result) {
  const ErrorRow* row = findRow(static_cast<int>(result));
  return row != nullptr ? row->description : nullptr;
}

bool isStickyError(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
      return true;
    default:
      return false;
  }
}

}  // namespace phos::vgpu
