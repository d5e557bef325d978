// SPDX-License-Identifier: Apache-2.0
// Tests of the policy simulator, and the simulated comparison of optimal and fixed intervals.
#include "phos/policy/simulator.h"

#include <cmath>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "phos/policy/multi_level.h"
#include "phos/policy/single_level.h"
#include "status_matchers.h"

namespace phos::policy {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;

struct Estimate {
  double mean = 0;
  double standardError = 0;
};

// Independent replicas (seeds 1..replicas) of one policy; every policy sees
// the same failure times, so differences between policies are paired.
Estimate replicate(const std::vector<Level>& levels, const SimulatedPolicy& policy,
                   double wallSeconds, int replicas) {
  std::vector<double> w;
  for (int r = 1; r <= replicas; ++r) {
    auto result = simulate(levels, policy, wallSeconds, static_cast<uint64_t>(r));
    EXPECT_THAT(result, IsOk());
    w.push_back(result.valueOr({}).wastedFraction());
  }
  Estimate e;
  for (double x : w) e.mean += x / replicas;
  double var = 0;
  for (double x : w) var += (x - e.mean) * (x - e.mean);
  e.standardError = std::sqrt(var / (replicas - 1) / replicas);
  return e;
}

TEST(Simulator, IsDeterministicPerSeed) {
  std::vector<Level> levels = {{"a", 2, 10, 2}, {"b", 20, 60, 0.5}};
  SimulatedPolicy policy{100, {1, 4}};
  auto a = simulate(levels, policy, 1e6, 42);
  auto b = simulate(levels, policy, 1e6, 42);
  auto c = simulate(levels, policy, 1e6, 43);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(a->failures, b->failures);
  EXPECT_EQ(a->workSeconds, b->workSeconds);
  EXPECT_EQ(a->wallSeconds, b->wallSeconds);
  EXPECT_NE(a->wallSeconds, c->wallSeconds);
}

TEST(Simulator, WithoutFailuresOnlyCheckpointsCost) {
  // 90 s of work, then a level-1 checkpoint of 10 s; every 3rd checkpoint also
  // goes to level 2 (+30 s). Three intervals: 270 s of work in
  // 270 + 10 + 10 + 40 = 330 s, so 60/330 = 0.1818... of the time is wasted.
  std::vector<Level> levels = {{"a", 10, 0, 0}, {"b", 30, 0, 0}};
  auto r = simulate(levels, {90, {1, 3}}, 330 * 1000, 1);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->failures, 0u);
  EXPECT_EQ(r->checkpoints, 3000u);
  EXPECT_NEAR(r->wastedFraction(), 60.0 / 330.0, 1e-12);
  EXPECT_NEAR(r->checkpointSeconds, 60.0 * 1000, 1e-6);
}

TEST(Simulator, RejectsBadPolicies) {
  std::vector<Level> levels = {{"a", 1, 1, 1}};
  EXPECT_THAT(simulate(levels, {0, {1}}, 10, 1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(simulate(levels, {1, {2}}, 10, 1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(simulate(levels, {1, {1}}, 0, 1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(simulate({}, {1, {}}, 10, 1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(simulate({{"a", -1, 1, 1}}, {1, {1}}, 10, 1), StatusIs(Code::kInvalidArgument));
  // 4 levels promoted every 1e6 times: 1e18 > 2^53, checkpoint numbers would be inexact.
  std::vector<Level> four = {{"a", 1, 1, 1}, {"b", 1, 1, 1}, {"c", 1, 1, 1}, {"d", 1, 1, 1}};
  EXPECT_THAT(simulate(four, {1, {1, 1000000, 1000000, 1000000}}, 10, 1),
              StatusIs(Code::kInvalidArgument));
}

// 8 GPUs failing 0.5 times per GPU-hour (4 job failures per hour), O = 5 s,
// R = 60 s: f* = 37.9/h, a checkpoint every 94.9 s.
TEST(SimulatorComparison, SingleLevelOptimumBeatsQuarterAndFourTimes) {
  SingleLevelModel model{8, 0.5, 5.0, 60.0};
  const double optimal = 3600.0 / optimalCheckpointsPerHour(model).value();
  std::vector<Level> job = {{"job", 5.0, 60.0, 4.0}};
  // 5 replicas of 2500 h: about 50 000 failures in all; the standard error of
  // each mean is ~3e-4 against differences of ~0.1 between the policies.
  const double wall = 2500 * 3600.0;
  Estimate best = replicate(job, {optimal, {1}}, wall, 5);
  for (double scale : {0.25, 0.5, 2.0, 4.0}) {
    SCOPED_TRACE(scale);
    Estimate fixed = replicate(job, {optimal * scale, {1}}, wall, 5);
    EXPECT_LT(best.mean + 3 * (best.standardError + fixed.standardError), fixed.mean);
  }
  // The first-order model agrees with the simulation to within its
  // approximations (second-order terms such as failures during checkpoints):
  // 0.172 predicted.
  EXPECT_NEAR(best.mean, wastedFraction(model, 3600.0 / optimal).value(), 0.02);
}

TEST(SimulatorComparison, MultiLevelOptimumBeatsQuarterAndFourTimes) {
  std::vector<Level> levels = {{"peer-gpu", 2, 10, 2},
                               {"host-dram", 8, 30, 1},
                               {"local-disk", 40, 90, 0.5},
                               {"remote", 200, 400, 0.1}};
  auto plan = planMultiLevel(levels);
  ASSERT_THAT(plan, IsOk());
  const auto& s = plan->schedule;
  // 3.6 failures per hour: 5 replicas of 3000 h give about 54 000 failures.
  const double wall = 3000 * 3600.0;
  Estimate best = replicate(levels, {s.intervalSeconds[0], s.every}, wall, 5);
  for (double scale : {0.25, 0.5, 2.0, 4.0}) {
    SCOPED_TRACE(scale);
    Estimate fixed = replicate(levels, {s.intervalSeconds[0] * scale, s.every}, wall, 5);
    EXPECT_LT(best.mean + 3 * (best.standardError + fixed.standardError), fixed.mean);
  }
  // Writing every checkpoint all the way to remote storage at the single-level
  // optimum of the summed cost is much worse than nesting.
  std::vector<Level> flat = levels;
  auto flatSchedule = solveNested(flat, {1, 1, 1, 1});
  ASSERT_THAT(flatSchedule, IsOk());
  Estimate flatEstimate = replicate(levels, {flatSchedule->intervalSeconds[0], {1, 1, 1, 1}}, wall, 5);
  EXPECT_LT(best.mean + 3 * (best.standardError + flatEstimate.standardError), flatEstimate.mean);
  EXPECT_NEAR(best.mean, plan->wastedFraction(), 0.03);
}

}  // namespace
}  // namespace phos::policy
