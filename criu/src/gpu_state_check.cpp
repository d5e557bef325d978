// SPDX-License-Identifier: Apache-2.0
// checkGpuState: the GPU state's references to blobs, checked without a device.
#include "phos/criu/gpu_state_check.h"

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace phos::checkpoint {

namespace {

using nlohmann::json;

class Checker {
 public:
  explicit Checker(const image::ImageReader& reader) : reader_(reader) {}

  std::vector<image::Problem> run() {
    const json& state = reader_.manifest().state;
    if (!state.is_object() || !state.contains("gpu")) return problems_;
    const json& gpu = state["gpu"];
    if (!gpu.is_object() || !gpu.contains("sessions") || !gpu["sessions"].is_array()) {
      add("gpu", "the GPU state has no list of sessions");
      return problems_;
    }
    for (size_t i = 0; i < gpu["sessions"].size(); ++i) session(gpu["sessions"][i], fmt::format("gpu.sessions[{}]", i));
    return problems_;
  }

 private:
  void add(std::string where, std::string what) { problems_.push_back({std::move(where), std::move(what)}); }

  // The blob an entry names, of `kind`; nullptr (and a problem) if none.
  const image::BlobInfo* blob(const json& entry, const std::string& key, const char* kind, const std::string& where) {
    if (!entry.is_object() || !entry.contains(key) || !entry[key].is_string()) {
      add(where, fmt::format("names no blob (\"{}\")", key));
      return nullptr;
    }
    const std::string name = entry[key].get<std::string>();
    auto index = reader_.findBlob(name);
    if (!index) {
      add(where, fmt::format("blob {} is not in the image", name));
      return nullptr;
    }
    const image::BlobInfo& info = reader_.manifest().blobs[*index];
    if (info.kind != kind) {
      add(where, fmt::format("blob {} is a {} blob, not {}", name, info.kind, kind));
      return nullptr;
    }
    return &info;
  }

  // A sized range (allocation, pinned memory): its blob holds exactly its bytes.
  void sized(const json& entry, const char* kind, const char* what, const std::string& where) {
    const image::BlobInfo* info = blob(entry, "blob", kind, where);
    if (info == nullptr) return;
    if (!entry.contains("bytes") || !entry["bytes"].is_number_unsigned()) {
      add(where, fmt::format("the {} has no size", what));
      return;
    }
    const auto bytes = entry["bytes"].get<uint64_t>();
    if (bytes != info->size) {
      const auto address = entry.contains("address") && entry["address"].is_number_unsigned()
                               ? entry["address"].get<uint64_t>()
                               : uint64_t{0};
      add(where, fmt::format("{} {:#x} is {} bytes, its blob {} holds {}", what, address, bytes, info->name,
                             info->size));
    }
  }

  template <typename Each>
  void list(const json& s, const char* key, const std::string& where, Each&& each) {
    if (!s.contains(key)) return;
    if (!s[key].is_array()) {
      add(where + "." + key, "is not a list");
      return;
    }
    for (size_t j = 0; j < s[key].size(); ++j) each(s[key][j], fmt::format("{}.{}[{}]", where, key, j));
  }

  void session(const json& s, const std::string& where) {
    if (!s.is_object()) {
      add(where, "is not an object");
      return;
    }
    list(s, "allocations", where, [&](const json& a, const std::string& at) { sized(a, "gpu-memory", "allocation", at); });
    list(s, "pinned", where, [&](const json& p, const std::string& at) { sized(p, "pinned-host", "pinned range", at); });
    if (!s.contains("ring")) {
      add(where, "the session's call ring is not in the image");
    } else {
      blob(s["ring"], "blob", "call-ring", where + ".ring");
    }
    if (s.contains("host_calls")) blob(s["host_calls"], "blob", "host-call-queue", where + ".host_calls");
    list(s, "links", where, [&](const json& l, const std::string& at) {
      list(l, "inputs", at,
           [&](const json& in, const std::string& iat) { blob(in, "blob", "link-input", iat); });
    });
    list(s, "modules", where, [&](const json& m, const std::string& at) {
      blob(m, "image", "module-image", at);
      list(m, "globals", at, [&](const json& g, const std::string& gat) {
        if (g.is_object() && g.contains("blob")) sized(g, "module-global", "global", gat);
      });
    });
  }

  const image::ImageReader& reader_;
  std::vector<image::Problem> problems_;
};

}  // namespace

std::vector<image::Problem> checkGpuState(const image::ImageReader& reader) { return Checker(reader).run(); }

}  // namespace phos::checkpoint
