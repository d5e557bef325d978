// SPDX-License-Identifier: Apache-2.0
// Tests of the online stall/restore estimator and the interval it recommends.
#include "phos/policy/online_estimator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace phos::policy {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;

TEST(EwmaMean, HandComputed) {
  // weight 0.5: 10 -> 10; 20 -> 10 + 0.5 * 10 = 15; 30 -> 15 + 0.5 * 15 = 22.5.
  EwmaMean m(0.5);
  EXPECT_FALSE(m.value().has_value());
  m.add(10);
  EXPECT_DOUBLE_EQ(*m.value(), 10);
  m.add(20);
  EXPECT_DOUBLE_EQ(*m.value(), 15);
  m.add(30);
  EXPECT_DOUBLE_EQ(*m.value(), 22.5);
  EXPECT_EQ(m.count(), 3u);
}

TEST(OnlineIntervalEstimator, NeedsAStallFirst) {
  auto e = OnlineIntervalEstimator::create({2, 1.0, 0.2});
  ASSERT_THAT(e, IsOk());
  EXPECT_THAT(e->intervalSeconds(), StatusIs(Code::kFailedPrecondition));
  ASSERT_THAT(e->recordStall(0.0), IsOk());  // nothing to copy: valid, but no interval yet
  EXPECT_THAT(e->intervalSeconds(), StatusIs(Code::kFailedPrecondition));
}

TEST(OnlineIntervalEstimator, FollowsMeasuredStalls) {
  // N = 2, F = 1/h. Stalls of 36 s (0.01 h): f* = sqrt(2 / 0.02) = 10/h, 360 s.
  auto e = OnlineIntervalEstimator::create({2, 1.0, 0.2});
  ASSERT_THAT(e, IsOk());
  ASSERT_THAT(e->recordStall(36.0), IsOk());
  EXPECT_NEAR(e->checkpointsPerHour().value(), 10.0, 1e-12);
  EXPECT_NEAR(e->intervalSeconds().value(), 360.0, 1e-9);
  // The working set grows: stalls of 144 s (0.04 h) give f* = sqrt(2 / 0.08) = 5/h,
  // 720 s. After 150 samples the old value's weight is 0.8^150 ~ 3e-15.
  for (int i = 0; i < 150; ++i) ASSERT_THAT(e->recordStall(144.0), IsOk());
  EXPECT_NEAR(e->intervalSeconds().value(), 720.0, 1e-6);
  // One sample moves the mean by 20 % of the distance: 144 + 0.2 (-144 + 36) = 122.4 s.
  ASSERT_THAT(e->recordStall(36.0), IsOk());
  EXPECT_NEAR(e->model().value().overheadSeconds, 122.4, 1e-9);
}

TEST(OnlineIntervalEstimator, RestoreTimesFeedTheModel) {
  auto e = OnlineIntervalEstimator::create({2, 1.0, 1.0});
  ASSERT_THAT(e, IsOk());
  ASSERT_THAT(e->recordStall(36.0), IsOk());
  EXPECT_DOUBLE_EQ(e->model().value().restoreSeconds, 0.0);
  ASSERT_THAT(e->recordRestore(180.0), IsOk());
  // Weight 1: the newest sample is the estimate. With R = 0.05 h, the waste at
  // f* = 10 is 2 (0.05 + 0.05) + 0.1 = 0.3 (see single_level_test).
  auto m = e->model();
  ASSERT_THAT(m, IsOk());
  EXPECT_NEAR(wastedFraction(*m, 10).value(), 0.3, 1e-12);
}

TEST(OnlineIntervalEstimator, RejectsBadSamplesAndConfig) {
  EXPECT_THAT(OnlineIntervalEstimator::create({0, 1.0, 0.2}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(OnlineIntervalEstimator::create({1, 1.0, 0.0}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(OnlineIntervalEstimator::create({1, 1.0, 1.5}), StatusIs(Code::kInvalidArgument));
  auto e = OnlineIntervalEstimator::create({1, 1.0, 0.2});
  ASSERT_THAT(e, IsOk());
  EXPECT_THAT(e->recordStall(-1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(e->recordRestore(-1), StatusIs(Code::kInvalidArgument));
}

TEST(OnlineLevelEstimator, PlansFromMeasuredCosts) {
  // The worked example of docs/policy.md, its costs arriving as measurements.
  auto e = OnlineLevelEstimator::create({{"host-dram", 2}, {"local-disk", 0.5}}, 0.5);
  ASSERT_THAT(e, IsOk());
  ASSERT_THAT(e->recordCheckpoint("host-dram", 2), IsOk());
  EXPECT_THAT(e->plan(), StatusIs(Code::kFailedPrecondition,
                                  ::testing::HasSubstr("level 'local-disk'")));
  // weight 0.5: 30 then 10 -> 30 + 0.5 (10 - 30) = 20.
  ASSERT_THAT(e->recordCheckpoint("local-disk", 30), IsOk());
  ASSERT_THAT(e->recordCheckpoint("local-disk", 10), IsOk());
  ASSERT_THAT(e->recordRestore("host-dram", 10), IsOk());
  ASSERT_THAT(e->recordRestore("local-disk", 60), IsOk());
  auto levels = e->levels();
  ASSERT_THAT(levels, IsOk());
  EXPECT_DOUBLE_EQ((*levels)[1].checkpointSeconds, 20);
  EXPECT_DOUBLE_EQ((*levels)[1].restoreSeconds, 60);
  auto plan = e->plan();
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->schedule.every[1], 6);
  EXPECT_NEAR(plan->schedule.intervalSeconds[0], 81.7324, 1e-4);
}

TEST(OnlineLevelEstimator, RejectsUnknownLevelsAndBadSamples) {
  EXPECT_THAT(OnlineLevelEstimator::create({}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(OnlineLevelEstimator::create({{"a", 0}}), StatusIs(Code::kInvalidArgument));
  auto e = OnlineLevelEstimator::create({{"a", 1}});
  ASSERT_THAT(e, IsOk());
  EXPECT_THAT(e->recordCheckpoint("b", 1), StatusIs(Code::kNotFound));
  EXPECT_THAT(e->recordRestore("a", -1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(e->recordCheckpoint("a", 0), IsOk());
  EXPECT_THAT(e->levels(), StatusIs(Code::kFailedPrecondition));
}

}  // namespace
}  // namespace phos::policy
