// SPDX-License-Identifier: Apache-2.0
// Validator twins on the vgpu engine: a twin computes bit for bit what its kernel
// computes, and reports exactly the accesses outside its range table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "engine_harness.h"
#include "phos/instrument/check_function.h"
#include "phos/instrument/twin.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "phos/ptx/resolve.h"
#include "status_matchers.h"

namespace phos::vgpu::engine::testing {
namespace {

using instrument::RangeEntry;
using instrument::ReportEntry;
using instrument::ReportHeader;
using instrument::ViolationKind;
using ::phos::testing::IsOk;

constexpr uint32_t kLoadBit = 1;
constexpr uint32_t kStoreBit = 2;

template <typename T>
RangeEntry allow(const T* p, size_t count, uint32_t access) {
  uint64_t begin = reinterpret_cast<uint64_t>(p);
  return {begin, begin + count * sizeof(T), access, 0};
}

// The range table and report buffer of one twin launch, in device memory.
struct Validator {
  RangeEntry* ranges = nullptr;
  uint32_t count = 0;
  ReportHeader* report = nullptr;

  const ReportEntry& entry(size_t i) const {
    return reinterpret_cast<const ReportEntry*>(report + 1)[i];
  }
  std::vector<ReportEntry> entries() const {
    std::vector<ReportEntry> out;
    for (uint32_t i = 0; i < std::min(report->count, report->capacity); ++i) {
      out.push_back(entry(i));
    }
    return out;
  }
};

// Loads the twin module of `original` into `twins` (sharing the original's
// memory) and fills its address table as phosd does: slot i gets the address of
// stats.globals[i] in the original module.
Status loadBeside(const ptx::Module& original, Module& program, Module& twins, const instrument::TwinOptions& options) {
  instrument::TwinStats stats;
  ASSIGN_OR_RETURN(ptx::Module twin, instrument::buildTwinModule(original, options, &stats));
  RETURN_IF_ERROR(twins.load(ptx::print(twin)));
  if (stats.globals.empty()) return Status::ok();
  std::vector<uint64_t> addresses;
  for (const std::string& name : stats.globals) {
    uint64_t address = program.global(name);
    if (address == 0) return Status(Code::kNotFound, "the original module has no variable " + name);
    addresses.push_back(address);
  }
  uint64_t table = twins.global(std::string(instrument::kGlobalTable));
  if (table == 0) return Status(Code::kNotFound, "the twin module has no address table");
  return twins.memory().write(table, std::as_bytes(std::span(addresses)));
}

class TwinEquivalence : public ::testing::TestWithParam<uint32_t> {
 protected:
  // The program's own module from its own text, the twins in a module beside it.
  void load(instrument::TwinMode mode, const std::string& ptx = "twin") {
    const std::string text = readFile(ptxPath(ptx));
    Result<ptx::Module> original = ptx::parseModule(text, ptx + ".ptx");
    ASSERT_THAT(original, IsOk());
    original_ = std::move(original).value();
    ASSERT_THAT(module_.load(text), IsOk());
    instrument::TwinOptions options;
    options.mode = mode;
    ASSERT_THAT(loadBeside(original_, module_, twins_, options), IsOk());
    setWorkerThreads(module_.program(), GetParam());
    setWorkerThreads(twins_.program(), GetParam());
  }

  template <typename T>
  T* variable(const std::string& name) {
    return reinterpret_cast<T*>(module_.global(name));
  }

  Validator validator(std::vector<RangeEntry> ranges, uint32_t capacity = 64) {
    std::sort(ranges.begin(), ranges.end(),
              [](const RangeEntry& a, const RangeEntry& b) { return a.begin < b.begin; });
    Validator v;
    v.ranges = module_.memory().alloc(ranges);
    v.count = static_cast<uint32_t>(ranges.size());
    std::vector<std::byte> report(sizeof(ReportHeader) + capacity * sizeof(ReportEntry));
    v.report = reinterpret_cast<ReportHeader*>(module_.memory().alloc(report));
    v.report->capacity = capacity;
    return v;
  }

  static Params withValidator(Params p, const Validator& v) {
    return p.add(v.ranges).add(v.count).add(v.report);
  }

