// SPDX-License-Identifier: Apache-2.0
// vgpu's CUDA graphs: stream capture (one stream, several joined through
// events, the calls a capture refuses and its modes) and the explicit graph
// API, each graph launched and its results checked against what the same
// work directly on a stream computes.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

// x[i] = x[i] * a + b for i < n.
constexpr const char* kScaleAddPtx = R"(
.version 8.0
.target sm_80
.address_size 64
.visible .entry scale_add(.param .u64 x, .param .u32 a, .param .u32 b, .param .u32 n)
{
  .reg .pred %p<2>;
  .reg .b32 %r<10>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [x];
  ld.param.u32 %r6, [a];
  ld.param.u32 %r7, [b];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r5, 4;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.u32 %r8, [%rd4];
  mad.lo.s32 %r9, %r8, %r6, %r7;
  st.global.u32 [%rd4], %r9;
DONE:
  ret;
}
)";

constexpr unsigned kN = 1000;

// Not DriverTest: its TearDown takes the PTX engine away (fake programs).
class GraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&device_, 0));
    ASSERT_CU(cuCtxCreate(&context_, nullptr, 0, device_));
    ASSERT_CU(cuModuleLoadData(&module_, kScaleAddPtx));
    ASSERT_CU(cuModuleGetFunction(&scaleAdd_, module_, "scale_add"));
    ASSERT_CU(cuMemAlloc(&x_, kN * sizeof(unsigned)));
    ASSERT_CU(cuMemAllocHost(reinterpret_cast<void**>(&host_), kN * sizeof(unsigned)));
    ASSERT_CU(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    (void)cuStreamDestroy(s_);
    (void)cuMemFreeHost(host_);
    (void)cuMemFree(x_);
    (void)cuModuleUnload(module_);
    if (context_ != nullptr) (void)cuCtxDestroy(context_);
  }

  // Enqueues x = x * a + b on `stream`.
  CUresult scaleAdd(CUstream stream, unsigned a, unsigned b) {
    unsigned n = kN;
    void* args[] = {&x_, &a, &b, &n};
    return cuLaunchKernel(scaleAdd_, (kN + 255) / 256, 1, 1, 256, 1, 1, 0, stream, args, nullptr);
  }
  // A kernel node's parameters for scale_add over x with `args` ({&x_, &a, &b, &n}).
  CUDA_KERNEL_NODE_PARAMS scaleAddNode(void** args) const {
    CUDA_KERNEL_NODE_PARAMS k{};
    k.func = scaleAdd_;
    k.gridDimX = (kN + 255) / 256;
    k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = 256;
    k.blockDimY = k.blockDimZ = 1;
    k.kernelParams = args;
    return k;
  }
  std::vector<unsigned> device() {
    std::vector<unsigned> out(kN);
    EXPECT_CU(cuMemcpyDtoH(out.data(), x_, kN * sizeof(unsigned)));
    return out;
  }
  static std::vector<unsigned> filled(unsigned v) { return std::vector<unsigned>(kN, v); }

  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction scaleAdd_ = nullptr;
  CUdeviceptr x_ = 0;
  unsigned* host_ = nullptr;
  CUstream s_ = nullptr;
};

