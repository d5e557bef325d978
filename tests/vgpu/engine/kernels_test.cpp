// SPDX-License-Identifier: Apache-2.0
// Real CUDA kernels (compiled by nvcc at build time) run through the engine and
// compared bit-exactly with C++ references.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <cuda_fp8.h>

#include "engine_harness.h"
#include "status_matchers.h"

namespace phos::vgpu::engine::testing {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

uint32_t f2u(float f) { return std::bit_cast<uint32_t>(f); }
uint64_t d2u(double d) { return std::bit_cast<uint64_t>(d); }

// Each test runs with one worker and with two, so both the sequential and the
// parallel CTA paths are exercised.
class Kernels : public ::testing::TestWithParam<uint32_t> {
 protected:
  void load(const std::string& name) {
    ASSERT_THAT(module_.loadFile(ptxPath(name)), IsOk());
    setWorkerThreads(module_.program(), GetParam());
  }
  Module module_;
};

INSTANTIATE_TEST_SUITE_P(Workers, Kernels, ::testing::Values(1u, 2u),
                         [](const auto& p) { return "workers" + std::to_string(p.param); });

std::vector<float> randomFloats(size_t n, uint32_t seed, float lo = -100, float hi = 100) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---------------------------------------------------------------- basic

TEST_P(Kernels, Saxpy) {
  load("basic");
  const int n = 1000;
  auto x = randomFloats(n, 1), y = randomFloats(n, 2);
  float* dx = module_.memory().alloc(x);
  float* dy = module_.memory().alloc(y);
  float a = 1.75f;
  ASSERT_THAT(module_.launch("saxpy", {4}, {256}, Params().add(n).add(a).add(dx).add(dy)), IsOk());
  for (int i = 0; i < n; ++i) ASSERT_EQ(f2u(dy[i]), f2u(std::fma(a, x[i], y[i]))) << i;
  LaunchStats stats = lastLaunchStats(module_.program());
  EXPECT_GT(stats.warpInstructions, 0u);
  EXPECT_GE(stats.laneInstructions, stats.warpInstructions);
}

TEST_P(Kernels, Daxpy2d) {
  load("basic");
  const int w = 37, h = 19;
  std::vector<double> x(w * h), y(w * h);
  for (int i = 0; i < w * h; ++i) {
    x[i] = std::sin(i) * 1e3;
    y[i] = std::cos(i) / 7;
  }
  double* dx = module_.memory().alloc(x);
  double* dy = module_.memory().alloc(y);
  double a = -0.3;
  ASSERT_THAT(module_.launch("daxpy2d", {3, 3}, {16, 8}, Params().add(w).add(h).add(a).add(dx).add(dy)),
              IsOk());
  for (int i = 0; i < w * h; ++i) ASSERT_EQ(d2u(dy[i]), d2u(std::fma(a, x[i], y[i]))) << i;
}

TEST_P(Kernels, SharedMemoryTreeReduction) {
  load("basic");
  const int n = 1000;
  std::vector<int> in(n);
  for (int i = 0; i < n; ++i) in[i] = (i * 7919) % 1000 - 500;
  int* din = module_.memory().alloc(in);
  int* dout = module_.memory().alloc<int>(4);
  ASSERT_THAT(module_.launch("blockSum", {4}, {256}, Params().add(din).add(dout).add(n)), IsOk());
  for (int b = 0; b < 4; ++b) {
    int s = 0;
    for (int i = b * 256; i < std::min(n, (b + 1) * 256); ++i) s += in[i];
    EXPECT_EQ(dout[b], s) << b;
  }
}

TEST_P(Kernels, WarpShuffleReductionMatchesTreeOrder) {
  load("basic");
  const int blocks = 3, threads = 128;
  auto in = randomFloats(blocks * threads, 3);
  float* din = module_.memory().alloc(in);
  float* dout = module_.memory().alloc<float>(blocks);
  ASSERT_THAT(module_.launch("warpSumF", {blocks}, {threads}, Params().add(din).add(dout)), IsOk());
  for (int b = 0; b < blocks; ++b) {
    std::vector<float> partial(32, 0.0f);
    for (int w = 0; w < threads / 32; ++w) {
      float v[32];
      for (int l = 0; l < 32; ++l) v[l] = in[b * threads + w * 32 + l];
      for (int off = 16; off > 0; off >>= 1) {
        float nv[32];
        for (int l = 0; l < 32; ++l) nv[l] = v[l] + (l + off < 32 ? v[l + off] : v[l]);
        std::memcpy(v, nv, sizeof v);
      }
      partial[w] = v[0];
    }
    float v[32];
    for (int l = 0; l < 32; ++l) v[l] = partial[l];
    for (int off = 16; off > 0; off >>= 1) {
      float nv[32];
      for (int l = 0; l < 32; ++l) nv[l] = v[l] + v[l ^ off];
      std::memcpy(v, nv, sizeof v);
    }
    EXPECT_EQ(f2u(dout[b]), f2u(v[0])) << b;
  }
}

TEST_P(Kernels, DynamicSharedMemory) {
  load("basic");
  std::vector<int> data(3 * 64);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int>(i * 3 + 1);
  int* d = module_.memory().alloc(data);
  ASSERT_THAT(module_.launch("reverseDyn", {3}, {64}, Params().add(d), 64 * sizeof(int)), IsOk());
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 64; ++t) EXPECT_EQ(d[b * 64 + t], data[b * 64 + 63 - t]);
  }
}

TEST_P(Kernels, DynamicSharedMemoryTooSmallFaults) {
  load("basic");
  int* d = module_.memory().alloc<int>(64);
  EXPECT_THAT(module_.launch("reverseDyn", {1}, {64}, Params().add(d), 16),
              StatusIs(Code::kFailedPrecondition, StartsWith("CUDA_ERROR_ILLEGAL_ADDRESS")));
}

TEST_P(Kernels, SpecialRegistersIn3d) {
  load("basic");
  Dim3 grid{2, 3, 2}, block{8, 4, 2};
  const unsigned nt = 64, nb = 12;
  unsigned* out = module_.memory().alloc<unsigned>(nt * nb * 2);
  ASSERT_THAT(module_.launch("indices", grid, block, Params().add(out)), IsOk());
  for (unsigned bz = 0; bz < 2; ++bz)
    for (unsigned by = 0; by < 3; ++by)
      for (unsigned bx = 0; bx < 2; ++bx)
        for (unsigned tz = 0; tz < 2; ++tz)
          for (unsigned ty = 0; ty < 4; ++ty)
            for (unsigned tx = 0; tx < 8; ++tx) {
              unsigned b = (bz * 3 + by) * 2 + bx;
              unsigned t = (tz * 4 + ty) * 8 + tx;
              ASSERT_EQ(out[(b * nt + t) * 2], tx | (ty << 8) | (tz << 16) | (bx << 24));
              ASSERT_EQ(out[(b * nt + t) * 2 + 1], (t % 32) | ((t / 32) << 8) | (by << 16) | (bz << 24));
            }
}

TEST_P(Kernels, TiledMatmul) {
  load("basic");
  const int n = 48;
  auto a = randomFloats(n * n, 4, -1, 1), b = randomFloats(n * n, 5, -1, 1);
  float* da = module_.memory().alloc(a);
  float* db = module_.memory().alloc(b);
  float* dc = module_.memory().alloc<float>(n * n);
  ASSERT_THAT(module_.launch("matmul", {n / 16, n / 16}, {16, 16}, Params().add(da).add(db).add(dc).add(n)),
              IsOk());
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < n; ++c) {
      float acc = 0.0f;
      for (int k = 0; k < n; ++k) acc = std::fma(a[r * n + k], b[k * n + c], acc);
      ASSERT_EQ(f2u(dc[r * n + c]), f2u(acc)) << r << "," << c;
    }
  }
}

// ---------------------------------------------------------------- control flow

TEST_P(Kernels, DivergentLoopsCollatz) {
  load("control");
  const int n = 512;
  std::vector<unsigned> in(n);
  std::mt19937 rng(7);
  for (auto& v : in) v = rng() % 100000 + 1;
  unsigned* din = module_.memory().alloc(in);
  unsigned* steps = module_.memory().alloc<unsigned>(n);
  unsigned* maxv = module_.memory().alloc<unsigned>(n);
  ASSERT_THAT(module_.launch("collatz", {4}, {128}, Params().add(din).add(steps).add(maxv)), IsOk());
  for (int i = 0; i < n; ++i) {
    unsigned x = in[i], c = 0, m = x;
    while (x != 1) {
      if (x & 1) {
        x = 3 * x + 1;
      } else {
        x >>= 1;
        if (c > 1000) break;
      }
      if (x > m) m = x;
      ++c;
    }
    ASSERT_EQ(steps[i], c) << i;
    ASSERT_EQ(maxv[i], m) << i;
  }
}

