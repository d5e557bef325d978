// SPDX-License-Identifier: Apache-2.0
// PTX instruction semantics on hand-written PTX: each case runs a one-warp kernel
// that stores its results, compared with values worked out from the PTX ISA.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "engine_harness.h"
#include "status_matchers.h"

namespace phos::vgpu::engine::testing {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

class PtxSemantics : public ::testing::Test {
 protected:
  // Runs `body` on `threads` threads with `in` as input; returns `outWords` words.
  std::vector<uint32_t> run(const std::string& body, std::vector<uint32_t> in,
                            size_t outWords, uint32_t threads = 1,
                            const std::string& prelude = "") {
    Status st = module_.load(kernel(body, prelude));
    EXPECT_THAT(st, IsOk());
    if (!st.isOk()) return {};
    if (in.empty()) in.push_back(0);
    uint32_t* din = module_.memory().alloc(in);
    uint32_t* dout =
        module_.memory().alloc<uint32_t>(std::max<size_t>(outWords, 4));  // room for a .v4 store
    last_ = module_.launch("k", {1}, {threads}, Params().add(dout).add(din));
    EXPECT_THAT(last_, IsOk());
    return std::vector<uint32_t>(dout, dout + outWords);
  }
  Module module_;
  Status last_;
};

uint32_t f2u(float f) { return std::bit_cast<uint32_t>(f); }

// cvt forms the engine does not execute fault when executed, naming the
// form, instead of producing wrong values; the module loads (its other
// kernels may run), and a thread that skips the instruction is unaffected.
TEST_F(PtxSemantics, UnsupportedCvtFormsFaultWhenExecuted) {
  const std::pair<std::string, std::string> cases[] = {
      {"cvt.rm.tf32.f32 %r1, %f1;", "cvt.rm.tf32.f32"},
      {"cvt.rn.satfinite.e2m1x2.f32 %h1, %f1, %f2;", "cvt.rn.satfinite.e2m1x2.f32"},
      {"cvt.rs.satfinite.bf16x2.f32 %r1, %f1, %f2, %r2;", "cvt.rs.satfinite.bf16x2.f32"}};
  for (const auto& [inst, name] : cases) {
    ASSERT_THAT(module_.load(kernel("setp.ne.u32 %p1, %r0, 0;\n  @%p1 " + inst)), IsOk()) << inst;
    uint32_t* in = module_.memory().alloc<uint32_t>(4);
    uint32_t* out = module_.memory().alloc<uint32_t>(4);
    EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)), IsOk()) << inst;  // thread 0 skips it
    EXPECT_THAT(module_.launch("k", {1}, {2}, Params().add(out).add(in)),
                StatusIs(Code::kFailedPrecondition, HasSubstr(name + " is not supported by vgpu")))
        << inst;
  }
}

// tf32: 10 fraction bits, rounded to nearest with ties away (rna) or to even
// (rn), or truncated (rz); .satfinite keeps the largest finite value.
TEST_F(PtxSemantics, Tf32Conversions) {
  auto out = run(R"(
  ld.global.f32 %f1, [%rd2];
  ld.global.f32 %f2, [%rd2+4];
  ld.global.f32 %f3, [%rd2+8];
  ld.global.f32 %f4, [%rd2+12];
  cvt.rna.tf32.f32 %r1, %f1;  st.global.u32 [%rd1], %r1;
  cvt.rn.tf32.f32 %r1, %f1;   st.global.u32 [%rd1+4], %r1;
  cvt.rz.tf32.f32 %r1, %f2;   st.global.u32 [%rd1+8], %r1;
  cvt.rna.tf32.f32 %r1, %f2;  st.global.u32 [%rd1+12], %r1;
  cvt.rna.tf32.f32 %r1, %f3;  st.global.u32 [%rd1+16], %r1;
  cvt.rna.satfinite.tf32.f32 %r1, %f3;  st.global.u32 [%rd1+20], %r1;
  cvt.rna.tf32.f32 %r1, %f4;  st.global.u32 [%rd1+24], %r1;
  cvt.rn.tf32.f32 %r1, %f4;   st.global.u32 [%rd1+28], %r1;
)", {0x3f801000u,   // a tie above 1.0 (even): rna up, rn stays
     0xbf801fffu,   // negative, just below the next tf32: rz truncates, rna rounds up in magnitude
     0x7f7ff000u,   // the largest float's tie: rna overflows to infinity, .satfinite keeps 0x7f7fe000
     0x3f803000u},  // a tie above an odd tf32: both round up
    8);
  const std::vector<uint32_t> expected = {0x3f802000u, 0x3f800000u, 0xbf800000u, 0xbf802000u,
                                          0x7f800000u, 0x7f7fe000u, 0x3f804000u, 0x3f804000u};
  EXPECT_EQ(out, expected);
}

// Two-operand fp8 forms load (an f16x2 destination from one fp8 pair).
TEST_F(PtxSemantics, Fp8PairToF16x2HasTwoOperands) {
  auto out = run(R"(
  mov.b16 %h1, 0x3c38;
  cvt.rn.f16x2.e4m3x2 %r1, %h1;   st.global.u32 [%rd1], %r1;
  cvt.rn.f16x2.e5m2x2 %r1, %h1;   st.global.u32 [%rd1+4], %r1;
)", {}, 2);
  ASSERT_EQ(out.size(), 2u);
  // e4m3 0x3c = 1.5 (f16 0x3e00), 0x38 = 1.0 (0x3c00); e5m2 0x3c = 1.0, 0x38 = 0.5.
  EXPECT_EQ(out[0], 0x3e003c00u);
  EXPECT_EQ(out[1], 0x3c003800u);
}

// cp.async copies global into shared memory: whole (4, 8 or 16 bytes), the
// first src-size bytes then zeros, or only zeros when ignore-src holds.
TEST_F(PtxSemantics, AsyncCopyIntoShared) {
  const std::string prelude = ".shared .align 16 .b8 buf[64];\n";
  auto out = run(R"(
  .reg .pred %q<2>;
  mov.u32 %r1, buf;
  st.shared.v4.u32 [%r1+16], {-1, -1, -1, -1};
  st.shared.v4.u32 [%r1+32], {-1, -1, -1, -1};
  st.shared.v4.u32 [%r1+48], {-1, -1, -1, -1};
  setp.eq.u32 %q0, %r0, 0;
  setp.ne.u32 %q1, %r0, 0;
  cp.async.ca.shared.global [%r1], [%rd2], 16;
  cp.async.ca.shared.global [%r1+16], [%rd2+16], 8;
  mov.u32 %r2, 5;
  cp.async.cg.shared.global [%r1+32], [%rd2], 16, %r2;
  cp.async.ca.shared.global [%r1+48], [%rd2], 8, %q0;
  cp.async.ca.shared.global [%r1+56], [%rd2+8], 4, %q1;
  cp.async.commit_group;
  cp.async.wait_group 0;
  cp.async.wait_all;
  ld.shared.v4.u32 {%r4, %r5, %r6, %r7}, [%r1];      st.global.v4.u32 [%rd1], {%r4, %r5, %r6, %r7};
  ld.shared.v4.u32 {%r4, %r5, %r6, %r7}, [%r1+16];   st.global.v4.u32 [%rd1+16], {%r4, %r5, %r6, %r7};
  ld.shared.v4.u32 {%r4, %r5, %r6, %r7}, [%r1+32];   st.global.v4.u32 [%rd1+32], {%r4, %r5, %r6, %r7};
  ld.shared.v4.u32 {%r4, %r5, %r6, %r7}, [%r1+48];   st.global.v4.u32 [%rd1+48], {%r4, %r5, %r6, %r7};
)", {0x03020100u, 0x07060504u, 0x0b0a0908u, 0x0f0e0d0cu, 0x13121110u, 0x17161514u}, 16, 1, prelude);
  ASSERT_EQ(out.size(), 16u);
  const std::vector<uint32_t> expected = {
      0x03020100u, 0x07060504u, 0x0b0a0908u, 0x0f0e0d0cu,  // 16 bytes
      0x13121110u, 0x17161514u, 0xffffffffu, 0xffffffffu,  // 8 bytes; the rest untouched
      0x03020100u, 0x00000004u, 0u,          0u,           // src-size 5 of 16: zero-filled
      0u,          0u,          0x0b0a0908u, 0xffffffffu,  // ignore-src true: zeros; false: copied
  };
  EXPECT_EQ(out, expected);
}

TEST_F(PtxSemantics, AsyncCopyFaults) {
  const std::string prelude = ".shared .align 16 .b8 buf[64];\n";
  ASSERT_THAT(module_.load(kernel("mov.u32 %r1, buf;\n  cp.async.ca.shared.global [%r1], [%rd2+4], 8;", prelude)),
              IsOk());
  uint32_t* in = module_.memory().alloc<uint32_t>(16);
  uint32_t* out = module_.memory().alloc<uint32_t>(16);
  EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("MISALIGNED")));
  ASSERT_THAT(module_.load(kernel("mov.u32 %r1, buf;\n  cp.async.ca.shared.global [%r1+64], [%rd2], 8;", prelude)),
              IsOk());
  EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("ILLEGAL_ADDRESS")));
  ASSERT_THAT(module_.load(kernel("mov.u32 %r1, buf;\n  cp.async.ca.shared.global [%r1], [%rd2+64], 16;", prelude)),
              IsOk());
  EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("ILLEGAL_ADDRESS")));
  // Bulk copies: sizes in 16-byte units between 16-byte aligned addresses,
  // within the destination, completing bytes on an mbarrier that exists; and
  // refused at load without their operands.
  const std::string bulk = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes";
  const std::pair<std::string, std::string> bulkFaults[] = {
      {"[%r1], [%rd2], 24, [%r1+48];", "not a multiple of 16"},
      {"[%r1], [%rd2+8], 16, [%r1+48];", "MISALIGNED"},
      {"[%r1+48], [%rd2], 32, [%r1+32];", "ILLEGAL_ADDRESS"},
      {"[%r1], [%rd2], 16, [%r1+64];", "ILLEGAL_ADDRESS"}};
  for (const auto& [operands, what] : bulkFaults) {
    ASSERT_THAT(module_.load(kernel("mov.u32 %r1, buf;\n  " + bulk + " " + operands, prelude)), IsOk()) << operands;
    EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
                StatusIs(Code::kFailedPrecondition, HasSubstr(what)))
        << operands;
  }
  EXPECT_THAT(module_.load(kernel("mov.u32 %r1, buf;\n  " + bulk + " [%r1], [%rd2], 16;", prelude)),
              StatusIs(Code::kInvalidArgument, HasSubstr("needs [dst], [src], size and [mbar]")));
  // A bulk copy form vgpu does not run faults when executed, named.
  ASSERT_THAT(module_.load(kernel("mov.u32 %r1, buf;\n  cp.async.bulk.global.shared::cta.mbarrier::complete_tx::bytes "
                                  "[%rd1], [%r1], 16, [%r1];",
                                  prelude)),
              IsOk());
  EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
              StatusIs(Code::kFailedPrecondition,
                       HasSubstr("cp.async.bulk.global.shared::cta.mbarrier::complete_tx::bytes is not supported")));
}

