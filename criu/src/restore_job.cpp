// SPDX-License-Identifier: Apache-2.0
// Restoring a job: CRIU's half and phosd's half, and the eager second attempt
// after a rollback (phos/criu/restore_job.h).
#include "phos/criu/restore_job.h"

#include <fcntl.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "phos/common/ipc/control.h"
#include "phos/common/unique_fd.h"
#include "phos/image/reader.h"

namespace phos::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The GPU half of a restore, through phosd: the session is re-created before
// CRIU runs and adopted by the restored pid after. The connection lives
// across both hooks; closing it abandons the session. Unless eager, device
// memory loads while the process runs: phosd says at the end whether it all
// loaded, or whether the process had to end because a launch touched memory
// speculation did not foresee (rollback: restore again, eagerly).
class GpuRestore {
 public:
  GpuRestore(const JobRestoreOptions& options, bool eager)
      : options_(options), socket_(ipc::controlSocketPath(options.runtimeDir)), eager_(eager) {}
  ~GpuRestore() { finish(); }

  Status before(const image::ImageReader& reader) {
    const json& state = reader.manifest().state;
    bool hasGpu = state.contains("gpu") && state["gpu"].is_object() && state["gpu"].contains("sessions") &&
                  state["gpu"]["sessions"].is_array() && !state["gpu"]["sessions"].empty();
    if (!hasGpu) return Status::ok();
    std::string image = fs::absolute(reader.directory()).lexically_normal().string();
    const std::string request = json{{"op", "restore"}, {"image", image}, {"eager", eager_}}.dump();
    auto stream = ipc::ControlStream::open(socket_, request);
    if (!stream && stream.status().code() == Code::kUnavailable && options_.startDaemon) {
      // The GPU state needs phosd: start one, as phos run does.
      if (Status started = options_.startDaemon(); !started.isOk()) {
        return makeError(Code::kFailedPrecondition,
                         "the image has GPU state and no phosd answers at {}; starting one failed: {}; "
                         "nothing was restored",
                         socket_, started.message());
      }
      stream = ipc::ControlStream::open(socket_, request);
    }
    if (!stream) return std::move(stream).status();
    stream_.emplace(std::move(*stream));
    ASSIGN_OR_RETURN(json answer, finalLine("re-creating the GPU session"));
    if (answer["ok"] != true) {
      stream_.reset();
      return makeError(Code::kFailedPrecondition, "phosd could not re-create the GPU session: {}",
                       answer.value("error", std::string("no reason given")));
    }
    session_ = true;
    rebuiltAt_ = Clock::now();
    return Status::ok();
  }

  void after(std::optional<pid_t> restored) {
    if (!stream_) return;
    if (!restored) {
      stream_.reset();  // CRIU failed: phosd drops the session
      return;
    }
    if (Status s = stream_->writeLine(json{{"adopt", *restored}}.dump()); !s.isOk()) {
      adoptError_ = s.message();
      return;
    }
    auto final = finalLine("handing the GPU session to the restored process");
    adoptedAt_ = Clock::now();  // its calls are served from here
    if (!final) {
      adoptError_ = final.status().message();
    } else if ((*final)["ok"] != true) {
      adoptError_ = final->value("error", std::string("phosd refused"));
    } else if (final->value("loading", false)) {
      // The process runs; its device memory is still loading.
      if (options_.detach) {
        watchLoads();
      } else {
        watcher_ = std::thread([this] { watchLoads(); });
      }
    }
  }

  // Waits for the outcome of the loads (after the process ended, or returned).
  void finish() {
    if (watcher_.joinable()) watcher_.join();
  }

  bool used() const { return session_; }
  std::optional<Clock::time_point> rebuiltAt() const { return rebuiltAt_; }
  std::optional<Clock::time_point> adoptedAt() const { return adoptedAt_; }
  const std::string& adoptError() const { return adoptError_; }
  // After finish(): why the process was ended to be restored again eagerly
  // (empty: it was not), what the loads did, and what went wrong meanwhile.
  const std::string& rollback() const { return rollback_; }
  const json& loads() const { return loads_; }
  const std::string& loadError() const { return loadError_; }

 private:
  // Reads phosd's lines until the loads' outcome.
  void watchLoads() {
    for (;;) {
      auto line = stream_->readLine();
      if (!line) {
        loadError_ = "phosd stopped answering while the device memory loaded: " + line.status().message();
        return;
      }
      json message = json::parse(*line, nullptr, false);
      if (!message.is_object()) continue;
      if (message.contains("loaded")) {
        loads_ = message["loaded"];
        return;
      }
      if (message.contains("rollback")) {
        rollback_ = message.value("rollback", std::string("phosd rolled the restore back"));
        loads_ = message.value("report", json::object());
        return;
      }
      if (message.contains("damaged")) {
        loadError_ = fmt::format("the image is damaged: {}; phosd ended the process before it could read that "
                                 "memory (its output so far is the uninterrupted run's)",
                                 message.value("damaged", std::string("a chunk does not match its checksum")));
        loads_ = message.value("report", json::object());
        return;
      }
      if (message.contains("ended")) {
        loads_ = message.value("report", json::object());
        return;
      }
    }
  }

  void progress(const json& p) const {
    if (options_.progress) options_.progress(p);
  }