TEST_P(Kernels, ReconvergesAfterDivergence) {
  load("control");
  unsigned* inside = module_.memory().alloc<unsigned>(64);
  unsigned* after = module_.memory().alloc<unsigned>(64);
  ASSERT_THAT(module_.launch("reconverge", {1}, {64}, Params().add(inside).add(after)), IsOk());
  unsigned masks[3] = {0, 0, 0};
  for (unsigned l = 0; l < 32; ++l) masks[l % 3] |= 1u << l;
  for (unsigned t = 0; t < 64; ++t) {
    unsigned l = t % 32;
    unsigned expect = l % 3 == 0 ? masks[0] : l % 3 == 1 ? (masks[1] | 0x80000000u) : (masks[2] ^ 1u);
    EXPECT_EQ(inside[t], expect) << t;
    EXPECT_EQ(after[t], 0xffffffffu) << t;
  }
}

TEST_P(Kernels, EarlyReturnAndContinue) {
  load("control");
  const int n = 200;
  int* out = module_.memory().alloc(std::vector<int>(256, 12345));
  ASSERT_THAT(module_.launch("earlyExit", {1}, {256}, Params().add(out).add(n)), IsOk());
  for (int i = 0; i < 256; ++i) {
    int expect;
    if (i >= n) {
      expect = 12345;
    } else if (i % 5 == 0) {
      expect = -1;
    } else {
      expect = 0;
      for (int k = 0; k <= i % 7; ++k) {
        if (k == 3) continue;
        expect += k * i;
      }
    }
    EXPECT_EQ(out[i], expect) << i;
  }
}

int fibRef(int n) { return n < 2 ? n : fibRef(n - 1) + fibRef(n - 2); }
unsigned long long ackRef(unsigned depth, unsigned long long acc) {
  unsigned long long local[8];
  for (int k = 0; k < 8; ++k) local[k] = acc * (k + 1) + depth;
  if (depth == 0) return local[acc & 7];
  return local[depth & 7] ^ ackRef(depth - 1, acc + local[(acc + depth) & 7]);
}

TEST_P(Kernels, RecursionWithLocalFrames) {
  load("control");
  std::vector<int> n(64);
  for (int i = 0; i < 64; ++i) n[i] = i % 16;
  int* dn = module_.memory().alloc(n);
  int* fib = module_.memory().alloc<int>(64);
  auto* ack = module_.memory().alloc<unsigned long long>(64);
  ASSERT_THAT(module_.launch("recursion", {1}, {64}, Params().add(dn).add(fib).add(ack)), IsOk());
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(fib[t], fibRef(n[t])) << t;
    EXPECT_EQ(ack[t], ackRef(t % 6, t)) << t;
  }
}

TEST_P(Kernels, LocalArrayIndexedByData) {
  load("control");
  std::vector<int> idx(96);
  for (int i = 0; i < 96; ++i) idx[i] = (i * 37) ^ (i << 5);
  int* didx = module_.memory().alloc(idx);
  int* out = module_.memory().alloc<int>(96);
  ASSERT_THAT(module_.launch("localArray", {1}, {96}, Params().add(didx).add(out)), IsOk());
  for (int t = 0; t < 96; ++t) {
    int i0 = idx[t] & 31, i1 = (idx[t] >> 5) & 31;
    EXPECT_EQ(out[t], i0 * i0 + t + i1 * i1 + t) << t;
  }
}

TEST_P(Kernels, Printf) {
  load("control");
  ASSERT_THAT(module_.launch("hello", {1}, {32}, Params().add(10)), IsOk());
  EXPECT_EQ(module_.printed(),
            "thread 0: 10  0.00 ok A ff -1234567890123\n"
            "thread 1: 11  1.50 ok B 100 -1234567890123\n"
            "thread 2: 12  3.00 ok C 101 -1234567890123\n");
}

// ---------------------------------------------------------------- warp primitives

TEST_P(Kernels, Shuffles) {
  load("warp");
  std::vector<int> in(64);
  for (int i = 0; i < 64; ++i) in[i] = i * 11 + 3;
  int* din = module_.memory().alloc(in);
  int* up = module_.memory().alloc<int>(64);
  int* down = module_.memory().alloc<int>(64);
  int* xr = module_.memory().alloc<int>(64);
  int* idx = module_.memory().alloc<int>(64);
  int* seg = module_.memory().alloc<int>(64);
  ASSERT_THAT(module_.launch("shuffles", {1}, {64}, Params().add(din).add(up).add(down).add(xr).add(idx).add(seg)),
              IsOk());
  for (int t = 0; t < 64; ++t) {
    int base = t & ~31, l = t & 31;
    EXPECT_EQ(up[t], in[l >= 3 ? t - 3 : t]) << t;
    EXPECT_EQ(down[t], in[l + 5 < 32 ? t + 5 : t]) << t;
    EXPECT_EQ(xr[t], in[base + (l ^ 9)]) << t;
    EXPECT_EQ(idx[t], in[base + ((t * 7) & 31)]) << t;
    int segBase = t & ~7;
    int sIdx = in[segBase + 2];
    int sDown = in[(l % 8) + 3 < 8 ? t + 3 : t];
    EXPECT_EQ(seg[t], sIdx + sDown * 1000) << t;
  }
}

TEST_P(Kernels, VotesAndMatch) {
  load("warp");
  std::vector<int> in(64);
  for (int i = 0; i < 64; ++i) in[i] = (i * 13) % 50 + (i < 32 ? 1 : 0);
  int* din = module_.memory().alloc(in);
  unsigned* ballot = module_.memory().alloc<unsigned>(64);
  int* all = module_.memory().alloc<int>(64);
  int* any = module_.memory().alloc<int>(64);
  unsigned* match = module_.memory().alloc<unsigned>(64);
  unsigned* pballot = module_.memory().alloc<unsigned>(64);
  ASSERT_THAT(module_.launch("votes", {1}, {64}, Params().add(din).add(ballot).add(all).add(any).add(match).add(pballot)),
              IsOk());
  for (int w = 0; w < 2; ++w) {
    unsigned b = 0, pb = 0;
    bool allPos = true, anyBig = false;
    for (int l = 0; l < 32; ++l) {
      int v = in[w * 32 + l];
      if (v > 10) b |= 1u << l;
      if ((l & 1) && v > 5) pb |= 1u << l;
      allPos = allPos && v > 0;
      anyBig = anyBig || v > 40;
    }
    for (int l = 0; l < 32; ++l) {
      int t = w * 32 + l;
      EXPECT_EQ(ballot[t], b);
      EXPECT_EQ(all[t], allPos ? 1 : 0) << t;
      EXPECT_EQ(any[t], anyBig ? 1 : 0) << t;
      unsigned m = 0;
      for (int k = 0; k < 32; ++k) if ((in[w * 32 + k] & 3) == (in[t] & 3)) m |= 1u << k;
      EXPECT_EQ(match[t], m) << t;
      EXPECT_EQ(pballot[t], (l & 1) ? pb : 0u) << t;
    }
  }
}

TEST_P(Kernels, WarpReduxSync) {
  load("warp");
  std::vector<unsigned> in(32);
  for (unsigned i = 0; i < 32; ++i) in[i] = i * 0x01010101u + (i << 28);
  unsigned* din = module_.memory().alloc(in);
  unsigned* out = module_.memory().alloc<unsigned>(96);
  ASSERT_THAT(module_.launch("reduxOps", {1}, {32}, Params().add(din).add(out)), IsOk());
  unsigned sum = 0, mx = 0, orv = 0;
  for (unsigned v : in) {
    sum += v;
    mx = std::max(mx, v);
    orv |= v;
  }
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(out[t * 3], sum);
    EXPECT_EQ(out[t * 3 + 1], mx);
    EXPECT_EQ(out[t * 3 + 2], orv);
  }
}

// ---------------------------------------------------------------- memory

