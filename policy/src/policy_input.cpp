// SPDX-License-Identifier: Apache-2.0
// The JSON input and output of `phos policy`; nlohmann's exceptions stop here.
#include "phos/policy/policy_input.h"

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>

#include <nlohmann/json.hpp>

namespace phos::policy {
namespace {

using nlohmann::json;

Status rejectUnknownKeys(const json& object, std::string_view where,
                         std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    bool ok = false;
    for (auto k : known) ok |= key == k;
    if (!ok) {
      // A misspelt field would otherwise be silently ignored and reported as missing.
      return makeError(Code::kInvalidArgument, "{}unknown field '{}'", where, key);
    }
  }
  return Status::ok();
}

Result<double> numberField(const json& object, std::string_view where, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) {
    return makeError(Code::kInvalidArgument, "{}missing field '{}'", where, key);
  }
  if (!it->is_number()) {
    return makeError(Code::kInvalidArgument, "{}field '{}' must be a number, got {}", where, key,
                     it->type_name());
  }
  return it->get<double>();
}

Result<PolicyInput> parseDocument(const json& doc) {
  if (!doc.is_object()) {
    return makeError(Code::kInvalidArgument, "the input must be a JSON object, got {}",
                     doc.type_name());
  }
  RETURN_IF_ERROR(rejectUnknownKeys(doc, "", {"gpus", "failures_per_gpu_hour",
                                              "checkpoint_overhead_seconds", "restore_seconds",
                                              "levels"}));
  PolicyInput in;
  auto gpus = doc.find("gpus");
  if (gpus == doc.end()) return makeError(Code::kInvalidArgument, "missing field 'gpus'");
  if (!gpus->is_number_integer()) {
    return makeError(Code::kInvalidArgument, "field 'gpus' must be an integer, got {}",
                     gpus->is_number() ? gpus->dump() : gpus->type_name());
  }
  const bool tooLarge =
      gpus->is_number_unsigned() ? gpus->get<uint64_t>() > INT_MAX : gpus->get<int64_t>() > INT_MAX;
  if (tooLarge) {
    return makeError(Code::kInvalidArgument, "gpus must be at most {}, got {}", INT_MAX,
                     gpus->dump());
  }
  // Range checked by validate() below, with the same message as for the library.
  in.single.gpus = static_cast<int>(gpus->get<int64_t>());
  ASSIGN_OR_RETURN(in.single.failuresPerGpuHour, numberField(doc, "", "failures_per_gpu_hour"));
  ASSIGN_OR_RETURN(in.single.overheadSeconds, numberField(doc, "", "checkpoint_overhead_seconds"));
  ASSIGN_OR_RETURN(in.single.restoreSeconds, numberField(doc, "", "restore_seconds"));
  RETURN_IF_ERROR(validate(in.single));

  auto levels = doc.find("levels");
  if (levels == doc.end()) {
    return makeError(Code::kInvalidArgument,
                     "missing field 'levels' (a list of {{name, checkpoint_seconds, "
                     "restore_seconds, failures_per_hour}})");
  }
  if (!levels->is_array()) {
    return makeError(Code::kInvalidArgument, "field 'levels' must be an array, got {}",
                     levels->type_name());
  }
  for (size_t i = 0; i < levels->size(); ++i) {
    const json& l = (*levels)[i];
    const std::string where = fmt::format("levels[{}]: ", i);
    if (!l.is_object()) {
      return makeError(Code::kInvalidArgument, "{}must be an object, got {}", where,
                       l.type_name());
    }
    RETURN_IF_ERROR(rejectUnknownKeys(
        l, where, {"name", "checkpoint_seconds", "restore_seconds", "failures_per_hour"}));
    Level level;
    auto name = l.find("name");
    if (name == l.end()) return makeError(Code::kInvalidArgument, "{}missing field 'name'", where);
    if (!name->is_string()) {
      return makeError(Code::kInvalidArgument, "{}field 'name' must be a string, got {}", where,
                       name->type_name());
    }
    level.name = name->get<std::string>();
    ASSIGN_OR_RETURN(level.checkpointSeconds, numberField(l, where, "checkpoint_seconds"));
    ASSIGN_OR_RETURN(level.restoreSeconds, numberField(l, where, "restore_seconds"));
    ASSIGN_OR_RETURN(level.failuresPerHour, numberField(l, where, "failures_per_hour"));
    in.levels.push_back(std::move(level));
  }
  RETURN_IF_ERROR(validate(in.levels));
  return in;
}

}  // namespace

Result<PolicyInput> parsePolicyInput(std::string_view text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    return makeError(Code::kInvalidArgument, "malformed JSON: {}", e.what());
  }
  // get<>() below is only called after the type checks; the guard is for the
  // cases nlohmann still throws on (e.g. number conversions).
  try {
    return parseDocument(doc);
  } catch (const json::exception& e) {
    return makeError(Code::kInvalidArgument, "invalid input: {}", e.what());
  }
}

Result<PolicyInput> loadPolicyInput(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    return makeError(Code::kNotFound, "cannot read {}: {}", path,
                     ec ? ec.message() : "no such file");
  }
  if (std::filesystem::is_directory(status)) {
    return makeError(Code::kInvalidArgument, "cannot read {}: it is a directory", path);
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return makeError(Code::kInvalidArgument, "cannot read {}: {}", path, std::strerror(errno));
  }
  std::string text{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (file.bad()) return makeError(Code::kInvalidArgument, "cannot read {}: read error", path);
  auto input = parsePolicyInput(text);
  if (!input) return std::move(input).status().withContext(path);
  return input;
}

Result<PolicyOutput> computePolicy(const PolicyInput& input) {
  PolicyOutput out;
  ASSIGN_OR_RETURN(out.checkpointsPerHour, optimalCheckpointsPerHour(input.single));
  ASSIGN_OR_RETURN(out.wastedFraction, wastedFraction(input.single, out.checkpointsPerHour));
  if (!(out.wastedFraction < 1.0)) {
    return makeError(Code::kFailedPrecondition,
                     "with {} GPUs failing {} times per hour each, the single-level model wastes "
                     "{:.3g} of the GPU time at its best frequency: failures come too often for "
                     "periodic checkpointing to make progress",
                     input.single.gpus, input.single.failuresPerGpuHour, out.wastedFraction);
  }
  ASSIGN_OR_RETURN(out.plan, planMultiLevel(input.levels));
  return out;
}

std::string renderPolicyOutput(const PolicyInput& input, const PolicyOutput& output) {
  json levels = json::array();
  const auto& s = output.plan.schedule;
  for (size_t i = 0; i < input.levels.size(); ++i) {
    levels.push_back({{"name", input.levels[i].name},
                      {"interval_seconds", s.intervalSeconds[i]},
                      {"every", s.every[i]},
                      {"continuous_interval_seconds",
                       output.plan.continuous.intervalSeconds[i]}});
  }
  json doc = {{"checkpoints_per_hour", output.checkpointsPerHour},
              {"interval_seconds", 3600.0 / output.checkpointsPerHour},
              {"wasted_fraction", output.wastedFraction},
              {"levels", std::move(levels)},
              {"levels_wasted_fraction", output.plan.wastedFraction()}};
  return doc.dump(2);
}

}  // namespace phos::policy
