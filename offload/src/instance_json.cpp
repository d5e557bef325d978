// SPDX-License-Identifier: Apache-2.0
// JSON form of offload instances and outcomes; nlohmann's exceptions stop here.
#include "phos/offload/instance_json.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

namespace phos::offload {
namespace {

using nlohmann::json;

Result<const json*> field(const json& object, const std::string& where, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) {
    return makeError(Code::kInvalidArgument, "missing field '{}{}'", where, key);
  }
  return &*it;
}

Result<double> number(const json& value, const std::string& name) {
  if (!value.is_number()) {
    return makeError(Code::kInvalidArgument, "'{}' must be a number, got {}", name, value.dump());
  }
  const double v = value.get<double>();
  if (!std::isfinite(v)) return makeError(Code::kInvalidArgument, "'{}' is not finite", name);
  return v;
}

// Byte counts and indices: whole numbers (1e9 is accepted, 1.5 is not).
Result<int64_t> integer(const json& value, const std::string& name) {
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return makeError(Code::kInvalidArgument, "'{}' is too large ({})", name, u);
    }
    return static_cast<int64_t>(u);
  }
  ASSIGN_OR_RETURN(double v, number(value, name));
  if (v != std::floor(v) || std::abs(v) >= 9.2e18) {
    return makeError(Code::kInvalidArgument, "'{}' must be a whole number, got {}", name,
                     value.dump());
  }
  return static_cast<int64_t>(v);
}

Result<int64_t> integerField(const json& object, const std::string& where, const char* key) {
  ASSIGN_OR_RETURN(const json* v, field(object, where, key));
  return integer(*v, where + key);
}

Result<double> numberField(const json& object, const std::string& where, const char* key) {
  ASSIGN_OR_RETURN(const json* v, field(object, where, key));
  return number(*v, where + key);
}

// A misspelt optional field ("egres_limit") would otherwise be ignored in
// silence, so every key must be one the format knows.
Status onlyKnownKeys(const json& object, const std::string& where,
                     std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (std::string_view k : known) list += fmt::format("{}'{}'", list.empty() ? "" : ", ", k);
      return makeError(Code::kInvalidArgument, "unknown field '{}{}' (known: {})", where, key,
                       list);
    }
  }
  return Status::ok();
}

Result<const json*> arrayField(const json& object, const char* key) {
  ASSIGN_OR_RETURN(const json* v, field(object, "", key));
  if (!v->is_array()) {
    return makeError(Code::kInvalidArgument, "'{}' must be an array", key);
  }
  return v;
}

Result<Instance> fromJson(const json& root) {
  if (!root.is_object()) {
    return makeError(Code::kInvalidArgument, "the instance must be a JSON object");
  }
  RETURN_IF_ERROR(
      onlyKnownKeys(root, "", {"chunk_bytes", "host_bandwidth", "gpus", "links"}));
  Instance in;
  ASSIGN_OR_RETURN(in.chunkBytes, integerField(root, "", "chunk_bytes"));
  ASSIGN_OR_RETURN(in.hostBandwidth, numberField(root, "", "host_bandwidth"));
  ASSIGN_OR_RETURN(const json* gpus, arrayField(root, "gpus"));
  for (size_t i = 0; i < gpus->size(); ++i) {
    const json& g = (*gpus)[i];
    const std::string where = fmt::format("gpus[{}].", i);
    if (!g.is_object()) {
      return makeError(Code::kInvalidArgument, "'gpus[{}]' must be an object", i);
    }
    RETURN_IF_ERROR(onlyKnownKeys(
        g, where, {"checkpoint_bytes", "free_bytes", "egress_limit", "ingress_limit"}));
    GpuState gpu;
    ASSIGN_OR_RETURN(gpu.checkpointBytes, integerField(g, where, "checkpoint_bytes"));
    ASSIGN_OR_RETURN(gpu.freeBytes, integerField(g, where, "free_bytes"));
    if (g.contains("egress_limit")) {
      ASSIGN_OR_RETURN(gpu.egressLimit, numberField(g, where, "egress_limit"));
    }
    if (g.contains("ingress_limit")) {
      ASSIGN_OR_RETURN(gpu.ingressLimit, numberField(g, where, "ingress_limit"));
    }
    in.gpus.push_back(gpu);
  }
  // A node with no links is legal (it can only use the host), so "links" may
  // be absent; when present it must be an array.
  if (root.contains("links")) {
    ASSIGN_OR_RETURN(const json* links, arrayField(root, "links"));
    for (size_t k = 0; k < links->size(); ++k) {
      const json& l = (*links)[k];
      const std::string where = fmt::format("links[{}].", k);
      if (!l.is_object()) {
        return makeError(Code::kInvalidArgument, "'links[{}]' must be an object", k);
      }
      RETURN_IF_ERROR(onlyKnownKeys(l, where, {"a", "b", "bandwidth"}));
      Link link;
      ASSIGN_OR_RETURN(int64_t a, integerField(l, where, "a"));
      ASSIGN_OR_RETURN(int64_t b, integerField(l, where, "b"));
      ASSIGN_OR_RETURN(link.bandwidth, numberField(l, where, "bandwidth"));
      const auto gpuCount = static_cast<int64_t>(in.gpus.size());
      for (int64_t end : {a, b}) {
        if (end < 0 || end >= gpuCount) {
          return makeError(Code::kInvalidArgument,
                           "links[{}] names GPU {}, but there are only {} GPUs (0..{})", k, end,
                           gpuCount, gpuCount - 1);
        }
      }
      link.a = static_cast<int>(a);
      link.b = static_cast<int>(b);
      in.links.push_back(link);
    }
  }
  RETURN_IF_ERROR(validate(in));
  return in;
}

}  // namespace

Result<Instance> parseInstanceJson(std::string_view text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    return makeError(Code::kInvalidArgument, "malformed JSON: {}", e.what());
  }
  return fromJson(root);
}

json instanceToJson(const Instance& instance) {
  json out = {{"chunk_bytes", instance.chunkBytes},
              {"host_bandwidth", instance.hostBandwidth},
              {"gpus", json::array()},
              {"links", json::array()}};
  for (const GpuState& g : instance.gpus) {
    json gpu = {{"checkpoint_bytes", g.checkpointBytes}, {"free_bytes", g.freeBytes}};
    if (g.egressLimit) gpu["egress_limit"] = *g.egressLimit;
    if (g.ingressLimit) gpu["ingress_limit"] = *g.ingressLimit;
    out["gpus"].push_back(gpu);
  }
  for (const Link& l : instance.links) {
    out["links"].push_back({{"a", l.a}, {"b", l.b}, {"bandwidth", l.bandwidth}});
  }
  return out;
}

json outcomeToJson(const Outcome& outcome) {
  json transfers = json::array();
  for (const Transfer& t : outcome.plan.transfers) {
    json to = t.to == kHost ? json("host") : json(t.to);
    transfers.push_back({{"from", t.from}, {"to", to}, {"bytes", t.bytes}});
  }
  return {{"blocking_seconds", outcome.blockingSeconds},
          {"solve_seconds", outcome.solveSeconds},
          {"transfers", transfers}};
}

json outcomesToJson(const std::vector<Outcome>& outcomes) {
  json out = json::object();
  for (const Outcome& o : outcomes) out[std::string(schedulerName(o.scheduler))] = outcomeToJson(o);
  return out;
}

}  // namespace phos::offload