TEST_P(Kernels, AtomicsUnderContention) {
  load("memory");
  const int blocks = 8, threads = 256, n = blocks * threads;
  std::vector<unsigned> data(n);
  for (int i = 0; i < n; ++i) data[i] = static_cast<unsigned>(i * 2654435761u >> 7);
  auto& mem = module_.memory();
  int* counter = mem.alloc<int>(1);
  unsigned* maxv = mem.alloc<unsigned>(1);
  unsigned* inc = mem.alloc<unsigned>(1);
  float* fsum = mem.alloc<float>(1);
  double* dsum = mem.alloc<double>(1);
  auto* ull = mem.alloc<unsigned long long>(1);
  int* exch = mem.alloc(std::vector<int>{-1, -1});
  unsigned* hist = mem.alloc<unsigned>(16);
  unsigned* ddata = mem.alloc(data);
  ASSERT_THAT(module_.launch("atomics", {blocks}, {threads},
                             Params().add(counter).add(maxv).add(inc).add(fsum).add(dsum).add(ull).add(exch).add(hist).add(ddata)),
              IsOk());
  EXPECT_EQ(*counter, n);
  unsigned mx = 0;
  unsigned long long us = 0;
  unsigned h[16] = {};
  for (int t = 0; t < n; ++t) {
    mx = std::max(mx, static_cast<unsigned>(t * 2654435761u) >> 8);
    us += static_cast<unsigned long long>(t) << 20;
    h[data[t] & 15]++;
  }
  EXPECT_EQ(*maxv, mx);
  EXPECT_EQ(*inc, static_cast<unsigned>(n % 101));
  EXPECT_EQ(*fsum, static_cast<float>(n / 8 * 28));
  EXPECT_EQ(*dsum, n / 4 * 3.0);
  EXPECT_EQ(*ull, us);
  EXPECT_TRUE(exch[0] >= 0 && exch[0] < n && exch[0] % 2 == 0) << exch[0];
  EXPECT_TRUE(exch[1] >= 0 && exch[1] < n && exch[1] % 2 == 1) << exch[1];
  for (int k = 0; k < 16; ++k) EXPECT_EQ(hist[k], h[k]) << k;
}

TEST_P(Kernels, CasSpinLockAcrossBlocks) {
  load("memory");
  int* lock = module_.memory().alloc<int>(1);
  int* value = module_.memory().alloc<int>(1);
  ASSERT_THAT(module_.launch("casLock", {64}, {32}, Params().add(lock).add(value)), IsOk());
  EXPECT_EQ(*value, 64 * 63 / 2);
  EXPECT_EQ(*lock, 0);
}

TEST_P(Kernels, SyncthreadsCountAndOr) {
  load("memory");
  const int blocks = 3, threads = 128;
  std::vector<int> in(blocks * threads);
  for (int i = 0; i < blocks * threads; ++i) in[i] = (i % 9) - 2 + (i >= 256 ? 200 : 0);
  int* din = module_.memory().alloc(in);
  int* count = module_.memory().alloc<int>(blocks);
  int* all = module_.memory().alloc<int>(blocks);
  int* any = module_.memory().alloc<int>(blocks);
  ASSERT_THAT(module_.launch("syncCounts", {blocks}, {threads}, Params().add(din).add(count).add(all).add(any)),
              IsOk());
  for (int b = 0; b < blocks; ++b) {
    int c = 0;
    bool a = true, o = false;
    for (int t = 0; t < threads; ++t) {
      int v = in[b * threads + t];
      c += v > 0;
      a = a && v > 0;
      o = o || v > 100;
    }
    EXPECT_EQ(count[b], c) << b;
    EXPECT_EQ(all[b] != 0, a) << b;
    EXPECT_EQ(any[b] != 0, o) << b;
  }
}

TEST_P(Kernels, NamedBarrierProducerConsumer) {
  load("memory");
  int* out = module_.memory().alloc<int>(96);
  ASSERT_THAT(module_.launch("namedBarrier", {2}, {128}, Params().add(out)), IsOk());
  for (int t = 0; t < 96; ++t) EXPECT_EQ(out[t], (t % 32) * 10 + (t / 32 + 1)) << t;
}

TEST_P(Kernels, IllegalGlobalAddressFaults) {
  load("memory");
  int* p = module_.memory().alloc<int>(16);
  long long offset = 1 << 22;
  Status st = module_.launch("outOfBounds", {1}, {32}, Params().add(p).add(offset));
  EXPECT_THAT(st, StatusIs(Code::kFailedPrecondition, StartsWith("CUDA_ERROR_ILLEGAL_ADDRESS")));
  EXPECT_THAT(st.message(), HasSubstr("st.global.u32"));
  EXPECT_THAT(st.message(), HasSubstr(fmt::format("{:#x}", reinterpret_cast<uint64_t>(p + offset))));
  EXPECT_THAT(st.message(), HasSubstr("thread (7,0,0) of block (0,0,0)"));
}

TEST_P(Kernels, NullPointerFaults) {
  load("memory");
  int* out = module_.memory().alloc<int>(1);
  const int* null = nullptr;
  EXPECT_THAT(module_.launch("nullRead", {1}, {32}, Params().add(null).add(out)),
              StatusIs(Code::kFailedPrecondition, StartsWith("CUDA_ERROR_ILLEGAL_ADDRESS")));
}

TEST_P(Kernels, MisalignedAddressFaults) {
  load("memory");
  char* p = module_.memory().alloc<char>(64);
  EXPECT_THAT(module_.launch("misaligned", {1}, {32}, Params().add(p)),
              StatusIs(Code::kFailedPrecondition, StartsWith("CUDA_ERROR_MISALIGNED_ADDRESS")));
}

TEST_P(Kernels, AsyncCopyStagingThroughShared) {
  load("memory");
  const int n = 1000;  // not a multiple of the 128-float tile: the tail is zero-filled
  auto x = randomFloats(n, 17);
  float* in = module_.memory().alloc(x);
  float* out = module_.memory().alloc<float>(n);
  ASSERT_THAT(module_.launch("async_tiles", {3}, {128}, Params().add(in).add(out).add(n)), IsOk());
  for (int i = 0; i < n; ++i) {
    const int tile = i / 128 * 128, next = tile + (i + 1) % 128;
    const float neighbour = next < n ? x[next] : 0.0f;
    ASSERT_EQ(f2u(out[i]), f2u(x[i] + neighbour)) << i;
  }
}

TEST_P(Kernels, SharedOutOfRangeFaults) {
  load("memory");
  int* out = module_.memory().alloc<int>(64);
  EXPECT_THAT(module_.launch("sharedOutOfBounds", {1}, {64}, Params().add(out).add(1000)),
              StatusIs(Code::kFailedPrecondition, StartsWith("CUDA_ERROR_ILLEGAL_ADDRESS")));
  EXPECT_THAT(module_.launch("sharedOutOfBounds", {1}, {64}, Params().add(out).add(0)), IsOk());
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], t);
}

TEST_P(Kernels, TrapEndsTheLaunch) {
  load("memory");
  int* p = module_.memory().alloc<int>(32);
  Status st = module_.launch("trapKernel", {1}, {32}, Params().add(p));
  EXPECT_THAT(st, StatusIs(Code::kFailedPrecondition, StartsWith("CUDA_ERROR_LAUNCH_FAILED")));
  EXPECT_THAT(st.message(), HasSubstr("trap"));
}

TEST_P(Kernels, DeviceAssert) {
  load("memory");
  std::vector<int> v(32, 1);
  v[5] = 10;
  int* p = module_.memory().alloc(v);
  Status st = module_.launch("assertKernel", {1}, {32}, Params().add(p));
  EXPECT_THAT(st, StatusIs(Code::kFailedPrecondition, StartsWith("CUDA_ERROR_ASSERT")));
  EXPECT_THAT(st.message(), HasSubstr("p[threadIdx.x] < 10"));
  // To stderr, once per failing thread, as NVIDIA's driver prints it.
  const std::string errors = module_.printedErrors();
  EXPECT_THAT(
      errors,
      HasSubstr(": block: [0,0,0], thread: [5,0,0] Assertion `p[threadIdx.x] < 10` failed.\n"));
  EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 1);
  EXPECT_EQ(module_.printed(), "");
  v[5] = 1;
  int* ok = module_.memory().alloc(v);
  EXPECT_THAT(module_.launch("assertKernel", {1}, {32}, Params().add(ok)), IsOk());
}

// ---------------------------------------------------------------- arithmetic

unsigned bytePerm(unsigned x, unsigned y, unsigned s) {
  uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}