  // Index of `name` among the original module's functions, and of the first
  // instruction with `opcode` and state space `space` in it (ReportEntry fields).
  std::pair<uint32_t, uint32_t> site(const std::string& name, ptx::Opcode opcode,
                                     ptx::StateSpace space) {
    uint32_t fi = 0;
    for (const ptx::ModuleItem& item : original_.items) {
      const auto* f = std::get_if<ptx::Function>(&item);
      if (!f) continue;
      if (f->name == name) {
        Result<ptx::ResolvedFunction> r = ptx::ResolvedFunction::build(*f, &original_);
        EXPECT_THAT(r, IsOk());
        for (uint32_t i = 0; i < r->instructions().size(); ++i) {
          const ptx::Instruction& inst = *r->instructions()[i].inst;
          if (inst.opcode == opcode && inst.m.space == space) return {fi, i};
        }
        ADD_FAILURE() << "no such instruction in " << name;
      }
      ++fi;
    }
    ADD_FAILURE() << "no function " << name;
    return {0, 0};
  }

  std::string functionNamed(std::string_view part) const {
    for (const ptx::ModuleItem& item : original_.items) {
      const auto* f = std::get_if<ptx::Function>(&item);
      if (f && f->name.find(part) != std::string::npos) return f->name;
    }
    return "";
  }

  ptx::Module original_;
  Module module_;
  Module twins_{module_.memory()};
};

INSTANTIATE_TEST_SUITE_P(Workers, TwinEquivalence, ::testing::Values(1u, 2u),
                         [](const auto& p) { return "workers" + std::to_string(p.param); });

std::vector<float> randomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-100, 100);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <typename T>
void expectSameBits(const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(T)), 0) << "element " << i;
  }
}

TEST_P(TwinEquivalence, SaxpyComputesTheSameAndReportsNothingWhenAllowed) {
  load(instrument::TwinMode::kCheckpoint);
  const int n = 1000;
  auto x = randomFloats(n, 1), y = randomFloats(n, 2);
  float* dx = module_.memory().alloc(x);
  float* y1 = module_.memory().alloc(y);
  float* y2 = module_.memory().alloc(y);
  float a = 1.75f;
  ASSERT_THAT(module_.launch("saxpy", {4}, {256}, Params().add(n).add(a).add(dx).add(y1)), IsOk());
  Validator v = validator({allow(dx, n, kLoadBit), allow(y2, n, kLoadBit | kStoreBit)});
  ASSERT_THAT(twins_.launch("saxpy__phos_twin", {4}, {256},
                             withValidator(Params().add(n).add(a).add(dx).add(y2), v)),
              IsOk());
  expectSameBits(y1, y2, n);
  EXPECT_EQ(v.report->count, 0u);
}

TEST_P(TwinEquivalence, SaxpyReportsEveryStoreToAReadOnlyRangeAndCountsPastCapacity) {
  load(instrument::TwinMode::kCheckpoint);
  const int n = 100;
  auto x = randomFloats(n, 3), y = randomFloats(n, 4);
  float* dx = module_.memory().alloc(x);
  float* y1 = module_.memory().alloc(y);
  float* y2 = module_.memory().alloc(y);
  float a = -0.5f;
  ASSERT_THAT(module_.launch("saxpy", {1}, {128}, Params().add(n).add(a).add(dx).add(y1)), IsOk());
  Validator v = validator({allow(dx, n, kLoadBit), allow(y2, n, kLoadBit)}, 8);
  ASSERT_THAT(twins_.launch("saxpy__phos_twin", {1}, {128},
                             withValidator(Params().add(n).add(a).add(dx).add(y2), v)),
              IsOk());
  expectSameBits(y1, y2, n);  // a violation is reported, never prevented
  EXPECT_EQ(v.report->count, static_cast<uint32_t>(n));
  auto [fi, index] = site("saxpy", ptx::Opcode::kSt, ptx::StateSpace::kGlobal);
  for (const ReportEntry& e : v.entries()) {
    EXPECT_GE(e.address, reinterpret_cast<uint64_t>(y2));
    EXPECT_LT(e.address, reinterpret_cast<uint64_t>(y2 + n));
    EXPECT_EQ(e.address % 4, reinterpret_cast<uint64_t>(y2) % 4);
    EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kStore));
    EXPECT_EQ(e.size, 4u);
    EXPECT_EQ(e.function, fi);
    EXPECT_EQ(e.instruction, index);
  }
}

