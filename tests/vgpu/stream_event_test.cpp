// SPDX-License-Identifier: Apache-2.0
// vgpu's streams and events: asynchronous work on worker threads with CUDA's ordering and errors.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

using StreamTest = DriverTest;

struct Log {
  std::mutex mutex;
  std::vector<int> order;
  void add(int v) {
    std::lock_guard lock(mutex);
    order.push_back(v);
  }
};

template <int N>
void CUDA_CB append(void* log) {
  static_cast<Log*>(log)->add(N);
}

TEST_F(StreamTest, WorkRunsAsynchronouslyAndInOrder) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Gate gate;
  Log log;
  ASSERT_CU(cuLaunchHostFunc(s, &Gate::wait, &gate));
  ASSERT_CU(cuLaunchHostFunc(s, &append<1>, &log));
  ASSERT_CU(cuLaunchHostFunc(s, &append<2>, &log));
  // The calls returned while the stream is blocked: work is asynchronous.
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  gate.release();
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuStreamQuery(s));
  EXPECT_EQ(log.order, (std::vector<int>{1, 2}));
  EXPECT_CU(cuStreamDestroy(s));
}

TEST_F(StreamTest, CreateDestroyAndProperties) {
  CUstream s = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamCreate(nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamCreate(&s, 0x4));
  ASSERT_CU(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -100));
  int priority = 0;
  EXPECT_CU(cuStreamGetPriority(s, &priority));
  EXPECT_EQ(priority, -5);  // clamped to the greatest priority
  unsigned flags = 0;
  EXPECT_CU(cuStreamGetFlags(s, &flags));
  EXPECT_EQ(flags, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  CUcontext ctx = nullptr;
  EXPECT_CU(cuStreamGetCtx(s, &ctx));
  EXPECT_EQ(ctx, context_);
  CUgreenCtx green = reinterpret_cast<CUgreenCtx>(0x1);
  ctx = nullptr;
  EXPECT_CU(cuStreamGetCtx_v2(s, &ctx, &green));
  EXPECT_EQ(ctx, context_);
  EXPECT_EQ(green, nullptr);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  EXPECT_CU(cuStreamIsCapturing(s, &capture));
  EXPECT_EQ(capture, CU_STREAM_CAPTURE_STATUS_NONE);
  CUdevice dev = -1;
  EXPECT_CU(cuStreamGetDevice(s, &dev));
  EXPECT_EQ(dev, 0);
  unsigned long long id = 0, legacyId = 0;
  EXPECT_CU(cuStreamGetId(s, &id));
  EXPECT_CU(cuStreamGetId(nullptr, &legacyId));
  EXPECT_NE(id, legacyId);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamGetFlags(s, nullptr));
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuStreamDestroy(s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuStreamQuery(s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuStreamDestroy(nullptr));
  // The default streams always exist.
  EXPECT_CU(cuStreamSynchronize(nullptr));
  EXPECT_CU(cuStreamSynchronize(CU_STREAM_LEGACY));
  EXPECT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
}