TEST_P(Kernels, IntegerOps) {
  load("math");
  const int n = 64;
  std::vector<unsigned> a(n), b(n);
  std::mt19937 rng(11);
  for (int i = 0; i < n; ++i) {
    a[i] = rng();
    b[i] = i % 8 == 0 ? 0 : i % 8 == 1 ? 0xffffffffu : rng() >> (i % 31);
  }
  a[5] = 0x80000000u;
  b[5] = 0xffffffffu;  // INT_MIN / -1
  a[6] = 0;
  unsigned* da = module_.memory().alloc(a);
  unsigned* db = module_.memory().alloc(b);
  unsigned* out = module_.memory().alloc<unsigned>(n * 16);
  ASSERT_THAT(module_.launch("intOps", {1}, {n}, Params().add(da).add(db).add(out)), IsOk());
  for (int t = 0; t < n; ++t) {
    unsigned x = a[t], y = b[t];
    int sx = static_cast<int>(x), sy = static_cast<int>(y);
    unsigned* o = out + t * 16;
    EXPECT_EQ(o[0], static_cast<unsigned>((static_cast<uint64_t>(x) * y) >> 32)) << t;
    EXPECT_EQ(o[1], static_cast<unsigned>((static_cast<int64_t>(sx) * sy) >> 32)) << t;
    unsigned rev = 0;
    for (int k = 0; k < 32; ++k) rev |= ((x >> k) & 1) << (31 - k);
    EXPECT_EQ(o[2], rev) << t;
    EXPECT_EQ(o[3], static_cast<unsigned>(std::countl_zero(x))) << t;
    EXPECT_EQ(o[4], static_cast<unsigned>(std::popcount(x))) << t;
    EXPECT_EQ(o[5], bytePerm(x, y, y & 0x7777)) << t;
    uint64_t hl = (static_cast<uint64_t>(y) << 32) | x;
    EXPECT_EQ(o[6], static_cast<unsigned>((hl << (y & 31)) >> 32)) << t;
    EXPECT_EQ(o[7], static_cast<unsigned>(hl >> std::min(y, 32u))) << t;
    EXPECT_EQ(o[8], y ? x / y : 0) << t;
    EXPECT_EQ(o[9], sy ? (sy == -1 ? 0u : static_cast<unsigned>(sx % sy)) : 0u) << t;
    EXPECT_EQ(o[10], x ? static_cast<unsigned>(std::countr_zero(x) + 1) : 0u) << t;
    EXPECT_EQ(o[11], static_cast<unsigned>(sx >> (y & 31))) << t;
    EXPECT_EQ(o[12], static_cast<unsigned>(std::abs(static_cast<int64_t>(sx) - sy)) + x) << t;
    EXPECT_EQ(o[13], static_cast<unsigned>(std::min(sx, sy)) ^ std::max(x, y)) << t;
    __extension__ typedef unsigned __int128 U128;
    uint64_t hi = static_cast<uint64_t>(
        (static_cast<U128>((static_cast<uint64_t>(x) << 32) | y) * 0x9e3779b97f4a7c15ull) >> 64);
    uint64_t w = static_cast<uint64_t>(x) * y + hi;
    EXPECT_EQ(o[14], static_cast<unsigned>(w)) << t;
    EXPECT_EQ(o[15], static_cast<unsigned>(w >> 32)) << t;
  }
}

