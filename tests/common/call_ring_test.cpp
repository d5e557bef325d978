// SPDX-License-Identifier: Apache-2.0
// Tests of the shared-memory call ring: ordering, back-pressure, processes,
// daemon death, malformed rings, and checkpoint snapshots.
#include "phos/common/ipc/call_ring.h"
#include "phos/common/ipc/transfer_lane.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace phos::ipc {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string ringPath(const char* name) {
  return fmt::format("/dev/shm/phos-test-{}-{}", name, getpid());
}

template <typename T>
std::span<const std::byte> bytesOf(const T& v) {
  return std::as_bytes(std::span<const T>(&v, 1));
}

template <typename T>
T valueOf(std::span<const std::byte> b) {
  T v{};
  EXPECT_EQ(b.size(), sizeof(T));
  std::memcpy(&v, b.data(), std::min(b.size(), sizeof(T)));
  return v;
}

class CallRingTest : public ::testing::Test {
 protected:
  void TearDown() override { unlink(path_.c_str()); }
  std::string path_ = ringPath("ring");
};

TEST_F(CallRingTest, PostThenNextThenFinish) {
  auto daemon = CallRing::create(path_, {8, 256});
  ASSERT_THAT(daemon, IsOk());
  auto client = CallRing::open(path_);
  ASSERT_THAT(client, IsOk());
  EXPECT_EQ(client->geometry().slotCount, 8u);

  int v = 42;
  ASSERT_THAT(client->post(bytesOf(v)), IsOk());
  EXPECT_EQ(daemon->pending(), 1u);
  auto req = daemon->next(1s);
  ASSERT_THAT(req, IsOk());
  EXPECT_FALSE(req->expectsReply);
  EXPECT_EQ(valueOf<int>(req->bytes), 42);
  daemon->finish(*req);
  EXPECT_EQ(daemon->pending(), 0u);
}

TEST_F(CallRingTest, NextTimesOutWhenIdle) {
  auto daemon = CallRing::create(path_, {8, 256});
  ASSERT_THAT(daemon, IsOk());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THAT(daemon->next(50ms), StatusIs(Code::kNotFound));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 45ms);
}

TEST_F(CallRingTest, CallGetsItsReply) {
  auto daemon = CallRing::create(path_, {8, 256});
  ASSERT_THAT(daemon, IsOk());
  auto client = CallRing::open(path_);
  ASSERT_THAT(client, IsOk());
  std::thread server([&] {
    for (int i = 0; i < 100; ++i) {
      auto req = daemon->next(5s);
      ASSERT_THAT(req, IsOk());
      ASSERT_TRUE(req->expectsReply);
      int x = valueOf<int>(req->bytes);
      int y = x * x;
      ASSERT_THAT(daemon->reply(*req, bytesOf(y)), IsOk());
    }
  });
  for (int i = 0; i < 100; ++i) {
    int out = 0;
    auto n = client->call(bytesOf(i), std::as_writable_bytes(std::span<int>(&out, 1)));
    ASSERT_THAT(n, IsOk());
    EXPECT_EQ(*n, sizeof(int));
    EXPECT_EQ(out, i * i);
  }
  server.join();
}