// mbarrier on one thread, step by step: a phase completes when its pending
// arrivals and its tx-count both reach zero; test_wait with a state asks about
// the phase that state was taken in, with .parity about the current phase
// (parity equal) or the one before (parity different); arrive_drop lowers the
// expected count of the phases after. pending_count reads the count a state
// holds, which in vgpu is the pending count just before that arrive.
TEST_F(PtxSemantics, MbarrierPhasesArrivalsAndTransactions) {
  auto out = run(R"(
  mov.u32 %r1, bar;
  mbarrier.init.shared.b64 [%r1], 2;
  mbarrier.arrive.shared.b64 %rd3, [%r1];
  mbarrier.test_wait.shared.b64 %p1, [%r1], %rd3;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1], %r2;
  mbarrier.test_wait.parity.shared.b64 %p1, [%r1], 1;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1+4], %r2;
  mbarrier.test_wait.parity.shared.b64 %p1, [%r1], 0;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1+8], %r2;
  mbarrier.arrive_drop.shared.b64 %rd4, [%r1];
  mbarrier.test_wait.shared.b64 %p1, [%r1], %rd3;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1+12], %r2;
  mbarrier.test_wait.parity.shared.b64 %p1, [%r1], 0;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1+16], %r2;
  mbarrier.arrive.shared.b64 %rd5, [%r1];
  mbarrier.test_wait.parity.shared.b64 %p1, [%r1], 1;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1+20], %r2;
  mbarrier.pending_count.b64 %r2, %rd3;  st.global.u32 [%rd1+24], %r2;
  mbarrier.pending_count.b64 %r2, %rd5;  st.global.u32 [%rd1+28], %r2;
  mbarrier.expect_tx.shared.b64 [%r1], 16;
  mbarrier.arrive.shared.b64 %rd6, [%r1];
  mbarrier.try_wait.shared::cta.b64 %p1, [%r1], %rd6;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1+32], %r2;
  mbarrier.complete_tx.shared::cta.b64 [%r1], 16;
  mbarrier.try_wait.shared::cta.b64 %p1, [%r1], %rd6;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1+36], %r2;
  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r1], 8;
  mbarrier.test_wait.parity.shared.b64 %p1, [%r1], 1;
  selp.u32 %r2, 1, 0, %p1;  st.global.u32 [%rd1+40], %r2;
  mbarrier.inval.shared.b64 [%r1];
  mbarrier.init.shared.b64 [%r1], 3;
  mbarrier.arrive.noComplete.shared.b64 %rd7, [%r1], 2;
  mbarrier.pending_count.b64 %r2, %rd7;  st.global.u32 [%rd1+44], %r2;
)", {}, 12, 1, ".shared .align 8 .b64 bar;");
  // 0: phase 0 still open; 4: parity 1 is the phase before (complete); 8:
  // parity 0 is the current one (open); 12, 16: the drop completed phase 0;
  // 20: with one expected arrival, the next arrive completed phase 1; 24, 28:
  // the counts before those arrives; 32: arrivals done, 16 bytes still
  // expected; 36: the bytes came; 40: an arrive that expects bytes leaves the
  // phase open; 44: three pending before the two arrivals.
  const std::vector<uint32_t> expected = {0, 1, 0, 1, 1, 1, 2, 1, 0, 1, 0, 3};
  EXPECT_EQ(out, expected);
}

// What the ISA leaves undefined faults, named, instead of running on; a form
// that is no mbarrier operation is refused at load.
TEST_F(PtxSemantics, MbarrierMisuseFaultsOrIsRefused) {
  const std::string prelude = ".shared .align 8 .b64 bar;";
  uint32_t* in = module_.memory().alloc<uint32_t>(4);
  uint32_t* out = module_.memory().alloc<uint32_t>(4);
  const std::pair<std::string, std::string> faults[] = {
      {"mbarrier.init.shared.b64 [%r1], 2;\n  mbarrier.arrive.shared.b64 %rd3, [%r1], 3;", "3 arrivals"},
      {"mbarrier.init.shared.b64 [%r1], 2;\n  mbarrier.arrive.noComplete.shared.b64 %rd3, [%r1], 2;",
       ".noComplete arrive completed"},
      {"mbarrier.init.shared.b64 [%r1], 0;", "outside the range"},
      {"mbarrier.init.shared.b64 [%r1], 1;\n  mbarrier.expect_tx.shared.b64 [%r1], 1048575;\n"
       "  mbarrier.expect_tx.shared.b64 [%r1], 1;",
       "tx-count would be 1048576"},
      {"mbarrier.init.b64 [%rd1], 2;", "not in shared memory"},
      {"mbarrier.init.shared.b64 [%r1], 2;\n  mbarrier.arrive.shared.b64 %rd3, [%r1];\n"
       "LOOP:\n  mbarrier.try_wait.shared::cta.b64 %p1, [%r1], %rd3;\n  @!%p1 bra LOOP;",
       "mbarrier deadlock"}};
  for (const auto& [body, what] : faults) {
    ASSERT_THAT(module_.load(kernel("mov.u32 %r1, bar;\n  " + body, prelude)), IsOk()) << body;
    EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
                StatusIs(Code::kFailedPrecondition, HasSubstr(what)))
        << body;
  }
  for (const std::string body : {"mbarrier.init.global.b64 [%rd1], 2;", "mbarrier.shared.b64 [%r1];",
                                 "mbarrier.arrive.test_wait.shared.b64 %rd3, [%r1];",
                                 "mbarrier.test_wait.shared.b64 %p1, [%r1];"}) {
    EXPECT_THAT(module_.load(kernel("mov.u32 %r1, bar;\n  " + body, prelude)),
                StatusIs(Code::kInvalidArgument, HasSubstr("mbarrier")))
        << body;
  }
}

// Prefetches name their cache level (Thrust's sm_90 kernels use
// prefetch.global.L2); they move no data and run as no-ops.
TEST_F(PtxSemantics, PrefetchesWithCacheLevels) {
  auto out = run(R"(
  prefetch.global.L2 [%rd2];
  prefetch.global.L1 [%rd2+4];
  prefetch.L2 [%rd2];
  prefetchu.L1 [%rd2];
  prefetch.global.L2::evict_last [%rd2];
  ld.global.u32 %r1, [%rd2];
  st.global.u32 [%rd1], %r1;
)", {42u}, 1);
  EXPECT_EQ(out, std::vector<uint32_t>{42u});
}

// barrier.cluster (cooperative groups' cluster.sync(): arrive, then wait) in a
// launch without clusters: the cluster is the CTA, and a wait returns only
// once every thread of it has arrived, however long the others take to get
// there. Warp 1 spins well past a scheduling quantum before it stores and
// arrives; warp 0 arrives and waits at once, then reads what warp 1 stored.
TEST_F(PtxSemantics, ClusterBarrierWaitsForEveryThreadsArrival) {
  auto out = run(R"(
  mov.u32 %r1, buf;
  shl.b32 %r2, %r0, 2;
  add.u32 %r3, %r1, %r2;
  setp.lt.u32 %p1, %r0, 32;
  @%p1 bra READY;
  mov.u32 %r4, 0;
SPIN:
  add.u32 %r4, %r4, 1;
  setp.lt.u32 %p2, %r4, 5000;
  @%p2 bra SPIN;
  st.shared.u32 [%r3], %r4;
  barrier.cluster.arrive;
  barrier.cluster.wait;
  bra DONE;
READY:
  barrier.cluster.arrive.release.aligned;
  barrier.cluster.wait.acquire.aligned;
  ld.shared.u32 %r5, [%r3+128];
  cvt.u64.u32 %rd3, %r2;
  add.u64 %rd4, %rd1, %rd3;
  st.global.u32 [%rd4], %r5;
DONE:
)", {}, 32, 64, ".shared .align 4 .b32 buf[64];");
  EXPECT_EQ(out, std::vector<uint32_t>(32, 5000u));
}

// Half-precision atomics as cuda_fp16.h's atomicAdd emits them (.noftz:
// subnormal inputs and results are kept, which vgpu's f16 arithmetic does),
// each half rounded to nearest even on its own.
TEST_F(PtxSemantics, HalfPrecisionAtomicAdds) {
  auto out = run(R"(
  ld.global.u32 %r1, [%rd2];
  atom.global.add.noftz.f16x2 %r2, [%rd1], %r1;
  st.global.u32 [%rd1+4], %r2;
  ld.global.u32 %r3, [%rd2+4];
  red.global.add.noftz.bf16x2 [%rd1+8], %r3;
  ld.global.u16 %h1, [%rd2+8];
  atom.global.add.noftz.f16 %h2, [%rd1+12], %h1;
  atom.global.add.noftz.f16 %h2, [%rd1+12], %h1;
  st.global.u16 [%rd1+14], %h2;
)", {0x3c000001u,   // f16x2 halves: 2^-24 (the smallest subnormal) and 1.0
     0x3f803f80u,   // bf16x2: 1.0 and 1.0
     0x00000200u},  // f16 subnormal 2^-15
    4);
  // Memory started at 0: the f16x2 sum is the input (subnormal kept), the old
  // value 0; bf16x2 1.0 + 0; the f16 subnormal added twice, 2^-14 (normal).
  const std::vector<uint32_t> expected = {0x3c000001u, 0u, 0x3f803f80u, 0x02000400u};
  EXPECT_EQ(out, expected);
}

// fns: the PTX ISA's examples, and the edges of its pseudo-code.
TEST_F(PtxSemantics, FindNthSetBit) {
  auto out = run(R"(
  fns.b32 %r1, 0xaaaaaaaa, 3, 1;    st.global.u32 [%rd1], %r1;
  fns.b32 %r1, 0xaaaaaaaa, 3, -1;   st.global.u32 [%rd1+4], %r1;
  fns.b32 %r1, 0xaaaaaaaa, 2, 1;    st.global.u32 [%rd1+8], %r1;
  fns.b32 %r1, 0xaaaaaaaa, 2, -1;   st.global.u32 [%rd1+12], %r1;
  fns.b32 %r1, 0xaaaaaaaa, 2, 0;    st.global.u32 [%rd1+16], %r1;
  fns.b32 %r1, 0xaaaaaaaa, 3, 0;    st.global.u32 [%rd1+20], %r1;
  fns.b32 %r1, 0xaaaaaaaa, 0, 3;    st.global.u32 [%rd1+24], %r1;
  fns.b32 %r1, 0xaaaaaaaa, 31, -16; st.global.u32 [%rd1+28], %r1;
  fns.b32 %r1, 0xaaaaaaaa, 31, -17; st.global.u32 [%rd1+32], %r1;
  fns.b32 %r1, 0x80000001, 0, 2;    st.global.u32 [%rd1+36], %r1;
  fns.b32 %r1, 0, 5, 1;             st.global.u32 [%rd1+40], %r1;
)", {}, 11);
  const std::vector<uint32_t> expected = {3, 3, 3, 1, 0xffffffffu, 3, 5, 1, 0xffffffffu, 31, 0xffffffffu};
  EXPECT_EQ(out, expected);
}

TEST_F(PtxSemantics, PrmtModes) {
  // a = 0x33221100 (bytes 0..3), b = 0x77665544 (bytes 4..7); c selects.
  auto out = run(R"(
  mov.b32 %r1, 0x33221100;
  mov.b32 %r2, 0xf7665544;
  prmt.b32 %r3, %r1, %r2, 0x3210;  st.global.u32 [%rd1], %r3;
  prmt.b32 %r3, %r1, %r2, 0x7654;  st.global.u32 [%rd1+4], %r3;
  prmt.b32 %r3, %r1, %r2, 0x0f0b;  st.global.u32 [%rd1+8], %r3;
  prmt.b32.f4e %r3, %r1, %r2, 1;   st.global.u32 [%rd1+12], %r3;
  prmt.b32.b4e %r3, %r1, %r2, 1;   st.global.u32 [%rd1+16], %r3;
  prmt.b32.rc8 %r3, %r1, %r2, 2;   st.global.u32 [%rd1+20], %r3;
  prmt.b32.ecl %r3, %r1, %r2, 1;   st.global.u32 [%rd1+24], %r3;
  prmt.b32.ecr %r3, %r1, %r2, 2;   st.global.u32 [%rd1+28], %r3;
  prmt.b32.rc16 %r3, %r1, %r2, 1;  st.global.u32 [%rd1+32], %r3;
)", {}, 9);
  EXPECT_EQ(out[0], 0x33221100u);
  EXPECT_EQ(out[1], 0xf7665544u);
  EXPECT_EQ(out[2], 0x00ff0000u);  // 0xb: sign of byte 3 (0x33); 0xf: sign of byte 7 (0xf7)
  EXPECT_EQ(out[3], 0x44332211u);  // f4e 1: bytes 4 3 2 1
  EXPECT_EQ(out[4], 0x66f70011u);  // b4e 1: d.b3..b0 = bytes 6 7 0 1
  EXPECT_EQ(out[5], 0x22222222u);
  EXPECT_EQ(out[6], 0x33221111u);  // ecl 1: 3 2 1 1
  EXPECT_EQ(out[7], 0x22221100u);  // ecr 2: 2 2 1 0
  EXPECT_EQ(out[8], 0x33223322u);  // rc16 1: 3 2 3 2
}

