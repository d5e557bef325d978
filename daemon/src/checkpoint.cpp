// SPDX-License-Identifier: Apache-2.0
// checkpointProcess/restoreProcess: CRIU into and out of a PhOS image.
#include "phos/daemon/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "phos/daemon/criu.h"
#include "phos/image/reader.h"
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
  pid_t session = 0;
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
  info.session = static_cast<pid_t>(session);
  std::ifstream cmdFile(proc / "cmdline");
  for (std::string arg; std::getline(cmdFile, arg, '\0');) info.cmdline.push_back(arg);
  return info;
}

// The lines of CRIU's log that say what went wrong (it prefixes them "Error").
std::string criuErrors(const fs::path& log) {
  std::ifstream in(log);
  std::vector<std::string> errors;
  for (std::string line; std::getline(in, line);) {
    if (line.find("Error") != std::string::npos) errors.push_back(line);
  }
  if (errors.empty()) return "no error lines in " + log.string();
  std::string text;
  for (size_t i = errors.size() > 5 ? errors.size() - 5 : 0; i < errors.size(); ++i) {
    text += "\n  " + errors[i];
  }
  return text;
}

std::vector<std::string> withShellJob(std::vector<std::string> argv, bool shellJob) {
  if (shellJob) argv.push_back("--shell-job");
  return argv;
}

}  // namespace

Result<CheckpointReport> checkpointProcess(pid_t pid, const CheckpointOptions& options) {
  auto start = Clock::now();
  auto log = log::get("checkpoint");
  ASSIGN_OR_RETURN(ProcessInfo process, readProcess(pid));
  ASSIGN_OR_RETURN(auto writer, image::ImageWriter::create(options.image, {.codec = options.codec}));
  auto criuBinary = criu::locate();
  if (!criuBinary) {
    return makeError(Code::kFailedPrecondition, "CRIU is needed for the CPU state: {}",
                     criuBinary.status().message());
  }
  // A process that does not lead its own session (started from a shell) needs
  // --shell-job, at dump and at restore.
  bool shellJob = process.session != pid;
  fs::path cpu = writer->cpuDirectory();
  std::vector<std::string> argv{criuBinary->path, "dump", "-t", std::to_string(pid), "-D",
                                cpu.string(), "-o", "dump.log"};
  if (options.leaveRunning) argv.push_back("--leave-running");
  log->debug("dumping pid {} ({}) with {}", pid, process.comm, criuBinary->path);
  auto freezeStart = Clock::now();
  ASSIGN_OR_RETURN(ProcessOutput dump, runCapture(withShellJob(argv, shellJob)));
  double freeze = secondsSince(freezeStart);
  if (dump.exitCode != 0) {
    // CRIU resumes the process when a dump fails; the writer drops the staging directory.
    return makeError(Code::kFailedPrecondition, "CRIU could not dump pid {} (exit {}):{}", pid,
                     dump.exitCode, criuErrors(cpu / "dump.log"));
  }
  nlohmann::json cmdline = process.cmdline;
  writer->setState({
      {"process", {{"pid", pid}, {"comm", process.comm}, {"cmdline", cmdline}}},
      {"cpu", {{"tool", "criu"}, {"version", criuBinary->version}, {"shell_job", shellJob},
               {"leave_running", options.leaveRunning}}},
      // No phosd session yet: the process's GPU state is not part of this image.
      {"gpu", {{"sessions", nlohmann::json::array()}}},
      {"protocol", "stop-the-world"},
      {"timings", {{"freeze_seconds", freeze}}},
  });
  RETURN_IF_ERROR_CTX(writer->commit(), "writing the image");

  CheckpointReport report;
  report.pid = pid;
  report.image = fs::absolute(options.image);
  ASSIGN_OR_RETURN(auto reader, image::ImageReader::open(report.image));
  for (const auto& file : reader->manifest().cpuFiles) {
    report.cpuBytes += file.size;
    ++report.cpuFiles;
  }
  report.freezeSeconds = freeze;
  report.totalSeconds = secondsSince(start);
  return report;
}

Result<RestoreReport> restoreProcess(const RestoreOptions& options) {
  const fs::path& imageDir = options.image;
  auto start = Clock::now();
  ASSIGN_OR_RETURN(auto reader, image::ImageReader::open(imageDir));
  const nlohmann::json& state = reader->manifest().state;
  if (!state.contains("cpu") || reader->manifest().cpuFiles.empty()) {
    return makeError(Code::kDataLoss, "{}: the image holds no CPU state (cpu/ is empty)",
                     imageDir.string());
  }
  if (auto problems = reader->verifyCpuFiles(); !problems.empty()) {
    return makeError(Code::kDataLoss, "{}: {}: {} (phos verify lists every problem)",
                     imageDir.string(), problems[0].where, problems[0].what);
  }
  auto criuBinary = criu::locate();
  if (!criuBinary) {
    return makeError(Code::kFailedPrecondition, "CRIU is needed for the CPU state: {}",
                     criuBinary.status().message());
  }
  // CRIU's log and pid file go to a private work directory: the image may be
  // read-only and is never modified by a restore.
  char workTemplate[] = "/tmp/phos-restore.XXXXXX";
  if (::mkdtemp(workTemplate) == nullptr) return errnoError(errno, "creating a work directory");
  fs::path work = workTemplate;
  bool shellJob = state["cpu"].value("shell_job", false);
  std::vector<std::string> argv{criuBinary->path, "restore", "-D", reader->cpuDirectory().string(),
                                "-W", work.string(), "-o", "restore.log", "--restore-detached",
                                "--pidfile", (work / "pid").string()};
  ASSIGN_OR_RETURN(ProcessOutput run, runCapture(withShellJob(argv, shellJob)));
  if (run.exitCode != 0) {
    std::string errors = criuErrors(work / "restore.log");
    return makeError(Code::kFailedPrecondition,
                     "CRIU could not restore {} (exit {}; its log is {}):{}", imageDir.string(),
                     run.exitCode, (work / "restore.log").string(), errors);
  }
  RestoreReport report;
  std::ifstream pidFile(work / "pid");
  long restored = 0;
  pidFile >> restored;
  report.pid = static_cast<pid_t>(restored);
  std::error_code ec;
  fs::remove_all(work, ec);
  report.totalSeconds = secondsSince(start);
  return report;
}

}  // namespace phos::checkpoint
