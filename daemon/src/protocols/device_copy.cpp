// SPDX-License-Identifier: Apache-2.0
#include "protocols/device_copy.h"

#include <fstream>
#include <limits>
#include <string>

namespace phos::daemon {

uint64_t stagingBudget() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") return kib * 1024 / 2;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

}  // namespace phos::daemon