// Many producers on a ring much smaller than the traffic: every call arrives
// exactly once, and each thread's calls arrive in the order it posted them.
TEST_F(CallRingTest, ManyProducersKeepPerThreadOrderUnderBackPressure) {
  auto daemon = CallRing::create(path_, {4, 128});
  ASSERT_THAT(daemon, IsOk());
  constexpr int kThreads = 4, kPerThread = 5000;
  struct Msg { int thread; int seq; };
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      auto client = CallRing::open(path_);
      ASSERT_THAT(client, IsOk());
      for (int i = 0; i < kPerThread; ++i) {
        Msg m{t, i};
        if (i % 10 == 0) {  // mix synchronous calls in
          int ack = 0;
          ASSERT_THAT(client->call(bytesOf(m), std::as_writable_bytes(std::span<int>(&ack, 1))),
                      IsOk());
          ASSERT_EQ(ack, i);
        } else {
          ASSERT_THAT(client->post(bytesOf(m)), IsOk());
        }
      }
    });
  }
  std::map<int, int> nextSeq;
  for (int n = 0; n < kThreads * kPerThread; ++n) {
    auto req = daemon->next(10s);
    ASSERT_THAT(req, IsOk());
    auto m = valueOf<Msg>(req->bytes);
    ASSERT_EQ(m.seq, nextSeq[m.thread]) << "thread " << m.thread;
    nextSeq[m.thread]++;
    if (req->expectsReply) {
      ASSERT_THAT(daemon->reply(*req, bytesOf(m.seq)), IsOk());
    } else {
      daemon->finish(*req);
    }
  }
  for (auto& p : producers) p.join();
  EXPECT_THAT(daemon->next(10ms), StatusIs(Code::kNotFound));
}

TEST_F(CallRingTest, WorksAcrossProcesses) {
  auto daemon = CallRing::create(path_, {16, 256});
  ASSERT_THAT(daemon, IsOk());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto client = CallRing::open(path_);
    if (!client) _exit(10);
    for (int i = 0; i < 1000; ++i) {
      int out = -1;
      auto n = client->call(bytesOf(i), std::as_writable_bytes(std::span<int>(&out, 1)));
      if (!n || out != i + 1) _exit(11);
    }
    _exit(0);
  }
  for (int i = 0; i < 1000; ++i) {
    auto req = daemon->next(5s);
    ASSERT_THAT(req, IsOk());
    int y = valueOf<int>(req->bytes) + 1;
    ASSERT_THAT(daemon->reply(*req, bytesOf(y)), IsOk());
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Two restores of one session once truncated each other's ring: the first
// one's process then died of SIGBUS. A ring that exists is never replaced.
TEST_F(CallRingTest, CreateNeverReplacesARingThatExists) {
  auto first = CallRing::create(path_, {8, 256});
  ASSERT_THAT(first.status(), IsOk());
  auto second = CallRing::create(path_, {8, 256});
  EXPECT_THAT(second.status(), StatusIs(Code::kFailedPrecondition, HasSubstr("exists")));
  auto client = CallRing::open(path_);
  ASSERT_THAT(client.status(), IsOk());  // the first ring is whole: its header still checks
}

// If phosd dies, a caller waiting for a reply fails promptly instead of hanging.
TEST_F(CallRingTest, CallerSeesDaemonDeathWithinASecond) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t daemonPid = fork();
  ASSERT_GE(daemonPid, 0);
  if (daemonPid == 0) {
    auto ring = CallRing::create(path_, {8, 256});
    char c = ring ? 1 : 0;
    (void)!write(ready[1], &c, 1);
    pause();  // never serves; killed by the test
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 1);
  auto client = CallRing::open(path_);
  ASSERT_THAT(client, IsOk());
  std::thread killer([&] {
    std::this_thread::sleep_for(100ms);
    kill(daemonPid, SIGKILL);
    waitpid(daemonPid, nullptr, 0);
  });
  auto t0 = std::chrono::steady_clock::now();
  int v = 1, out = 0;
  auto r = client->call(bytesOf(v), std::as_writable_bytes(std::span<int>(&out, 1)));
  auto waited = std::chrono::steady_clock::now() - t0;
  killer.join();
  EXPECT_THAT(r, StatusIs(Code::kUnavailable, HasSubstr("is gone")));
  EXPECT_LT(waited, 1s);
  close(ready[0]);
  close(ready[1]);
}

