// SPDX-License-Identifier: Apache-2.0
// Tests of `phos policy` as a user runs it: output, exit codes and error messages.
// Usage: policy_cli_test PATH_TO_PHOS [gtest flags]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "phos/common/subprocess.h"
#include "status_matchers.h"

namespace phos {
namespace {

using ::phos::testing::IsOk;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string phosPath;

constexpr const char* kValid = R"({"gpus": 2, "failures_per_gpu_hour": 1,
  "checkpoint_overhead_seconds": 36, "restore_seconds": 180,
  "levels": [
    {"name": "host-dram", "checkpoint_seconds": 2, "restore_seconds": 10, "failures_per_hour": 2},
    {"name": "local-disk", "checkpoint_seconds": 20, "restore_seconds": 60, "failures_per_hour": 0.5}
  ]})";

class PolicyCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("phos-policy-cli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& text) {
    const fs::path p = dir_ / "input.json";
    std::ofstream(p) << text;
    return p.string();
  }
  ProcessOutput run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {phosPath, "policy"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = runCapture(argv);
    EXPECT_THAT(r, IsOk());
    return r.valueOr({});
  }

  fs::path dir_;
};

TEST_F(PolicyCli, PrintsFrequencyAndLevels) {
  auto r = run({write(kValid)});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  auto doc = nlohmann::json::parse(r.out);
  // N = 2, F = 1/h, O = 0.01 h: f* = sqrt(2 / 0.02) = 10/h; waste
  // 2 (0.05 + 0.05) + 0.1 = 0.3 (single_level_test).
  EXPECT_NEAR(doc["checkpoints_per_hour"].get<double>(), 10.0, 1e-9);
  EXPECT_NEAR(doc["wasted_fraction"].get<double>(), 0.3, 1e-9);
  ASSERT_EQ(doc["levels"].size(), 2u);
  EXPECT_EQ(doc["levels"][0]["name"], "host-dram");
  EXPECT_EQ(doc["levels"][0]["every"], 1);
  EXPECT_EQ(doc["levels"][1]["name"], "local-disk");
  EXPECT_GT(doc["levels"][1]["interval_seconds"].get<double>(), 20.0);
}

TEST_F(PolicyCli, MalformedJsonIsBadInput) {
  auto r = run({write("{\"gpus\": 2,")});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_THAT(r.err, HasSubstr("malformed JSON"));
  EXPECT_EQ(r.out, "");
}

TEST_F(PolicyCli, UnreadableFileIsBadInput) {
  auto r = run({(dir_ / "does-not-exist.json").string()});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot read"));
  auto d = run({dir_.string()});  // a directory opens but cannot be read
  EXPECT_EQ(d.exitCode, 2);
  EXPECT_THAT(d.err, HasSubstr("cannot read"));
}

TEST_F(PolicyCli, MissingLevelsIsBadInput) {
  auto doc = nlohmann::json::parse(kValid);
  doc.erase("levels");
  auto r = run({write(doc.dump())});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_THAT(r.err, HasSubstr("missing field 'levels'"));
}

TEST_F(PolicyCli, InvalidValueNamesTheField) {
  auto doc = nlohmann::json::parse(kValid);
  doc["levels"][1]["checkpoint_seconds"] = -1;
  auto r = run({write(doc.dump())});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_THAT(r.err, HasSubstr("levels[1] (\"local-disk\").checkpoint_seconds"));

  doc = nlohmann::json::parse(kValid);
  doc["checkpoint_overhead_seconds"] = 0;
  r = run({write(doc.dump())});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_THAT(r.err, HasSubstr("checkpoint_overhead_seconds"));
}

TEST_F(PolicyCli, MissingArgumentIsBadInput) {
  auto r = run({});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_THAT(r.err, HasSubstr("input"));
}

TEST_F(PolicyCli, NoSteadyStateIsAFailureNotBadInput) {
  auto doc = nlohmann::json::parse(kValid);
  doc["gpus"] = 64;
  doc["failures_per_gpu_hour"] = 2;
  doc["restore_seconds"] = 600;
  auto r = run({write(doc.dump())});
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_THAT(r.err, HasSubstr("too often"));
}

}  // namespace
}  // namespace phos

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PATH_TO_PHOS [gtest flags]\n", argv[0]);
    return 2;
  }
  phos::phosPath = argv[1];
  return RUN_ALL_TESTS();
}
