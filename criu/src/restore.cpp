// SPDX-License-Identifier: Apache-2.0
// restoreProcess: CRIU out of a PhOS image, with the GPU half's hooks, its
// memory loaded eagerly or while it runs (CRIU's lazy-pages server).
#include "phos/criu/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "criu_support.h"
#include "phos/common/subprocess.h"
#include "phos/common/unique_fd.h"
#include "phos/criu/criu.h"
#include "phos/criu/gpu_state_check.h"
#include "phos/image/reader.h"
namespace phos::checkpoint {

using namespace detail;

namespace {

// A process killed just before (by a dump without --leave-running) may
// linger a moment as a zombie of a parent that has not reaped it yet, and
// CRIU cannot give its pid back until it is gone.
void waitForPidToBeFree(pid_t pid) {
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline) {
    auto info = readProcess(pid);
    if (!info || (info->state != 'Z' && info->state != 'X')) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// CRIU's lazy-pages server for one restore (`criu lazy-pages`): while the
// restored process runs, it serves each page of its private memory that the
// process touches from the image (userfaultfd), sends the rest in the
// background, and exits once all of it is loaded or the process is gone.
// Restore and server meet on a socket in the restore's work directory.
class LazyPagesServer {
 public:
  // Started and ready for the restore (it wrote its status byte).
  static Result<std::unique_ptr<LazyPagesServer>> start(const criu::CriuBinary& criu, const fs::path& images,
                                                         const fs::path& work) {
    int status[2];
    if (::pipe2(status, O_CLOEXEC) != 0) return errnoError(errno, "a pipe for CRIU's lazy-pages server");
    UniqueFd readEnd(status[0]), writeEnd(status[1]);
    constexpr int kStatusFd = 3;
    auto pid = spawn(criu.command({"lazy-pages", "-D", images.string(), "-W", work.string(), "-o", "lazy-pages.log",
                                   "--status-fd", std::to_string(kStatusFd)}),
                     -1, {{writeEnd.get(), kStatusFd}});
    writeEnd.reset();  // the server's only: its exit closes the pipe
    if (!pid.isOk()) return std::move(pid).status().withContext("starting CRIU's lazy-pages server");
    auto server = std::unique_ptr<LazyPagesServer>(new LazyPagesServer(*pid));
    char ready = 1;
    ssize_t n;
    do {
      n = ::read(readEnd.get(), &ready, 1);
    } while (n < 0 && errno == EINTR);
    readEnd.reset();
    if (n != 1 || ready != '\0') {
      const int exit = server->waitLoaded();
      ProcessOutput none{exit, "", ""};
      return makeError(Code::kFailedPrecondition, "CRIU's lazy-pages server did not start (exit {}):{}", exit,
                       criuErrors(work / "lazy-pages.log", none));
    }
    return server;
  }

  LazyPagesServer(const LazyPagesServer&) = delete;
  LazyPagesServer& operator=(const LazyPagesServer&) = delete;
  // A server still running (the restore failed) is killed.
  ~LazyPagesServer() {
    if (!exited_.load()) ::kill(pid_, SIGKILL);
    if (reaper_.joinable()) reaper_.join();
  }

  // Waits until it exited (all memory loaded, or the process gone); its exit status.
  int waitLoaded() {
    if (reaper_.joinable()) reaper_.join();
    return exitStatus_;
  }
  Clock::time_point exitedAt() const { return exitedAt_; }

 private:
  explicit LazyPagesServer(pid_t pid) : pid_(pid), reaper_([this] {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    exitedAt_ = Clock::now();
    exitStatus_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    exited_ = true;
  }) {}

  const pid_t pid_;
  std::atomic<bool> exited_{false};
  Clock::time_point exitedAt_{};
  int exitStatus_ = -1;
  std::thread reaper_;  // last: started once the fields above exist
};

// Our descriptor `fd` under a number of its own (>= 64, close-on-exec), so
// that handing it to CRIU as fd 10+N never overwrites another one.
int duplicateHigh(int fd) {
  return ::fcntl(fd, F_DUPFD_CLOEXEC, 64);
}

// CRIU's log and pid file go to a private work directory: the image may be
// read-only and is never modified by a restore. Removed when it goes, unless
// `keep` (an error names a log in it).
struct WorkDirectory {
  fs::path dir;
  bool keep = false;
  static Result<std::unique_ptr<WorkDirectory>> create() {
    char name[] = "/tmp/phos-restore.XXXXXX";
    if (::mkdtemp(name) == nullptr) return errnoError(errno, "creating a work directory");
    auto work = std::make_unique<WorkDirectory>();
    work->dir = name;
    return work;
  }
  ~WorkDirectory() {
    std::error_code ec;
    if (!keep) fs::remove_all(dir, ec);
  }
};

// The process's standard descriptors, as they were at the dump, stand in for
// ours (or `options.stdio`'s): each one CRIU recorded under a key
// (StdioDescriptor) is passed as fd 10+N with --inherit-fd; `passed` gets
// our copies, to close once CRIU ran.
void inheritStdio(const RestoreOptions& options, const nlohmann::json& cpuState, std::vector<std::string>& argv,
                  CaptureOptions& capture, std::vector<UniqueFd>& passed) {
  if (!cpuState.contains("stdio") || !cpuState["stdio"].is_array()) return;
  std::set<std::string> keys;
  for (const auto& entry : cpuState["stdio"]) {
    if (!entry.is_object() || !entry.contains("inherit_key") ||
        !entry["inherit_key"].is_string() || !entry.contains("fd") ||
        !entry["fd"].is_number_integer()) {
      continue;
    }
    int fd = entry["fd"].get<int>();
    std::string key = entry["inherit_key"].get<std::string>();
    // stdout and stderr into one file (2>&1) are one file for CRIU: the
    // lower of our descriptors stands for both.
    if (fd < 0 || fd > 2 || key.empty() || !keys.insert(key).second) continue;
    int copy = duplicateHigh(options.stdio[fd] >= 0 ? options.stdio[fd] : fd);
    if (copy < 0) continue;  // our own fd N is closed: restore it as it was
    passed.emplace_back(copy);
    capture.passFds.emplace_back(copy, 10 + fd);
    argv.insert(argv.end(), {"--inherit-fd", fmt::format("fd[{}]:{}", 10 + fd, key)});
  }
}

// Why CRIU's restore of `imageDir` failed, with a hint where its errors have
// a usual cause.
Status restoreFailure(const fs::path& imageDir, const fs::path& work, const ProcessOutput& run) {
  std::string errors = criuErrors(work / "restore.log", run);
  std::string hint;
  if (errors.find("has bad size") != std::string::npos) {
    hint =
        "\n  a file the process had open changed size since the checkpoint; for its "
        "stdin/stdout/stderr, restoring with them attached to ours (phos restore without "
        "--keep-descriptors) avoids this";
  } else if (errors.find("Can't fork for") != std::string::npos) {
    hint = "\n  the process's pid is taken: is the checkpointed process still running?";
  }
  return makeError(Code::kFailedPrecondition,
                   "CRIU could not restore {} (exit {}; its log is {}):{}{}", imageDir.string(),
                   run.exitCode, (work / "restore.log").string(), errors, hint);
}

// The exit status of the restored `pid`, re-parented to this process.
Result<int> waitForExit(pid_t pid) {
  int status = 0;
  for (;;) {
    if (::waitpid(pid, &status, 0) >= 0) break;
    if (errno == EINTR) continue;
    return errnoError(errno,
                      fmt::format("waiting for the restored pid {} (it was not re-parented to this process)", pid));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The pid CRIU wrote into `pidFile` (--pidfile); 0 if none.
pid_t restoredPid(const fs::path& pidFile) {
  std::ifstream in(pidFile);
  long restored = 0;
  in >> restored;
  return static_cast<pid_t>(restored);
}

// The lazy-pages server exits once all the memory is loaded (or the process
// is gone): a detached restore returns then; one that waits for the job says
// when it happened, once the job ended. Waits for that.
void noteLoaded(LazyPagesServer& server, Clock::time_point start, WorkDirectory& work, RestoreReport& report) {
  if (const int exit = server.waitLoaded(); exit != 0) {
    ProcessOutput none{exit, "", ""};
    report.cpuLoadError = fmt::format("CRIU's lazy-pages server failed (exit {}):{}", exit,
                                      criuErrors(work.dir / "lazy-pages.log", none));
    work.keep = true;  // its log is named there
  }
  report.cpuLoadedSeconds = std::chrono::duration<double>(server.exitedAt() - start).count();
}

}  // namespace

Result<RestoreReport> restoreProcess(const RestoreOptions& options) {
  const fs::path& imageDir = options.image;
  auto start = Clock::now();
  // The rules phosd applies (docs/security.md), for whoever runs this.
  ASSIGN_OR_RETURN(auto reader, image::ImageReader::open(imageDir, image::Requester{::geteuid()}));
  const nlohmann::json& state = reader->manifest().state;
  if (state.contains("cpu") && state["cpu"].is_object() &&
      state["cpu"].value("tool", "") == "criu-plugin") {
    fs::path criuImages = fs::absolute(imageDir).lexically_normal();
    if (!criuImages.has_filename()) criuImages = criuImages.parent_path();
    criuImages = criuImages.parent_path();
    return makeError(
        Code::kInvalidArgument,
        "{} is the GPU half of a checkpoint CRIU took with PhOS's plugin; CRIU's images are in "
        "{}: restore them with `criu restore -D {}` and the plugin loaded (docs/containers.md)",
        imageDir.string(), criuImages.string(), criuImages.string());
  }
  if (!state.contains("cpu") || !state["cpu"].is_object() || reader->manifest().cpuFiles.empty()) {
    return makeError(Code::kDataLoss, "{}: the image holds no CPU state (cpu/ is empty)",
                     imageDir.string());
  }
  auto damaged = [&](const std::vector<image::Problem>& problems) {
    return makeError(Code::kDataLoss, "{}: {}: {} (phos verify lists every problem)", imageDir.string(),
                     problems[0].where, problems[0].what);
  };
  if (auto problems = checkGpuState(*reader); !problems.empty()) return damaged(problems);
  // cpu/ (the process's memory: as large as it is) is read and checked while
  // phosd re-creates the GPU session; CRIU runs only once both are done.
  auto cpuChecked = std::async(std::launch::async, [&reader] { return reader->verifyCpuFiles(); });
  auto cpuDamage = [&]() -> std::optional<Status> {
    if (!cpuChecked.valid()) return std::nullopt;
    if (auto problems = cpuChecked.get(); !problems.empty()) return damaged(problems);
    return std::nullopt;
  };
  auto criuBinary = criu::locate();
  if (!criuBinary) {
    if (auto bad = cpuDamage()) return *bad;
    return makeError(Code::kFailedPrecondition, "CRIU is needed for the CPU state: {}",
                     criuBinary.status().message());
  }
  // Before the GPU session is re-created: nothing is done that CRIU cannot finish.
  if (Status may = criu::checkPrivilege(*criuBinary); !may.isOk()) {
    if (auto bad = cpuDamage()) return *bad;
    return std::move(may).withContext("nothing was restored");
  }
  if (state.contains("process") && state["process"].contains("pid") &&
      state["process"]["pid"].is_number_integer()) {
    waitForPidToBeFree(state["process"]["pid"].get<pid_t>());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<WorkDirectory> cleanup, WorkDirectory::create());
  const fs::path work = cleanup->dir;

  RestoreReport report;
  // The process's memory loaded while it runs, where this host can.
  std::unique_ptr<LazyPagesServer> lazyPages;
  if (options.lazyPages) {
    if (Status can = criu::checkLazyPages(*criuBinary); !can.isOk()) report.cpuEagerReason = can.message();
  }
  bool shellJob = state["cpu"].value("shell_job", false);
  std::vector<std::string> argv =
      criuBinary->command({"restore", "-D", reader->cpuDirectory().string(), "-W", work.string(), "-o", "restore.log",
                           "--restore-detached", "--pidfile", (work / "pid").string()});
  // The standard descriptors: ours stand in for the ones recorded at dump.
  CaptureOptions capture{.inheritStdin = true, .passFds = {}};
  std::vector<UniqueFd> passed;  // closed once CRIU ran
  if (options.inheritStdio) inheritStdio(options, state["cpu"], argv, capture, passed);

  if (options.beforeRestore) {
    if (Status prepared = options.beforeRestore(*reader); !prepared.isOk()) {
      if (auto bad = cpuDamage()) return *bad;
      return std::move(prepared).withContext(fmt::format("preparing the restore of {}", imageDir.string()));
    }
  }
  if (auto bad = cpuDamage()) {
    if (options.afterRestore) options.afterRestore(std::nullopt);  // phosd abandons the session
    return *bad;
  }
  if (options.lazyPages && report.cpuEagerReason.empty()) {
    auto server = LazyPagesServer::start(*criuBinary, reader->cpuDirectory(), work);
    if (server.isOk()) {
      lazyPages = std::move(*server);
      argv.push_back("--lazy-pages");
    } else {
      // Restored eagerly instead: slower to run, never wrong.
      report.cpuEagerReason = server.status().message();
      cleanup->keep = true;  // its log is named in the reason
    }
  }
  report.cpuLazy = lazyPages != nullptr;
  auto afterRestore = [&](std::optional<pid_t> pid) {
    if (options.afterRestore) options.afterRestore(pid);
  };
  // The restored tree is CRIU's child; when CRIU leaves (--restore-detached)
  // it is re-parented to the nearest subreaper, which we become to wait for it.
  if (!options.detach && ::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    Status status = errnoError(errno, "prctl(PR_SET_CHILD_SUBREAPER)");
    afterRestore(std::nullopt);
    return status;
  }
  auto run = runCapture(withShellJob(argv, shellJob), capture);
  passed.clear();
  if (!run) {
    afterRestore(std::nullopt);
    return std::move(run).status().withContext("running CRIU");
  }
  if (run->exitCode != 0) {
    afterRestore(std::nullopt);
    cleanup->keep = true;  // the log is named in the error
    return restoreFailure(imageDir, work, *run);
  }
  report.pid = restoredPid(work / "pid");
  report.restoreSeconds = secondsSince(start);
  if (report.pid <= 0) {
    afterRestore(std::nullopt);
    return makeError(Code::kInternal, "CRIU restored {} but wrote no pid into {}",
                     imageDir.string(), (work / "pid").string());
  }
  afterRestore(report.pid);
  if (!options.detach) {
    ASSIGN_OR_RETURN(report.exitCode, waitForExit(report.pid));
  }
  if (lazyPages != nullptr) noteLoaded(*lazyPages, start, *cleanup, report);
  report.totalSeconds = secondsSince(start);
  return report;
}

}  // namespace phos::checkpoint
