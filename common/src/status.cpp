// SPDX-License-Identifier: Apache-2.0
// Status formatting and the errno helper.
#include "phos/common/status.h"

#include <cerrno>
#include <cstring>

namespace phos {

std::string_view codeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kAlreadyExists: return "ALREADY_EXISTS";
    case Code::kOutOfRange: return "OUT_OF_RANGE";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kDataLoss: return "DATA_LOSS";
    case Code::kNotSupported: return "NOT_SUPPORTED";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
    case Code::kIo: return "IO";
    case Code::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string_view wireCode(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid-argument";
    case Code::kNotFound: return "not-found";
    case Code::kAlreadyExists: return "already-exists";
    case Code::kOutOfRange: return "out-of-range";
    case Code::kResourceExhausted: return "resource-exhausted";
    case Code::kFailedPrecondition: return "failed-precondition";
    case Code::kUnavailable: return "unavailable";
    case Code::kDataLoss: return "data-loss";
    case Code::kNotSupported: return "not-supported";
    case Code::kPermissionDenied: return "permission";
    case Code::kIo: return "io";
    case Code::kInternal: return "internal";
  }
  return "internal";
}

Status Status::withContext(std::string_view context) const& {
  Status copy = *this;
  return std::move(copy).withContext(context);
}

Status Status::withContext(std::string_view context) && {
  if (isOk()) return *this;
  message_ = fmt::format("{}: {}", context, message_);
  return std::move(*this);
}

std::string Status::toString() const {
  if (isOk()) return "OK";
  return fmt::format("{}: {}", codeName(code_), message_);
}

Status errnoError(int errnum, std::string_view what) {
  Code code = Code::kIo;
  switch (errnum) {
    case ENOENT: code = Code::kNotFound; break;
    case EEXIST: code = Code::kAlreadyExists; break;
    case EACCES:
    case EPERM: code = Code::kPermissionDenied; break;
    case ENOMEM:
    case ENOSPC: code = Code::kResourceExhausted; break;
    case EINVAL: code = Code::kInvalidArgument; break;
    default: break;
  }
  return Status(code, fmt::format("{}: {}", what, std::strerror(errnum)));
}

}  // namespace phos