TEST_P(TwinEquivalence, AtomicHistogramComputesTheSame) {
  load(instrument::TwinMode::kCheckpoint);
  const int n = 3000, nbins = 37;
  std::vector<unsigned> in(n);
  std::mt19937 rng(5);
  for (auto& e : in) e = rng();
  unsigned* din = module_.memory().alloc(in);
  unsigned* b1 = module_.memory().alloc<unsigned>(nbins);
  unsigned* b2 = module_.memory().alloc<unsigned>(nbins);
  ASSERT_THAT(module_.launch("histogram", {3}, {128}, Params().add(din).add(n).add(b1).add(nbins)),
              IsOk());
  Validator v = validator({allow(din, n, kLoadBit), allow(b2, nbins, kLoadBit | kStoreBit)});
  ASSERT_THAT(twins_.launch("histogram__phos_twin", {3}, {128},
                             withValidator(Params().add(din).add(n).add(b2).add(nbins), v)),
              IsOk());
  expectSameBits(b1, b2, nbins);
  EXPECT_EQ(v.report->count, 0u);

  // Bins readable but not writable: every atomic is reported as one.
  unsigned* b3 = module_.memory().alloc<unsigned>(nbins);
  Validator denied = validator({allow(din, n, kLoadBit), allow(b3, nbins, kLoadBit)}, 4);
  ASSERT_THAT(twins_.launch("histogram__phos_twin", {3}, {128},
                             withValidator(Params().add(din).add(n).add(b3).add(nbins), denied)),
              IsOk());
  expectSameBits(b1, b3, nbins);
  EXPECT_EQ(denied.report->count, static_cast<uint32_t>(n));
  auto [fi, index] = site("histogram", ptx::Opcode::kAtom, ptx::StateSpace::kGlobal);
  for (const ReportEntry& e : denied.entries()) {
    EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kAtomic));
    EXPECT_EQ(e.size, 4u);
    EXPECT_EQ(e.function, fi);
    EXPECT_EQ(e.instruction, index);
  }
}

TEST_P(TwinEquivalence, StoreInADeviceFunctionIsCheckedThere) {
  load(instrument::TwinMode::kCheckpoint);
  const int n = 300;
  auto in = randomFloats(n, 6);
  float* din = module_.memory().alloc(in);
  float* o1 = module_.memory().alloc<float>(n);
  float* o2 = module_.memory().alloc<float>(n);
  float s = 3.25f;
  ASSERT_THAT(module_.launch("scale_via_device_function", {2}, {256},
                             Params().add(din).add(o1).add(n).add(s)),
              IsOk());
  // out is missing from the table: the stores of putScaled are reported.
  Validator v = validator({allow(din, n, kLoadBit)}, 512);
  ASSERT_THAT(twins_.launch("scale_via_device_function__phos_twin", {2}, {256},
                             withValidator(Params().add(din).add(o2).add(n).add(s), v)),
              IsOk());
  expectSameBits(o1, o2, n);
  ASSERT_EQ(v.report->count, static_cast<uint32_t>(n));
  auto [fi, index] = site(functionNamed("putScaled"), ptx::Opcode::kSt, ptx::StateSpace::kGlobal);
  std::vector<uint64_t> addresses;
  for (const ReportEntry& e : v.entries()) {
    EXPECT_EQ(e.function, fi);
    EXPECT_EQ(e.instruction, index);
    EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kStore));
    EXPECT_EQ(e.size, 4u);
    addresses.push_back(e.address);
  }
  std::sort(addresses.begin(), addresses.end());
  for (int i = 0; i < n; ++i) EXPECT_EQ(addresses[i], reinterpret_cast<uint64_t>(o2 + i));
}

TEST_P(TwinEquivalence, GenericStoreToSharedMemoryIsNotReported) {
  load(instrument::TwinMode::kCheckpoint);
  const int blocks = 3, threads = 128, n = blocks * threads;
  auto in = randomFloats(n, 7);
  float* din = module_.memory().alloc(in);
  float* o1 = module_.memory().alloc<float>(n);
  float* o2 = module_.memory().alloc<float>(n);
  int viaShared = 1;
  ASSERT_THAT(module_.launch("reverse_through_shared", {blocks}, {threads},
                             Params().add(din).add(o1).add(viaShared)),
              IsOk());
  Validator v = validator({allow(din, n, kLoadBit), allow(o2, n, kStoreBit)});
  ASSERT_THAT(twins_.launch("reverse_through_shared__phos_twin", {blocks}, {threads},
                             withValidator(Params().add(din).add(o2).add(viaShared), v)),
              IsOk());
  expectSameBits(o1, o2, n);
  EXPECT_EQ(v.report->count, 0u);
  for (int b = 0; b < blocks; ++b) {
    for (int t = 0; t < threads; ++t) {
      ASSERT_EQ(o2[b * threads + t], in[b * threads + threads - 1 - t]);
    }
  }
}