// Float -> int as the GPU converts: saturating, NaN to 0.
template <typename I>
I satConvert(double v) {
  if (std::isnan(v)) return 0;
  if (v <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (v >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

// Evaluates f() under a host rounding mode. The result goes through a volatile so
// the compiler cannot evaluate it after the mode is restored.
template <typename F>
auto withRounding(int mode, F f) {
  std::fesetround(mode);
  volatile auto r = f();
  std::fesetround(FE_TONEAREST);
  return static_cast<decltype(f())>(r);
}

uint32_t canon(float f) { return std::isnan(f) ? 0x7fffffffu : f2u(f); }

TEST_P(Kernels, FloatRoundingModesAndConversions) {
  load("math");
  std::vector<float> a = randomFloats(64, 21, -1e4f, 1e4f), b = randomFloats(64, 22, -3, 3);
  a[0] = NAN; b[1] = NAN; a[2] = INFINITY; b[3] = -INFINITY; a[4] = 1e-40f; b[4] = 3e-39f;
  a[5] = -0.0f; b[5] = 0.0f; a[6] = 2.5f; b[6] = -2.5f; a[7] = 3e38f; b[7] = 1e-30f;
  a[8] = 0.75f; b[8] = 0.5f; a[9] = 5e9f; b[9] = -5e9f; a[10] = -1.5f; b[10] = 0.0f;
  float* da = module_.memory().alloc(a);
  float* db = module_.memory().alloc(b);
  float* out = module_.memory().alloc<float>(64 * 16);
  int* iout = module_.memory().alloc<int>(64 * 6);
  ASSERT_THAT(module_.launch("floatOps", {1}, {64}, Params().add(da).add(db).add(out).add(iout)), IsOk());
  for (int t = 0; t < 64; ++t) {
    volatile float x = a[t], y = b[t];
    float* o = out + t * 16;
    EXPECT_EQ(f2u(o[0]), canon(x + y)) << t;
    EXPECT_EQ(f2u(o[1]), canon(withRounding(FE_TOWARDZERO, [&] { return x + y; }))) << t;
    EXPECT_EQ(f2u(o[2]), canon(withRounding(FE_UPWARD, [&] { return x * y; }))) << t;
    EXPECT_EQ(f2u(o[3]), canon(withRounding(FE_DOWNWARD, [&] { return x * y; }))) << t;
    EXPECT_EQ(f2u(o[4]), canon(x / y)) << t;
    EXPECT_EQ(f2u(o[5]), canon(withRounding(FE_TOWARDZERO, [&] { return x / y; }))) << t;
    EXPECT_EQ(f2u(o[6]), canon(std::sqrt(std::fabs(x)))) << t;
    EXPECT_EQ(f2u(o[7]), canon(withRounding(FE_TOWARDZERO, [&] { return std::fma(x, y, 1.0f); }))) << t;
    float mn = std::isnan(x) ? y : std::isnan(y) ? x : (x == y ? (std::signbit(x) ? x : y) : std::min(x, y));
    float mx = std::isnan(x) ? y : std::isnan(y) ? x : (x == y ? (std::signbit(x) ? y : x) : std::max(x, y));
    EXPECT_EQ(f2u(o[8]), canon(mn)) << t;
    EXPECT_EQ(f2u(o[9]), canon(mx)) << t;
    float sat = std::isnan(x) ? 0.0f : std::clamp(static_cast<float>(x), 0.0f, 1.0f);
    if (sat == 0.0f) sat = 0.0f;
    EXPECT_EQ(f2u(o[10]), f2u(sat)) << t;
    EXPECT_EQ(f2u(o[11]), canon(1.0f / y)) << t;
    EXPECT_EQ(f2u(o[12]), canon(std::nearbyint(x))) << t;
    EXPECT_EQ(f2u(o[13]), canon(std::trunc(y))) << t;
    EXPECT_EQ(f2u(o[14]), canon(std::floor(x) + std::ceil(y))) << t;
    float i2f = withRounding(FE_TOWARDZERO, [&] { return static_cast<float>(static_cast<int32_t>(f2u(x))); });
    float u2f = withRounding(FE_UPWARD, [&] { return static_cast<float>(f2u(y)); });
    EXPECT_EQ(f2u(o[15]), canon(i2f + u2f)) << t;
    int* io = iout + t * 6;
    EXPECT_EQ(io[0], satConvert<int32_t>(std::nearbyint(static_cast<float>(x * 1e6f)))) << t;
    EXPECT_EQ(io[1], satConvert<int32_t>(std::trunc(static_cast<float>(y * 1e9f)))) << t;
    EXPECT_EQ(static_cast<uint32_t>(io[2]), satConvert<uint32_t>(std::floor(x))) << t;
    EXPECT_EQ(io[3], satConvert<int32_t>(std::ceil(y))) << t;
    EXPECT_EQ(io[4], static_cast<int>(satConvert<int64_t>(std::nearbyint(static_cast<float>(x * 1e12f))))) << t;
    float back = std::bit_cast<float>(io[0]) + 0.0f;
    EXPECT_EQ(static_cast<uint32_t>(io[5]), canon(back)) << t;
  }
}

TEST_P(Kernels, DoubleRoundingModes) {
  load("math");
  std::vector<double> a(32), b(32);
  for (int i = 0; i < 32; ++i) {
    a[i] = std::sin(i * 1.37) * std::pow(10.0, i % 9 - 4);
    b[i] = std::cos(i * 0.71) * 3;
  }
  a[0] = 1e-310; b[0] = 7.0; a[1] = -0.0; b[1] = 0.0;
  double* da = module_.memory().alloc(a);
  double* db = module_.memory().alloc(b);
  double* out = module_.memory().alloc<double>(32 * 8);
  ASSERT_THAT(module_.launch("doubleOps", {1}, {32}, Params().add(da).add(db).add(out)), IsOk());
  for (int t = 0; t < 32; ++t) {
    volatile double x = a[t], y = b[t];
    double* o = out + t * 8;
    EXPECT_EQ(d2u(o[0]), d2u(withRounding(FE_TOWARDZERO, [&] { return x + y; }))) << t;
    EXPECT_EQ(d2u(o[1]), d2u(withRounding(FE_UPWARD, [&] { return x * y; }))) << t;
    EXPECT_EQ(d2u(o[2]), d2u(withRounding(FE_DOWNWARD, [&] { return x / y; }))) << t;
    EXPECT_EQ(d2u(o[3]), d2u(std::sqrt(std::fabs(x)))) << t;
    EXPECT_EQ(d2u(o[4]), d2u(std::fma(x, y, -x))) << t;
    double mn = x == y ? (std::signbit(x) ? x : y) : std::min(x, y);
    EXPECT_EQ(d2u(o[5]), d2u(mn)) << t;
    EXPECT_EQ(d2u(o[6]), d2u(static_cast<double>(withRounding(FE_TOWARDZERO, [&] { return static_cast<float>(x); })))) << t;
    EXPECT_EQ(d2u(o[7]), d2u(withRounding(FE_DOWNWARD, [&] { return static_cast<double>(static_cast<int64_t>(d2u(y))); })))
        << t;
  }
}

uint16_t h2u(_Float16 h) { return std::bit_cast<uint16_t>(h); }
// Round toward zero to f16, from the round-to-nearest result of the host type.
uint16_t toHalfRz(float f) {
  _Float16 rn = static_cast<_Float16>(f);
  if (std::isnan(f) || std::isinf(f)) return h2u(rn);
  if (std::fabs(static_cast<float>(rn)) > std::fabs(f)) return h2u(rn) - 1;
  return h2u(rn);
}
uint16_t toBf16Rn(float f) {
  uint32_t u = f2u(f);
  if (std::isnan(f)) return 0x7fff;
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

TEST_P(Kernels, HalfAndBFloat16) {
  load("math");
  std::vector<float> a = randomFloats(64, 31, -70000, 70000), b = randomFloats(64, 32, -2, 2);
  a[0] = 1e-6f; b[0] = 3e-8f; a[1] = 65519.0f; b[1] = 65521.0f; a[2] = NAN; a[3] = -0.0f;
  float* da = module_.memory().alloc(a);
  float* db = module_.memory().alloc(b);
  auto* out = module_.memory().alloc<unsigned short>(64 * 6);
  ASSERT_THAT(module_.launch("halfOps", {1}, {64}, Params().add(da).add(db).add(out)), IsOk());
  for (int t = 0; t < 64; ++t) {
    unsigned short* o = out + t * 6;
    _Float16 x = static_cast<_Float16>(a[t]);
    uint16_t yBits = toHalfRz(b[t]);
    _Float16 y = std::bit_cast<_Float16>(yBits);
    auto canonH = [](_Float16 h) { return std::isnan(static_cast<float>(h)) ? uint16_t{0x7fff} : h2u(h); };
    EXPECT_EQ(o[0], canonH(x)) << t;
    EXPECT_EQ(o[1], yBits) << t;
    EXPECT_EQ(o[2], canonH(static_cast<_Float16>(static_cast<double>(x) + static_cast<double>(y)))) << t;
    EXPECT_EQ(o[3], canonH(static_cast<_Float16>(static_cast<double>(x) * static_cast<double>(y)))) << t;
    EXPECT_EQ(o[4], toBf16Rn(a[t])) << t;
    EXPECT_EQ(o[5], canonH(static_cast<_Float16>(static_cast<float>(x) * 3.0f))) << t;
  }
}

// ---------------------------------------------------------------- fp8

// cuda_fp8.h's host emulation is the reference; a NaN is compared as a NaN.
bool e4m3IsNan(unsigned b) { return (b & 0x7fu) == 0x7fu; }
bool e5m2IsNan(unsigned b) { return (b & 0x7fu) > 0x7cu; }

void expectFp8Pair(unsigned got, unsigned want, bool e4, const std::string& what) {
  for (int k = 0; k < 2; ++k) {
    const unsigned g = (got >> (8 * k)) & 0xffu, w = (want >> (8 * k)) & 0xffu;
    if (e4 ? e4m3IsNan(w) : e5m2IsNan(w)) {
      EXPECT_TRUE(e4 ? e4m3IsNan(g) : e5m2IsNan(g)) << what << " byte " << k << ": " << std::hex << g;
    } else {
      EXPECT_EQ(g, w) << what << " byte " << k;
    }
  }
}

// .relu: negative values become 0, a NaN the canonical NaN.
unsigned reluFp8(float x, __nv_fp8_interpretation_t kind) {
  if (std::isnan(x)) return 0x7fu;
  return __nv_cvt_float_to_fp8(x < 0 ? 0.0f : x, __NV_SATFINITE, kind);
}

TEST_P(Kernels, Fp8FromF32MatchesCudaFp8) {
  load("fp8");
  // Every value of both formats, the midpoints between neighbours (ties) and
  // the floats next to them, the saturation edges, specials, and random
  // magnitudes over the whole range.
  std::vector<float> values = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f, 449.0f, 463.99f, 464.0f,
                               465.0f, 480.0f, 1e9f, 57344.0f, 61440.0f, 61441.0f, 65536.0f, 3.4e38f,
                               std::ldexp(1.0f, -9), std::ldexp(1.0f, -10), std::ldexp(1.0001f, -10),
                               std::ldexp(1.0f, -16), std::ldexp(1.0f, -17), std::ldexp(1.5f, -17), 1e-30f};
  for (bool e4 : {true, false}) {
    std::vector<float> all;
    for (unsigned b = 0; b < 256; ++b) {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), e4 ? __NV_E4M3 : __NV_E5M2);
      const float v = static_cast<float>(std::bit_cast<_Float16>(h.x));
      if (!std::isnan(v) && !std::isinf(v)) all.push_back(v);
    }
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + 1 < all.size(); ++i) {
      const float mid = (all[i] + all[i + 1]) / 2;  // exact: a few significant bits
      values.insert(values.end(), {all[i], mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)});
    }
  }
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> exponent(-20, 17);
  for (int i = 0; i < 4096; ++i) values.push_back((rng() & 1 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  const int n = static_cast<int>(values.size());
  std::vector<float> a(values), b(n);
  for (int i = 0; i < n; ++i) b[i] = values[(static_cast<size_t>(i) * 7 + 3) % values.size()];
  float* da = module_.memory().alloc(a);
  float* db = module_.memory().alloc(b);
  auto* out = module_.memory().alloc<unsigned short>(static_cast<size_t>(n) * 4);
  ASSERT_THAT(module_.launch("f32_to_fp8x2", {static_cast<uint32_t>((n + 255) / 256)}, {256},
                             Params().add(da).add(db).add(out).add(n)),
              IsOk());
  for (int i = 0; i < n; ++i) {
    const float2 f = make_float2(b[i], a[i]);
    const std::string what = "cvt of " + std::to_string(a[i]) + ", " + std::to_string(b[i]);
    expectFp8Pair(out[i], __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3), true, "e4m3x2 " + what);
    expectFp8Pair(out[i + n], __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E5M2), false, "e5m2x2 " + what);
    EXPECT_EQ(out[i + 2 * n], (reluFp8(a[i], __NV_E4M3) << 8) | reluFp8(b[i], __NV_E4M3)) << "relu e4m3x2 " << what;
    EXPECT_EQ(out[i + 3 * n], (reluFp8(a[i], __NV_E5M2) << 8) | reluFp8(b[i], __NV_E5M2)) << "relu e5m2x2 " << what;
    if (HasFailure()) break;
  }
}

TEST_P(Kernels, Fp8FromF16x2MatchesCudaFp8) {
  load("fp8");
  const int n = 1 << 16;  // every f16 in the upper half, paired with another in the lower
  std::vector<unsigned> h(n);
  for (int i = 0; i < n; ++i) h[i] = (static_cast<unsigned>(i) << 16) | ((static_cast<unsigned>(i) * 13 + 5) & 0xffffu);
  unsigned* dh = module_.memory().alloc(h);
  auto* out = module_.memory().alloc<unsigned short>(static_cast<size_t>(n) * 3);
  ASSERT_THAT(module_.launch("f16x2_to_fp8x2", {n / 256}, {256}, Params().add(dh).add(out).add(n)), IsOk());
  for (int i = 0; i < n; ++i) {
    __half2_raw v;
    v.x = static_cast<unsigned short>(h[i]);
    v.y = static_cast<unsigned short>(h[i] >> 16);
    const std::string what = "cvt of f16x2 " + std::to_string(h[i]);
    expectFp8Pair(out[i], __nv_cvt_halfraw2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3), true, "e4m3x2 " + what);
    expectFp8Pair(out[i + n], __nv_cvt_halfraw2_to_fp8x2(v, __NV_SATFINITE, __NV_E5M2), false, "e5m2x2 " + what);
    auto relu = [](unsigned short bits) {
      return reluFp8(static_cast<float>(std::bit_cast<_Float16>(bits)), __NV_E4M3);
    };
    EXPECT_EQ(out[i + 2 * n], (relu(v.y) << 8) | relu(v.x)) << "relu e4m3x2 " << what;
    if (HasFailure()) break;
  }
}