  Result<json> finalLine(const char* what) {
    for (;;) {
      auto line = stream_->readLine();
      if (!line) {
        progress(nullptr);
        return makeError(Code::kUnavailable, "phosd stopped answering while {}: {}", what, line.status().message());
      }
      json message = json::parse(*line, nullptr, false);
      if (!message.is_object()) {
        progress(nullptr);
        return makeError(Code::kInternal, "phosd sent a line that is not a JSON object: {}", *line);
      }
      if (message.contains("progress")) {
        progress(message["progress"]);
        continue;
      }
      if (message.contains("ok")) {
        progress(nullptr);
        return message;
      }
    }
  }

  const JobRestoreOptions& options_;
  const std::string socket_;
  const bool eager_;
  std::optional<ipc::ControlStream> stream_;
  bool session_ = false;
  std::string adoptError_;
  std::optional<Clock::time_point> rebuiltAt_, adoptedAt_;
  std::thread watcher_;
  std::string rollback_;
  json loads_;
  std::string loadError_;
};

// The files given for the job's standard descriptors (JobRestoreOptions::stdio),
// opened once for every attempt.
Status openStdio(const JobRestoreOptions& job, UniqueFd (&files)[3]) {
  for (int fd = 0; fd < 3; ++fd) {
    const std::string& path = job.stdio[fd];
    if (path.empty()) continue;
    files[fd].reset(::open(path.c_str(), fd == 0 ? O_RDONLY | O_CLOEXEC : O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
                           0644));
    if (!files[fd]) {
      return makeError(Code::kInvalidArgument, "cannot open {} for the job's {}: {}", path,
                       fd == 0 ? "stdin" : fd == 1 ? "stdout" : "stderr", std::strerror(errno));
    }
  }
  return Status::ok();
}

// One attempt; `rollback` gets why phosd ended the restored process (its
// device memory loaded concurrently and a launch touched what speculation did
// not foresee): the caller restores again, eagerly.
Result<JobRestoreReport> restoreOnce(const JobRestoreOptions& job, const UniqueFd (&stdio)[3], bool eager,
                                     std::string& rollback) {
  GpuRestore gpu(job, eager);
  RestoreOptions options;
  options.image = job.image;
  options.detach = job.detach;
  options.inheritStdio = job.inheritStdio;
  for (int fd = 0; fd < 3; ++fd) options.stdio[fd] = stdio[fd].get();
  // Concurrent: the CPU memory too loads while the job runs, where CRIU can.
  options.lazyPages = !eager;
  options.beforeRestore = [&gpu](const image::ImageReader& reader) { return gpu.before(reader); };
  std::optional<double> runningAfter;
  const auto start = Clock::now();
  options.afterRestore = [&](std::optional<pid_t> pid) {
    gpu.after(pid);  // waits for the loads too when detached
    if (!pid) return;
    runningAfter = std::chrono::duration<double>(gpu.adoptedAt().value_or(Clock::now()) - start).count();
    if (job.running) job.running(*pid, *runningAfter);
  };
  auto process = restoreProcess(options);
  gpu.finish();
  RETURN_IF_ERROR(process.status());
  if (!gpu.rollback().empty()) {
    rollback = gpu.rollback();
    return JobRestoreReport{};
  }
  JobRestoreReport report;
  report.process = std::move(*process);
  report.runningSeconds = runningAfter.value_or(report.process.restoreSeconds);
  report.gpuSession = gpu.used();
  report.eager = eager;
  if (auto rebuilt = gpu.rebuiltAt()) report.gpuRebuiltSeconds = std::chrono::duration<double>(*rebuilt - start).count();
  report.concurrentLoad = gpu.loads();
  report.adoptError = gpu.adoptError();
  report.loadError = gpu.loadError();
  return report;
}

}  // namespace

json JobRestoreReport::toJson(const fs::path& image, bool detached) const {
  json out = {{"pid", process.pid},
              {"image", image.string()},
              {"restore_seconds", process.restoreSeconds},
              {"running_seconds", runningSeconds},
              {"total_seconds", process.totalSeconds},
              {"gpu_session", gpuSession},
              {"eager", eager},
              {"detached", detached}};
  if (gpuRebuiltSeconds) out["gpu_rebuilt_seconds"] = *gpuRebuiltSeconds;
  if (!concurrentLoad.is_null()) out["concurrent_load"] = concurrentLoad;
  out["cpu_lazy"] = process.cpuLazy;
  if (process.cpuLoadedSeconds) out["cpu_loaded_seconds"] = *process.cpuLoadedSeconds;
  if (!process.cpuEagerReason.empty()) out["cpu_eager_reason"] = process.cpuEagerReason;
  if (!process.cpuLoadError.empty()) out["cpu_load_error"] = process.cpuLoadError;
  if (!loadError.empty()) out["load_error"] = loadError;
  if (!adoptError.empty()) out["adopt_error"] = adoptError;
  if (!rolledBack.empty()) out["rolled_back"] = rolledBack;
  if (process.exitCode) out["exit_code"] = *process.exitCode;
  return out;
}

Result<JobRestoreReport> restoreJob(const JobRestoreOptions& options) {
  UniqueFd stdio[3];
  RETURN_IF_ERROR(openStdio(options, stdio));
  std::string rollback;
  ASSIGN_OR_RETURN(JobRestoreReport report, restoreOnce(options, stdio, options.eager, rollback));
  if (rollback.empty()) return report;
  if (options.rolledBack) options.rolledBack(rollback);
  std::string again;
  ASSIGN_OR_RETURN(report, restoreOnce(options, stdio, true, again));
  if (!again.empty()) {
    // An eager restore loads everything before the process runs: nothing to roll back.
    return makeError(Code::kInternal, "{}", again);
  }
  report.rolledBack = rollback;
  return report;
}

}  // namespace phos::checkpoint
