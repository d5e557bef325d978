// SPDX-License-Identifier: Apache-2.0
#include "criu_support.h"

#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace phos::checkpoint::detail {

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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

std::vector<std::string> withShellJob(std::vector<std::string> argv, bool shellJob) {
  if (shellJob) argv.push_back("--shell-job");
  return argv;
}

}  // namespace phos::checkpoint::detail