TEST_F(GraphTest, CapturedWorkRunsAtEachLaunchAndNotWhileCaptured) {
  ASSERT_CU(cuMemsetD32(x_, 1, kN));
  ASSERT_CU(cuCtxSynchronize());  // the legacy stream does not order non-blocking ones
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_CU(cuStreamIsCapturing(s_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  ASSERT_CU(scaleAdd(s_, 3, 1));
  ASSERT_CU(cuMemcpyDtoHAsync(host_, x_, kN * sizeof(unsigned), s_));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  ASSERT_NE(graph, nullptr);
  EXPECT_CU(cuStreamIsCapturing(s_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  // Captured, not run.
  EXPECT_EQ(device(), filled(1));

  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  // Each launch runs the work again: 1 -> 4 -> 13, and the copy sees each.
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(4));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(13));
  // The graph stays usable after the executable graph is gone, and the other way round.
  EXPECT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  EXPECT_CU(cuGraphDestroy(graph));
  ASSERT_CU(cuGraphLaunch(exec, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(device(), filled(40));
  EXPECT_CU(cuGraphExecDestroy(exec));
}

// A destroyed executable graph is refused at its launch.
TEST_F(GraphTest, ADestroyedExecutableGraphIsNotLaunched) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(scaleAdd(s_, 3, 1));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch(exec, s_));
  EXPECT_CU(cuGraphDestroy(graph));
}

// What a capture made, seen through the graph's own API: one node per call,
// in order, with the launch's parameters; one root for a fork joined back.
TEST_F(GraphTest, ACapturedGraphHoldsANodePerCall) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(scaleAdd(s_, 3, 1));
  ASSERT_CU(cuMemcpyDtoHAsync(host_, x_, kN * sizeof(unsigned), s_));
  ASSERT_CU(cuMemsetD2D16Async(x_, 64, 0xabcd, 8, 4, s_));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  size_t count = 0;
  ASSERT_CU(cuGraphGetNodes(graph, nullptr, &count));
  ASSERT_EQ(count, 3u);
  std::vector<CUgraphNode> nodes(count);
  ASSERT_CU(cuGraphGetNodes(graph, nodes.data(), &count));
  CUgraphNodeType type{};
  ASSERT_CU(cuGraphNodeGetType(nodes[0], &type));
  EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_KERNEL);
  ASSERT_CU(cuGraphNodeGetType(nodes[1], &type));
  EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_MEMCPY);
  CUDA_KERNEL_NODE_PARAMS params{};
  ASSERT_CU(cuGraphKernelNodeGetParams(nodes[0], &params));
  EXPECT_EQ(params.func, scaleAdd_);
  EXPECT_EQ(params.gridDimX, (kN + 255) / 256);
  EXPECT_EQ(params.blockDimX, 256u);
  EXPECT_EQ(*static_cast<unsigned*>(params.kernelParams[1]), 3u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphKernelNodeGetParams(nodes[1], &params));
  // A copy is one row of a 3D copy; a set keeps its rows and pitch.
  CUDA_MEMCPY3D copy{};
  ASSERT_CU(cuGraphMemcpyNodeGetParams(nodes[1], &copy));
  EXPECT_EQ(copy.srcMemoryType, CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(copy.srcDevice, x_);
  EXPECT_EQ(copy.dstMemoryType, CU_MEMORYTYPE_HOST);
  EXPECT_EQ(copy.dstHost, host_);
  EXPECT_EQ(copy.WidthInBytes, kN * sizeof(unsigned));
  EXPECT_EQ(copy.Height, 1u);
  EXPECT_EQ(copy.Depth, 1u);
  CUDA_MEMSET_NODE_PARAMS set{};
  ASSERT_CU(cuGraphNodeGetType(nodes[2], &type));
  EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_MEMSET);
  ASSERT_CU(cuGraphMemsetNodeGetParams(nodes[2], &set));
  EXPECT_EQ(set.dst, x_);
  EXPECT_EQ(set.pitch, 64u);
  EXPECT_EQ(set.value, 0xabcdu);
  EXPECT_EQ(set.elementSize, 2u);
  EXPECT_EQ(set.width, 8u);
  EXPECT_EQ(set.height, 4u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeGetParams(nodes[1], &set));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemcpyNodeGetParams(nodes[0], &copy));
  EXPECT_CU(cuGraphDestroy(graph));

  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUevent forked = nullptr, joined = nullptr;
  ASSERT_CU(cuEventCreate(&forked, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&joined, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(scaleAdd(s_, 2, 0));
  ASSERT_CU(cuEventRecord(forked, s_));
  ASSERT_CU(cuStreamWaitEvent(other, forked, 0));
  ASSERT_CU(scaleAdd(other, 1, 5));
  ASSERT_CU(cuEventRecord(joined, other));
  ASSERT_CU(cuStreamWaitEvent(s_, joined, 0));
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  size_t roots = 0;
  ASSERT_CU(cuGraphGetRootNodes(graph, nullptr, &roots));
  EXPECT_EQ(roots, 1u);
  EXPECT_CU(cuGraphDestroy(graph));
  EXPECT_CU(cuEventDestroy(forked));
  EXPECT_CU(cuEventDestroy(joined));
  EXPECT_CU(cuStreamDestroy(other));
}

TEST_F(GraphTest, StreamsJoinACaptureThroughEventsAndMustJoinBack) {
  ASSERT_CU(cuMemsetD32(x_, 2, kN));
  ASSERT_CU(cuCtxSynchronize());  // the legacy stream does not order non-blocking ones
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUevent forked = nullptr, joined = nullptr;
  ASSERT_CU(cuEventCreate(&forked, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&joined, CU_EVENT_DISABLE_TIMING));

  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  ASSERT_CU(scaleAdd(s_, 2, 0));  // x = 2x
  ASSERT_CU(cuEventRecord(forked, s_));
  ASSERT_CU(cuStreamWaitEvent(other, forked, 0));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t originId = 0, otherId = 0;
  CUgraph capturing = nullptr;
  const CUgraphNode* last = nullptr;
  size_t lastCount = 0;
  ASSERT_CU(cuStreamGetCaptureInfo(s_, &status, &originId, &capturing, &last, nullptr, &lastCount));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_NE(capturing, nullptr);
  EXPECT_EQ(lastCount, 1u);
  ASSERT_CU(cuStreamGetCaptureInfo(other, &status, &otherId, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(otherId, originId);      // one capture sequence
  ASSERT_CU(scaleAdd(other, 1, 5));  // x = x + 5, after the fork
  ASSERT_CU(cuEventRecord(joined, other));
  ASSERT_CU(cuStreamWaitEvent(s_, joined, 0));
  ASSERT_CU(scaleAdd(s_, 10, 0));  // x = 10x, after the join
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  ASSERT_CU(cuStreamIsCapturing(other, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);  // the end ends it for every stream

  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, other));
  ASSERT_CU(cuStreamSynchronize(other));
  EXPECT_EQ(device(), filled((2 * 2 + 5) * 10));

  // A stream forked from the capture and not joined back: the end refuses.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(forked, s_));
  ASSERT_CU(cuStreamWaitEvent(other, forked, 0));
  ASSERT_CU(scaleAdd(other, 1, 1));
  CUgraph unjoined = reinterpret_cast<CUgraph>(1);
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, cuStreamEndCapture(s_, &unjoined));
  EXPECT_EQ(unjoined, nullptr);
  ASSERT_CU(cuStreamIsCapturing(other, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  // Ended on a stream that joined but did not begin it: refused.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(forked, s_));
  ASSERT_CU(cuStreamWaitEvent(other, forked, 0));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, cuStreamEndCapture(other, &unjoined));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &unjoined));

  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
  EXPECT_CU(cuEventDestroy(forked));
  EXPECT_CU(cuEventDestroy(joined));
  EXPECT_CU(cuStreamDestroy(other));
}

TEST_F(GraphTest, ACallTheCaptureCannotTakeInvalidatesIt) {
  CUgraph graph = reinterpret_cast<CUgraph>(1);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // Synchronizing the capturing stream.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamSynchronize(s_));
  ASSERT_CU(cuStreamIsCapturing(s_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, scaleAdd(s_, 1, 1));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &graph));
  EXPECT_EQ(graph, nullptr);

  // The legacy stream, while a blocking stream of its context captures.
  CUstream blocking = nullptr;
  ASSERT_CU(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  ASSERT_CU(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cuMemsetD32Async(x_, 0, kN, CU_STREAM_LEGACY));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(blocking, &graph));
  EXPECT_CU(cuStreamDestroy(blocking));

  // Allocations: refused in a global capture, allowed once the thread is relaxed.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUdeviceptr scratch = 0;
  ASSERT_CU(cuMemAlloc(&scratch, 256));
  ASSERT_CU(cuMemFree(scratch));
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  ASSERT_CU(scaleAdd(s_, 1, 1));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&scratch, 256));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &graph));
  // Stream-ordered allocations would be graph memory nodes, which vgpu does not make.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAllocAsync(&scratch, 256, s_));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &graph));

  // What cannot be captured at all, and an end without a beginning.
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamBeginCapture(s_, static_cast<CUstreamCaptureMode>(7)));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_STATE, cuStreamEndCapture(s_, &graph));
  // A capturing stream waiting for an event recorded outside the capture.
  CUevent outside = nullptr;
  ASSERT_CU(cuEventCreate(&outside, 0));
  ASSERT_CU(cuEventRecord(outside, nullptr));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cuStreamWaitEvent(s_, outside, 0));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &graph));
  EXPECT_CU(cuEventDestroy(outside));
  // After all of it the stream runs its work again.
  ASSERT_CU(cuMemsetD32Async(x_, 7, kN, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(7));
}

