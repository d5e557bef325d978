// SPDX-License-Identifier: Apache-2.0
#include "session/driver_jit_options.h"

#include <algorithm>
#include <cstring>

namespace phos::daemon {
namespace {

uint64_t asU64(void* v) {
  uint64_t out = 0;
  std::memcpy(&out, &v, sizeof(v));
  return out;
}

void* asValue(uint64_t v) {
  void* out = nullptr;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

ipc::Text logText(const std::vector<char>& log) {
  if (log.empty()) return ipc::Text::of(std::string_view());
  return ipc::Text::of(std::string_view(log.data(), strnlen(log.data(), log.size())));
}

}  // namespace

bool DriverJitOptions::decode(const ipc::JitOptions& wire) {
  std::vector<int32_t> options;
  const size_t n = wire.options.size() / sizeof(int32_t);
  std::vector<uint64_t> values;
  if (n > ipc::kMaxJitOptions || !wire.options.copyTo(&options, n) ||
      !wire.values.copyTo(&values, n))
    return false;
  std::vector<std::pair<int32_t, uint64_t>> given;
  for (size_t i = 0; i < n; ++i) given.emplace_back(options[i], values[i]);
  return set(given);
}

bool DriverJitOptions::set(const std::vector<std::pair<int32_t, uint64_t>>& given) {
  if (given.size() > ipc::kMaxJitOptions) return false;
  lent_ = false;
  options_.clear();
  values_.clear();
  // The logs' capacities first: the buffers phosd lends are never larger
  // than what comes back.
  auto capacity = [&](CUjit_option sizeOption) -> size_t {
    for (const auto& [option, value] : given) {
      if (option == sizeOption)
        return std::min<uint64_t>(value & 0xffffffffu, ipc::kMaxJitLogBytes);
    }
    return 0;
  };
  infoLog_.assign(std::max<size_t>(1, capacity(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)), '\0');
  errorLog_.assign(std::max<size_t>(1, capacity(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)), '\0');
  for (const auto& [given_option, given_value] : given) {
    const auto option = static_cast<CUjit_option>(given_option);
    void* value = asValue(given_value);
    switch (ipc::jitValue(option)) {
      case ipc::JitValue::kScalar:
        break;
      case ipc::JitValue::kOutput:
        if (option == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ||
            option == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
          value = asValue(capacity(option));
        }
        break;
      case ipc::JitValue::kInfoLog:
        value = infoLog_.data();
        break;
      case ipc::JitValue::kErrorLog:
        value = errorLog_.data();
        break;
      case ipc::JitValue::kPointer:
      case ipc::JitValue::kUnknown:
        return false;
    }
    options_.push_back(option);
    values_.push_back(value);
  }
  given_list_ = given;
  for (auto& [option, value] : given_list_) {
    const ipc::JitValue kind = ipc::jitValue(static_cast<CUjit_option>(option));
    if (kind == ipc::JitValue::kInfoLog || kind == ipc::JitValue::kErrorLog) value = 0;
  }
  return true;
}

DriverJitOptions DriverJitOptions::of(const std::vector<std::pair<int32_t, uint64_t>>& saved) {
  DriverJitOptions o;
  for (const auto& [option, value] : saved) {
    if (!ipc::jitShapesCode(static_cast<CUjit_option>(option))) continue;
    o.options_.push_back(static_cast<CUjit_option>(option));
    o.values_.push_back(asValue(value));
  }
  return o;
}

ipc::JitOutputs DriverJitOptions::outputs() {
  if (!lent_) return {};
  returned_.clear();
  for (void* v : values_) returned_.push_back(asU64(v));
  // A log buffer's value is phosd's address: it means nothing to the shim.
  for (size_t i = 0; i < options_.size(); ++i) {
    const ipc::JitValue kind = ipc::jitValue(options_[i]);
    if (kind == ipc::JitValue::kInfoLog || kind == ipc::JitValue::kErrorLog) returned_[i] = 0;
  }
  return {ipc::Blob::of(returned_.data(), returned_.size() * sizeof(uint64_t)), logText(infoLog_),
          logText(errorLog_)};
}

std::vector<std::pair<int32_t, uint64_t>> DriverJitOptions::codeShaping() const {
  std::vector<std::pair<int32_t, uint64_t>> out;
  for (size_t i = 0; i < options_.size(); ++i) {
    if (ipc::jitShapesCode(options_[i])) out.emplace_back(options_[i], asU64(values_[i]));
  }
  return out;
}

}  // namespace phos::daemon