TEST_P(TwinEquivalence, GenericStoreToGlobalMemoryIsReported) {
  load(instrument::TwinMode::kCheckpoint);
  const int threads = 64;
  auto in = randomFloats(threads, 12);
  float* din = module_.memory().alloc(in);
  float* out = module_.memory().alloc<float>(threads);
  int viaShared = 0;
  Validator v = validator({allow(din, threads, kLoadBit)}, threads);
  ASSERT_THAT(twins_.launch("reverse_through_shared__phos_twin", {1}, {threads},
                             withValidator(Params().add(din).add(out).add(viaShared), v)),
              IsOk());
  expectSameBits(in.data(), out, threads);
  ASSERT_EQ(v.report->count, static_cast<uint32_t>(threads));
  auto [fi, index] = site(functionNamed("storeGeneric"), ptx::Opcode::kSt, ptx::StateSpace::kNone);
  for (const ReportEntry& e : v.entries()) {
    EXPECT_EQ(e.function, fi);
    EXPECT_EQ(e.instruction, index);
    EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kStore));
  }
}

TEST_P(TwinEquivalence, StoreOutsideTheTableIsReportedWithAddressKindIndexAndSize) {
  load(instrument::TwinMode::kCheckpoint);
  const int n = 32, size = 64;
  std::vector<int> index(n);
  for (int i = 0; i < n; ++i) index[i] = 2 * i;
  int* dindex = module_.memory().alloc(index);
  int* o1 = module_.memory().alloc<int>(size);
  int* o2 = module_.memory().alloc<int>(size);
  ASSERT_THAT(module_.launch("scatter", {1}, {64}, Params().add(o1).add(dindex).add(n)), IsOk());
  // Only the first half of out is speculated as written.
  Validator v = validator({allow(dindex, n, kLoadBit), allow(o2, size / 2, kStoreBit)});
  ASSERT_THAT(twins_.launch("scatter__phos_twin", {1}, {64},
                             withValidator(Params().add(o2).add(dindex).add(n), v)),
              IsOk());
  expectSameBits(o1, o2, size);
  ASSERT_EQ(v.report->count, 16u);
  auto [fi, inst] = site("scatter", ptx::Opcode::kSt, ptx::StateSpace::kGlobal);
  std::vector<uint64_t> addresses;
  for (const ReportEntry& e : v.entries()) {
    EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kStore));
    EXPECT_EQ(e.size, 4u);
    EXPECT_EQ(e.function, fi);
    EXPECT_EQ(e.instruction, inst);
    addresses.push_back(e.address);
  }
  std::sort(addresses.begin(), addresses.end());
  for (int k = 0; k < 16; ++k) {
    EXPECT_EQ(addresses[k], reinterpret_cast<uint64_t>(o2 + 2 * (16 + k)));
  }
}

TEST_P(TwinEquivalence, AccessSpanningAdjacentRangesIsAllowed) {
  load(instrument::TwinMode::kCheckpoint);
  const int n = 64;
  auto x = randomFloats(n, 8), y = randomFloats(n, 9);
  float* dx = module_.memory().alloc(x);
  float* y2 = module_.memory().alloc(y);
  float a = 2.0f;
  // y split in three adjacent ranges, the first split inside element 10: the
  // store of y[10] spans two entries and is still allowed.
  uint64_t yb = reinterpret_cast<uint64_t>(y2);
  Validator v = validator({allow(dx, n, kLoadBit),
                           {yb, yb + 42, kLoadBit | kStoreBit, 0},
                           {yb + 42, yb + 160, kLoadBit | kStoreBit, 0},
                           {yb + 160, yb + 4 * n, kLoadBit | kStoreBit, 0}});
  ASSERT_THAT(twins_.launch("saxpy__phos_twin", {1}, {64},
                             withValidator(Params().add(n).add(a).add(dx).add(y2), v)),
              IsOk());
  EXPECT_EQ(v.report->count, 0u);
}

TEST_P(TwinEquivalence, RestoreTwinReportsLoadsOfRangesNotYetReadable) {
  load(instrument::TwinMode::kRestore);
  const int n = 50;
  auto x = randomFloats(n, 10), y = randomFloats(n, 11);
  float* dx = module_.memory().alloc(x);
  float* y1 = module_.memory().alloc(y);
  float* y2 = module_.memory().alloc(y);
  float a = 0.25f;
  ASSERT_THAT(module_.launch("saxpy", {1}, {64}, Params().add(n).add(a).add(dx).add(y1)), IsOk());
  // x not readable yet: its loads are reported; y is fully available.
  Validator v = validator({allow(y2, n, kLoadBit | kStoreBit)}, 128);
  ASSERT_THAT(twins_.launch("saxpy__phos_twin", {1}, {64},
                             withValidator(Params().add(n).add(a).add(dx).add(y2), v)),
              IsOk());
  expectSameBits(y1, y2, n);
  ASSERT_EQ(v.report->count, static_cast<uint32_t>(n));
  auto [fi, first] = site("saxpy", ptx::Opcode::kLd, ptx::StateSpace::kGlobal);
  for (const ReportEntry& e : v.entries()) {
    EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kLoad));
    EXPECT_EQ(e.instruction, first);  // the load of x comes first
    EXPECT_GE(e.address, reinterpret_cast<uint64_t>(dx));
    EXPECT_LT(e.address, reinterpret_cast<uint64_t>(dx + n));
  }
}