TEST_F(PtxSemantics, BitFieldOps) {
  auto out = run(R"(
  mov.b32 %r1, 0xf0f0a5c3;
  bfe.u32 %r2, %r1, 4, 8;     st.global.u32 [%rd1], %r2;
  bfe.s32 %r2, %r1, 28, 8;    st.global.u32 [%rd1+4], %r2;
  bfe.s32 %r2, %r1, 8, 0;     st.global.u32 [%rd1+8], %r2;
  bfe.u32 %r2, %r1, 40, 4;    st.global.u32 [%rd1+12], %r2;
  bfi.b32 %r2, 0xff, %r1, 8, 4;  st.global.u32 [%rd1+16], %r2;
  bfind.u32 %r2, %r1;         st.global.u32 [%rd1+20], %r2;
  bfind.s32 %r2, %r1;         st.global.u32 [%rd1+24], %r2;
  bfind.shiftamt.u32 %r2, 0x100; st.global.u32 [%rd1+28], %r2;
  bfind.u32 %r2, 0;           st.global.u32 [%rd1+32], %r2;
  brev.b32 %r2, 1;            st.global.u32 [%rd1+36], %r2;
  clz.b32 %r2, 0;             st.global.u32 [%rd1+40], %r2;
  popc.b32 %r2, %r1;          st.global.u32 [%rd1+44], %r2;
  lop3.b32 %r2, %r1, 0xff00ff00, 0x0ff00ff0, 0x96; st.global.u32 [%rd1+48], %r2;
)", {}, 13);
  EXPECT_EQ(out[0], 0x5cu);
  EXPECT_EQ(out[1], 0xffffffffu);  // bits 28..31 = 0xf, then sign (bit 31) extends
  EXPECT_EQ(out[2], 0u);           // len 0
  EXPECT_EQ(out[3], 0u);           // start beyond msb, unsigned: zero fill
  EXPECT_EQ(out[4], 0xf0f0afc3u);
  EXPECT_EQ(out[5], 31u);
  EXPECT_EQ(out[6], 27u);          // negative: highest clear bit of 0xf0f0a5c3
  EXPECT_EQ(out[7], 23u);
  EXPECT_EQ(out[8], 0xffffffffu);
  EXPECT_EQ(out[9], 0x80000000u);
  EXPECT_EQ(out[10], 32u);
  EXPECT_EQ(out[11], static_cast<uint32_t>(std::popcount(0xf0f0a5c3u)));
  EXPECT_EQ(out[12], 0xf0f0a5c3u ^ 0xff00ff00u ^ 0x0ff00ff0u);  // 0x96 = a ^ b ^ c
}

TEST_F(PtxSemantics, ShiftsClampAndFunnel) {
  auto out = run(R"(
  mov.b32 %r1, 0x80000001;
  shl.b32 %r2, %r1, 33;          st.global.u32 [%rd1], %r2;
  shr.u32 %r2, %r1, 32;          st.global.u32 [%rd1+4], %r2;
  shr.s32 %r2, %r1, 100;         st.global.u32 [%rd1+8], %r2;
  shf.l.wrap.b32 %r2, %r1, 0x12345678, 36;  st.global.u32 [%rd1+12], %r2;
  shf.r.clamp.b32 %r2, %r1, 0x12345678, 40; st.global.u32 [%rd1+16], %r2;
  shf.r.wrap.b32 %r2, %r1, 0x12345678, 4;   st.global.u32 [%rd1+20], %r2;
)", {}, 6);
  EXPECT_EQ(out[0], 0u);
  EXPECT_EQ(out[1], 0u);
  EXPECT_EQ(out[2], 0xffffffffu);
  EXPECT_EQ(out[3], 0x23456788u);  // (0x12345678:0x80000001 << 4) >> 32
  EXPECT_EQ(out[4], 0x12345678u);  // clamp 32: the high word
  EXPECT_EQ(out[5], 0x88000000u);  // (b:a >> 4) low word
}

TEST_F(PtxSemantics, CarryChains) {
  // 64-bit add/sub from 32-bit halves with .cc, addc, subc, madc.
  auto out = run(R"(
  add.cc.u32 %r1, 0xffffffff, 1;   addc.u32 %r2, 5, 6;
  st.global.u32 [%rd1], %r1;  st.global.u32 [%rd1+4], %r2;
  sub.cc.u32 %r1, 0, 1;            subc.u32 %r2, 10, 3;
  st.global.u32 [%rd1+8], %r1;  st.global.u32 [%rd1+12], %r2;
  mad.lo.cc.u32 %r1, 0x10000, 0x10000, 0xffffffff; madc.hi.u32 %r2, 0x10000, 0x10000, 0;
  st.global.u32 [%rd1+16], %r1;  st.global.u32 [%rd1+20], %r2;
  add.cc.u32 %r1, 1, 1;            addc.cc.u32 %r2, 0xffffffff, 0; addc.u32 %r3, 0, 0;
  st.global.u32 [%rd1+24], %r3;
)", {}, 7);
  EXPECT_EQ(out[0], 0u);
  EXPECT_EQ(out[1], 12u);  // carry in
  EXPECT_EQ(out[2], 0xffffffffu);
  EXPECT_EQ(out[3], 6u);   // borrow in
  EXPECT_EQ(out[4], 0xffffffffu);  // 0x100000000 (lo = 0) + 0xffffffff: no carry
  EXPECT_EQ(out[5], 1u);   // hi = 1, carry 0
  EXPECT_EQ(out[6], 0u);
}

TEST_F(PtxSemantics, MultiplyVariants) {
  auto out = run(R"(
  mul.wide.s16 %r1, -3, 7;                 st.global.u32 [%rd1], %r1;
  mul.hi.u32 %r1, 0xffffffff, 0xffffffff;  st.global.u32 [%rd1+4], %r1;
  mul.hi.s32 %r1, -2, 0x40000000;          st.global.u32 [%rd1+8], %r1;
  mul24.lo.u32 %r1, 0x01000003, 5;         st.global.u32 [%rd1+12], %r1;
  mul24.hi.s32 %r1, 0x00800000, 0x00800000; st.global.u32 [%rd1+16], %r1;
  mad.hi.sat.s32 %r1, 0x7fffffff, 0x7fffffff, 0x7fffffff; st.global.u32 [%rd1+20], %r1;
  add.sat.s32 %r1, 0x7ffffff0, 0x100;      st.global.u32 [%rd1+24], %r1;
  sub.sat.s32 %r1, 0x80000010, 0x100;      st.global.u32 [%rd1+28], %r1;
  mul.wide.u32 %rd3, 0xffffffff, 0xffffffff; st.global.u64 [%rd1+32], %rd3;
  mul.hi.s64 %rd3, -1, 5;                  st.global.u64 [%rd1+40], %rd3;
)", {}, 12);
  EXPECT_EQ(out[0], static_cast<uint32_t>(-21));
  EXPECT_EQ(out[1], 0xfffffffeu);
  EXPECT_EQ(out[2], 0xffffffffu);
  EXPECT_EQ(out[3], 15u);               // 24-bit operands: 3 * 5
  EXPECT_EQ(out[4], 0x40000000u);       // (-2^23)^2 = 2^46: bits 47..16 of the product
  EXPECT_EQ(out[5], 0x7fffffffu);
  EXPECT_EQ(out[6], 0x7fffffffu);
  EXPECT_EQ(out[7], 0x80000000u);
  EXPECT_EQ(out[8], 0x00000001u);
  EXPECT_EQ(out[9], 0xfffffffeu);
  EXPECT_EQ(out[10], 0xffffffffu);
  EXPECT_EQ(out[11], 0xffffffffu);
}

TEST_F(PtxSemantics, IntegerDivisionEdgeCases) {
  auto out = run(R"(
  div.u32 %r1, 7, 0;          st.global.u32 [%rd1], %r1;
  rem.u32 %r1, 7, 0;          st.global.u32 [%rd1+4], %r1;
  div.s32 %r1, -7, 2;         st.global.u32 [%rd1+8], %r1;
  rem.s32 %r1, -7, 2;         st.global.u32 [%rd1+12], %r1;
  div.s32 %r1, 0x80000000, -1; st.global.u32 [%rd1+16], %r1;
  rem.s32 %r1, 0x80000000, -1; st.global.u32 [%rd1+20], %r1;
)", {}, 6);
  EXPECT_EQ(out[0], 0xffffffffu);
  EXPECT_EQ(out[1], 7u);
  EXPECT_EQ(out[2], static_cast<uint32_t>(-3));  // truncates toward zero
  EXPECT_EQ(out[3], static_cast<uint32_t>(-1));
  EXPECT_EQ(out[4], 0x80000000u);
  EXPECT_EQ(out[5], 0u);
}

TEST_F(PtxSemantics, ConversionsSaturateAndRound) {
  auto out = run(R"(
  cvt.sat.s8.s32 %r1, 300;            st.global.u32 [%rd1], %r1;
  cvt.sat.u8.s32 %r1, -5;             st.global.u32 [%rd1+4], %r1;
  cvt.s32.s8 %r1, 0x80;               st.global.u32 [%rd1+8], %r1;
  cvt.u16.u32 %r1, 0x12345;           st.global.u32 [%rd1+12], %r1;
  mov.b32 %f1, 0f7FC00001;
  cvt.rzi.s32.f32 %r1, %f1;           st.global.u32 [%rd1+16], %r1;
  cvt.rzi.u32.f32 %r1, 0fC0000000;    st.global.u32 [%rd1+20], %r1;
  cvt.rni.s32.f32 %r1, 0f4F800000;    st.global.u32 [%rd1+24], %r1;
  cvt.rni.s32.f32 %r1, 0f40200000;    st.global.u32 [%rd1+28], %r1;
  cvt.rmi.s32.f32 %r1, 0fC0200000;    st.global.u32 [%rd1+32], %r1;
  cvt.rn.f16.f32 %h1, 0f3F800000;     cvt.u32.u16 %r1, %h1;  st.global.u32 [%rd1+36], %r1;
  cvt.f32.f16 %f2, %h1;               st.global.f32 [%rd1+40], %f2;
  cvt.rn.f16x2.f32 %r1, 0f40000000, 0f3F800000;  st.global.u32 [%rd1+44], %r1;
  cvt.sat.f32.f32 %f2, 0f3FC00000;    st.global.f32 [%rd1+48], %f2;
  cvt.ftz.f32.f32 %f2, 0f00000001;    st.global.f32 [%rd1+52], %f2;
  cvt.rn.bf16.f32 %h1, 0f3F808000;    cvt.u32.u16 %r1, %h1;  st.global.u32 [%rd1+56], %r1;
  cvt.rpi.f32.f32 %f2, 0f3F8CCCCD;    st.global.f32 [%rd1+60], %f2;
)", {}, 16);
  EXPECT_EQ(out[0], 127u);
  EXPECT_EQ(out[1], 0u);
  EXPECT_EQ(out[2], static_cast<uint32_t>(-128));
  EXPECT_EQ(out[3], 0x2345u);
  EXPECT_EQ(out[4], 0u);            // NaN -> 0
  EXPECT_EQ(out[5], 0u);            // negative -> 0 for unsigned
  EXPECT_EQ(out[6], 0x7fffffffu);   // 2^32 saturates
  EXPECT_EQ(out[7], 2u);            // 2.5 -> 2 (ties to even)
  EXPECT_EQ(out[8], static_cast<uint32_t>(-3));
  EXPECT_EQ(out[9], 0x3c00u);
  EXPECT_EQ(out[10], f2u(1.0f));
  EXPECT_EQ(out[11], 0x40003c00u);  // a (2.0) in the upper half
  EXPECT_EQ(out[12], f2u(1.0f));
  EXPECT_EQ(out[13], 0u);
  EXPECT_EQ(out[14], 0x3f80u);      // tie to even
  EXPECT_EQ(out[15], f2u(2.0f));
}

TEST_F(PtxSemantics, FloatComparisonsAndSelection) {
  auto out = run(R"(
  mov.b32 %f1, 0f7FC00000;
  setp.lt.f32 %p1, %f1, 0f3F800000;   selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1], %r1;
  setp.ltu.f32 %p1, %f1, 0f3F800000;  selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+4], %r1;
  setp.nan.f32 %p1, %f1, %f1;         selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+8], %r1;
  setp.ge.and.s32 %p1|%p2, 5, 3, 1;
  selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+12], %r1;
  selp.u32 %r1, 1, 0, %p2;  st.global.u32 [%rd1+16], %r1;
  setp.lo.u32 %p1, 1, 0xffffffff;     selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+20], %r1;
  setp.lt.s32 %p1, 1, 0xffffffff;     selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+24], %r1;
  slct.u32.s32 %r1, 10, 20, -1;       st.global.u32 [%rd1+28], %r1;
  slct.u32.f32 %r1, 10, 20, 0f80000000; st.global.u32 [%rd1+32], %r1;
  set.gt.u32.f32 %r1, 0f40000000, 0f3F800000; st.global.u32 [%rd1+36], %r1;
  set.gt.f32.f32 %f2, 0f40000000, 0f3F800000; st.global.f32 [%rd1+40], %f2;
  min.f32 %f2, %f1, 0f3F800000;       st.global.f32 [%rd1+44], %f2;
  max.NaN.f32 %f2, %f1, 0f3F800000;   st.global.f32 [%rd1+48], %f2;
  min.f32 %f2, 0f80000000, 0f00000000; st.global.f32 [%rd1+52], %f2;
  add.f32 %f2, %f1, 0f3F800000;       st.global.f32 [%rd1+56], %f2;
  copysign.f32 %f2, 0fBF800000, 0f40000000; st.global.f32 [%rd1+60], %f2;
)", {}, 16);
  EXPECT_EQ(out[0], 0u);
  EXPECT_EQ(out[1], 1u);
  EXPECT_EQ(out[2], 1u);
  EXPECT_EQ(out[3], 1u);
  EXPECT_EQ(out[4], 0u);
  EXPECT_EQ(out[5], 1u);
  EXPECT_EQ(out[6], 0u);
  EXPECT_EQ(out[7], 20u);
  EXPECT_EQ(out[8], 10u);  // -0.0 >= 0
  EXPECT_EQ(out[9], 0xffffffffu);
  EXPECT_EQ(out[10], f2u(1.0f));
  EXPECT_EQ(out[11], f2u(1.0f));
  EXPECT_EQ(out[12], 0x7fffffffu);
  EXPECT_EQ(out[13], 0x80000000u);
  EXPECT_EQ(out[14], 0x7fffffffu);  // canonical NaN
  EXPECT_EQ(out[15], f2u(-2.0f));
}

