// SPDX-License-Identifier: Apache-2.0
// Hand-solved offload instances: each scheduler's plan and blocking time against values worked out on paper.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "phos/offload/instance_json.h"
#include "phos/offload/schedulers.h"
#include "phos/offload/topology.h"
#include "status_matchers.h"

namespace phos::offload {
namespace {

using ::phos::testing::IsOk;
using ::testing::ElementsAre;

struct Gpu {
  int64_t checkpoint;
  int64_t free;
  std::optional<double> egress = std::nullopt;
  std::optional<double> ingress = std::nullopt;
};

Problem problemOf(int64_t chunk, double host, std::vector<Gpu> gpus, std::vector<Link> links) {
  Instance in;
  in.chunkBytes = chunk;
  in.hostBandwidth = host;
  for (const Gpu& g : gpus) in.gpus.push_back({g.checkpoint, g.free, g.egress, g.ingress});
  in.links = std::move(links);
  auto p = makeProblem(in);
  EXPECT_THAT(p, IsOk());
  return std::move(p).value();
}

// Runs all four schedulers (each plan verified) and returns their blocking
// times in the order baseline, greedy, flow, exact.
std::vector<double> blockingTimes(const Problem& p) {
  auto outcomes = runAllSchedulers(p);
  EXPECT_THAT(outcomes, IsOk());
  std::vector<double> t;
  for (const Outcome& o : *outcomes) t.push_back(o.blockingSeconds);
  return t;
}

::testing::Matcher<double> Near(double v) { return ::testing::DoubleNear(v, 1e-12 * v + 1e-15); }

// The example of the paper's Figure 1 and Section IV, on the DGX-1 cube-mesh
// with the paper's units (1 MB = 1e6 bytes chunks): G0 has 480 MB and G6
// 240 MB left over; G4 can take 480 MB and G1 160 MB.
Problem paperFigure1() {
  Instance in = makeInstance(dgx1(), std::vector<int64_t>(8, 0), 0, 1'000'000);
  in.gpus[0].checkpointBytes = 480'000'000;
  in.gpus[6].checkpointBytes = 240'000'000;
  in.gpus[4].freeBytes = 480'000'000;
  in.gpus[1].freeBytes = 160'000'000;
  auto p = makeProblem(in);
  EXPECT_THAT(p, IsOk());
  return std::move(p).value();
}

TEST(PaperFigure1, BlockingTimesMatchThePaper) {
  const Problem p = paperFigure1();
  // Baseline: G0's 480 MB over PCIe at 12 GB/s = 40 ms. Greedy (the paper):
  // G0 fills G4 over the dual NVLink (10 ms), G6 is left with the host:
  // 240 MB / 12 GB/s = 20 ms. Optimum (the paper: 6.7 ms): G6 sends 160 MB
  // to G4 over its single link and 80 MB to the host, 6.67 ms each, and G0
  // fits around it.
  EXPECT_THAT(blockingTimes(p), ElementsAre(Near(0.040), Near(0.020), Near(0.24 / 36),
                                            Near(0.24 / 36)));
}

TEST(PaperFigure1, GreedyFillsG4FromG0AndSendsG6ToTheHost) {
  const Plan plan = greedyPlan(paperFigure1());
  EXPECT_THAT(plan.transfers, ElementsAre(Transfer{0, 4, 480, 480'000'000},
                                          Transfer{6, kHost, 240, 240'000'000}));
}

TEST(PaperFigure1, FlowSplitsG6BetweenG4AndTheHost) {
  const Problem p = paperFigure1();
  for (const Plan& plan : {minTimeFlowPlan(p).value(), exactPlan(p).value()}) {
    ASSERT_THAT(verifyPlan(p, plan), IsOk());
    int64_t g6ToG4 = 0, g6ToHost = 0;
    for (const Transfer& t : plan.transfers) {
      if (t.from == 6 && t.to == 4) g6ToG4 = t.chunks;
      if (t.from == 6 && t.to == kHost) g6ToHost = t.chunks;
    }
    // The only optimal split for G6: 160 MB at 24 GB/s, 80 MB at 12 GB/s.
    EXPECT_EQ(g6ToG4, 160);
    EXPECT_EQ(g6ToHost, 80);
  }
}

TEST(HandSolved, OneSenderSplitsBetweenPeerAndHost) {
  // 30 chunks; the peer link is twice the host link: 20 to the peer and 10
  // to the host finish together at 10 s. Greedy sends all 30 to the peer.
  const Problem p = problemOf(1, 1, {{30, 0}, {0, 100}}, {{0, 1, 2}});
  EXPECT_THAT(blockingTimes(p), ElementsAre(Near(30), Near(15), Near(10), Near(10)));
}

TEST(HandSolved, GreedyLetsTheLargestSenderTakeTheOnlyReceiver) {
  // A (10 chunks) and B (6) share receiver R (10 slots), links 4, host 1.
  // Greedy: A fills R (2.5 s), B goes to the host (6 s). Optimum: A 7 to R
  // and 3 to the host, B 3 and 3: 3 s (A and B each need >= 10 - T and
  // >= 6 - T on R, so 16 - 2T <= 10).
  const Problem p = problemOf(1, 1, {{10, 0}, {6, 0}, {0, 10}}, {{0, 2, 4}, {1, 2, 4}});
  EXPECT_THAT(blockingTimes(p), ElementsAre(Near(10), Near(6), Near(3), Near(3)));
}

TEST(HandSolved, EgressLimitCapsASendersPeerTraffic) {
  // 12 chunks, two receivers at 10 B/s each but 10 B/s of NVLink egress in
  // all, host 2: 10 over peers and 2 to the host in 1 s. Greedy puts all 12
  // on one link: 1.2 s on the link and on the egress.
  const Problem p = problemOf(1, 2, {{12, 0, 10.0}, {0, 100}, {0, 100}}, {{0, 1, 10}, {0, 2, 10}});
  EXPECT_THAT(blockingTimes(p), ElementsAre(Near(6), Near(1.2), Near(1), Near(1)));
}

TEST(HandSolved, IngressLimitMakesGreedyWorseThanTheBaseline) {
  // Three senders of 4 chunks, one receiver with 12 slots but 4 B/s of
  // ingress; links 4, host 2. Baseline: 2 s. Greedy sends everything to the
  // receiver: 12 chunks through 4 B/s of ingress = 3 s, worse than the
  // baseline. Optimum: at T = 1.25 each sender must still ship
  // ceil(4 - 2.5) = 2 chunks to the receiver, 6 > 5 ingress slots; at
  // T = 1.5 one chunk each suffices: 1.5 s.
  const Problem p = problemOf(1, 2, {{4, 0}, {4, 0}, {4, 0}, {0, 12, std::nullopt, 4.0}},
                              {{0, 3, 4}, {1, 3, 4}, {2, 3, 4}});
  EXPECT_THAT(blockingTimes(p), ElementsAre(Near(2), Near(3), Near(1.5), Near(1.5)));
}

TEST(HandSolved, NoReceiversMeansEverySchedulerIsTheBaseline) {
  const Problem p = problemOf(4, 8, {{40, 8}, {16, 16}, {20, 4}}, {{0, 1, 100}, {1, 2, 100}});
  // Remainders 8, 0 and 4 chunks of 4 bytes at 8 B/s: GPU 0 takes 4 s.
  EXPECT_THAT(blockingTimes(p), ElementsAre(Near(4), Near(4), Near(4), Near(4)));
}

TEST(HandSolved, NoSendersMeansNoTransfersAndNoBlocking) {
  const Problem p = problemOf(4, 8, {{4, 8}, {16, 16}}, {{0, 1, 100}});
  auto outcomes = runAllSchedulers(p);
  ASSERT_THAT(outcomes, IsOk());
  ASSERT_EQ(outcomes->size(), 4u);
  for (const Outcome& o : *outcomes) {
    EXPECT_EQ(o.blockingSeconds, 0) << schedulerName(o.scheduler);
    EXPECT_TRUE(o.plan.transfers.empty()) << schedulerName(o.scheduler);
  }
}

TEST(HandSolved, UnlinkedSenderCanOnlyUseTheHost) {
  // GPU 2 has no link at all; GPU 0 reaches the receiver.
  const Problem p = problemOf(1, 1, {{6, 0}, {0, 6}, {3, 0}}, {{0, 1, 2}});
  // GPU 0: 4 to the peer, 2 to the host: 2 s. GPU 2: 3 s on its host link.
  EXPECT_THAT(blockingTimes(p), ElementsAre(Near(6), Near(3), Near(3), Near(3)));
}

TEST(FlowBudget, RefusesWhatWouldRunForMinutesButExactSolvesIt) {
  // 150 senders of ~7000 chunks each, all linked to 150 receivers: about 2^20
  // path searches over ~45000 arcs.
  Instance in;
  in.chunkBytes = 1;
  in.hostBandwidth = 1;
  for (int g = 0; g < 300; ++g) {
    in.gpus.push_back(g < 150 ? GpuState{6990, 0} : GpuState{0, 7000});
  }
  for (int a = 0; a < 150; ++a) {
    for (int b = 150; b < 300; ++b) in.links.push_back({a, b, 100});
  }
  auto p = makeProblem(in);
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT(minTimeFlowPlan(*p),
              ::phos::testing::StatusIs(Code::kInvalidArgument,
                                        ::testing::HasSubstr("use a larger chunk_bytes")));
  auto exact = exactPlan(*p);
  ASSERT_THAT(exact, IsOk());
  EXPECT_THAT(verifyPlan(*p, *exact), IsOk());
  // Each sender spreads its 6990 chunks over 150 links of 100 chunks/s:
  // ceil(6990/150) = 47 chunks on its busiest link, 0.47 s (the host link
  // moves nothing in under 1 s); the 150 x 7000 slots hold everything.
  EXPECT_NEAR(blockingTime(*p, *exact), 0.47, 1e-12);
}

TEST(OutcomeJson, HasTheDocumentedShape) {
  const Problem p = problemOf(4, 8, {{10, 0}, {0, 40}}, {{0, 1, 16}});
  auto outcomes = runAllSchedulers(p);
  ASSERT_THAT(outcomes, IsOk());
  const nlohmann::json j = outcomesToJson(*outcomes);
  for (const char* name : {"baseline", "greedy", "flow", "exact"}) {
    ASSERT_TRUE(j.contains(name)) << name;
    EXPECT_TRUE(j[name]["blocking_seconds"].is_number());
    EXPECT_TRUE(j[name]["transfers"].is_array());
  }
  // The baseline ships all 10 bytes (3 chunks, the last one short) to the host.
  EXPECT_EQ(j["baseline"]["transfers"],
            nlohmann::json::parse(R"([{"from": 0, "to": "host", "bytes": 10}])"));
  EXPECT_DOUBLE_EQ(j["baseline"]["blocking_seconds"].get<double>(), 12.0 / 8);
}

}  // namespace
}  // namespace phos::offload
