// SPDX-License-Identifier: Apache-2.0
// Logger registry configured from PHOS_LOG and the process's chosen sinks.
#include "phos/common/log.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace phos::log {
namespace {

constexpr const char* kPattern = "[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] [pid %P tid %t] %v";

struct Registry {
  std::mutex mu;
  std::vector<spdlog::sink_ptr> sinks;
  LevelSpec levels;
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  bool configured = false;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: loggers outlive statics
  return *r;
}

Result<spdlog::level::level_enum> parseLevel(std::string_view name) {
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kNames[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"critical", spdlog::level::critical}, {"off", spdlog::level::off},
  };
  for (const auto& [n, level] : kNames) {
    if (n == name) return level;
  }
  return makeError(Code::kInvalidArgument,
                   "unknown log level '{}' (expected trace, debug, info, warn, error, "
                   "critical or off)",
                   name);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

spdlog::level::level_enum LevelSpec::levelFor(std::string_view component) const {
  auto it = components.find(component);
  return it == components.end() ? defaultLevel : it->second;
}

Result<LevelSpec> parseLevelSpec(std::string_view text) {
  LevelSpec spec;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      ASSIGN_OR_RETURN(spec.defaultLevel, parseLevel(item));
      continue;
    }
    std::string_view component = trim(item.substr(0, colon));
    if (component.empty()) {
      return makeError(Code::kInvalidArgument, "PHOS_LOG item '{}' has no component name",
                       item);
    }
    ASSIGN_OR_RETURN(auto level, parseLevel(trim(item.substr(colon + 1))));
    spec.components[std::string(component)] = level;
  }
  return spec;
}

Sinks sinksFromEnvironment() {
  Sinks sinks;
  if (const char* f = std::getenv("PHOS_LOG_FILE"); f != nullptr && *f != '\0') sinks.file = f;
  if (const char* e = std::getenv("PHOS_LOG_STDERR"); e != nullptr && std::string_view(e) == "1") {
    sinks.toStderr = true;
  }
  return sinks;
}

void setup(const Sinks& sinks) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.sinks.clear();
  if (sinks.toStderr) r.sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  std::string fileError;
  if (!sinks.file.empty()) {
    try {
      r.sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(sinks.file));
    } catch (const spdlog::spdlog_ex& e) {
      fileError = e.what();
    }
  }
  for (auto& s : r.sinks) s->set_pattern(kPattern);

  std::string specError;
  const char* env = std::getenv("PHOS_LOG");
  r.levels = LevelSpec{};
  if (env != nullptr) {
    auto parsed = parseLevelSpec(env);
    if (parsed) {
      r.levels = std::move(parsed).value();
    } else {
      specError = parsed.status().message();
    }
  }
  for (auto& [name, logger] : r.loggers) {
    logger->sinks() = r.sinks;
    logger->set_level(r.levels.levelFor(name));
  }
  r.configured = true;

  // Reported through the loggers themselves, outside the lock.
  auto self = std::make_shared<spdlog::logger>("log", r.sinks.begin(), r.sinks.end());
  if (!specError.empty()) self->warn("ignoring PHOS_LOG='{}': {}", env, specError);
  if (!fileError.empty()) self->warn("cannot open log file '{}': {}", sinks.file, fileError);
}

std::shared_ptr<spdlog::logger> get(std::string_view component) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.loggers.find(component);
  if (it != r.loggers.end()) return it->second;
  if (!r.configured) {
    // No setup() yet: stay silent rather than write into someone's stderr.
    const char* env = std::getenv("PHOS_LOG");
    if (env != nullptr) {
      if (auto parsed = parseLevelSpec(env)) r.levels = std::move(parsed).value();
    }
  }
  auto logger = std::make_shared<spdlog::logger>(std::string(component), r.sinks.begin(),
                                                 r.sinks.end());
  logger->set_level(r.levels.levelFor(component));
  logger->flush_on(spdlog::level::warn);
  r.loggers.emplace(std::string(component), logger);
  return logger;
}

}  // namespace phos::log
