// SPDX-License-Identifier: Apache-2.0
// Hostile requests on a session's ring, each answered with a specific CUresult
// by a session that keeps serving; and two sessions that cannot reach each
// other's memory or handles. phosd's sessions run on vgpu in this process; the
// applications are child processes holding the memory phosd copies from/to.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "phos/common/ipc/call_ring.h"
#include "phos/common/ipc/transfer_lane.h"
#include "ring_requests.h"
#include "session/context_pool.h"
#include "session/driver_table.h"
#include "session/server_call.h"
#include "session/session.h"
#include "session_harness.h"

namespace phos::daemon {
namespace {

// (EntryPointId, RequestBuilder and the stand-in application's addresses
// come with session_harness.h.)
constexpr uint64_t kHandleTypeShift = 48;
uint64_t fakeHandle(HandleType type, uint64_t serial) { return (static_cast<uint64_t>(type) << kHandleTypeShift) | serial; }


class RingDecoder : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { app_ = new Application(); }
  static void TearDownTestSuite() {
    delete app_;
    app_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(daemonState().error.empty()) << daemonState().error;
    ASSERT_GT(app_->pid(), 0) << "cannot start the stand-in application";
    client_ = std::make_unique<Client>(++nextId_, app_->pid());
    ASSERT_NO_FATAL_FAILURE(client_->setUpContext());
  }
  void TearDown() override {
    if (client_) {
      client_->expectStillServing();
      client_.reset();
    }
  }
  Client& c() { return *client_; }
  static Application* app_;
  static uint64_t nextId_;
  std::unique_ptr<Client> client_;
};
Application* RingDecoder::app_ = nullptr;
uint64_t RingDecoder::nextId_ = 100;

std::vector<std::byte> bytesOf(const RequestBuilder& b) { return b.bytes(); }

// ---- framing -------------------------------------------------------------

TEST_F(RingDecoder, EmptyRequestIsInvalidValue) {
  EXPECT_EQ(c().call(std::span<const std::byte>{}).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, TruncatedHeaderIsInvalidValue) {
  auto bytes = bytesOf(c().req(EntryPointId::kCuDriverGetVersion).u8(1));
  bytes.resize(sizeof(ipc::CallHeader) - 1);
  EXPECT_EQ(c().call(bytes).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, UnknownEntryIdIsNotSupported) {
  for (uint32_t entry : {static_cast<uint32_t>(cuda_api::kEntryPointCount), 0xffffffffu}) {
    ipc::CallHeader h;
    h.entry = entry;
    h.flags = ipc::kCallExpectsReply;
    h.context = c().context;
    std::vector<std::byte> bytes(sizeof(h));
    std::memcpy(bytes.data(), &h, sizeof(h));
    EXPECT_EQ(c().call(bytes).result, CUDA_ERROR_NOT_SUPPORTED) << "entry " << entry;
  }
}

TEST_F(RingDecoder, EntryWithoutServerIsNotSupported) {
  // cuGraphAddMemAllocNode is not remoted (apigen/remoting.json): no server function.
  ASSERT_EQ(daemonState().servers[static_cast<size_t>(EntryPointId::kCuGraphAddMemAllocNode)], nullptr);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuGraphAddMemAllocNode).u8(1).u64(0)).result,
            CUDA_ERROR_NOT_SUPPORTED);
}

TEST_F(RingDecoder, MissingArgumentIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemAlloc_v2).u8(1).u32(4096)).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, TrailingBytesAreInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemAlloc_v2).message(wire::cuMemAlloc_v2_Request{true, 4096}).u8(0)).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, PresenceByteSevenIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuDriverGetVersion).u8(7)).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemGetInfo_v2).u8(1).u8(7)).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, HugeStringLengthIsInvalidValue) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleGetFunction).u8(1).u64(c().module).u32(0xfffffff0u)).result,
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, BlobLengthPastTheEndIsInvalidValue) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  // Four bytes of name follow a length of five.
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleGetFunction).u8(1).u64(c().module).u32(5).raw("fill", 4))
                .result,
            CUDA_ERROR_INVALID_VALUE);
}

// ---- handles ---------------------------------------------------------------

TEST_F(RingDecoder, HandleOfTheWrongTypeIsInvalidHandle) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  // A module id where a stream is expected, a function id where a module is.
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuStreamSynchronize).u64(c().module)).result, CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleGetFunction).u8(1).u64(c().function).text("fill")).result,
            CUDA_ERROR_INVALID_HANDLE);
  // A context id where a module is expected.
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleUnload).u64(c().context)).result, CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(RingDecoder, HandleOfNothingIsInvalidHandle) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuStreamSynchronize).u64(fakeHandle(HandleType::kCUstream_st, 999)))
                .result,
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuEventRecord).u64(fakeHandle(HandleType::kCUevent_st, 77)).u64(0))
                .result,
            CUDA_ERROR_INVALID_HANDLE);
  // A raw pointer-looking value is not an id.
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuStreamSynchronize).u64(0x7fff12345678)).result,
            CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(RingDecoder, ContextOfNothingIsInvalidContext) {
  const uint64_t nothing = fakeHandle(HandleType::kCUctx_st, 4242);
  EXPECT_EQ(c().call(RequestBuilder(EntryPointId::kCuCtxSynchronize, nothing)).result, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxDestroy_v2).u64(nothing)).result, CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(RingDecoder, DestroyingThePrimaryContextIsInvalidContext) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxDestroy_v2).u64(c().context)).result, CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(RingDecoder, FunctionIdZeroIsInvalidHandle) {
  const uint32_t n = 1;
  const uint64_t p = c().device;
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuLaunchKernel)
                         .u64(0)
                         .u32(1).u32(1).u32(1).u32(1).u32(1).u32(1).u32(0)
                         .u64(0)
                         .u32(2).blob(&p, 8).blob(&n, 4))
                .result,
            CUDA_ERROR_INVALID_HANDLE);
}