// cuThreadExchangeStreamCaptureMode's rules are per thread: a thread-local
// capture binds only its own thread, a global one every thread in global
// mode, and a capture not begun in relaxed mode ends in its own thread.
TEST_F(GraphTest, CaptureModesAndTheirRefusalsArePerThread) {
  // Runs `body` on a second thread with the test's context current.
  auto onOtherThread = [&](auto body) {
    std::thread([&] {
      ASSERT_CU(cuCtxSetCurrent(context_));
      body();
    }).join();
  };
  CUgraph graph = reinterpret_cast<CUgraph>(1);
  CUdeviceptr scratch = 0;
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  ASSERT_CU(scaleAdd(s_, 2, 1));
  onOtherThread([&] {
    // Another thread's thread-local capture does not bind this one.
    ASSERT_CU(cuMemAlloc(&scratch, 256));
    ASSERT_CU(cuMemFree(scratch));
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, cuStreamEndCapture(s_, &graph));
  });
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_CU(cuStreamIsCapturing(s_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);  // the refused end changed nothing
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  EXPECT_CU(cuGraphDestroy(graph));

  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(scaleAdd(s_, 2, 1));
  onOtherThread([&] {
    // A global capture binds every thread in global mode, and the refusal
    // does not invalidate another thread's capture.
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&scratch, 256));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
    ASSERT_CU(cuMemAlloc(&scratch, 256));
    ASSERT_CU(cuMemFree(scratch));
  });
  // The other thread's relaxed mode was its own.
  CUstreamCaptureMode mine = CU_STREAM_CAPTURE_MODE_GLOBAL;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mine));
  EXPECT_EQ(mine, CU_STREAM_CAPTURE_MODE_GLOBAL);
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  CUgraphExec exec = nullptr;
  // On the launch's stream: the legacy stream does not order a non-blocking one.
  ASSERT_CU(cuMemsetD32Async(x_, 1, kN, s_));
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(3));
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
}

void CUDA_CB countCall(void* counter) {
  static_cast<std::atomic<int>*>(counter)->fetch_add(1);
}

// cuGraphExecChildGraphNodeSetParams: the work of a child graph node in an
// executable graph takes the parameters of another graph of the same shape;
// the node itself, and its graph, stay as they are.
TEST_F(GraphTest, AChildGraphNodeOfAnExecutableGraphTakesAnotherGraphsParameters) {
  auto memsetGraph = [&](unsigned value, int nodes) {
    CUgraph g = nullptr;
    EXPECT_CU(cuGraphCreate(&g, 0));
    CUDA_MEMSET_NODE_PARAMS m{};
    m.dst = x_;
    m.value = value;
    m.elementSize = 4;
    m.width = kN;
    m.height = 1;
    CUgraphNode last = nullptr;
    for (int i = 0; i < nodes; ++i) {
      CUgraphNode node = nullptr;
      EXPECT_CU(cuGraphAddMemsetNode(&node, g, last != nullptr ? &last : nullptr,
                                     last != nullptr ? 1 : 0, &m, context_));
      last = node;
    }
    return g;
  };
  CUgraph child = memsetGraph(1, 1), other = memsetGraph(2, 1), twoNodes = memsetGraph(3, 2);
  CUgraph top = nullptr;
  ASSERT_CU(cuGraphCreate(&top, 0));
  CUgraphNode node = nullptr, empty = nullptr;
  ASSERT_CU(cuGraphAddChildGraphNode(&node, top, nullptr, 0, child));
  ASSERT_CU(cuGraphAddEmptyNode(&empty, top, &node, 1));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, top, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(1));
  ASSERT_CU(cuGraphExecChildGraphNodeSetParams(exec, node, other));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(2));
  // Another shape, or a node that is not a child graph node: refused, nothing changed.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecChildGraphNodeSetParams(exec, node, twoNodes));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecChildGraphNodeSetParams(exec, empty, other));
  ASSERT_CU(cuMemsetD32(x_, 0, kN));
  ASSERT_CU(cuCtxSynchronize());  // the legacy stream does not order non-blocking ones
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(2));
  // The graph it was instantiated from still sets 1.
  CUgraphExec again = nullptr;
  ASSERT_CU(cuGraphInstantiate(&again, top, 0));
  ASSERT_CU(cuGraphLaunch(again, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(1));
  EXPECT_CU(cuGraphExecDestroy(again));
  EXPECT_CU(cuGraphExecDestroy(exec));
  for (CUgraph g : {top, child, other, twoNodes}) EXPECT_CU(cuGraphDestroy(g));
}

TEST_F(GraphTest, ExplicitNodesRunInTheirDependenciesOrder) {
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphCreate(&graph, 1));
  CUgraphNode memset = nullptr, kernel = nullptr, copy = nullptr, host = nullptr, empty = nullptr;
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = x_;
  m.value = 5;
  m.elementSize = 4;
  m.width = kN;
  m.height = 1;
  ASSERT_CU(cuGraphAddMemsetNode(&memset, graph, nullptr, 0, &m, context_));
  unsigned a = 3, b = 2, n = kN;
  void* args[] = {&x_, &a, &b, &n};
  CUDA_KERNEL_NODE_PARAMS k = scaleAddNode(args);
  ASSERT_CU(cuGraphAddKernelNode(&kernel, graph, &memset, 1, &k));
  a = 100;  // the node keeps the arguments it was given
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = x_;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = host_;
  c.WidthInBytes = kN * sizeof(unsigned);
  c.Height = 1;
  c.Depth = 1;
  ASSERT_CU(cuGraphAddMemcpyNode(&copy, graph, &kernel, 1, &c, context_));
  std::atomic<int> calls{0};
  CUDA_HOST_NODE_PARAMS h{&countCall, &calls};
  ASSERT_CU(cuGraphAddHostNode(&host, graph, &copy, 1, &h));
  ASSERT_CU(cuGraphAddEmptyNode(&empty, graph, &host, 1));
  // Bad parameters name no node.
  CUgraphNode bad = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEmptyNode(&bad, graph, nullptr, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddKernelNode(&bad, graph, &memset, 1, nullptr));
  const CUgraphNode twice[] = {memset, memset};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEmptyNode(&bad, graph, twice, 2));
  m.elementSize = 3;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddMemsetNode(&bad, graph, nullptr, 0, &m, context_));

  // A graph that runs the first one as its child, then its own kernel.
  CUgraph outer = nullptr;
  CUgraphNode child = nullptr, after = nullptr;
  ASSERT_CU(cuGraphCreate(&outer, 0));
  ASSERT_CU(cuGraphAddChildGraphNode(&child, outer, nullptr, 0, graph));
  b = 0;
  a = 2;
  ASSERT_CU(cuGraphAddKernelNode(&after, outer, &child, 1, &k));
  CUgraphNodeType type{};
  ASSERT_CU(cuGraphNodeGetType(child, &type));
  EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_GRAPH);

  CUgraphExec exec = nullptr, outerExec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(5 * 3 + 2));
  EXPECT_EQ(calls.load(), 1);
  ASSERT_CU(cuGraphInstantiate(&outerExec, outer, 0));
  ASSERT_CU(cuGraphLaunch(outerExec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled((5 * 3 + 2) * 2));
  EXPECT_EQ(calls.load(), 2);

  // A cycle cannot be instantiated; an edge named twice is refused.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddDependencies(graph, &memset, &kernel, nullptr, 1));
  ASSERT_CU(cuGraphAddDependencies(graph, &empty, &memset, nullptr, 1));
  CUgraphExec cyclic = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiate(&cyclic, graph, 0));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED,
                cuGraphInstantiate(&cyclic, outer, CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH));

  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphExecDestroy(outerExec));
  EXPECT_CU(cuGraphDestroy(outer));
  EXPECT_CU(cuGraphDestroy(graph));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphDestroy(graph));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphNodeGetType(memset, &type));
}

