// SPDX-License-Identifier: Apache-2.0
// Finding and probing the CRIU that PhOS drives for CPU state.
#pragma once

#include <string>
#include <vector>

#include "phos/common/status.h"
#include "phos/common/subprocess.h"

namespace phos::criu {

struct CriuBinary {
  std::string path;     // what is executed
  std::string version;  // "4.1.1"
  int major = 0;
  int minor = 0;
  // Runs in CRIU's unprivileged mode: the copy with CAP_CHECKPOINT_RESTORE
  // that scripts/install-criu makes for the members of group phos, which
  // users other than root run (docs/security.md "Users checkpoint their own
  // jobs").
  bool unprivileged = false;

  // The command line: the binary, `args`, and --unprivileged when needed,
  // run with kPluginOffVariable=off (through /usr/bin/env).
  std::vector<std::string> command(std::vector<std::string> args) const;
};

// Set to "off" in CRIU's environment, PhOS's CRIU plugin (criu/plugin/)
// does nothing: PhOS's own CRIU runs carry it.
inline constexpr const char* kPluginOffVariable = "PHOS_CRIU_PLUGIN";

// Minimum CRIU major version: 3.x cannot dump on current kernels (vDSO layout).
inline constexpr int kMinimumMajor = 4;

// The candidates, in order: $PHOS_CRIU, the build-time -Dcriu= option, the
// project install of scripts/install-criu (for a user other than root, its
// capability-carrying copy first), `criu` on PATH.
std::vector<std::string> candidatePaths();

// The first candidate that runs and reports a version >= kMinimumMajor.
// The error lists every candidate and why it was rejected.
Result<CriuBinary> locate();

// Parses the output of `criu --version` ("Version: 4.1.1\n...").
Result<CriuBinary> parseVersion(std::string path, std::string_view versionOutput);

// Whether this process may run `criu` for a dump or restore: as root, with
// the capability-carrying copy, or holding CAP_CHECKPOINT_RESTORE or
// CAP_SYS_ADMIN itself. The error says how a user gets there.
Status checkPrivilege(const CriuBinary& criu);

// Runs `criu check`; OK if CRIU says "Looks good.", otherwise the error carries
// what CRIU printed.
Status check(const CriuBinary& criu);

// What CRIU said last: the last line it printed, or its exit status when it
// printed nothing (the reason a `criu check --feature` gives).
std::string lastWords(const ProcessOutput& run);

// Whether CRIU can restore a process's memory on demand here (its lazy
// pages, through userfaultfd: `criu check --feature uffd-noncoop`); the error
// carries what CRIU said.
Status checkLazyPages(const CriuBinary& criu);

}  // namespace phos::criu