// cuStreamGetAttribute/SetAttribute/CopyAttributes: the ids cuda.h marks
// "valid for streams", a new stream's defaults, the values each member
// allows, and copies within one context.
TEST_F(StreamTest, StreamAttributesKeepTheirValuesAndRefuseWhatCudaHRefuses) {
  CUstream s = nullptr, t = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreateWithPriority(&t, CU_STREAM_DEFAULT, -2));
  CUstreamAttrValue v{};
  EXPECT_CU(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v));
  EXPECT_EQ(v.syncPolicy, CU_SYNC_POLICY_AUTO);
  EXPECT_CU(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP, &v));
  EXPECT_EQ(v.memSyncDomainMap.default_, 0);
  EXPECT_EQ(v.memSyncDomainMap.remote, 1);
  EXPECT_CU(cuStreamGetAttribute(t, CU_LAUNCH_ATTRIBUTE_PRIORITY, &v));
  EXPECT_EQ(v.priority, -2);

  CUdeviceptr buffer = 0;
  ASSERT_CU(cuMemAlloc(&buffer, 4096));
  CUstreamAttrValue set{};
  set.accessPolicyWindow = {reinterpret_cast<void*>(buffer), 4096, 0.5f,
                            CU_ACCESS_PROPERTY_PERSISTING, CU_ACCESS_PROPERTY_STREAMING};
  EXPECT_CU(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &set));
  v = {};
  EXPECT_CU(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v));
  EXPECT_EQ(v.accessPolicyWindow.base_ptr, reinterpret_cast<void*>(buffer));
  EXPECT_EQ(v.accessPolicyWindow.num_bytes, 4096u);
  EXPECT_EQ(v.accessPolicyWindow.hitRatio, 0.5f);
  EXPECT_EQ(v.accessPolicyWindow.hitProp, CU_ACCESS_PROPERTY_PERSISTING);
  EXPECT_EQ(v.accessPolicyWindow.missProp, CU_ACCESS_PROPERTY_STREAMING);
  set = {};
  set.priority = -100;  // clamped, as at creation
  EXPECT_CU(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_PRIORITY, &set));
  int priority = 0;
  EXPECT_CU(cuStreamGetPriority(s, &priority));
  EXPECT_EQ(priority, -5);
  set = {};
  set.syncPolicy = CU_SYNC_POLICY_BLOCKING_SYNC;
  EXPECT_CU(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &set));
  set.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  EXPECT_CU(cuStreamSetAttribute(nullptr, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &set));
  EXPECT_CU(cuStreamGetAttribute(CU_STREAM_LEGACY, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &v));
  EXPECT_EQ(v.memSyncDomain, CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE);

  // Copied: every stream attribute, the priority too.
  EXPECT_CU(cuStreamCopyAttributes(t, s));
  EXPECT_CU(cuStreamGetAttribute(t, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v));
  EXPECT_EQ(v.syncPolicy, CU_SYNC_POLICY_BLOCKING_SYNC);
  EXPECT_CU(cuStreamGetAttribute(t, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v));
  EXPECT_EQ(v.accessPolicyWindow.num_bytes, 4096u);
  EXPECT_CU(cuStreamGetPriority(t, &priority));
  EXPECT_EQ(priority, -5);

  // Refused: a launch's attributes, values outside each member's range, nulls.
  auto refused = [&](CUstreamAttrID id, CUstreamAttrValue value) {
    return cuStreamSetAttribute(s, id, &value);
  };
  CUstreamAttrValue bad{};
  bad.programmaticEvent.event = reinterpret_cast<CUevent>(0x1234);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, refused(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, bad));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v));
  bad = {};
  bad.accessPolicyWindow = {reinterpret_cast<void*>(buffer), 4096, 1.5f, CU_ACCESS_PROPERTY_NORMAL,
                            CU_ACCESS_PROPERTY_NORMAL};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, refused(CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, bad));
  bad.accessPolicyWindow.hitRatio = 1.0f;
  bad.accessPolicyWindow.missProp =
      CU_ACCESS_PROPERTY_PERSISTING;  // "must be either NORMAL or STREAMING"
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, refused(CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, bad));
  int maxWindow = 0;
  ASSERT_CU(
      cuDeviceGetAttribute(&maxWindow, CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, device_));
  bad.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_NORMAL;
  bad.accessPolicyWindow.num_bytes = static_cast<size_t>(maxWindow) + 1;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, refused(CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, bad));
  bad = {};
  bad.syncPolicy = static_cast<CUsynchronizationPolicy>(9);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, refused(CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, bad));
  int domains = 0;
  ASSERT_CU(cuDeviceGetAttribute(&domains, CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, device_));
  bad = {};
  bad.memSyncDomainMap.remote = static_cast<unsigned char>(domains);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, refused(CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP, bad));
  bad = {};
  bad.memSyncDomain = static_cast<CUlaunchMemSyncDomain>(2);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, refused(CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, bad));
  bad = {};
  bad.nvlinkUtilCentricScheduling = 2;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                refused(CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING, bad));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_PRIORITY, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_PRIORITY, nullptr));
  // Nothing refused changed the stream.
  EXPECT_CU(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v));
  EXPECT_EQ(v.accessPolicyWindow.hitRatio, 0.5f);

  // "Both streams must have the same context."
  CUcontext other = nullptr;
  CUstream elsewhere = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, device_));
  ASSERT_CU(cuStreamCreate(&elsewhere, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamCopyAttributes(elsewhere, s));
  EXPECT_CU(cuStreamDestroy(elsewhere));
  EXPECT_CU(cuCtxDestroy(other));
  ASSERT_CU(cuCtxSetCurrent(context_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE,
                cuStreamGetAttribute(elsewhere, CU_LAUNCH_ATTRIBUTE_PRIORITY, &v));
  EXPECT_CU(cuMemFree(buffer));
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuStreamDestroy(t));
}

