// SPDX-License-Identifier: Apache-2.0
// The worked example of docs/policy.md: every number printed there is checked here.
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
using ::testing::ElementsAre;

const SingleLevelModel kJob{2, 1.0, 36.0, 180.0};
const std::vector<Level> kLevels = {{"host-dram", 2, 10, 2}, {"local-disk", 20, 60, 0.5}};

TEST(WorkedExample, SingleLevel) {
  // f* = sqrt(2 * 1 / (2 * 0.01)) = 10 per hour, one checkpoint every 360 s.
  EXPECT_NEAR(optimalCheckpointsPerHour(kJob).value(), 10.0, 1e-12);
  // 2 * 1 * (0.05 + 1/20) + 0.01 * 10 = 0.2 + 0.1 = 0.3.
  EXPECT_NEAR(wastedFraction(kJob, 10.0).value(), 0.3, 1e-12);
}

TEST(WorkedExample, CostOfGivenIntervals) {
  // t = (81.73, 490.39): numerator 1 + 2/81.73 + 20/490.39 = 1.065254;
  // host-dram loses 2/3600 (40.866 + 1 + 10) = 0.028815;
  // local-disk loses 0.5/3600 (245.197 + 16 + 60) = 0.044611; w = 1.149668.
  const double tau = std::sqrt(7680.0 / 1.1496683153677);
  EXPECT_NEAR(tau, 81.7324, 1e-4);
  EXPECT_NEAR(wallPerWork(kLevels, {tau, 6 * tau}), 1.065254 / (1 - 0.028815 - 0.044611), 2e-6);
  EXPECT_NEAR(wallPerWork(kLevels, {tau, 6 * tau}), 1.1496683, 1e-7);
}

TEST(WorkedExample, ContinuousAlgorithmOne) {
  // Young's intervals (25) start the inner iteration: sqrt(2 C / lambda).
  EXPECT_NEAR(std::sqrt(2 * 2 / (2 / 3600.0)), 84.8528, 1e-4);
  EXPECT_NEAR(std::sqrt(2 * 20 / (0.5 / 3600.0)), 536.6563, 1e-4);
  auto s = solveContinuous(kLevels);
  ASSERT_THAT(s, IsOk());
  ASSERT_GE(s->wallPerIteration.size(), 3u);
  EXPECT_NEAR(s->wallPerIteration[0], 1.150004771, 1e-9);
  EXPECT_NEAR(s->wallPerIteration[1], 1.149660658, 1e-9);
  EXPECT_NEAR(s->wallPerIteration[2], 1.149660656, 1e-9);
  EXPECT_NEAR(s->wallPerWork, 1.149660656, 1e-9);
  EXPECT_NEAR(s->intervalSeconds[0], 80.6841, 1e-4);
  EXPECT_NEAR(s->intervalSeconds[1], 494.4181, 1e-4);
  // Condition (23) holds for both levels.
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(firstOrderResidual(kLevels, s->intervalSeconds, s->wallPerWork, i), 0.0, 1e-9);
  }
}

TEST(WorkedExample, NestedCandidates) {
  // The continuous ratio 494.42 / 80.68 = 6.13 lies between 6 and 7; the
  // search also tries 5. tau = sqrt(2 (2 + 20/k) / (w (2 + 0.5 k) / 3600)).
  struct Row {
    int every;
    double firstIteration;  // w from tau at w = 1
    double wall;
    double tau;
  };
  for (const Row& row : {Row{5, 1.1507233, 1.1503737, 91.3516},
                         Row{6, 1.1500125, 1.1496683, 81.7324},
                         Row{7, 1.1503123, 1.1499664, 74.3589}}) {
    SCOPED_TRACE(row.every);
    auto s = solveNested(kLevels, {1, row.every});
    ASSERT_THAT(s, IsOk());
    EXPECT_NEAR(s->wallPerIteration.front(), row.firstIteration, 1e-7);
    EXPECT_NEAR(s->wallPerWork, row.wall, 1e-7);
    EXPECT_NEAR(s->intervalSeconds[0], row.tau, 1e-4);
    EXPECT_NEAR(s->intervalSeconds[1], row.every * row.tau, 1e-3);
  }
  EXPECT_NEAR(std::sqrt(2 * (2 + 20 / 6.0) / (2 + 0.5 * 6) * 3600), 87.6356, 1e-4);
}

TEST(WorkedExample, Plan) {
  auto plan = planMultiLevel(kLevels);
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->schedule.every, ElementsAre(1, 6));
  EXPECT_NEAR(plan->schedule.intervalSeconds[0], 81.7324, 1e-4);
  EXPECT_NEAR(plan->schedule.intervalSeconds[1], 490.3945, 1e-4);
  // 1 - 1/1.1496683 = 0.130184: 13 % of the wall-clock time does no kept work,
  // 0.0006 % more than the continuous relaxation (1 - 1/1.1496607).
  EXPECT_NEAR(plan->wastedFraction(), 0.130184, 1e-6);
  EXPECT_NEAR(1 - 1 / plan->continuous.wallPerWork, 0.130178, 1e-6);
}

}  // namespace
}  // namespace phos::policy