TEST_F(PtxSemantics, DirectedRoundingF32AndF64) {
  auto out = run(R"(
  add.rz.f32 %f1, 0f3F800000, 0f33800000;  st.global.f32 [%rd1], %f1;
  add.rp.f32 %f1, 0f3F800000, 0f33800000;  st.global.f32 [%rd1+4], %f1;
  add.rm.f32 %f1, 0fBF800000, 0fB3800000;  st.global.f32 [%rd1+8], %f1;
  mov.b64 %fd1, 0d3FF0000000000000;
  mov.b64 %fd2, 0d3C90000000000000;
  add.rp.f64 %fd3, %fd1, %fd2;             st.global.f64 [%rd1+16], %fd3;
  add.rz.f64 %fd3, %fd1, %fd2;             st.global.f64 [%rd1+24], %fd3;
  div.rn.f32 %f1, 0f3F800000, 0f40400000;  st.global.f32 [%rd1+32], %f1;
  div.rz.f32 %f1, 0f3F800000, 0f40400000;  st.global.f32 [%rd1+36], %f1;
  mul.ftz.f32 %f1, 0f00800000, 0f3F000000; st.global.f32 [%rd1+40], %f1;
  mul.f32 %f1, 0f00800000, 0f3F000000;     st.global.f32 [%rd1+44], %f1;
  fma.rn.sat.f32 %f1, 0f40000000, 0f40000000, 0f00000000; st.global.f32 [%rd1+48], %f1;
)", {}, 13);
  EXPECT_EQ(out[0], f2u(1.0f));
  EXPECT_EQ(out[1], f2u(std::nextafter(1.0f, 2.0f)));
  EXPECT_EQ(out[2], f2u(std::nextafter(-1.0f, -2.0f)));
  uint64_t rp = static_cast<uint64_t>(out[4]) | (static_cast<uint64_t>(out[5]) << 32);
  uint64_t rz = static_cast<uint64_t>(out[6]) | (static_cast<uint64_t>(out[7]) << 32);
  EXPECT_EQ(rp, std::bit_cast<uint64_t>(std::nextafter(1.0, 2.0)));
  EXPECT_EQ(rz, std::bit_cast<uint64_t>(1.0));
  EXPECT_EQ(out[8], 0x3eaaaaabu);
  EXPECT_EQ(out[9], 0x3eaaaaaau);
  EXPECT_EQ(out[10], 0u);          // subnormal result flushed
  EXPECT_EQ(out[11], 0x00400000u);  // subnormal kept
  EXPECT_EQ(out[12], f2u(1.0f));
}

TEST_F(PtxSemantics, HalfPrecisionArithmetic) {
  auto out = run(R"(
  mov.b32 %r1, 0x3c004000;   // {2.0 (hi), 1.0 (lo)}... hi=0x3c00, lo=0x4000
  add.f16x2 %r2, %r1, %r1;   st.global.u32 [%rd1], %r2;
  mul.f16x2 %r2, %r1, %r1;   st.global.u32 [%rd1+4], %r2;
  fma.rn.f16x2 %r2, %r1, %r1, %r1;  st.global.u32 [%rd1+8], %r2;
  mov.b16 %h1, 0x7bff;
  add.f16 %h2, %h1, %h1;     cvt.u32.u16 %r3, %h2;  st.global.u32 [%rd1+12], %r3;
  add.rn.bf16 %h2, 0x3f80, 0x3f80;  cvt.u32.u16 %r3, %h2;  st.global.u32 [%rd1+16], %r3;
  max.f16 %h2, 0x7e00, 0x3c00; cvt.u32.u16 %r3, %h2;  st.global.u32 [%rd1+20], %r3;
)", {}, 6);
  EXPECT_EQ(out[0], 0x40004400u);  // {2, 4}
  EXPECT_EQ(out[1], 0x3c004400u);  // {1, 4}
  EXPECT_EQ(out[2], 0x40004600u);  // {2, 6}
  EXPECT_EQ(out[3], 0x7c00u);      // overflow to infinity
  EXPECT_EQ(out[4], 0x4000u);
  EXPECT_EQ(out[5], 0x3c00u);      // NaN operand: the other one
}

// --- Constructs CCCL (CUB, Thrust) emits for sm_90 and later, found in CuPy's
// prebuilt compute_120 PTX (tests/corpus/cccl_*.ptx).

// griddepcontrol (programmatic dependent launch) orders nothing more than
// vgpu's streams already do: the kernel runs through it.
TEST_F(PtxSemantics, GridDependencyControl) {
  auto out = run(R"(
  griddepcontrol.wait;
  ld.global.u32 %r1, [%rd2];
  add.u32 %r1, %r1, 1;
  griddepcontrol.launch_dependents;
  st.global.u32 [%rd1], %r1;
)", {41}, 1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], 42u);
}

// CUB's warp reduction writes `shfl` results into registers declared without
// '%' inside an inline-assembly scope, `r0|p` included.
TEST_F(PtxSemantics, PredicatePairOfRegistersWithoutPercent) {
  std::vector<uint32_t> in(32);
  for (uint32_t i = 0; i < 32; ++i) in[i] = 3 * i + 1;
  auto out = run(R"(
  shl.b32 %r9, %r0, 2;
  cvt.u64.u32 %rd3, %r9;
  add.u64 %rd4, %rd2, %rd3;
  ld.global.u32 %r1, [%rd4];
  { .reg .u32 r0; .reg .pred p; shfl.sync.down.b32 r0|p, %r1, 1, 31, -1; @p add.u32 r0, r0, %r1; mov.u32 %r2, r0;}
  add.u64 %rd5, %rd1, %rd3;
  st.global.u32 [%rd5], %r2;
)", in, 32, 32);
  ASSERT_EQ(out.size(), 32u);
  for (uint32_t i = 0; i < 31; ++i) EXPECT_EQ(out[i], in[i] + in[i + 1]) << "lane " << i;
  EXPECT_EQ(out[31], in[31]);  // lane 31 reads past the clamp: its own value, p false
}

// set writes 1.0 in a floating-point destination type (f32, f16, bf16), all
// ones in an integer one; packed sources compare half by half; setp on packed
// pairs sets p from the low halves and q from the high ones; .ftz flushes
// subnormal f16 inputs.
TEST_F(PtxSemantics, SetAndSetpOnHalfTypes) {
  auto out = run(R"(
  mov.b16 %h1, 0x7e00;   // NaN
  mov.b16 %h2, 0x3c00;   // 1.0
  mov.b16 %h4, 0x4000;   // 2.0
  set.nan.f16.f16 %h3, %h1, %h2;   cvt.u32.u16 %r1, %h3;  st.global.u32 [%rd1], %r1;
  set.nan.f16.f16 %h3, %h2, %h2;   cvt.u32.u16 %r1, %h3;  st.global.u32 [%rd1+4], %r1;
  set.lt.u32.f16 %r1, %h2, %h4;    st.global.u32 [%rd1+8], %r1;
  set.lt.u16.f16 %h3, %h2, %h4;    cvt.u32.u16 %r1, %h3;  st.global.u32 [%rd1+12], %r1;
  set.gt.bf16.f32 %h3, 0f40000000, 0f3F800000;  cvt.u32.u16 %r1, %h3;  st.global.u32 [%rd1+16], %r1;
  mov.b32 %r2, 0x42003c00;   // {hi 3.0, lo 1.0}
  mov.b32 %r3, 0x40004000;   // {hi 2.0, lo 2.0}
  set.lt.f16x2.f16x2 %r1, %r2, %r3;  st.global.u32 [%rd1+20], %r1;
  set.lt.u32.f16x2 %r1, %r2, %r3;    st.global.u32 [%rd1+24], %r1;
  setp.lt.f16x2 %p1|%p2, %r2, %r3;
  selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+28], %r1;
  selp.u32 %r1, 1, 0, %p2;  st.global.u32 [%rd1+32], %r1;
  setp.ge.f16x2 %p1|%p2, %r2, %r3;
  selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+36], %r1;
  selp.u32 %r1, 1, 0, %p2;  st.global.u32 [%rd1+40], %r1;
  mov.b16 %h5, 0x0001;
  mov.b16 %h6, 0x0002;
  setp.lt.f16 %p1, %h5, %h6;      selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+44], %r1;
  setp.lt.ftz.f16 %p1, %h5, %h6;  selp.u32 %r1, 1, 0, %p1;  st.global.u32 [%rd1+48], %r1;
)", {}, 13);
  const std::vector<uint32_t> expected = {
      0x3c00u, 0u,             // set.nan.f16: 1.0 or 0.0 in f16
      0xffffffffu, 0xffffu,    // integer destinations: all ones of their size
      0x3f80u,                 // 1.0 in bf16
      0x00003c00u,             // low half 1 < 2: 1.0; high half 3 < 2: 0
      0x0000ffffu,
      1u, 0u,                  // setp.lt.f16x2: p low, q high
      0u, 1u,                  // setp.ge.f16x2
      1u, 0u,                  // two subnormals compare, unless flushed to zero
  };
  EXPECT_EQ(out, expected);
}

// bar.red across the CTA (two warps) and bar.warp.sync.
TEST_F(PtxSemantics, BarrierReductions) {
  auto out = run(R"(
  setp.eq.u32 %p1, %r0, 37;
  bar.red.or.pred %p2, 0, %p1;
  bar.red.and.pred %p3, 1, %p1;
  setp.lt.u32 %p4, %r0, 100;
  bar.red.and.pred %p5, 2, %p4;
  bar.red.popc.u32 %r1, 3, %p1;
  bar.warp.sync -1;
  selp.u32 %r2, 1, 0, %p2;
  selp.u32 %r3, 2, 0, %p3;
  selp.u32 %r4, 4, 0, %p5;
  or.b32 %r2, %r2, %r3;
  or.b32 %r2, %r2, %r4;
  shl.b32 %r1, %r1, 8;
  or.b32 %r2, %r2, %r1;
  shl.b32 %r9, %r0, 2;
  cvt.u64.u32 %rd3, %r9;
  add.u64 %rd4, %rd1, %rd3;
  st.global.u32 [%rd4], %r2;
)", {}, 64, 64);
  ASSERT_EQ(out.size(), 64u);
  for (uint32_t i = 0; i < 64; ++i) EXPECT_EQ(out[i], 0x100u | 1u | 4u) << "thread " << i;
}

// Loads and stores with memory-order and scope qualifiers, vectors included,
// and atomics of CTA scope in global and shared memory.
TEST_F(PtxSemantics, OrderedAndScopedMemoryOperations) {
  const std::string prelude = ".shared .align 8 .b8 counter[8];\n";
  auto out = run(R"(
  ld.relaxed.gpu.v2.u64 {%rd3, %rd4}, [%rd2];
  st.relaxed.gpu.v2.u64 [%rd1], {%rd4, %rd3};
  ld.relaxed.gpu.v4.u32 {%r1, %r2, %r3, %r4}, [%rd2];
  st.relaxed.gpu.v4.u32 [%rd1+16], {%r4, %r3, %r2, %r1};
  ld.acquire.gpu.u32 %r5, [%rd2+4];
  st.release.gpu.u32 [%rd1+32], %r5;
  ld.cg.v2.u64 {%rd5, %rd6}, [%rd2];
  st.cg.v2.u64 [%rd1+48], {%rd5, %rd6};
  mov.u64 %rd7, 7;
  st.global.u64 [%rd1+64], %rd7;
  atom.global.cta.add.u64 %rd8, [%rd1+64], 5;
  mov.u32 %r6, counter;
  st.shared.u64 [%r6], %rd7;
  atom.shared.cta.add.u64 %rd9, [%r6], 3;
  ld.shared.u64 %rd10, [%r6];
  st.global.u64 [%rd1+72], %rd8;
  st.global.u64 [%rd1+80], %rd9;
  st.global.u64 [%rd1+88], %rd10;
)", {1, 2, 3, 4}, 24, 1, prelude);
  const std::vector<uint32_t> expected = {3, 4, 1, 2,  4, 3, 2, 1,  2, 0, 0, 0,  1, 2, 3, 4,
                                          12, 0,  7, 0,  7, 0,  10, 0};
  EXPECT_EQ(out, expected);
}

