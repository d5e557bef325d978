// SPDX-License-Identifier: Apache-2.0
// Human-readable byte counts for the CLI's terminal output.
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace phos::cli {

// 1536 -> "1.5 KiB"; exact below 1 KiB.
inline std::string formatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

}  // namespace phos::cli
