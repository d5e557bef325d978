// SPDX-License-Identifier: Apache-2.0
// Which way each parameter's data moves: inferred from the type, corrected by the override table.
#include "directions.h"

#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

namespace phos::apigen {
namespace {

Direction inferred(const Param& p) {
  if (p.kind != ParamKind::kPointer) return Direction::kIn;
  return p.pointeeConst ? Direction::kIn : Direction::kOut;
}

Result<Direction> parseDirection(const std::string& s) {
  if (s == "in") return Direction::kIn;
  if (s == "out") return Direction::kOut;
  if (s == "inout") return Direction::kInOut;
  return makeError(Code::kInvalidArgument, "direction '{}' is not one of in, out, inout", s);
}

}  // namespace

std::string_view directionName(Direction d) {
  switch (d) {
    case Direction::kIn: return "in";
    case Direction::kOut: return "out";
    case Direction::kInOut: return "inout";
  }
  return "in";
}

std::string_view kindName(ParamKind k) {
  switch (k) {
    case ParamKind::kValue: return "value";
    case ParamKind::kHandle: return "handle";
    case ParamKind::kCallback: return "callback";
    case ParamKind::kAddress: return "address";
    case ParamKind::kPointer: return "pointer";
  }
  return "value";
}

Result<DirectionStats> assignDirections(ApiModel& model, const std::string& overridesPath) {
  DirectionStats stats;
  for (EntryPoint& e : model.entryPoints) {
    for (Param& p : e.params) {
      p.direction = inferred(p);
      p.directionWhy.clear();
      if (p.kind == ParamKind::kPointer || p.kind == ParamKind::kAddress) ++stats.pointers;
    }
  }
  if (overridesPath.empty()) return stats;

  std::ifstream in(overridesPath);
  if (!in) return makeError(Code::kNotFound, "cannot open the direction overrides '{}'", overridesPath);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (doc.is_discarded() || !doc.is_object()) {
    return makeError(Code::kInvalidArgument, "{} is not a JSON object", overridesPath);
  }
  for (const auto& [publicName, params] : doc.items()) {
    if (publicName.starts_with("_")) continue;  // "_comment" and the like
    if (!params.is_object()) {
      return makeError(Code::kInvalidArgument, "{}: '{}' must map parameter names to overrides", overridesPath,
                       publicName);
    }
    for (const auto& [paramName, o] : params.items()) {
      if (!o.is_object() || !o.contains("direction") || !o["direction"].is_string() || !o.contains("why") ||
          !o["why"].is_string() || o["why"].get<std::string>().empty()) {
        return makeError(Code::kInvalidArgument,
                         "{}: {}.{} needs {{\"direction\": \"in|out|inout\", \"why\": \"...\"}}", overridesPath,
                         publicName, paramName);
      }
      Result<Direction> d = parseDirection(o["direction"].get<std::string>());
      if (!d.isOk()) return d.status().withContext(fmt::format("{}: {}.{}", overridesPath, publicName, paramName));
      int applied = 0;
      for (EntryPoint& e : model.entryPoints) {
        if (e.publicName != publicName) continue;
        for (Param& p : e.params) {
          if (p.name != paramName) continue;
          if (p.kind != ParamKind::kPointer && p.kind != ParamKind::kAddress) {
            return makeError(Code::kInvalidArgument, "{}: {}.{} is a {}, whose direction is always 'in'",
                             overridesPath, e.symbol, paramName, kindName(p.kind));
          }
          p.direction = *d;
          p.directionWhy = o["why"].get<std::string>();
          ++applied;
          ++stats.overridden;
        }
      }
      if (applied == 0) {
        return makeError(Code::kNotFound, "{}: no entry point named {} has a parameter '{}'", overridesPath,
                         publicName, paramName);
      }
    }
  }
  return stats;
}

}  // namespace phos::apigen
