// SPDX-License-Identifier: Apache-2.0
// Kernel printf output as NVIDIA's driver writes it: to the worker's stdout,
// which the session captures (daemon/src/session/session.h, KernelOutput).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <tuple>

#include "session/session.h"

namespace phos::daemon {
namespace {

// The test's own stdout comes back after each test.
class KernelOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::fflush(stdout);
    saved_ = dup(STDOUT_FILENO);
    ASSERT_GE(saved_, 0);
  }
  void TearDown() override {
    std::fflush(stdout);
    dup2(saved_, STDOUT_FILENO);
    close(saved_);
  }
  int saved_ = -1;
};

TEST_F(KernelOutputTest, WhatTheProcessPrintsIsTakenInOrderAndOnlyOnce) {
  KernelOutput out;
  std::printf("before the capture\n");
  ASSERT_TRUE(out.captureStdout().isOk());
  ASSERT_TRUE(out.captureStdout().isOk());  // once is enough
  EXPECT_FALSE(out.pending());
  std::printf("hello from thread %d\n", 0);  // buffered by stdio: pending() flushes it
  EXPECT_TRUE(out.pending());
  EXPECT_EQ(out.take(1 << 20).first, "hello from thread 0\n");
  EXPECT_FALSE(out.pending());
  // More than a page, so that the pages read are given back, then more.
  const std::string line(100, 'x');
  for (int i = 0; i < 100; ++i) std::printf("%s\n", line.c_str());
  std::fflush(stdout);  // stdio and write(2) in order
  ASSERT_EQ(write(STDOUT_FILENO, "raw\n", 4), 4);
  ASSERT_TRUE(out.pending());
  std::string got = out.take(1 << 20).first;
  EXPECT_EQ(got.size(), 100 * 101 + 4);
  EXPECT_EQ(got.substr(got.size() - 4), "raw\n");
  std::printf("last\n");
  EXPECT_TRUE(out.pending());
  EXPECT_EQ(out.take(3).first, "las");
  EXPECT_EQ(out.take(10).first, "t\n");
}

// vgpu's failed assertions, for the application's stderr: after stdout's
// text, in the room it leaves.
TEST_F(KernelOutputTest, AssertionMessagesComeAfterThePrintedText) {
  KernelOutput out;
  out.write("printed\n");
  out.writeError("assertion\n");
  EXPECT_TRUE(out.pending());
  auto [text, errors] = out.take(12);
  EXPECT_EQ(text, "printed\n");
  EXPECT_EQ(errors, "asse");
  EXPECT_TRUE(out.pending());
  std::tie(text, errors) = out.take(100);
  EXPECT_EQ(text, "");
  EXPECT_EQ(errors, "rtion\n");
  EXPECT_FALSE(out.pending());
}

}  // namespace
}  // namespace phos::daemon
