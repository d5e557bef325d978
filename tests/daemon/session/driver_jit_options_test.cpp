// SPDX-License-Identifier: Apache-2.0
// DriverJitOptions: what phosd makes of a request's JIT options (untrusted:
// the application writes them) before the driver sees them, and what it
// sends back.
#include "session/driver_jit_options.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace phos::daemon {
namespace {

struct Wire {
  std::vector<int32_t> options;
  std::vector<uint64_t> values;
  ipc::JitOptions encoded() const {
    return {ipc::Blob::of(options.data(), options.size() * sizeof(int32_t)),
            ipc::Blob::of(values.data(), values.size() * sizeof(uint64_t))};
  }
};

uint64_t valueOf(void* v) {
  uint64_t out = 0;
  std::memcpy(&out, &v, sizeof(v));
  return out;
}

TEST(DriverJitOptions, ScalarsReachTheDriverAsTheyCame) {
  Wire w{{CU_JIT_MAX_REGISTERS, CU_JIT_OPTIMIZATION_LEVEL}, {16, 2}};
  DriverJitOptions o;
  ASSERT_TRUE(o.decode(w.encoded()));
  ASSERT_EQ(o.count(), 2U);
  EXPECT_EQ(o.options()[0], CU_JIT_MAX_REGISTERS);
  EXPECT_EQ(valueOf(o.values()[0]), 16U);
  EXPECT_EQ(valueOf(o.values()[1]), 2U);
}

TEST(DriverJitOptions, LogBuffersArePhosdsOwnAndNeverLargerThanWhatComesBack) {
  // The application's buffer address (0xdead0000) must never reach the driver.
  Wire w{{CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES}, {0xdead0000, 1u << 30}};
  DriverJitOptions o;
  ASSERT_TRUE(o.decode(w.encoded()));
  void** values = o.values();
  EXPECT_NE(valueOf(values[0]), 0xdead0000U);
  EXPECT_EQ(valueOf(values[1]), ipc::kMaxJitLogBytes);
  // What the driver writes there comes back as text, cut at the terminator.
  std::strcpy(static_cast<char*>(values[0]), "ptxas: error");
  values[1] = reinterpret_cast<void*>(uintptr_t{13});
  ipc::JitOutputs out = o.outputs();
  EXPECT_EQ(out.errorLog.view(), "ptxas: error");
  EXPECT_TRUE(out.infoLog.view().empty());
  std::vector<uint64_t> after;
  ASSERT_TRUE(out.values.copyTo(&after, 2));
  EXPECT_EQ(after[0], 0U) << "phosd's buffer address means nothing to the shim";
  EXPECT_EQ(after[1], 13U);
  // given() is what a restore makes the state again from: no address in it.
  EXPECT_EQ(o.given()[0].second, 0U);
  EXPECT_EQ(o.given()[1].second, 1u << 30);
}

TEST(DriverJitOptions, NothingComesBackBeforeTheDriverHadTheValues) {
  Wire w{{CU_JIT_WALL_TIME}, {7}};
  DriverJitOptions o;
  ASSERT_TRUE(o.decode(w.encoded()));
  EXPECT_EQ(o.outputs().values.size(), 0U);
  o.values();
  EXPECT_EQ(o.outputs().values.size(), sizeof(uint64_t));
}

TEST(DriverJitOptions, MalformedListsAreRefused) {
  DriverJitOptions o;
  Wire lengths{{CU_JIT_MAX_REGISTERS, CU_JIT_OPTIMIZATION_LEVEL}, {16}};
  EXPECT_FALSE(o.decode(lengths.encoded()));
  Wire pointers{{CU_JIT_GLOBAL_SYMBOL_NAMES}, {0x1000}};
  EXPECT_FALSE(o.decode(pointers.encoded()));
  Wire unknown{{CU_JIT_NUM_OPTIONS + 5}, {0}};
  EXPECT_FALSE(o.decode(unknown.encoded()));
  Wire negative{{-1}, {0}};
  EXPECT_FALSE(o.decode(negative.encoded()));
  Wire many;
  for (uint32_t i = 0; i <= ipc::kMaxJitOptions; ++i) {
    many.options.push_back(CU_JIT_MAX_REGISTERS);
    many.values.push_back(16);
  }
  EXPECT_FALSE(o.decode(many.encoded()));
  const char odd[3] = {};
  EXPECT_FALSE(o.decode({ipc::Blob::of(odd, 3), ipc::Blob::of(odd, 3)}));
}

TEST(DriverJitOptions, ARestoreLoadsWithTheOptionsThatShapeCodeOnly) {
  Wire w{{CU_JIT_MAX_REGISTERS, CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
          CU_JIT_WALL_TIME, CU_JIT_THREADS_PER_BLOCK},
         {32, 0, 64, 0, 128}};
  DriverJitOptions o;
  ASSERT_TRUE(o.decode(w.encoded()));
  const auto shaping = o.codeShaping();
  ASSERT_EQ(shaping.size(), 2U);
  EXPECT_EQ(shaping[0], std::make_pair(static_cast<int32_t>(CU_JIT_MAX_REGISTERS), uint64_t{32}));
  EXPECT_EQ(shaping[1],
            std::make_pair(static_cast<int32_t>(CU_JIT_THREADS_PER_BLOCK), uint64_t{128}));
  DriverJitOptions again = DriverJitOptions::of(shaping);
  EXPECT_EQ(again.count(), 2U);
}

}  // namespace
}  // namespace phos::daemon