// Rounding to integral values in f64, integer <-> f16 conversions (round to
// nearest even, overflow to infinity; NaN to 0, infinity saturated) and the
// reciprocal approximation's flushing of subnormal inputs.
TEST_F(PtxSemantics, IntegralRoundingAndHalfConversions) {
  auto out = run(R"(
  cvt.rmi.f64.f64 %fd1, 0dC004000000000000;  st.global.f64 [%rd1], %fd1;
  cvt.rpi.f64.f64 %fd1, 0d4000CCCCCCCCCCCD;  st.global.f64 [%rd1+8], %fd1;
  cvt.rni.f64.f64 %fd1, 0d4004000000000000;  st.global.f64 [%rd1+16], %fd1;
  cvt.rni.f64.f64 %fd1, 0d400C000000000000;  st.global.f64 [%rd1+24], %fd1;
  cvt.rzi.f64.f64 %fd1, 0dC005999999999999;  st.global.f64 [%rd1+32], %fd1;
  cvt.rn.f16.s32 %h1, 2049;    cvt.u32.u16 %r1, %h1;  st.global.u32 [%rd1+40], %r1;
  cvt.rn.f16.s32 %h1, 2051;    cvt.u32.u16 %r1, %h1;  st.global.u32 [%rd1+44], %r1;
  cvt.rn.f16.s32 %h1, 70000;   cvt.u32.u16 %r1, %h1;  st.global.u32 [%rd1+48], %r1;
  cvt.rn.f16.s32 %h1, -65520;  cvt.u32.u16 %r1, %h1;  st.global.u32 [%rd1+52], %r1;
  mov.b16 %h2, 0xc0a0;   // -2.3125
  cvt.rzi.s32.f16 %r1, %h2;    st.global.u32 [%rd1+56], %r1;
  mov.b16 %h2, 0x7e00;
  cvt.rzi.s32.f16 %r1, %h2;    st.global.u32 [%rd1+60], %r1;
  mov.b16 %h2, 0x7c00;
  cvt.rzi.s32.f16 %r1, %h2;    st.global.u32 [%rd1+64], %r1;
  mov.b64 %rd3, 9007199254740993;
  cvt.rn.f64.s64 %fd1, %rd3;   st.global.f64 [%rd1+72], %fd1;
  mov.b64 %fd2, 0d0000000000000001;
  rcp.approx.ftz.f64 %fd1, %fd2;  st.global.f64 [%rd1+80], %fd1;
  rcp.approx.ftz.f64 %fd1, 0d4010000000000000;  st.global.f64 [%rd1+88], %fd1;
)", {}, 24);
  ASSERT_EQ(out.size(), 24u);
  auto f64 = [&](size_t word) {
    return std::bit_cast<double>(static_cast<uint64_t>(out[word]) | (static_cast<uint64_t>(out[word + 1]) << 32));
  };
  EXPECT_EQ(f64(0), -3.0);   // floor(-2.5)
  EXPECT_EQ(f64(2), 3.0);    // ceil(2.1)
  EXPECT_EQ(f64(4), 2.0);    // 2.5: ties to even
  EXPECT_EQ(f64(6), 4.0);    // 3.5: ties to even
  EXPECT_EQ(f64(8), -2.0);   // trunc(-2.7)
  EXPECT_EQ(out[10], 0x6800u);  // 2049 -> 2048 (tie, even)
  EXPECT_EQ(out[11], 0x6802u);  // 2051 -> 2052 (tie, even)
  EXPECT_EQ(out[12], 0x7c00u);  // beyond the largest f16: infinity
  EXPECT_EQ(out[13], 0xfc00u);  // -65520 is the tie above -65504: rounds to -infinity
  EXPECT_EQ(out[14], static_cast<uint32_t>(-2));
  EXPECT_EQ(out[15], 0u);           // NaN -> 0
  EXPECT_EQ(out[16], 0x7fffffffu);  // infinity saturates
  EXPECT_EQ(f64(18), 9007199254740992.0);  // 2^53 + 1: tie to even
  EXPECT_EQ(f64(20), std::numeric_limits<double>::infinity());  // subnormal flushed: 1/+0
  EXPECT_EQ(f64(22), 0.25);
}

TEST_F(PtxSemantics, VectorMovPackAndUnpack) {
  auto out = run(R"(
  mov.b64 %rd3, {%r4, %r5};
  mov.b32 %r4, 0x11111111;
  mov.b32 %r5, 0x22222222;
  mov.b64 %rd3, {%r4, %r5};  st.global.u64 [%rd1], %rd3;
  mov.b64 {%r6, %r7}, %rd3;  st.global.v2.u32 [%rd1+8], {%r7, %r6};
  mov.b32 %r8, {%h1, %h2};
  mov.b16 %h1, 0xaaaa;  mov.b16 %h2, 0xbbbb;
  mov.b32 %r8, {%h1, %h2};   st.global.u32 [%rd1+16], %r8;
  ld.global.v4.u32 {%r10, %r11, _, %r13}, [%rd2];
  st.global.v4.u32 [%rd1+32], {%r13, %r11, %r10, 7};
)", {1, 2, 3, 4}, 12);
  EXPECT_EQ(out[0], 0x11111111u);
  EXPECT_EQ(out[1], 0x22222222u);
  EXPECT_EQ(out[2], 0x22222222u);
  EXPECT_EQ(out[3], 0x11111111u);
  EXPECT_EQ(out[4], 0xbbbbaaaau);
  EXPECT_EQ(out[8], 4u);
  EXPECT_EQ(out[9], 2u);
  EXPECT_EQ(out[10], 1u);
  EXPECT_EQ(out[11], 7u);
}

TEST_F(PtxSemantics, SharedAndLocalThroughGenericAddresses) {
  auto out = run(R"(
  .shared .align 4 .b32 sbuf[32];
  .local .align 4 .b32 lbuf[4];
  mov.u64 %rd3, sbuf;
  cvta.shared.u64 %rd4, %rd3;
  mul.wide.u32 %rd5, %r0, 4;
  add.s64 %rd6, %rd4, %rd5;
  st.u32 [%rd6], %r0;                   // generic store into shared
  bar.sync 0;
  xor.b32 %r1, %r0, 1;
  mul.wide.u32 %rd7, %r1, 4;
  add.s64 %rd8, %rd3, %rd7;
  ld.shared.u32 %r2, [%rd8];            // neighbour's value
  mov.u64 %rd9, lbuf;
  cvta.local.u64 %rd10, %rd9;
  st.u32 [%rd10+8], %r2;                // generic store into local
  ld.local.u32 %r3, [lbuf+8];
  isspacep.shared %p1, %rd4;
  isspacep.global %p2, %rd4;
  isspacep.local %p3, %rd10;
  selp.u32 %r4, 1, 0, %p1;
  selp.u32 %r5, 2, 0, %p2;
  selp.u32 %r6, 4, 0, %p3;
  or.b32 %r4, %r4, %r5;
  or.b32 %r4, %r4, %r6;
  shl.b32 %r4, %r4, 16;
  or.b32 %r3, %r3, %r4;
  add.s64 %rd11, %rd1, %rd5;
  st.global.u32 [%rd11], %r3;
)", {}, 32, 32);
  for (uint32_t t = 0; t < 32; ++t) EXPECT_EQ(out[t], (t ^ 1) | (5u << 16)) << t;
}

TEST_F(PtxSemantics, CallsWithParamsAndReturns) {
  std::string prelude = R"(
.func (.param .b64 ret) addmul(.param .b32 a, .param .b32 b, .param .align 8 .b8 s[16])
{
  .reg .b32 %q<4>;
  .reg .b64 %qd<4>;
  ld.param.u32 %q1, [a];
  ld.param.u32 %q2, [b];
  ld.param.u64 %qd1, [s+8];
  mul.wide.u32 %qd2, %q1, %q2;
  add.s64 %qd3, %qd2, %qd1;
  st.param.b64 [ret], %qd3;
  ret;
}
)";
  auto out = run(R"(
  {
    .param .b32 pa;
    .param .b32 pb;
    .param .align 8 .b8 ps[16];
    .param .b64 rv;
    st.param.b32 [pa], %r0;
    st.param.b32 [pb], 1000;
    st.param.b64 [ps+8], 7;
    call.uni (rv), addmul, (pa, pb, ps);
    ld.param.b64 %rd3, [rv];
  }
  mul.wide.u32 %rd4, %r0, 8;
  add.s64 %rd5, %rd1, %rd4;
  st.global.u64 [%rd5], %rd3;
)", {}, 8, 4, prelude);
  for (uint32_t t = 0; t < 4; ++t) EXPECT_EQ(out[t * 2], t * 1000 + 7) << t;
}

TEST_F(PtxSemantics, ExitedThreadsDoNotBlockBarriers) {
  auto out = run(R"(
  setp.ge.u32 %p1, %r0, 40;
  @%p1 exit;
  bar.sync 0;
  mul.wide.u32 %rd3, %r0, 4;
  add.s64 %rd4, %rd1, %rd3;
  st.global.u32 [%rd4], 1;
)", {}, 64, 64);
  for (uint32_t t = 0; t < 64; ++t) EXPECT_EQ(out[t], t < 40 ? 1u : 0u) << t;
}

TEST_F(PtxSemantics, ShuffleOutOfRangePredicate) {
  auto out = run(R"(
  shfl.sync.up.b32 %r1|%p1, %r0, 2, 0, 0xffffffff;
  selp.u32 %r2, 1000, 0, %p1;
  add.u32 %r1, %r1, %r2;
  mul.wide.u32 %rd3, %r0, 4;
  add.s64 %rd4, %rd1, %rd3;
  st.global.u32 [%rd4], %r1;
)", {}, 32, 32);
  for (uint32_t t = 0; t < 32; ++t) EXPECT_EQ(out[t], t >= 2 ? (t - 2 + 1000) : t) << t;
}

// Warp operations whose lanes pass different membermasks (cooperative
// groups' binary_partition and labeled_partition do) act on each mask's lanes
// apart: here the even lanes and the odd lanes.
TEST_F(PtxSemantics, SyncOperationsActOnEachLanesMembermask) {
  auto out = run(R"(
  and.b32 %r1, %r0, 1;
  setp.eq.u32 %p1, %r1, 0;
  selp.b32 %r2, 0x55555555, 0xaaaaaaaa, %p1;
  mul.lo.u32 %r3, %r0, 20;
  cvt.u64.u32 %rd3, %r3;
  add.u64 %rd4, %rd1, %rd3;
  redux.sync.add.u32 %r4, %r0, %r2;
  st.global.u32 [%rd4], %r4;
  setp.lt.u32 %p2, %r0, 8;
  vote.sync.ballot.b32 %r4, %p2, %r2;
  st.global.u32 [%rd4+4], %r4;
  vote.sync.any.pred %p3, %p2, %r2;
  selp.u32 %r4, 1, 0, %p3;
  st.global.u32 [%rd4+8], %r4;
  shr.u32 %r5, %r0, 2;
  match.any.sync.b32 %r4, %r5, %r2;
  st.global.u32 [%rd4+12], %r4;
  match.all.sync.b32 %r4|%p4, %r1, %r2;
  selp.u32 %r6, 1, 0, %p4;
  add.u32 %r4, %r4, %r6;
  st.global.u32 [%rd4+16], %r4;
)", {}, 32 * 5, 32);
  ASSERT_EQ(out.size(), 32u * 5);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    const bool even = lane % 2 == 0;
    const uint32_t group = even ? 0x55555555u : 0xaaaaaaaau;
    const uint32_t* o = &out[lane * 5];
    EXPECT_EQ(o[0], even ? 240u : 256u) << lane;                      // sum of the group's lane ids
    EXPECT_EQ(o[1], even ? 0x55u : 0xaau) << lane;                    // its lanes below 8
    EXPECT_EQ(o[2], 1u) << lane;
    EXPECT_EQ(o[3], (0xfu << (lane / 4 * 4)) & group) << lane;        // same lane / 4, in the group
    EXPECT_EQ(o[4], group + 1) << lane;                               // all equal in the group
  }
}