TEST_P(Kernels, F16x2FromFp8MatchesCudaFp8) {
  load("fp8");
  const int n = 1 << 16;  // every pair
  std::vector<unsigned short> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<unsigned short>(i);
  unsigned short* dv = module_.memory().alloc(v);
  auto* out = module_.memory().alloc<unsigned>(static_cast<size_t>(n) * 4);
  ASSERT_THAT(module_.launch("fp8x2_to_f16x2", {n / 256}, {256}, Params().add(dv).add(out).add(n)), IsOk());
  auto pack = [](__half2_raw r) { return r.x | (static_cast<unsigned>(r.y) << 16); };
  auto relu = [](unsigned pair) {
    unsigned d = 0;
    for (int k = 0; k < 2; ++k) {
      unsigned h = (pair >> (16 * k)) & 0xffffu;
      if ((h & 0x7fffu) > 0x7c00u) h = 0x7fffu;
      else if (h & 0x8000u) h = 0;
      d |= h << (16 * k);
    }
    return d;
  };
  for (int i = 0; i < n; ++i) {
    const unsigned e4 = pack(__nv_cvt_fp8x2_to_halfraw2(v[i], __NV_E4M3));
    const unsigned e5 = pack(__nv_cvt_fp8x2_to_halfraw2(v[i], __NV_E5M2));
    EXPECT_EQ(out[i], e4) << "f16x2 of e4m3x2 " << i;
    EXPECT_EQ(out[i + n], e5) << "f16x2 of e5m2x2 " << i;
    EXPECT_EQ(out[i + 2 * n], relu(e4)) << "relu f16x2 of e4m3x2 " << i;
    EXPECT_EQ(out[i + 3 * n], relu(e5)) << "relu f16x2 of e5m2x2 " << i;
    if (HasFailure()) break;
  }
}

// ---------------------------------------------------------------- wmma

// D = alpha * (A x B) + C, 32 x 32 x 64, through wmma (kernels/wmma.cu): A
// row-major, B column-major. The reference adds the products in k order from 0,
// each exact in f32, with one rounding per addition, chunk by chunk (an f16
// accumulator is rounded to f16 after each wmma.mma); the epilogue as the PTX
// has it (fma.rn for f32 and f64; mul.f16 then add.f16, each rounded).
struct WmmaCase {
  static constexpr int M = 32, N = 32, K = 64;
  std::vector<double> a = std::vector<double>(M * K), b = std::vector<double>(K * N),  // b[j * K + k]
                      c = std::vector<double>(M * N);
  explicit WmmaCase(uint32_t seed, double scale) {
    std::mt19937 rng(seed);
    auto small = [&] { return static_cast<double>(static_cast<int>(rng() % 17) - 8) * scale; };
    for (double& x : a) x = small();
    for (double& x : b) x = small();
    for (double& x : c) x = small();
  }
  template <typename T, typename Convert>
  std::vector<T> as(const std::vector<double>& v, Convert convert) const {
    std::vector<T> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = convert(v[i]);
    return out;
  }
  // acc over k in chunks of `chunk`, `round` applied after each chunk.
  template <typename Acc, typename Round>
  Acc dot(int i, int j, int chunk, Round round, const std::vector<double>& av, const std::vector<double>& bv) const {
    Acc acc = 0;
    for (int k0 = 0; k0 < K; k0 += chunk) {
      for (int k = k0; k < k0 + chunk; ++k) acc += static_cast<Acc>(av[i * K + k]) * static_cast<Acc>(bv[j * K + k]);
      acc = round(acc);
    }
    return acc;
  }
};

TEST_P(Kernels, WmmaF16WithF32Accumulator) {
  load("wmma");
  for (const char* kernel : {"gemm_f16_f32", "gemm_m32n8_f16", "gemm_m8n32_f16"}) {
    const WmmaCase t(3, 0.25);
    auto half = [](double x) { return h2u(static_cast<_Float16>(x)); };
    auto* da = module_.memory().alloc(t.as<uint16_t>(t.a, half));
    auto* db = module_.memory().alloc(t.as<uint16_t>(t.b, half));
    auto* dc = module_.memory().alloc(t.as<float>(t.c, [](double x) { return static_cast<float>(x); }));
    auto* dd = module_.memory().alloc<float>(WmmaCase::M * WmmaCase::N);
    const std::string name = kernel;
    const Dim3 grid = name == "gemm_m32n8_f16" ? Dim3{4, 1} : name == "gemm_m8n32_f16" ? Dim3{1, 4} : Dim3{2, 2};
    const float alpha = 1.5f;
    ASSERT_THAT(module_.launch(kernel, grid, {32},
                               Params().add(da).add(db).add(dc).add(dd).add(WmmaCase::M).add(WmmaCase::N)
                                   .add(WmmaCase::K).add(alpha)),
                IsOk()) << kernel;
    for (int i = 0; i < WmmaCase::M; ++i) {
      for (int j = 0; j < WmmaCase::N; ++j) {
        const float acc = t.dot<float>(i, j, 16, [](float x) { return x; }, t.a, t.b);
        ASSERT_EQ(f2u(dd[i * WmmaCase::N + j]), f2u(std::fma(alpha, acc, static_cast<float>(t.c[i * WmmaCase::N + j]))))
            << kernel << " d[" << i << "][" << j << "]";
      }
    }
  }
}

TEST_P(Kernels, WmmaF16WithF16Accumulator) {
  load("wmma");
  const WmmaCase t(4, 0.125);
  auto half = [](double x) { return h2u(static_cast<_Float16>(x)); };
  auto* da = module_.memory().alloc(t.as<uint16_t>(t.a, half));
  auto* db = module_.memory().alloc(t.as<uint16_t>(t.b, half));
  auto* dc = module_.memory().alloc(t.as<uint16_t>(t.c, half));
  auto* dd = module_.memory().alloc<uint16_t>(WmmaCase::M * WmmaCase::N);
  const _Float16 alpha = static_cast<_Float16>(0.75);
  ASSERT_THAT(module_.launch("gemm_f16_f16", {2, 2}, {32},
                             Params().add(da).add(db).add(dc).add(dd).add(WmmaCase::M).add(WmmaCase::N)
                                 .add(WmmaCase::K).add(h2u(alpha))),
              IsOk());
  for (int i = 0; i < WmmaCase::M; ++i) {
    for (int j = 0; j < WmmaCase::N; ++j) {
      const float acc =
          t.dot<float>(i, j, 16, [](float x) { return static_cast<float>(static_cast<_Float16>(x)); }, t.a, t.b);
      const _Float16 scaled = static_cast<_Float16>(static_cast<float>(alpha) * acc);
      const _Float16 want = static_cast<_Float16>(static_cast<float>(scaled) + static_cast<float>(t.c[i * WmmaCase::N + j]));
      ASSERT_EQ(dd[i * WmmaCase::N + j], h2u(want)) << "d[" << i << "][" << j << "]";
    }
  }
}

