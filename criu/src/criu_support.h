// SPDX-License-Identifier: Apache-2.0
// CRIU run on a process (checkpoint.cpp dumps it, restore.cpp restores it):
// what is read of the process, as whom CRIU runs, and what CRIU said when it
// failed.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "phos/common/status.h"
#include "phos/common/subprocess.h"

namespace phos::checkpoint::detail {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start);

// A process as /proc shows it.
struct ProcessInfo {
  std::string comm;
  std::vector<std::string> cmdline;
  char state = '?';
  pid_t session = 0;
  // Real, effective and saved ids (/proc/PID/status "Uid:" and "Gid:").
  std::array<uid_t, 3> uids{};
  std::array<gid_t, 3> gids{};
};

// kNotFound: no such process; kInvalidArgument: not a process id.
Result<ProcessInfo> readProcess(pid_t pid);

// Who runs CRIU's dump. A root phosd dumps another user's job as that user
// (its real, effective and saved ids), in CRIU's unprivileged mode with only
// CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE (ambient): the kernel then lets
// CRIU read the job's resource limits (prlimit needs matching ids or
// CAP_SYS_RESOURCE, which containers usually drop: "Can't get rlimit 0"), and
// CRIU, which parses a process the user controls, holds no other privilege.
// The user cannot ptrace or signal-hijack it: its capabilities exceed theirs.
// See docs/security.md "Users checkpoint their own jobs".
struct DumpIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
};

// Whom to dump `process` as; none: CRIU runs as this process does (a user's
// own phosd, a root job, or a set-id process).
std::optional<DumpIdentity> dumpAsUser(const ProcessInfo& process);

// The command line that runs `argv` as `who` with CRIU's two capabilities
// (util-linux's setpriv: a new uid keeps ambient capabilities across exec).
std::vector<std::string> runAs(const DumpIdentity& who, const std::vector<std::string>& criuArgv);

// The lines of CRIU's log that say what went wrong (it prefixes them "Error").
// CRIU 4.1 run by root in a container logs a harmless "Can't setup
// RLIMIT_NOFILE for self" error on every run; it never is the cause.
// When the log holds none (CRIU could not write it, or failed before it
// opened it), the last lines CRIU printed. A full file system is named as such:
// CRIU's own words for it vary, or are lost with the log it could not write.
std::string criuErrors(const fs::path& log, const ProcessOutput& run);

// `argv` with --shell-job for a process that does not lead its own session
// (started from a shell), at dump and at restore.
std::vector<std::string> withShellJob(std::vector<std::string> argv, bool shellJob);

}  // namespace phos::checkpoint::detail