// Asynchronous copies read global memory as loads do: a restore twin of
// kernels/barrier.cu's sm_90 kernels (a cuda::memcpy_async of 4-byte pieces,
// one of a 16-byte aligned size that is a cp.async.bulk, and a bulk copy back
// to global memory) computes what the kernel computes, and reports the
// copies' reads of memory not yet readable; a checkpoint twin reports the
// bulk copy's write to memory it may not write.
TEST_P(TwinEquivalence, AsyncAndBulkCopiesAreCheckedAsTheGlobalAccessesTheyAre) {
  load(instrument::TwinMode::kRestore, "barrier_sm90");
  std::vector<int> in(1536);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i * 13 % 1000) - 500;
  int* din = module_.memory().alloc(in);
  const int n = static_cast<int>(in.size());
  for (const char* kernel : {"async_copy_sum", "bulk_copies"}) {
    SCOPED_TRACE(kernel);
    const bool bulk = std::string(kernel) == "bulk_copies";
    auto params = [&](int* out) { return bulk ? Params().add(din).add(out) : Params().add(din).add(out).add(n); };
    int* expected = module_.memory().alloc<int>(256);
    ASSERT_THAT(module_.launch(kernel, {1}, {256}, params(expected)), IsOk());
    int* allowed = module_.memory().alloc<int>(256);
    Validator all = validator({allow(din, in.size(), kLoadBit), allow(allowed, 256, kLoadBit | kStoreBit)});
    ASSERT_THAT(twins_.launch(std::string(kernel) + "__phos_twin", {1}, {256}, withValidator(params(allowed), all)),
                IsOk());
    expectSameBits(expected, allowed, 256);
    EXPECT_EQ(all.report->count, 0u);
    int* unread = module_.memory().alloc<int>(256);
    Validator none = validator({allow(unread, 256, kLoadBit | kStoreBit)}, 4096);
    ASSERT_THAT(twins_.launch(std::string(kernel) + "__phos_twin", {1}, {256}, withValidator(params(unread), none)),
                IsOk());
    expectSameBits(expected, unread, 256);
    ASSERT_GT(none.report->count, 0u);
    for (const ReportEntry& e : none.entries()) {
      EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kLoad));
      EXPECT_GE(e.address, reinterpret_cast<uint64_t>(din));
      EXPECT_LT(e.address, reinterpret_cast<uint64_t>(din + in.size()));
    }
  }
}

TEST_P(TwinEquivalence, ABulkCopyToGlobalMemoryIsCheckedAsAStore) {
  load(instrument::TwinMode::kCheckpoint, "barrier_sm90");
  std::vector<int> in(256, 3);
  int* din = module_.memory().alloc(in);
  int* out = module_.memory().alloc<int>(256);
  Validator readOnly = validator({allow(din, in.size(), kLoadBit), allow(out, 256, kLoadBit)});
  ASSERT_THAT(twins_.launch("bulk_copies__phos_twin", {1}, {256}, withValidator(Params().add(din).add(out), readOnly)),
              IsOk());
  ASSERT_EQ(readOnly.report->count, 1u);  // one bulk copy of the whole tile
  const ReportEntry& e = readOnly.entry(0);
  EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kStore));
  EXPECT_EQ(e.address, reinterpret_cast<uint64_t>(out));
  EXPECT_EQ(e.size, 1024u);
}

