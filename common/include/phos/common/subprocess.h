// SPDX-License-Identifier: Apache-2.0
// Running helper programs (criu, nvcc, ptxas) and capturing what they print.
#pragma once

#include <string>
#include <vector>

#include "phos/common/status.h"

namespace phos {

struct ProcessOutput {
  int exitCode = -1;  // 128 + signal number if the process was killed
  std::string out;
  std::string err;
};

// Runs argv[0] (searched in PATH when it has no '/') with stdin from
// /dev/null, waits for it, and returns its exit code and output. Fails only if
// the program cannot be started; a non-zero exit is a successful result.
Result<ProcessOutput> runCapture(const std::vector<std::string>& argv);

}  // namespace phos
