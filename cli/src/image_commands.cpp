// SPDX-License-Identifier: Apache-2.0
// phos inspect / phos verify: what an image holds, and whether it is intact.
#include <unistd.h>

#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "byte_units.h"
#include "phos/criu/gpu_state_check.h"
#include "phos/image/reader.h"
#include "subcommands.h"

namespace phos::cli {

namespace {

using nlohmann::json;

// Exit code for an image that cannot be opened: the user named a wrong or
// damaged directory.
int reportOpenError(const char* command, const Status& status) {
  std::fprintf(stderr, "phos %s: %s\n", command, status.message().c_str());
  return kExitBadInput;
}

// verify (and restore): a damaged image exits 1, something that is not an
// image this PhOS reads (missing, foreign, newer format) exits 2.
int openExitCode(const Status& status) {
  return status.code() == Code::kDataLoss || status.code() == Code::kIo ? kExitFailure
                                                                         : kExitBadInput;
}

// `object[key]` as a T, or `otherwise` where it is missing or of another type
// (inspect shows damaged images too: `phos verify` names what is wrong).
template <typename T>
T fieldOr(const json& object, const char* key, T otherwise) {
  if (!object.is_object() || !object.contains(key)) return otherwise;
  try {
    return object[key].get<T>();
  } catch (const json::exception&) {
    return otherwise;
  }
}

// The summary of one GPU session of state.gpu.sessions: its id and pid if
// recorded, and how many objects of each kind it holds.
json sessionSummary(const json& session) {
  json out = json::object();
  if (!session.is_object()) return out;
  for (const char* key : {"id", "session", "pid", "device"}) {
    if (session.contains(key)) out[key] = session[key];
  }
  for (const char* key : {"contexts", "allocations", "modules", "functions", "kernels", "streams", "events",
                          "memory_pools", "pinned"}) {
    if (session.contains(key) && (session[key].is_array() || session[key].is_object())) {
      out[key] = session[key].size();
    }
  }
  // Per module: what it is and the globals saved with it (each context's
  // copy of a library's).
  if (session.contains("modules") && session["modules"].is_array()) {
    json modules = json::array();
    for (const json& m : session["modules"]) {
      if (!m.is_object()) continue;
      json globals = json::array();
      const json saved = fieldOr(m, "globals", json::array());
      for (const json& g : saved.is_array() ? saved : json::array()) {
        globals.push_back({{"name", fieldOr(g, "name", std::string("?"))},
                           {"bytes", fieldOr(g, "bytes", uint64_t{0})},
                           {"context", fieldOr(g, "context", uint64_t{0})}});
      }
      modules.push_back({{"id", fieldOr(m, "id", uint64_t{0})},
                         {"library", fieldOr(m, "library", false)},
                         {"context", fieldOr(m, "context", uint64_t{0})},
                         {"image", fieldOr(m, "image", std::string())},
                         {"globals", globals}});
    }
    out["module_list"] = modules;
  }
  return out;
}

std::string deviceName(const image::BlobInfo& blob) {
  if (!blob.attributes.contains("device")) return "host";
  const json& device = blob.attributes["device"];
  return device.is_string() ? device.get<std::string>() : device.dump();
}

// phos runs with its user's privileges, but the rules for images are the
// same as phosd's (docs/security.md): a user inspects and verifies only image
// directories of its own, and nothing follows links.
image::Requester caller() { return image::Requester{::geteuid()}; }

int runInspect(const std::string& dir, bool asJson) {
  auto reader = image::ImageReader::open(dir, caller());
  if (!reader) return reportOpenError("inspect", reader.status());
  const image::Manifest& m = (*reader)->manifest();
  uint64_t cpuBytes = 0;
  for (const auto& f : m.cpuFiles) cpuBytes += f.size;
  uint64_t raw = 0, stored = 0;
  // Per device (attributes.device) and per kind totals.
  std::map<std::string, uint64_t> perDevice, perKind;
  std::map<std::string, uint64_t> perDeviceBlobs;
  uint64_t gpuMemory = 0, pinned = 0, modules = 0;
  for (const auto& b : m.blobs) {
    raw += b.size;
    stored += b.storedBytes();
    perKind[b.kind] += b.size;
    if (b.kind == "gpu-memory") {
      gpuMemory += b.size;
      perDevice[deviceName(b)] += b.size;
      ++perDeviceBlobs[deviceName(b)];
    } else if (b.kind == "pinned-host") {
      pinned += b.size;
    } else if (b.kind == "module-image") {
      modules += b.size;
    } else if (b.attributes.contains("device")) {
      perDevice[deviceName(b)] += b.size;
      ++perDeviceBlobs[deviceName(b)];
    }
  }
  const json& state = m.state;
  json sessions = json::array();
  if (state.contains("gpu") && state["gpu"].is_object() && state["gpu"].contains("sessions") &&
      state["gpu"]["sessions"].is_array()) {
    for (const auto& session : state["gpu"]["sessions"]) sessions.push_back(sessionSummary(session));
  }
  json cpuState = state.contains("cpu") && state["cpu"].is_object() ? state["cpu"] : json::object();
  json preDump = {{"done", cpuState.value("pre_dump", false)}};
  if (cpuState.contains("pre_dump_reason")) preDump["reason"] = cpuState["pre_dump_reason"];
  if (cpuState.contains("pre_dump_seconds")) preDump["seconds"] = cpuState["pre_dump_seconds"];
  if (asJson) {
    json devices = json::object();
    for (const auto& [device, bytes] : perDevice) {
      devices[device] = {{"bytes", bytes}, {"blobs", perDeviceBlobs[device]}};
    }
    json out = {{"image", dir},
                {"version", m.version},
                {"created", m.created},
                {"state", state},
                {"cpu", {{"files", m.cpuFiles.size()}, {"bytes", cpuBytes}, {"pre_dump", preDump}}},
                {"blobs", {{"count", m.blobs.size()}, {"bytes", raw}, {"stored_bytes", stored}}},
                {"gpu_memory_bytes", gpuMemory},
                {"pinned_bytes", pinned},
                {"module_bytes", modules},
                {"devices", devices},
                {"sessions", sessions},
                {"per_device", perDevice},
                {"per_kind", perKind}};
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  std::printf("image      %s (format %d, created %s)\n", dir.c_str(), m.version,
              m.created.c_str());
  if (state.contains("process") && state["process"].is_object()) {
    const auto& p = state["process"];
    std::printf("process    pid %s, %s\n", p.value("pid", json()).dump().c_str(),
                p.value("comm", std::string("?")).c_str());
  }
  if (state.contains("protocol") && state["protocol"].is_string()) {
    std::printf("protocol   %s\n", state["protocol"].get<std::string>().c_str());
  }
  if (cpuState.value("tool", "") == "criu-plugin") {
    // docs/containers.md: CRIU wrote the CPU half beside this directory.
    std::printf(
        "cpu        CRIU's images in the directory above (dumped by CRIU with PhOS's plugin)\n");
  } else {
    std::printf("cpu        %zu files, %s\n", m.cpuFiles.size(), formatBytes(cpuBytes).c_str());
  }
  if (preDump["done"] == true) {
    std::printf("pre-dump   yes (%.2f s while running)\n", preDump.value("seconds", 0.0));
  } else if (preDump.contains("reason")) {
    std::printf("pre-dump   no: %s\n", preDump["reason"].get<std::string>().c_str());
  }
  if (sessions.empty()) {
    std::printf("gpu        no PhOS session (CPU state only)\n");
  }
  for (const auto& session : sessions) {
    std::string text;
    for (const char* key : {"contexts", "allocations", "modules", "streams", "events"}) {
      if (session.contains(key)) text += fmt::format(", {} {}", session[key].get<uint64_t>(), key);
    }
    std::printf("session    %s%s\n",
                session.contains("id") ? session["id"].dump().c_str()
                                       : session.value("session", json()).dump().c_str(),
                text.c_str());
    std::string objects;
    for (const char* key : {"functions", "kernels", "memory_pools", "pinned"}) {
      if (session.contains(key)) {
        objects += fmt::format("{}{} {}", objects.empty() ? "" : ", ", session[key].get<uint64_t>(), key);
      }
    }
    if (!objects.empty()) std::printf("  objects     %s\n", objects.c_str());
    for (const json& module : session.value("module_list", json::array())) {
      uint64_t imageBytes = 0;
      for (const auto& b : m.blobs) {
        if (b.name == module["image"].get<std::string>()) imageBytes = b.size;
      }
      std::string globals;
      for (const json& g : module["globals"]) {
        globals += fmt::format("{}{} ({})", globals.empty() ? "" : ", ", g["name"].get<std::string>(),
                               formatBytes(g["bytes"].get<uint64_t>()));
      }
      std::printf("  %-7s %#llx: image %s, %zu globals saved%s%s\n",
                  module["library"].get<bool>() ? "library" : "module",
                  static_cast<unsigned long long>(module["id"].get<uint64_t>()), formatBytes(imageBytes).c_str(),
                  module["globals"].size(), globals.empty() ? "" : ": ", globals.c_str());
    }
  }
  std::printf("gpu/pinned %zu blobs, %s (%s stored)\n", m.blobs.size(), formatBytes(raw).c_str(),
              formatBytes(stored).c_str());
  for (const auto& [device, bytes] : perDevice) {
    std::printf("  device %-6s %s in %llu blobs\n", device.c_str(), formatBytes(bytes).c_str(),
                static_cast<unsigned long long>(perDeviceBlobs[device]));
  }
  std::printf("  gpu memory    %s\n", formatBytes(gpuMemory).c_str());
  std::printf("  pinned host   %s\n", formatBytes(pinned).c_str());
  std::printf("  modules       %s\n", formatBytes(modules).c_str());
  for (const auto& [kind, bytes] : perKind) {
    if (kind == "gpu-memory" || kind == "pinned-host" || kind == "module-image") continue;
    std::printf("  %-13s %s\n", kind.c_str(), formatBytes(bytes).c_str());
  }
  return kExitOk;
}

int runVerify(const std::string& dir, bool asJson) {
  auto reader = image::ImageReader::open(dir, caller());
  if (!reader) {
    if (asJson) {
      nlohmann::json out = {{"image", dir}, {"ok", false},
                            {"problems", {{{"where", "manifest"},
                                           {"what", reader.status().message()}}}}};
      std::printf("%s\n", out.dump(2).c_str());
      return openExitCode(reader.status());
    }
    std::fprintf(stderr, "phos verify: %s\n", reader.status().message().c_str());
    return openExitCode(reader.status());
  }
  std::vector<image::Problem> problems = (*reader)->verify();
  for (auto& p : checkpoint::checkGpuState(**reader)) problems.push_back(std::move(p));
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
