// SPDX-License-Identifier: Apache-2.0
// checkpointProcess/restoreProcess: CRIU into and out of a PhOS image, with the GPU half's hooks.
#include "phos/daemon/checkpoint.h"

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

#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "phos/daemon/criu.h"
#include "phos/daemon/gpu_state_check.h"
#include "phos/image/reader.h"
#include "phos/image/safe_open.h"
#include "phos/image/writer.h"

namespace phos::checkpoint {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct ProcessInfo {
  std::string comm;
  std::vector<std::string> cmdline;
  char state = '?';
  pid_t session = 0;
  // Real, effective and saved ids (/proc/PID/status "Uid:" and "Gid:").
  std::array<uid_t, 3> uids{};
  std::array<gid_t, 3> gids{};
};

Result<ProcessInfo> readProcess(pid_t pid) {
  if (pid <= 0) return makeError(Code::kInvalidArgument, "pid {} is not a process id", pid);
  if (::kill(pid, 0) != 0 && errno == ESRCH) {
    return makeError(Code::kNotFound, "no process with pid {}", pid);
  }
  fs::path proc = fs::path("/proc") / std::to_string(pid);
  std::ifstream statFile(proc / "stat");
  std::string stat((std::istreambuf_iterator<char>(statFile)), std::istreambuf_iterator<char>());
  // "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
  size_t open = stat.find('('), close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos) {
    return makeError(Code::kNotFound, "no process with pid {} (cannot read {})", pid,
                     (proc / "stat").string());
  }
  ProcessInfo info;
  info.comm = stat.substr(open + 1, close - open - 1);
  std::istringstream rest(stat.substr(close + 1));
  std::string state;
  long ppid = 0, pgrp = 0, session = 0;
  rest >> state >> ppid >> pgrp >> session;
  info.state = state.empty() ? '?' : state[0];
  info.session = static_cast<pid_t>(session);
  std::ifstream cmdFile(proc / "cmdline");
  for (std::string arg; std::getline(cmdFile, arg, '\0');) info.cmdline.push_back(arg);
  std::ifstream statusFile(proc / "status");
  for (std::string line; std::getline(statusFile, line);) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "Uid:") fields >> info.uids[0] >> info.uids[1] >> info.uids[2];
    if (key == "Gid:") fields >> info.gids[0] >> info.gids[1] >> info.gids[2];
  }
  return info;
}

// Who runs CRIU's dump. A root phosd dumps another user's job as that user
// (its real, effective and saved ids), in CRIU's unprivileged mode with only
// CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE (ambient): the kernel then lets
// CRIU read the job's resource limits (prlimit needs matching ids or
// CAP_SYS_RESOURCE, which containers usually drop: "Can't get rlimit 0"), and
// CRIU, which parses a process the user controls, holds no other privilege.
// The user cannot ptrace or signal-hijack it: its capabilities exceed theirs.
// See docs/security.md "Users checkpoint their own jobs".
struct DumpIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
};

std::optional<DumpIdentity> dumpAsUser(const ProcessInfo& process) {
  if (::geteuid() != 0) return std::nullopt;  // a user's own phosd runs CRIU as itself
  const auto& [ruid, euid, suid] = process.uids;
  const auto& [rgid, egid, sgid] = process.gids;
  // A set-id process (ids that differ) keeps root's dump: CRIU as one of its
  // ids could not read the others' limits either.
  if (ruid == 0 || ruid != euid || ruid != suid || rgid != egid || rgid != sgid) return std::nullopt;
  return DumpIdentity{ruid, rgid};
}

// The command line that runs `argv` as `who` with CRIU's two capabilities
// (util-linux's setpriv: a new uid keeps ambient capabilities across exec).
std::vector<std::string> runAs(const DumpIdentity& who, const std::vector<std::string>& criuArgv) {
  std::vector<std::string> line{"setpriv",
                                fmt::format("--reuid={}", who.uid),
                                fmt::format("--regid={}", who.gid),
                                "--clear-groups",
                                "--inh-caps=-all,+checkpoint_restore,+sys_ptrace",
                                "--ambient-caps=-all,+checkpoint_restore,+sys_ptrace",
                                "--"};
  line.insert(line.end(), criuArgv.begin(), criuArgv.end());
  line.push_back("--unprivileged");
  return line;
}

