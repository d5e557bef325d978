// SPDX-License-Identifier: Apache-2.0
// Tests of offload instances: validation, the chunk model, the JSON format, the blocking-time model and plan checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "phos/offload/instance_json.h"
#include "phos/offload/plan.h"
#include "phos/offload/problem.h"
#include "status_matchers.h"

namespace phos::offload {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

Instance twoGpus() {
  Instance in;
  in.chunkBytes = 4;
  in.hostBandwidth = 8;
  in.gpus = {{.checkpointBytes = 10, .freeBytes = 5}, {.checkpointBytes = 3, .freeBytes = 20}};
  in.links = {{0, 1, 16}};
  return in;
}

TEST(MakeProblem, CountsChunksSlotsRemainderAndSpare) {
  auto p = makeProblem(twoGpus());
  ASSERT_THAT(p, IsOk());
  // GPU 0: 10 bytes = 3 chunks (4+4+2), 5 free bytes = 1 slot -> 2 chunks move.
  // GPU 1: 3 bytes = 1 chunk, 20 free bytes = 5 slots -> 4 spare.
  EXPECT_EQ(p->remainder, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(p->spare, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(p->tailShortfall, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(p->totalRemainder(), 2);
  EXPECT_EQ(p->bandwidth[0][1], 16);
  EXPECT_EQ(p->bandwidth[1][0], 16);  // links are symmetric
}

TEST(MakeProblem, GpuWithoutASlotMovesItsShortLastChunk) {
  Instance in = twoGpus();
  in.gpus[0].freeBytes = 3;  // less than one chunk: no slot
  auto p = makeProblem(in);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->remainder[0], 3);
  EXPECT_EQ(p->tailShortfall[0], 2);  // 3 chunks carry 12 - 2 = 10 bytes
  Plan plan = finalizePlan(*p, {{0, kHost, 2, 0}, {0, 1, 1, 0}});
  ASSERT_EQ(plan.transfers.size(), 2u);
  EXPECT_EQ(plan.transfers[0], (Transfer{0, kHost, 2, 6}));  // the short chunk goes to the host
  EXPECT_EQ(plan.transfers[1], (Transfer{0, 1, 1, 4}));
  EXPECT_THAT(verifyPlan(*p, plan), IsOk());
}

TEST(Validate, NamesTheProblem) {
  struct Case {
    const char* what;
    void (*edit)(Instance&);
    const char* message;
  };
  const Case cases[] = {
      {"zero chunk", [](Instance& i) { i.chunkBytes = 0; }, "chunk_bytes must be positive"},
      {"host bw", [](Instance& i) { i.hostBandwidth = 0; }, "host_bandwidth must be at least"},
      {"no gpus", [](Instance& i) { i.gpus.clear(); }, "gpus is empty"},
      {"negative checkpoint", [](Instance& i) { i.gpus[1].checkpointBytes = -1; },
       "gpus[1].checkpoint_bytes is negative (-1)"},
      {"negative free", [](Instance& i) { i.gpus[0].freeBytes = -7; },
       "gpus[0].free_bytes is negative (-7)"},
      {"egress", [](Instance& i) { i.gpus[0].egressLimit = 0.0; },
       "gpus[0].egress_limit must be at least 1 byte/s"},
      {"ingress", [](Instance& i) { i.gpus[1].ingressLimit = -3.0; },
       "gpus[1].ingress_limit must be at least 1 byte/s"},
      {"unknown gpu", [](Instance& i) { i.links.push_back({0, 5, 1}); },
       "links[1] names GPU 5, but there are only 2 GPUs (0..1)"},
      {"self link", [](Instance& i) { i.links.push_back({1, 1, 1}); },
       "links[1] connects GPU 1 to itself"},
      {"repeated link", [](Instance& i) { i.links.push_back({1, 0, 1}); },
       "links[1] repeats the link between GPUs 1 and 0"},
      {"link bw", [](Instance& i) { i.links[0].bandwidth = 0.5; },
       "links[0].bandwidth must be at least 1 byte/s"},
  };
  for (const Case& c : cases) {
    Instance in = twoGpus();
    c.edit(in);
    EXPECT_THAT(validate(in), StatusIs(Code::kInvalidArgument, HasSubstr(c.message))) << c.what;
    EXPECT_THAT(makeProblem(in), StatusIs(Code::kInvalidArgument)) << c.what;
  }
}

TEST(MakeProblem, RefusesMoreChunksThanTheSchedulersAccept) {
  Instance in = twoGpus();
  in.chunkBytes = 1;
  in.gpus[0].checkpointBytes = kMaxMovedChunks + 10;
  EXPECT_THAT(makeProblem(in),
              StatusIs(Code::kInvalidArgument, HasSubstr("use a larger chunk_bytes")));
  in.gpus[0].checkpointBytes = kMaxMovedChunks + 5;  // 5 free bytes: exactly the limit
  EXPECT_THAT(makeProblem(in), IsOk());
}

TEST(MakeProblem, HugeSizesDoNotOverflow) {
  Instance in = twoGpus();
  in.chunkBytes = int64_t{1} << 44;
  in.gpus[0].checkpointBytes = std::numeric_limits<int64_t>::max();
  in.gpus[0].freeBytes = 0;
  auto p = makeProblem(in);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->remainder[0], (std::numeric_limits<int64_t>::max() >> 44) + 1);
}

TEST(BlockingTime, BusiestResourceOfTheFluidModel) {
  Instance in = twoGpus();
  in.gpus.push_back({.checkpointBytes = 0, .freeBytes = 40, .ingressLimit = 4.0});
  in.gpus[0].egressLimit = 8.0;
  in.links.push_back({0, 2, 16});
  auto p = makeProblem(in);
  ASSERT_THAT(p, IsOk());
  // 1 chunk (4 B) over each link at 16 B/s: 0.25 s each, but GPU 0's egress
  // (8 B/s) carries both: 1 s, and GPU 2's ingress (4 B/s) 1 chunk: 1 s.
  Plan plan = finalizePlan(*p, {{0, 1, 1, 0}, {0, 2, 1, 0}});
  EXPECT_DOUBLE_EQ(blockingTime(*p, plan), 1.0);
  // Host links are per GPU and run in parallel: 2 chunks at 8 B/s = 1 s.
  EXPECT_DOUBLE_EQ(blockingTime(*p, finalizePlan(*p, {{0, kHost, 2, 0}})), 1.0);
  EXPECT_DOUBLE_EQ(blockingTime(*p, Plan{}), 0.0);
}

TEST(VerifyPlan, CatchesEveryKindOfInvalidPlan) {
  auto p = makeProblem(twoGpus());
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT(verifyPlan(*p, finalizePlan(*p, {{0, 1, 2, 0}})), IsOk());
  EXPECT_THAT(verifyPlan(*p, finalizePlan(*p, {{0, 1, 1, 0}})),
              StatusIs(Code::kInternal, HasSubstr("GPU 0 moves 1 chunks, its remainder is 2")));
  EXPECT_THAT(verifyPlan(*p, finalizePlan(*p, {{0, 1, 2, 0}, {1, kHost, 1, 0}})),
              StatusIs(Code::kInternal, HasSubstr("GPU 1 moves 1 chunks")));
  Plan overfull = finalizePlan(*p, {{0, 1, 2, 0}});
  overfull.transfers[0].chunks = 5;
  overfull.transfers[0].bytes = 20;
  EXPECT_THAT(verifyPlan(*p, overfull), StatusIs(Code::kInternal));
  Plan noLink;
  noLink.transfers = {{1, 0, 2, 8}};
  EXPECT_THAT(verifyPlan(*p, noLink), StatusIs(Code::kInternal));
  Plan oddBytes = finalizePlan(*p, {{0, 1, 2, 0}});
  oddBytes.transfers[0].bytes = 7;
  EXPECT_THAT(verifyPlan(*p, oddBytes), StatusIs(Code::kInternal, HasSubstr("is not 2 chunks")));

  Instance tight = twoGpus();
  tight.links.clear();
  auto q = makeProblem(tight);
  ASSERT_THAT(q, IsOk());
  EXPECT_THAT(verifyPlan(*q, finalizePlan(*q, {{0, 1, 2, 0}})),
              StatusIs(Code::kInternal, HasSubstr("uses a link that does not exist")));
}

constexpr const char* kValidJson = R"({
  "chunk_bytes": 1048576, "host_bandwidth": 12e9,
  "gpus": [{"checkpoint_bytes": 300000000, "free_bytes": 100000000, "egress_limit": 1.44e11},
           {"checkpoint_bytes": 0, "free_bytes": 1e9}],
  "links": [{"a": 0, "b": 1, "bandwidth": 48e9}]})";

