// SPDX-License-Identifier: Apache-2.0
// Running helper programs (criu, nvcc, ptxas) and capturing what they print.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
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

struct CaptureOptions {
  // The child reads our stdin instead of /dev/null (CRIU's --shell-job
  // re-attaches a job's terminal through its own stdin).
  bool inheritStdin = false;
  // {our fd, the child's fd}: descriptors handed to the child under a chosen
  // number (CRIU's --inherit-fd fd[N]:...). The child's fd must be > 2.
  std::vector<std::pair<int, int>> passFds;
};
Result<ProcessOutput> runCapture(const std::vector<std::string>& argv,
                                 const CaptureOptions& options);

// Starts argv[0] (searched in PATH when it has no '/') without waiting for
// it: stdin from /dev/null, stdout and stderr to `output` (-1: /dev/null),
// `passFds` as in CaptureOptions. The caller reaps it (waitpid).
Result<pid_t> spawn(const std::vector<std::string>& argv, int output,
                    const std::vector<std::pair<int, int>>& passFds = {});

// Whether `pid` has ended: no such process, or one that exited and was not
// reaped yet (a zombie still answers kill(pid, 0)). Allocates nothing and
// opens no descriptor, so applications may call it at any moment.
bool processEnded(pid_t pid);

// The pid `pid` (as this process's namespace numbers it) has in its own
// innermost PID namespace: the last "NSpid:" field of /proc/PID/status. A
// process in a container sees itself as this pid. kNotFound: no such process.
Result<pid_t> pidInOwnNamespace(pid_t pid);

}  // namespace phos
