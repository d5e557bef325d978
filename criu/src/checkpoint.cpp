// SPDX-License-Identifier: Apache-2.0
// checkpointProcess: CRIU into a PhOS image, with the GPU half's hooks
// (restore.cpp brings it back).
#include "phos/criu/checkpoint.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "action_channel.h"
#include "criu_support.h"
#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "phos/criu/criu.h"
#include "phos/criu/gpu_state_check.h"
#include "phos/image/reader.h"
#include "phos/image/safe_open.h"
#include "phos/image/writer.h"

namespace phos::checkpoint {

using namespace detail;

namespace {

// --- The process's standard descriptors --------------------------------------

// What fd 0, 1 or 2 of the process points to, and the name CRIU gives that
// file, which `--inherit-fd fd[N]:<key>` matches at restore. Verified with
// CRIU 4.1.1 here: a regular file is its path without the leading '/'
// ("tmp/job.log"), a pipe "pipe:[INODE]", a socket "socket:[INODE]" (a UNIX
// socket whose peer is outside the dumped tree also needs `--external
// unix[INODE]` at dump). A terminal is left to --shell-job, which re-attaches
// it through CRIU's own stdin.
struct StdioDescriptor {
  int fd = 0;
  std::string target;  // readlink /proc/P/fd/N
  std::string kind;    // file, pipe, socket, tty, closed, other
  std::string key;     // for --inherit-fd; empty: restored as it was
  uint64_t inode = 0;  // pipes and sockets
  bool unixSocket = false;
};

uint64_t bracketedInode(const std::string& target) {
  size_t open = target.find('['), close = target.rfind(']');
  if (open == std::string::npos || close == std::string::npos || close <= open + 1) return 0;
  return std::strtoull(target.substr(open + 1, close - open - 1).c_str(), nullptr, 10);
}

// Whether `inode` is a UNIX socket in the process's network namespace
// (/proc/P/net/unix: "Num RefCount Protocol Flags Type St Inode Path").
bool isUnixSocket(pid_t pid, uint64_t inode) {
  std::ifstream in(fmt::format("/proc/{}/net/unix", pid));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string skip;
    uint64_t value = 0;
    for (int i = 0; i < 6; ++i) fields >> skip;
    if (fields >> value && value == inode) return true;
  }
  return false;
}

std::vector<StdioDescriptor> readStdio(pid_t pid) {
  std::vector<StdioDescriptor> out;
  for (int fd = 0; fd <= 2; ++fd) {
    StdioDescriptor d;
    d.fd = fd;
    std::error_code ec;
    fs::path link = fmt::format("/proc/{}/fd/{}", pid, fd);
    d.target = fs::read_symlink(link, ec).string();
    if (ec) {
      d.kind = "closed";
    } else if (d.target.starts_with("pipe:[")) {
      d.kind = "pipe";
      d.inode = bracketedInode(d.target);
      d.key = d.target;
    } else if (d.target.starts_with("socket:[")) {
      d.kind = "socket";
      d.inode = bracketedInode(d.target);
      d.unixSocket = isUnixSocket(pid, d.inode);
      d.key = d.target;
    } else if (d.target.starts_with("/dev/pts/") || d.target.starts_with("/dev/tty") ||
               d.target == "/dev/console") {
      d.kind = "tty";
    } else if (d.target.starts_with("/") && !d.target.ends_with(" (deleted)")) {
      d.kind = "file";
      d.key = d.target.substr(1);
    } else {
      d.kind = "other";  // anon inodes, deleted files: CRIU restores them itself
    }
    out.push_back(std::move(d));
  }
  return out;
}

nlohmann::json stdioJson(const std::vector<StdioDescriptor>& stdio) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& d : stdio) {
    nlohmann::json entry = {{"fd", d.fd}, {"kind", d.kind}, {"target", d.target}};
    entry["inherit_key"] = d.key.empty() ? nlohmann::json() : nlohmann::json(d.key);
    list.push_back(std::move(entry));
  }
  return list;
}

// --- Progress of the CPU phase ----------------------------------------------

