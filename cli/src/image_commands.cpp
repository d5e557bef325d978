// SPDX-License-Identifier: Apache-2.0
// phos inspect / phos verify: what an image holds, and whether it is intact.
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "byte_units.h"
#include "phos/image/reader.h"
#include "subcommands.h"

namespace phos::cli {

namespace {

// Exit code for an image that cannot be opened: the user named a wrong or
// damaged directory.
int reportOpenError(const char* command, const Status& status) {
  std::fprintf(stderr, "phos %s: %s\n", command, status.message().c_str());
  return kExitBadInput;
}

int runInspect(const std::string& dir, bool asJson) {
  auto reader = image::ImageReader::open(dir);
  if (!reader) return reportOpenError("inspect", reader.status());
  const image::Manifest& m = (*reader)->manifest();
  uint64_t cpuBytes = 0;
  for (const auto& f : m.cpuFiles) cpuBytes += f.size;
  uint64_t raw = 0, stored = 0;
  // Per device (attributes.device) and per kind totals.
  std::map<std::string, uint64_t> perDevice, perKind;
  for (const auto& b : m.blobs) {
    raw += b.size;
    stored += b.storedBytes();
    std::string device = b.attributes.contains("device") ? b.attributes["device"].dump() : "host";
    perDevice[device] += b.size;
    perKind[b.kind] += b.size;
  }
  const nlohmann::json& state = m.state;
  if (asJson) {
    nlohmann::json out = {{"image", dir},
                          {"version", m.version},
                          {"created", m.created},
                          {"state", state},
                          {"cpu", {{"files", m.cpuFiles.size()}, {"bytes", cpuBytes}}},
                          {"blobs", {{"count", m.blobs.size()}, {"bytes", raw},
                                     {"stored_bytes", stored}}},
                          {"per_device", perDevice},
                          {"per_kind", perKind}};
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  std::printf("image      %s (format %d, created %s)\n", dir.c_str(), m.version,
              m.created.c_str());
  if (state.contains("process")) {
    const auto& p = state["process"];
    std::printf("process    pid %s, %s\n", p.value("pid", nlohmann::json()).dump().c_str(),
                p.value("comm", std::string("?")).c_str());
  }
  if (state.contains("protocol")) {
    std::printf("protocol   %s\n", state["protocol"].get<std::string>().c_str());
  }
  std::printf("cpu        %zu files, %s\n", m.cpuFiles.size(), formatBytes(cpuBytes).c_str());
  std::printf("gpu/pinned %zu blobs, %s (%s stored)\n", m.blobs.size(), formatBytes(raw).c_str(),
              formatBytes(stored).c_str());
  for (const auto& [device, bytes] : perDevice) {
    std::printf("  device %-6s %s\n", device.c_str(), formatBytes(bytes).c_str());
  }
  for (const auto& [kind, bytes] : perKind) {
    std::printf("  %-13s %s\n", kind.c_str(), formatBytes(bytes).c_str());
  }
  return kExitOk;
}

int runVerify(const std::string& dir, bool asJson) {
  auto reader = image::ImageReader::open(dir);
  if (!reader) {
    if (asJson) {
      nlohmann::json out = {{"image", dir}, {"ok", false},
                            {"problems", {{{"where", "manifest"},
                                           {"what", reader.status().message()}}}}};
      std::printf("%s\n", out.dump(2).c_str());
      return kExitFailure;
    }
    std::fprintf(stderr, "phos verify: %s\n", reader.status().message().c_str());
    return reader.status().code() == Code::kDataLoss ? kExitFailure : kExitBadInput;
  }
  std::vector<image::Problem> problems = (*reader)->verify();
  const image::Manifest& m = (*reader)->manifest();
  uint64_t chunks = 0;
  for (const auto& b : m.blobs) chunks += b.chunkCount();
  if (asJson) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& p : problems) list.push_back({{"where", p.where}, {"what", p.what}});
    nlohmann::json out = {{"image", dir}, {"ok", problems.empty()}, {"chunks", chunks},
                          {"cpu_files", m.cpuFiles.size()}, {"problems", list}};
    std::printf("%s\n", out.dump(2).c_str());
  } else if (problems.empty()) {
    std::printf("%s: intact (%llu chunks in %zu blobs, %zu cpu files checked)\n", dir.c_str(),
                static_cast<unsigned long long>(chunks), m.blobs.size(), m.cpuFiles.size());
  } else {
    for (const auto& p : problems) {
      std::fprintf(stderr, "%s: %s: %s\n", dir.c_str(), p.where.c_str(), p.what.c_str());
    }
    std::fprintf(stderr, "phos verify: %s is damaged (%zu problems)\n", dir.c_str(),
                 problems.size());
  }
  return problems.empty() ? kExitOk : kExitFailure;
}

}  // namespace

void addInspect(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("inspect", "Show what a checkpoint image holds");
  auto dir = std::make_shared<std::string>();
  auto asJson = std::make_shared<bool>(false);
  cmd->add_option("IMAGE", *dir, "image directory")->required();
  cmd->add_flag("--json", *asJson, "print JSON");
  cmd->callback([&runner, dir, asJson] { runner = [dir, asJson] { return runInspect(*dir, *asJson); }; });
}

void addVerify(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand(
      "verify", "Check an image's structure and every checksum (exit 1 if damaged)");
  auto dir = std::make_shared<std::string>();
  auto asJson = std::make_shared<bool>(false);
  cmd->add_option("IMAGE", *dir, "image directory")->required();
  cmd->add_flag("--json", *asJson, "print JSON");
  cmd->callback([&runner, dir, asJson] { runner = [dir, asJson] { return runVerify(*dir, *asJson); }; });
}

}  // namespace phos::cli
