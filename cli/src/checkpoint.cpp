// SPDX-License-Identifier: Apache-2.0
// phos checkpoint / phos restore: a running process into an image and back.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "byte_units.h"
#include "phos/daemon/checkpoint.h"
#include "subcommands.h"

namespace phos::cli {

namespace {

// Errors the user can fix by changing the command line exit with kExitBadInput.
int exitCodeFor(const Status& status) {
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

int runCheckpoint(pid_t pid, const checkpoint::CheckpointOptions& options, bool asJson) {
  auto report = checkpoint::checkpointProcess(pid, options);
  if (!report) {
    std::fprintf(stderr, "phos checkpoint: %s\n", report.status().message().c_str());
    if (report.status().code() == Code::kFailedPrecondition) {
      std::fprintf(stderr, "phos checkpoint: nothing was written; pid %d keeps running\n", pid);
    }
    return exitCodeFor(report.status());
  }
  if (asJson) {
    nlohmann::json out = {{"pid", report->pid},
                          {"image", report->image.string()},
                          {"cpu_bytes", report->cpuBytes},
                          {"cpu_files", report->cpuFiles},
                          {"gpu_bytes", report->gpuBytes},
                          {"freeze_seconds", report->freezeSeconds},
                          {"total_seconds", report->totalSeconds},
                          {"left_running", options.leaveRunning}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "phos: checkpointed pid %d into %s: cpu %s in %llu files; gpu: no PhOS session, CPU "
        "state only; frozen %.2f s, total %.2f s%s\n",
        pid, report->image.c_str(), formatBytes(report->cpuBytes).c_str(),
        static_cast<unsigned long long>(report->cpuFiles), report->freezeSeconds,
        report->totalSeconds, options.leaveRunning ? "; still running" : "; process ended");
  }
  return kExitOk;
}

int runRestore(const std::string& image, bool asJson) {
  auto report = checkpoint::restoreProcess({.image = image});
  if (!report) {
    std::fprintf(stderr, "phos restore: %s\n", report.status().message().c_str());
    return exitCodeFor(report.status());
  }
  if (asJson) {
    nlohmann::json out = {{"pid", report->pid}, {"image", image},
                          {"total_seconds", report->totalSeconds}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("phos: restored pid %d from %s in %.2f s\n", report->pid, image.c_str(),
                report->totalSeconds);
  }
  return kExitOk;
}

}  // namespace

void addCheckpoint(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("checkpoint", "Save a running process into an image");
  struct Args {
    pid_t pid = 0;
    std::string image;
    std::string compress = "none";
    bool leaveRunning = false;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("--pid", args->pid, "process to checkpoint")->required();
  cmd->add_option("--image", args->image, "image directory to create (must not exist)")
      ->required();
  cmd->add_flag("--leave-running", args->leaveRunning,
                "keep the process running after the checkpoint (default: it ends)");
  cmd->add_option("--compress", args->compress, "chunk compression: none, zstd or lz4")
      ->check(CLI::IsMember({"none", "zstd", "lz4"}));
  cmd->add_flag("--json", args->json, "print the result as JSON");
  cmd->callback([&runner, args] {
    runner = [args] {
      checkpoint::CheckpointOptions options;
      options.image = args->image;
      options.leaveRunning = args->leaveRunning;
      options.codec = *image::parseCodec(args->compress);  // CLI11 checked the name
      return runCheckpoint(args->pid, options, args->json);
    };
  });
}

void addRestore(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("restore", "Bring a checkpointed process back");
  auto image = std::make_shared<std::string>();
  auto asJson = std::make_shared<bool>(false);
  cmd->add_option("--image", *image, "image directory")->required();
  cmd->add_flag("--json", *asJson, "print the result as JSON");
  cmd->callback([&runner, image, asJson] {
    runner = [image, asJson] { return runRestore(*image, *asJson); };
  });
}

}  // namespace phos::cli
