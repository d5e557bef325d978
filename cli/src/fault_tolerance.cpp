// SPDX-License-Identifier: Apache-2.0
// phos run --ft: a job kept checkpointed at the interval the PhOS paper's model
// gives for its measured costs, and restored from its newest good image when it
// or its daemon dies (docs/fault-tolerance.md).
#include "fault_tolerance.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "phos/common/ipc/control.h"
#include "phos/criu/restore_job.h"
#include "phos/image/reader.h"
#include "phos/policy/online_estimator.h"
#include "subcommands.h"

namespace phos::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void say(const std::string& text) { std::fprintf(stderr, "phos run --ft: %s\n", text.c_str()); }

// One storage level: where its images go and its newest good one.
struct Level {
  std::string name;
  fs::path dir;
  fs::path newest;
  uint64_t newestNumber = 0;
};

class Supervisor {
 public:
  Supervisor(const FaultToleranceOptions& options, policy::OnlineIntervalEstimator estimator)
      : options_(options), estimator_(std::move(estimator)) {}

  int run(char* const argv[]) {
    if (Status s = prepareLevels(); !s.isOk()) {
      say(s.message());
      return kExitBadInput;
    }
    // Restored processes are CRIU's children, re-parented to us when it leaves.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    // The application SDK's hints (phos_checkpoint()) arrive here.
    const std::string hints = fmt::format("phos-ft-{}", ::getpid());
    hints_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, hints.data(), hints.size());
    if (hints_ < 0 || ::bind(hints_, reinterpret_cast<sockaddr*>(&addr),
                             static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + hints.size())) != 0) {
      say(fmt::format("no socket for the SDK's hints: {}", std::strerror(errno)));
    } else {
      options_.jobEnvironment.emplace_back("PHOS_FT_HINTS", "@" + hints);
    }
    pid_ = ::fork();
    if (pid_ < 0) {
      say(fmt::format("fork: {}", std::strerror(errno)));
      return kExitFailure;
    }
    if (pid_ == 0) {
      for (const auto& [name, value] : options_.jobEnvironment) ::setenv(name.c_str(), value.c_str(), 1);
      ::execvp(argv[0], argv);
      std::fprintf(stderr, "phos run: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    daemonPid_ = daemonPid();
    double interval = options_.intervalSeconds > 0 ? options_.intervalSeconds : options_.firstIntervalSeconds;
    for (;;) {
      auto next = Clock::now() + std::chrono::duration<double>(interval);
      bool restored = false;
      while (!restored && Clock::now() < next) {
        // The job, and whatever else ends up our child (re-parented helpers).
        int status = 0;
        for (pid_t ended; (ended = ::waitpid(-1, &status, WNOHANG)) > 0;) {
          if (ended != pid_) continue;
          std::optional<int> code = onEnd(status);
          if (code) return *code;
          restored = true;  // a fresh interval
          break;
        }
        if (std::optional<std::string> mode = hint(); mode && !restored) {
          checkpoint(*mode, "asked by the job");
          next = Clock::now() + std::chrono::duration<double>(nextInterval());
          continue;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (restored) {
        interval = nextInterval();
        continue;
      }
      checkpoint(options_.mode, "");
      interval = nextInterval();
    }
  }

 private:
  Status prepareLevels() {
    for (const std::string& name : options_.levels) {
      Level level{name, {}, {}, 0};
      if (name == "dram") {
        level.dir = fs::path("/dev/shm") / fmt::format("phos-ft-{}", ::getpid());
      } else if (name == "disk") {
        if (options_.directory.empty()) {
          return makeError(Code::kInvalidArgument, "the disk level needs a directory (--ft DIR)");
        }
        level.dir = fs::absolute(options_.directory) / fmt::format("phos-ft-{}", ::getpid());
      } else if (name.starts_with("dir:") && name.size() > 4) {
        // Any directory: remote storage mounted here (NFS, a parallel file system).
        level.dir = fs::absolute(name.substr(4)) / fmt::format("phos-ft-{}", ::getpid());
      } else {
        return makeError(Code::kInvalidArgument, "unknown level \"{}\" (dram, disk, dir:PATH)", name);
      }
      std::error_code ec;
      fs::create_directories(level.dir, ec);
      if (ec) return makeError(Code::kIo, "cannot create {}: {}", level.dir.string(), ec.message());
      levels_.push_back(level);
    }
    if (levels_.empty()) return makeError(Code::kInvalidArgument, "no storage level");
    if (levels_.size() > 1) {
      // Failures the first level recovers from (the job's GPU or process) at
      // F; each further level's class (the host, the node's disk, ...) is
      // configured, or a quarter of the one below.
      std::vector<policy::OnlineLevelEstimator::LevelConfig> config;
      double rate = options_.failuresPerGpuHour;
      for (size_t i = 0; i < levels_.size(); ++i) {
        if (i > 0) {
          rate = i - 1 < options_.levelFailuresPerHour.size() ? options_.levelFailuresPerHour[i - 1] : rate / 4;
        }
        config.push_back({levels_[i].name, rate});
      }
      auto model = policy::OnlineLevelEstimator::create(config);
      if (!model.isOk()) return model.status();
      levelModel_ = std::move(*model);
    }
    return Status::ok();
  }

  // The daemon's pid, or 0 when none answers.
  pid_t daemonPid() const {
    auto pong = ipc::controlRequest(ipc::controlSocketPath(options_.runtimeDir), R"({"op":"ping"})",
                                    std::chrono::seconds(2));
    if (!pong.isOk()) return 0;
    return json::parse(*pong, nullptr, false).value("daemon_pid", 0);
  }

  // With several levels, paper 004's model for their measured costs (once
  // every level has been written to), else the PhOS paper's single level.
  std::optional<policy::MultiLevelPlan> plan() const {
    if (!levelModel_) return std::nullopt;
    auto planned = levelModel_->plan();
    if (!planned.isOk()) return std::nullopt;
    return *planned;
  }

  double nextInterval() const {
    if (options_.intervalSeconds > 0) return options_.intervalSeconds;
    if (auto p = plan()) return p->schedule.intervalSeconds.front();
    auto model = estimator_.intervalSeconds();
    return model.isOk() ? *model : options_.firstIntervalSeconds;
  }

  // How many checkpoints of level i-1 make one of level i.
  uint64_t promoteEvery(size_t i) const {
    if (options_.promoteEvery > 0) return static_cast<uint64_t>(options_.promoteEvery);
    if (auto p = plan(); p && i < p->schedule.every.size()) return static_cast<uint64_t>(p->schedule.every[i]);
    return kDefaultPromoteEvery;
  }
  static constexpr uint64_t kDefaultPromoteEvery = 4;

  // A hint of the application SDK: "checkpoint MODE" (the mode, if it is one).
  std::optional<std::string> hint() {
    char text[64];
    const ssize_t n = hints_ < 0 ? -1 : ::recv(hints_, text, sizeof text - 1, 0);
    if (n <= 0) return std::nullopt;
    const std::string message(text, static_cast<size_t>(n));
    for (const char* mode : {"cow", "recopy", "stop"}) {
      if (message == std::string("checkpoint ") + mode) return mode;
    }
    say(fmt::format("ignored a hint that is not \"checkpoint cow|recopy|stop\": {}", message));
    return std::nullopt;
  }

  // Checkpoint n goes to the first level; every promoteEvery-th is copied to
  // the next one too (a multi-level schedule nested by promotion).
  void checkpoint(const std::string& mode, const std::string& why) {
    const uint64_t n = ++checkpoints_;
    Level& first = levels_.front();
    const fs::path image = first.dir / fmt::format("checkpoint-{}", n);
    json request = {{"op", "checkpoint"}, {"pid", pid_}, {"image", image.string()}, {"leave_running", true},
                    {"mode", mode}};
    auto stream = ipc::ControlStream::open(ipc::controlSocketPath(options_.runtimeDir), request.dump());
    if (!stream) return say(fmt::format("checkpoint {} of pid {}: {}", n, pid_, stream.status().message()));
    json answer;
    for (;;) {
      auto line = stream->readLine();
      if (!line) return say(fmt::format("checkpoint {}: phosd stopped answering", n));
      answer = json::parse(*line, nullptr, false);
      if (answer.is_object() && answer.contains("ok")) break;
    }
    if (answer["ok"] != true) {
      return say(fmt::format("checkpoint {} of pid {} failed: {}", n, pid_, answer.value("error", std::string("?"))));
    }
    const json report = answer.value("report", json::object());
    const double stall = report.value("gpu_stall_seconds", 0.0) + report.value("freeze_seconds", 0.0);
    (void)estimator_.recordStall(std::max(stall, 1e-3));
    if (levelModel_) (void)levelModel_->recordCheckpoint(first.name, std::max(stall, 1e-3));
    keep(first, image, n);
    // Level i gets every k^i-th checkpoint, copied while the job runs on.
    std::string promoted;
    uint64_t every = 1;
    for (size_t i = 1; i < levels_.size(); ++i) {
      every *= promoteEvery(i);
      if (n % every != 0) break;
      Level& next = levels_[i];
      const fs::path copy = next.dir / image.filename();
      const fs::path partial = next.dir / ("." + image.filename().string() + ".partial");
      std::error_code ec;
      const auto copyStart = Clock::now();
      fs::copy(image, partial, fs::copy_options::recursive, ec);
      // Its cost in the model: the copy's time (the job runs meanwhile, so this
      // overstates it, and keeps the level from being scheduled faster than
      // it can be written).
      if (levelModel_ && !ec) (void)levelModel_->recordCheckpoint(next.name, std::max(secondsSince(copyStart), 1e-3));
      if (!ec) fs::rename(partial, copy, ec);
      if (ec) {
        fs::remove_all(partial, ec);
        say(fmt::format("could not copy checkpoint {} to {}: {}", n, next.name, ec.message()));
        break;
      }
      keep(next, copy, n);
      promoted += fmt::format(", copied to {}", next.name);
    }
    std::string model;
    if (auto p = plan()) model = fmt::format(" (multi-level model: every {})", fmt::join(p->schedule.every, "/"));
    say(fmt::format("checkpoint {} of pid {} in {}{} ({}, {}the job stalled {:.3f} s); next in {:.1f} s{}", n, pid_,
                    first.name, promoted, mode, why.empty() ? "" : why + "; ", stall, nextInterval(), model));
  }

  // The level's newest image is `image`; the one before goes.
  static void keep(Level& level, const fs::path& image, uint64_t n) {
    std::error_code ec;
    if (!level.newest.empty()) fs::remove_all(level.newest, ec);
    level.newest = image;
    level.newestNumber = n;
  }

  // The job ended with `status`: its exit code is ours, unless it died (a
  // signal, or its daemon went away): then it is restored, newest image first.
  std::optional<int> onEnd(int status) {
    const bool signalled = WIFSIGNALED(status);
    const int code = signalled ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    const pid_t daemonNow = daemonPid();
    const bool daemonDied = daemonNow != daemonPid_;
    if (!signalled && (code == 0 || !daemonDied)) {
      cleanup();
      return code;
    }
    const auto failedAt = Clock::now();
    say(signalled ? fmt::format("pid {} was killed by signal {}", pid_, WTERMSIG(status))
                  : fmt::format("pid {} exited with {} after its daemon went away", pid_, code));
    if (restores_ >= options_.maxRestores) {
      say(fmt::format("restored {} times already: giving up", restores_));
      cleanup();
      return code;
    }
    std::vector<const Level*> byAge;
    for (const Level& l : levels_) {
      if (!l.newest.empty()) byAge.push_back(&l);
    }
    std::sort(byAge.begin(), byAge.end(), [](auto* a, auto* b) { return a->newestNumber > b->newestNumber; });
    for (const Level* level : byAge) {
      if (restore(level->newest)) {
        ++restores_;
        const double seconds = secondsSince(failedAt);
        (void)estimator_.recordRestore(seconds);
        if (levelModel_) (void)levelModel_->recordRestore(level->name, seconds);
        say(fmt::format("pid {} runs again from checkpoint {} ({}), {:.2f} s after it died", pid_,
                        level->newestNumber, level->name, seconds));
        daemonPid_ = daemonPid();
        return std::nullopt;
      }
    }
    say(byAge.empty() ? "no checkpoint was taken yet: nothing to restore" : "no image could be restored");
    cleanup();
    return code;
  }

  bool restore(const fs::path& image) {
    auto reader = image::ImageReader::open(image, image::Requester{::geteuid()});
    if (!reader.isOk()) {
      say(fmt::format("{}: {}", image.string(), reader.status().message()));
      return false;
    }
    if (auto problems = (*reader)->verifyCpuFiles(); !problems.empty()) {
      say(fmt::format("{}: {}: {}", image.string(), problems[0].where, problems[0].what));
      return false;
    }
    // The job keeps our standard descriptors (a terminal's, for CRIU too), as it had them.
    checkpoint::JobRestoreOptions restore;
    restore.image = image;
    restore.runtimeDir = options_.runtimeDir;
    restore.detach = true;
    restore.startDaemon = [this] { return ensureDaemon(options_.runtimeDir, ""); };
    restore.rolledBack = [&](const std::string& why) {
      say(fmt::format("{}: {}; restoring it again, its device memory loaded first", image.string(), why));
    };
    auto restored = checkpoint::restoreJob(restore);
    if (!restored.isOk()) {
      say(fmt::format("restoring {} failed: {}", image.string(), restored.status().message()));
      return false;
    }
    if (!restored->clean()) {
      say(fmt::format("restoring {} failed: pid {}: {}", image.string(), restored->process.pid, restored->problem()));
      return false;
    }
    return true;  // the same pid: CRIU gives it back
  }

  void cleanup() {
    std::error_code ec;
    for (const Level& l : levels_) {
      if (l.name == "dram") fs::remove_all(l.dir, ec);
    }
  }

  FaultToleranceOptions options_;
  int hints_ = -1;
  policy::OnlineIntervalEstimator estimator_;
  std::optional<policy::OnlineLevelEstimator> levelModel_;
  std::vector<Level> levels_;
  pid_t pid_ = -1;
  pid_t daemonPid_ = 0;
  uint64_t checkpoints_ = 0;
  int restores_ = 0;
};

}  // namespace

int runFaultTolerant(const FaultToleranceOptions& options, char* const argv[]) {
  auto estimator = policy::OnlineIntervalEstimator::create({1, options.failuresPerGpuHour, 0.2});
  if (!estimator.isOk()) {
    std::fprintf(stderr, "phos run --ft: %s\n", estimator.status().message().c_str());
    return kExitBadInput;
  }
  Supervisor supervisor(options, std::move(*estimator));
  return supervisor.run(argv);
}

}  // namespace phos::cli
