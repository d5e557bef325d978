// SPDX-License-Identifier: Apache-2.0
// The speculation accuracy harness: runs each launch of the launch table on the vgpu
// engine with the access recorder, compares the speculated read/write sets with what
// the launch really touched, and runs the validator twins (checkpoint and restore)
// to check they compute what the original does and report exactly the misses.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "phos/common/status.h"

namespace phos::bench::speculation {

// One PTX file to run, and the row of the table it counts in.
struct ModuleInput {
  std::string path;
  std::string source;   // "corpus O3", "corpus -G", "examples", "deliberate O3" ...
  std::string variant;  // file stem, for messages: "corpus_saxpy_O3"
};

// The corpus files of tests/instrument for the given variants ("O3", "G",
// "lineinfo", "nvrtc", "clang", "numba"), labelled "corpus O3", "corpus -G", ...;
// files that do not exist (NVRTC, clang or numba not installed; misc.cu under
// NVRTC) are left out.
std::vector<ModuleInput> corpusInputs(const std::string& corpusDir,
                                      const std::vector<std::string>& variants);

struct HarnessOptions {
  // Time the original and the twins (interleaved repetitions, medians).
  bool measureWallTime = false;
  uint32_t repetitions = 7;
  // Each timed sample runs the launch back to back until the original's batch
  // takes this long (single launches of the corpus take microseconds).
  double minBatchSeconds = 0.005;
  // Engine worker threads; 1 keeps the order of float atomics, hence the output,
  // identical between the original and the twin.
  uint32_t workers = 1;
  // Negative control of the harness itself: give the twins one range allowing
  // everything, so no twin can report and every miss must come out undetected.
  bool permissiveRanges = false;
  // Narrow the speculated buffers to the bytes the accesses can reach
  // (AccessBounds), as phosd does; false: whole buffers.
  bool narrow = true;
  // Speculation sees each buffer this many bytes larger on either side, as if
  // the launch worked on a window of a larger allocation: what narrowing must
  // cut back (0: the buffers as they are).
  uint64_t widenBuffers = 0;
};

// What one twin (one mode) did in one launch.
struct TwinRun {
  bool ran = false;
  std::string error;      // build, load or launch failure
  uint32_t reported = 0;  // ReportHeader::count
  // The generator listed the kernel in TwinStats::kernelsWithUncheckedCalls: some
  // access cannot be checked, so phosd never trusts this twin and falls back to
  // stop-the-world; a miss is then handled without a report.
  bool staticFallback = false;
  bool outputsIdentical = false;
  std::string mismatch;  // first differing byte, when not identical
  uint64_t laneInstructions = 0;
  double seconds = 0;          // median wall time (when measured)
  double baselineSeconds = 0;  // the original's median, interleaved with this twin
};

struct LaunchOutcome {
  std::string source, variant, kernel;  // kernel: the table key
  std::string ptxName;
  bool deliberate = false;
  bool deliberateReadOnly = false;
  bool ran = false;
  std::string error;  // the original did not run (load/launch failure)
  // vgpu cannot execute an instruction of the kernel (wmma, cp.async): not run,
  // and counted apart from errors.
  bool unsupported = false;
  // Speculation against the recorder.
  bool writeMissed = false;  // a byte written outside the speculated write set
  bool readMissed = false;   // a byte read outside reads ∪ writes
  bool incomplete = false;   // LaunchAccessSet::incomplete
  std::string missDetail;    // first missed range, for the table
  uint64_t speculatedWriteBytes = 0;  // after narrowing (HarnessOptions::narrow)
  uint64_t wholeWriteBytes = 0;       // the same sets at buffer granularity
  uint64_t actualWriteBytes = 0;
  uint64_t laneInstructions = 0;  // the original's
  double seconds = 0;             // the original's median (when measured)
  TwinRun checkpoint, restore;

  bool failed() const { return writeMissed || readMissed; }
  // A miss the twin of that mode should have reported and did not.
  bool undetectedCheckpoint() const {
    return checkpoint.ran && writeMissed && checkpoint.reported == 0 && !checkpoint.staticFallback;
  }
  bool undetectedRestore() const {
    return restore.ran && failed() && restore.reported == 0 && !restore.staticFallback;
  }
  // A report with nothing missed: the fallback runs for nothing (safe, but wrong).
  bool falseAlarmCheckpoint() const {
    return checkpoint.ran && !writeMissed && checkpoint.reported > 0;
  }
  bool falseAlarmRestore() const { return restore.ran && !failed() && restore.reported > 0; }
};

// Runs every entry of `input` that the launch table knows (and lists the ones it
// does not in `unknown`). Fails only when the file cannot be read or parsed.
Result<std::vector<LaunchOutcome>> runModule(const ModuleInput& input,
                                             const HarnessOptions& options,
                                             std::vector<std::string>* unknown = nullptr);

// The Table-3-like summary (per source: kernels / failed, launches / failed,
// reported, undetected, false alarms, twin mismatches, over-tracing), then the
// per-launch detail of every failed, undetected or mismatched launch.
std::string formatAccuracyTable(const std::vector<LaunchOutcome>& outcomes);

// Per kernel: lane-instruction and wall-time ratio of each twin over the original.
std::string formatOverheadTable(const std::vector<LaunchOutcome>& outcomes);

nlohmann::json toJson(const std::vector<LaunchOutcome>& outcomes);

// Totals the test asserts on.
struct Totals {
  uint32_t launches = 0, failed = 0, errors = 0;
  uint32_t undetected = 0, falseAlarms = 0, mismatches = 0, twinErrors = 0;
  uint32_t deliberate = 0, deliberateCaught = 0, deliberateNotMissed = 0;
  uint32_t deliberateByFallback = 0;  // caught only as a statically unchecked kernel
  uint32_t unsupported = 0;           // not in `launches`
};
Totals totals(const std::vector<LaunchOutcome>& outcomes);

}  // namespace phos::bench::speculation
