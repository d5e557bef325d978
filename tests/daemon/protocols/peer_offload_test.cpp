// SPDX-License-Identifier: Apache-2.0
// The plans a multi-device copy-on-write checkpoint gets (daemon/src/protocols/peer_offload.h),
// on an instance solved by hand.
#include "protocols/peer_offload.h"

#include <gtest/gtest.h>

namespace phos::daemon {
namespace {

constexpr uint64_t kChunk = 4 << 20;

// Device 0 must move 8 chunks (10 to save, room for 2); device 1 lends 6,
// device 5 lends 3 (4 free, 1 of its own). Device 0 reaches device 1 at
// 4 GB/s and device 5 at 2 GB/s; the host at 1 GB/s (the slower of the two
// host links measured). In units of one chunk at 1 GB/s, sending x1, x5 and
// xh chunks takes max(x1/4, x5/2, xh): 8 chunks need 7T >= 8 and whole
// chunks, first feasible at T = 1.25 with 5, 2 and 1.
struct HandSolved : ::testing::Test {
  std::vector<DeviceSpace> devices = {
      {0, nullptr, 10 * kChunk, 2 * kChunk}, {1, nullptr, 0, 6 * kChunk}, {5, nullptr, kChunk, 4 * kChunk}};
  LinkBandwidths links;
  HandSolved() {
    links.host = {{0, 1e9}, {1, 3e9}};
    links.peer = {{{0, 1}, 4e9}, {{1, 0}, 5e9}, {{0, 5}, 2e9}, {{5, 0}, 2e9},
                  {{1, 5}, 9e9}};  // 5 -> 1 unmeasured: no link
  }
  static double units(double seconds) { return seconds * 1e9 / kChunk; }
};

TEST_F(HandSolved, ExactLendsFiveChunksOfDeviceOneAndTwoOfDeviceFive) {
  auto plan = planPeerShadows(devices, links, offload::Scheduler::kExact, kChunk);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  const std::map<std::pair<int, int>, uint64_t> expected = {{{0, 1}, 5 * kChunk}, {{0, 5}, 2 * kChunk}};
  EXPECT_EQ(plan->quota, expected);
  EXPECT_NEAR(units(plan->report["blocking_seconds"].get<double>()), 1.25, 1e-9);
  EXPECT_EQ(plan->report["host_bandwidth"].get<double>(), 1e9);
  EXPECT_EQ(plan->report["links"].size(), 2u);  // 0-1 at 4 GB/s, 0-5; not 1-5
  EXPECT_EQ(plan->report["links"][0]["bandwidth"].get<double>(), 4e9);
  const auto& transfers = plan->report["transfers"];  // sorted by (from, to), the host first
  ASSERT_EQ(transfers.size(), 3u);
  EXPECT_EQ(transfers[0]["to"], "host");
  EXPECT_EQ(transfers[0]["chunks"], 1);
  EXPECT_EQ(transfers[0]["bytes"], kChunk);
  EXPECT_EQ(transfers[2]["to"], 5);
  EXPECT_EQ(transfers[2]["chunks"], 2);
}

TEST_F(HandSolved, GreedyFillsTheFastestPeerFirst) {
  auto plan = planPeerShadows(devices, links, offload::Scheduler::kGreedy, kChunk);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  const std::map<std::pair<int, int>, uint64_t> expected = {{{0, 1}, 6 * kChunk}, {{0, 5}, 2 * kChunk}};
  EXPECT_EQ(plan->quota, expected);
  EXPECT_NEAR(units(plan->report["blocking_seconds"].get<double>()), 1.5, 1e-9);
}

TEST_F(HandSolved, TheBaselineLendsNothing) {
  auto plan = planPeerShadows(devices, links, offload::Scheduler::kBaseline, kChunk);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  EXPECT_TRUE(plan->quota.empty());
  EXPECT_NEAR(units(plan->report["blocking_seconds"].get<double>()), 8, 1e-9);
}

TEST_F(HandSolved, WithoutLinksEverythingWaitsForTheHost) {
  links.peer.clear();
  auto plan = planPeerShadows(devices, links, offload::Scheduler::kExact, kChunk);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  EXPECT_TRUE(plan->quota.empty());
  EXPECT_TRUE(plan->report["links"].empty());
}

TEST(PeerOffloadPlan, NoDeviceShortOfReserveMovesNothing) {
  std::vector<DeviceSpace> devices = {{0, nullptr, kChunk, 4 * kChunk}, {1, nullptr, 3 * kChunk, 4 * kChunk}};
  LinkBandwidths links;
  links.peer = {{{0, 1}, 4e9}, {{1, 0}, 4e9}};
  auto plan = planPeerShadows(devices, links, offload::Scheduler::kExact, kChunk);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  EXPECT_TRUE(plan->quota.empty());
  EXPECT_EQ(plan->report["blocking_seconds"].get<double>(), 0);
}

TEST(PeerOffloadPlan, SchedulerNamesAreParsed) {
  EXPECT_EQ(*offload::parseScheduler("flow"), offload::Scheduler::kFlow);
  auto bad = offload::parseScheduler("fastest");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("\"fastest\""), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace phos::daemon