// ---- device pointers and ranges ----------------------------------------------

TEST_F(RingDecoder, DevicePointerOfNothingIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemsetD8_v2).message(wire::cuMemsetD8_v2_Request{0xdead0000, 0, 16})).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemFree_v2).u64(0x1234)).result, CUDA_ERROR_INVALID_VALUE);
  // "CUDA_ERROR_NOT_FOUND" is what cuMemGetAddressRange documents for an
  // address no allocation contains.
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemGetAddressRange_v2).u8(1).u8(1).u64(0x1234)).result,
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(0xdead0000).u64(16)).result,
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, FreeInsideAnAllocationIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemFree_v2).u64(c().device + 16)).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, RangePastTheAllocationIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyHtoD_v2).u64(c().device + 1).u64(kAppScratch).u64(Client::kBytes))
                .result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemsetD32_v2).u64(c().device).u32(0).u64(Client::kBytes / 4 + 1))
                .result,
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, MemcpyRangesOverflowing64BitsAreInvalidValue) {
  const uint64_t wrap = std::numeric_limits<uint64_t>::max() - c().device + 17;  // device + wrap == 16
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyHtoD_v2).u64(c().device).u64(kAppScratch).u64(wrap)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(c().device + 16).u64(~0ull)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyDtoD_v2).u64(c().device).u64(c().device + 8).u64(~0ull - 7))
                .result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyHtoD_v2).u64(c().device).u64(~0ull - 8).u64(64)).result,
            CUDA_ERROR_INVALID_VALUE);
}

// count * 4 wraps to a small number: refused, and answered.
TEST_F(RingDecoder, MemsetCountOverflowingIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemsetD32_v2).u64(c().device).u32(0).u64((1ull << 62) + 1)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemsetD16_v2).message(wire::cuMemsetD16_v2_Request{c().device, 0, ~0ull})).result,
            CUDA_ERROR_INVALID_VALUE);
}

// Host to host through cuMemcpy: a length phosd must not allocate.
TEST_F(RingDecoder, HugeHostToHostCopyIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpy).u64(0x10).u64(0x20).u64(1ull << 62)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpy).u64(kAppScratch).u64(kAppScratch + 64).u64(~0ull)).result,
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, HostToHostCopyStaysInTheApplication) {
  std::vector<uint8_t> pattern(64, 0xc3);
  ASSERT_TRUE(app_->write(kAppScratch + 256, pattern));
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpy).u64(kAppScratch + 512).u64(kAppScratch + 256).u64(64)).result,
            CUDA_SUCCESS);
  EXPECT_EQ(app_->read(kAppScratch + 512, 64), pattern);
}

TEST_F(RingDecoder, UnreadableApplicationMemoryIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyHtoD_v2).u64(c().device).u64(0x1000).u64(64)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyDtoH_v2).u64(0x1000).u64(c().device).u64(64)).result,
            CUDA_ERROR_INVALID_VALUE);
}

// ---- modules -------------------------------------------------------------------

TEST_F(RingDecoder, ModuleImageAtAddressZeroIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleLoadData).message(moduleLoad(0, kModulePtx.size()))).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuLibraryLoadData)
                         .message(wire::cuLibraryLoadData_Request{true, {0, 16}, {}, 0}))
                .result,
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, ModuleImageOfHugeSizeIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleLoadData).message(moduleLoad(kAppPtx, 1ull << 40))).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleLoadData).message(moduleLoad(kAppPtx, ~0ull))).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleLoadData).message(moduleLoad(kAppPtx, 0))).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, ModuleImageOutsideTheApplicationIsInvalidValue) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleLoadData).message(moduleLoad(0x10, 4096))).result, CUDA_ERROR_INVALID_VALUE);
  // Past the end of the application's mapping.
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuModuleLoadData).message(moduleLoad(fuzz::kAppBase, fuzz::kAppBytes + 4096))).result,
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, ModuleImageThatIsNotAModuleFails) {
  std::vector<uint8_t> junk(256, 0x7f);
  ASSERT_TRUE(app_->write(kAppScratch, junk));
  Reply r = c().call(c().req(EntryPointId::kCuModuleLoadData).message(moduleLoad(kAppScratch, junk.size())));
  EXPECT_NE(r.result, CUDA_SUCCESS);
}

// ---- launches ------------------------------------------------------------------

// Everything of a launch but its parameters, which a test writes as it likes.
RequestBuilder launchHeader(Client& c) {
  RequestBuilder b = c.req(EntryPointId::kCuLaunchKernel);
  b.u64(c.function).u32(1).u32(1).u32(1).u32(32).u32(1).u32(1).u32(0).u64(0);
  return b;
}
RequestBuilder launchExHeader(Client& c) {
  RequestBuilder b = c.req(EntryPointId::kCuLaunchKernelEx);
  b.message(ipc::LaunchConfig{1, 1, 1, 32, 1, 1, 0, 0, {}}).u64(c.function);
  return b;
}

TEST_F(RingDecoder, LaunchWithWellFormedParametersSucceeds) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  const uint64_t p = c().device;
  const uint32_t n = 32;
  EXPECT_EQ(c().call(launchHeader(c()).u32(2).blob(&p, 8).blob(&n, 4)).result, CUDA_SUCCESS);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxSynchronize)).result, CUDA_SUCCESS);
}