TEST_F(PtxSemantics, VoteUniAndMatchAll) {
  auto out = run(R"(
  and.b32 %r1, %r0, 0;
  match.all.sync.b32 %r2|%p1, %r1, 0xffffffff;
  setp.lt.u32 %p2, %r0, 16;
  vote.sync.uni.pred %p3, %p2, 0xffffffff;
  vote.sync.uni.pred %p4, %p1, 0xffffffff;
  selp.u32 %r3, 1, 0, %p3;
  selp.u32 %r4, 2, 0, %p4;
  or.b32 %r3, %r3, %r4;
  mul.wide.u32 %rd3, %r0, 8;
  add.s64 %rd4, %rd1, %rd3;
  st.global.v2.u32 [%rd4], {%r2, %r3};
)", {}, 64, 32);
  for (uint32_t t = 0; t < 32; ++t) {
    EXPECT_EQ(out[t * 2], 0xffffffffu) << t;
    EXPECT_EQ(out[t * 2 + 1], 2u) << t;
  }
}

TEST_F(PtxSemantics, BarrierDeadlockIsReported) {
  module_.load(kernel(R"(
  setp.lt.u32 %p1, %r0, 32;
  @%p1 bar.sync 1, 64;
)")).isOk();
  uint32_t* out = module_.memory().alloc<uint32_t>(1);
  EXPECT_THAT(module_.launch("k", {1}, {64}, Params().add(out).add(out)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("deadlock")));
}

TEST_F(PtxSemantics, ModuleGlobalsWithInitializers) {
  Module m;
  ASSERT_THAT(m.load(R"(.version 8.0
.target sm_80
.address_size 64
.global .align 4 .u32 table[4] = {10, 20, 30, 40};
.const .align 8 .f64 scale = 0d4000000000000000;
.global .align 8 .u64 ptr = table;
.global .align 4 .b32 counter;
.visible .entry k(.param .u64 out)
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<8>;
  .reg .f64 %fd<4>;
  ld.param.u64 %rd1, [out];
  ld.global.u64 %rd2, [ptr];
  ld.u32 %r1, [%rd2+8];
  ld.const.f64 %fd1, [scale];
  cvt.rn.f64.u32 %fd2, %r1;
  mul.f64 %fd3, %fd1, %fd2;
  st.global.f64 [%rd1], %fd3;
  atom.global.add.u32 %r2, [counter], 5;
  ret;
}
)"), IsOk());
  const auto& globals = m.program().globals();
  ASSERT_EQ(globals.size(), 4u);
  EXPECT_EQ(globals[0].name, "table");
  EXPECT_EQ(globals[0].size, 16u);
  auto* table = reinterpret_cast<uint32_t*>(globals[0].address);
  EXPECT_EQ(table[3], 40u);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(globals[2].address), globals[0].address);
  double* out = m.memory().alloc<double>(1);
  ASSERT_THAT(m.launch("k", {1}, {1}, Params().add(out)), IsOk());
  EXPECT_EQ(*out, 60.0);
  EXPECT_EQ(*reinterpret_cast<uint32_t*>(globals[3].address), 5u);
}

TEST_F(PtxSemantics, FunctionInfoReportsLayout) {
  Module m;
  ASSERT_THAT(m.load(R"(.version 8.0
.target sm_80
.address_size 64
.extern .shared .align 16 .b8 dyn[];
.visible .entry k(.param .u32 a, .param .u64 b, .param .align 4 .b8 c[12])
.maxntid 128, 1, 1
{
  .shared .align 4 .b8 s[100];
  .local .align 8 .b8 depot[24];
  ret;
}
)"), IsOk());
  ASSERT_EQ(m.program().functions().size(), 1u);
  const FunctionInfo& f = m.program().functions()[0];
  EXPECT_EQ(f.name, "k");
  ASSERT_EQ(f.params.size(), 3u);
  EXPECT_EQ(f.params[1].offset, 8u);
  EXPECT_EQ(f.params[2].offset, 16u);
  EXPECT_EQ(f.paramBufferSize, 28u);
  EXPECT_EQ(f.staticSharedBytes, 100u);
  EXPECT_EQ(f.localBytesPerThread, 32u);
  EXPECT_EQ(f.maxThreadsPerBlock, 128);
}

TEST_F(PtxSemantics, MalformedPtxIsInvalidArgument) {
  Module m;
  EXPECT_THAT(m.load(".version 8.0\n.target sm_80\n.entry k( { bogus"),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(m.load(R"(.version 8.0
.target sm_80
.address_size 64
.visible .entry k()
{
  bra $L_nowhere;
}
)"), StatusIs(Code::kInvalidArgument, HasSubstr("L_nowhere")));
  // Too few operands or a vector narrower than the access: refused, never run.
  EXPECT_THAT(m.load(kernel("shfl.sync.up.b32 %r1, %r0, 1;")),
              StatusIs(Code::kInvalidArgument, HasSubstr("operands")));
  EXPECT_THAT(m.load(kernel("ld.global.v4.u32 {%r1, %r2}, [%rd2];")),
              StatusIs(Code::kInvalidArgument, HasSubstr("malformed")));
}

// cnot: 1 for a zero operand, 0 for any other.
TEST_F(PtxSemantics, LogicalNot) {
  auto out = run(R"(
  ld.global.u32 %r10, [%rd2];
  cnot.b32 %r1, %r10;  st.global.u32 [%rd1], %r1;
  mov.u32 %r11, 5;
  cnot.b32 %r1, %r11;  st.global.u32 [%rd1+4], %r1;
)", {0}, 2);
  EXPECT_EQ(out, (std::vector<uint32_t>{1, 0}));
}

// dp4a: c plus the four byte products; dp2a: c plus the two 16-bit halves of
// a times bytes 0-1 (.lo) or 2-3 (.hi) of b. Signed forms sign-extend.
TEST_F(PtxSemantics, DotProducts) {
  auto out = run(R"(
  mov.b32 %r10, 0x01020304;
  mov.b32 %r11, 0x05060708;
  mov.b32 %r12, 100;
  dp4a.u32.u32 %r1, %r10, %r11, %r12;  st.global.u32 [%rd1], %r1;
  mov.b32 %r13, 0xff020304;
  mov.b32 %r14, -100;
  dp4a.s32.s32 %r1, %r13, %r11, %r14;  st.global.u32 [%rd1+4], %r1;
  mov.b32 %r15, 0x00030002;
  mov.b32 %r16, 0x0a090807;
  mov.b32 %r17, 1;
  dp2a.lo.u32.u32 %r1, %r15, %r16, %r17;  st.global.u32 [%rd1+8], %r1;
  dp2a.hi.u32.u32 %r1, %r15, %r16, %r17;  st.global.u32 [%rd1+12], %r1;
  mov.b32 %r18, 0xfffe0002;
  dp2a.lo.s32.s32 %r1, %r18, %r16, %r12;  st.global.u32 [%rd1+16], %r1;
)", {}, 5);
  EXPECT_EQ(out[0], 170u);                                   // 4*8 + 3*7 + 2*6 + 1*5 + 100
  EXPECT_EQ(out[1], static_cast<uint32_t>(4 * 8 + 3 * 7 + 2 * 6 - 1 * 5 - 100));
  EXPECT_EQ(out[2], 39u);                                    // 2*7 + 3*8 + 1
  EXPECT_EQ(out[3], 49u);                                    // 2*9 + 3*10 + 1
  EXPECT_EQ(out[4], static_cast<uint32_t>(2 * 7 - 2 * 8 + 100));
}

// mad24: the 48-bit product of two 24-bit values, its low 32 bits (.lo) or
// bits 47..16 (.hi), plus c.
TEST_F(PtxSemantics, Multiply24) {
  auto out = run(R"(
  mov.b32 %r10, 0x00123456;
  mov.b32 %r11, 0x00000100;
  mov.b32 %r12, 1;
  mad24.lo.u32 %r1, %r10, %r11, %r12;  st.global.u32 [%rd1], %r1;
  mov.b32 %r13, 0x00800000;
  mov.b32 %r14, 0;
  mad24.hi.u32 %r1, %r13, %r13, %r14;  st.global.u32 [%rd1+4], %r1;
  mov.b32 %r15, -3;
  mad24.lo.s32 %r1, %r15, %r11, %r12;  st.global.u32 [%rd1+8], %r1;
)", {}, 3);
  EXPECT_EQ(out[0], 0x12345601u);
  EXPECT_EQ(out[1], 0x40000000u);  // 2^46 >> 16
  EXPECT_EQ(out[2], static_cast<uint32_t>(-3 * 256 + 1));
}

// szext: sign- or zero-extends the low N bits of a, N = b clamped to 32
// (.clamp) or b mod 32 (.wrap); bmsk: width b from bit a, likewise.
TEST_F(PtxSemantics, ExtendsAndMasks) {
  auto out = run(R"(
  mov.b32 %r10, 0x80;
  mov.b32 %r11, 0x1ff;
  szext.wrap.s32 %r1, %r10, 8;    st.global.u32 [%rd1], %r1;
  szext.clamp.u32 %r1, %r11, 8;   st.global.u32 [%rd1+4], %r1;
  szext.clamp.s32 %r1, %r10, 40;  st.global.u32 [%rd1+8], %r1;
  szext.wrap.u32 %r1, %r11, 40;   st.global.u32 [%rd1+12], %r1;
  bmsk.clamp.b32 %r1, 4, 8;       st.global.u32 [%rd1+16], %r1;
  bmsk.wrap.b32 %r1, 4, 40;       st.global.u32 [%rd1+20], %r1;
  bmsk.clamp.b32 %r1, 28, 8;      st.global.u32 [%rd1+24], %r1;
)", {}, 7);
  const std::vector<uint32_t> expected = {0xffffff80u, 0xffu, 0x80u, 0xffu, 0xff0u, 0xff0u, 0xf0000000u};
  EXPECT_EQ(out, expected);
}

// tanh.approx.f32: within the ISA's bound (maximum relative error 2^-10.987).
TEST_F(PtxSemantics, HyperbolicTangent) {
  auto out = run(R"(
  ld.global.f32 %f1, [%rd2];
  tanh.approx.f32 %f2, %f1;  st.global.f32 [%rd1], %f2;
  neg.f32 %f3, %f1;
  tanh.approx.f32 %f2, %f3;  st.global.f32 [%rd1+4], %f2;
  mov.f32 %f4, 0f41200000;
  tanh.approx.f32 %f2, %f4;  st.global.f32 [%rd1+8], %f2;
)", {f2u(0.5f)}, 3);
  const float bound = std::ldexp(1.0f, -10) * 0.51f;  // 2^-10.987 < 0.51 * 2^-10
  EXPECT_NEAR(std::bit_cast<float>(out[0]), std::tanh(0.5f), std::tanh(0.5f) * bound);
  EXPECT_EQ(std::bit_cast<float>(out[1]), -std::bit_cast<float>(out[0]));
  EXPECT_NEAR(std::bit_cast<float>(out[2]), 1.0f, bound);
}

// ldu: a load of memory the kernel does not write, the same value as ld's.
TEST_F(PtxSemantics, UniformLoad) {
  auto out = run(R"(
  ldu.global.u32 %r1, [%rd2];    st.global.u32 [%rd1], %r1;
  ldu.global.v2.u32 {%r2, %r3}, [%rd2+8];  st.global.v2.u32 [%rd1+8], {%r2, %r3};
)", {7, 0, 8, 9}, 4);
  EXPECT_EQ(out, (std::vector<uint32_t>{7, 0, 8, 9}));
}

// %r6 = this thread's fragment of the 8 x 8 matrix of b16 whose element
// (row, column) is 8 row + column, in the layout of ldmatrix and mma: thread
// t holds row t / 4, columns 2(t % 4) and 2(t % 4) + 1.
const std::string kMatrixFragment = R"(
  shr.u32 %r2, %r0, 2;
  and.b32 %r3, %r0, 3;
  shl.b32 %r3, %r3, 1;
  mad.lo.u32 %r4, %r2, 8, %r3;
  add.u32 %r5, %r4, 1;
  shl.b32 %r5, %r5, 16;
  or.b32 %r6, %r4, %r5;
)";

// stmatrix stores the warp's fragments as ldmatrix would have loaded them:
// thread t holds row t / 4, columns 2(t % 4) and +1 of each matrix (of its
// transpose with .trans), and thread 8j + r names row r of matrix j. Here
// element (row, column) of matrix j is 64j + 8 row + column.
TEST_F(PtxSemantics, StmatrixStoresTheFragmentsRowsAndTheirTranspose) {
  const std::string prelude = ".shared .align 16 .b8 sm[768];\n";
  auto out = run(kMatrixFragment + R"(
  add.u32 %r7, %r6, 0x00400040;
  mov.u32 %r8, sm;
  shl.b32 %r9, %r0, 4;
  add.u32 %r10, %r8, %r9;
  stmatrix.sync.aligned.m8n8.x2.shared.b16 [%r10], {%r6, %r7};
  and.b32 %r11, %r0, 7;
  shl.b32 %r11, %r11, 4;
  add.u32 %r12, %r8, %r11;
  add.u32 %r12, %r12, 256;
  stmatrix.sync.aligned.m8n8.x1.trans.shared.b16 [%r12], {%r6};
  bar.sync 0;
  shl.b32 %r13, %r0, 3;
  add.u32 %r14, %r8, %r13;
  ld.shared.v2.u32 {%r15, %r16}, [%r14];
  cvt.u64.u32 %rd5, %r13;
  add.s64 %rd6, %rd1, %rd5;
  st.global.v2.u32 [%rd6], {%r15, %r16};
  ld.shared.v2.u32 {%r15, %r16}, [%r14+256];
  st.global.v2.u32 [%rd6+256], {%r15, %r16};
)", {}, 128, 32, prelude);
  auto at = [&](size_t base, int row, int col) {
    const uint32_t word = out[base / 4 + (row * 8 + col) / 2];
    return (col % 2 == 0) ? (word & 0xffff) : (word >> 16);
  };
  for (int j = 0; j < 2; ++j) {
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 8; ++c) EXPECT_EQ(at(128 * j, r, c), 64u * j + 8 * r + c) << j << " " << r << " " << c;
    }
  }
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 8; ++c) EXPECT_EQ(at(256, r, c), 8u * c + r) << "transposed " << r << " " << c;
  }
}