TEST_F(GraphTest, AnExecutableGraphsKernelTakesNewParametersAndTheGraphKeepsItsOwn) {
  ASSERT_CU(cuMemsetD32(x_, 1, kN));
  ASSERT_CU(cuCtxSynchronize());  // the legacy stream does not order non-blocking ones
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(scaleAdd(s_, 3, 1));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  CUgraphNode kernel = nullptr;
  size_t count = 1;
  ASSERT_CU(cuGraphGetNodes(graph, &kernel, &count));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  CUDA_KERNEL_NODE_PARAMS p{};
  ASSERT_CU(cuGraphKernelNodeGetParams(kernel, &p));
  unsigned a = 5, b = 0, n = kN;
  void* args[] = {&x_, &a, &b, &n};
  p.kernelParams = args;
  ASSERT_CU(cuGraphExecKernelNodeSetParams(exec, kernel, &p));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(5));
  // The graph's node is unchanged: a new instantiation runs x * 3 + 1.
  CUgraphExec again = nullptr;
  ASSERT_CU(cuGraphInstantiate(&again, graph, 0));
  ASSERT_CU(cuGraphLaunch(again, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(16));
  ASSERT_CU(cuGraphKernelNodeGetParams(kernel, &p));
  EXPECT_EQ(*static_cast<unsigned*>(p.kernelParams[1]), 3u);
  // Only a kernel node of the graph it was instantiated from.
  CUgraphNode empty = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&empty, graph, nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecKernelNodeSetParams(exec, empty, &p));
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphExecDestroy(again));
  EXPECT_CU(cuGraphDestroy(graph));
}

TEST_F(GraphTest, EventNodesRecordAndWaitAtEachLaunch) {
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, 0));
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  // A graph that waits for `e`, then sets x to 9.
  CUgraph waits = nullptr;
  ASSERT_CU(cuGraphCreate(&waits, 0));
  CUgraphNode wait = nullptr, set = nullptr;
  ASSERT_CU(cuGraphAddEventWaitNode(&wait, waits, nullptr, 0, e));
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = x_;
  m.value = 9;
  m.elementSize = 4;
  m.width = kN;
  m.height = 1;
  ASSERT_CU(cuGraphAddMemsetNode(&set, waits, &wait, 1, &m, context_));
  CUevent got = nullptr;
  ASSERT_CU(cuGraphEventWaitNodeGetEvent(wait, &got));
  EXPECT_EQ(got, e);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphEventRecordNodeGetEvent(wait, &got));
  CUgraphExec waitsExec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&waitsExec, waits, 0));

  // `e` recorded behind a closed gate: the graph's memset waits for it.
  ASSERT_CU(cuMemsetD32(x_, 1, kN));
  ASSERT_CU(cuCtxSynchronize());  // the legacy stream does not order non-blocking ones
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(s_, &Gate::wait, &gate));
  ASSERT_CU(cuEventRecord(e, s_));
  ASSERT_CU(cuGraphLaunch(waitsExec, other));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(other));
  gate.release();
  ASSERT_CU(cuStreamSynchronize(other));
  EXPECT_EQ(device(), filled(9));

  // A graph that records `e` after its kernel: the host waits for it there.
  CUgraph records = nullptr;
  ASSERT_CU(cuGraphCreate(&records, 0));
  CUgraphNode kernel = nullptr, record = nullptr;
  unsigned a = 2, b = 0, n = kN;
  void* args[] = {&x_, &a, &b, &n};
  CUDA_KERNEL_NODE_PARAMS k = scaleAddNode(args);
  ASSERT_CU(cuGraphAddKernelNode(&kernel, records, nullptr, 0, &k));
  ASSERT_CU(cuGraphAddEventRecordNode(&record, records, &kernel, 1, e));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddEventRecordNode(&record, records, nullptr, 0, nullptr));
  CUgraphExec recordsExec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&recordsExec, records, 0));
  ASSERT_CU(cuGraphLaunch(recordsExec, s_));
  ASSERT_CU(cuEventSynchronize(e));
  EXPECT_EQ(device(), filled(18));

  EXPECT_CU(cuGraphExecDestroy(waitsExec));
  EXPECT_CU(cuGraphExecDestroy(recordsExec));
  EXPECT_CU(cuGraphDestroy(waits));
  EXPECT_CU(cuGraphDestroy(records));
  EXPECT_CU(cuStreamDestroy(other));
  EXPECT_CU(cuEventDestroy(e));
}