TEST_F(RingDecoder, LaunchWith100000ParametersIsInvalidValue) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  RequestBuilder b = launchHeader(c()).u32(100000);
  for (int i = 0; i < 100; ++i) b.u32(0);  // a slot holds no more; the count alone must be refused
  EXPECT_EQ(c().call(b).result, CUDA_ERROR_INVALID_VALUE);
}

// The kernel takes (u64, u32). The driver reads one pointer per declared
// parameter and sizeof(parameter) bytes through it: fewer parameters, or
// shorter ones, would make it read what phosd does not hold.
TEST_F(RingDecoder, LaunchWithTooFewParametersIsInvalidValue) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  const uint64_t p = c().device;
  EXPECT_EQ(c().call(launchHeader(c()).u32(1).blob(&p, 8)).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, LaunchWithTooManyParametersIsInvalidValue) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  const uint64_t p = c().device;
  const uint32_t n = 1;
  EXPECT_EQ(c().call(launchHeader(c()).u32(3).blob(&p, 8).blob(&n, 4).blob(&n, 4)).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, LaunchWithAShortParameterIsInvalidValue) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  const uint64_t p = c().device;
  const uint32_t n = 1;
  EXPECT_EQ(c().call(launchHeader(c()).u32(2).blob(&p, 1).blob(&n, 4)).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(launchExHeader(c()).u32(2).blob(&p, 8).blob(&n, 0)).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(RingDecoder, LaunchWithAShortParameterBufferIsInvalidValue) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  const uint64_t p = c().device;
  EXPECT_EQ(c().call(launchHeader(c()).u32(0xfffffffeu).blob(&p, 8)).result, CUDA_ERROR_INVALID_VALUE);
}

// The attributes are whole CUlaunchAttribute records.
TEST_F(RingDecoder, LaunchExWithAPartialAttributeIsInvalidValue) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  const uint64_t p = c().device;
  const uint32_t n = 1;
  const std::vector<std::byte> partial(sizeof(CUlaunchAttribute) - 4);
  ipc::LaunchConfig config{1, 1, 1, 32, 1, 1, 0, 0, ipc::Blob::of(partial.data(), partial.size())};
  RequestBuilder b = c().req(EntryPointId::kCuLaunchKernelEx);
  b.message(config).u64(c().function).u32(2).blob(&p, 8).blob(&n, 4);
  EXPECT_EQ(c().call(b).result, CUDA_ERROR_INVALID_VALUE);
}

// ---- other handwritten decoders -------------------------------------------------

// The length is the application's buffer: phosd lends the driver a buffer of
// its own, never larger than it holds, and the name comes back whole.
TEST_F(RingDecoder, DeviceNameOfHostileLength) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuDeviceGetName).message(wire::cuDeviceGetName_Request{true, -1, 0})).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuDeviceGetName).message(wire::cuDeviceGetName_Request{true, 0, 0})).result,
            CUDA_ERROR_INVALID_VALUE);
  Reply r = c().call(c().req(EntryPointId::kCuDeviceGetName).message(wire::cuDeviceGetName_Request{true, 1 << 30, 0}));
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  ipc::Decoder d(r.bytes);
  (void)d.value<ipc::ReplyHeader>();
  wire::cuDeviceGetName_Reply name;
  wire::get(d, name);
  ASSERT_TRUE(d.ok() && d.atEnd());
  EXPECT_FALSE(name.name.view().empty());
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuDeviceGetName).message(wire::cuDeviceGetName_Request{true, 64, 12345}))
                .result,
            CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(RingDecoder, PrimaryContextOfNoDeviceIsInvalidDevice) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuDevicePrimaryCtxRetain).message(wire::cuDevicePrimaryCtxRetain_Request{true, -1})).result, CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxCreate_v2).message(wire::cuCtxCreate_v2_Request{true, 0, 1 << 20})).result, CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(RingDecoder, PinnedMemoryOfHostileSizeOrFlagsIsRefused) {
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemHostAlloc).u64(0).u32(0)).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemHostAlloc).u64(4096).u32(0x80)).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemHostAlloc).u64(1ull << 40).u32(0)).result, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemFreeHost).u64(0x500000000000ull)).result, CUDA_ERROR_INVALID_VALUE);
}