TEST_P(Kernels, WmmaBf16Tf32Int8AndF64) {
  load("wmma");
  const int M = WmmaCase::M, N = WmmaCase::N, K = WmmaCase::K;
  {  // bf16 inputs, f32 accumulator
    const WmmaCase t(5, 0.5);
    auto bf = [](double x) { return toBf16Rn(static_cast<float>(x)); };
    auto* da = module_.memory().alloc(t.as<uint16_t>(t.a, bf));
    auto* db = module_.memory().alloc(t.as<uint16_t>(t.b, bf));
    auto* dc = module_.memory().alloc(t.as<float>(t.c, [](double x) { return static_cast<float>(x); }));
    auto* dd = module_.memory().alloc<float>(M * N);
    ASSERT_THAT(module_.launch("gemm_bf16", {2, 2}, {32}, Params().add(da).add(db).add(dc).add(dd).add(M).add(N).add(K)
                                                              .add(2.0f)),
                IsOk());
    for (int i = 0; i < M * N; ++i) {
      const float acc = t.dot<float>(i / N, i % N, 16, [](float x) { return x; }, t.a, t.b);
      ASSERT_EQ(f2u(dd[i]), f2u(std::fma(2.0f, acc, static_cast<float>(t.c[i])))) << "bf16 " << i;
    }
  }
  {  // tf32: f32 inputs with every fraction bit, rounded by cvt.rna.tf32.f32 in the kernel
    const WmmaCase t(6, 1.0);
    std::vector<float> a = randomFloats(M * K, 61, -2, 2), b = randomFloats(K * N, 62, -2, 2);
    auto tf32 = [](float x) {
      uint32_t u = f2u(x);
      u = (u + 0x1000u) & 0xffffe000u;  // rna; no NaN or overflow in these inputs
      return static_cast<double>(std::bit_cast<float>(u));
    };
    std::vector<double> ar(a.size()), br(b.size());
    for (size_t i = 0; i < a.size(); ++i) ar[i] = tf32(a[i]);
    for (size_t i = 0; i < b.size(); ++i) br[i] = tf32(b[i]);
    auto* da = module_.memory().alloc(a);
    auto* db = module_.memory().alloc(b);
    auto* dc = module_.memory().alloc(t.as<float>(t.c, [](double x) { return static_cast<float>(x); }));
    auto* dd = module_.memory().alloc<float>(M * N);
    ASSERT_THAT(module_.launch("gemm_tf32", {2, 2}, {32}, Params().add(da).add(db).add(dc).add(dd).add(M).add(N).add(K)
                                                              .add(1.0f)),
                IsOk());
    for (int i = 0; i < M * N; ++i) {
      const float acc = t.dot<float>(i / N, i % N, 8, [](float x) { return x; }, ar, br);
      ASSERT_EQ(f2u(dd[i]), f2u(std::fma(1.0f, acc, static_cast<float>(t.c[i])))) << "tf32 " << i;
    }
  }
  {  // s8 inputs, s32 accumulator
    const WmmaCase t(7, 1.0);
    std::vector<double> a(M * K), b(K * N);
    std::mt19937 rng(71);
    for (double& x : a) x = static_cast<double>(static_cast<int>(rng() % 256) - 128);
    for (double& x : b) x = static_cast<double>(static_cast<int>(rng() % 256) - 128);
    auto s8 = [](double x) { return static_cast<int8_t>(x); };
    auto* da = module_.memory().alloc(t.as<int8_t>(a, s8));
    auto* db = module_.memory().alloc(t.as<int8_t>(b, s8));
    auto* dc = module_.memory().alloc(t.as<int32_t>(t.c, [](double x) { return static_cast<int32_t>(x); }));
    auto* dd = module_.memory().alloc<int32_t>(M * N);
    ASSERT_THAT(module_.launch("gemm_s8", {2, 2}, {32}, Params().add(da).add(db).add(dc).add(dd).add(M).add(N).add(K)
                                                            .add(3)),
                IsOk());
    for (int i = 0; i < M * N; ++i) {
      const int64_t acc = t.dot<int64_t>(i / N, i % N, 16, [](int64_t x) { return x; }, a, b);
      ASSERT_EQ(dd[i], static_cast<int32_t>(3 * acc + static_cast<int64_t>(t.c[i]))) << "s8 " << i;
    }
  }
  {  // f64, m8n8k4
    const WmmaCase t(8, 1.0);
    std::vector<double> a(M * K), b(K * N);
    std::mt19937_64 rng(81);
    std::uniform_real_distribution<double> u(-1, 1);
    for (double& x : a) x = u(rng);
    for (double& x : b) x = u(rng);
    auto* da = module_.memory().alloc(a);
    auto* db = module_.memory().alloc(b);
    auto* dc = module_.memory().alloc(t.c);
    auto* dd = module_.memory().alloc<double>(M * N);
    ASSERT_THAT(module_.launch("gemm_f64", {4, 4}, {32}, Params().add(da).add(db).add(dc).add(dd).add(M).add(N).add(K)
                                                             .add(0.5)),
                IsOk());
    for (int i = 0; i < M * N; ++i) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc = std::fma(a[(i / N) * K + k], b[(i % N) * K + k], acc);
      ASSERT_EQ(d2u(dd[i]), d2u(std::fma(0.5, acc, t.c[i]))) << "f64 " << i;
    }
  }
}

// mma.sync with ldmatrix (kernels/mma.cu): the fragments' documented layouts,
// loaded with ldmatrix (B n-major, and k-major through .trans) or by their
// element positions, give D = A x B (+ C); sums in k order as for wmma.
TEST_P(Kernels, MmaSyncWithLdmatrix) {
  load("mma");
  const int K = 48;
  std::mt19937 rng(12);
  std::vector<double> a(16 * K), bt(8 * K);
  for (double& x : a) x = static_cast<double>(static_cast<int>(rng() % 17) - 8) * 0.25;
  for (double& x : bt) x = static_cast<double>(static_cast<int>(rng() % 17) - 8) * 0.25;
  for (const char* kernel : {"mma_f16", "mma_bf16"}) {
    const bool bf = std::string(kernel) == "mma_bf16";
    auto conv = [&](const std::vector<double>& v) {
      std::vector<uint16_t> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        out[i] = bf ? toBf16Rn(static_cast<float>(v[i])) : h2u(static_cast<_Float16>(v[i]));
      }
      return out;
    };
    auto* da = module_.memory().alloc(conv(a));
    auto* db = module_.memory().alloc(conv(bt));
    for (int trans : {0, 1}) {
      auto* dd = module_.memory().alloc<float>(16 * 8);
      ASSERT_THAT(module_.launch(kernel, {1}, {32}, Params().add(da).add(db).add(dd).add(K).add(trans)), IsOk())
          << kernel;
      for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 8; ++j) {
          float acc = 0;
          for (int k = 0; k < K; ++k) acc += static_cast<float>(a[i * K + k]) * static_cast<float>(bt[j * K + k]);
          ASSERT_EQ(f2u(dd[i * 8 + j]), f2u(acc)) << kernel << (trans ? " .trans" : "") << " d[" << i << "][" << j << "]";
        }
      }
    }
  }
  // m16n8k8 with an f16 accumulator.
  std::vector<uint16_t> a8(16 * 8), b8(8 * 8), c8(16 * 8);
  std::vector<double> av(a8.size()), bv(b8.size()), cv(c8.size());
  for (size_t i = 0; i < a8.size(); ++i) a8[i] = h2u(static_cast<_Float16>(av[i] = (static_cast<int>(rng() % 9) - 4) * 0.5));
  for (size_t i = 0; i < b8.size(); ++i) b8[i] = h2u(static_cast<_Float16>(bv[i] = (static_cast<int>(rng() % 9) - 4) * 0.5));
  for (size_t i = 0; i < c8.size(); ++i) c8[i] = h2u(static_cast<_Float16>(cv[i] = (static_cast<int>(rng() % 9) - 4) * 0.125));
  auto* da = module_.memory().alloc(a8);
  auto* db = module_.memory().alloc(b8);
  auto* dc = module_.memory().alloc(c8);
  auto* dd = module_.memory().alloc<uint16_t>(16 * 8);
  ASSERT_THAT(module_.launch("mma_m16n8k8_f16", {1}, {32}, Params().add(da).add(db).add(dc).add(dd)), IsOk());
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      float acc = static_cast<float>(cv[i * 8 + j]);
      for (int k = 0; k < 8; ++k) acc += static_cast<float>(av[i * 8 + k]) * static_cast<float>(bv[j * 8 + k]);
      ASSERT_EQ(dd[i * 8 + j], h2u(static_cast<_Float16>(acc))) << "m16n8k8 d[" << i << "][" << j << "]";
    }
  }
}

// ---------------------------------------------------------------- mbarrier

// kernels/barrier.cu for sm_80 (test_wait) and sm_90 (try_wait): cuda::barrier
// over many phases, cuda::memcpy_async double buffering, and a producer and
// its consumers on "full"/"empty" mbarriers waited on by phase parity; on
// sm_90 also transaction counts and bulk copies both ways.
TEST_P(Kernels, MbarrierPhasesPipelinesAndAsyncCopies) {
  for (const char* ptx : {"barrier", "barrier_sm90"}) {
    SCOPED_TRACE(ptx);
    load(ptx);
    const int threads = 128, rounds = 9;
    std::vector<int> values(threads);
    for (int t = 0; t < threads; ++t) values[t] = t;
    for (int r = 0; r < rounds; ++r) {
      std::vector<int> next(threads);
      for (int t = 0; t < threads; ++t) next[t] = values[(t + 1) % threads] * 3 + r + t;
      values = next;
    }
    int* out = module_.memory().alloc<int>(threads);
    ASSERT_THAT(module_.launch("split_phases", {2}, {threads}, Params().add(out).add(rounds)), IsOk());
    for (int t = 0; t < threads; ++t) ASSERT_EQ(out[t], values[t]) << "split_phases " << t;

    const int n = 256 * 6;
    std::vector<int> in(n);
    for (int i = 0; i < n; ++i) in[i] = (i * 37) % 101 - 50;
    int* din = module_.memory().alloc(in);
    int* sums = module_.memory().alloc<int>(256);
    ASSERT_THAT(module_.launch("async_copy_sum", {1}, {256}, Params().add(din).add(sums).add(n)), IsOk());
    for (int t = 0; t < 256; ++t) {
      int acc = 0;
      for (int k = 0; k < n / 256; ++k) acc += in[k * 256 + (t * 7 + k) % 256];
      ASSERT_EQ(sums[t], acc) << "async_copy_sum " << t;
    }

    const int iterations = 11;
    int* piped = module_.memory().alloc<int>(128);
    ASSERT_THAT(module_.launch("producer_consumer", {3}, {128}, Params().add(din).add(piped).add(iterations)), IsOk());
    for (int t = 32; t < 128; ++t) {
      int acc = 0;
      for (int i = 0; i < iterations; ++i) acc += in[i * 32 + t % 32] * (t / 32);
      ASSERT_EQ(piped[t], acc) << "producer_consumer " << t;
    }
  }
  int* out = module_.memory().alloc<int>(96);
  ASSERT_THAT(module_.launch("transaction_count", {1}, {96}, Params().add(out)), IsOk());
  for (int t = 0; t < 96; ++t) {
    const int i = t % 64;
    ASSERT_EQ(out[t], i < 32 ? (i + 32) * 5 : i * 7) << "transaction_count " << t;
  }
  std::vector<int> in(256);
  for (int i = 0; i < 256; ++i) in[i] = i * 11 - 700;
  int* din = module_.memory().alloc(in);
  int* bulk = module_.memory().alloc<int>(256);
  ASSERT_THAT(module_.launch("bulk_copies", {2}, {256}, Params().add(din).add(bulk)), IsOk());
  for (int t = 0; t < 256; ++t) ASSERT_EQ(bulk[t], in[255 - t] * 3) << "bulk_copies " << t;
}