TEST_F(GraphTest, EdgesAreListedRemovedAndFollowAStreamsUpdatedDependencies) {
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  CUgraphNode a = nullptr, b = nullptr, c = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&a, graph, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&b, graph, &a, 1));
  const CUgraphNode ab[] = {a, b};
  ASSERT_CU(cuGraphAddEmptyNode(&c, graph, ab, 2));
  size_t count = 0;
  ASSERT_CU(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
  EXPECT_EQ(count, 3u);
  std::vector<CUgraphNode> from(4), to(4);
  count = 4;
  ASSERT_CU(cuGraphGetEdges(graph, from.data(), to.data(), nullptr, &count));
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(from[3], nullptr);
  CUgraphNode deps[2] = {};
  count = 2;
  ASSERT_CU(cuGraphNodeGetDependencies(c, deps, nullptr, &count));
  EXPECT_EQ(count, 2u);
  EXPECT_EQ(deps[0], a);
  EXPECT_EQ(deps[1], b);
  ASSERT_CU(cuGraphNodeGetDependentNodes(a, nullptr, nullptr, &count));
  EXPECT_EQ(count, 2u);
  ASSERT_CU(cuGraphRemoveDependencies(graph, &a, &c, nullptr, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphRemoveDependencies(graph, &a, &c, nullptr, 1));
  ASSERT_CU(cuGraphDestroyNode(b));
  ASSERT_CU(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
  EXPECT_EQ(count, 0u);
  ASSERT_CU(cuGraphGetRootNodes(graph, nullptr, &count));
  EXPECT_EQ(count, 2u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphDestroyNode(b));
  EXPECT_CU(cuGraphDestroy(graph));

  // A capture whose stream's dependencies are replaced: the next node is a root.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(scaleAdd(s_, 1, 1));
  ASSERT_CU(cuStreamUpdateCaptureDependencies(s_, nullptr, nullptr, 0,
                                              CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  ASSERT_CU(scaleAdd(s_, 1, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamUpdateCaptureDependencies(s_, nullptr, nullptr, 0, 7));
  // CUDA 11.3's form (no edge data), which programs built then call by its name.
  using UpdateWithoutEdges = CUresult (*)(CUstream, CUgraphNode*, size_t, unsigned);
  for (const char* name :
       {"cuStreamUpdateCaptureDependencies", "cuStreamUpdateCaptureDependencies_ptsz"}) {
    auto update = reinterpret_cast<UpdateWithoutEdges>(dlsym(RTLD_DEFAULT, name));
    ASSERT_NE(update, nullptr) << name;
    EXPECT_CU(update(s_, nullptr, 0, CU_STREAM_ADD_CAPTURE_DEPENDENCIES)) << name;
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, update(s_, nullptr, 0, 7)) << name;
  }
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  ASSERT_CU(cuGraphGetRootNodes(graph, nullptr, &count));
  EXPECT_EQ(count, 2u);
  EXPECT_CU(cuGraphDestroy(graph));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_STATE,
                cuStreamUpdateCaptureDependencies(s_, nullptr, nullptr, 0,
                                                  CU_STREAM_ADD_CAPTURE_DEPENDENCIES));

  // Captured into the application's graph, after one of its nodes: the end
  // returns that graph, and an invalidated capture leaves it to the application.
  ASSERT_CU(cuGraphCreate(&graph, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&a, graph, nullptr, 0));
  ASSERT_CU(cuStreamBeginCaptureToGraph(s_, graph, &a, nullptr, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(scaleAdd(s_, 1, 1));
  CUgraph captured = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &captured));
  EXPECT_EQ(captured, graph);
  ASSERT_CU(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
  EXPECT_EQ(count, 1u);
  ASSERT_CU(
      cuStreamBeginCaptureToGraph(s_, graph, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamSynchronize(s_));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &captured));
  ASSERT_CU(cuGraphGetNodes(graph, nullptr, &count));
  EXPECT_EQ(count, 2u);
  EXPECT_CU_ERR(
      CUDA_ERROR_INVALID_VALUE,
      cuStreamBeginCaptureToGraph(s_, graph, &b, nullptr, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(cuGraphDestroy(graph));
}

TEST_F(GraphTest, NodeParametersAreSetInTheGraphOrInOneExecutableGraph) {
  // memset x to 2, then x = x * 3 + 1, then x copied into host_, then a host function.
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = x_;
  m.value = 2;
  m.elementSize = 4;
  m.width = kN;
  m.height = 1;
  CUgraphNode set = nullptr, kernel = nullptr, copy = nullptr, host = nullptr;
  ASSERT_CU(cuGraphAddMemsetNode(&set, graph, nullptr, 0, &m, context_));
  unsigned a = 3, b = 1, n = kN;
  void* args[] = {&x_, &a, &b, &n};
  CUDA_KERNEL_NODE_PARAMS k = scaleAddNode(args);
  ASSERT_CU(cuGraphAddKernelNode(&kernel, graph, &set, 1, &k));
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = x_;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = host_;
  c.WidthInBytes = kN * sizeof(unsigned);
  c.Height = c.Depth = 1;
  ASSERT_CU(cuGraphAddMemcpyNode(&copy, graph, &kernel, 1, &c, context_));
  int calls = 0, otherCalls = 0;
  CUDA_HOST_NODE_PARAMS h{[](void* p) { ++*static_cast<int*>(p); }, &calls};
  ASSERT_CU(cuGraphAddHostNode(&host, graph, &copy, 1, &h));
  CUDA_HOST_NODE_PARAMS asked{};
  ASSERT_CU(cuGraphHostNodeGetParams(host, &asked));
  EXPECT_EQ(asked.fn, h.fn);
  EXPECT_EQ(asked.userData, &calls);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphHostNodeGetParams(kernel, &asked));

  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(7));
  EXPECT_EQ(calls, 1);

  // In the executable graph only: set to 4, x * 5, the other counter.
  m.value = 4;
  ASSERT_CU(cuGraphExecMemsetNodeSetParams(exec, set, &m, context_));
  a = 5;
  ASSERT_CU(cuGraphExecKernelNodeSetParams(exec, kernel, &k));
  CUDA_HOST_NODE_PARAMS other{h.fn, &otherCalls};
  ASSERT_CU(cuGraphExecHostNodeSetParams(exec, host, &other));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(21));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(otherCalls, 1);
  // A disabled kernel runs as an empty node; enabled again, it runs.
  ASSERT_CU(cuGraphNodeSetEnabled(exec, kernel, 0));
  unsigned enabled = 1;
  ASSERT_CU(cuGraphNodeGetEnabled(exec, kernel, &enabled));
  EXPECT_EQ(enabled, 0u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphNodeSetEnabled(exec, host, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(4));
  ASSERT_CU(cuGraphNodeSetEnabled(exec, kernel, 1));

  // In the graph: a new instantiation runs set to 6, x * 2 + 1; the first
  // executable graph takes it with cuGraphExecUpdate, and keeps its node disabled.
  m.value = 6;
  ASSERT_CU(cuGraphMemsetNodeSetParams(set, &m));
  a = 2;
  ASSERT_CU(cuGraphKernelNodeSetParams(kernel, &k));
  ASSERT_CU(cuGraphHostNodeSetParams(host, &other));
  ASSERT_CU(cuGraphMemcpyNodeSetParams(copy, &c));
  CUgraphExec again = nullptr;
  ASSERT_CU(cuGraphInstantiate(&again, graph, 0));
  ASSERT_CU(cuGraphLaunch(again, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(13));
  EXPECT_EQ(otherCalls, 3);
  CUgraphExecUpdateResultInfo info{};
  ASSERT_CU(cuGraphNodeSetEnabled(exec, kernel, 0));
  ASSERT_CU(cuGraphExecUpdate(exec, graph, &info));
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_SUCCESS);
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(6));
  // A graph of another shape is refused, saying why.
  CUgraphNode extra = nullptr;
  ASSERT_CU(cuGraphAddKernelNode(&extra, graph, &host, 1, &k));
  EXPECT_CU_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cuGraphExecUpdate(exec, graph, &info));
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
  // Parameters of another node type are refused, and memory that is not allocated.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeSetParams(kernel, &m));
  CUDA_MEMSET_NODE_PARAMS stray = m;
  stray.dst = 0x1000;
  CUgraphNode refused = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddMemsetNode(&refused, graph, nullptr, 0, &stray, context_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeSetParams(set, &stray));
  CUDA_MEMCPY3D strayCopy = c;
  strayCopy.srcDevice = 0x1000;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddMemcpyNode(&refused, graph, nullptr, 0, &strayCopy, context_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphExecMemcpyNodeSetParams(exec, copy, &strayCopy, context_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphExecMemsetNodeSetParams(exec, kernel, &m, context_));

  // A clone's nodes are found from the original's.
  CUgraph clone = nullptr;
  ASSERT_CU(cuGraphClone(&clone, graph));
  CUgraphNode found = nullptr;
  ASSERT_CU(cuGraphNodeFindInClone(&found, kernel, clone));
  CUgraphNodeType type{};
  ASSERT_CU(cuGraphNodeGetType(found, &type));
  EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_KERNEL);
  EXPECT_NE(found, kernel);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphNodeFindInClone(&found, kernel, graph));
  EXPECT_CU(cuGraphDestroy(clone));
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphExecDestroy(again));
  EXPECT_CU(cuGraphDestroy(graph));
}

