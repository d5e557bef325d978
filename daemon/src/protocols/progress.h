// SPDX-License-Identifier: Apache-2.0
// Progress of a checkpoint or a restore, phase by phase, as `phos checkpoint
// --progress` and the restore's report show it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace phos::daemon {

// Receives {"phase": ..., "bytes": done, "total": of the phase} as work advances.
using ProgressFn = std::function<void(const nlohmann::json& progress)>;

// Reports progress of one phase at most every 50 ms (and at its end).
class PhaseProgress {
 public:
  PhaseProgress(const ProgressFn& fn, std::string phase, uint64_t total)
      : fn_(fn), phase_(std::move(phase)), total_(total) {}
  void advance(uint64_t bytes) {
    done_ += bytes;
    auto now = std::chrono::steady_clock::now();
    if (fn_ && (done_ == total_ || now - last_ > std::chrono::milliseconds(50))) {
      last_ = now;
      fn_({{"phase", phase_}, {"bytes", done_}, {"total", total_}});
    }
  }
  void start() {
    if (fn_) fn_({{"phase", phase_}, {"bytes", 0}, {"total", total_}});
  }

 private:
  const ProgressFn& fn_;
  std::string phase_;
  uint64_t total_;
  uint64_t done_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace phos::daemon
