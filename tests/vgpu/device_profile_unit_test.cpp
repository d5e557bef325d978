// SPDX-License-Identifier: Apache-2.0
// vgpu's device profiles and their configuration (vgpu/driver/device_profile.cpp),
// without the driver: which compute capabilities PHOS_VGPU_CC and the JSON
// configuration accept, and what each profile's attributes are.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "device_profile.h"
#include "status_matchers.h"

namespace phos::vgpu {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

int attribute(const PlatformConfig& platform, CUdevice_attribute a, int ordinal = 0) {
  auto v = deviceAttribute(platform, ordinal, a);
  EXPECT_THAT(v.status(), IsOk());
  return v.isOk() ? *v : -1;
}

// Sets an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST(DeviceProfile, Cc120IsAnRtx5090) {
  auto p = profileFor(12, 0, 0);
  ASSERT_THAT(p.status(), IsOk());
  EXPECT_THAT(p->name, HasSubstr("RTX 5090"));
  PlatformConfig platform;
  platform.devices.push_back(*p);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), 12);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), 0);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), 170);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR), 1536);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR), 32);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR), 102400);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), 101376);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE), 100663296);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH), 512);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_ECC_ENABLED), 0);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO), 64);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH), 1);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT), 4);
}

TEST(DeviceProfile, OlderProfilesKeepTheirValues) {
  PlatformConfig platform;
  for (auto [major, minor] : {std::pair{8, 0}, std::pair{9, 0}}) {
    auto p = profileFor(major, minor, static_cast<int>(platform.devices.size()));
    ASSERT_THAT(p.status(), IsOk());
    platform.devices.push_back(*p);
  }
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 0), 2048);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 1), 2048);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0), 1);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 1), 2);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID, 0), 0x20b010de);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID, 1), 0x233010de);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 0), 0);
  EXPECT_EQ(attribute(platform, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1), 1);
}

TEST(DeviceProfile, UnknownComputeCapabilityNamesTheSupportedOnes) {
  EXPECT_THAT(profileFor(12, 1, 0).status(),
              StatusIs(Code::kInvalidArgument, HasSubstr("(8.0, 9.0 or 12.0)")));
  ScopedEnv cc("PHOS_VGPU_CC", "12.1");
  EXPECT_THAT(loadPlatformConfig().status(),
              StatusIs(Code::kInvalidArgument,
                       HasSubstr("compute capability '12.1' is not supported (8.0, 9.0 or 12.0)")));
}

// Without PHOS_VGPU_CC or "cc", devices get the newest profile: the only one
// that runs libraries shipping PTX for compute_120 alone.
TEST(DeviceProfile, DefaultIsCc120) {
  unsetenv("PHOS_VGPU_CC");
  unsetenv("PHOS_VGPU_CONFIG");
  auto platform = loadPlatformConfig();
  ASSERT_THAT(platform.status(), IsOk());
  ASSERT_EQ(platform->devices.size(), 1u);
  EXPECT_EQ(platform->devices[0].ccMajor, 12);
  EXPECT_EQ(platform->devices[0].ccMinor, 0);
  auto json = parsePlatformConfig(R"({"devices": [{"memory": 1073741824}]})");
  ASSERT_THAT(json.status(), IsOk());
  EXPECT_EQ(json->devices[0].ccMajor, 12);
  EXPECT_THAT(json->devices[0].name, HasSubstr("RTX 5090"));
}

TEST(DeviceProfile, EnvironmentSelectsCc120) {
  ScopedEnv cc("PHOS_VGPU_CC", "12.0");
  ScopedEnv devices("PHOS_VGPU_DEVICES", "2");
  auto platform = loadPlatformConfig();
  ASSERT_THAT(platform.status(), IsOk());
  ASSERT_EQ(platform->devices.size(), 2u);
  for (const DeviceProfile& d : platform->devices) {
    EXPECT_EQ(d.ccMajor, 12);
    EXPECT_EQ(d.ccMinor, 0);
    EXPECT_EQ(d.maxThreadsPerMultiprocessor, 1536);
  }
}

TEST(DeviceProfile, JsonConfigurationMixesProfiles) {
  auto platform = parsePlatformConfig(
      R"({"devices": [{"cc": "12.0", "memory": 1073741824}, {"cc": "8.0"}, {"cc": "9.0", "name": "big one"}]})");
  ASSERT_THAT(platform.status(), IsOk());
  ASSERT_EQ(platform->devices.size(), 3u);
  EXPECT_EQ(platform->devices[0].ccMajor, 12);
  EXPECT_EQ(platform->devices[0].totalMemory, std::size_t{1} << 30);
  EXPECT_EQ(platform->devices[0].multiprocessors, 170);
  EXPECT_EQ(platform->devices[1].ccMajor, 8);
  EXPECT_EQ(platform->devices[2].name, "big one");
  EXPECT_THAT(parsePlatformConfig(R"({"devices": [{"cc": "7.5"}]})").status(),
              StatusIs(Code::kInvalidArgument, HasSubstr("'7.5' is not supported (8.0, 9.0 or 12.0)")));
  EXPECT_THAT(parsePlatformConfig(R"({"devices": [{"cc": 12.0}]})").status(),
              StatusIs(Code::kInvalidArgument, HasSubstr("'cc' must be a string")));
}

}  // namespace
}  // namespace phos::vgpu