TEST_F(GraphTest, AnEventNodesEventIsSetInTheGraphOrInOneExecutableGraph) {
  CUevent first = nullptr, second = nullptr;
  ASSERT_CU(cuEventCreate(&first, 0));
  ASSERT_CU(cuEventCreate(&second, 0));
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  CUgraphNode record = nullptr;
  ASSERT_CU(cuGraphAddEventRecordNode(&record, graph, nullptr, 0, first));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphExecEventRecordNodeSetEvent(exec, record, second));
  CUevent asked = nullptr;
  ASSERT_CU(cuGraphEventRecordNodeGetEvent(record, &asked));
  EXPECT_EQ(asked, first);  // the graph keeps its own
  ASSERT_CU(cuGraphEventRecordNodeSetEvent(record, second));
  ASSERT_CU(cuGraphEventRecordNodeGetEvent(record, &asked));
  EXPECT_EQ(asked, second);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphEventWaitNodeSetEvent(record, first));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecEventWaitNodeSetEvent(exec, record, first));
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
  EXPECT_CU(cuEventDestroy(first));
  EXPECT_CU(cuEventDestroy(second));
}

TEST_F(GraphTest, ACapturedHostFunctionRunsAtEachLaunch) {
  int calls = 0;
  CUhostFn count = [](void* p) { ++*static_cast<int*>(p); };
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(scaleAdd(s_, 1, 1));
  ASSERT_CU(cuLaunchHostFunc(s_, count, &calls));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  EXPECT_EQ(calls, 0);  // captured, not run
  size_t count_ = 0;
  ASSERT_CU(cuGraphGetNodes(graph, nullptr, &count_));
  ASSERT_EQ(count_, 2u);
  std::vector<CUgraphNode> nodes(count_);
  ASSERT_CU(cuGraphGetNodes(graph, nodes.data(), &count_));
  CUgraphNodeType type{};
  ASSERT_CU(cuGraphNodeGetType(nodes[1], &type));
  ASSERT_EQ(type, CU_GRAPH_NODE_TYPE_HOST);
  CUDA_HOST_NODE_PARAMS asked{};
  ASSERT_CU(cuGraphHostNodeGetParams(nodes[1], &asked));
  EXPECT_EQ(asked.fn, count);  // the application's function, whoever runs it
  EXPECT_EQ(asked.userData, &calls);
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(calls, 3);
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
}

