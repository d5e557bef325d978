// SPDX-License-Identifier: Apache-2.0
// phos run --ft: periodic checkpoints and automatic restore (docs/fault-tolerance.md).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace phos::cli {

struct FaultToleranceOptions {
  std::string directory;                             // --ft DIR: the disk level
  std::vector<std::string> levels{"dram", "disk"};  // least durable first: dram, disk, dir:PATH
  double failuresPerGpuHour = 0.1;                   // F of the model (configured; O and R are measured)
  double intervalSeconds = 0;                        // fixed interval; 0: the model's
  double firstIntervalSeconds = 10;                  // until a checkpoint's stall was measured
  int promoteEvery = 0;                              // every k-th of a level is copied to the next; 0: the model's
  std::vector<double> levelFailuresPerHour;          // failure rates of the classes of levels 2.. (default: F/4 each)
  int maxRestores = 10;
  std::string mode = "cow";                          // the checkpoints' protocol
  std::string runtimeDir;                            // the daemon's
  // Set in the job's environment only (LD_PRELOAD=libphos.so, ...).
  std::vector<std::pair<std::string, std::string>> jobEnvironment;
};

// Forks the job (argv, with the environment phos run prepared) and supervises
// it; returns its exit code (the job's own, or after giving up on restores).
int runFaultTolerant(const FaultToleranceOptions& options, char* const argv[]);

}  // namespace phos::cli
