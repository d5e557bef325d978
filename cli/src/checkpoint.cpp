// SPDX-License-Identifier: Apache-2.0
// phos checkpoint / phos restore: a running process into an image and back.
#include "phos/common/unique_fd.h"
#include "phos/criu/checkpoint.h"
#include "phos/criu/restore_job.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "busy_wait.h"
#include "byte_units.h"
#include "progress_line.h"
#include "phos/common/ipc/control.h"
#include "subcommands.h"

namespace phos::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Errors the user can fix by changing the command line exit with kExitBadInput.
int checkpointExitCode(const Status& status) {
  switch (status.code()) {
    case Code::kInvalidArgument:
    case Code::kNotFound:
    case Code::kAlreadyExists:
    case Code::kDataLoss:
    case Code::kNotSupported:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

// restore and verify agree: a damaged image is a failure (1), something that
// is not an image this PhOS reads is bad input (2).
int restoreExitCode(const Status& status) {
  switch (status.code()) {
    case Code::kInvalidArgument:
    case Code::kNotFound:
    case Code::kNotSupported:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

// The exit status for phosd's refusal code (ipc::isBadRequest).
int daemonExitCode(const std::string& code) { return ipc::isBadRequest(code) ? kExitBadInput : kExitFailure; }

std::string runtimeDirOf(const std::string& given) {
  return given.empty() ? ipc::runtimeDir() : given;
}

struct CheckpointArgs {
  pid_t pid = 0;
  std::string image;
  std::string compress = "none";
  std::string mode = "cow";
  uint64_t cowReserveMib = 0;  // 0: phosd's default
  std::string peerOffload;      // empty: phosd's default (exact)
  std::string runtimeDir;
  bool leaveRunning = false;
  bool json = false;
};

void printCheckpointReport(const json& report, bool asJson, const std::string& gpuText) {
  if (asJson) {
    std::printf("%s\n", report.dump(2).c_str());
    return;
  }
  std::printf(
      "phos: checkpointed pid %d into %s: cpu %s in %llu files; gpu: %s; frozen %.2f s, "
      "total %.2f s%s\n",
      report.value("pid", 0), report.value("image", std::string()).c_str(),
      formatBytes(report.value("cpu_bytes", uint64_t{0})).c_str(),
      static_cast<unsigned long long>(report.value("cpu_files", uint64_t{0})), gpuText.c_str(),
      report.value("freeze_seconds", 0.0), report.value("total_seconds", 0.0),
      report.value("left_running", false) ? "; still running" : "; process ended");
}

// Without a PhOS session (no daemon, or the process does not use libphos.so)
// the checkpoint is CRIU's alone.
int localCheckpoint(const CheckpointArgs& args, const std::string& why) {
  // A process that runs libphos.so has GPU state only phosd can save: a CRIU
  // image of it alone would restore a job whose GPU memory is gone.
  if (std::ifstream maps(fmt::format("/proc/{}/maps", args.pid)); maps) {
    for (std::string line; std::getline(maps, line);) {
      if (line.find("/libphos.so") != std::string::npos) {
        std::fprintf(stderr,
                     "phos checkpoint: pid %d runs under PhOS (libphos.so is loaded), but %s: its GPU state cannot "
                     "be saved without phosd; nothing was written and it keeps running\n",
                     args.pid, why.c_str());
        return kExitFailure;
      }
    }
  }
  checkpoint::CheckpointOptions options;
  options.image = fs::absolute(args.image).lexically_normal();
  options.leaveRunning = args.leaveRunning;
  options.codec = *image::parseCodec(args.compress);  // CLI11 checked the name
  ProgressLine progress(!args.json);
  options.hooks.progress = [&progress](const json& p) { progress.update(p); };
  auto report = checkpoint::checkpointProcess(args.pid, options);
  progress.clear();
  if (!report) {
    std::fprintf(stderr, "phos checkpoint: %s\n", report.status().message().c_str());
    if (report.status().code() == Code::kFailedPrecondition) {
      std::fprintf(stderr, "phos checkpoint: nothing was written; pid %d keeps running\n",
                   args.pid);
    }
    return checkpointExitCode(report.status());
  }
  json out = {{"pid", report->pid},
              {"image", report->image.string()},
              {"cpu_bytes", report->cpuBytes},
              {"cpu_files", report->cpuFiles},
              {"gpu_bytes", report->gpuBytes},
              {"freeze_seconds", report->freezeSeconds},
              {"total_seconds", report->totalSeconds},
              {"left_running", args.leaveRunning},
              {"gpu_session", false},
              {"gpu_note", why}};
  printCheckpointReport(out, args.json, "no PhOS session, CPU state only (" + why + ")");
  return kExitOk;
}

int checkpointThroughDaemon(const CheckpointArgs& args, const json& request, const std::string& socket,
                            const std::string& image, std::string& busy);

int runCheckpoint(const CheckpointArgs& args) {
  if (args.pid <= 0) {
    std::fprintf(stderr, "phos checkpoint: pid %d is not a process id\n", args.pid);
    return kExitBadInput;
  }
  std::string image = fs::absolute(args.image).lexically_normal().string();
  json request = {{"op", "checkpoint"},
                  {"pid", args.pid},
                  {"image", image},
                  {"leave_running", args.leaveRunning},
                  {"compress", args.compress},
                  {"mode", args.mode}};
  if (args.cowReserveMib > 0) request["cow_reserve_bytes"] = args.cowReserveMib << 20;
  if (!args.peerOffload.empty()) request["peer_offload"] = args.peerOffload;
  std::string socket = ipc::controlSocketPath(runtimeDirOf(args.runtimeDir));
  // A session busy with another checkpoint, or loading its memory after a
  // concurrent restore, takes this one when it is done.
  return retryWhileBusy("checkpoint", args.json, [&](std::string& busy) {
    return checkpointThroughDaemon(args, request, socket, image, busy);
  });
}

// One request to phosd; `busy` gets phosd's words when the session was busy
// (nothing was done: the caller tries again).
int checkpointThroughDaemon(const CheckpointArgs& args, const json& request, const std::string& socket,
                            const std::string& image, std::string& busy) {
  auto stream = ipc::ControlStream::open(socket, request.dump());
  if (!stream) {
    if (stream.status().code() == Code::kUnavailable) {
      return localCheckpoint(args, stream.status().message());
    }
    std::fprintf(stderr, "phos checkpoint: %s\n", stream.status().message().c_str());
    return kExitFailure;
  }
  ProgressLine progress(!args.json);
  for (;;) {
    auto line = stream->readLine();
    if (!line) {
      progress.clear();
      std::fprintf(stderr,
                   "phos checkpoint: phosd stopped answering before the checkpoint of pid %d "
                   "finished (%s); no image was published at %s\n",
                   args.pid, line.status().message().c_str(), image.c_str());
      return kExitFailure;
    }
    json message = json::parse(*line, nullptr, /*allow_exceptions=*/false);
    if (!message.is_object()) {
      progress.clear();
      std::fprintf(stderr, "phos checkpoint: phosd sent a line that is not a JSON object: %s\n",
                   line->c_str());
      return kExitFailure;
    }
    if (message.contains("progress")) {
      progress.update(message["progress"]);
      continue;
    }
    if (!message.contains("ok")) continue;  // a line of a newer phosd: not ours to judge
    progress.clear();
    if (message["ok"] == true) {
      json report = message.value("report", json::object());
      if (!report.is_object()) report = json::object();
      if (!report.contains("pid")) report["pid"] = args.pid;
      if (!report.contains("image")) report["image"] = image;
      if (!report.contains("left_running")) report["left_running"] = args.leaveRunning;
      report["gpu_session"] = true;
      std::string gpuText = fmt::format("{} from phosd, {} (GPU calls waited {:.2f} s)",
                                        formatBytes(report.value("gpu_bytes", uint64_t{0})),
                                        report.value("protocol", std::string("stop-the-world")),
                                        report.value("gpu_stall_seconds", 0.0));
      if (report.contains("fallback")) gpuText += "; copy-on-write fell back: " + report["fallback"].get<std::string>();
      printCheckpointReport(report, args.json, gpuText);
      return kExitOk;
    }
    std::string code = message.value("code", std::string());
    std::string error = message.value("error", std::string("phosd refused the checkpoint"));
    if (code == ipc::kNoSession) return localCheckpoint(args, error);
    if (code == ipc::kBusy) {
      busy = error.substr(0, error.find("; try again"));
      return kExitFailure;
    }
    std::fprintf(stderr, "phos checkpoint: %s\n", error.c_str());
    return daemonExitCode(code);
  }
}

// --- restore -------------------------------------------------------------------

// While phos restore waits for the job it brought back, the signals a user
// sends to phos go to the job (Ctrl-C on a terminal, kill from a supervisor).
// The handlers are installed before CRIU runs (the job may run, and be
// signalled, before CRIU has returned its pid): a signal that comes before the
// pid is known waits in gPending.
std::atomic<pid_t> gForwardTo{0};
std::atomic<int> gPending{0};
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

void forwardSignal(int signal) {
  pid_t pid = gForwardTo.load();
  if (pid > 0) {
    ::kill(pid, signal);
  } else {
    gPending = signal;
  }
}

void installForwarding() {
  struct sigaction action {};
  action.sa_handler = forwardSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : kForwarded) ::sigaction(signal, &action, nullptr);
}

void forwardSignalsTo(pid_t pid) {
  gForwardTo = pid;
  if (int pending = gPending.exchange(0); pending != 0) ::kill(pid, pending);
}

// No job came back: a signal received meanwhile ends phos as it would have.
void uninstallForwarding() {
  for (int signal : kForwarded) ::signal(signal, SIG_DFL);
  if (int pending = gPending.exchange(0); pending != 0) ::raise(pending);
}

struct RestoreArgs {
  std::string image;
  std::string runtimeDir;
  bool detach = false;
  bool keepDescriptors = false;
  std::string stdio[3];  // --stdin, --stdout, --stderr: files for the job's 0, 1, 2
  bool json = false;
  bool eager = false;
};

int runRestore(const RestoreArgs& args) {
  ProgressLine progress(!args.json);
  checkpoint::JobRestoreOptions options;
  options.image = args.image;
  options.runtimeDir = runtimeDirOf(args.runtimeDir);
  options.detach = args.detach;
  options.eager = args.eager;
  options.inheritStdio = !args.keepDescriptors;
  for (int fd = 0; fd < 3; ++fd) options.stdio[fd] = args.stdio[fd];
  options.progress = [&progress](const json& p) {
    if (p.is_null()) {
      progress.clear();
    } else {
      progress.update(p);
    }
  };
  options.startDaemon = [&options] { return ensureDaemon(options.runtimeDir, ""); };
  options.running = [&args](pid_t pid, double seconds) {
    if (args.detach) return;
    forwardSignalsTo(pid);
    if (!args.json) {
      // stdout belongs to the job now: phos speaks on stderr.
      std::fprintf(stderr, "phos: restored pid %d from %s in %.2f s; waiting for it to exit\n", pid,
                   args.image.c_str(), seconds);
    }
  };
  options.rolledBack = [](const std::string& why) {
    std::fprintf(stderr, "phos restore: %s; the process is restored again, its device memory loaded first\n",
                 why.c_str());
    gForwardTo = 0;  // the first process is gone
  };
  if (!args.detach) installForwarding();
  auto report = checkpoint::restoreJob(options);
  if (!report) {
    std::fprintf(stderr, "phos restore: %s\n", report.status().message().c_str());
    if (!args.detach && gForwardTo.load() <= 0) uninstallForwarding();
    return restoreExitCode(report.status());
  }
  const pid_t pid = report->process.pid;
  if (!report->loadError.empty()) std::fprintf(stderr, "phos restore: pid %d: %s\n", pid, report->loadError.c_str());
  if (!report->adoptError.empty()) {
    std::fprintf(stderr, "phos restore: pid %d runs, but phosd did not give it its GPU session back: %s\n", pid,
                 report->adoptError.c_str());
  }
  if (!report->process.cpuLoadError.empty()) {
    std::fprintf(stderr, "phos restore: pid %d: %s\n", pid, report->process.cpuLoadError.c_str());
  }
  const json out = report->toJson(args.image, args.detach);
  if (args.detach) {
    if (args.json) {
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("phos: restored pid %d from %s in %.2f s\n", pid, args.image.c_str(),
                  report->process.restoreSeconds);
    }
    return report->clean() ? kExitOk : kExitFailure;
  }
  // In the foreground, the job's output is on stdout; our report goes to stderr.
  if (args.json) {
    std::fprintf(stderr, "%s\n", out.dump().c_str());
  } else {
    std::fprintf(stderr, "phos: restored pid %d exited with code %d\n", pid, report->process.exitCode.value_or(0));
  }
  // A process that phosd ended because its memory could not be loaded failed.
  return report->loadError.empty() ? report->process.exitCode.value_or(0) : kExitFailure;
}

}  // namespace

void addCheckpoint(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("checkpoint", "Save a running process into an image");
  auto args = std::make_shared<CheckpointArgs>();
  cmd->add_option("--pid", args->pid, "process to checkpoint")->required();
  cmd->add_option("--image", args->image, "image directory to create (must not exist)")->required();
  cmd->add_flag("--leave-running", args->leaveRunning,
                "keep the process running after the checkpoint (default: it ends)");
  cmd->add_option("--compress", args->compress, "chunk compression: none, zstd or lz4")
      ->check(CLI::IsMember({"none", "zstd", "lz4"}));
  cmd->add_option("--mode", args->mode,
                  "cow (default): with --leave-running the job runs on while its GPU memory is saved, "
                  "copy-on-write (the image is the state when the checkpoint began); recopy: its GPU memory is "
                  "copied while it runs, then what it wrote meanwhile again (the image is the state when the "
                  "checkpoint ends; what migration uses); stop: the job's GPU calls wait until it is copied")
      ->check(CLI::IsMember({"cow", "recopy", "stop"}));
  cmd->add_option("--cow-reserve-mib", args->cowReserveMib,
                  "device memory for copy-on-write shadows, per device (default: half of each device's free "
                  "memory)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  cmd->add_option("--peer-offload", args->peerOffload,
                  "with several devices, how the copy-on-write shadows that do not fit in a device's reserve are "
                  "placed on its peers (docs/offload.md): exact (default), flow, greedy, or baseline (none: "
                  "writers wait for the copy to the image)")
      ->check(CLI::IsMember({"exact", "flow", "greedy", "baseline"}));
  cmd->add_option("--runtime-dir", args->runtimeDir,
                  "where phosd's control socket lives (default: $PHOS_RUNTIME_DIR, /run/phos "
                  "for root)");
  cmd->add_flag("--json", args->json, "print the result as JSON (and no progress)");
  cmd->callback([&runner, args] { runner = [args] { return runCheckpoint(*args); }; });
}

void addRestore(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand(
      "restore", "Bring a checkpointed process back; waits for it and exits with its exit code");
  auto args = std::make_shared<RestoreArgs>();
  cmd->add_option("--image", args->image, "image directory")->required();
  cmd->add_flag("--detach", args->detach,
                "return once the process runs and all its memory is loaded, print its pid");
  cmd->add_flag("--eager", args->eager,
                "load all memory before the process runs (default: it runs at once; each GPU call waits only "
                "for the device memory it touches, and its CPU memory is loaded as it touches it where CRIU can)");
  cmd->add_flag("--keep-descriptors", args->keepDescriptors,
                "restore stdin/stdout/stderr as they were at the checkpoint (default: attach "
                "them to phos restore's own)");
  cmd->add_option("--stdin", args->stdio[0], "the job's stdin comes from FILE (default: phos restore's own)");
  cmd->add_option("--stdout", args->stdio[1], "the job's stdout is appended to FILE (default: phos restore's own)");
  cmd->add_option("--stderr", args->stdio[2], "the job's stderr is appended to FILE (default: phos restore's own)");
  cmd->add_option("--runtime-dir", args->runtimeDir,
                  "where phosd's control socket lives, for images with GPU state");
  cmd->add_flag("--json", args->json,
                "print the result as JSON (on stderr unless --detach: stdout is the job's)");
  cmd->callback([&runner, args] { runner = [args] { return runRestore(*args); }; });
}

}  // namespace phos::cli