// The lines of CRIU's log that say what went wrong (it prefixes them "Error").
// CRIU 4.1 run by root in a container logs a harmless "Can't setup
// RLIMIT_NOFILE for self" error on every run; it never is the cause.
// When the log holds none (CRIU could not write it, or failed before it
// opened it), the last lines CRIU printed. A full file system is named as such:
// CRIU's own words for it vary, or are lost with the log it could not write.
std::string criuErrors(const fs::path& log, const ProcessOutput& run) {
  std::ifstream in(log);
  std::vector<std::string> errors;
  for (std::string line; std::getline(in, line);) {
    if (line.find("Error") == std::string::npos) continue;
    if (line.find("RLIMIT_NOFILE for self") != std::string::npos) continue;
    errors.push_back(line);
  }
  if (errors.empty()) {
    std::istringstream printed(run.err + run.out);
    for (std::string line; std::getline(printed, line);) {
      if (line.find_first_not_of(" \t") != std::string::npos) errors.push_back(line);
    }
  }
  std::string text;
  for (size_t i = errors.size() > 5 ? errors.size() - 5 : 0; i < errors.size(); ++i) {
    text += "\n  " + errors[i];
  }
  if (text.empty()) text = "\n  CRIU printed no error (exit " + std::to_string(run.exitCode) + ")";
  struct statvfs fsInfo {};
  const uint64_t freeBytes = ::statvfs(log.parent_path().c_str(), &fsInfo) == 0
                                 ? static_cast<uint64_t>(fsInfo.f_bavail) * fsInfo.f_frsize
                                 : UINT64_MAX;
  if (text.find("No space left on device") != std::string::npos || freeBytes < (1u << 20)) {
    text += fmt::format("\n  the file system of the image is full (No space left on device: {} bytes free)",
                        freeBytes == UINT64_MAX ? 0 : freeBytes);
  }
  return text;
}

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

// --- CRIU's pre-dump and post-dump actions, run in this process ------------

// CRIU runs `--action-script` for each step of a dump with the step in
// CRTOOLS_SCRIPT_ACTION. At "pre-dump" it has started up (about 30 ms here:
// its kernel probes) and is about to freeze the tasks, which still run. At
// "post-dump" it has written its images and still holds the tasks frozen. A
// script that exits non-zero makes CRIU fail the dump: before the freeze it
// never stops the tasks, after it it resumes them (verified with CRIU 4.1.1
// here: /proc/P/stat shows 't' during post-dump, and the task runs on after a
// failing one).
//
// The script is generated into a private directory with two FIFOs: it writes
// the step's name as a line into `request`, and waits for our answer on
// `reply`. This process holds both FIFOs open read-write, so neither side's
// open() blocks; if this process dies, the script reads EOF, fails, and CRIU
// resumes the tasks. The channel holds an flock on its directory while it
// lives: one left by a killed worker (no lock, and older than a minute) is
// removed by the next checkpoint of any worker. Not by pid: phosds of other
// pid namespaces (test hosts, containers) share /tmp, and a pid one of them
// cannot see may live.
class ActionChannel {
 public:
  enum Step { kPreDump, kPostDump };
  using Hooks = std::map<Step, std::function<Status()>>;

