// SPDX-License-Identifier: Apache-2.0
// Tests of runCapture.
#include "phos/common/subprocess.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace phos {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;

TEST(RunCapture, CapturesBothStreamsAndExitCode) {
  auto r = runCapture({"sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->out, "out\n");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_EQ(r->exitCode, 3);
}

TEST(RunCapture, LargeOutputDoesNotDeadlock) {
  auto r = runCapture({"sh", "-c", "head -c 1000000 /dev/zero; head -c 1000000 /dev/zero >&2"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->out.size(), 1000000u);
  EXPECT_EQ(r->err.size(), 1000000u);
}

TEST(RunCapture, KilledBySignal) {
  auto r = runCapture({"sh", "-c", "kill -9 $$"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 128 + 9);
}

TEST(RunCapture, MissingProgramIsNotFound) {
  EXPECT_THAT(runCapture({"/nonexistent/program"}), StatusIs(Code::kNotFound));
  EXPECT_THAT(runCapture({}), StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace phos