TEST_F(StreamTest, LegacyStreamSynchronizesWithBlockingStreams) {
  CUstream blocking = nullptr, nonBlocking = nullptr;
  ASSERT_CU(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  ASSERT_CU(cuStreamCreate(&nonBlocking, CU_STREAM_NON_BLOCKING));
  Gate gate;
  Log log;
  ASSERT_CU(cuLaunchHostFunc(blocking, &Gate::wait, &gate));
  ASSERT_CU(cuLaunchHostFunc(blocking, &append<1>, &log));
  // "The NULL stream ... synchronizes with all other blocking streams": this
  // waits for the blocked stream; the non-blocking stream does not.
  ASSERT_CU(cuLaunchHostFunc(nullptr, &append<2>, &log));
  ASSERT_CU(cuLaunchHostFunc(nonBlocking, &append<3>, &log));
  EXPECT_CU(cuStreamSynchronize(nonBlocking));
  {
    std::lock_guard lock(log.mutex);
    EXPECT_EQ(log.order, (std::vector<int>{3}));
  }
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(nullptr));
  gate.release();
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(log.order, (std::vector<int>{3, 1, 2}));
  EXPECT_CU(cuStreamDestroy(blocking));
  EXPECT_CU(cuStreamDestroy(nonBlocking));
}

TEST_F(StreamTest, StreamWaitEventOrdersAcrossStreams) {
  CUstream a = nullptr, b = nullptr;
  ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  Gate gate;
  Log log;
  ASSERT_CU(cuLaunchHostFunc(a, &Gate::wait, &gate));
  ASSERT_CU(cuLaunchHostFunc(a, &append<1>, &log));
  ASSERT_CU(cuEventRecord(e, a));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuEventQuery(e));
  ASSERT_CU(cuStreamWaitEvent(b, e, 0));
  ASSERT_CU(cuLaunchHostFunc(b, &append<2>, &log));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(b));
  gate.release();
  EXPECT_CU(cuStreamSynchronize(b));
  EXPECT_EQ(log.order, (std::vector<int>{1, 2}));
  EXPECT_CU(cuEventSynchronize(e));
  EXPECT_CU(cuEventQuery(e));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWaitEvent(b, e, 0x10));
  EXPECT_CU(cuEventDestroy(e));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuStreamWaitEvent(b, e, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuEventQuery(e));
  EXPECT_CU(cuStreamDestroy(a));
  EXPECT_CU(cuStreamDestroy(b));
}

TEST_F(StreamTest, EventTiming) {
  CUevent start = nullptr, stop = nullptr, untimed = nullptr;
  ASSERT_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
  ASSERT_CU(cuEventCreate(&stop, CU_EVENT_BLOCKING_SYNC));
  ASSERT_CU(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  float ms = -1;
  // Never recorded: invalid handle; an unrecorded event is complete.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime(&ms, start, stop));
  EXPECT_CU(cuEventQuery(start));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  ASSERT_CU(cuEventRecord(start, s));
  ASSERT_CU(cuLaunchHostFunc(
      s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }, nullptr));
  ASSERT_CU(cuEventRecord(stop, s));
  ASSERT_CU(cuEventRecord(untimed, s));
  EXPECT_CU(cuEventSynchronize(stop));
  EXPECT_CU(cuEventElapsedTime(&ms, start, stop));
  EXPECT_GE(ms, 19.0F);
  EXPECT_LT(ms, 5000.0F);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime(&ms, start, untimed));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuEventElapsedTime(nullptr, start, stop));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuEventCreate(&start, 0x100));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuEventCreate(&start, CU_EVENT_INTERPROCESS));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuEventRecordWithFlags(start, s, 0x8));
  EXPECT_CU(cuStreamDestroy(s));
  EXPECT_CU(cuEventDestroy(start));
  EXPECT_CU(cuEventDestroy(stop));
  EXPECT_CU(cuEventDestroy(untimed));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuEventDestroy(stop));
}