// movmatrix: the warp's fragment of the transpose, in the same layout.
TEST_F(PtxSemantics, MovmatrixTransposesTheWarpsMatrix) {
  auto out = run(kMatrixFragment + R"(
  movmatrix.sync.aligned.m8n8.trans.b16 %r7, %r6;
  shl.b32 %r8, %r0, 2;
  cvt.u64.u32 %rd5, %r8;
  add.s64 %rd6, %rd1, %rd5;
  st.global.u32 [%rd6], %r7;
)", {}, 32, 32);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    const uint32_t g = lane / 4, c = 2 * (lane % 4);
    EXPECT_EQ(out[lane], (8 * c + g) | ((8 * (c + 1) + g) << 16)) << lane;
  }
}

// testp: each property of f32 and f64 values of every class. The ISA counts
// both zeros as normal numbers.
TEST_F(PtxSemantics, TestpClassifiesAsTheIsaSays) {
  // Per input: bits 0-5 = finite, infinite, number, notanumber, normal, subnormal.
  const std::string body = R"(
  shl.b32 %r5, %r0, 2;
  cvt.u64.u32 %rd5, %r5;
  add.s64 %rd6, %rd2, %rd5;
  add.s64 %rd7, %rd1, %rd5;
  ld.global.f32 %f1, [%rd6];
  cvt.f64.f32 %fd1, %f1;
  setp.eq.u32 %p9, %r0, 7;
  @%p9 mov.b64 %fd1, 0x0000000000000001;
  mov.u32 %r1, 0;
  testp.finite.f32 %p1, %f1;  selp.u32 %r2, 1, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.finite.f64 %p1, %fd1;  selp.u32 %r2, 256, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.infinite.f32 %p1, %f1;  selp.u32 %r2, 2, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.infinite.f64 %p1, %fd1;  selp.u32 %r2, 512, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.number.f32 %p1, %f1;  selp.u32 %r2, 4, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.number.f64 %p1, %fd1;  selp.u32 %r2, 1024, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.notanumber.f32 %p1, %f1;  selp.u32 %r2, 8, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.notanumber.f64 %p1, %fd1;  selp.u32 %r2, 2048, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.normal.f32 %p1, %f1;  selp.u32 %r2, 16, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.normal.f64 %p1, %fd1;  selp.u32 %r2, 4096, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.subnormal.f32 %p1, %f1;  selp.u32 %r2, 32, 0, %p1;  or.b32 %r1, %r1, %r2;
  testp.subnormal.f64 %p1, %fd1;  selp.u32 %r2, 8192, 0, %p1;  or.b32 %r1, %r1, %r2;
  st.global.u32 [%rd7], %r1;
)";
  // 0x00000001 is a subnormal f32, and its f64 a normal number.
  const std::vector<uint32_t> in = {f2u(1.5f), f2u(0.0f), f2u(-0.0f), 0x00000001u,
                                    f2u(std::numeric_limits<float>::infinity()),
                                    f2u(-std::numeric_limits<float>::infinity()),
                                    f2u(std::numeric_limits<float>::quiet_NaN()),
                                    f2u(1.0f)};  // lane 7: its f64 is the smallest subnormal
  auto out = run(body, in, 8, 8);
  const uint32_t normal = 0b010101, subnormal = 0b100101, infinite = 0b000110, nan = 0b001000;
  const std::vector<uint32_t> expected = {normal | normal << 8,       normal | normal << 8,
                                          normal | normal << 8,       subnormal | normal << 8,
                                          infinite | infinite << 8,   infinite | infinite << 8,
                                          nan | nan << 8,             normal | subnormal << 8};
  EXPECT_EQ(out, expected);
}

// 128-bit loads and stores need 128-bit registers, which the interpreter
// does not have: they fault naming the form rather than move half the bytes;
// the module loads, and a thread that skips them is unaffected.
TEST_F(PtxSemantics, Accesses128BitsWideFaultWhenExecuted) {
  for (const char* access : {"ld.global.b128 %q1, [%rd2];", "ldu.global.b128 %q1, [%rd2];",
                             "st.global.b128 [%rd1], %q1;"}) {
    const std::string body = std::string(".reg .b128 %q<2>;\n  setp.eq.u32 %p1, %r0, 1;\n  @%p1 ") + access;
    ASSERT_THAT(module_.load(kernel(body)), IsOk()) << access;
    uint32_t* in = module_.memory().alloc<uint32_t>(8);
    uint32_t* out = module_.memory().alloc<uint32_t>(8);
    EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)), IsOk()) << access;  // thread 0 skips it
    EXPECT_THAT(module_.launch("k", {1}, {2}, Params().add(out).add(in)),
                StatusIs(Code::kFailedPrecondition, HasSubstr("b128"))) << access;
  }
}

// elect.sync: every thread of the mask learns the leader, the lowest lane of
// the mask; only the leader's predicate is true.
TEST_F(PtxSemantics, ElectsTheLowestLaneOfTheMask) {
  auto out = run(R"(
  shl.b32 %r5, %r0, 3;
  cvt.u64.u32 %rd5, %r5;
  add.s64 %rd6, %rd1, %rd5;
  elect.sync %r1|%p1, 0xffffffff;
  selp.u32 %r2, 1, 0, %p1;
  st.global.v2.u32 [%rd6], {%r1, %r2};
  and.b32 %r6, %r0, 1;
  setp.eq.u32 %p2, %r6, 1;
  mov.u32 %r3, 99;
  mov.u32 %r4, 99;
  @%p2 elect.sync %r3|%p3, 0xaaaaaaaa;
  @%p2 selp.u32 %r4, 1, 0, %p3;
  st.global.v2.u32 [%rd6+256], {%r3, %r4};
)", {}, 128, 32);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(out[2 * lane], 0u) << lane;
    EXPECT_EQ(out[2 * lane + 1], lane == 0 ? 1u : 0u) << lane;
    const bool odd = lane % 2 == 1;
    EXPECT_EQ(out[64 + 2 * lane], odd ? 1u : 99u) << lane;
    EXPECT_EQ(out[64 + 2 * lane + 1], odd ? (lane == 1 ? 1u : 0u) : 99u) << lane;
  }
}

// Cache and profiling hints and a breakpoint with no debugger change nothing
// a kernel computes: what it stores around them is what it would without.
TEST_F(PtxSemantics, HintsAndBreakpointsChangeNothing) {
  auto out = run(R"(
  .reg .b64 %pol;
  ld.global.u32 %r1, [%rd2];
  applypriority.global.L2::evict_normal [%rd2], 128;
  createpolicy.fractional.L2::evict_last.b64 %pol, 1.0;
  ld.global.L2::cache_hint.u32 %r2, [%rd2+4], %pol;
  pmevent 1;
  brkpt;
  discard.global.L2 [%rd1+128], 128;
  st.global.v2.u32 [%rd1], {%r1, %r2};
)", {11, 12}, 2);
  EXPECT_THAT(last_, IsOk());
  EXPECT_EQ(out, (std::vector<uint32_t>{11, 12}));
}

}  // namespace
// --- textures and surfaces ---------------------------------------------------------
// Texture objects are TextureViews over test memory; each kernel loads the
// object's handle from its input (word pair 0) and its coordinates after it.

class TexturesTest : public PtxSemantics {
 protected:
  void SetUp() override { module_.setTextures(&objects_); }
  // A view of `texels` (copied to test memory) of the given shape and format.
  template <typename T>
  TextureView view(const std::vector<T>& texels, std::uint64_t width, std::uint64_t height,
                   unsigned channels, TextureView::Channel channel) {
    T* p = module_.memory().alloc(texels);
    TextureView v;
    v.address = reinterpret_cast<std::uint64_t>(p);
    v.dimensions = height > 1 ? 2 : 1;
    v.width = width;
    v.height = height;
    v.channel = channel;
    v.channelBytes = sizeof(T);
    v.channels = channels;
    v.pitch = width * sizeof(T) * channels;
    v.slicePitch = v.pitch * height;
    return v;
  }
  // Input words: the handle, then `rest`.
  static std::vector<uint32_t> with(std::uint64_t handle, std::vector<uint32_t> rest) {
    std::vector<uint32_t> in{static_cast<uint32_t>(handle), static_cast<uint32_t>(handle >> 32)};
    in.insert(in.end(), rest.begin(), rest.end());
    return in;
  }
  TestTextures objects_;
};

// tex.2d at (x, y) from words 2 and 3; the four results stored.
const char* kTex2d = R"(
  ld.global.u64 %rd3, [%rd2];
  ld.global.f32 %f1, [%rd2+8];
  ld.global.f32 %f2, [%rd2+12];
  tex.2d.v4.f32.f32 {%f3, %f4, %f5, %f6}, [%rd3, {%f1, %f2}];
  st.global.v4.f32 [%rd1], {%f3, %f4, %f5, %f6};)";

TEST_F(TexturesTest, PointAndLinearFilteringIn2D) {
  std::vector<float> texels{0, 1, 2, 3, 4, 5, 6, 7};  // 4 x 2
  TextureView point = view(texels, 4, 2, 1, TextureView::Channel::kFloat);
  point.addressMode = {TextureView::Address::kClamp, TextureView::Address::kClamp,
                       TextureView::Address::kClamp};
  TextureView linear = point;
  linear.linearFilter = true;
  objects_.textures[0x100] = point;
  objects_.textures[0x101] = linear;
  // A missing channel reads 0, a missing alpha 1.
  auto r = run(kTex2d, with(0x100, {f2u(1.5f), f2u(1.5f)}), 4);
  EXPECT_EQ(r, (std::vector<uint32_t>{f2u(5), 0, 0, f2u(1)}));
  // Between texel centres: the average; x = 0.8 weighs texel 1 by 0.3, as
  // 77/256 (weights have 8 fractional bits).
  EXPECT_EQ(run(kTex2d, with(0x101, {f2u(1.0f), f2u(0.5f)}), 1)[0], f2u(0.5f));
  EXPECT_EQ(run(kTex2d, with(0x101, {f2u(1.25f), f2u(1.0f)}), 1)[0], f2u(2.75f));
  EXPECT_EQ(run(kTex2d, with(0x101, {f2u(0.8f), f2u(0.5f)}), 1)[0], f2u(77.0f / 256.0f));
  // Clamped at the edge: beyond the last centre only the last texel counts.
  EXPECT_EQ(run(kTex2d, with(0x101, {f2u(9.0f), f2u(5.0f)}), 1)[0], f2u(7.0f));
}

