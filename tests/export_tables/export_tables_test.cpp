// SPDX-License-Identifier: Apache-2.0
// NVIDIA's private tables as vgpu's libcuda.so.1 serves them (the same code
// libphos.so serves them with): their layout, the integrity check's hash
// against RFC 1319's MD2 vectors and an independent HMAC-MD2, and the
// runtime's context-local storage, destructors included.
#include <cuda.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "internal/md2.h"
#include "phos/export_tables/export_tables.h"

namespace phos::export_tables {
namespace {

std::string hex(const std::array<std::uint8_t, 16>& d) {
  std::string out;
  for (auto b : d) out += fmt::format("{:02x}", b);
  return out;
}

std::span<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

TEST(Md2, Rfc1319TestSuite) {
  EXPECT_EQ(hex(detail::md2(bytes(""))), "8350e5a3e24c153df2275c9f80692773");
  EXPECT_EQ(hex(detail::md2(bytes("a"))), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
  EXPECT_EQ(hex(detail::md2(bytes("abc"))), "da853b0d3f88d99b30283a69e6ded6bb");
  EXPECT_EQ(hex(detail::md2(bytes("message digest"))), "ab4f496bfb2a530b219ff33031fe06b0");
  EXPECT_EQ(hex(detail::md2(bytes("abcdefghijklmnopqrstuvwxyz"))), "4e8ddff3650292ab5a4108c3aa47940b");
  EXPECT_EQ(hex(detail::md2(bytes("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"))),
            "da33def2a42df13975352846c30338cd");
  EXPECT_EQ(hex(detail::md2(bytes("1234567890123456789012345678901234567890123456789012345678901234567890"
                                  "1234567890"))),
            "d5976f79d83d3a0dc9806c3c66f3efd8");
}

// Expected values from pycryptodome's HMAC over its MD2 (another
// implementation), under the runtime's key.
TEST(IntegrityHash, IsHmacMd2UnderTheRuntimesKey) {
  std::uint64_t out[2] = {};
  integrityHash({}, out);
  EXPECT_EQ(out[0], 0xea75a8a4ab076bf6ull);
  EXPECT_EQ(out[1], 0x6a1ca413c02c0c14ull);
  integrityHash(bytes("abc"), out);
  EXPECT_EQ(out[0], 0x4536b39a8c115f81ull);
  EXPECT_EQ(out[1], 0x79ab7040482c22d4ull);
  std::vector<std::uint8_t> message(48);
  for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<std::uint8_t>(i);
  integrityHash(message, out);  // the size of the runtime's first block of input
  EXPECT_EQ(out[0], 0x96ac92f45ca4ad90ull);
  EXPECT_EQ(out[1], 0x9ae95bc297b6ec9bull);
  for (std::uint8_t b = 100; b < 128; ++b) message.push_back(b);  // and one device's record
  integrityHash(message, out);
  EXPECT_EQ(out[0], 0xb648cbbdd402a480ull);
  EXPECT_EQ(out[1], 0x2c919127a626eb00ull);
}

CUuuid uuidOf(std::initializer_list<unsigned char> b) {
  CUuuid u{};
  std::size_t i = 0;
  for (unsigned char c : b) u.bytes[i++] = static_cast<char>(c);
  return u;
}
const CUuuid kCudart = uuidOf({0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd,
                               0x9d, 0xf9});
const CUuuid kStorage = uuidOf({0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8,
                                0x95, 0x93});
const CUuuid kIntegrity = uuidOf({0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66,
                                  0xe1, 0xf2});
const CUuuid kHooks = uuidOf({0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c,
                              0x0a, 0x66});

const void* const* table(const CUuuid& id) {
  const void* t = nullptr;
  EXPECT_EQ(cuGetExportTable(&t, &id), CUDA_SUCCESS);
  return static_cast<const void* const*>(t);
}

class Tables : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cuInit(0), CUDA_SUCCESS); }
};

TEST_F(Tables, LayoutAndNames) {
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(table(kCudart)[0]), 13 * sizeof(void*));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(table(kIntegrity)[0]), 3 * sizeof(void*));
  EXPECT_STREQ(name(kCudart), "CUDART_INTERFACE");
  EXPECT_STREQ(name(kStorage), "CONTEXT_LOCAL_STORAGE_V0301");
  EXPECT_EQ(uuidText(kCudart), "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9");
  // The runtime probes this one first; it must not be found.
  const CUuuid probe = uuidOf({0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c,
                               0x0d, 0xd9});
  const void* t = reinterpret_cast<const void*>(1);
  EXPECT_EQ(cuGetExportTable(&t, &probe), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(t, nullptr);
}

