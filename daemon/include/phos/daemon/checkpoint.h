// SPDX-License-Identifier: Apache-2.0
// Checkpoint and restore of a whole process into a PhOS image (the entry point the CLI calls).
#pragma once

// Today this saves what exists without phosd: the CPU state through CRIU, into
// the image's cpu/, with the process, the CRIU run and timings in the manifest.
// A process that runs under libphos.so also has GPU state in phosd; saving it is
// the GPU half of issue 7 and lands with the daemon (see docs/checkpoint.md).
#include <sys/types.h>

#include <filesystem>

#include "phos/common/status.h"
#include "phos/image/format.h"

namespace phos::checkpoint {

struct CheckpointOptions {
  std::filesystem::path image;  // must not exist yet
  bool leaveRunning = false;    // otherwise the process is gone after a successful dump
  image::Codec codec = image::Codec::kNone;
};

struct CheckpointReport {
  pid_t pid = 0;
  std::filesystem::path image;
  uint64_t cpuBytes = 0;
  uint64_t cpuFiles = 0;
  uint64_t gpuBytes = 0;
  double freezeSeconds = 0;  // CRIU dump: the process is stopped during it
  double totalSeconds = 0;
};

// kNotFound: no such process; kAlreadyExists: the image directory exists;
// kFailedPrecondition: CRIU is missing or refused (its log's errors are in the
// message). On any failure nothing is left at `options.image` and the process
// keeps running.
Result<CheckpointReport> checkpointProcess(pid_t pid, const CheckpointOptions& options);

struct RestoreReport {
  pid_t pid = 0;
  double totalSeconds = 0;
};

// Checks the image (structure and cpu/ checksums), then restores the process
// detached from this one. kNotFound/kDataLoss/kNotSupported for a missing,
// damaged or newer image (refused before anything runs); kFailedPrecondition
// when CRIU fails (e.g. the pid is taken by a running process).
Result<RestoreReport> restoreProcess(const std::filesystem::path& image);

}  // namespace phos::checkpoint