TEST_F(TexturesTest, AddressModesWithNormalizedCoordinates) {
  using A = TextureView::Address;
  TextureView v = view(std::vector<float>{10, 20, 30, 40}, 4, 1, 1, TextureView::Channel::kFloat);
  v.normalizedCoordinates = true;
  v.borderColor = {7, 0, 0, 0};
  const char* tex1d = R"(
  ld.global.u64 %rd3, [%rd2];
  ld.global.f32 %f1, [%rd2+8];
  tex.1d.v4.f32.f32 {%f3, %f4, %f5, %f6}, [%rd3, {%f1}];
  st.global.f32 [%rd1], %f3;)";
  const std::pair<A, std::pair<float, float>> cases[] = {
      {A::kWrap, {1.25f, 20}},   {A::kWrap, {-0.25f, 40}}, {A::kMirror, {1.25f, 30}},
      {A::kMirror, {-0.1f, 10}}, {A::kClamp, {-0.5f, 10}}, {A::kClamp, {3.0f, 40}},
      {A::kBorder, {1.1f, 7}},   {A::kBorder, {0.6f, 30}}};
  for (const auto& [mode, c] : cases) {
    v.addressMode[0] = mode;
    objects_.textures[0x200] = v;
    EXPECT_EQ(run(tex1d, with(0x200, {f2u(c.first)}), 1)[0], f2u(c.second))
        << "mode " << static_cast<int>(mode) << " at " << c.first;
  }
  // Without normalized coordinates wrap clamps.
  v.normalizedCoordinates = false;
  v.addressMode[0] = A::kWrap;
  objects_.textures[0x200] = v;
  EXPECT_EQ(run(tex1d, with(0x200, {f2u(9.0f)}), 1)[0], f2u(40));
}

TEST_F(TexturesTest, IntegerTexelsReadAsNormalizedFloatsOrIntegers) {
  // Two channels of u8: (255, 128), and of s8: (-128, 64).
  TextureView u8 = view(std::vector<uint8_t>{255, 128}, 1, 1, 2, TextureView::Channel::kUnsigned);
  TextureView s8 = view(std::vector<uint8_t>{0x80, 64}, 1, 1, 2, TextureView::Channel::kSigned);
  TextureView half =
      view(std::vector<uint16_t>{0x3E00}, 1, 1, 1, TextureView::Channel::kHalf);  // 1.5
  objects_.textures[1] = u8;
  objects_.textures[2] = s8;
  objects_.textures[3] = half;
  u8.readAsInteger = true;
  objects_.textures[4] = u8;
  EXPECT_EQ(run(kTex2d, with(1, {f2u(0.5f), f2u(0.5f)}), 2),
            (std::vector<uint32_t>{f2u(1.0f), f2u(static_cast<float>(128 / 255.0))}));
  EXPECT_EQ(run(kTex2d, with(2, {f2u(0.5f), f2u(0.5f)}), 2),
            (std::vector<uint32_t>{f2u(-1.0f), f2u(static_cast<float>(64 / 127.0))}));
  EXPECT_EQ(run(kTex2d, with(3, {f2u(0.5f), f2u(0.5f)}), 1)[0], f2u(1.5f));
  EXPECT_EQ(run(kTex2d, with(4, {f2u(0.5f), f2u(0.5f)}), 4),
            (std::vector<uint32_t>{255, 128, 0, 1}));
}

TEST_F(TexturesTest, IntegerCoordinatesGatherAndQueries) {
  TextureView v =
      view(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, 3, 2, 1, TextureView::Channel::kSigned);
  v.addressMode = {TextureView::Address::kClamp, TextureView::Address::kClamp,
                   TextureView::Address::kClamp};
  objects_.textures[9] = v;
  // Integer coordinates index texels; out of range they clamp.
  const char* fetch = R"(
  ld.global.u64 %rd3, [%rd2];
  ld.global.u32 %r1, [%rd2+8];
  ld.global.u32 %r2, [%rd2+12];
  tex.2d.v4.s32.s32 {%r3, %r4, %r5, %r6}, [%rd3, {%r1, %r2}];
  st.global.u32 [%rd1], %r3;)";
  EXPECT_EQ(run(fetch, with(9, {2, 1}), 1)[0], 6u);
  EXPECT_EQ(run(fetch, with(9, {static_cast<uint32_t>(-3), 7}), 1)[0], 4u);
  // tld4 at the centre of the four texels (1,0), (2,0), (1,1), (2,1):
  // (i, j+1), (i+1, j+1), (i+1, j), (i, j).
  const char* gather = R"(
  ld.global.u64 %rd3, [%rd2];
  ld.global.f32 %f1, [%rd2+8];
  ld.global.f32 %f2, [%rd2+12];
  tld4.r.2d.v4.s32.f32 {%r3, %r4, %r5, %r6}, [%rd3, {%f1, %f2}];
  st.global.v4.u32 [%rd1], {%r3, %r4, %r5, %r6};)";
  EXPECT_EQ(run(gather, with(9, {f2u(2.0f), f2u(1.0f)}), 4), (std::vector<uint32_t>{5, 6, 3, 2}));
  const char* query = R"(
  ld.global.u64 %rd3, [%rd2];
  txq.width.b32 %r1, [%rd3];
  txq.height.b32 %r2, [%rd3];
  txq.depth.b32 %r3, [%rd3];
  txq.addr_mode_0.b32 %r4, [%rd3];
  txq.filter_mode.b32 %r5, [%rd3];
  txq.normalized_coords.b32 %r6, [%rd3];
  st.global.v4.u32 [%rd1], {%r1, %r2, %r3, %r4};
  st.global.v2.u32 [%rd1+16], {%r5, %r6};)";
  EXPECT_EQ(run(query, with(9, {}), 6), (std::vector<uint32_t>{3, 2, 1, 3, 0, 0}));
}

TEST_F(TexturesTest, SurfaceStoresLoadsAndBoundaryModes) {
  TextureView s = view(std::vector<uint32_t>(8, 0), 4, 2, 1, TextureView::Channel::kUnsigned);
  objects_.surfaces[0x300] = s;
  auto* texels = reinterpret_cast<uint32_t*>(s.address);
  // x in bytes, y in rows: (8, 1) is texel 6.
  const char* storeLoad = R"(
  ld.global.u64 %rd3, [%rd2];
  ld.global.u32 %r1, [%rd2+8];
  ld.global.u32 %r2, [%rd2+12];
  sust.b.2d.b32.trap [%rd3, {%r1, %r2}], {%r0};
  add.u32 %r5, %r0, 41;
  sust.b.2d.b32.trap [%rd3, {%r1, %r2}], {%r5};
  suld.b.2d.b32.trap {%r3}, [%rd3, {%r1, %r2}];
  add.u32 %r1, %r1, 400;
  suld.b.2d.b32.zero {%r4}, [%rd3, {%r1, %r2}];
  suld.b.2d.b32.clamp {%r6}, [%rd3, {%r1, %r2}];
  suq.width.b32 %r7, [%rd3];
  st.global.v4.u32 [%rd1], {%r3, %r4, %r6, %r7};)";
  EXPECT_EQ(run(storeLoad, with(0x300, {8, 1}), 4), (std::vector<uint32_t>{41, 0, 0, 4}));
  EXPECT_EQ(texels[6], 41u);
  // Out of the surface with .trap, or misaligned: the launch faults.
  const char* trap = R"(
  ld.global.u64 %rd3, [%rd2];
  ld.global.u32 %r1, [%rd2+8];
  sust.b.1d.b32.trap [%rd3, {%r1}], {%r0};)";
  ASSERT_THAT(module_.load(kernel(trap)), IsOk());
  uint32_t* in = module_.memory().alloc(with(0x300, {16}));
  uint32_t* out = module_.memory().alloc<uint32_t>(1);
  EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
              StatusIs(Code::kFailedPrecondition,
                       HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS: surface access at (16, 0, 0)")));
  in[2] = 2;
  EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("CUDA_ERROR_MISALIGNED_ADDRESS")));
}

TEST_F(TexturesTest, UnknownObjectsAndUnrunFormsFaultMalformedOnesAreRefused) {
  ASSERT_THAT(module_.load(kernel(kTex2d)), IsOk());
  uint32_t* in = module_.memory().alloc(with(0x7777, {0, 0}));
  uint32_t* out = module_.memory().alloc<uint32_t>(4);
  EXPECT_THAT(
      module_.launch("k", {1}, {1}, Params().add(out).add(in)),
      StatusIs(Code::kFailedPrecondition, HasSubstr("texture object 0x7777 does not exist")));
  // An array geometry loads and faults when it runs, naming the form.
  ASSERT_THAT(module_.load(kernel(R"(
  ld.global.u64 %rd3, [%rd2];
  tex.a2d.v4.f32.f32 {%f3, %f4, %f5, %f6}, [%rd3, {%r1, %f1, %f2, %f2}];)")),
              IsOk());
  EXPECT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)),
              StatusIs(Code::kFailedPrecondition,
                       HasSubstr("tex.a2d.v4.f32.f32 is not supported by vgpu")));
  // No coordinates, or a scalar destination: refused at load.
  EXPECT_FALSE(module_.load(kernel("tex.2d.v4.f32.f32 {%f3, %f4, %f5, %f6}, [%rd3];")).isOk());
  EXPECT_FALSE(module_.load(kernel("tex.2d.v4.f32.f32 %f3, [%rd3, {%f1, %f2}];")).isOk());
}

// What a launch reads through a texture and writes through a surface is in
// its access record, as its loads and stores are (speculation is checked
// against it).
TEST_F(TexturesTest, TexelReadsAndSurfaceStoresAreRecorded) {
  TextureView t = view(std::vector<float>{1, 2, 3, 4}, 4, 1, 1, TextureView::Channel::kFloat);
  t.addressMode[0] = TextureView::Address::kClamp;
  objects_.textures[5] = t;
  TextureView surface = view(std::vector<uint32_t>(4, 0), 4, 1, 1, TextureView::Channel::kUnsigned);
  objects_.surfaces[6] = surface;
  const char* body = R"(
  ld.global.u64 %rd3, [%rd2];
  ld.global.u64 %rd4, [%rd2+8];
  mov.f32 %f1, 0f40100000;
  tex.1d.v4.f32.f32 {%f3, %f4, %f5, %f6}, [%rd3, {%f1}];
  mov.u32 %r1, 12;
  sust.b.1d.b32.trap [%rd4, {%r1}], {%r0};)";
  ASSERT_THAT(module_.load(kernel(body)), IsOk());
  setRecordAccesses(module_.program(), true);
  std::vector<uint32_t> words{5, 0, 6, 0};
  uint32_t* in = module_.memory().alloc(words);
  uint32_t* out = module_.memory().alloc<uint32_t>(4);
  ASSERT_THAT(module_.launch("k", {1}, {1}, Params().add(out).add(in)), IsOk());
  AccessRecord r = lastLaunchAccesses(module_.program());
  ASSERT_TRUE(r.recorded);
  // x = 2.25: texel 2 (bytes 8..12 of the texture).
  const ByteRange texel{t.address + 8, t.address + 12};
  EXPECT_TRUE(std::find(r.reads.begin(), r.reads.end(), texel) != r.reads.end());
  EXPECT_EQ(r.writes, (std::vector<ByteRange>{{surface.address + 12, surface.address + 16}}));
}

// istypep: whether a handle names a texture object (also its own sampler in
// unified mode) or a surface object.
TEST_F(TexturesTest, IstypepTellsTexturesFromSurfaces) {
  objects_.textures[7] = view(std::vector<float>{1}, 1, 1, 1, TextureView::Channel::kFloat);
  objects_.surfaces[8] = view(std::vector<float>{1}, 1, 1, 1, TextureView::Channel::kFloat);
  const char* body = R"(
  ld.global.u64 %rd3, [%rd2];
  istypep.texref %p1, %rd3;
  istypep.samplerref %p2, %rd3;
  istypep.surfref %p3, %rd3;
  selp.u32 %r1, 1, 0, %p1;
  selp.u32 %r2, 1, 0, %p2;
  selp.u32 %r3, 1, 0, %p3;
  st.global.v4.u32 [%rd1], {%r1, %r2, %r3, %r3};)";
  EXPECT_EQ(run(body, with(7, {}), 3), (std::vector<uint32_t>{1, 1, 0}));
  EXPECT_EQ(run(body, with(8, {}), 3), (std::vector<uint32_t>{0, 0, 1}));
  EXPECT_EQ(run(body, with(9, {}), 3), (std::vector<uint32_t>{0, 0, 0}));
}

}  // namespace phos::vgpu::engine::testing