// Bytes of anonymous memory of the process: what CRIU's pages images will
// roughly hold (the total shown while the dump runs).
uint64_t anonymousBytes(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/smaps_rollup", pid));
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("Anonymous:")) {
      return std::strtoull(line.c_str() + 10, nullptr, 10) * 1024;
    }
  }
  return 0;
}

uint64_t directoryBytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    std::error_code sizeError;
    if (it->is_regular_file(sizeError)) total += it->file_size(sizeError);
  }
  return total;
}

// Reports the size of cpu/ while CRIU writes it.
class CpuProgress {
 public:
  CpuProgress(const std::function<void(const nlohmann::json&)>& progress, fs::path dir,
              uint64_t total)
      : progress_(progress), dir_(std::move(dir)), total_(total) {
    if (!progress_) return;
    progress_({{"phase", "cpu"}, {"bytes", 0}, {"total", total_}});
    thread_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return done_; })) {
        progress_({{"phase", "cpu"}, {"bytes", directoryBytes(dir_)}, {"total", total_}});
      }
    });
  }
  ~CpuProgress() { finish(); }
  void finish() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    uint64_t bytes = directoryBytes(dir_);
    progress_({{"phase", "cpu"}, {"bytes", bytes}, {"total", bytes}});
  }

 private:
  const std::function<void(const nlohmann::json&)>& progress_;
  fs::path dir_;
  uint64_t total_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// --- Pre-dump -----------------------------------------------------------------

// Why `criu check --feature mem_dirty_track` said no, in its last line.
std::string dirtyTrackingReason(const ProcessOutput& run) {
  return fmt::format("the kernel does not track dirty pages (criu check --feature mem_dirty_track: {})",
                     criu::lastWords(run));
}

// `pre-dump --track-mem` needs the kernel's soft-dirty bits; CRIU says whether
// they work with `check --feature mem_dirty_track` (exit 0). The answer is the
// running kernel's: asked once per CRIU binary (about 30 ms each time).
Result<bool> dirtyTrackingWorks(const criu::CriuBinary& criu, std::string& reason) {
  static std::mutex mutex;
  static std::map<std::vector<std::string>, std::pair<bool, std::string>> known;
  const std::vector<std::string> line = criu.command({"check", "--feature", "mem_dirty_track"});
  std::lock_guard lock(mutex);
  if (auto it = known.find(line); it != known.end()) {
    reason = it->second.second;
    return it->second.first;
  }
  ASSIGN_OR_RETURN(ProcessOutput run, runCapture(line));
  const bool works = run.exitCode == 0;
  if (!works) reason = dirtyTrackingReason(run);
  known[line] = {works, reason};
  return works;
}

// The process and its descendants (CRIU dumps the whole tree), from /proc.
std::vector<pid_t> processTree(pid_t root) {
  std::multimap<pid_t, pid_t> children;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::end(it); it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto info = std::ifstream(it->path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(info)), std::istreambuf_iterator<char>());
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    children.emplace(static_cast<pid_t>(ppid), static_cast<pid_t>(std::stol(name)));
  }
  std::vector<pid_t> tree{root};
  for (size_t i = 0; i < tree.size(); ++i) {
    auto [begin, end] = children.equal_range(tree[i]);
    for (auto it = begin; it != end; ++it) tree.push_back(it->second);
  }
  return tree;
}

// Without --leave-running, CRIU is told to leave the dumped tree stopped
// (--leave-stopped) rather than to kill it: the tree is killed only once the
// image is published, and resumed if anything fails before. So a checkpoint
// that dies midway (phos killed, a full disk at commit) never costs the job:
// at worst it stays stopped (kill -CONT resumes it).
class StoppedTree {
 public:
  explicit StoppedTree(pid_t root) : root_(root) {}
  ~StoppedTree() {
    if (armed_) signalTree(SIGCONT);
  }
  void arm() { armed_ = true; }
  void kill() {
    if (!armed_) return;
    armed_ = false;
    signalTree(SIGKILL);
  }
  // Neither killed nor resumed: it stays stopped.
  void release() { armed_ = false; }

 private:
  void signalTree(int signal) {
    for (pid_t pid : processTree(root_)) ::kill(pid, signal);
  }
  pid_t root_;
  bool armed_ = false;
};