TEST_F(Tables, CallbackHookBuffersAreStableAndZeroed) {
  using Hook = void (*)(void**, std::size_t*);
  void* a = nullptr;
  std::size_t n = 0;
  reinterpret_cast<Hook>(table(kHooks)[2])(&a, &n);
  EXPECT_EQ(n, 1024u);
  ASSERT_NE(a, nullptr);
  void* again = nullptr;
  reinterpret_cast<Hook>(table(kHooks)[2])(&again, &n);
  EXPECT_EQ(again, a);
  reinterpret_cast<Hook>(table(kHooks)[6])(&a, &n);
  EXPECT_EQ(n, 14u);
}

TEST_F(Tables, ToolSlotsSayNoToolIsAttached) {
  const CUuuid tls = uuidOf({0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a,
                             0xec, 0xdc});
  using Slot = CUresult (*)();
  for (int i : {1, 3}) EXPECT_EQ(reinterpret_cast<Slot>(table(tls)[i])(), CUDA_SUCCESS) << i;
  for (int i : {1, 3, 4, 5}) EXPECT_EQ(reinterpret_cast<Slot>(table(kHooks)[i])(), CUDA_SUCCESS) << i;
  // A slot never seen called fails cleanly instead of doing what NVIDIA's might.
  EXPECT_EQ(reinterpret_cast<Slot>(table(kCudart)[3])(), CUDA_ERROR_NOT_SUPPORTED);
}

