// SPDX-License-Identifier: Apache-2.0
// Finding and probing the CRIU that PhOS drives for CPU state.
#pragma once

#include <string>
#include <vector>

#include "phos/common/status.h"

namespace phos::criu {

struct CriuBinary {
  std::string path;     // what is executed
  std::string version;  // "4.1.1"
  int major = 0;
  int minor = 0;
};

// Minimum CRIU major version: 3.x cannot dump on current kernels (vDSO layout).
inline constexpr int kMinimumMajor = 4;

// The candidates, in order: $PHOS_CRIU, the build-time -Dcriu= option, the
// project install of scripts/install-criu, `criu` on PATH.
std::vector<std::string> candidatePaths();

// The first candidate that runs and reports a version >= kMinimumMajor.
// The error lists every candidate and why it was rejected.
Result<CriuBinary> locate();

// Parses the output of `criu --version` ("Version: 4.1.1\n...").
Result<CriuBinary> parseVersion(std::string path, std::string_view versionOutput);

// Runs `criu check`; OK if CRIU says "Looks good.", otherwise the error carries
// what CRIU printed.
Status check(const CriuBinary& criu);

}  // namespace phos::criu