// Registration of the application's memory, asked for by a client that
// skips the shim's checks: nothing of phosd's own is mapped over, no window
// phosd hands out is taken, and no more than the host's memory is registered.
TEST_F(RingDecoder, HostileRegistrationsAreRefused) {
  auto reg = [&](uint64_t p, uint64_t bytes, unsigned flags) {
    return c()
        .call(c().req(EntryPointId::kCuMemHostRegister_v2)
                  .message(wire::cuMemHostRegister_v2_Request{p, bytes, flags}))
        .result;
  };
  auto unreg = [&](uint64_t p) {
    return c()
        .call(c().req(EntryPointId::kCuMemHostUnregister)
                  .message(wire::cuMemHostUnregister_Request{p}))
        .result;
  };
  constexpr uint64_t kFree = 0x7e0000000100ull;  // unmapped in this process
  EXPECT_EQ(reg(0, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(reg(kFree, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(reg(kFree, 4096, 0x80), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(reg(~uint64_t{0} - 100, 4096, 0), CUDA_ERROR_INVALID_VALUE);  // wraps around
  EXPECT_EQ(reg(kFree, 4096, CU_MEMHOSTREGISTER_IOMEMORY), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(reg(0x500000000010ull, 4096, 0), CUDA_ERROR_NOT_SUPPORTED);  // the pinned window
  EXPECT_EQ(reg(0x100000000000ull, 4096, 0), CUDA_ERROR_NOT_SUPPORTED);  // the VMM windows
  static int ofPhosd = 0;  // phosd's own memory: never mapped over
  EXPECT_EQ(reg(reinterpret_cast<uint64_t>(&ofPhosd), sizeof(ofPhosd), 0),
            CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(ofPhosd, 0);
  EXPECT_EQ(reg(kFree, 1ull << 60, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(unreg(kFree), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(unreg(0), CUDA_ERROR_INVALID_VALUE);
  // A good one: its pages are taken once, and freed by their pointer only.
  ASSERT_EQ(reg(kFree, 8192, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
  EXPECT_EQ(reg(kFree + 8000, 16, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(reg(kFree - 0x100, 16, 0),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);  // the same first page
  EXPECT_EQ(unreg(kFree - 0x100), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemFreeHost).u64(kFree)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(unreg(kFree), CUDA_SUCCESS);
  EXPECT_EQ(unreg(kFree), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

// cuGraphDebugDotPrint: the driver writes as phosd, into a file named after
// the session's ring. A symlink the session's user planted at that name,
// pointing at a file of someone else's, must not be followed: phosd replaces
// it with a file of its own, and the victim keeps its bytes.
TEST_F(RingDecoder, APlantedSymlinkDoesNotRedirectTheGraphsDotFile) {
  Reply created =
      c().call(c().req(EntryPointId::kCuGraphCreate).message(wire::cuGraphCreate_Request{true, 0}));
  ASSERT_EQ(created.result, CUDA_SUCCESS);
  const uint64_t graph = created.value(true);
  char victim[] = "/tmp/phos-dot-victim.XXXXXX";
  const int fd = mkstemp(victim);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "precious", 8), 8);
  close(fd);
  const std::string planted = c().session().ringPath() + "-dot";
  (void)unlink(planted.c_str());
  ASSERT_EQ(symlink(victim, planted.c_str()), 0) << std::strerror(errno);

  Reply r = c().call(c().req(EntryPointId::kCuGraphDebugDotPrint)
                         .message(wire::cuGraphDebugDotPrint_Request{graph, 0}));
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  ipc::Decoder d(r.bytes);
  (void)d.value<ipc::ReplyHeader>();
  wire::cuGraphDebugDotPrint_Reply dot;
  wire::get(d, dot);
  ASSERT_TRUE(d.ok() && d.atEnd());
  EXPECT_EQ(dot.dot.view(), planted);
  struct stat st {};
  ASSERT_EQ(lstat(planted.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "phosd wrote through the planted symlink";
  std::ifstream written(planted);
  const std::string text((std::istreambuf_iterator<char>(written)),
                         std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("digraph", 0), 0u) << text;
  std::ifstream kept(victim);
  const std::string victimText((std::istreambuf_iterator<char>(kept)),
                               std::istreambuf_iterator<char>());
  EXPECT_EQ(victimText, "precious");
  (void)unlink(planted.c_str());
  (void)unlink(victim);
}

// A posted (no-reply) call that fails reports at the next synchronizing call.
TEST_F(RingDecoder, PostedFailureIsReportedAtTheNextSynchronize) {
  ASSERT_NO_FATAL_FAILURE(c().post(RequestBuilder(EntryPointId::kCuMemsetD8Async, c().context, false)
                                       .message(wire::cuMemsetD8Async_Request{0xdead0000, 0, 16, 0})));
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxSynchronize)).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxSynchronize)).result, CUDA_SUCCESS);
}

// ---- sessions that end badly ---------------------------------------------------------

// Whether `address` is still host memory the driver has registered.
bool registeredWithDriver(uint64_t address) {
  Daemon& d = daemonState();
  auto ctx = d.pool->take(0, 0);
  if (!ctx.isOk()) return false;
  PHOS_DRIVER(*d.driver, CtxSetCurrent)(*ctx);
  CUdeviceptr mapped = 0;
  const bool registered = PHOS_DRIVER(*d.driver, MemHostGetDevicePointer_v2)(
                              &mapped, reinterpret_cast<void*>(address), 0) == CUDA_SUCCESS;
  PHOS_DRIVER(*d.driver, CtxSetCurrent)(nullptr);
  d.pool->retire(*ctx, 0);
  return registered;
}

// Found by the ring fuzzer: the pool destroys a session's contexts later, on
// its own thread, and phosd unmapped pinned memory that queued copies still
// wrote to (SIGSEGV in the driver's stream worker).
TEST_F(RingDecoder, SessionEndingWithCopiesIntoPinnedMemoryQueued) {
  client_.reset();
  for (int i = 0; i < 8; ++i) {
    Client c(++nextId_, app_->pid());
    ASSERT_NO_FATAL_FAILURE(c.setUpContext());
    Reply r = c.call(c.req(EntryPointId::kCuStreamCreate).u8(1).u32(0));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    const uint64_t stream = r.value(true);
    r = c.call(c.req(EntryPointId::kCuMemHostAlloc).u64(Client::kBytes).u32(0));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    const uint64_t pinned = r.value();
    for (int k = 0; k < 64; ++k) {
      ASSERT_NO_FATAL_FAILURE(c.post(RequestBuilder(EntryPointId::kCuMemcpyDtoHAsync_v2, c.context, false)
                                         .u64(pinned)
                                         .u64(c.device)
                                         .u64(Client::kBytes)
                                         .u64(stream)));
    }
    // ~Client ends the session with the copies possibly still queued.
  }
  client_ = std::make_unique<Client>(++nextId_, app_->pid());
  ASSERT_NO_FATAL_FAILURE(client_->setUpContext());
}

// Found by the ring fuzzer: a context with a sticky error (here a kernel that
// wrote to an address of nobody) cannot unregister memory, and the session's
// pinned range stayed registered after it was unmapped; a later session whose
// slice held the address could not allocate pinned memory.
TEST_F(RingDecoder, PinnedMemoryIsUnregisteredWhenTheContextFaulted) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  Reply r = c().call(c().req(EntryPointId::kCuMemHostAlloc).u64(4096).u32(0));
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  const uint64_t pinned = r.value();
  const uint64_t nowhere = 0x10;
  const uint32_t n = 32;
  (void)c().call(launchHeader(c()).u32(2).blob(&nowhere, 8).blob(&n, 4));
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxSynchronize)).result, CUDA_ERROR_ILLEGAL_ADDRESS);
  client_.reset();  // the session ends; its pinned memory must go with it
  EXPECT_FALSE(registeredWithDriver(pinned));
}

// Releasing the primary context frees the pinned memory allocated in it, as
// cuMemHostAlloc's memory goes with its context.
TEST_F(RingDecoder, PinnedMemoryGoesWithItsContext) {
  Reply r = c().call(c().req(EntryPointId::kCuMemHostAlloc).u64(4096).u32(0));
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  const uint64_t pinned = r.value();
  ASSERT_EQ(c().call(c().req(EntryPointId::kCuDevicePrimaryCtxRelease_v2).i32(0)).result, CUDA_SUCCESS);
  EXPECT_FALSE(registeredWithDriver(pinned));
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemFreeHost).u64(pinned)).result, CUDA_ERROR_INVALID_VALUE);
  client_.reset();
}

// ---- isolation -------------------------------------------------------------------

// Session A owns memory, a module global, pinned memory and handles; session
// B names all of them. Each is refused, and A's memory is unchanged.
class Isolation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { appA_ = new Application(); }
  static void TearDownTestSuite() {
    delete appA_;
    appA_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(daemonState().error.empty()) << daemonState().error;
    ASSERT_GT(appA_->pid(), 0);
    appB_ = std::make_unique<Application>();
    ASSERT_GT(appB_->pid(), 0);
    a_ = std::make_unique<Client>(1, appA_->pid());
    b_ = std::make_unique<Client>(2, appB_->pid());
    ASSERT_NO_FATAL_FAILURE(a_->setUpContext());
    ASSERT_NO_FATAL_FAILURE(a_->loadModule());
    Reply r = a_->call(a_->req(EntryPointId::kCuModuleGetGlobal_v2).u8(1).u8(1).u64(a_->module).text("counter"));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    global_ = r.value(true);
    r = a_->call(a_->req(EntryPointId::kCuStreamCreate).u8(1).u32(0));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    stream_ = r.value(true);
    r = a_->call(a_->req(EntryPointId::kCuMemHostAlloc).u64(4096).u32(0));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    pinned_ = r.value();
    r = a_->call(a_->req(EntryPointId::kCuCtxCreate_v2).message(wire::cuCtxCreate_v2_Request{true, 0, 0}));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    secondContext_ = r.value(true);
    ASSERT_EQ(a_->call(a_->req(EntryPointId::kCuMemsetD8_v2).message(wire::cuMemsetD8_v2_Request{a_->device, 0xa5, Client::kBytes})).result,
              CUDA_SUCCESS);
    ASSERT_NO_FATAL_FAILURE(b_->setUpContext());
  }
  void TearDown() override {
    b_.reset();
    a_.reset();
    appB_.reset();
  }
  // A's memory as A sees it.
  void expectAUnchanged() {
    ASSERT_EQ(a_->call(a_->req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(a_->device).u64(Client::kBytes))
                  .result,
              CUDA_SUCCESS);
    EXPECT_EQ(appA_->read(kAppScratch, Client::kBytes), std::vector<uint8_t>(Client::kBytes, 0xa5));
  }
  static Application* appA_;
  std::unique_ptr<Application> appB_;
  std::unique_ptr<Client> a_;
  std::unique_ptr<Client> b_;
  uint64_t global_ = 0;
  uint64_t stream_ = 0;
  uint64_t pinned_ = 0;
  uint64_t secondContext_ = 0;
};
Application* Isolation::appA_ = nullptr;

TEST_F(Isolation, CopiesNamingAnotherSessionsMemoryAreRefused) {
  Client& b = *b_;
  const uint64_t theirs = a_->device;
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyHtoD_v2).u64(theirs).u64(kAppScratch).u64(16)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyHtoDAsync_v2).u64(theirs).u64(kAppScratch).u64(16).u64(0)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(theirs).u64(16)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyDtoD_v2).u64(b.device).u64(theirs).u64(16)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyDtoD_v2).u64(theirs).u64(b.device).u64(16)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyDtoDAsync_v2).u64(theirs).u64(b.device).u64(16).u64(0)).result,
            CUDA_ERROR_INVALID_VALUE);
  // cuMemcpy treats an address B does not own as B's host memory: B's own
  // process, never A's device memory.
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpy).u64(b.device).u64(theirs).u64(16)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpy).u64(theirs).u64(b.device).u64(16)).result,
            CUDA_ERROR_INVALID_VALUE);
  expectAUnchanged();
}