// Calls afterDump once, on whichever path leaves checkpointProcess.
class AfterDumpGuard {
 public:
  explicit AfterDumpGuard(const std::function<void(bool)>& hook) : hook_(hook) {}
  ~AfterDumpGuard() { call(false); }
  void arm() { armed_ = true; }
  void call(bool dumped) {
    if (!armed_ || called_) return;
    called_ = true;
    if (hook_) hook_(dumped);
  }

 private:
  const std::function<void(bool)>& hook_;
  bool armed_ = false;
  bool called_ = false;
};

// Pre-dump: memory copied while the process runs, so that the final dump
// writes only the pages dirtied since; or why not.
struct PreDump {
  bool done = false;
  double seconds = 0;
  std::string reason;  // why there was none
  static constexpr const char* kDir = "pre-dump";  // in cpu/
};

Result<PreDump> preDump(const criu::CriuBinary& criuBinary, pid_t pid, const fs::path& cpu, bool shellJob,
                        bool pageServer, const std::optional<DumpIdentity>& asUser) {
  PreDump pre;
  ASSIGN_OR_RETURN(bool canPreDump, dirtyTrackingWorks(criuBinary, pre.reason));
  // A page server takes the final dump's pages only (its parent images would
  // have to be on the other side too): no pre-dump then.
  if (canPreDump && pageServer) {
    canPreDump = false;
    pre.reason = "the pages go to a page server (live migration)";
  }
  if (canPreDump && asUser) {
    canPreDump = false;
    pre.reason = fmt::format(
        "CRIU dumps this job as its user (uid {}), and CRIU's unprivileged mode cannot track dirty memory",
        asUser->uid);
  }
  if (!canPreDump) return pre;
  const fs::path dir = cpu / PreDump::kDir;
  std::error_code ec;
  fs::create_directory(dir, ec);
  auto preStart = Clock::now();
  ASSIGN_OR_RETURN(ProcessOutput run,
                   runCapture(withShellJob(criuBinary.command({"pre-dump", "-t", std::to_string(pid), "-D",
                                                               dir.string(), "-o", "pre-dump.log", "--track-mem"}),
                                           shellJob)));
  pre.seconds = secondsSince(preStart);
  if (run.exitCode == 0) {
    pre.done = true;
    return pre;
  }
  // Not fatal: the final dump then copies everything.
  pre.reason = fmt::format("CRIU pre-dump failed (exit {}):{}", run.exitCode, criuErrors(dir / "pre-dump.log", run));
  log::get("checkpoint")->warn("pid {}: {}", pid, pre.reason);
  fs::remove_all(dir, ec);
  return pre;
}

// Why CRIU's dump of `pid` failed (exit non-zero): a step of the action
// script, the process gone, or CRIU's own errors. CRIU resumes the process.
Status dumpFailure(pid_t pid, const ActionChannel* channel, const ProcessOutput& dump, const fs::path& cpu) {
  if (channel && !channel->status(ActionChannel::kPreDump).isOk()) {
    return makeError(Code::kFailedPrecondition,
                     "the checkpoint's step before pid {} was frozen failed, so CRIU did not freeze it: {}", pid,
                     channel->status(ActionChannel::kPreDump).message());
  }
  if (channel && !channel->status(ActionChannel::kPostDump).isOk()) {
    return makeError(Code::kFailedPrecondition,
                     "the checkpoint's step while pid {} was frozen failed, so CRIU resumed it: {}", pid,
                     channel->status(ActionChannel::kPostDump).message());
  }
  // Gone, or a zombie its parent has not reaped yet.
  if (auto now = readProcess(pid); !now.isOk() || now->state == 'Z' || now->state == 'X') {
    return makeError(Code::kFailedPrecondition, "pid {} ended before it could be dumped", pid);
  }
  return makeError(Code::kFailedPrecondition, "CRIU could not dump pid {} (exit {}):{}", pid, dump.exitCode,
                   criuErrors(cpu / "dump.log", dump));
}

