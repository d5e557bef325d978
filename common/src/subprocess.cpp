// SPDX-License-Identifier: Apache-2.0
// posix_spawn-based runner that drains stdout and stderr without deadlocking.
#include "phos/common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "phos/common/unique_fd.h"

extern char** environ;

namespace phos {
namespace {

class Pipe {
 public:
  Pipe() = default;
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  Status open() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return errnoError(errno, "pipe2");
    read_.reset(fds[0]);
    write_.reset(fds[1]);
    return Status::ok();
  }
  int readEnd() const { return read_.get(); }
  int writeEnd() const { return write_.get(); }
  void closeWrite() { write_.reset(); }

 private:
  UniqueFd read_, write_;
};

}  // namespace

Result<ProcessOutput> runCapture(const std::vector<std::string>& argv) {
  return runCapture(argv, CaptureOptions{});
}

Result<ProcessOutput> runCapture(const std::vector<std::string>& argv,
                                 const CaptureOptions& options) {
  if (argv.empty()) return makeError(Code::kInvalidArgument, "runCapture: empty argv");
  for (const auto& [ours, theirs] : options.passFds) {
    if (theirs <= 2 || ours < 0) {
      return makeError(Code::kInvalidArgument,
                       "runCapture: cannot pass fd {} as the child's fd {} (must be > 2)", ours,
                       theirs);
    }
  }
  Pipe out, err;
  RETURN_IF_ERROR(out.open());
  RETURN_IF_ERROR(err.open());

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.inheritStdin) {
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  }
  posix_spawn_file_actions_adddup2(&actions, out.writeEnd(), 1);
  posix_spawn_file_actions_adddup2(&actions, err.writeEnd(), 2);
  // dup2 clears FD_CLOEXEC on the copy, so only the chosen numbers reach the child.
  for (const auto& [ours, theirs] : options.passFds) {
    posix_spawn_file_actions_adddup2(&actions, ours, theirs);
  }

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return errnoError(rc, fmt::format("cannot start '{}'", argv[0]));
  out.closeWrite();
  err.closeWrite();

  ProcessOutput result;
  pollfd fds[2] = {{out.readEnd(), POLLIN, 0}, {err.readEnd(), POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open = 2;
  char buf[4096];
  while (open > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open;
      }
    }
  }
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) return errnoError(errno, "waitpid");
  }
  result.exitCode = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  return result;
}

Result<pid_t> spawn(const std::vector<std::string>& argv, int output,
                    const std::vector<std::pair<int, int>>& passFds) {
  if (argv.empty()) return makeError(Code::kInvalidArgument, "spawn: empty argv");
  for (const auto& [ours, theirs] : passFds) {
    if (theirs <= 2 || ours < 0) {
      return makeError(Code::kInvalidArgument, "spawn: cannot pass fd {} as the child's fd {} (must be > 2)", ours,
                       theirs);
    }
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (output >= 0) {
    posix_spawn_file_actions_adddup2(&actions, output, 1);
    posix_spawn_file_actions_adddup2(&actions, output, 2);
  } else {
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  for (const auto& [ours, theirs] : passFds) posix_spawn_file_actions_adddup2(&actions, ours, theirs);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return errnoError(rc, fmt::format("cannot start '{}'", argv[0]));
  return pid;
}

bool processEnded(pid_t pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) return true;
  // A zombie still answers kill(pid, 0) but has no address space left:
  // reading one byte of it fails with ESRCH, where a live process answers
  // EPERM (not ours to read) or EFAULT (address 0 is never mapped). Unlike
  // reading /proc/<pid>/stat this opens no descriptor: the check runs in
  // applications under phos, and CRIU would save a descriptor open at the
  // moment it freezes one, then fail to reopen it once that pid is gone.
  // Where a seccomp filter refuses the call (ENOSYS), a zombie counts as
  // alive until it is reaped.
  char byte = 0;
  iovec local{&byte, 1};
  iovec remote{nullptr, 1};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) < 0 && errno == ESRCH;
}

Result<pid_t> pidInOwnNamespace(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  if (!status) return makeError(Code::kNotFound, "no process {}", pid);
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    pid_t innermost = 0;
    for (pid_t value = 0; fields >> value;) innermost = value;
    if (innermost > 0) return innermost;
    break;
  }
  return makeError(Code::kNotFound, "/proc/{}/status names no NSpid", pid);
}

}  // namespace phos
