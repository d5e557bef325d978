// SPDX-License-Identifier: Apache-2.0
// The protocols that save a session's GPU state while CRIU saves its process
// (docs/checkpoint.md): stop-the-world, soft copy-on-write and soft recopy.
// The engine (engine.cpp) drives one through the moments of a checkpoint
// (CheckpointHooks); each protocol owns its state, and closes its window and
// resumes the session when the checkpoint fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "protocols/peer_offload.h"
#include "phos/common/status.h"
#include "phos/image/writer.h"
#include "protocols/progress.h"

namespace phos::daemon {

class Session;
class StagedWrite;
namespace migration {
class Outgoing;
}

// How long a protocol waits for the call being served when it pauses the
// session; a call still running then fails the checkpoint (or the window's end).
inline constexpr auto kPauseTimeout = std::chrono::seconds(60);
// How long a checkpoint's pause waits for the application's stream captures
// in progress to end (its drain would invalidate them) before it refuses,
// naming them: captures of training steps last milliseconds.
inline constexpr auto kCaptureWait = std::chrono::seconds(2);

// When a checkpoint reached each of its moments (unset: never): where the
// report's "stall" and "timeline" come from.
struct CheckpointTimes {
  using Clock = std::chrono::steady_clock;
  Clock::time_point started = Clock::now();
  Clock::time_point beforeDump{}, pauseAsked{}, paused{}, captured{}, dumped{}, resumed{}, saved{};
};

// What a checkpoint request asks of its protocol besides the mode.
struct ProtocolOptions {
  bool leaveRunning = false;  // otherwise the process ends with the dump
  migration::Outgoing* outgoing =
      nullptr;                   // a migration's source end: recopy streams its rounds there
  uint64_t cowReserveBytes = 0;  // copy-on-write's shadow reserve per device; 0: the default
  offload::Scheduler peerOffload = offload::Scheduler::kExact;
};

class CheckpointProtocol {
 public:
  // The protocol of `mode` ("stop", "recopy", or "cow", which is
  // stop-the-world for a process that ends with the dump).
  static std::unique_ptr<CheckpointProtocol> make(const std::string& mode, Session& session,
                                                  const ProtocolOptions& options,
                                                  const ProgressFn& progress,
                                                  CheckpointTimes& times);
  virtual ~CheckpointProtocol();

  // The manifest's and the report's name of it: "stop-the-world",
  // "soft-copy-on-write" or "soft-recopy" (stop-the-world once a recopy
  // found no host memory for its copy).
  virtual const char* name() const = 0;

  // The moments of CheckpointHooks, in order.
  // The job runs: modules' globals listed, then the protocol's prepare().
  Status beforeDump();
  // The cut: the session paused (its calls wait) and its GPU state saved,
  // or, for copy-on-write, listed.
  Status beforeFreeze(image::ImageWriter& writer);
  // CRIU holds the process frozen: the files it shares with phosd.
  Status whileFrozen(image::ImageWriter& writer);
  // CRIU is done (`dumped`: it succeeded).
  virtual void afterDump(bool dumped);
  Status beforeCommit() const { return written_; }
  // The checkpoint ended (`succeeded` or not): a session still paused
  // serves again, a window still open closes.
  virtual void finish(bool succeeded);

  // Why the image may hold bytes of after the cut (a launch wrote outside
  // its speculated buffers while they were saved): the engine checkpoints
  // again, stop-the-world. None: the image is what the protocol promised.
  virtual std::optional<std::string> retryStopTheWorld() const { return std::nullopt; }
  // Whether the target of a migration loads the job's memory before it runs
  // (after a recopy it runs while its memory loads).
  virtual bool restoresEagerly() const { return true; }

  // The manifest's state.gpu.sessions[0].
  const nlohmann::json& state() const { return state_; }
  uint64_t gpuBytes() const { return gpuBytes_; }
  double copySeconds() const { return copySeconds_; }
  // The report's "copy_on_write" and "recopy" (empty objects when unused).
  nlohmann::json copyOnWriteReport() const;
  nlohmann::json recopyReport() const;

 protected:
  CheckpointProtocol(Session& session, const ProtocolOptions& options, const ProgressFn& progress,
                     CheckpointTimes& times);
  // While the job runs, before CRIU starts: twins compiled, host memory
  // reserved, recopy's rounds.
  virtual Status prepare() = 0;
  // The session paused and its mutex held; `snapshot`: the directory of the
  // tests' reference snapshot (PHOS_TEST_REFERENCE_SNAPSHOT), or empty.
  virtual Status capture(image::ImageWriter& writer, const std::string& snapshot) = 0;
  // Host memory for the device memory's copy, while the job still runs.
  void reserveStaging();

  Session& s_;
  const ProtocolOptions options_;
  const ProgressFn& progress_;
  CheckpointTimes& times_;
  nlohmann::json state_;
  uint64_t gpuBytes_ = 0;
  double copySeconds_ = 0;
  bool paused_ = false;  // by beforeFreeze, until the session serves again
  std::unique_ptr<StagedWrite> staged_;
  Status written_ = Status::ok();  // the device memory's writing into the image
  nlohmann::json cowReport_, recopyReport_;
};

}  // namespace phos::daemon