// The manifest's state of a dumped process: what it was, how CRIU saw it,
// its GPU state (the hooks'), the protocol and the freeze.
nlohmann::json manifestState(pid_t pid, const ProcessInfo& process, const std::string& criuVersion, bool shellJob,
                             const std::vector<StdioDescriptor>& stdio, const PreDump& pre, double freeze,
                             const CheckpointOptions& options) {
  nlohmann::json cpuState = {{"tool", "criu"},
                             {"version", criuVersion},
                             {"shell_job", shellJob},
                             {"leave_running", options.leaveRunning},
                             {"stdio", stdioJson(stdio)},
                             {"pre_dump", pre.done}};
  if (pre.done) {
    cpuState["pre_dump_seconds"] = pre.seconds;
    cpuState["pre_dump_dir"] = PreDump::kDir;
  } else {
    cpuState["pre_dump_reason"] = pre.reason;
  }
  const CheckpointHooks& hooks = options.hooks;
  return {
      {"process", {{"pid", pid}, {"comm", process.comm}, {"cmdline", process.cmdline}}},
      {"cpu", cpuState},
      {"gpu", hooks.gpuState ? hooks.gpuState() : nlohmann::json{{"sessions", nlohmann::json::array()}}},
      {"protocol", options.protocol},
      {"timings", {{"freeze_seconds", freeze}}},
  };
}

// What the published image at report.image holds, into `report`.
Status countImage(CheckpointReport& report) {
  ASSIGN_OR_RETURN(auto reader, image::ImageReader::open(report.image));
  for (const auto& file : reader->manifest().cpuFiles) {
    report.cpuBytes += file.size;
    ++report.cpuFiles;
  }
  for (const auto& blob : reader->manifest().blobs) report.gpuBytes += blob.size;
  return Status::ok();
}

// The published image's process goes to another host (live migration); on
// failure it runs on here, or stays stopped when the other host may run it.
Status handOver(const CheckpointHooks& hooks, const fs::path& image, pid_t pid, StoppedTree& stopped) {
  bool leaveStopped = false;
  Status handed = hooks.handOver(image, leaveStopped);
  if (handed.isOk()) return handed;
  if (leaveStopped) {
    stopped.release();
    return handed.withContext(fmt::format("pid {} is left stopped (kill -CONT {} resumes it)", pid, pid));
  }
  return handed.withContext(fmt::format("handing pid {} over (it runs on here)", pid));
}

}  // namespace