TEST_F(GraphTest, KernelNodeAttributesAreKeptCopiedAndACapturedCooperativeLaunchHasOne) {
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  unsigned a = 3, b = 1, n = kN;
  void* args[] = {&x_, &a, &b, &n};
  CUDA_KERNEL_NODE_PARAMS k = scaleAddNode(args);
  CUgraphNode first = nullptr, second = nullptr, empty = nullptr;
  ASSERT_CU(cuGraphAddKernelNode(&first, graph, nullptr, 0, &k));
  ASSERT_CU(cuGraphAddKernelNode(&second, graph, &first, 1, &k));
  ASSERT_CU(cuGraphAddEmptyNode(&empty, graph, nullptr, 0));
  // Unset: zero.
  CUkernelNodeAttrValue value{};
  value.priority = 7;
  ASSERT_CU(cuGraphKernelNodeGetAttribute(first, CU_LAUNCH_ATTRIBUTE_PRIORITY, &value));
  EXPECT_EQ(value.priority, 0);
  value.priority = -3;
  ASSERT_CU(cuGraphKernelNodeSetAttribute(first, CU_LAUNCH_ATTRIBUTE_PRIORITY, &value));
  CUkernelNodeAttrValue cooperative{};
  cooperative.cooperative = 1;
  ASSERT_CU(cuGraphKernelNodeSetAttribute(first, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &cooperative));
  // New parameters keep the attributes.
  ASSERT_CU(cuGraphKernelNodeSetParams(first, &k));
  CUkernelNodeAttrValue got{};
  ASSERT_CU(cuGraphKernelNodeGetAttribute(first, CU_LAUNCH_ATTRIBUTE_PRIORITY, &got));
  EXPECT_EQ(got.priority, -3);
  ASSERT_CU(cuGraphKernelNodeGetAttribute(first, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &got));
  EXPECT_EQ(got.cooperative, 1);
  ASSERT_CU(cuGraphKernelNodeCopyAttributes(second, first));
  ASSERT_CU(cuGraphKernelNodeGetAttribute(second, CU_LAUNCH_ATTRIBUTE_PRIORITY, &got));
  EXPECT_EQ(got.priority, -3);
  // Beyond cuCtxGetStreamPriorityRange's [-5, 0], clamped into it, as NVIDIA's driver does.
  for (auto [asked, kept] : {std::pair{1, 0}, std::pair{-9, -5}}) {
    value.priority = asked;
    ASSERT_CU(cuGraphKernelNodeSetAttribute(second, CU_LAUNCH_ATTRIBUTE_PRIORITY, &value));
    ASSERT_CU(cuGraphKernelNodeGetAttribute(second, CU_LAUNCH_ATTRIBUTE_PRIORITY, &got));
    EXPECT_EQ(got.priority, kept) << asked;
  }
  // Both nodes still run: x = (x * 3 + 1) * 3 + 1 from 0.
  ASSERT_CU(cuMemsetD32(x_, 0, kN));
  ASSERT_CU(cuCtxSynchronize());  // the legacy stream does not order non-blocking ones
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(device(), filled(4));
  // What vgpu refuses, and misuse.
  CUkernelNodeAttrValue cluster{};
  cluster.clusterDim.x = 2;
  cluster.clusterDim.y = cluster.clusterDim.z = 1;
  EXPECT_CU_ERR(
      CUDA_ERROR_NOT_SUPPORTED,
      cuGraphKernelNodeSetAttribute(first, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &cluster));
  EXPECT_CU_ERR(
      CUDA_ERROR_NOT_SUPPORTED,
      cuGraphKernelNodeGetAttribute(first, CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT, &got));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphKernelNodeGetAttribute(empty, CU_LAUNCH_ATTRIBUTE_PRIORITY, &got));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphKernelNodeCopyAttributes(second, empty));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphKernelNodeSetAttribute(first, CU_LAUNCH_ATTRIBUTE_PRIORITY, nullptr));
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));

  // A cooperative launch captured: its node says so.
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuLaunchCooperativeKernel(scaleAdd_, 1, 1, 1, 256, 1, 1, 0, s_, args));
  ASSERT_CU(cuStreamEndCapture(s_, &graph));
  size_t count = 1;
  CUgraphNode captured = nullptr;
  ASSERT_CU(cuGraphGetNodes(graph, &captured, &count));
  ASSERT_EQ(count, 1u);
  ASSERT_CU(cuGraphKernelNodeGetAttribute(captured, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &got));
  EXPECT_EQ(got.cooperative, 1);
  EXPECT_CU(cuGraphDestroy(graph));
}

TEST_F(GraphTest, TheGenericNodeEntryPointsAreThePerKindOnes) {
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  // A memset of x to 2, x = x * 3 + 1, a copy into host_, a host function,
  // an event record: each made by cuGraphAddNode.
  CUgraphNodeParams p{};
  p.type = CU_GRAPH_NODE_TYPE_MEMSET;
  p.memset.dst = x_;
  p.memset.value = 2;
  p.memset.elementSize = 4;
  p.memset.width = kN;
  p.memset.height = 1;
  p.memset.ctx = context_;
  CUgraphNode set = nullptr, kernel = nullptr, copy = nullptr, host = nullptr, record = nullptr;
  ASSERT_CU(cuGraphAddNode(&set, graph, nullptr, nullptr, 0, &p));
  unsigned a = 3, b = 1, n = kN;
  void* args[] = {&x_, &a, &b, &n};
  const CUDA_KERNEL_NODE_PARAMS k = scaleAddNode(args);
  p = CUgraphNodeParams{};
  p.type = CU_GRAPH_NODE_TYPE_KERNEL;
  p.kernel.func = k.func;
  p.kernel.gridDimX = k.gridDimX;
  p.kernel.gridDimY = p.kernel.gridDimZ = 1;
  p.kernel.blockDimX = k.blockDimX;
  p.kernel.blockDimY = p.kernel.blockDimZ = 1;
  p.kernel.kernelParams = args;
  const CUgraphNodeParams kernelParams = p;
  // Edge data given: the edges are the default ones.
  CUgraphEdgeData edge{};
  ASSERT_CU(cuGraphAddNode(&kernel, graph, &set, &edge, 1, &p));
  p = CUgraphNodeParams{};
  p.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  p.memcpy.copyCtx = context_;
  p.memcpy.copyParams.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.memcpy.copyParams.srcDevice = x_;
  p.memcpy.copyParams.dstMemoryType = CU_MEMORYTYPE_HOST;
  p.memcpy.copyParams.dstHost = host_;
  p.memcpy.copyParams.WidthInBytes = kN * sizeof(unsigned);
  p.memcpy.copyParams.Height = p.memcpy.copyParams.Depth = 1;
  ASSERT_CU(cuGraphAddNode(&copy, graph, &kernel, nullptr, 1, &p));
  int calls = 0;
  p = CUgraphNodeParams{};
  p.type = CU_GRAPH_NODE_TYPE_HOST;
  p.host.fn = [](void* c) { ++*static_cast<int*>(c); };
  p.host.userData = &calls;
  ASSERT_CU(cuGraphAddNode(&host, graph, &copy, nullptr, 1, &p));
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, 0));
  p = CUgraphNodeParams{};
  p.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
  p.eventRecord.event = e;
  ASSERT_CU(cuGraphAddNode(&record, graph, &host, nullptr, 1, &p));
  size_t edges = 0;
  ASSERT_CU(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  EXPECT_EQ(edges, 4u);
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(7));
  EXPECT_EQ(calls, 1);
  EXPECT_CU(cuEventQuery(e));

  // x * 5 + 1 in the executable graph only, then x * 2 + 1 in the graph.
  p = kernelParams;
  a = 5;
  ASSERT_CU(cuGraphExecNodeSetParams(exec, kernel, &p));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(std::vector<unsigned>(host_, host_ + kN), filled(11));
  a = 2;
  ASSERT_CU(cuGraphNodeSetParams(kernel, &p));
  CUDA_KERNEL_NODE_PARAMS asked{};
  ASSERT_CU(cuGraphKernelNodeGetParams(kernel, &asked));
  EXPECT_EQ(*static_cast<unsigned*>(asked.kernelParams[1]), 2u);

  // What the union says wrong is refused.
  p.reserved0[1] = 1;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphNodeSetParams(kernel, &p));
  p = CUgraphNodeParams{};
  p.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  CUgraphNode refused = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuGraphAddNode(&refused, graph, nullptr, nullptr, 0, &p));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddNode(&refused, graph, nullptr, nullptr, 0, nullptr));
  EXPECT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU(cuGraphDestroy(graph));
  EXPECT_CU(cuEventDestroy(e));
}