  static Result<std::unique_ptr<ActionChannel>> create(Hooks hooks) {
    removeAbandonedDirectories();
    std::string dirTemplate = fmt::format("{}{}.XXXXXX", kPrefix, ::getpid());
    if (::mkdtemp(dirTemplate.data()) == nullptr) {
      return errnoError(errno, "creating a directory for CRIU's action script");
    }
    std::unique_ptr<ActionChannel> channel(new ActionChannel(dirTemplate, std::move(hooks)));
    channel->lock_ = ::open(dirTemplate.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (channel->lock_ < 0 || ::flock(channel->lock_, LOCK_EX) != 0) {
      return errnoError(errno, fmt::format("locking {}", dirTemplate));
    }
    RETURN_IF_ERROR(channel->setUp());
    return channel;
  }

  // For a CRIU that runs as `who` (dumpAsUser): the script and the FIFOs
  // become its; the directory stays ours, searchable but not listable.
  Status lendTo(const DumpIdentity& who) {
    if (::chmod(dir_.c_str(), 0711) != 0) return errnoError(errno, fmt::format("chmod {}", dir_.string()));
    for (const fs::path& file : {script(), dir_ / "request", dir_ / "reply"}) {
      if (::lchown(file.c_str(), who.uid, who.gid) != 0) {
        return errnoError(errno, fmt::format("giving {} to uid {}", file.string(), who.uid));
      }
    }
    return Status::ok();
  }

  ~ActionChannel() {
    stop();
    for (int fd : {request_, reply_, stop_}) {
      if (fd >= 0) ::close(fd);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (lock_ >= 0) ::close(lock_);
  }

  fs::path script() const { return dir_ / "action.sh"; }

  // Ends the serving thread (after CRIU returned).
  void stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    (void)!::write(stop_, &one, sizeof one);
    thread_.join();
  }

  // After stop(): a step with a hook that CRIU never reached (nullptr if
  // none), and a step's outcome.
  const char* missedStep() const {
    for (const auto& [step, hook] : hooks_) {
      if (!outcomes_.contains(step)) return name(step);
    }
    return nullptr;
  }
  Status status(Step step) const {
    auto it = outcomes_.find(step);
    return it == outcomes_.end() ? Status::ok() : it->second;
  }

 private:
  static constexpr const char* kPrefix = "/tmp/phos-criu-action.";

  static const char* name(Step step) { return step == kPreDump ? "pre-dump" : "post-dump"; }

  ActionChannel(fs::path dir, Hooks hooks) : dir_(std::move(dir)), hooks_(std::move(hooks)) {}

  // Directories "<kPrefix><pid>.XXXXXX" of ours that no channel holds.
  static void removeAbandonedDirectories() {
    const fs::path prefix(kPrefix);
    const std::string stem = prefix.filename().string();
    std::error_code ec;
    for (auto it = fs::directory_iterator(prefix.parent_path(), ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!name.starts_with(stem)) continue;
      char* end = nullptr;
      const long pid = std::strtol(name.c_str() + stem.size(), &end, 10);
      if (pid <= 0 || *end != '.') continue;
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
      // A channel is created, then locked: a young directory may be one
      // between the two.
      if (::time(nullptr) - st.st_mtime < 60) continue;
      const int fd = ::open(it->path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
      ::close(fd);
      if (held) continue;
      std::error_code removeError;
      fs::remove_all(it->path(), removeError);
      log::get("checkpoint")->info("removed {}, left by phosd process {}, which no longer holds it",
                                   it->path().string(), pid);
    }
  }

  Status setUp() {
    fs::path request = dir_ / "request", reply = dir_ / "reply";
    for (const fs::path& fifo : {request, reply}) {
      if (::mkfifo(fifo.c_str(), 0600) != 0) {
        return errnoError(errno, fmt::format("creating the FIFO {}", fifo.string()));
      }
    }
    request_ = ::open(request.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    reply_ = ::open(reply.c_str(), O_RDWR | O_CLOEXEC);
    if (request_ < 0 || reply_ < 0) {
      return errnoError(errno, fmt::format("opening the FIFOs in {}", dir_.string()));
    }
    stop_ = ::eventfd(0, EFD_CLOEXEC);
    if (stop_ < 0) return errnoError(errno, "eventfd");
    std::string steps;
    for (const auto& [step, hook] : hooks_) steps += fmt::format("{}{}", steps.empty() ? "" : "|", name(step));
    std::string text = fmt::format(
        "#!/bin/sh\n"
        "# Generated by PhOS (pid {}) for one checkpoint: CRIU's steps {} run the\n"
        "# checkpoint's hooks for them in that process, and fail if they fail.\n"
        "case \"$CRTOOLS_SCRIPT_ACTION\" in {}) ;; *) exit 0 ;; esac\n"
        "echo \"$CRTOOLS_SCRIPT_ACTION\" > '{}' || exit 1\n"
        "read -r answer < '{}' || exit 1\n"
        "[ \"$answer\" = ok ]\n",
        ::getpid(), steps, steps, request.string(), reply.string());
    {
      std::ofstream out(script());
      out << text;
      if (!out) return makeError(Code::kIo, "cannot write {}", script().string());
    }
    if (::chmod(script().c_str(), 0700) != 0) {
      return errnoError(errno, fmt::format("chmod {}", script().string()));
    }
    thread_ = std::thread([this] { serve(); });
    return Status::ok();
  }

  void serve() {
    std::string line;
    for (;;) {
      pollfd fds[2] = {{request_, POLLIN, 0}, {stop_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        // The script then waits for ever, and CRIU with it.
        log::get("checkpoint")->error("waiting for CRIU's action script: {}", std::strerror(errno));
        return;
      }
      if (fds[1].revents != 0) return;
      char buf[256];
      ssize_t n = ::read(request_, buf, sizeof buf);
      if (n <= 0) continue;
      line.append(buf, static_cast<size_t>(n));
      const size_t end = line.find('\n');
      if (end == std::string::npos) continue;
      const std::string said = line.substr(0, end);
      line.clear();
      // Each step runs its hook once: the FIFOs may be the job user's (lendTo),
      // and a step asked for again fails the dump instead of running twice.
      bool ok = false;
      for (auto& [step, hook] : hooks_) {
        if (said != name(step)) continue;
        if (outcomes_.contains(step)) {
          outcomes_[step] = makeError(Code::kFailedPrecondition, "CRIU's {} step was asked for twice", said);
          break;
        }
        outcomes_[step] = hook();
        ok = outcomes_[step].isOk();
      }
      std::string answer = ok ? "ok\n" : "fail\n";
      (void)!::write(reply_, answer.data(), answer.size());
    }
  }

  fs::path dir_;
  Hooks hooks_;
  int request_ = -1, reply_ = -1, stop_ = -1;
  int lock_ = -1;  // flock on dir_ while the channel lives
  std::thread thread_;
  // Written by the serving thread, read after stop() joined it.
  std::map<Step, Status> outcomes_;
};

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


std::vector<std::string> withShellJob(std::vector<std::string> argv, bool shellJob) {
  if (shellJob) argv.push_back("--shell-job");
  return argv;
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

  // Pre-dump: copy memory while the process runs, so the final dump only
  // writes the pages dirtied since.
  std::string preDumpReason;
  ASSIGN_OR_RETURN(bool canPreDump, dirtyTrackingWorks(*criuBinary, preDumpReason));
  bool preDumped = false;
  double preDumpSeconds = 0;
  const std::string preDumpDir = "pre-dump";
  // A page server takes the final dump's pages only (its parent images would
  // have to be on the other side too): no pre-dump then.
  if (canPreDump && options.pageServerSocket >= 0) {
    canPreDump = false;
    preDumpReason = "the pages go to a page server (live migration)";
  }
  const std::optional<DumpIdentity> asUser = dumpAsUser(process);
  if (canPreDump && asUser) {
    canPreDump = false;
    preDumpReason = fmt::format(
        "CRIU dumps this job as its user (uid {}), and CRIU's unprivileged mode cannot track dirty memory",
        asUser->uid);
  }
  if (canPreDump) {
    std::error_code ec;
    fs::create_directory(cpu / preDumpDir, ec);
    auto preStart = Clock::now();
    ASSIGN_OR_RETURN(
        ProcessOutput pre,
        runCapture(withShellJob(criuBinary->command({"pre-dump", "-t", std::to_string(pid), "-D",
                                 (cpu / preDumpDir).string(), "-o", "pre-dump.log", "--track-mem"}),
                                shellJob)));
    preDumpSeconds = secondsSince(preStart);
    if (pre.exitCode == 0) {
      preDumped = true;
    } else {
      // Not fatal: the final dump then copies everything.
      preDumpReason = fmt::format("CRIU pre-dump failed (exit {}):{}", pre.exitCode,
                                  criuErrors(cpu / preDumpDir / "pre-dump.log", pre));
      log->warn("pid {}: {}", pid, preDumpReason);
      fs::remove_all(cpu / preDumpDir, ec);
    }
  }

  std::vector<std::string> argv =
      criuBinary->command({"dump", "-t", std::to_string(pid), "-D", cpu.string(), "-o", "dump.log"});
  argv.push_back(options.leaveRunning ? "--leave-running" : "--leave-stopped");
  if (preDumped) {
    argv.insert(argv.end(), {"--track-mem", "--prev-images-dir", preDumpDir});
  }
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
  if (dump->exitCode != 0) {
    // CRIU resumes the process when a dump fails; the writer drops the staging directory.
    if (channel && !channel->status(ActionChannel::kPreDump).isOk()) {
      return makeError(Code::kFailedPrecondition,
                       "the checkpoint's step before pid {} was frozen failed, so CRIU did not freeze it: {}",
                       pid, channel->status(ActionChannel::kPreDump).message());
    }
    if (channel && !channel->status(ActionChannel::kPostDump).isOk()) {
      return makeError(Code::kFailedPrecondition,
                       "the checkpoint's step while pid {} was frozen failed, so CRIU resumed "
                       "it: {}",
                       pid, channel->status(ActionChannel::kPostDump).message());
    }
    // Gone, or a zombie its parent has not reaped yet.
    if (auto now = readProcess(pid); !now.isOk() || now->state == 'Z' || now->state == 'X') {
      return makeError(Code::kFailedPrecondition, "pid {} ended before it could be dumped", pid);
    }
    return makeError(Code::kFailedPrecondition, "CRIU could not dump pid {} (exit {}):{}", pid,
                     dump->exitCode, criuErrors(cpu / "dump.log", *dump));
  }
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

  nlohmann::json cmdline = process.cmdline;
  nlohmann::json cpuState = {{"tool", "criu"},
                             {"version", criuBinary->version},
                             {"shell_job", shellJob},
                             {"leave_running", options.leaveRunning},
                             {"stdio", stdioJson(stdio)},
                             {"pre_dump", preDumped}};
  if (preDumped) {
    cpuState["pre_dump_seconds"] = preDumpSeconds;
    cpuState["pre_dump_dir"] = preDumpDir;
  } else {
    cpuState["pre_dump_reason"] = preDumpReason;
  }
  writer->setState({
      {"process", {{"pid", pid}, {"comm", process.comm}, {"cmdline", cmdline}}},
      {"cpu", cpuState},
      {"gpu",
       hooks.gpuState ? hooks.gpuState() : nlohmann::json{{"sessions", nlohmann::json::array()}}},
      {"protocol", options.protocol},
      {"timings", {{"freeze_seconds", freeze}}},
  });
  RETURN_IF_ERROR_CTX(writer->commit(),
                      fmt::format("writing the image (pid {} keeps running)", pid));
  CheckpointReport report;
  report.pid = pid;
  // As ImageWriter names it: "a/../b" and "b/" are the directory b.
  report.image = fs::absolute(options.image).lexically_normal();
  if (!report.image.has_filename()) report.image = report.image.parent_path();
  if (hooks.handOver && !options.leaveRunning) {
    bool leaveStopped = false;
    if (Status handed = hooks.handOver(report.image, leaveStopped); !handed.isOk()) {
      if (leaveStopped) {
        stopped.release();
        return handed.withContext(fmt::format("pid {} is left stopped (kill -CONT {} resumes it)", pid, pid));
      }
      return handed.withContext(fmt::format("handing pid {} over (it runs on here)", pid));
    }
  }
  stopped.kill();  // published: the process ends, as a dump without --leave-running does
  ASSIGN_OR_RETURN(auto reader, image::ImageReader::open(report.image));
  for (const auto& file : reader->manifest().cpuFiles) {
    report.cpuBytes += file.size;
    ++report.cpuFiles;
  }
  for (const auto& blob : reader->manifest().blobs) report.gpuBytes += blob.size;
  report.freezeSeconds = freeze;
  report.totalSeconds = secondsSince(start);
  return report;
}

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
    constexpr int kStatusFd = 3;
    auto pid = spawn(criu.command({"lazy-pages", "-D", images.string(), "-W", work.string(), "-o", "lazy-pages.log",
                                   "--status-fd", std::to_string(kStatusFd)}),
                     -1, {{status[1], kStatusFd}});
    ::close(status[1]);
    if (!pid.isOk()) {
      ::close(status[0]);
      return std::move(pid).status().withContext("starting CRIU's lazy-pages server");
    }
    auto server = std::unique_ptr<LazyPagesServer>(new LazyPagesServer(*pid));
    char ready = 1;
    ssize_t n;
    do {
      n = ::read(status[0], &ready, 1);
    } while (n < 0 && errno == EINTR);
    ::close(status[0]);
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

}  // namespace

Result<RestoreReport> restoreProcess(const RestoreOptions& options) {
  const fs::path& imageDir = options.image;
  auto start = Clock::now();
  // The rules phosd applies (docs/security.md), for whoever runs this.
  ASSIGN_OR_RETURN(auto reader, image::ImageReader::open(imageDir, image::Requester{::geteuid()}));
  const nlohmann::json& state = reader->manifest().state;
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
  // CRIU's log and pid file go to a private work directory: the image may be
  // read-only and is never modified by a restore.
  char workTemplate[] = "/tmp/phos-restore.XXXXXX";
  if (::mkdtemp(workTemplate) == nullptr) return errnoError(errno, "creating a work directory");
  fs::path work = workTemplate;
  struct WorkCleanup {
    fs::path dir;
    bool keep = false;
    ~WorkCleanup() {
      std::error_code ec;
      if (!keep) fs::remove_all(dir, ec);
    }
  } cleanup{work};

  RestoreReport report;
  // The process's memory loaded while it runs, where this host can.
  std::unique_ptr<LazyPagesServer> lazyPages;
  if (options.lazyPages) {
    if (Status can = criu::checkLazyPages(*criuBinary); !can.isOk()) report.cpuEagerReason = can.message();
  }
  bool shellJob = state["cpu"].value("shell_job", false);
  std::vector<std::string> argv = criuBinary->command({"restore",
                                "-D",
                                reader->cpuDirectory().string(),
                                "-W",
                                work.string(),
                                "-o",
                                "restore.log",
                                "--restore-detached",
                                "--pidfile",
                                (work / "pid").string()});
  // The standard descriptors: ours stand in for the ones recorded at dump.
  CaptureOptions capture{.inheritStdin = true, .passFds = {}};
  struct FdCloser {
    std::vector<int> fds;
    ~FdCloser() {
      for (int fd : fds) ::close(fd);
    }
  } passed;
  if (options.inheritStdio && state["cpu"].contains("stdio") && state["cpu"]["stdio"].is_array()) {
    std::set<std::string> keys;
    for (const auto& entry : state["cpu"]["stdio"]) {
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
      passed.fds.push_back(copy);
      capture.passFds.emplace_back(copy, 10 + fd);
      argv.insert(argv.end(), {"--inherit-fd", fmt::format("fd[{}]:{}", 10 + fd, key)});
    }
  }

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
      cleanup.keep = true;  // its log is named in the reason
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
  for (int fd : passed.fds) ::close(fd);
  passed.fds.clear();
  if (!run) {
    afterRestore(std::nullopt);
    return std::move(run).status().withContext("running CRIU");
  }
  if (run->exitCode != 0) {
    afterRestore(std::nullopt);
    cleanup.keep = true;  // the log is named in the error
    std::string errors = criuErrors(work / "restore.log", *run);
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
                     run->exitCode, (work / "restore.log").string(), errors, hint);
  }
  {
    std::ifstream pidFile(work / "pid");
    long restored = 0;
    pidFile >> restored;
    report.pid = static_cast<pid_t>(restored);
  }
  report.restoreSeconds = secondsSince(start);
  if (report.pid <= 0) {
    afterRestore(std::nullopt);
    return makeError(Code::kInternal, "CRIU restored {} but wrote no pid into {}",
                     imageDir.string(), (work / "pid").string());
  }
  afterRestore(report.pid);
  // The lazy-pages server exits once all the memory is loaded (or the
  // process is gone): a detached restore returns then; one that waits for
  // the job says when it happened (below, once the job ended).
  auto loaded = [&] {
    if (lazyPages == nullptr) return;
    if (const int exit = lazyPages->waitLoaded(); exit != 0) {
      ProcessOutput none{exit, "", ""};
      report.cpuLoadError = fmt::format("CRIU's lazy-pages server failed (exit {}):{}", exit,
                                        criuErrors(work / "lazy-pages.log", none));
      cleanup.keep = true;  // its log is named there
    }
    report.cpuLoadedSeconds = std::chrono::duration<double>(lazyPages->exitedAt() - start).count();
    lazyPages.reset();
  };
  if (!options.detach) {
    int status = 0;
    for (;;) {
      if (::waitpid(report.pid, &status, 0) >= 0) break;
      if (errno == EINTR) continue;
      return errnoError(errno, fmt::format("waiting for the restored pid {} (it was not "
                                           "re-parented to this process)",
                                           report.pid));
    }
    report.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  loaded();
  report.totalSeconds = secondsSince(start);
  return report;
}

}  // namespace phos::checkpoint