// Stream 0 is the legacy default stream everywhere a CUstream is taken: events
// record on it and streams wait on it.
TEST_F(StreamTest, EventsOnTheNullStream) {
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
  EXPECT_CU(cuEventRecord(e, nullptr));
  EXPECT_CU(cuEventSynchronize(e));
  EXPECT_CU(cuEventQuery(e));
  EXPECT_CU(cuEventRecordWithFlags(e, nullptr, CU_EVENT_RECORD_DEFAULT));
  EXPECT_CU(cuStreamWaitEvent(nullptr, e, 0));
  EXPECT_CU(cuStreamSynchronize(nullptr));
  EXPECT_CU(cuStreamQuery(nullptr));
  EXPECT_CU(cuEventDestroy(e));
}

TEST_F(StreamTest, CallbacksGetTheStreamAndStatus) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  struct Seen {
    CUstream stream = nullptr;
    CUresult status = CUDA_ERROR_UNKNOWN;
    std::thread::id thread;
  } seen;
  auto cb = [](CUstream stream, CUresult status, void* user) {
    auto* out = static_cast<Seen*>(user);
    out->stream = stream;
    out->status = status;
    out->thread = std::this_thread::get_id();
  };
  ASSERT_CU(cuStreamAddCallback(s, cb, &seen, 0));
  EXPECT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(seen.stream, s);
  EXPECT_EQ(seen.status, CUDA_SUCCESS);
  EXPECT_NE(seen.thread, std::this_thread::get_id());  // a driver thread ran it
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamAddCallback(s, cb, &seen, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamAddCallback(s, nullptr, &seen, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchHostFunc(s, nullptr, nullptr));
  EXPECT_CU(cuStreamDestroy(s));
}

TEST_F(StreamTest, PerThreadDefaultStreamsAreIndependent) {
  Gate gate;
  Log log;
  // This thread's per-thread stream is blocked; another thread's is not.
  ASSERT_CU(cuLaunchHostFunc(CU_STREAM_PER_THREAD, &Gate::wait, &gate));
  std::thread other([&] {
    ASSERT_CU(cuCtxSetCurrent(context_));
    ASSERT_CU(cuLaunchHostFunc(CU_STREAM_PER_THREAD, &append<1>, &log));
    EXPECT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  });
  other.join();
  EXPECT_EQ(log.order, (std::vector<int>{1}));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(CU_STREAM_PER_THREAD));
  gate.release();
  EXPECT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
}

TEST_F(StreamTest, StreamsOfADestroyedContextAreInvalid) {
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, 0));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, 0));
  ASSERT_CU(cuCtxDestroy(other));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuEventQuery(e));
}