TEST_F(Isolation, MemsetAndFreeOfAnotherSessionsMemoryAreRefused) {
  Client& b = *b_;
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemsetD8_v2).message(wire::cuMemsetD8_v2_Request{a_->device, 0, 16})).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemsetD32Async).u64(a_->device).u32(0).u64(4).u64(0)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemFree_v2).u64(a_->device)).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemGetAddressRange_v2).u8(1).u8(1).u64(a_->device)).result,
            CUDA_ERROR_NOT_FOUND);
  expectAUnchanged();
}

TEST_F(Isolation, AnotherSessionsModuleGlobalIsRefused) {
  Client& b = *b_;
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyHtoD_v2).u64(global_).u64(kAppScratch).u64(4)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(global_).u64(4)).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemsetD32_v2).u64(global_).u32(7).u64(1)).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemFree_v2).u64(global_)).result, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Isolation, AnotherSessionsPinnedMemoryIsRefused) {
  Client& b = *b_;
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemFreeHost).u64(pinned_)).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemHostGetDevicePointer_v2).message(wire::cuMemHostGetDevicePointer_v2_Request{true, pinned_, 0})).result,
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemHostGetFlags).message(wire::cuMemHostGetFlags_Request{true, pinned_})).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemsetD8_v2).message(wire::cuMemsetD8_v2_Request{pinned_, 0, 16})).result, CUDA_ERROR_INVALID_VALUE);
  // The address is B's own (unmapped) host memory to B's requests.
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuMemcpyHtoD_v2).u64(b.device).u64(pinned_).u64(16)).result,
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Isolation, AnotherSessionsHandleIdsAreUnknown) {
  Client& b = *b_;
  // A's ids name nothing in B (B created only its context).
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuModuleGetFunction).u8(1).u64(a_->module).text("fill")).result,
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuModuleUnload).u64(a_->module)).result, CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuStreamSynchronize).u64(stream_)).result, CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuStreamDestroy_v2).u64(stream_)).result, CUDA_ERROR_INVALID_HANDLE);
  const uint64_t p = b.device;
  const uint32_t n = 1;
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuLaunchKernel)
                       .u64(a_->function)
                       .u32(1).u32(1).u32(1).u32(1).u32(1).u32(1).u32(0)
                       .u64(0)
                       .u32(2).blob(&p, 8).blob(&n, 4))
                .result,
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(b.call(RequestBuilder(EntryPointId::kCuCtxSynchronize, secondContext_)).result, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(b.call(b.req(EntryPointId::kCuCtxDestroy_v2).u64(secondContext_)).result, CUDA_ERROR_INVALID_CONTEXT);
  // A's objects still work for A.
  EXPECT_EQ(a_->call(a_->req(EntryPointId::kCuStreamSynchronize).u64(stream_)).result, CUDA_SUCCESS);
  EXPECT_EQ(a_->call(RequestBuilder(EntryPointId::kCuCtxSynchronize, secondContext_)).result, CUDA_SUCCESS);
  b.expectStillServing();
}