// The twins read and write the program's own module variables: a pointer a
// twin stores is the one the program's kernels use, a twin's atomics count in
// the program's counter, and __constant__ data is read where the program put it.
TEST_P(TwinEquivalence, TwinsShareTheProgramsModuleVariables) {
  load(instrument::TwinMode::kCheckpoint);
  const int n = 300;
  auto in = randomFloats(n, 13);
  std::vector<float> weights = {0.5f, -1.25f, 2.0f, 3.5f, -0.75f, 1.0f, 8.0f, -4.0f};
  std::memcpy(variable<float>("c_weights"), weights.data(), sizeof(float) * weights.size());
  *variable<int>("c_count") = n;
  float* din = module_.memory().alloc(in);
  float* y1 = module_.memory().alloc<float>(n);
  float* y2 = module_.memory().alloc<float>(n);
  ASSERT_THAT(module_.launch("set_target", {1}, {1}, Params().add(y1)), IsOk());
  ASSERT_THAT(module_.launch("weigh_into_target", {2}, {256}, Params().add(din)), IsOk());
  ASSERT_EQ(*variable<unsigned>("g_hits"), static_cast<unsigned>(n));

  // The twin of set_target stores into the program's g_target...
  float** target = variable<float*>("g_target");
  uint64_t targetAddress = reinterpret_cast<uint64_t>(target);
  Validator set = validator({{targetAddress, targetAddress + sizeof(float*), kLoadBit | kStoreBit, 0}});
  ASSERT_THAT(twins_.launch("set_target__phos_twin", {1}, {1}, withValidator(Params().add(y2), set)), IsOk());
  EXPECT_EQ(*target, y2);
  EXPECT_EQ(set.report->count, 0u);
  // ...which the twin of weigh_into_target stores through, counting in the
  // program's g_hits, weighing with the program's c_weights.
  unsigned* hits = variable<unsigned>("g_hits");
  Validator weigh =
      validator({allow(din, n, kLoadBit), allow(y2, n, kLoadBit | kStoreBit), allow(hits, 1, kLoadBit | kStoreBit)});
  ASSERT_THAT(twins_.launch("weigh_into_target__phos_twin", {2}, {256}, withValidator(Params().add(din), weigh)),
              IsOk());
  expectSameBits(y1, y2, n);
  EXPECT_EQ(*hits, 2u * n);
  EXPECT_EQ(weigh.report->count, 0u);
  // The original, run after the twin, sees the pointer the twin stored.
  float* y3 = module_.memory().alloc<float>(n);
  *target = y3;
  ASSERT_THAT(module_.launch("weigh_into_target", {2}, {256}, Params().add(din)), IsOk());
  expectSameBits(y1, y3, n);
}

TEST_P(TwinEquivalence, AnAtomicOnAModuleCounterOutsideTheTableIsReportedAtTheProgramsAddress) {
  load(instrument::TwinMode::kCheckpoint);
  const int n = 40;
  auto in = randomFloats(n, 14);
  std::vector<float> weights(8, 1.0f);
  std::memcpy(variable<float>("c_weights"), weights.data(), sizeof(float) * weights.size());
  *variable<int>("c_count") = n;
  float* din = module_.memory().alloc(in);
  float* y = module_.memory().alloc<float>(n);
  *variable<float*>("g_target") = y;
  unsigned* hits = variable<unsigned>("g_hits");
  Validator v = validator({allow(din, n, kLoadBit), allow(y, n, kLoadBit | kStoreBit)}, 64);
  ASSERT_THAT(twins_.launch("weigh_into_target__phos_twin", {1}, {64}, withValidator(Params().add(din), v)), IsOk());
  expectSameBits(in.data(), y, n);
  EXPECT_EQ(*hits, static_cast<unsigned>(n));
  ASSERT_EQ(v.report->count, static_cast<uint32_t>(n));
  auto [fi, index] = site("weigh_into_target", ptx::Opcode::kAtom, ptx::StateSpace::kGlobal);
  for (const ReportEntry& e : v.entries()) {
    EXPECT_EQ(e.address, reinterpret_cast<uint64_t>(hits));
    EXPECT_EQ(e.kind, static_cast<uint32_t>(ViolationKind::kAtomic));
    EXPECT_EQ(e.function, fi);
    EXPECT_EQ(e.instruction, index);
  }
}

// vgpu runs calls to the range check natively (Builtin::kPhosCheck); with
// PHOS_VGPU_INTERPRET_CHECK=1 it interprets the check's PTX, as a GPU runs it.
// Both must leave the same report for any access: inside, across adjacent
// ranges, across gaps, lacking a bit, generic shared or local addresses, past
// the top of the address space, and more violations than the report holds.
struct Probe {
  uint64_t address;
  uint32_t size, flags, instruction, function;
};
static_assert(sizeof(Probe) == 24);

