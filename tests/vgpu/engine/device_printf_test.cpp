// SPDX-License-Identifier: Apache-2.0
// Device printf formatting over an in-memory argument buffer.
#include "device_printf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "status_matchers.h"

namespace phos::vgpu::engine::detail {
namespace {

using ::phos::testing::StatusIs;

// A fake device: a few byte buffers at fixed addresses.
struct FakeDevice {
  std::map<uint64_t, std::vector<char>> regions;
  DeviceReader reader() {
    return [this](uint64_t addr, void* out, size_t n) {
      for (auto& [base, bytes] : regions) {
        if (addr >= base && addr + n <= base + bytes.size()) {
          std::memcpy(out, bytes.data() + (addr - base), n);
          return true;
        }
      }
      return false;
    };
  }
  void putString(uint64_t addr, const std::string& s) {
    regions[addr] = std::vector<char>(s.begin(), s.end());
    regions[addr].push_back('\0');
  }
  template <typename T>
  void putArg(std::vector<char>& buf, T v) {
    size_t at = (buf.size() + sizeof(T) - 1) / sizeof(T) * sizeof(T);
    buf.resize(at + sizeof(T));
    std::memcpy(buf.data() + at, &v, sizeof(T));
  }
};

TEST(DevicePrintf, FormatsEveryConversion) {
  FakeDevice dev;
  dev.putString(0x1000, "i=%d u=%u x=%08x c=%c f=%.3f e=%e g=%g s=%s ll=%lld lu=%llu p=%p %%");
  dev.putString(0x2000, "str");
  std::vector<char> args;
  dev.putArg<int32_t>(args, -42);
  dev.putArg<uint32_t>(args, 42u);
  dev.putArg<uint32_t>(args, 0xbeefu);
  dev.putArg<int32_t>(args, 'z');
  dev.putArg<double>(args, 3.14159);
  dev.putArg<double>(args, 1234.5);
  dev.putArg<double>(args, 0.0001);
  dev.putArg<uint64_t>(args, 0x2000);
  dev.putArg<int64_t>(args, -1234567890123LL);
  dev.putArg<uint64_t>(args, 18446744073709551615ull);
  dev.putArg<uint64_t>(args, 0x1234);
  dev.regions[0x3000] = args;
  auto r = formatDevicePrintf(0x1000, 0x3000, dev.reader());
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->text,
            "i=-42 u=42 x=0000beef c=z f=3.142 e=1.234500e+03 g=0.0001 s=str "
            "ll=-1234567890123 lu=18446744073709551615 p=0x1234 %");
  EXPECT_EQ(r->arguments, 11);
}

TEST(DevicePrintf, NoArguments) {
  FakeDevice dev;
  dev.putString(0x1000, "plain text\n");
  auto r = formatDevicePrintf(0x1000, 0, dev.reader());
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->text, "plain text\n");
  EXPECT_EQ(r->arguments, 0);
}

TEST(DevicePrintf, UnreadableFormatIsAnError) {
  FakeDevice dev;
  EXPECT_THAT(formatDevicePrintf(0xdead, 0, dev.reader()).status(),
              StatusIs(Code::kOutOfRange));
}

}  // namespace
}  // namespace phos::vgpu::engine::detail