// ---- speculation: what each call touches, before it runs --------------------

// Records what the session's access gate is shown.
struct GateLog {
  std::mutex mutex;
  std::vector<CallAccess> calls;
  AccessGate gate() {
    return [this](const CallAccess& a) {
      std::lock_guard lock(mutex);
      calls.push_back(a);
    };
  }
  std::vector<CallAccess> take() {
    std::lock_guard lock(mutex);
    return std::exchange(calls, {});
  }
};

TEST_F(RingDecoder, CopiesAndSetsPassTheGateWithExactRanges) {
  GateLog log;
  c().session().setAccessGate(log.gate());
  const uint64_t d = c().device;
  ASSERT_EQ(c().call(c().req(EntryPointId::kCuMemsetD32_v2).u64(d + 64).u32(7).u64(8)).result, CUDA_SUCCESS);
  ASSERT_EQ(c().call(c().req(EntryPointId::kCuMemcpyHtoD_v2).u64(d + 16).u64(kAppScratch).u64(100)).result,
            CUDA_SUCCESS);
  ASSERT_EQ(c().call(c().req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(d + 8).u64(40)).result,
            CUDA_SUCCESS);
  ASSERT_EQ(c().call(c().req(EntryPointId::kCuMemcpyDtoD_v2).u64(d + 1000).u64(d + 2000).u64(24)).result,
            CUDA_SUCCESS);
  auto calls = log.take();
  c().session().setAccessGate({});
  ASSERT_EQ(calls.size(), 4u);
  // Application memory is CPU state: only the device side of each is listed.
  EXPECT_TRUE(calls[0].reads.empty());
  EXPECT_THAT(calls[0].writes, ::testing::ElementsAre(instrument::Buffer{d + 64, 32}));
  EXPECT_THAT(calls[1].writes, ::testing::ElementsAre(instrument::Buffer{d + 16, 100}));
  EXPECT_TRUE(calls[1].reads.empty());
  EXPECT_THAT(calls[2].reads, ::testing::ElementsAre(instrument::Buffer{d + 8, 40}));
  EXPECT_TRUE(calls[2].writes.empty());
  EXPECT_THAT(calls[3].reads, ::testing::ElementsAre(instrument::Buffer{d + 2000, 24}));
  EXPECT_THAT(calls[3].writes, ::testing::ElementsAre(instrument::Buffer{d + 1000, 24}));
  for (const auto& a : calls) EXPECT_FALSE(a.kernel);
}

