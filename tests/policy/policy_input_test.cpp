// SPDX-License-Identifier: Apache-2.0
// Tests of the `phos policy` input parser: every rejected document names what is wrong.
#include "phos/policy/policy_input.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "status_matchers.h"

namespace phos::policy {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;
using nlohmann::json;

json validDocument() {
  return json::parse(R"({"gpus": 8, "failures_per_gpu_hour": 0.5,
    "checkpoint_overhead_seconds": 5, "restore_seconds": 60,
    "levels": [
      {"name": "host-dram", "checkpoint_seconds": 2, "restore_seconds": 10, "failures_per_hour": 2},
      {"name": "remote", "checkpoint_seconds": 20, "restore_seconds": 60, "failures_per_hour": 0.5}
    ]})");
}

TEST(PolicyInput, ParsesAValidDocument) {
  auto in = parsePolicyInput(validDocument().dump());
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ(in->single.gpus, 8);
  EXPECT_DOUBLE_EQ(in->single.failuresPerGpuHour, 0.5);
  EXPECT_DOUBLE_EQ(in->single.overheadSeconds, 5);
  EXPECT_DOUBLE_EQ(in->single.restoreSeconds, 60);
  ASSERT_EQ(in->levels.size(), 2u);
  EXPECT_EQ(in->levels[1].name, "remote");
  EXPECT_DOUBLE_EQ(in->levels[1].checkpointSeconds, 20);
  EXPECT_DOUBLE_EQ(in->levels[1].restoreSeconds, 60);
  EXPECT_DOUBLE_EQ(in->levels[1].failuresPerHour, 0.5);
}

TEST(PolicyInput, RendersTheDocumentedFields) {
  auto in = parsePolicyInput(validDocument().dump());
  ASSERT_THAT(in, IsOk());
  auto out = computePolicy(*in);
  ASSERT_THAT(out, IsOk());
  json doc = json::parse(renderPolicyOutput(*in, *out));
  // f* = sqrt(4 / (2 * 5 / 3600)) = sqrt(1440) (single_level_test).
  EXPECT_NEAR(doc["checkpoints_per_hour"].get<double>(), std::sqrt(1440.0), 1e-9);
  EXPECT_NEAR(doc["wasted_fraction"].get<double>(), out->wastedFraction, 1e-15);
  ASSERT_EQ(doc["levels"].size(), 2u);
  EXPECT_EQ(doc["levels"][0]["name"], "host-dram");
  EXPECT_EQ(doc["levels"][0]["every"], 1);
  EXPECT_GE(doc["levels"][1]["every"].get<int>(), 1);
  EXPECT_NEAR(doc["levels"][1]["interval_seconds"].get<double>(),
              doc["levels"][1]["every"].get<int>() *
                  doc["levels"][0]["interval_seconds"].get<double>(),
              1e-6);
}

struct BadCase {
  const char* label;
  std::function<void(json&)> edit;
  const char* expected;  // must appear in the message
};