std::string checkProbeModule() {
  return std::string(".version 8.0\n.target sm_80\n.address_size 64\n") + std::string(instrument::kCheckFunctionText) +
         R"(
.visible .entry probe(.param .u64 probe_probes, .param .u32 probe_n, .param .u64 probe_ranges,
                      .param .u32 probe_count, .param .u64 probe_report)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<10>;
	.reg .b64 	%rd<8>;
	ld.param.u64 	%rd1, [probe_probes];
	ld.param.u32 	%r1, [probe_n];
	ld.param.u64 	%rd2, [probe_ranges];
	ld.param.u32 	%r2, [probe_count];
	ld.param.u64 	%rd3, [probe_report];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r3, %r3, %r4, %r5;
	setp.ge.u32 	%p1, %r3, %r1;
	@%p1 bra 	$probe_done;
	mul.wide.u32 	%rd4, %r3, 24;
	add.s64 	%rd4, %rd1, %rd4;
	ld.global.u64 	%rd5, [%rd4];
	ld.global.u32 	%r6, [%rd4+8];
	ld.global.u32 	%r7, [%rd4+12];
	ld.global.u32 	%r8, [%rd4+16];
	ld.global.u32 	%r9, [%rd4+20];
	call 	__phos_check, (%rd5, %r6, %r7, %r8, %r9, %rd2, %r2, %rd3);
$probe_done:
	ret;
}
)";
}

