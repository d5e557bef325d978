// SPDX-License-Identifier: Apache-2.0
// Checkpoint and restore of a whole process into a PhOS image (the entry point the CLI calls).
#pragma once

// The CPU state goes through CRIU into the image's cpu/, with the process, its
// standard descriptors, the CRIU run and timings in the manifest; the GPU half
// (phosd's engine) joins through CheckpointHooks and the restore hooks. The
// order of the steps and how beforeFreeze and whileFrozen run inside CRIU's
// pre-dump and post-dump steps are in docs/checkpoint.md.
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "phos/common/status.h"
#include "phos/image/format.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"

namespace phos::checkpoint {

// What the GPU half of a checkpoint (phosd's engine) adds to the CPU half.
// Every hook is optional.
struct CheckpointHooks {
  // The image's staging directory exists; CRIU has not run; the process runs.
  // (What can be prepared while the job runs: twins, host memory, recopy's
  // copies.)
  std::function<Status(image::ImageWriter&)> beforeDump;
  // CRIU's final dump has started and is about to freeze the process (its
  // pre-dump action script, after CRIU's own start-up and after any memory
  // pre-dump); the process still runs. The GPU state is quiesced here, so that
  // the job's GPU calls wait for CRIU's freeze and dump, not for its start. A
  // failure makes CRIU give up before freezing.
  std::function<Status(image::ImageWriter&)> beforeFreeze;
  // CRIU has written its images and still holds the process frozen (its
  // post-dump action script): state the process's CPU could still change,
  // such as shared-memory files. A failure makes CRIU resume the process.
  std::function<Status(image::ImageWriter&)> whileFrozen;
  // CRIU is done (`dumped`: successfully); called before the image is
  // committed, and on every failure path after beforeDump ran.
  std::function<void(bool dumped)> afterDump;
  // After afterDump(true), before the image is committed: GPU state still
  // being saved while the process runs (soft copy-on-write). A failure
  // discards the image; a process left running runs on.
  std::function<Status()> beforeCommit;
  // Without leaveRunning, after the image is published and before the stopped
  // process is killed: another host takes the job over (live migration). On
  // failure the process is resumed, unless `leaveStopped` was set (the other
  // host may run it already); the image stays published either way.
  std::function<Status(const std::filesystem::path& image, bool& leaveStopped)> handOver;
  // The manifest's "gpu" value; default {"sessions": []}.
  std::function<nlohmann::json()> gpuState;
  // Progress of the whole checkpoint, {"phase", "bytes", "total"}.
  std::function<void(const nlohmann::json&)> progress;
};

struct CheckpointOptions {
  std::filesystem::path image;  // must not exist yet
  bool leaveRunning = false;    // otherwise the process is gone after a successful dump
  image::Codec codec = image::Codec::kNone;
  // The uid the published image belongs to (image::WriterOptions::owner):
  // phosd sets the asking user's, so that it may restore it.
  std::optional<uid_t> owner;
  std::string protocol = "stop-the-world";  // the manifest's "protocol"
  // A connected socket to a CRIU page server (live migration): the final dump
  // sends its memory pages there (--page-server --ps-socket) instead of into
  // cpu/, which then holds the other images only. -1: none.
  int pageServerSocket = -1;
  CheckpointHooks hooks;
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
// keeps running: without leaveRunning, CRIU leaves the dumped tree stopped and
// it is killed only once the image is published (resumed on any failure).
Result<CheckpointReport> checkpointProcess(pid_t pid, const CheckpointOptions& options);

// CRIU run by another program (plain `criu`, runc, Podman) that loaded PhOS's
// CRIU plugin (docs/containers.md): the checkpoint follows CRIU's steps as the
// plugin reports them instead of running CRIU. `next(done)` tells the plugin
// what the GPU half finished ("paused": CRIU may freeze the process; "saved":
// CRIU may dump it) and returns CRIU's next step: "frozen", then "dumped", or
// "failed" when CRIU gave up (also when the plugin is gone).
struct PluginSteps {
  std::function<Result<std::string>(std::string_view done)> next;
};

// The GPU half of a checkpoint whose CPU half CRIU writes beside it, into the
// directory that holds `options.image` (the plugin names it). The image's
// cpu/ stays empty and its manifest says where CRIU's images are
// ("cpu": {"tool": "criu-plugin"}). The GPU state is cut while the process
// runs ("paused"), what its CPU could still change is saved while it is
// frozen ("saved"), and the image is committed after CRIU's dump succeeded,
// before CRIU lets the process go. kFailedPrecondition when CRIU gave up; the
// session runs on whatever happens.
Result<CheckpointReport> checkpointForPlugin(pid_t pid, const CheckpointOptions& options,
                                             const PluginSteps& steps);

struct RestoreOptions {
  std::filesystem::path image;
  // Return as soon as the process runs; otherwise wait until it exits and
  // report its exit status (phos restore behaves like the job it brings back).
  // Waiting makes the calling process a child subreaper (PR_SET_CHILD_SUBREAPER)
  // so that the restored tree, CRIU's child, is re-parented to it.
  bool detach = false;
  // Attach the restored process's stdin/stdout/stderr to ours (CRIU's
  // --inherit-fd); false restores them as they were at the checkpoint.
  bool inheritStdio = true;
  // With inheritStdio: the descriptors that stand in for the job's 0, 1, 2
  // (-1: ours).
  int stdio[3] = {-1, -1, -1};
  // Load the process's private memory while it runs (CRIU's lazy pages,
  // through userfaultfd): each page comes from the image when the process
  // first touches it, the rest in the background. Where this host cannot,
  // the memory is loaded before it runs, and the report says why.
  bool lazyPages = false;
  // The GPU half: called after the image checked out and before CRIU runs
  // (re-create the session and its shared files); then with CRIU's outcome.
  // afterRestore is called once if beforeRestore succeeded (or is unset).
  std::function<Status(const image::ImageReader&)> beforeRestore;
  std::function<void(std::optional<pid_t> restored)> afterRestore;
};

struct RestoreReport {
  pid_t pid = 0;
  double restoreSeconds = 0;          // until the process runs again
  bool cpuLazy = false;               // its memory was loaded while it ran (RestoreOptions::lazyPages)
  std::string cpuEagerReason;         // lazyPages asked, and why it was not done
  std::optional<double> cpuLoadedSeconds;  // lazily: when all of it was loaded (the server exited)
  std::string cpuLoadError;           // lazily: the server failed before all was loaded (the job may have too)
  std::optional<int> exitCode;        // when waited for: its exit code, 128+N if killed by signal N
  double totalSeconds = 0;
};

// Checks the image (structure and cpu/ checksums), then restores the process
// detached from this one. kNotFound/kDataLoss/kNotSupported for a missing,
// damaged or newer image (refused before anything runs); kFailedPrecondition
// when CRIU fails (e.g. the pid is taken by a running process).
Result<RestoreReport> restoreProcess(const RestoreOptions& options);

}  // namespace phos::checkpoint
