// SPDX-License-Identifier: Apache-2.0
// The worker's context pool (daemon/src/session/context_pool.h) on vgpu: what it holds
// before a session and after. It is not refilled once a session took from it:
// a context created in the background while a session or its restore loads
// modules moves where NVIDIA's driver puts the modules' variables (docs/gpu.md).
#include "session/context_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "session/driver_table.h"

namespace phos::daemon {
namespace {

const DriverTable& vgpu() {
  static DriverTable* driver = [] {
    auto d = DriverTable::load(PHOS_VGPU_DRIVER);
    EXPECT_TRUE(d.isOk()) << d.status().message();
    return d.isOk() ? *d : nullptr;
  }();
  return *driver;
}

int freeOn(const ContextPool& pool, int device) {
  for (const auto& s : pool.stats()) {
    if (s.device == device) return s.free;
  }
  return -1;
}

TEST(ContextPool, HoldsItsContextsBeforeAnySession) {
  ContextPool pool(vgpu(), 2);
  ASSERT_EQ(pool.deviceCount(), 1);
  EXPECT_EQ(freeOn(pool, 0), 2);
  EXPECT_EQ(pool.misses(), 0u);
}

TEST(ContextPool, IsNotRefilledAfterASessionTookFromIt) {
  ContextPool pool(vgpu(), 1);
  auto first = pool.take(0, 0);
  ASSERT_TRUE(first.isOk()) << first.status().message();
  EXPECT_EQ(pool.misses(), 0u);
  // Time for a background refill, had there been one.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(freeOn(pool, 0), 0);
  // The session's next context is created on its call, and counted as a miss.
  auto second = pool.take(0, 0);
  ASSERT_TRUE(second.isOk()) << second.status().message();
  EXPECT_NE(*first, *second);
  EXPECT_EQ(pool.misses(), 1u);
  EXPECT_EQ(freeOn(pool, 0), 0);
  // Contexts the session no longer uses are destroyed, and not replaced.
  pool.retire(*first, 0);
  pool.retire(*second, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(freeOn(pool, 0), 0);
}

TEST(ContextPool, NamesADeviceItDoesNotHave) {
  ContextPool pool(vgpu(), 1);
  auto taken = pool.take(3, 0);
  ASSERT_FALSE(taken.isOk());
  EXPECT_EQ(taken.status().message(), "no device 3");
}

}  // namespace
}  // namespace phos::daemon