Result<CheckpointReport> checkpointProcess(pid_t pid, const CheckpointOptions& options) {
  auto start = Clock::now();
  auto log = log::get("checkpoint");
  const CheckpointHooks& hooks = options.hooks;
  ASSIGN_OR_RETURN(ProcessInfo process, readProcess(pid));
  auto criuBinary = criu::locate();
  if (!criuBinary) {
    return makeError(Code::kFailedPrecondition, "CRIU is needed for the CPU state: {}",
                     criuBinary.status().message());
  }
  ASSIGN_OR_RETURN(auto writer,
                   image::ImageWriter::create(options.image, {.codec = options.codec, .owner = options.owner}));
  // A process that does not lead its own session (started from a shell) needs
  // --shell-job, at dump and at restore.
  bool shellJob = process.session != pid;
  fs::path cpu = writer->cpuDirectory();
  std::vector<StdioDescriptor> stdio = readStdio(pid);

  AfterDumpGuard afterDump(hooks.afterDump);
  afterDump.arm();
  if (hooks.beforeDump) {
    RETURN_IF_ERROR_CTX(hooks.beforeDump(*writer), fmt::format("before dumping pid {}", pid));
  }

  const std::optional<DumpIdentity> asUser = dumpAsUser(process);
  ASSIGN_OR_RETURN(const PreDump pre, preDump(*criuBinary, pid, cpu, shellJob, options.pageServerSocket >= 0, asUser));
  std::vector<std::string> argv =
      criuBinary->command({"dump", "-t", std::to_string(pid), "-D", cpu.string(), "-o", "dump.log"});
  argv.push_back(options.leaveRunning ? "--leave-running" : "--leave-stopped");
  if (pre.done) argv.insert(argv.end(), {"--track-mem", "--prev-images-dir", PreDump::kDir});
  // A UNIX socket on stdio whose peer is outside the dumped tree (a
  // supervisor's socketpair): restore attaches it to ours.
  std::set<uint64_t> externalSockets;
  for (const auto& d : stdio) {
    if (d.kind == "socket" && d.unixSocket && externalSockets.insert(d.inode).second) {
      argv.insert(argv.end(), {"--external", fmt::format("unix[{}]", d.inode)});
    }
  }
  // The page server's socket, as CRIU's fd 20 (above the inherited stdio of a restore).
  constexpr int kPageServerFd = 20;
  CaptureOptions dumpOptions;
  if (options.pageServerSocket >= 0) {
    argv.insert(argv.end(), {"--page-server", "--ps-socket", std::to_string(kPageServerFd)});
    dumpOptions.passFds.emplace_back(options.pageServerSocket, kPageServerFd);
  }
  std::unique_ptr<ActionChannel> channel;
  ActionChannel::Hooks actions;
  if (hooks.beforeFreeze) actions[ActionChannel::kPreDump] = [&] { return hooks.beforeFreeze(*writer); };
  if (hooks.whileFrozen) actions[ActionChannel::kPostDump] = [&] { return hooks.whileFrozen(*writer); };
  if (!actions.empty()) {
    ASSIGN_OR_RETURN(channel, ActionChannel::create(std::move(actions)));
    argv.insert(argv.end(), {"--action-script", channel->script().string()});
  }
  // CRIU as the job's user writes into cpu/ through a descriptor (fd 21): the
  // image's staging directory (mode 0700, ours) stays closed to that user, so
  // nothing of an image written for root can be changed by the job's owner.
  image::Fd cpuForUser;
  constexpr int kCpuDirectoryFd = 21;
  if (asUser) {
    cpuForUser = image::Fd(::open(cpu.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!cpuForUser) return errnoError(errno, fmt::format("opening {}", cpu.string()));
    if (::fchown(cpuForUser.get(), asUser->uid, asUser->gid) != 0) {
      return errnoError(errno, fmt::format("giving {} to uid {} for CRIU", cpu.string(), asUser->uid));
    }
    dumpOptions.passFds.emplace_back(cpuForUser.get(), kCpuDirectoryFd);
    auto images = std::find(argv.begin(), argv.end(), "-D") + 1;
    *images = fmt::format("/proc/self/fd/{}", kCpuDirectoryFd);
    if (channel) RETURN_IF_ERROR(channel->lendTo(*asUser));
  }
  log->debug("dumping pid {} ({}) with {}{}", pid, process.comm, criuBinary->path,
             asUser ? fmt::format(" as uid {}", asUser->uid) : "");
  auto freezeStart = Clock::now();
  Result<ProcessOutput> dump = [&] {
    CpuProgress progress(hooks.progress, cpu, anonymousBytes(pid));
    std::vector<std::string> line = withShellJob(argv, shellJob);
    return runCapture(asUser ? runAs(*asUser, line) : line, dumpOptions);
  }();
  cpuForUser.reset();
  double freeze = secondsSince(freezeStart);
  if (channel) channel->stop();
  if (!dump) return std::move(dump).status().withContext("running CRIU");
  // CRIU resumes the process when a dump fails; the writer drops the staging directory.
  if (dump->exitCode != 0) return dumpFailure(pid, channel.get(), *dump, cpu);
  StoppedTree stopped(pid);
  if (!options.leaveRunning) stopped.arm();
  // CRIU succeeded without running a step of the script: the GPU half never
  // saw the process about to freeze, or frozen, so the image would be
  // inconsistent.
  if (const char* missed = channel ? channel->missedStep() : nullptr; missed != nullptr) {
    return makeError(Code::kInternal, "CRIU dumped pid {} without running its {} action script {}", pid, missed,
                     channel->script().string());
  }
  afterDump.call(true);
  if (hooks.beforeCommit) {
    RETURN_IF_ERROR_CTX(hooks.beforeCommit(),
                        fmt::format("saving the GPU state (pid {} {})", pid,
                                    options.leaveRunning ? "keeps running" : "is resumed"));
  }

  writer->setState(manifestState(pid, process, criuBinary->version, shellJob, stdio, pre, freeze, options));
  RETURN_IF_ERROR_CTX(writer->commit(),
                      fmt::format("writing the image (pid {} keeps running)", pid));
  CheckpointReport report;
  report.pid = pid;
  // As ImageWriter names it: "a/../b" and "b/" are the directory b.
  report.image = fs::absolute(options.image).lexically_normal();
  if (!report.image.has_filename()) report.image = report.image.parent_path();
  if (hooks.handOver && !options.leaveRunning) RETURN_IF_ERROR(handOver(hooks, report.image, pid, stopped));
  stopped.kill();  // published: the process ends, as a dump without --leave-running does
  RETURN_IF_ERROR(countImage(report));
  report.freezeSeconds = freeze;
  report.totalSeconds = secondsSince(start);
  return report;
}

Result<CheckpointReport> checkpointForPlugin(pid_t pid, const CheckpointOptions& options,
                                             const PluginSteps& steps) {
  auto start = Clock::now();
  const CheckpointHooks& hooks = options.hooks;
  ASSIGN_OR_RETURN(ProcessInfo process, readProcess(pid));
  ASSIGN_OR_RETURN(
      auto writer,
      image::ImageWriter::create(options.image, {.codec = options.codec, .owner = options.owner}));
  AfterDumpGuard afterDump(hooks.afterDump);
  afterDump.arm();
  if (hooks.beforeDump) {
    RETURN_IF_ERROR_CTX(hooks.beforeDump(*writer), fmt::format("before CRIU dumps pid {}", pid));
  }
  if (hooks.beforeFreeze) {
    RETURN_IF_ERROR_CTX(hooks.beforeFreeze(*writer),
                        fmt::format("before CRIU freezes pid {}", pid));
  }
  // CRIU's steps as the plugin reports them; anything but the one expected
  // means CRIU gave up (it then resumes the process).
  auto expect = [&](std::string_view done, std::string_view wanted) -> Status {
    ASSIGN_OR_RETURN(std::string step, steps.next(done));
    if (step == wanted) return Status::ok();
    return makeError(Code::kFailedPrecondition,
                     "CRIU did not dump pid {}: its plugin reported \"{}\" where \"{}\" was due",
                     pid, step, wanted);
  };
  RETURN_IF_ERROR(expect("paused", "frozen"));
  auto freezeStart = Clock::now();
  if (hooks.whileFrozen) {
    RETURN_IF_ERROR_CTX(hooks.whileFrozen(*writer),
                        fmt::format("while CRIU holds pid {} frozen", pid));
  }
  RETURN_IF_ERROR(expect("saved", "dumped"));
  afterDump.call(true);
  if (hooks.beforeCommit) {
    RETURN_IF_ERROR_CTX(hooks.beforeCommit(), fmt::format("saving the GPU state of pid {}", pid));
  }
  const double freeze = secondsSince(freezeStart);
  writer->setState({
      {"process", {{"pid", pid}, {"comm", process.comm}, {"cmdline", process.cmdline}}},
      // CRIU's images are in the directory that holds this one, written by
      // whoever ran CRIU; this cpu/ is empty.
      {"cpu", {{"tool", "criu-plugin"}, {"images", ".."}, {"leave_running", options.leaveRunning}}},
      {"gpu",
       hooks.gpuState ? hooks.gpuState() : nlohmann::json{{"sessions", nlohmann::json::array()}}},
      {"protocol", options.protocol},
      {"timings", {{"freeze_seconds", freeze}}},
  });
  RETURN_IF_ERROR_CTX(writer->commit(), fmt::format("writing the GPU image of pid {}", pid));
  CheckpointReport report;
  report.pid = pid;
  report.image = fs::absolute(options.image).lexically_normal();
  if (!report.image.has_filename()) report.image = report.image.parent_path();
  RETURN_IF_ERROR(countImage(report));
  report.freezeSeconds = freeze;
  report.totalSeconds = secondsSince(start);
  return report;
}

}  // namespace phos::checkpoint
