// SPDX-License-Identifier: Apache-2.0
// The progress line of the long commands (checkpoint, restore, migrate).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "byte_units.h"

namespace phos::cli {

// One line on stderr, redrawn in place, while a checkpoint or restore runs:
// phase, bytes done of the phase's total, throughput and time left. Only on a
// terminal, and never with --json.
class ProgressLine {
 public:
  explicit ProgressLine(bool wanted) : enabled_(wanted && ::isatty(STDERR_FILENO) == 1) {}
  ~ProgressLine() { clear(); }

  void update(const nlohmann::json& progress) {
    if (!enabled_ || !progress.is_object()) return;
    std::lock_guard lock(mutex_);
    std::string phase = progress.value("phase", std::string("?"));
    uint64_t bytes = progress.value("bytes", uint64_t{0});
    uint64_t total = progress.value("total", uint64_t{0});
    auto now = std::chrono::steady_clock::now();
    if (phase != phase_) {
      phase_ = phase;
      phaseStart_ = now;
    } else if (now - lastDraw_ < std::chrono::milliseconds(100) && bytes < total) {
      return;
    }
    lastDraw_ = now;
    double seconds = std::chrono::duration<double>(now - phaseStart_).count();
    std::string line = fmt::format("{:<10} {}", phase, formatBytes(bytes));
    if (total > 0) {
      line += fmt::format(
          " / {} ({:.0f}%)", formatBytes(total),
          100.0 * static_cast<double>(std::min(bytes, total)) / static_cast<double>(total));
    }
    if (seconds > 0.05 && bytes > 0) {
      double rate = static_cast<double>(bytes) / seconds;
      line += fmt::format("  {}/s", formatBytes(static_cast<uint64_t>(rate)));
      if (total > bytes) {
        line += fmt::format("  ETA {:.1f} s", static_cast<double>(total - bytes) / rate);
      }
    }
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }

  void clear() {
    std::lock_guard lock(mutex_);
    if (!drawn_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  bool enabled_;
  std::mutex mutex_;
  bool drawn_ = false;
  std::string phase_;
  std::chrono::steady_clock::time_point phaseStart_{}, lastDraw_{};
};

}  // namespace phos::cli