TEST_F(CallRingTest, OversizedRequestAndReplyAreRejected) {
  auto daemon = CallRing::create(path_, {8, 256});
  ASSERT_THAT(daemon, IsOk());
  auto client = CallRing::open(path_);
  ASSERT_THAT(client, IsOk());
  std::vector<std::byte> big(client->payloadCapacity() + 1);
  EXPECT_THAT(client->post(big), StatusIs(Code::kInvalidArgument, HasSubstr("exceeds")));

  std::thread server([&] {
    auto req = daemon->next(5s);
    ASSERT_THAT(req, IsOk());
    int64_t tooBig = 7;  // 8 bytes for a 4-byte reply buffer
    EXPECT_THAT(daemon->reply(*req, big), StatusIs(Code::kInvalidArgument));
    ASSERT_THAT(daemon->reply(*req, bytesOf(tooBig)), IsOk());
  });
  int v = 0, out = 0;
  EXPECT_THAT(client->call(bytesOf(v), std::as_writable_bytes(std::span<int>(&out, 1))),
              StatusIs(Code::kOutOfRange));
  server.join();
  // The slot was released despite the error: the ring still works.
  ASSERT_THAT(client->post(bytesOf(v)), IsOk());
  auto req = daemon->next(1s);
  ASSERT_THAT(req, IsOk());
  daemon->finish(*req);
}

// A hostile client writing nonsense into its slot cannot make the daemon read
// outside the slot.
TEST_F(CallRingTest, DaemonRejectsCorruptSlotLength) {
  auto daemon = CallRing::create(path_, {8, 256});
  ASSERT_THAT(daemon, IsOk());
  auto client = CallRing::open(path_);
  ASSERT_THAT(client, IsOk());
  int v = 5;
  ASSERT_THAT(client->post(bytesOf(v)), IsOk());
  // Overwrite the first slot's requestBytes (offset 4096 + 16) through a raw mapping.
  int fd = open(path_.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* raw = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(raw, MAP_FAILED);
  uint32_t huge = 1u << 30;
  std::memcpy(static_cast<char*>(raw) + 4096 + 16, &huge, sizeof huge);
  munmap(raw, 8192);
  close(fd);
  EXPECT_THAT(daemon->next(1s), StatusIs(Code::kDataLoss, HasSubstr("claims 1073741824 bytes")));
}

TEST_F(CallRingTest, OpenRejectsMalformedFiles) {
  EXPECT_THAT(CallRing::open(path_ + "-missing"), StatusIs(Code::kNotFound));
  {
    int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 100), 0);
    close(fd);
  }
  EXPECT_THAT(CallRing::open(path_), StatusIs(Code::kDataLoss, HasSubstr("too small")));
  {
    int fd = open(path_.c_str(), O_RDWR | O_TRUNC);
    ASSERT_EQ(ftruncate(fd, 8192), 0);
    close(fd);
  }
  EXPECT_THAT(CallRing::open(path_), StatusIs(Code::kDataLoss, HasSubstr("bad magic")));
  unlink(path_.c_str());
  ASSERT_THAT(CallRing::create(path_, {8, 256}), IsOk());
  ASSERT_EQ(truncate(path_.c_str(), 4096 + 4 * 256), 0);
  EXPECT_THAT(CallRing::open(path_), StatusIs(Code::kDataLoss, HasSubstr("geometry needs")));
}

