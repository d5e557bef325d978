// SPDX-License-Identifier: Apache-2.0
// The channel between phosd's main process and its workers (worker.h): one
// JSON object per datagram, a descriptor passed along, the ends noticed.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "status_matchers.h"
#include "process/worker.h"

namespace phos::daemon {
namespace {

using detail::receiveMessage;
using detail::sendMessage;
using nlohmann::json;
using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;

class WorkerChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends_), 0);
  }
  void TearDown() override {
    for (int fd : ends_) {
      if (fd >= 0) close(fd);
    }
  }
  int ends_[2] = {-1, -1};
};

TEST_F(WorkerChannelTest, MessagesKeepTheirBoundariesAndOrder) {
  ASSERT_THAT(sendMessage(ends_[0], {{"op", "info"}, {"id", 1}}), IsOk());
  ASSERT_THAT(sendMessage(ends_[0], {{"op", "end"}}), IsOk());
  auto first = receiveMessage(ends_[1], /*wait=*/true);
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->body, (json{{"op", "info"}, {"id", 1}}));
  EXPECT_FALSE(first->fd);
  auto second = receiveMessage(ends_[1], /*wait=*/true);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->body["op"], "end");
  bool empty = false;
  auto none = receiveMessage(ends_[1], /*wait=*/false, &empty);
  EXPECT_FALSE(none.isOk());
  EXPECT_TRUE(empty);
}

TEST_F(WorkerChannelTest, ADescriptorTravelsWithItsMessage) {
  int pipeFds[2];
  ASSERT_EQ(pipe(pipeFds), 0);
  ASSERT_THAT(sendMessage(ends_[0], {{"op", "checkpoint"}}, pipeFds[1]), IsOk());
  close(pipeFds[1]);
  auto got = receiveMessage(ends_[1], /*wait=*/true);
  ASSERT_THAT(got, IsOk());
  ASSERT_TRUE(got->fd);
  EXPECT_NE(fcntl(got->fd.get(), F_GETFD) & FD_CLOEXEC, 0);
  ASSERT_EQ(write(got->fd.get(), "x", 1), 1);
  got->fd.reset();
  char c = 0;
  EXPECT_EQ(read(pipeFds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  close(pipeFds[0]);
}

TEST_F(WorkerChannelTest, TheOtherEndClosingIsUnavailable) {
  close(ends_[0]);
  ends_[0] = -1;
  auto got = receiveMessage(ends_[1], /*wait=*/true);
  EXPECT_THAT(got.status(), StatusIs(Code::kUnavailable));
}

TEST_F(WorkerChannelTest, OversizedAndMalformedMessagesAreRefused) {
  json big = {{"pad", std::string(detail::kMaxChannelMessage, 'a')}};
  EXPECT_THAT(sendMessage(ends_[0], big), StatusIs(Code::kOutOfRange));
  ASSERT_EQ(send(ends_[0], "[1, 2]", 6, 0), 6);
  EXPECT_THAT(receiveMessage(ends_[1], /*wait=*/true).status(), StatusIs(Code::kInvalidArgument));
}

TEST_F(WorkerChannelTest, AFullChannelDoesNotBlockASenderThatMayNotWait) {
  json message = {{"pad", std::string(16 << 10, 'a')}};
  Status s = Status::ok();
  for (int i = 0; i < 10000 && s.isOk(); ++i)
    s = sendMessage(ends_[0], message, -1, /*wait=*/false);
  EXPECT_THAT(s, StatusIs(Code::kUnavailable));
}

}  // namespace
}  // namespace phos::daemon
