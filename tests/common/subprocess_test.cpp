// SPDX-License-Identifier: Apache-2.0
// Tests of runCapture and processEnded.
#include "phos/common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

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

TEST(RunCapture, PassesDescriptorsUnderTheChosenNumbers) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  // Descriptor 9: dash redirects single-digit descriptors only.
  auto r = runCapture({"sh", "-c", "echo through-9 >&9; echo out"},
                      CaptureOptions{.inheritStdin = false, .passFds = {{fds[1], 9}}});
  // Only the chosen numbers reach a child: the original stays close-on-exec.
  auto closed = runCapture({"sh", "-c", "echo x >&" + std::to_string(fds[1])});
  ::close(fds[1]);
  ASSERT_THAT(closed, IsOk());
  EXPECT_NE(closed->exitCode, 0);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->out, "out\n") << r->err;
  char buf[64] = {};
  ASSERT_GT(::read(fds[0], buf, sizeof buf - 1), 0);
  ::close(fds[0]);
  EXPECT_STREQ(buf, "through-9\n");
}

TEST(RunCapture, RefusesToReplaceTheStandardDescriptors) {
  EXPECT_THAT(runCapture({"true"}, CaptureOptions{.passFds = {{0, 1}}}),
              StatusIs(Code::kInvalidArgument, ::testing::HasSubstr("must be > 2")));
}

}  // namespace
TEST(ProcessEnded, LiveProcessesRun) {
  EXPECT_FALSE(processEnded(getpid()));
  EXPECT_FALSE(processEnded(1));  // another user's process may not be read, and still runs
}

TEST(ProcessEnded, ZombieAndReapedChildHaveEnded) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  // Until reaped it is a zombie: kill(pid, 0) still succeeds.
  for (int i = 0; i < 2000 && !processEnded(child); ++i) usleep(1000);
  EXPECT_EQ(kill(child, 0), 0);
  EXPECT_TRUE(processEnded(child));
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(processEnded(child));
}

TEST(ProcessEnded, NoPidHasEnded) {
  EXPECT_TRUE(processEnded(0));
  EXPECT_TRUE(processEnded(-1));
}

}  // namespace phos
