// SPDX-License-Identifier: Apache-2.0
// Status and Result<T>: how PhOS code reports failure without exceptions.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace phos {

// Canonical error codes. Pick the most specific one: callers branch on them
// (the C ABI boundaries map them to CUresult, the CLI to exit codes).
enum class Code {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed
  kNotFound,            // a named thing does not exist
  kAlreadyExists,
  kOutOfRange,          // an index/offset/size outside what exists
  kResourceExhausted,   // memory, reserve or quota used up
  kFailedPrecondition,  // the system is not in a state where this works
  kUnavailable,         // a peer (daemon, host) cannot be reached
  kDataLoss,            // stored data is damaged (checksum, truncation)
  kNotSupported,        // a valid request this build does not implement
  kPermissionDenied,
  kIo,                  // an OS call failed; the message carries errno text
  kInternal,            // a broken invariant: a bug in PhOS
};

std::string_view codeName(Code code);

// The code as phosd's answers spell it ("code" in docs/remoting.md):
// lowercase words joined by '-', e.g. "not-found", "data-loss".
std::string_view wireCode(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool isOk() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "context: message", used while an error travels up the stack.
  Status withContext(std::string_view context) const&;
  Status withContext(std::string_view context) &&;

  // "NOT_FOUND: no kernel named 'saxpy' in module 3"
  std::string toString() const;

  friend bool operator==(const Status&, const Status&) = default;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Convenience constructors; the message is a fmt format string.
template <typename... Args>
Status makeError(Code code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
// An OS call failed: the message ends with strerror(errnum).
Status errnoError(int errnum, std::string_view what);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).isOk() && "Result built from an OK status");
  }

  bool isOk() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return isOk(); }

  Status status() const& { return isOk() ? Status() : std::get<Status>(v_); }
  Status status() && { return isOk() ? Status() : std::get<Status>(std::move(v_)); }

  T& value() & { assert(isOk()); return std::get<T>(v_); }
  const T& value() const& { assert(isOk()); return std::get<T>(v_); }
  T&& value() && { assert(isOk()); return std::get<T>(std::move(v_)); }

  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  T valueOr(T fallback) const& { return isOk() ? value() : std::move(fallback); }

 private:
  std::variant<T, Status> v_;
};

namespace detail {
inline Status toStatus(Status s) { return s; }
template <typename T>
Status toStatus(Result<T>&& r) { return std::move(r).status(); }
}  // namespace detail

}  // namespace phos

#define PHOS_CONCAT_INNER_(a, b) a##b
#define PHOS_CONCAT_(a, b) PHOS_CONCAT_INNER_(a, b)

// Returns the error of `expr` (a Status) from the enclosing function.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::phos::Status phos_status_ = (expr);             \
    if (!phos_status_.isOk()) return phos_status_;    \
  } while (0)

// Like RETURN_IF_ERROR, prefixing the message with a context string.
#define RETURN_IF_ERROR_CTX(expr, context)                                         \
  do {                                                                             \
    ::phos::Status phos_status_ = (expr);                                          \
    if (!phos_status_.isOk()) return std::move(phos_status_).withContext(context); \
  } while (0)

// ASSIGN_OR_RETURN(auto x, computeX()); declares/assigns `lhs` from a Result,
// or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  PHOS_ASSIGN_OR_RETURN_IMPL_(PHOS_CONCAT_(phos_result_, __LINE__), lhs, expr)
#define PHOS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.isOk()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()
