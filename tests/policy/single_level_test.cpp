// SPDX-License-Identifier: Apache-2.0
// Tests of the PhOS paper's single-level model on hand-computed values.
#include "phos/policy/single_level.h"

#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace phos::policy {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

TEST(SingleLevel, OptimalFrequencyHandComputed) {
  // N = 2 GPUs, F = 1 failure per GPU-hour, O = 36 s = 0.01 h.
  // f* = sqrt(N F / (2 O)) = sqrt(2 / 0.02) = sqrt(100) = 10 checkpoints per hour.
  auto f = optimalCheckpointsPerHour({2, 1.0, 36.0, 180.0});
  ASSERT_THAT(f, IsOk());
  EXPECT_NEAR(*f, 10.0, 1e-12);

  // N = 8, F = 0.5, O = 5 s: f* = sqrt(4 / (2 * 5 / 3600)) = sqrt(1440) = 37.94733...
  auto g = optimalCheckpointsPerHour({8, 0.5, 5.0, 60.0});
  ASSERT_THAT(g, IsOk());
  EXPECT_NEAR(*g, 37.947331922020552, 1e-9);
}

TEST(SingleLevel, PaperFigures) {
  // PhOS paper, section 8 (Figure 12): 8 GPUs, one failure per GPU-hour. With
  // PhOS's 185 ms stall on Llama2-13B "a checkpoint frequency of 279 per hour",
  // with Singularity's 3.2 s "67": sqrt(8 * 3600 / 0.37) = 278.99 and
  // sqrt(8 * 3600 / 6.4) = sqrt(4500) = 67.08.
  auto phos = optimalCheckpointsPerHour({8, 1.0, 0.185, 0.0});
  ASSERT_THAT(phos, IsOk());
  EXPECT_NEAR(*phos, std::sqrt(8 * 3600 / 0.37), 1e-9);
  EXPECT_EQ(std::lround(*phos), 279);
  auto singularity = optimalCheckpointsPerHour({8, 1.0, 3.2, 0.0});
  ASSERT_THAT(singularity, IsOk());
  EXPECT_NEAR(*singularity, std::sqrt(4500.0), 1e-9);
  EXPECT_EQ(std::lround(*singularity), 67);
}

TEST(SingleLevel, WastedFractionHandComputed) {
  // N = 2, F = 1/h, O = 0.01 h, R = 180 s = 0.05 h.
  // w(f) = N F (R + 1/(2f)) + O f.
  // w(10) = 2 (0.05 + 0.05)  + 0.1 = 0.30
  // w(5)  = 2 (0.05 + 0.10)  + 0.05 = 0.35
  // w(20) = 2 (0.05 + 0.025) + 0.2 = 0.35
  SingleLevelModel m{2, 1.0, 36.0, 180.0};
  auto at = [&](double f) { return wastedFraction(m, f).value(); };
  EXPECT_NEAR(at(10), 0.30, 1e-12);
  EXPECT_NEAR(at(5), 0.35, 1e-12);
  EXPECT_NEAR(at(20), 0.35, 1e-12);
}

TEST(SingleLevel, DerivativeVanishesAtOptimum) {
  SingleLevelModel m{8, 0.5, 5.0, 60.0};
  const double f = optimalCheckpointsPerHour(m).value();
  const double h = f * 1e-5;
  const double slope = (wastedFraction(m, f + h).value() - wastedFraction(m, f - h).value()) / (2 * h);
  // The slope away from the optimum is O = 5/3600 per unit f; at f* it must be
  // many orders of magnitude smaller.
  EXPECT_NEAR(slope, 0.0, 1e-9);
  EXPECT_GT(wastedFraction(m, f * 1.01).value(), wastedFraction(m, f).value());
  EXPECT_GT(wastedFraction(m, f * 0.99).value(), wastedFraction(m, f).value());
}

TEST(SingleLevel, EqualsYoungsInterval) {
  // 1/f* = sqrt(2 O / (N F)) = sqrt(2 O M) with M = 1 / (N F), Young's formula.
  SingleLevelModel m{16, 0.25, 7.0, 30.0};
  const double intervalSeconds = 3600.0 / optimalCheckpointsPerHour(m).value();
  const double mtbfSeconds = 3600.0 / (16 * 0.25);
  EXPECT_NEAR(intervalSeconds, std::sqrt(2.0 * 7.0 * mtbfSeconds), 1e-9);
}

TEST(SingleLevel, PaperPrintedFormulaHasTheSameOptimum) {
  // The appendix prints N F T (R + N/(2f)) + N O f T; per N T that is
  // F (R + N/(2f)) + O f. Its restore term does not depend on f, so it has the
  // same minimizer as our N F (R + 1/(2f)) + O f and differs only by
  // (N - 1) F R: with N = 2, F = 1, R = 0.05 h, at f = 10 it is
  // 1 (0.05 + 2/20) + 0.1 = 0.25 = 0.30 - 1 * 1 * 0.05.
  SingleLevelModel m{2, 1.0, 36.0, 180.0};
  auto printed = [](double f) { return 1.0 * (0.05 + 2.0 / (2.0 * f)) + 0.01 * f; };
  EXPECT_NEAR(printed(10), 0.25, 1e-12);
  EXPECT_NEAR(wastedFraction(m, 10).value() - printed(10), 0.05, 1e-12);
  const double h = 1e-4;
  EXPECT_NEAR((printed(10 + h) - printed(10 - h)) / (2 * h), 0.0, 1e-9);
}

TEST(SingleLevel, RejectsMeaninglessModels) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(validate({0, 1, 1, 1}), StatusIs(Code::kInvalidArgument, HasSubstr("gpus")));
  EXPECT_THAT(validate({1, 0, 1, 1}),
              StatusIs(Code::kInvalidArgument, HasSubstr("failures_per_gpu_hour")));
  EXPECT_THAT(validate({1, nan, 1, 1}),
              StatusIs(Code::kInvalidArgument, HasSubstr("failures_per_gpu_hour")));
  EXPECT_THAT(validate({1, 1, 0, 1}),
              StatusIs(Code::kInvalidArgument, HasSubstr("checkpoint_overhead_seconds")));
  EXPECT_THAT(validate({1, 1, 1, -1}),
              StatusIs(Code::kInvalidArgument, HasSubstr("restore_seconds")));
  EXPECT_THAT(validate({1, 1, 1, 0}), IsOk());
  EXPECT_THAT(wastedFraction({1, 1, 1, 0}, 0), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(optimalCheckpointsPerHour({1, 1, -3, 0}), StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace phos::policy