TEST_F(RingDecoder, LaunchPassesTheGateWithTheBytesItsArgumentAndGridReach) {
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  GateLog log;
  c().session().setAccessGate(log.gate());
  // A pointer into the middle of the allocation: fill's threads store
  // p[tid.x], so the launch writes the 32 words from there (access bounds,
  // docs/speculation.md), not the whole allocation.
  const uint64_t p = c().device + 128;
  const uint32_t n = 32;
  EXPECT_EQ(c().call(launchHeader(c()).u32(2).blob(&p, 8).blob(&n, 4)).result, CUDA_SUCCESS);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxSynchronize)).result, CUDA_SUCCESS);
  auto calls = log.take();
  c().session().setAccessGate({});
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(calls[0].kernel);
  EXPECT_FALSE(calls[0].incomplete);
  EXPECT_THAT(calls[0].writes, ::testing::ElementsAre(instrument::Buffer{p, n * 4}));
  EXPECT_TRUE(calls[0].reads.empty());
}

TEST_F(RingDecoder, ValidatedLaunchRunsTheTwinAndReportsNothingWhenSpeculationHolds) {
  c().session().setValidation(ValidationMode::kValidate);
  ASSERT_NO_FATAL_FAILURE(c().loadModule());
  const uint64_t p = c().device;
  const uint32_t n = 32;
  EXPECT_EQ(c().call(launchHeader(c()).u32(2).blob(&p, 8).blob(&n, 4)).result, CUDA_SUCCESS);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuCtxSynchronize)).result, CUDA_SUCCESS);
  // The twin computed what fill computes.
  std::vector<uint32_t> out(n);
  ASSERT_EQ(c().call(c().req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(p).u64(n * 4)).result,
            CUDA_SUCCESS);
  std::vector<uint8_t> got = app_->read(kAppScratch, n * 4);
  ASSERT_EQ(got.size(), n * 4);
  std::memcpy(out.data(), got.data(), n * 4);
  for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(out[i], i);
  auto report = c().session().validationReport(std::chrono::seconds(10));
  ASSERT_TRUE(report.isOk()) << report.status().message();
  EXPECT_EQ((*report)["launches"], 1);
  EXPECT_EQ((*report)["twin_launches"], 1);
  EXPECT_EQ((*report)["violations"], 0);
  c().session().setValidation(ValidationMode::kOff);
}

// A kernel of B given A's pointer is not checked call by call: the device
// faults it because A's memory is not mapped in B's process. Sessions sharing
// one process, as here, would share VMM mappings; phosd serves each in a
// worker of its own, and tests/python/test_shim_sessions.py
// (test_a_client_cannot_touch_another_clients_memory) checks the fault there.


// ---- transfer lanes (phos/common/ipc/transfer_lane.h) -----------------------

namespace lanes {

std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed + i / 4096);
  return v;
}

uint64_t allocate(Client& c, uint64_t bytes) {
  Reply r = c.call(c.req(EntryPointId::kCuMemAlloc_v2).message(wire::cuMemAlloc_v2_Request{true, bytes}));
  EXPECT_EQ(r.result, CUDA_SUCCESS);
  return r.value(true);
}

// Lanes of 4 KiB buffers: copies of a few pages cross many chunks.
ipc::RingGeometry smallLanes() {
  ipc::RingGeometry g;
  g.laneSlotBytes = 4096;
  return g;
}

}  // namespace lanes

// The application's half as libphos.so runs it: bytes in through lane 0, out
// through lane 1, over chunk boundaries and a partial last chunk.
TEST_F(RingDecoder, CopiesThroughLanesArriveWhole) {
  const uint64_t bytes = (9u << 20) + 123;
  const uint64_t device = lanes::allocate(c(), bytes);
  const auto in = lanes::pattern(bytes, 7);
  const ipc::TransferLane to = c().lane(0), from = c().lane(1);
  ipc::resetLane(to);
  Reply r = c().call(c().req(EntryPointId::kCuMemcpyHtoD_v2).flags(ipc::laneFlags(0)).u64(device).u64(0x1000).u64(bytes),
                     [&](const std::function<bool()>& replied) { ipc::serveLane(to, in.data(), nullptr, bytes, replied); });
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  EXPECT_EQ(to.words->consumed.load(), to.chunks(bytes));
  std::vector<uint8_t> out(bytes);
  ipc::resetLane(from);
  r = c().call(c().req(EntryPointId::kCuMemcpyDtoH_v2).flags(ipc::laneFlags(1)).u64(0x1000).u64(device).u64(bytes),
               [&](const std::function<bool()>& replied) { ipc::serveLane(from, nullptr, out.data(), bytes, replied); });
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  EXPECT_TRUE(out == in);
  // Answered once the application had taken every chunk and left its half:
  // a checkpoint after the call never finds it inside the lane.
  EXPECT_EQ(from.words->consumed.load(), from.chunks(bytes));
  EXPECT_EQ(to.words->busy.load(), 0u);
  EXPECT_EQ(from.words->busy.load(), 0u);
  EXPECT_FALSE(c().session().busyLane().has_value());
  // The addresses given (0x1000, nothing there in the application) were
  // never touched: the bytes went through the lanes only.

  // Between unified addresses phosd says which way: the same both ways.
  const auto again = lanes::pattern(bytes, 11);
  ipc::resetLane(to);
  r = c().call(c().req(EntryPointId::kCuMemcpy).flags(ipc::laneFlags(0)).u64(device).u64(0x1000).u64(bytes),
               [&](const std::function<bool()>& replied) {
                 ipc::serveLane(to, again.data(), out.data(), bytes, replied);
               });
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  EXPECT_TRUE(out == in) << "phosd took the bytes from the device";
  std::fill(out.begin(), out.end(), 0);
  ipc::resetLane(from);
  r = c().call(c().req(EntryPointId::kCuMemcpy).flags(ipc::laneFlags(1)).u64(0x1000).u64(device).u64(bytes),
               [&](const std::function<bool()>& replied) {
                 ipc::serveLane(from, again.data(), out.data(), bytes, replied);
               });
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  EXPECT_TRUE(out == again);
}