// Stream memory operations (the _v2 API): a stream waits on a word until
// another stream or the host writes it, with each condition; writes, flushes
// and barriers in a batch; and what the calls refuse. Through PhOS too, where
// the synchronizations behind a wait are answered later.
TEST_F(StreamTest, StreamMemoryOperationsWaitAndWrite) {
  int wide = -1;
  ASSERT_CU(cuDeviceGetAttribute(&wide, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0));
  CUdeviceptr words = 0;
  ASSERT_CU(cuMemAlloc(&words, 64));
  ASSERT_CU(cuMemsetD8(words, 0, 64));
  CUstream waiter = nullptr, writer = nullptr;
  ASSERT_CU(cuStreamCreate(&waiter, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&writer, CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(wide, 1);
  auto read32 = [&](size_t offset) {
    uint32_t v = 0;
    EXPECT_CU(cuMemcpyDtoHAsync(&v, words + offset, 4, writer));
    EXPECT_CU(cuStreamSynchronize(writer));
    return v;
  };
  // The waiter blocks until the writer stream writes the word; what follows
  // the wait (a write of a marker) runs after it.
  ASSERT_CU(cuStreamWaitValue32(waiter, words, 1, CU_STREAM_WAIT_VALUE_EQ));
  ASSERT_CU(cuStreamWriteValue32(waiter, words + 4, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(waiter));
  EXPECT_EQ(read32(4), 0u);
  ASSERT_CU(cuStreamWriteValue32(writer, words, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  ASSERT_CU(cuStreamSynchronize(waiter));
  EXPECT_EQ(read32(4), 7u);
  // GEQ is cyclic: 0x00000002 is "after" 0xfffffffe.
  ASSERT_CU(cuStreamWriteValue32(writer, words, 2, 0));
  ASSERT_CU(cuStreamSynchronize(writer));
  ASSERT_CU(cuStreamWaitValue32(waiter, words, 0xfffffffeu, CU_STREAM_WAIT_VALUE_GEQ));
  ASSERT_CU(cuStreamSynchronize(waiter));
  // A batch: 64-bit write, barrier, AND and NOR waits that hold, a flush.
  CUstreamBatchMemOpParams ops[5] = {};
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[0].writeValue.address = words + 8;
  ops[0].writeValue.value64 = 0x600000000ull;
  ops[1].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
  ops[1].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_GPU;
  ops[2].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
  ops[2].waitValue.address = words + 8;
  ops[2].waitValue.value64 = 0x200000000ull;
  ops[2].waitValue.flags = CU_STREAM_WAIT_VALUE_AND;
  ops[3].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[3].waitValue.address = words + 4;  // 7: ~(7 | 8) != 0
  ops[3].waitValue.value = 8;
  ops[3].waitValue.flags = CU_STREAM_WAIT_VALUE_NOR | CU_STREAM_WAIT_VALUE_FLUSH;
  ops[4].flushRemoteWrites.operation = CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES;
  ASSERT_CU(cuStreamBatchMemOp(waiter, 5, ops, 0));
  ASSERT_CU(cuStreamSynchronize(waiter));
  uint64_t wideWord = 0;
  ASSERT_CU(cuMemcpyDtoH(&wideWord, words + 8, 8));
  EXPECT_EQ(wideWord, 0x600000000ull);
  // Pinned memory the host thread writes directly.
  void* pinned = nullptr;
  ASSERT_CU(cuMemAllocHost(&pinned, 64));
  auto* flag = static_cast<std::atomic<uint32_t>*>(pinned);
  flag->store(0);
  ASSERT_CU(cuStreamWaitValue32(waiter, reinterpret_cast<CUdeviceptr>(pinned), 3,
                                CU_STREAM_WAIT_VALUE_GEQ));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(waiter));
  flag->store(3);
  EXPECT_CU(cuStreamSynchronize(waiter));
  // Refused: unaligned, unknown host memory, managed memory, bad flags or
  // operations, batches of none or 256 operations, batch flags.
  uint32_t onStack = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(waiter, words + 2, 1, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWriteValue64(waiter, words + 4, 1, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamWriteValue32(waiter, reinterpret_cast<CUdeviceptr>(&onStack), 1, 0));
  CUdeviceptr managed = 0;
  ASSERT_CU(cuMemAllocManaged(&managed, 64, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(waiter, managed, 0, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(waiter, words, 1, 4));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWriteValue32(waiter, words, 1, 2));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamBatchMemOp(waiter, 0, ops, 0));
  std::vector<CUstreamBatchMemOpParams> many(256, ops[4]);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamBatchMemOp(waiter, 256, many.data(), 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamBatchMemOp(waiter, 1, ops, 1));
  ops[0].operation = static_cast<CUstreamBatchMemOpType>(99);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamBatchMemOp(waiter, 1, ops, 0));
  EXPECT_CU(cuStreamQuery(waiter));  // nothing refused was enqueued
  EXPECT_CU(cuMemFree(managed));
  EXPECT_CU(cuMemFreeHost(pinned));
  EXPECT_CU(cuStreamDestroy(waiter));
  EXPECT_CU(cuStreamDestroy(writer));
  EXPECT_CU(cuMemFree(words));
}

// cuCtxRecordEvent captures the work of all the context's streams so far;
// cuCtxWaitEvent makes all work submitted to a context afterwards wait for an
// event, on streams made before or after. A stream memory wait on a host word
// holds stream `a` until the test stores the word.
TEST_F(StreamTest, ContextEventsCoverEveryStream) {
  CUcontext c = nullptr;
  ASSERT_CU(cuCtxCreate(&c, nullptr, 0, 0));
  unsigned* gate = nullptr;
  ASSERT_CU(cuMemHostAlloc(reinterpret_cast<void**>(&gate), sizeof(unsigned), 0));
  *gate = 0;
  CUdeviceptr words = 0;
  ASSERT_CU(cuMemAlloc(&words, 2 * sizeof(unsigned)));
  ASSERT_CU(cuMemsetD32(words, 0, 2));
  CUstream a = nullptr, b = nullptr;
  ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(
      cuStreamWaitValue32(a, reinterpret_cast<CUdeviceptr>(gate), 1, CU_STREAM_WAIT_VALUE_EQ));
  CUevent all = nullptr, mine = nullptr;
  ASSERT_CU(cuEventCreate(&all, CU_EVENT_DEFAULT));
  ASSERT_CU(cuCtxRecordEvent(c, all));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuEventQuery(all));  // stream a's wait is in it
  ASSERT_CU(cuCtxWaitEvent(c, all));
  ASSERT_CU(cuMemsetD32Async(words, 7, 1, b));  // b had nothing queued: it waits now
  CUstream later = nullptr;
  ASSERT_CU(cuStreamCreate(&later, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuMemsetD32Async(words + sizeof(unsigned), 9, 1, later));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(b));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(later));
  // The event of another context is refused; a context waits for any event.
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, 0));
  ASSERT_CU(cuEventCreate(&mine, CU_EVENT_DISABLE_TIMING));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuCtxRecordEvent(c, mine));
  ASSERT_CU(cuCtxRecordEvent(other, mine));
  EXPECT_CU(cuCtxWaitEvent(other, all));
  EXPECT_CU(cuCtxDestroy(other));
  ASSERT_CU(cuCtxSetCurrent(c));
  reinterpret_cast<std::atomic<unsigned>*>(gate)->store(1);
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_CU(cuEventQuery(all));
  unsigned out[2] = {};
  ASSERT_CU(cuMemcpyDtoH(out, words, sizeof out));
  EXPECT_EQ(out[0], 7u);
  EXPECT_EQ(out[1], 9u);
  // Not while a stream of the context captures: refused, and the capture invalidated.
  ASSERT_CU(cuStreamBeginCapture(b, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuCtxRecordEvent(c, all));
  CUgraph graph = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(b, &graph));
  EXPECT_CU(cuEventDestroy(all));
  EXPECT_CU(cuStreamDestroy(a));
  EXPECT_CU(cuStreamDestroy(b));
  EXPECT_CU(cuStreamDestroy(later));
  EXPECT_CU(cuMemFree(words));
  EXPECT_CU(cuMemFreeHost(gate));
  EXPECT_CU(cuCtxDestroy(c));
}