TEST_P(TwinEquivalence, TheNativeRangeCheckReportsWhatItsPtxReports) {
  // Ranges 0x1000 apart from 0x10000, 0x800 long: every third one adjacent to
  // the next (with other bits), the others followed by a gap.
  std::vector<RangeEntry> ranges;
  std::mt19937 rng(GetParam() * 7919u + 5u);
  for (uint64_t i = 0; i < 40; ++i) {
    const uint64_t begin = 0x10000 + i * 0x1000;
    const uint64_t end = begin + (i % 3 == 0 ? 0x1000 : 0x800);
    ranges.push_back({begin, end, static_cast<uint32_t>(1 + rng() % 3), 0});
  }
  std::vector<Probe> probes;
  constexpr uint64_t kShared = 0x0001'0000'0000'0000ull, kLocal = 0x0002'0000'0000'0000ull;
  for (uint32_t i = 0; i < 1500; ++i) {
    uint64_t address = 0xF000 + rng() % (0x1000 * 42);
    auto flags = static_cast<uint32_t>(1 + rng() % 3);   // kind
    flags |= static_cast<uint32_t>(1 + rng() % 3) << 4;  // bits needed
    if (rng() % 4 == 0) flags |= instrument::kCheckFlagGlobalSpace;
    if (rng() % 4 == 0) {
      flags |= instrument::kCheckFlagGeneric;
      if (rng() % 2 == 0) address += rng() % 2 == 0 ? kShared : kLocal;
    }
    probes.push_back({address, static_cast<uint32_t>(1 + rng() % 32), flags, static_cast<uint32_t>(rng() % 1000),
                      static_cast<uint32_t>(rng() % 50)});
  }
  for (const RangeEntry& r : ranges) {  // at each edge of each range
    for (uint64_t at : {r.begin - 1, r.begin, r.end - 4, r.end - 3}) {
      probes.push_back({at, 4, 1u | (static_cast<uint32_t>(1 + rng() % 3) << 4), static_cast<uint32_t>(at % 997), 7});
    }
  }
  probes.push_back({0x10000 + 0x1000 - 4, 8, 1u | (1u << 4), 1, 2});   // across two adjacent ranges
  probes.push_back({0xFFFF'FFFF'FFFF'FFF0ull, 32, 1u | (1u << 4), 3, 4});  // wraps past the top

  auto run = [&](bool interpret, uint32_t capacity, uint64_t* laneInstructions) {
    if (interpret) setenv("PHOS_VGPU_INTERPRET_CHECK", "1", 1);
    Module m;
    Status loaded = m.load(checkProbeModule());
    unsetenv("PHOS_VGPU_INTERPRET_CHECK");
    EXPECT_THAT(loaded, IsOk());
    setWorkerThreads(m.program(), GetParam());
    Probe* dprobes = m.memory().alloc(probes);
    RangeEntry* dranges = m.memory().alloc(ranges);
    std::vector<std::byte> bytes(sizeof(ReportHeader) + capacity * sizeof(ReportEntry));
    auto* report = reinterpret_cast<ReportHeader*>(m.memory().alloc(bytes));
    report->capacity = capacity;
    const uint32_t n = static_cast<uint32_t>(probes.size());
    EXPECT_THAT(m.launch("probe", {(n + 127) / 128}, {128},
                         Params().add(dprobes).add(n).add(dranges).add(static_cast<uint32_t>(ranges.size())).add(report)),
                IsOk());
    if (laneInstructions != nullptr) *laneInstructions = lastLaunchStats(m.program()).laneInstructions;
    std::vector<ReportEntry> entries(reinterpret_cast<ReportEntry*>(report + 1),
                                     reinterpret_cast<ReportEntry*>(report + 1) + std::min(report->count, capacity));
    // The order of the entries is the order of the atomics, which the
    // divergent paths of a warp do not fix: compared as sets.
    std::sort(entries.begin(), entries.end(), [](const ReportEntry& a, const ReportEntry& b) {
      return std::memcmp(&a, &b, sizeof(ReportEntry)) < 0;
    });
    return std::pair{report->count, entries};
  };
  auto same = [](const ReportEntry& x, const ReportEntry& y) { return std::memcmp(&x, &y, sizeof(ReportEntry)) == 0; };
  const auto all = static_cast<uint32_t>(probes.size());
  uint64_t nativeInstructions = 0, interpretedInstructions = 0;
  auto [nativeCount, native] = run(false, all, &nativeInstructions);
  auto [interpretedCount, interpreted] = run(true, all, &interpretedInstructions);
  // Some accesses pass, some fail.
  EXPECT_GT(interpretedCount, 300u);
  EXPECT_LT(interpretedCount, all);
  EXPECT_EQ(nativeCount, interpretedCount);
  ASSERT_EQ(native.size(), interpreted.size());
  EXPECT_TRUE(std::equal(native.begin(), native.end(), interpreted.begin(), same));
  // A report too small: the count goes on, and each entry written is a violation.
  auto [overflowCount, overflow] = run(false, 8, nullptr);
  EXPECT_EQ(overflowCount, interpretedCount);
  ASSERT_EQ(overflow.size(), 8u);
  for (const ReportEntry& e : overflow) {
    EXPECT_TRUE(std::any_of(interpreted.begin(), interpreted.end(), [&](const ReportEntry& x) { return same(x, e); }));
  }
  EXPECT_LT(nativeInstructions * 3, interpretedInstructions) << "the native check was not used";
}

// A function named like the range check with another body is not PhOS's: it
// runs as written (here, one that counts each violation twice).
TEST(NativeRangeCheck, AFunctionOfTheSameNameWithAnotherBodyRunsAsWritten) {
  std::string text = checkProbeModule();
  const std::string once = "atom.global.add.u32 \t%r15, [%rd12], 1;";
  const size_t at = text.find(once);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, once.size(), "atom.global.add.u32 \t%r15, [%rd12], 2;");
  Module m;
  ASSERT_THAT(m.load(text), IsOk());
  std::vector<RangeEntry> ranges = {{0x10000, 0x10100, 3, 0}};
  std::vector<Probe> probes = {{0x10000, 4, 2u | (2u << 4), 0, 0}, {0x20000, 4, 2u | (2u << 4), 1, 0},
                               {0x30000, 4, 1u | (1u << 4), 2, 0}};
  Probe* dprobes = m.memory().alloc(probes);
  RangeEntry* dranges = m.memory().alloc(ranges);
  std::vector<std::byte> bytes(sizeof(ReportHeader) + 64 * sizeof(ReportEntry));
  auto* report = reinterpret_cast<ReportHeader*>(m.memory().alloc(bytes));
  report->capacity = 64;
  ASSERT_THAT(m.launch("probe", {1}, {32}, Params().add(dprobes).add(3u).add(dranges).add(1u).add(report)), IsOk());
  EXPECT_EQ(report->count, 4u);  // two violations, each counted twice
}

// Beside every module of the engine's corpus that loads, its twin module loads
// too, in both modes and as phosd builds it, with its address table filled (the
// daemon hands twin modules to the vgpu driver).
TEST(TwinModules, LoadWhereverTheOriginalLoads) {
  size_t loaded = 0;
  for (const char* src :
       {"saxpy", "matmul", "reduce", "normalize", "adam", "atomics", "half_bf16", "misc"}) {
    for (const char* variant : {"O3", "G", "lineinfo"}) {
      std::string name = std::string("corpus_") + src + "_" + variant;
      SCOPED_TRACE(name);
      std::string text = readFile(ptxPath(name));
      if (text.empty()) continue;
      Module plain;
      if (!plain.load(text).isOk()) continue;
      Result<ptx::Module> original = ptx::parseModule(text, name);
      ASSERT_THAT(original, IsOk());
      for (instrument::TwinOptions options : {instrument::TwinOptions{instrument::TwinMode::kCheckpoint},
                                              instrument::TwinOptions{instrument::TwinMode::kRestore},
                                              instrument::TwinOptions{instrument::TwinMode::kCheckpoint, true}}) {
        Module twins(plain.memory());
        EXPECT_THAT(loadBeside(*original, plain, twins, options), IsOk());
      }
      ++loaded;
    }
  }
  EXPECT_GT(loaded, 0u);
}

}  // namespace
}  // namespace phos::vgpu::engine::testing