// grid.sync() of cooperative groups: in a cooperative launch every block runs
// at once and the barrier completes, whatever the worker count; in a plain
// launch the grid has no workspace and grid.sync() traps, as on a GPU.
TEST_P(Kernels, GridSyncInACooperativeLaunch) {
  for (const char* ptx : {"barrier", "barrier_sm90"}) {
    SCOPED_TRACE(ptx);
    load(ptx);
    const int n = 1000, rounds = 4;  // 4 blocks of 256: the last threads have no word
    std::vector<int> expected(n);
    for (int i = 0; i < n; ++i) expected[i] = i;
    for (int r = 0; r < rounds; ++r) {
      std::vector<int> next(n);
      for (int i = 0; i < n; ++i) next[i] = expected[i] * 3 + expected[(i + 1) % n] + r;
      expected = next;
    }
    int* data = module_.memory().alloc<int>(n);
    ASSERT_THAT(module_.launch("grid_sync", {2, 2}, {256}, Params().add(data).add(n).add(rounds), 0, true), IsOk());
    for (int i = 0; i < n; ++i) ASSERT_EQ(data[i], expected[i]) << i;
    EXPECT_THAT(module_.launch("grid_sync", {4}, {256}, Params().add(data).add(n).add(rounds)),
                StatusIs(Code::kFailedPrecondition, HasSubstr("trap")));
  }
}

TEST_P(Kernels, WmmaNeedsTheWholeWarp) {
  load("wmma");
  const WmmaCase t(9, 1.0);
  auto* da = module_.memory().alloc(t.as<uint16_t>(t.a, [](double x) { return h2u(static_cast<_Float16>(x)); }));
  auto* dc = module_.memory().alloc<float>(WmmaCase::M * WmmaCase::N);
  EXPECT_THAT(module_.launch("gemm_f16_f32", {1, 1}, {16},
                             Params().add(da).add(da).add(dc).add(dc).add(16).add(16).add(16).add(1.0f)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("part of a warp")));
}

TEST_P(Kernels, ApproximateFunctionsWithinPtxBounds) {
  load("math");
  std::vector<float> a = randomFloats(64, 41, -3.14159f, 3.14159f);
  float* da = module_.memory().alloc(a);
  float* out = module_.memory().alloc<float>(64 * 6);
  ASSERT_THAT(module_.launch("approxOps", {1}, {64}, Params().add(da).add(out)), IsOk());
  for (int t = 0; t < 64; ++t) {
    double x = a[t];
    const float* o = out + t * 6;
    // ex2.approx: max relative error 2^-22 (the argument is first scaled by log2(e) in f32).
    double e = std::exp2(static_cast<double>(static_cast<float>(x * 1.4426950408889634)));
    EXPECT_NEAR(o[0], e, std::fabs(e) * 0x1p-21) << t;
    EXPECT_NEAR(o[1], std::log(std::fabs(x) + 1.0), 0x1p-21) << t;
    // sin/cos.approx: maximum absolute error 2^-20.5 in [-pi, pi].
    EXPECT_NEAR(o[2], std::sin(x), std::exp2(-20.5)) << t;
    EXPECT_NEAR(o[3], std::cos(x), std::exp2(-20.5)) << t;
    double rs = 1.0 / std::sqrt(std::fabs(x) + 1.0);
    EXPECT_NEAR(o[4], rs, rs * 0x1p-22) << t;
    EXPECT_NEAR(o[5], x / 3.0, std::fabs(x / 3.0) * 0x1p-22) << t;
  }
}

// ---------------------------------------------------------------- access recorder

uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

TEST_P(Kernels, AccessRecorderIsExact) {
  load("basic");
  setRecordAccesses(module_.program(), true);
  const int n = 1000;
  float* x = module_.memory().alloc<float>(1024);
  float* y = module_.memory().alloc<float>(1024);
  ASSERT_THAT(module_.launch("saxpy", {4}, {256}, Params().add(n).add(2.0f).add(x).add(y)), IsOk());
  AccessRecord r = lastLaunchAccesses(module_.program());
  std::vector<ByteRange> reads = {{addr(x), addr(x + n)}, {addr(y), addr(y + n)}};
  if (addr(y) < addr(x)) std::swap(reads[0], reads[1]);
  EXPECT_EQ(r.reads, reads);
  EXPECT_EQ(r.writes, (std::vector<ByteRange>{{addr(y), addr(y + n)}}));

  // Only even blocks' data is touched by a kernel that returns early.
  load("control");
  setRecordAccesses(module_.program(), true);
  int* out = module_.memory().alloc<int>(256);
  ASSERT_THAT(module_.launch("earlyExit", {1}, {256}, Params().add(out).add(200)), IsOk());
  r = lastLaunchAccesses(module_.program());
  EXPECT_TRUE(r.reads.empty());
  EXPECT_EQ(r.writes, (std::vector<ByteRange>{{addr(out), addr(out + 200)}}));

  // Atomics read and write their word.
  load("memory");
  setRecordAccesses(module_.program(), true);
  int* lock = module_.memory().alloc<int>(1);
  int* value = module_.memory().alloc<int>(1);
  ASSERT_THAT(module_.launch("casLock", {4}, {32}, Params().add(lock).add(value)), IsOk());
  r = lastLaunchAccesses(module_.program());
  std::vector<ByteRange> both = {{addr(lock), addr(lock + 1)}, {addr(value), addr(value + 1)}};
  if (addr(value) < addr(lock)) std::swap(both[0], both[1]);
  EXPECT_EQ(r.reads, both);
  EXPECT_EQ(r.writes, both);

  setRecordAccesses(module_.program(), false);
  ASSERT_THAT(module_.launch("casLock", {4}, {32}, Params().add(lock).add(value)), IsOk());
  EXPECT_TRUE(lastLaunchAccesses(module_.program()).reads.empty());
}

// ---------------------------------------------------------------- corpus

TEST(Corpus, EveryModuleLoads) {
  int loaded = 0;
  for (const char* src : {"saxpy", "matmul", "reduce", "normalize", "adam", "atomics",
                          "half_bf16", "misc"}) {
    for (const char* variant : {"O3", "G", "lineinfo"}) {
      std::string name = std::string("corpus_") + src + "_" + variant;
      Module m;
      EXPECT_THAT(m.loadFile(ptxPath(name)), IsOk()) << name;
      if (m.loadFile(ptxPath(name)).isOk()) {
        EXPECT_FALSE(m.program().functions().empty()) << name;
        ++loaded;
      }
    }
  }
  EXPECT_EQ(loaded, 24);
}

// PTX cut from libraries (tests/corpus/cccl_*.ptx: CuPy's CUB, Thrust and cuRAND
// device-API modules, compute_120, PTX ISA 9.2) loads and lowers: CUB's inline
// assembly, Thrust's griddepcontrol, module-scope shared variables. CuPy runs
// them end to end in tests/python/test_vgpu_cupy.py.
TEST(Corpus, LibraryModulesLoad) {
  const std::pair<const char*, size_t> modules[] = {{"cccl_cub_reduce_f32", 2},
                                                    {"cccl_cub_scan_f32", 2},
                                                    {"cccl_thrust_merge_sort_f16", 2},
                                                    {"cccl_curand_xorwow", 2}};
  for (const auto& [name, kernels] : modules) {
    Module m;
    Status st = m.loadFile(std::string(PHOS_CORPUS_DIR) + "/" + name + ".ptx");
    EXPECT_THAT(st, IsOk()) << name;
    if (st.isOk()) {
      EXPECT_EQ(m.program().functions().size(), kernels) << name;
    }
  }
}

}  // namespace
}  // namespace phos::vgpu::engine::testing