// A wait nothing will satisfy ends with its context (a GPU's work ends with
// the context), instead of holding cuCtxDestroy forever.
TEST_F(StreamTest, DestroyingAContextEndsAWaitNothingSatisfies) {
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, 0));
  CUdeviceptr word = 0;
  ASSERT_CU(cuMemAlloc(&word, 4));
  ASSERT_CU(cuMemsetD32(word, 0, 1));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamWaitValue32(s, word, 1, CU_STREAM_WAIT_VALUE_EQ));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  EXPECT_CU(cuCtxDestroy(other));
}

// A wait whose word is unmapped meanwhile faults its context, as a GPU's
// would (CUDA_ERROR_ILLEGAL_ADDRESS, sticky), instead of faulting the process.
TEST_F(StreamTest, UnmappingTheWordOfAWaitFaultsItsContext) {
  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, 0));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t size = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, size, 0, 0, 0));
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_CU(cuMemCreate(&handle, size, &prop, 0));
  ASSERT_CU(cuMemMap(va, size, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_CU(cuMemSetAccess(va, size, &access, 1));
  ASSERT_CU(cuMemsetD32(va, 0, 1));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamWaitValue32(s, va, 1, CU_STREAM_WAIT_VALUE_EQ));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  EXPECT_CU(cuMemUnmap(va, size));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());  // the context's error now
  EXPECT_CU(cuMemRelease(handle));
  EXPECT_CU(cuMemAddressFree(va, size));
  EXPECT_CU(cuCtxDestroy(other));
}

}  // namespace
}  // namespace phos::vgpu::testing
