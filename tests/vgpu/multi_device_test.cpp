// SPDX-License-Identifier: Apache-2.0
// vgpu with several devices (PHOS_VGPU_DEVICES=2): ordinals, peer access and peer copies.
#include <algorithm>
#include <iterator>
#include <vector>

#include <gmock/gmock.h>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

class MultiDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    int count = 0;
    ASSERT_CU(cuDeviceGetCount(&count));
    ASSERT_EQ(count, 2) << "run with PHOS_VGPU_DEVICES=2";
    ASSERT_CU(cuCtxCreate(&c0_, nullptr, 0, 0));
    ASSERT_CU(cuCtxCreate(&c1_, nullptr, 0, 1));  // current
  }
  void TearDown() override {
    (void)cuCtxDestroy(c1_);
    (void)cuCtxDestroy(c0_);
  }
  CUcontext c0_ = nullptr, c1_ = nullptr;
};

TEST_F(MultiDeviceTest, DevicesHaveDistinctWindowsAndIds) {
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuCtxPushCurrent(c0_));
  ASSERT_CU(cuMemAlloc(&a, 64));
  ASSERT_CU(cuCtxPopCurrent(nullptr));
  ASSERT_CU(cuMemAlloc(&b, 64));
  int da = -1, db = -1;
  EXPECT_CU(cuPointerGetAttribute(&da, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a));
  EXPECT_CU(cuPointerGetAttribute(&db, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b));
  EXPECT_EQ(da, 0);
  EXPECT_EQ(db, 1);
  CUuuid u0{}, u1{};
  EXPECT_CU(cuDeviceGetUuid(&u0, 0));
  EXPECT_CU(cuDeviceGetUuid(&u1, 1));
  EXPECT_NE(std::memcmp(u0.bytes, u1.bytes, sizeof(u0.bytes)), 0);
  EXPECT_CU(cuMemFree(a));
  EXPECT_CU(cuMemFree(b));
}

// The native atomics of a link (cuDeviceGet{Host,P2P}AtomicCapabilities):
// none with the host (the profile's HOST_NATIVE_ATOMIC_SUPPORTED is 0); over
// the default NVLink between the two devices (NATIVE_ATOMIC_SUPPORTED is 1)
// every form CUDA's atomic functions have on the devices' compute capability.
TEST_F(MultiDeviceTest, AtomicCapabilitiesOfTheHostAndThePeerLink) {
  const CUatomicOperation ops[] = {CU_ATOMIC_OPERATION_INTEGER_ADD, CU_ATOMIC_OPERATION_INTEGER_INCREMENT,
                                   CU_ATOMIC_OPERATION_CAS, CU_ATOMIC_OPERATION_FLOAT_ADD,
                                   CU_ATOMIC_OPERATION_FLOAT_MAX};
  constexpr unsigned kInts = CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED |
                             CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
  unsigned caps[5];
  std::fill(std::begin(caps), std::end(caps), 0xdeadu);
  EXPECT_CU(cuDeviceGetHostAtomicCapabilities(caps, ops, 5, 0));
  EXPECT_THAT(caps, ::testing::Each(0u));

  int native = 0;
  ASSERT_CU(cuDeviceGetP2PAttribute(&native, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, 0, 1));
  ASSERT_EQ(native, 1);
  int major = 0;
  ASSERT_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
  const bool hopper = major >= 9;  // 128-bit exchange and compare-and-swap, float4 add
  EXPECT_CU(cuDeviceGetP2PAtomicCapabilities(caps, ops, 5, 0, 1));
  EXPECT_EQ(caps[0], kInts | CU_ATOMIC_CAPABILITY_REDUCTION);
  EXPECT_EQ(caps[1], CU_ATOMIC_CAPABILITY_UNSIGNED | CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_REDUCTION);
  EXPECT_EQ(caps[2], kInts | (hopper ? unsigned{CU_ATOMIC_CAPABILITY_SCALAR_128} : 0u));
  EXPECT_EQ(caps[3], CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64 | CU_ATOMIC_CAPABILITY_REDUCTION |
                         (hopper ? unsigned{CU_ATOMIC_CAPABILITY_VECTOR_32x4} : 0u));
  EXPECT_EQ(caps[4], 0u);

  // The documented errors.
  const CUatomicOperation bad[] = {CU_ATOMIC_OPERATION_OR, CU_ATOMIC_OPERATION_MAX};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(nullptr, ops, 5, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(caps, nullptr, 5, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(caps, ops, 0, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(caps, bad, 2, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetHostAtomicCapabilities(caps, ops, 5, 7));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetP2PAtomicCapabilities(caps, ops, 5, 1, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetP2PAtomicCapabilities(caps, ops, 5, 0, 7));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetP2PAtomicCapabilities(caps, bad, 2, 0, 1));
}

TEST_F(MultiDeviceTest, PeerAccessAndPeerCopies) {
  int can = 0;
  EXPECT_CU(cuDeviceCanAccessPeer(&can, 1, 0));
  EXPECT_EQ(can, 1);
  int supported = 0;
  EXPECT_CU(cuDeviceGetP2PAttribute(&supported, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, 1));
  EXPECT_EQ(supported, 1);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE,
                cuDeviceGetP2PAttribute(&supported, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 1, 1));
  EXPECT_CU(cuCtxEnablePeerAccess(c0_, 0));
  EXPECT_CU_ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cuCtxEnablePeerAccess(c0_, 0));
  EXPECT_CU(cuCtxDisablePeerAccess(c0_));
  EXPECT_CU_ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, cuCtxDisablePeerAccess(c0_));

  CUdeviceptr src = 0, dst = 0;
  ASSERT_CU(cuCtxPushCurrent(c0_));
  ASSERT_CU(cuMemAlloc(&src, 4096));
  std::vector<unsigned> data(1024);
  for (unsigned i = 0; i < data.size(); ++i) data[i] = i * 3;
  ASSERT_CU(cuMemcpyHtoD(src, data.data(), 4096));
  ASSERT_CU(cuCtxPopCurrent(nullptr));
  ASSERT_CU(cuMemAlloc(&dst, 4096));
  EXPECT_CU(cuMemcpyPeer(dst, c1_, src, c0_, 4096));
  std::vector<unsigned> out(1024);
  EXPECT_CU(cuMemcpyDtoH(out.data(), dst, 4096));
  EXPECT_EQ(out, data);
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  EXPECT_CU(cuMemsetD32Async(dst, 0, 1024, s));
  EXPECT_CU(cuMemcpyPeerAsync(dst, c1_, src, c0_, 4096, s));
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuMemcpyDtoH(out.data(), dst, 4096));
  EXPECT_EQ(out, data);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuMemcpyPeer(dst, nullptr, src, c0_, 4096));
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuMemFree(dst));
  ASSERT_CU(cuCtxPushCurrent(c0_));
  EXPECT_CU(cuMemFree(src));
  ASSERT_CU(cuCtxPopCurrent(nullptr));
}

}  // namespace
}  // namespace phos::vgpu::testing