TEST(PolicyInput, EachBadDocumentNamesTheProblem) {
  const std::vector<BadCase> cases = {
      {"gpus missing", [](json& d) { d.erase("gpus"); }, "missing field 'gpus'"},
      {"gpus zero", [](json& d) { d["gpus"] = 0; }, "gpus must be at least 1"},
      {"gpus negative", [](json& d) { d["gpus"] = -3; }, "gpus must be at least 1"},
      {"gpus fractional", [](json& d) { d["gpus"] = 2.5; }, "'gpus' must be an integer"},
      {"gpus huge", [](json& d) { d["gpus"] = 1ull << 40; }, "gpus must be at most"},
      {"gpus string", [](json& d) { d["gpus"] = "8"; }, "'gpus' must be an integer, got string"},
      {"rate missing", [](json& d) { d.erase("failures_per_gpu_hour"); },
       "missing field 'failures_per_gpu_hour'"},
      {"rate zero", [](json& d) { d["failures_per_gpu_hour"] = 0; }, "failures_per_gpu_hour"},
      {"rate negative", [](json& d) { d["failures_per_gpu_hour"] = -1; }, "failures_per_gpu_hour"},
      {"overhead missing", [](json& d) { d.erase("checkpoint_overhead_seconds"); },
       "missing field 'checkpoint_overhead_seconds'"},
      {"overhead zero", [](json& d) { d["checkpoint_overhead_seconds"] = 0; },
       "checkpoint_overhead_seconds must be"},
      {"overhead bool", [](json& d) { d["checkpoint_overhead_seconds"] = true; },
       "'checkpoint_overhead_seconds' must be a number, got boolean"},
      {"restore missing", [](json& d) { d.erase("restore_seconds"); },
       "missing field 'restore_seconds'"},
      {"restore negative", [](json& d) { d["restore_seconds"] = -5; }, "restore_seconds must be"},
      {"levels missing", [](json& d) { d.erase("levels"); }, "missing field 'levels'"},
      {"levels not array", [](json& d) { d["levels"] = json::object(); },
       "'levels' must be an array"},
      {"levels empty", [](json& d) { d["levels"] = json::array(); }, "at least one level"},
      {"level not object", [](json& d) { d["levels"][1] = 3; }, "levels[1]: must be an object"},
      {"level name missing", [](json& d) { d["levels"][0].erase("name"); },
       "levels[0]: missing field 'name'"},
      {"level name number", [](json& d) { d["levels"][0]["name"] = 1; },
       "levels[0]: field 'name' must be a string"},
      {"level name empty", [](json& d) { d["levels"][0]["name"] = ""; }, "levels[0].name"},
      {"level name twice", [](json& d) { d["levels"][1]["name"] = "host-dram"; }, "used twice"},
      {"level cost missing", [](json& d) { d["levels"][1].erase("checkpoint_seconds"); },
       "levels[1]: missing field 'checkpoint_seconds'"},
      {"level cost zero", [](json& d) { d["levels"][1]["checkpoint_seconds"] = 0; },
       "levels[1] (\"remote\").checkpoint_seconds"},
      {"level restore missing", [](json& d) { d["levels"][0].erase("restore_seconds"); },
       "levels[0]: missing field 'restore_seconds'"},
      {"level restore negative", [](json& d) { d["levels"][0]["restore_seconds"] = -1; },
       "levels[0] (\"host-dram\").restore_seconds"},
      {"level rate missing", [](json& d) { d["levels"][0].erase("failures_per_hour"); },
       "levels[0]: missing field 'failures_per_hour'"},
      {"level rate zero", [](json& d) { d["levels"][0]["failures_per_hour"] = 0; },
       "levels[0] (\"host-dram\").failures_per_hour"},
      {"level rate string", [](json& d) { d["levels"][0]["failures_per_hour"] = "1"; },
       "levels[0]: field 'failures_per_hour' must be a number, got string"},
      {"unknown field", [](json& d) { d["gpu"] = 8; }, "unknown field 'gpu'"},
      {"unknown level field", [](json& d) { d["levels"][0]["cost"] = 1; },
       "levels[0]: unknown field 'cost'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    json doc = validDocument();
    c.edit(doc);
    EXPECT_THAT(parsePolicyInput(doc.dump()),
                StatusIs(Code::kInvalidArgument, HasSubstr(c.expected)));
  }
}

TEST(PolicyInput, MalformedJson) {
  EXPECT_THAT(parsePolicyInput("{\"gpus\": 8,"),
              StatusIs(Code::kInvalidArgument, HasSubstr("malformed JSON")));
  EXPECT_THAT(parsePolicyInput(""), StatusIs(Code::kInvalidArgument, HasSubstr("malformed JSON")));
  EXPECT_THAT(parsePolicyInput("[1, 2]"),
              StatusIs(Code::kInvalidArgument, HasSubstr("must be a JSON object, got array")));
}

TEST(PolicyInput, LoadsFromAFileAndNamesItInErrors) {
  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   ("phos-policy-input-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto good = (dir / "good.json").string();
  std::ofstream(good) << validDocument().dump();
  auto in = loadPolicyInput(good);
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ(in->single.gpus, 8);

  EXPECT_THAT(loadPolicyInput((dir / "missing.json").string()),
              StatusIs(Code::kNotFound, HasSubstr("missing.json")));
  EXPECT_THAT(loadPolicyInput(dir.string()),
              StatusIs(Code::kInvalidArgument, HasSubstr("is a directory")));
  const auto bad = (dir / "bad.json").string();
  std::ofstream(bad) << "{\"gpus\": 0}";
  EXPECT_THAT(loadPolicyInput(bad),
              StatusIs(Code::kInvalidArgument, HasSubstr(bad + ": missing field")));
  std::filesystem::remove_all(dir);
}

TEST(PolicyInput, TooManyFailuresIsNotBadInputButHasNoAnswer) {
  // 64 GPUs failing twice an hour, restoring for 10 minutes: 128 failures per
  // hour each costing 1/6 h of restore alone.
  json doc = validDocument();
  doc["gpus"] = 64;
  doc["failures_per_gpu_hour"] = 2;
  doc["restore_seconds"] = 600;
  auto in = parsePolicyInput(doc.dump());
  ASSERT_THAT(in, IsOk());
  EXPECT_THAT(computePolicy(*in), StatusIs(Code::kFailedPrecondition, HasSubstr("too often")));

  json levels = validDocument();
  levels["levels"][0]["failures_per_hour"] = 60;
  levels["levels"][0]["restore_seconds"] = 120;
  auto in2 = parsePolicyInput(levels.dump());
  ASSERT_THAT(in2, IsOk());
  EXPECT_THAT(computePolicy(*in2), StatusIs(Code::kFailedPrecondition));
}

}  // namespace
}  // namespace phos::policy