TEST(InstanceJson, ParsesTheDocumentedFormat) {
  auto in = parseInstanceJson(kValidJson);
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ(in->chunkBytes, 1048576);
  EXPECT_EQ(in->hostBandwidth, 12e9);
  ASSERT_EQ(in->gpus.size(), 2u);
  EXPECT_EQ(in->gpus[0].checkpointBytes, 300000000);
  EXPECT_EQ(in->gpus[0].egressLimit, 1.44e11);
  EXPECT_FALSE(in->gpus[0].ingressLimit.has_value());
  EXPECT_EQ(in->gpus[1].freeBytes, 1000000000);  // 1e9 is a whole number
  ASSERT_EQ(in->links.size(), 1u);
  EXPECT_EQ(in->links[0].b, 1);
  EXPECT_EQ(in->links[0].bandwidth, 48e9);

  // Writing it back gives the same instance.
  auto again = parseInstanceJson(instanceToJson(*in).dump());
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(instanceToJson(*again), instanceToJson(*in));
}

TEST(InstanceJson, LinksMayBeAbsent) {
  auto in = parseInstanceJson(
      R"({"chunk_bytes": 4, "host_bandwidth": 1, "gpus": [{"checkpoint_bytes": 1, "free_bytes": 0}]})");
  ASSERT_THAT(in, IsOk());
  EXPECT_TRUE(in->links.empty());
}

