// SPDX-License-Identifier: Apache-2.0
// A call's JIT options as phosd hands them to the driver (the jit_options
// encoding, phos/common/ipc/jit_options.h): the scalars as the application
// gave them, and log buffers of phosd's own in place of the application's.
// After the driver ran, outputs() is what the reply carries back.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "phos/common/ipc/jit_options.h"

namespace phos::daemon {

class DriverJitOptions {
 public:
  DriverJitOptions() = default;
  // The driver's values point into this object's log buffers: moved, they
  // move along; a copy would point into the original's.
  DriverJitOptions(DriverJitOptions&&) = default;
  DriverJitOptions& operator=(DriverJitOptions&&) = default;
  DriverJitOptions(const DriverJitOptions&) = delete;
  DriverJitOptions& operator=(const DriverJitOptions&) = delete;

  // False for a malformed list (sizes that disagree, too many options, an
  // option whose value would be an address of the application).
  bool decode(const ipc::JitOptions& wire);
  // The same from (option, value) pairs: given() of another, or a checkpoint's.
  bool set(const std::vector<std::pair<int32_t, uint64_t>>& given);
  // The options as the program gave them (log buffers as 0), which set() takes.
  const std::vector<std::pair<int32_t, uint64_t>>& given() const { return given_list_; }
  // Rebuilt from options a checkpoint saved (codeShaping()); no logs.
  static DriverJitOptions of(const std::vector<std::pair<int32_t, uint64_t>>& saved);

  unsigned count() const { return static_cast<unsigned>(options_.size()); }
  CUjit_option* options() { return options_.empty() ? nullptr : options_.data(); }
  // What the driver gets, and may overwrite (outputs, logs): from then on
  // outputs() reports them.
  void** values() {
    lent_ = true;
    return values_.empty() ? nullptr : values_.data();
  }

  // The values after the call and the logs' text: views into this object,
  // valid until it changes. Empty if the driver never had the values.
  ipc::JitOutputs outputs();
  // The options that shape the code, which a restore loads the module again with.
  std::vector<std::pair<int32_t, uint64_t>> codeShaping() const;

 private:
  std::vector<CUjit_option> options_;
  std::vector<void*> values_;
  std::vector<char> infoLog_;
  std::vector<char> errorLog_;
  std::vector<uint64_t> returned_;  // outputs()'s copy of values_
  std::vector<std::pair<int32_t, uint64_t>> given_list_;
  bool lent_ = false;
};

}  // namespace phos::daemon
