// SPDX-License-Identifier: Apache-2.0
// Restoring a job from an image: its process through CRIU (checkpoint.h) and
// its GPU session through phosd, which re-creates the session before CRIU runs
// and hands it to the restored process after. Unless eager, the job runs at
// once and its device memory loads meanwhile; when phosd has to end it for
// that (a launch touched memory its speculation did not foresee), the job is
// restored again, its memory loaded first.
//
// The one owner of that sequence (docs/checkpoint.md, "Restore"): `phos
// restore`, the supervisor of `phos run --ft` and the target of a migration
// call it in their own process.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "phos/criu/checkpoint.h"

namespace phos::checkpoint {

struct JobRestoreOptions {
  std::filesystem::path image;
  std::string runtimeDir;  // phosd's, for an image with GPU state
  // Return once the job runs and all its memory is loaded; otherwise once it
  // exits (RestoreOptions::detach).
  bool detach = false;
  bool eager = false;  // load all memory before the job runs
  bool inheritStdio = true;
  // With inheritStdio: files for the job's 0 (read), 1 and 2 (appended,
  // created if missing); empty: ours. One that cannot be opened is
  // kInvalidArgument naming it, before anything runs.
  std::string stdio[3];
  // phosd's progress lines while it re-creates the session; null json once it is done.
  std::function<void(const nlohmann::json&)> progress;
  // The image has GPU state and no phosd answers: start one, or fail (unset).
  std::function<Status()> startDaemon;
  // The restored process runs, `seconds` after the restore began (once per
  // attempt that got that far).
  std::function<void(pid_t pid, double seconds)> running;
  // The concurrent attempt was rolled back, why; the eager one starts next.
  std::function<void(const std::string& why)> rolledBack;
};

struct JobRestoreReport {
  RestoreReport process;  // CRIU's half: the pid, its times, its exit code
  double runningSeconds = 0;  // until the job ran with its GPU session
  bool gpuSession = false;    // the image had one, and phosd re-created it
  bool eager = false;         // the attempt that stands loaded its memory first
  std::optional<double> gpuRebuiltSeconds;  // when phosd had re-created the session
  nlohmann::json concurrentLoad;  // phosd's report of the concurrent loads (null: none)
  // What went wrong once the job ran: phosd did not hand it its session, or
  // its device memory could not be loaded (phosd ended it then).
  std::string adoptError;
  std::string loadError;
  std::string rolledBack;  // why a first, concurrent attempt was rolled back (empty: it was not)

  // The first thing that went wrong once the job ran; empty when nothing did.
  const std::string& problem() const {
    return !adoptError.empty() ? adoptError : !loadError.empty() ? loadError : process.cpuLoadError;
  }
  bool clean() const { return problem().empty(); }
  // What `phos restore --json` prints.
  nlohmann::json toJson(const std::filesystem::path& image, bool detached) const;
};

// kNotFound/kDataLoss/kNotSupported/kInvalidArgument for an image that cannot
// be restored (nothing ran), kFailedPrecondition when CRIU or phosd fails.
Result<JobRestoreReport> restoreJob(const JobRestoreOptions& options);

}  // namespace phos::checkpoint