TEST(InstanceJson, EveryMistakeIsNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"{", "malformed JSON"},
      {"[]", "the instance must be a JSON object"},
      {R"({"host_bandwidth": 1, "gpus": []})", "missing field 'chunk_bytes'"},
      {R"({"chunk_bytes": "4", "host_bandwidth": 1, "gpus": []})",
       "'chunk_bytes' must be a number"},
      {R"({"chunk_bytes": 4.5, "host_bandwidth": 1, "gpus": []})",
       "'chunk_bytes' must be a whole number"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1, "gpus": {}})", "'gpus' must be an array"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1, "gpus": [3]})", "'gpus[0]' must be an object"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1, "gpus": [{"free_bytes": 1}]})",
       "missing field 'gpus[0].checkpoint_bytes'"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1,
           "gpus": [{"checkpoint_bytes": -5, "free_bytes": 1}]})",
       "gpus[0].checkpoint_bytes is negative (-5)"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1,
           "gpus": [{"checkpoint_bytes": 5, "free_bytes": 1, "egres_limit": 3}]})",
       "unknown field 'gpus[0].egres_limit'"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1, "gpu": []})", "unknown field 'gpu'"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1,
           "gpus": [{"checkpoint_bytes": 5, "free_bytes": 1}],
           "links": [{"a": 0, "b": 3, "bandwidth": 1e9}]})",
       "links[0] names GPU 3, but there are only 1 GPUs (0..0)"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1,
           "gpus": [{"checkpoint_bytes": 5, "free_bytes": 1}],
           "links": [{"a": 0, "b": 99999999999, "bandwidth": 1e9}]})",
       "names GPU 99999999999"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1,
           "gpus": [{"checkpoint_bytes": 5, "free_bytes": 1}], "links": [{"a": 0, "b": 0}]})",
       "missing field 'links[0].bandwidth'"},
      {R"({"chunk_bytes": 4, "host_bandwidth": 1,
           "gpus": [{"checkpoint_bytes": 18446744073709551615, "free_bytes": 1}]})",
       "'gpus[0].checkpoint_bytes' is too large"},
  };
  for (const auto& [text, message] : cases) {
    EXPECT_THAT(parseInstanceJson(text), StatusIs(Code::kInvalidArgument, HasSubstr(message)))
        << text;
  }
}

}  // namespace
}  // namespace phos::offload