// "Returns the flags that were passed to instantiation."
TEST_F(GraphTest, AnExecutableGraphKeepsItsInstantiateFlags) {
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  CUgraphNode empty = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&empty, graph, nullptr, 0));
  CUgraphExec plain = nullptr, prioritized = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&plain, graph, 0));
  ASSERT_CU(cuGraphInstantiateWithFlags(&prioritized, graph,
                                        CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY));
  cuuint64_t flags = 99;
  ASSERT_CU(cuGraphExecGetFlags(plain, &flags));
  EXPECT_EQ(flags, 0u);
  ASSERT_CU(cuGraphExecGetFlags(prioritized, &flags));
  EXPECT_EQ(flags, static_cast<cuuint64_t>(CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecGetFlags(plain, nullptr));
  EXPECT_CU(cuGraphExecDestroy(prioritized));
  EXPECT_CU(cuGraphExecDestroy(plain));
  EXPECT_CU(cuGraphDestroy(graph));
}

// cuGraphDebugDotPrint writes the graph in DOT: a cluster per graph, the
// child graph's inside its node's, a node per graph node with its type (and
// its parameters when asked), an edge per dependency. Through PhOS the file
// is written by the shim, where the application named it.
TEST_F(GraphTest, DebugDotPrintWritesTheGraphWhereAsked) {
  CUgraph inner = nullptr, outer = nullptr;
  ASSERT_CU(cuGraphCreate(&inner, 0));
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = x_;
  m.value = 5;
  m.elementSize = 4;
  m.width = kN;
  m.height = 1;
  CUgraphNode memset = nullptr, kernel = nullptr, child = nullptr, empty = nullptr;
  ASSERT_CU(cuGraphAddMemsetNode(&memset, inner, nullptr, 0, &m, context_));
  unsigned a = 3, b = 2, n = kN;
  void* args[] = {&x_, &a, &b, &n};
  CUDA_KERNEL_NODE_PARAMS k = scaleAddNode(args);
  ASSERT_CU(cuGraphAddKernelNode(&kernel, inner, &memset, 1, &k));
  ASSERT_CU(cuGraphCreate(&outer, 0));
  ASSERT_CU(cuGraphAddChildGraphNode(&child, outer, nullptr, 0, inner));
  ASSERT_CU(cuGraphAddEmptyNode(&empty, outer, &child, 1));

  char dir[] = "/tmp/graph_dot.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/graph.dot";
  auto read = [&] {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  ASSERT_CU(cuGraphDebugDotPrint(outer, path.c_str(), CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE));
  const std::string verbose = read();
  EXPECT_EQ(verbose.rfind("digraph", 0), 0u) << verbose;
  for (const char* part :
       {"GRAPH", "EMPTY", "MEMSET", "KERNEL", "scale_add", "grid (", "value 0x5", "->"}) {
    EXPECT_NE(verbose.find(part), std::string::npos) << part << " missing from\n" << verbose;
  }
  // Without flags: types and names, no parameters.
  ASSERT_CU(cuGraphDebugDotPrint(outer, path.c_str(), 0));
  const std::string plain = read();
  EXPECT_NE(plain.find("scale_add"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("grid ("), std::string::npos) << plain;
  EXPECT_LT(plain.size(), verbose.size());
  // Where it cannot be written, and no path.
  EXPECT_CU_ERR(CUDA_ERROR_OPERATING_SYSTEM,
                cuGraphDebugDotPrint(outer, (std::string(dir) + "/missing/graph.dot").c_str(), 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphDebugDotPrint(outer, nullptr, 0));
  std::remove(path.c_str());
  rmdir(dir);
  EXPECT_CU(cuGraphDestroy(outer));
  EXPECT_CU(cuGraphDestroy(inner));
}

}  // namespace
// User objects: a destructor that runs once the last reference goes, on a
// thread of the driver's. Graphs own references (moved or new), clones and
// executable graphs own new ones, and a launch keeps its executable graph's
// until it has run.
void countDestruction(void* p) {
  static_cast<std::atomic<int>*>(p)->fetch_add(1);
}

bool destroyedWithin(const std::atomic<int>& flag, int want) {
  for (int i = 0; i < 2000 && flag.load() < want; ++i) {  // up to 10 s: it runs asynchronously
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return flag.load() == want;
}

TEST_F(GraphTest, UserObjectsLiveAsLongAsTheirLastReference) {
  std::atomic<int> destroyed{0};
  CUuserObject object = nullptr;
  ASSERT_CU(cuUserObjectCreate(&object, &destroyed, countDestruction, 2,
                               CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  ASSERT_CU(cuUserObjectRetain(object, 1));  // the caller holds 3
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  ASSERT_CU(
      cuGraphRetainUserObject(graph, object, 2, CU_GRAPH_USER_OBJECT_MOVE));  // caller 1, graph 2
  ASSERT_CU(cuGraphRetainUserObject(graph, object, 1, 0));                    // graph 3
  EXPECT_CU(cuGraphReleaseUserObject(graph, object, 1));                      // graph 2
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphReleaseUserObject(graph, object, 5));
  CUgraphNode empty = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&empty, graph, nullptr, 0));
  CUgraph clone = nullptr;
  ASSERT_CU(cuGraphClone(&clone, graph));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuUserObjectRelease(object, 1));  // the caller's last
  ASSERT_CU(cuGraphDestroy(graph));
  ASSERT_CU(cuGraphDestroy(clone));
  EXPECT_EQ(destroyed.load(), 0) << "the executable graph still holds references";
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_TRUE(destroyedWithin(destroyed, 1)) << destroyed.load();
  // Refused: no destructor, other flags, counts of 0, a released object.
  CUuserObject other = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuUserObjectCreate(&other, nullptr, nullptr, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuUserObjectCreate(&other, &destroyed, countDestruction, 1, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuUserObjectCreate(&other, &destroyed, countDestruction,
                                                             0, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuUserObjectRetain(object, 1));
  ASSERT_CU(cuUserObjectCreate(&other, &destroyed, countDestruction, 1,
                               CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuUserObjectRelease(other, 0));
  ASSERT_CU(cuUserObjectRelease(other, 1));
  EXPECT_TRUE(destroyedWithin(destroyed, 2)) << destroyed.load();
}

}  // namespace phos::vgpu::testing