// An application thread that stops feeding its lane (stopped, or a broken
// shim) does not hold its session: after a second phosd abandons the lane and
// reads the rest from the application's memory itself.
TEST_F(RingDecoder, LaneNeverFedIsAbandonedAndTheApplicationsMemoryRead) {
  Client small(++nextId_, app_->pid(), lanes::smallLanes());
  ASSERT_NO_FATAL_FAILURE(small.setUpContext());
  const auto data = lanes::pattern(16384, 3);
  ASSERT_TRUE(app_->write(kAppScratch, data));
  const uint64_t device = lanes::allocate(small, data.size());
  const ipc::TransferLane lane = small.lane(0);
  ipc::resetLane(lane);
  // Two chunks fed, then nothing.
  Reply r = small.call(small.req(EntryPointId::kCuMemcpyHtoD_v2).flags(ipc::laneFlags(0)).u64(device).u64(kAppScratch)
                           .u64(data.size()),
                       [&](const std::function<bool()>&) { ipc::serveLane(lane, data.data(), nullptr, 8192, [] { return false; }); });
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  EXPECT_EQ(lane.words->abandoned.load(), 1u);
  EXPECT_EQ(small.call(small.req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch + 16384).u64(device).u64(data.size()))
                .result,
            CUDA_SUCCESS);
  EXPECT_EQ(app_->read(kAppScratch + 16384, data.size()), data);
  small.expectStillServing();
}

// The same from the device: the application took two chunks and stopped;
// phosd writes the rest into its memory.
TEST_F(RingDecoder, LaneNeverDrainedIsAbandonedAndTheApplicationsMemoryWritten) {
  Client small(++nextId_, app_->pid(), lanes::smallLanes());
  ASSERT_NO_FATAL_FAILURE(small.setUpContext());
  const auto data = lanes::pattern(20000, 5);
  ASSERT_TRUE(app_->write(kAppScratch, data));
  const uint64_t device = lanes::allocate(small, data.size());
  ASSERT_EQ(small.call(small.req(EntryPointId::kCuMemcpyHtoD_v2).u64(device).u64(kAppScratch).u64(data.size())).result,
            CUDA_SUCCESS);
  ASSERT_TRUE(app_->write(kAppScratch + 32768, std::vector<uint8_t>(data.size(), 0)));
  const ipc::TransferLane lane = small.lane(1);
  ipc::resetLane(lane);
  std::vector<uint8_t> taken(8192);
  Reply r = small.call(small.req(EntryPointId::kCuMemcpyDtoH_v2).flags(ipc::laneFlags(1)).u64(kAppScratch + 32768)
                           .u64(device).u64(data.size()),
                       [&](const std::function<bool()>&) { ipc::serveLane(lane, nullptr, taken.data(), 8192, [] { return false; }); });
  ASSERT_EQ(r.result, CUDA_SUCCESS);
  EXPECT_EQ(lane.words->abandoned.load(), 1u);
  EXPECT_TRUE(std::equal(taken.begin(), taken.end(), data.begin()));
  // A thread still inside its half would be named to a checkpoint.
  EXPECT_FALSE(small.session().busyLane().has_value());
  lane.words->busy.store(1);
  EXPECT_EQ(small.session().busyLane(), std::optional<uint32_t>(1));
  lane.words->busy.store(0);
  // phosd wrote from the first chunk not taken on.
  auto written = app_->read(kAppScratch + 32768, data.size());
  ASSERT_EQ(written.size(), data.size());
  EXPECT_TRUE(std::equal(written.begin() + 8192, written.end(), data.begin() + 8192));
  small.expectStillServing();
}

// A lane the ring does not have is not used: the copy reads the application.
TEST_F(RingDecoder, LaneThatTheRingDoesNotHaveIsIgnored) {
  const auto data = lanes::pattern(4096, 9);
  ASSERT_TRUE(app_->write(kAppScratch, data));
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyHtoD_v2).flags(ipc::laneFlags(200)).u64(c().device)
                         .u64(kAppScratch).u64(data.size()))
                .result,
            CUDA_SUCCESS);
  EXPECT_EQ(c().call(c().req(EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch + 8192).u64(c().device).u64(4096)).result,
            CUDA_SUCCESS);
  EXPECT_EQ(app_->read(kAppScratch + 8192, 4096), data);
}

// A refused copy stops the application's half at once.
TEST_F(RingDecoder, RefusedLaneCopyStopsTheApplicationsHalf) {
  const ipc::TransferLane lane = c().lane(0);
  ipc::resetLane(lane);
  const uint64_t bytes = 64u << 20;  // far past the allocation
  std::vector<uint8_t> in(lane.bufferBytes * 3);
  Reply r = c().call(c().req(EntryPointId::kCuMemcpyHtoD_v2).flags(ipc::laneFlags(0)).u64(c().device).u64(kAppScratch)
                         .u64(bytes),
                     [&](const std::function<bool()>& replied) {
                       ipc::serveLane(lane, in.data(), nullptr, in.size(), replied);
                     });
  EXPECT_EQ(r.result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(lane.words->abandoned.load(), 1u);
  EXPECT_EQ(lane.words->consumed.load(), 0u);
}

}  // namespace
}  // namespace phos::daemon