TEST_F(CallRingTest, CreateRejectsBadGeometry) {
  EXPECT_THAT(CallRing::create(path_, {6, 256}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(CallRing::create(path_, {8, 100}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(CallRing::create("/nonexistent-dir/ring", {8, 256}), StatusIs(Code::kNotFound));
}

TEST_F(CallRingTest, CreateRejectsBadLaneGeometry) {
  EXPECT_THAT(CallRing::create(path_, {8, 256, RingGeometry::kMaxLanes + 1, 4096}),
              StatusIs(Code::kInvalidArgument, HasSubstr("transfer lanes")));
  EXPECT_THAT(CallRing::create(path_, {8, 256, 1, 1000}), StatusIs(Code::kInvalidArgument, HasSubstr("4096")));
  EXPECT_THAT(CallRing::create(path_, {8, 256, 0, 0}), IsOk());
}

// Both processes see a lane's words and buffers at the same place of the
// file; a snapshot holds the ring without its lanes, and restores only into
// a ring with the same lanes (the application's mapping covers them).
TEST_F(CallRingTest, LanesAreSharedAndLeftOutOfSnapshots) {
  auto daemon = CallRing::create(path_, {8, 256, 2, 8192});
  ASSERT_THAT(daemon, IsOk());
  auto client = CallRing::open(path_);
  ASSERT_THAT(client, IsOk());
  EXPECT_EQ(client->geometry().laneCount, 2u);
  EXPECT_EQ(client->geometry().laneSlotBytes, 8192u);
  TransferLane mine = client->lane(1), theirs = daemon->lane(1);
  EXPECT_EQ(mine.bufferBytes, 8192u);
  mine.buffers[1][8191] = std::byte{0x5a};
  mine.words->produced.store(3);
  EXPECT_EQ(theirs.buffers[1][8191], std::byte{0x5a});
  EXPECT_EQ(theirs.words->produced.load(), 3u);
  EXPECT_NE(daemon->lane(0).words, theirs.words);

  CallRing::Snapshot snap = daemon->snapshot();
  EXPECT_EQ(snap.bytes.size(), 4096u + 8 * 256);
  std::string restoredPath = ringPath("lanes");
  auto other = CallRing::create(restoredPath, {8, 256, 1, 8192});
  ASSERT_THAT(other, IsOk());
  EXPECT_THAT(other->restoreSnapshot(snap), StatusIs(Code::kInvalidArgument, HasSubstr("transfer lanes")));
  unlink(restoredPath.c_str());
  auto same = CallRing::create(restoredPath, {8, 256, 2, 8192});
  ASSERT_THAT(same, IsOk());
  EXPECT_THAT(same->restoreSnapshot(snap), IsOk());
  unlink(restoredPath.c_str());
}

// Checkpoint: calls queued at the quiesce point survive a snapshot into a
// re-created ring file and are served there in order.
TEST_F(CallRingTest, SnapshotCarriesQueuedCallsToANewRing) {
  auto daemon = CallRing::create(path_, {8, 256});
  ASSERT_THAT(daemon, IsOk());
  auto client = CallRing::open(path_);
  ASSERT_THAT(client, IsOk());
  for (int i = 0; i < 3; ++i) ASSERT_THAT(client->post(bytesOf(i)), IsOk());
  auto first = daemon->next(1s);  // one taken before the checkpoint
  ASSERT_THAT(first, IsOk());
  daemon->finish(*first);
  CallRing::Snapshot snap = daemon->snapshot();

  std::string restoredPath = ringPath("restored");
  auto restored = CallRing::create(restoredPath, {8, 256});
  ASSERT_THAT(restored, IsOk());
  ASSERT_THAT(restored->restoreSnapshot(snap), IsOk());
  EXPECT_EQ(restored->pending(), 2u);
  for (int i = 1; i < 3; ++i) {
    auto req = restored->next(1s);
    ASSERT_THAT(req, IsOk());
    EXPECT_EQ(valueOf<int>(req->bytes), i);
    restored->finish(*req);
  }
  // A client mapping the new file continues from there.
  auto restoredClient = CallRing::open(restoredPath);
  ASSERT_THAT(restoredClient, IsOk());
  int v = 99;
  ASSERT_THAT(restoredClient->post(bytesOf(v)), IsOk());
  auto req = restored->next(1s);
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(valueOf<int>(req->bytes), 99);

  auto other = CallRing::create(restoredPath + "-small", {4, 256});
  ASSERT_THAT(other, IsOk());
  EXPECT_THAT(other->restoreSnapshot(snap), StatusIs(Code::kInvalidArgument));
  unlink(restoredPath.c_str());
  unlink((restoredPath + "-small").c_str());
}

}  // namespace
}  // namespace phos::ipc