// cuBLASLt keys its kernels by context: TOOLS_TLS [2] names the calling
// thread's, TOOLS_CONTEXT [3] its device and [4] its unique id. Answers as the
// public API's, which NVIDIA's driver gives too (tests/gpu/export_table_probe.cpp).
TEST_F(Tables, ContextsAreNamedAsThePublicApiNamesThem) {
  const CUuuid tls = uuidOf({0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7,
                             0x8a, 0x3a, 0xec, 0xdc});
  const CUuuid tools = uuidOf({0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41,
                               0xff, 0x73, 0x24, 0xc8, 0xf2});
  EXPECT_STREQ(name(tools), "TOOLS_CONTEXT");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(table(tools)[0]), 95 * sizeof(void*));
  auto current = reinterpret_cast<CUresult (*)(CUcontext*)>(table(tls)[2]);
  auto id = reinterpret_cast<CUresult (*)(CUcontext, unsigned long long*)>(table(tools)[4]);
  EXPECT_EQ(current(nullptr), CUDA_ERROR_INVALID_VALUE);

  CUcontext a = nullptr, b = nullptr, got = reinterpret_cast<CUcontext>(1);
  ASSERT_EQ(cuCtxCreate(&a, nullptr, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate(&b, nullptr, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(current(&got), CUDA_SUCCESS);
  EXPECT_EQ(got, b);
  unsigned long long idA = 0, idB = 0, publicA = 0;
  ASSERT_EQ(id(a, &idA), CUDA_SUCCESS);
  ASSERT_EQ(id(b, &idB), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxGetId(a, &publicA), CUDA_SUCCESS);
  EXPECT_EQ(idA, publicA);
  EXPECT_NE(idA, idB);
  EXPECT_EQ(id(a, nullptr), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuCtxDestroy(b), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(a), CUDA_SUCCESS);
  ASSERT_EQ(current(&got), CUDA_SUCCESS);
  EXPECT_EQ(got, a);
  auto device = reinterpret_cast<CUresult (*)(CUcontext, CUdevice*)>(table(tools)[3]);
  CUdevice dev = -1;
  ASSERT_EQ(device(a, &dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(device(a, nullptr), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuCtxDestroy(a), CUDA_SUCCESS);
  // A slot never seen called says so rather than guess.
  EXPECT_EQ(reinterpret_cast<CUresult (*)()>(table(tools)[5])(), CUDA_ERROR_NOT_SUPPORTED);
}

TEST_F(Tables, IntegrityCheckFixedAnswers) {
  using Check = CUresult (*)(std::uint32_t, std::uint64_t, std::uint64_t*);
  auto check = reinterpret_cast<Check>(table(kIntegrity)[1]);
  std::uint64_t out[2] = {};
  ASSERT_EQ(check(13000, 1, out), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 0x3341181C03CB675Cull);
  ASSERT_EQ(check(13001, 1, out), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 0x1841181C03CB675Cull);
  EXPECT_EQ(out[1], 0x8ED383AA1F4CD1E8ull);
  // Other versions hash the caller's process and time: they differ with the time.
  std::uint64_t later[2] = {};
  ASSERT_EQ(check(13002, 1, out), CUDA_SUCCESS);
  ASSERT_EQ(check(13002, 2, later), CUDA_SUCCESS);
  EXPECT_NE(out[0], later[0]);
  EXPECT_EQ(check(13002, 1, nullptr), CUDA_ERROR_INVALID_VALUE);
}

using Destructor = void (*)(CUcontext, void*, void*);
using Put = CUresult (*)(CUcontext, void*, void*, Destructor);
using Delete = CUresult (*)(CUcontext, void*);
using Get = CUresult (*)(void**, CUcontext, void*);

struct Destroyed {
  CUcontext context = nullptr;
  void* key = nullptr;
  void* value = nullptr;
  int calls = 0;
};
Destroyed gDestroyed;
void recordDestroyed(CUcontext c, void* k, void* v) {
  gDestroyed = {c, k, v, gDestroyed.calls + 1};
}

TEST_F(Tables, ContextLocalStorageLivesAndDiesWithItsContext) {
  auto put = reinterpret_cast<Put>(table(kStorage)[0]);
  auto erase = reinterpret_cast<Delete>(table(kStorage)[1]);
  auto get = reinterpret_cast<Get>(table(kStorage)[2]);
  int key = 0, value = 0, other = 0;
  void* got = nullptr;
  // No context current: a null context names nothing.
  EXPECT_EQ(get(&got, nullptr, &key), CUDA_ERROR_INVALID_CONTEXT);

  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(get(&got, nullptr, &key), CUDA_ERROR_INVALID_HANDLE);  // missing key
  ASSERT_EQ(put(nullptr, &key, &value, recordDestroyed), CUDA_SUCCESS);  // null: the current context
  ASSERT_EQ(get(&got, ctx, &key), CUDA_SUCCESS);
  EXPECT_EQ(got, &value);
  EXPECT_EQ(get(nullptr, ctx, &key), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(put(ctx, &other, &other, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(erase(ctx, &other), CUDA_SUCCESS);  // forgotten, and not destroyed
  EXPECT_EQ(erase(ctx, &other), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(gDestroyed.calls, 0);

  // Destroying the context runs the destructor of what it kept.
  ASSERT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  EXPECT_EQ(gDestroyed.calls, 1);
  EXPECT_EQ(gDestroyed.context, ctx);
  EXPECT_EQ(gDestroyed.key, &key);
  EXPECT_EQ(gDestroyed.value, &value);
}

TEST_F(Tables, PrimaryContextResetRunsTheDestructors) {
  auto put = reinterpret_cast<Put>(table(kStorage)[0]);
  using Primary = CUresult (*)(CUcontext*, CUdevice);
  CUcontext primary = nullptr;
  // CUDART_INTERFACE[2]: the device's primary context, for the runtime.
  ASSERT_EQ(reinterpret_cast<Primary>(table(kCudart)[2])(&primary, 0), CUDA_SUCCESS);
  ASSERT_NE(primary, nullptr);
  int key = 0;
  gDestroyed = {};
  ASSERT_EQ(put(primary, &key, &key, recordDestroyed), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
  EXPECT_EQ(gDestroyed.calls, 1);
  EXPECT_EQ(gDestroyed.context, primary);
}

TEST_F(Tables, ModuleFromACorruptWrapperIsRefused) {
  using FromWrapper = CUresult (*)(CUmodule*, const void*);
  auto load = reinterpret_cast<FromWrapper>(table(kCudart)[1]);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
  struct {
    int magic;
    int version;
    const void* data;
    const void* unused;
  } wrapper{0x466243B1, 1, reinterpret_cast<const void*>(0x40), nullptr};
  CUmodule m = nullptr;
  EXPECT_EQ(load(&m, &wrapper), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(load(nullptr, &wrapper), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(load(&m, nullptr), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
}

}  // namespace
}  // namespace phos::export_tables
