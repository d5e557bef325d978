// SPDX-License-Identifier: Apache-2.0
// Tests of PHOS_LOG parsing and the per-component loggers.
#include "phos/common/log.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace phos::log {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

TEST(LevelSpec, GlobalLevel) {
  auto spec = parseLevelSpec("debug");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->levelFor("shim"), spdlog::level::debug);
}

TEST(LevelSpec, PerComponentLevelsAndDefault) {
  auto spec = parseLevelSpec("warn, shim:debug,daemon:info");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->levelFor("shim"), spdlog::level::debug);
  EXPECT_EQ(spec->levelFor("daemon"), spdlog::level::info);
  EXPECT_EQ(spec->levelFor("vgpu"), spdlog::level::warn);
}

TEST(LevelSpec, EmptyMeansInfo) {
  auto spec = parseLevelSpec("");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->levelFor("cli"), spdlog::level::info);
}

TEST(LevelSpec, RejectsUnknownLevel) {
  EXPECT_THAT(parseLevelSpec("shim:loud"),
              StatusIs(Code::kInvalidArgument, HasSubstr("unknown log level 'loud'")));
}

TEST(LevelSpec, RejectsMissingComponent) {
  EXPECT_THAT(parseLevelSpec(":debug"),
              StatusIs(Code::kInvalidArgument, HasSubstr("no component name")));
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Logger, WritesToFileWithPidAndLevelFilter) {
  std::string path = ::testing::TempDir() + "phos-log-test-" + std::to_string(getpid()) + ".log";
  setenv("PHOS_LOG", "error,shim:debug", 1);
  setup({.toStderr = false, .file = path});
  get("shim")->debug("shim says {}", 42);
  get("daemon")->info("daemon info is filtered");
  get("daemon")->error("daemon error passes");
  get("shim")->flush();
  get("daemon")->flush();
  std::string text = slurp(path);
  EXPECT_THAT(text, HasSubstr("[shim] [debug]"));
  EXPECT_THAT(text, HasSubstr("shim says 42"));
  EXPECT_THAT(text, HasSubstr("pid " + std::to_string(getpid())));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("filtered")));
  EXPECT_THAT(text, HasSubstr("daemon error passes"));
  unsetenv("PHOS_LOG");
  std::remove(path.c_str());
}

TEST(Logger, MalformedSpecIsReportedAndIgnored) {
  std::string path = ::testing::TempDir() + "phos-log-bad-" + std::to_string(getpid()) + ".log";
  setenv("PHOS_LOG", "shim:chatty", 1);
  setup({.toStderr = false, .file = path});
  get("shim")->info("still logging at info");
  get("shim")->flush();
  std::string text = slurp(path);
  EXPECT_THAT(text, HasSubstr("ignoring PHOS_LOG='shim:chatty'"));
  EXPECT_THAT(text, HasSubstr("still logging at info"));
  unsetenv("PHOS_LOG");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace phos::log
