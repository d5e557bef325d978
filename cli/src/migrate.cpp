// SPDX-License-Identifier: Apache-2.0
// phos migrate: a running job to another host's phosd (docs/migration.md).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "busy_wait.h"
#include "byte_units.h"
#include "phos/common/ipc/control.h"
#include "phos/net/channel.h"
#include "progress_line.h"
#include "subcommands.h"

namespace phos::cli {
namespace {

using nlohmann::json;

constexpr int kDefaultPort = 7070;  // phos daemon --listen's usual port

struct MigrateArgs {
  pid_t pid = 0;
  std::string to;
  std::string keyFile;
  std::string mode = "recopy";
  std::string compress = "zstd";
  std::string runtimeDir;
  bool json = false;
};

void printReport(const json& report, const std::string& to) {
  const json m = report.value("migration", json::object());
  const json target = m.value("target_report", json::object());
  std::printf("phos: migrated pid %d to %s (pid %d there), %s\n", report.value("pid", 0), to.c_str(),
              target.value("pid", 0), report.value("protocol", std::string("?")).c_str());
  if (m.contains("downtime_seconds")) {
    std::printf("  downtime %.3f s (GPU calls waited here %.3f s), total %.2f s\n", m.value("downtime_seconds", 0.0),
                report.value("gpu_stall_seconds", 0.0), report.value("total_seconds", 0.0));
  }
  std::printf("  sent while it ran: %s of device memory in %llu chunks; at the end: %s (%llu of %llu chunks were "
              "there already)\n",
              formatBytes(m.value("precopy_wire_bytes", uint64_t{0})).c_str(),
              static_cast<unsigned long long>(m.value("precopy_chunks", uint64_t{0})),
              formatBytes(m.value("image_wire_bytes", uint64_t{0})).c_str(),
              static_cast<unsigned long long>(m.value("cached_chunks", uint64_t{0})),
              static_cast<unsigned long long>(m.value("image_chunks", uint64_t{0})));
}

// One attempt; `busy` gets phosd's words when the session was busy.
int migrateOnce(const MigrateArgs& args, const json& request, const std::string& socket, std::string& busy) {
  auto stream = ipc::ControlStream::open(socket, request.dump());
  if (!stream) {
    std::fprintf(stderr, "phos migrate: %s\n", stream.status().message().c_str());
    return kExitFailure;
  }
  ProgressLine progress(!args.json);
  for (;;) {
    auto line = stream->readLine();
    if (!line) {
      progress.clear();
      std::fprintf(stderr, "phos migrate: phosd stopped answering before the migration of pid %d finished (%s)\n",
                   args.pid, line.status().message().c_str());
      return kExitFailure;
    }
    json message = json::parse(*line, nullptr, false);
    if (!message.is_object()) continue;
    if (message.contains("progress")) {
      progress.update(message["progress"]);
      continue;
    }
    if (!message.contains("ok")) continue;
    progress.clear();
    if (message["ok"] == true) {
      json report = message.value("report", json::object());
      if (args.json) {
        std::printf("%s\n", report.dump(2).c_str());
      } else {
        printReport(report, request["to"].get<std::string>());
      }
      return kExitOk;
    }
    const std::string code = message.value("code", std::string());
    const std::string error = message.value("error", std::string("phosd refused the migration"));
    if (code == ipc::kBusy) {
      busy = error.substr(0, error.find("; try again"));
      return kExitFailure;
    }
    std::fprintf(stderr, "phos migrate: %s\n", error.c_str());
    if (code == ipc::kNoSession) {
      std::fprintf(stderr, "phos migrate: only jobs under PhOS (phos run) migrate\n");
    } else if (error.find("left stopped") == std::string::npos) {
      std::fprintf(stderr, "phos migrate: pid %d runs on here\n", args.pid);
    }
    return ipc::isBadRequest(code) ? kExitBadInput : kExitFailure;
  }
}

int runMigrate(const MigrateArgs& args) {
  if (args.pid <= 0) {
    std::fprintf(stderr, "phos migrate: pid %d is not a process id\n", args.pid);
    return kExitBadInput;
  }
  std::string to = args.to;
  if (to.find(':') == std::string::npos) to += fmt::format(":{}", kDefaultPort);
  json request = {{"op", "migrate"}, {"pid", args.pid}, {"to", to}, {"mode", args.mode}, {"compress", args.compress}};
  if (!args.keyFile.empty()) {
    auto key = net::Key::load(args.keyFile);
    if (!key) {
      std::fprintf(stderr, "phos migrate: %s\n", key.status().message().c_str());
      return kExitBadInput;
    }
    request["key"] = key->hex();
  }
  const std::string socket = ipc::controlSocketPath(args.runtimeDir.empty() ? ipc::runtimeDir() : args.runtimeDir);
  return retryWhileBusy("migrate", args.json,
                        [&](std::string& busy) { return migrateOnce(args, request, socket, busy); });
}

}  // namespace

void addMigrate(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("migrate", "Move a running job to another host's phosd (phos daemon --listen)");
  auto args = std::make_shared<MigrateArgs>();
  cmd->add_option("--pid", args->pid, "the job to move")->required();
  cmd->add_option("--to", args->to, "the target daemon, HOST[:PORT] (port 7070 by default)")->required();
  cmd->add_option("--key", args->keyFile,
                  "the shared key file (default: the one the local daemon was started with, phos daemon --key)");
  cmd->add_option("--mode", args->mode,
                  "recopy (default): device memory goes over while the job runs, then what it wrote meanwhile, and "
                  "the job runs on the target while the rest loads; stop: stop-the-world, everything is copied and "
                  "sent while the job waits")
      ->check(CLI::IsMember({"recopy", "stop"}));
  cmd->add_option("--compress", args->compress,
                  "zstd (default): what crosses the link is compressed when that makes it smaller; none: sent as "
                  "it is (a fast link, or memory that does not compress)")
      ->check(CLI::IsMember({"zstd", "none"}));
  cmd->add_option("--runtime-dir", args->runtimeDir, "the local daemon's runtime directory");
  cmd->add_flag("--json", args->json, "print the report as JSON");
  cmd->callback([&runner, args] { runner = [args] { return runMigrate(*args); }; });
}

}  // namespace phos::cli
