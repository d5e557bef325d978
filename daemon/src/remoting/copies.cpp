// SPDX-License-Identifier: Apache-2.0
// Server hooks for copies and sets: every device side checked against the
// session's memory, the application's pageable memory read and written with
// process_vm_readv/writev through staging buffers, and each call's reads and
// writes shown to the checkpoint protocols' gate.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "phos/common/memcpy3d_peer.h"
#include "phos/cuda_api/server_hooks.h"
#include "session/session.h"
#include "session/session_arrays.h"

namespace phos::daemon::hooks {
namespace {

// Managed memory is pinned host memory to the driver (memory.cpp), though the
// application names it as device memory: copies of it go through the
// driver's unified copy, which takes host memory on either side. Sets of
// pinned or managed memory run on the host in stream order (the driver's
// sets take device memory).
bool isManaged(const Session& s, uint64_t p) {
  const PinnedRange* r = s.findPinned(p);
  return r != nullptr && r->managed;
}

CUresult copyToDevice(ServerCall& c, CUdeviceptr dst, const void* src, size_t bytes,
                      CUstream stream) {
  if (isManaged(c.session(), dst)) {
    return PHOS_DRIVER(c.driverTable(), MemcpyAsync)(dst, reinterpret_cast<CUdeviceptr>(src), bytes,
                                                     stream);
  }
  return PHOS_DRIVER(c.driverTable(), MemcpyHtoDAsync_v2)(dst, src, bytes, stream);
}

CUresult copyFromDevice(ServerCall& c, void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  if (isManaged(c.session(), src)) {
    return PHOS_DRIVER(c.driverTable(), MemcpyAsync)(reinterpret_cast<CUdeviceptr>(dst), src, bytes,
                                                     stream);
  }
  return PHOS_DRIVER(c.driverTable(), MemcpyDtoHAsync_v2)(dst, src, bytes, stream);
}

// The memory type the driver is given for a side of a 2D or 3D copy.
CUmemorytype driverType(const Session& s, CUmemorytype type, CUdeviceptr device) {
  return type == CU_MEMORYTYPE_DEVICE && isManaged(s, device) ? CU_MEMORYTYPE_UNIFIED : type;
}

// A set of pinned or managed memory: rows of `width` elements, `pitch` bytes apart.
struct HostSet {
  uint64_t dst;
  size_t pitch;
  uint32_t value;
  unsigned elementBytes;
  size_t width;
  size_t height;
};

void CUDA_CB runHostSet(void* data) {
  std::unique_ptr<HostSet> set(static_cast<HostSet*>(data));
  for (size_t y = 0; y < set->height; ++y) {
    auto* row = reinterpret_cast<std::byte*>(set->dst + y * set->pitch);
    for (size_t x = 0; x < set->width; ++x)
      std::memcpy(row + x * set->elementBytes, &set->value, set->elementBytes);
  }
}

// "The synchronous memset functions are asynchronous with respect to the
// host except when the target is pinned host memory or a Unified Memory
// region, in which case they are fully synchronous."
CUresult setOnHost(ServerCall& c, HostSet set, CUstream stream, bool synchronous) {
  // A graph would run the set again, and the set is freed by its first run.
  if (auto refused = c.refuseInCapture(stream)) return *refused;
  auto owned = std::make_unique<HostSet>(set);
  CUresult r = PHOS_DRIVER(c.driverTable(), LaunchHostFunc)(stream, runHostSet, owned.get());
  if (r != CUDA_SUCCESS) return r;
  (void)owned.release();  // runHostSet's now
  return synchronous ? PHOS_DRIVER(c.driverTable(), StreamSynchronize)(stream) : CUDA_SUCCESS;
}

// Copies between the application's pageable memory and device memory go
// through the current context's two staging buffers, pipelined: while the
// driver copies one chunk, phosd reads (or writes) the application's memory
// of the next with process_vm_readv/writev. All chunks are enqueued on
// `stream` in order and complete before the call returns (the buffers are
// reused by the next call, and CUDA returns from copies of pageable memory
// once the host side is done).
class StagedCopy {
 public:
  StagedCopy(ServerCall& c, CopyStaging& staging, CUstream stream) : c_(c), st_(staging), stream_(stream) {}
  ~StagedCopy() { (void)drain(); }

  // Waits until buffer k is free again.
  CUresult acquire(int k) {
    if (!st_.pending[k]) return CUDA_SUCCESS;
    st_.pending[k] = false;
    return PHOS_DRIVER(c_.driverTable(), EventSynchronize)(st_.done[k]);
  }
  CUresult release(int k) {
    CUresult r = PHOS_DRIVER(c_.driverTable(), EventRecord)(st_.done[k], stream_);
    st_.pending[k] = r == CUDA_SUCCESS;
    return r;
  }
  CUresult drain() {
    CUresult first = CUDA_SUCCESS;
    for (int k = 0; k < 2; ++k) {
      CUresult r = acquire(k);
      if (first == CUDA_SUCCESS) first = r;
    }
    return first;
  }

 private:
  ServerCall& c_;
  CopyStaging& st_;
  CUstream stream_;
};

CUresult copyFromApplication(ServerCall& c, CUdeviceptr dst, uint64_t src, uint64_t bytes, CUstream stream) {
  Session& s = c.session();
  CopyStaging* st = s.staging();
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  StagedCopy copy(c, *st, stream);
  int k = 0;
  for (uint64_t done = 0; done < bytes; done += st->bytes, k ^= 1) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, st->bytes));
    if (CUresult r = copy.acquire(k); r != CUDA_SUCCESS) return r;
    if (!s.readApplication(src + done, st->buffers[k], n).isOk()) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = copyToDevice(c, dst + done, st->buffers[k], n, stream);
    if (r == CUDA_SUCCESS) r = copy.release(k);
    if (r != CUDA_SUCCESS) return r;
  }
  return copy.drain();
}

CUresult copyToApplication(ServerCall& c, uint64_t dst, CUdeviceptr src, uint64_t bytes, CUstream stream) {
  Session& s = c.session();
  CopyStaging* st = s.staging();
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  StagedCopy copy(c, *st, stream);
  const uint64_t chunks = (bytes + st->bytes - 1) / st->bytes;
  auto enqueue = [&](uint64_t i) {
    const uint64_t off = i * st->bytes;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - off, st->bytes));
    CUresult r = copyFromDevice(c, st->buffers[i % 2], src + off, n, stream);
    return r == CUDA_SUCCESS ? copy.release(static_cast<int>(i % 2)) : r;
  };
  if (chunks > 0) {
    if (CUresult r = enqueue(0); r != CUDA_SUCCESS) return r;
  }
  for (uint64_t i = 0; i < chunks; ++i) {
    // The next chunk copies while this one is written to the application.
    if (i + 1 < chunks) {
      if (CUresult r = enqueue(i + 1); r != CUDA_SUCCESS) return r;
    }
    if (CUresult r = copy.acquire(static_cast<int>(i % 2)); r != CUDA_SUCCESS) return r;
    const uint64_t off = i * st->bytes;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - off, st->bytes));
    if (!s.writeApplication(dst + off, st->buffers[i % 2], n).isOk()) return CUDA_ERROR_INVALID_VALUE;
  }
  return copy.drain();
}

// ---- through a transfer lane (ipc/transfer_lane.h) --------------------------
// The application streams its side of the copy through a lane while phosd
// moves each chunk between the lane and the device. phosd never waits on the
// application without bound: a lane whose other side makes no progress for
// kLaneStall is abandoned and the rest copied as without a lane.
constexpr std::chrono::milliseconds kLanePeriod{20};
constexpr std::chrono::seconds kLaneStall{1};

// The stop condition of phosd's waits on a lane: neither `word` (the
// application's) nor phosd's own side (progressed()) has moved for
// kLaneStall, or the application is gone.
class LaneStall {
 public:
  LaneStall(const Session& s, const std::atomic<uint32_t>& word) : session_(s), word_(word) { progressed(); }
  bool operator()() {
    if (word_.load(std::memory_order_relaxed) != seen_) progressed();
    return std::chrono::steady_clock::now() - since_ > kLaneStall || !session_.applicationAlive();
  }
  void progressed() {
    seen_ = word_.load(std::memory_order_relaxed);
    since_ = std::chrono::steady_clock::now();
  }

 private:
  const Session& session_;
  const std::atomic<uint32_t>& word_;
  uint32_t seen_ = 0;
  std::chrono::steady_clock::time_point since_;
};

// One chunk between the lane and the device, complete when this returns.
template <typename Enqueue>
CUresult laneChunk(StagedCopy& copy, Enqueue enqueue) {
  if (CUresult r = copy.acquire(0); r != CUDA_SUCCESS) return r;
  CUresult r = enqueue();
  if (r == CUDA_SUCCESS) r = copy.release(0);
  if (r == CUDA_SUCCESS) r = copy.acquire(0);
  return r;
}

CUresult copyFromLane(ServerCall& c, const ipc::TransferLane& lane, CUdeviceptr dst, uint64_t src, uint64_t bytes,
                      CUstream stream) {
  Session& s = c.session();
  CopyStaging* st = s.staging();  // its events
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  s.registerLanes();
  StagedCopy copy(c, *st, stream);
  ipc::accept(lane, ipc::kLaneToDevice);
  LaneStall stalled(s, lane.words->produced);
  for (uint64_t i = 0; i < lane.chunks(bytes); ++i) {
    const uint64_t off = i * lane.bufferBytes;
    if (!ipc::awaitAtLeast(lane.words->produced, static_cast<uint32_t>(i + 1), kLanePeriod, stalled)) {
      ipc::abandon(lane);
      return copyFromApplication(c, dst + off, src + off, bytes - off, stream);
    }
    CUresult r = laneChunk(copy, [&] {
      return copyToDevice(c, dst + off, lane.buffer(i), lane.chunkBytes(bytes, i), stream);
    });
    if (r != CUDA_SUCCESS) return r;
    ipc::publish(lane.words->consumed, static_cast<uint32_t>(i + 1));
    stalled.progressed();
  }
  return CUDA_SUCCESS;
}

CUresult copyToLane(ServerCall& c, const ipc::TransferLane& lane, uint64_t dst, CUdeviceptr src, uint64_t bytes,
                    CUstream stream) {
  Session& s = c.session();
  CopyStaging* st = s.staging();
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  s.registerLanes();
  StagedCopy copy(c, *st, stream);
  ipc::accept(lane, ipc::kLaneFromDevice);
  LaneStall stalled(s, lane.words->consumed);
  const uint64_t chunks = lane.chunks(bytes);
  for (uint64_t i = 0; i <= chunks; ++i) {
    // Chunk i goes where chunk i - 2 was, which must have been taken; after
    // the last one, every chunk must have been: the application has then
    // left the lane when the call is answered (a restore could not give it
    // back the lane's bytes).
    const uint64_t mustBeTaken = i < chunks ? (i >= 2 ? i - 1 : 0) : chunks;
    if (mustBeTaken > 0 &&
        !ipc::awaitAtLeast(lane.words->consumed, static_cast<uint32_t>(mustBeTaken), kLanePeriod, stalled)) {
      ipc::abandon(lane);
      // What the application says it took (its word: a wrong one only spoils
      // its own copy) is written again from the device, then the rest.
      const uint64_t taken = std::min<uint64_t>(lane.words->consumed.load(std::memory_order_acquire), i);
      const uint64_t off = taken * lane.bufferBytes;
      return copyToApplication(c, dst + off, src + off, bytes - off, stream);
    }
    if (i == chunks) break;
    const uint64_t off = i * lane.bufferBytes;
    CUresult r = laneChunk(copy, [&] {
      return copyFromDevice(c, lane.buffer(i), src + off, lane.chunkBytes(bytes, i), stream);
    });
    if (r != CUDA_SUCCESS) return r;
    ipc::publish(lane.words->produced, static_cast<uint32_t>(i + 1));
    stalled.progressed();
  }
  return CUDA_SUCCESS;
}

// Host to host: CUDA copies it too. Through a staging buffer: `bytes` is the
// client's number, and a buffer of that size could be any size.
CUresult copyWithinApplication(ServerCall& c, uint64_t dst, uint64_t src, uint64_t bytes) {
  Session& s = c.session();
  CopyStaging* st = s.staging();
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  for (uint64_t done = 0; done < bytes;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, st->bytes));
    if (!s.readApplication(src + done, st->buffers[0], n).isOk() ||
        !s.writeApplication(dst + done, st->buffers[0], n).isOk()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    done += n;
  }
  return CUDA_SUCCESS;
}

// One of the application's transfers between its memory and the device,
// from its issue to its return (TransferTracker: the protocols' copies give
// way to it).
class TransferScope {
 public:
  TransferScope(Session& session, bool async, CUstream stream)
      : tracker_(session.transfers()), async_(async), stream_(stream) {
    tracker_.begin();
  }
  ~TransferScope() { tracker_.end(async_, stream_); }
  TransferScope(const TransferScope&) = delete;
  TransferScope& operator=(const TransferScope&) = delete;

 private:
  TransferTracker& tracker_;
  bool async_;
  CUstream stream_;
};

// A copy's sides that are GPU state of the session: device memory and pinned
// ranges (pageable application memory is CPU state). Exact byte ranges.
void passCopyGate(Session& s, uint64_t dst, uint64_t src, uint64_t bytes) {
  if (bytes == 0) return;
  CallAccess access{.overwrites = true};
  if (s.ownsRange(src, bytes)) access.reads.push_back({src, bytes});
  if (s.ownsRange(dst, bytes)) access.writes.push_back({dst, bytes});
  if (!access.reads.empty() || !access.writes.empty()) s.passGate(access);
}

// A synchronous call runs on the default stream of its variant (legacy, or
// the calling thread's for _ptds) and waits for itself.
CUresult defaultStream(ServerCall& c, CUstream* out) {
  return c.resolveStream(0, c.perThreadEntry(), out) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult finish(ServerCall& c, CUresult r, bool async, CUstream s) {
  if (r == CUDA_SUCCESS && !async) r = PHOS_DRIVER(c.driverTable(), StreamSynchronize)(s);
  return r;
}

CUresult hostToDevice(ServerCall& c, CUdeviceptr dst, uint64_t src, size_t bytes, CUstream s, bool async) {
  if (src == 0 && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!c.checkDeviceRange(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
  passCopyGate(c.session(), dst, src, bytes);
  TransferScope transfer(c.session(), async, s);
  if (c.session().ownsRange(src, bytes)) {
    // Pinned memory: the same address in phosd.
    return finish(c, copyToDevice(c, dst, reinterpret_cast<void*>(src), bytes, s), async, s);
  }
  // Pageable memory is the application's: a graph could not read it again.
  if (auto refused = c.refuseInCapture(s)) return *refused;
  if (auto lane = c.lane(); lane && lane->carries(bytes)) return copyFromLane(c, *lane, dst, src, bytes, s);
  return copyFromApplication(c, dst, src, bytes, s);
}

CUresult deviceToHost(ServerCall& c, uint64_t dst, CUdeviceptr src, size_t bytes, CUstream s, bool async) {
  if (dst == 0 && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!c.checkDeviceRange(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
  passCopyGate(c.session(), dst, src, bytes);
  TransferScope transfer(c.session(), async, s);
  if (c.session().ownsRange(dst, bytes)) {
    return finish(c, copyFromDevice(c, reinterpret_cast<void*>(dst), src, bytes, s), async, s);
  }
  if (auto refused = c.refuseInCapture(s)) return *refused;
  if (auto lane = c.lane(); lane && lane->carries(bytes)) return copyToLane(c, *lane, dst, src, bytes, s);
  return copyToApplication(c, dst, src, bytes, s);
}

// Unified addressing: either side may be the application's pageable memory,
// unless the entry point names both as device memory.
CUresult unifiedCopy(ServerCall& c, CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s, bool async,
                     bool deviceOnly) {
  Session& session = c.session();
  const bool dstOurs = session.ownsRange(dst, bytes);
  const bool srcOurs = session.ownsRange(src, bytes);
  if (bytes == 0) return CUDA_SUCCESS;
  if (!deviceOnly || (dstOurs && srcOurs)) passCopyGate(session, dst, src, bytes);
  // Between host memory (the application's, or pinned) and the device: one
  // of its transfers.
  std::optional<TransferScope> transfer;
  if (session.memory().find(dst) == nullptr || session.memory().find(src) == nullptr) {
    transfer.emplace(session, async, s);
  }
  if (dstOurs && srcOurs) return finish(c, PHOS_DRIVER(c.driverTable(), MemcpyAsync)(dst, src, bytes, s), async, s);
  if (deviceOnly) return CUDA_ERROR_INVALID_VALUE;
  if (auto refused = c.refuseInCapture(s)) return *refused;
  auto lane = c.lane();
  if (lane && !lane->carries(bytes)) lane.reset();
  if (dstOurs) return lane ? copyFromLane(c, *lane, dst, src, bytes, s) : copyFromApplication(c, dst, src, bytes, s);
  if (srcOurs) return lane ? copyToLane(c, *lane, dst, src, bytes, s) : copyToApplication(c, dst, src, bytes, s);
  return copyWithinApplication(c, dst, src, bytes);
}

// "Memset functions are asynchronous with respect to the host" for device
// memory: the synchronous variants only differ in their stream (the default
// stream of the variant, legacy or the calling thread's).
template <typename T>
CUresult memset(ServerCall& c, CUdeviceptr dst, T value, size_t count, CUstream s,
                bool synchronous) {
  if (count > (~0ull) / sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
  if (!c.checkDeviceRange(dst, count * sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  c.session().passGate({.writes = {{dst, count * sizeof(T)}}, .overwrites = true});
  if (c.session().findPinned(dst) != nullptr) {
    return setOnHost(c, {dst, count * sizeof(T), value, sizeof(T), count, 1}, s, synchronous);
  }
  if constexpr (sizeof(T) == 1) return PHOS_DRIVER(c.driverTable(), MemsetD8Async)(dst, value, count, s);
  if constexpr (sizeof(T) == 2) return PHOS_DRIVER(c.driverTable(), MemsetD16Async)(dst, value, count, s);
  if constexpr (sizeof(T) == 4) return PHOS_DRIVER(c.driverTable(), MemsetD32Async)(dst, value, count, s);
}

// Every row must lie in one allocation of the session: the last one ends
// pitch * (height - 1) + width * element bytes after dst.
template <typename T>
CUresult memset2D(ServerCall& c, CUdeviceptr dst, size_t pitch, T value, size_t width,
                  size_t height, CUstream s, bool synchronous) {
  const uint64_t kMax = ~0ull;
  if (width > kMax / sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t row = width * sizeof(T);
  if (height > 1 && pitch != 0 && height - 1 > (kMax - row) / pitch) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t extent = height == 0 ? 0 : pitch * (height - 1) + row;
  if (!c.checkDeviceRange(dst, extent)) return CUDA_ERROR_INVALID_VALUE;
  // The rows and the gaps between them, which are not written: the span is
  // overwritten only when there are no gaps.
  c.session().passGate({.writes = {{dst, extent}}, .overwrites = height <= 1 || pitch == row});
  if (c.session().findPinned(dst) != nullptr) {
    return setOnHost(c, {dst, pitch, value, sizeof(T), width, height}, s, synchronous);
  }
  if constexpr (sizeof(T) == 1) {
    return PHOS_DRIVER(c.driverTable(), MemsetD2D8Async)(dst, pitch, value, width, height, s);
  }
  if constexpr (sizeof(T) == 2) {
    return PHOS_DRIVER(c.driverTable(), MemsetD2D16Async)(dst, pitch, value, width, height, s);
  }
  if constexpr (sizeof(T) == 4) {
    return PHOS_DRIVER(c.driverTable(), MemsetD2D32Async)(dst, pitch, value, width, height, s);
  }
}

// Both ranges in the session's allocations.
CUresult peerCopy(ServerCall& c, CUdeviceptr dst, Handle<CUcontext> dstContext, CUdeviceptr src,
                  Handle<CUcontext> srcContext, size_t bytes, CUstream s, bool async) {
  if (dstContext.real == nullptr || srcContext.real == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c.checkDeviceRange(dst, bytes) || !c.checkDeviceRange(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
  passCopyGate(c.session(), dst, src, bytes);
  return finish(c, PHOS_DRIVER(c.driverTable(), MemcpyPeerAsync)(dst, dstContext.real, src, srcContext.real, bytes, s),
                async, s);
}

// The driver's array for an array side of a 2D or 3D copy (the descriptor
// holds the application's id); false for an id that names no array of the
// session. Other sides are left as they are.
bool driverArray(ServerCall& c, CUmemorytype type, CUarray& array) {
  if (type != CU_MEMORYTYPE_ARRAY) return true;
  array = static_cast<CUarray>(
      c.session().handles().resolve(HandleType::kCUarray_st, reinterpret_cast<uint64_t>(array)));
  return array != nullptr;
}

// Whether a 1D copy of `bytes` fits `array` (its whole bytes): phosd stages
// no more than that. NOT_SUPPORTED for a format that is not whole bytes per
// texel (block compressed, planar), whose bytes phosd cannot count.
CUresult fitsArray(ServerCall& c, CUarray array, uint64_t bytes) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  const CUresult r = PHOS_DRIVER(c.driverTable(), Array3DGetDescriptor_v2)(&d, array);
  if (r != CUDA_SUCCESS) return r;
  const std::optional<uint64_t> capacity = arrayBytes(d);
  if (!capacity) return CUDA_ERROR_NOT_SUPPORTED;
  return bytes <= *capacity ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// 1D copies between host memory and an array's bytes. Pinned memory is used
// where it is; the application's pageable memory goes through a buffer of
// phosd, so the copy is done when the call returns, as CUDA does for
// pageable memory.
CUresult hostToArray(ServerCall& c, CUarray dst, size_t offset, uint64_t src, size_t bytes,
                     CUstream s, bool async) {
  if (src == 0 && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fitsArray(c, dst, bytes); r != CUDA_SUCCESS) return r;
  Session& session = c.session();
  TransferScope transfer(session, async, s);
  if (session.ownsRange(src, bytes)) {
    passCopyGate(session, 0, src, bytes);
    return finish(c,
                  PHOS_DRIVER(c.driverTable(), MemcpyHtoAAsync_v2)(
                      dst, offset, reinterpret_cast<void*>(src), bytes, s),
                  async, s);
  }
  if (auto refused = c.refuseInCapture(s)) return *refused;
  std::vector<std::byte> staged(bytes);
  if (!session.readApplication(src, staged.data(), bytes).isOk()) return CUDA_ERROR_INVALID_VALUE;
  return finish(
      c, PHOS_DRIVER(c.driverTable(), MemcpyHtoAAsync_v2)(dst, offset, staged.data(), bytes, s),
      false, s);
}

CUresult arrayToHost(ServerCall& c, uint64_t dst, CUarray src, size_t offset, size_t bytes,
                     CUstream s, bool async) {
  if (dst == 0 && bytes != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fitsArray(c, src, bytes); r != CUDA_SUCCESS) return r;
  Session& session = c.session();
  TransferScope transfer(session, async, s);
  if (session.ownsRange(dst, bytes)) {
    passCopyGate(session, dst, 0, bytes);
    return finish(c,
                  PHOS_DRIVER(c.driverTable(), MemcpyAtoHAsync_v2)(reinterpret_cast<void*>(dst),
                                                                   src, offset, bytes, s),
                  async, s);
  }
  if (auto refused = c.refuseInCapture(s)) return *refused;
  std::vector<std::byte> staged(bytes);
  CUresult r = finish(
      c, PHOS_DRIVER(c.driverTable(), MemcpyAtoHAsync_v2)(staged.data(), src, offset, bytes, s),
      false, s);
  if (r == CUDA_SUCCESS && !session.writeApplication(dst, staged.data(), bytes).isOk()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return r;
}

// One side of a 2D or 3D copy: row (y, z) of the copy starts at
// base + ((z0 + z) * height + y0 + y) * pitch + x0.
struct RowSide {
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  uint64_t base = 0;
  uint64_t x = 0, y = 0, z = 0, pitch = 0, height = 0;
  bool application = false;  // the application's pageable memory
};

uint64_t rowAddress(const RowSide& side, uint64_t y, uint64_t z) {
  return side.base + ((side.z + z) * side.height + side.y + y) * side.pitch + side.x;
}

// Says where a side is: in the session's memory (device or pinned, used as
// is) or the application's pageable memory (copied row by row). The whole
// span of the side's rows must lie in one allocation when it is device
// memory.
CUresult placeSide(ServerCall& c, RowSide& side, uint64_t width, uint64_t rows, uint64_t depth) {
  // An array's extent is the driver's to check (its handle is translated).
  if (side.type == CU_MEMORYTYPE_ARRAY) return CUDA_SUCCESS;
  if (side.type != CU_MEMORYTYPE_HOST && side.type != CU_MEMORYTYPE_DEVICE && side.type != CU_MEMORYTYPE_UNIFIED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (side.base == 0) return CUDA_ERROR_INVALID_VALUE;
  // The client's numbers: bounded first, then the span computed wide, so that
  // no row address can wrap around.
  constexpr uint64_t kLimit = 1ull << 40;
  for (uint64_t v : {side.x, side.y, side.z, side.pitch, side.height, width, rows, depth}) {
    if (v >= kLimit) return CUDA_ERROR_INVALID_VALUE;
  }
  __extension__ using Wide = unsigned __int128;
  const Wide first = (Wide{side.z} * side.height + side.y) * side.pitch + side.x;
  const Wide last = (Wide{side.z + depth - 1} * side.height + side.y + rows - 1) * side.pitch + side.x + width;
  if (Wide{side.base} + last > Wide{~0ull}) return CUDA_ERROR_INVALID_VALUE;
  const auto start = static_cast<uint64_t>(side.base + first);
  if (c.session().ownsRange(start, static_cast<uint64_t>(last - first))) return CUDA_SUCCESS;
  if (side.type == CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  side.application = true;
  return CUDA_SUCCESS;
}

// Validates as CUDA does, places both sides, and copies: device and pinned
// memory with the driver's own 2D/3D copy (`direct`), anything involving the
// application's pageable memory row by row through the staging buffers (the
// host side is done when the call returns, as CUDA does for pageable memory).
// A copy between an array and the application's pageable memory goes
// through a buffer of phosd at most this large (the driver copies between it
// and the array).
constexpr uint64_t kArrayStagingLimit = 1ull << 30;

// `restage(buffer, source)`: the copy's host side (its source, or its
// destination) becomes `buffer`, its rows `width` bytes apart.
template <typename Direct>
CUresult rowCopy(ServerCall& c, RowSide src, RowSide dst, uint64_t width, uint64_t rows,
                 uint64_t depth, CUstream s, bool async, Direct direct,
                 const std::function<void(void*, bool)>& restage = {}) {
  // An array's rows are the driver's to lay out: it checks the extent.
  auto rowsFit = [&](const RowSide& side) {
    if (side.type == CU_MEMORYTYPE_ARRAY) return true;
    if ((rows > 1 || depth > 1) && side.pitch < side.x + width) return false;
    return depth <= 1 || side.height >= side.y + rows;
  };
  if (!rowsFit(src) || !rowsFit(dst)) return CUDA_ERROR_INVALID_VALUE;
  if (width == 0 || rows == 0 || depth == 0) return CUDA_SUCCESS;
  if (CUresult r = placeSide(c, src, width, rows, depth); r != CUDA_SUCCESS) return r;
  if (CUresult r = placeSide(c, dst, width, rows, depth); r != CUDA_SUCCESS) return r;
  // The span from the first row to the end of the last (placeSide bounded it).
  auto span = [&](const RowSide& side) -> instrument::Buffer {
    const uint64_t first = rowAddress(side, 0, 0);
    return {first, rowAddress(side, rows - 1, depth - 1) + width - first};
  };
  // The destination's span is overwritten when its rows and slices follow
  // one another with no gap.
  CallAccess access{.overwrites = (rows == 1 && depth == 1) ||
                                  (dst.pitch == width && (depth == 1 || dst.height == rows))};
  // An array is saved whole at a checkpoint's cut: no protocol tracks it.
  const bool srcArray = src.type == CU_MEMORYTYPE_ARRAY;
  const bool dstArray = dst.type == CU_MEMORYTYPE_ARRAY;
  if (!src.application && !srcArray) access.reads.push_back(span(src));
  if (!dst.application && !dstArray) access.writes.push_back(span(dst));
  if (!access.reads.empty() || !access.writes.empty()) c.session().passGate(access);
  if (!src.application && !dst.application) return finish(c, direct(), async, s);
  if (auto refused = c.refuseInCapture(s)) return *refused;
  if (srcArray || dstArray) {
    // (width is not 0 here, and the product is bounded before it is formed.)
    if (!restage || rows > kArrayStagingLimit / width ||
        depth > kArrayStagingLimit / (width * rows)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::vector<std::byte> staged(width * rows * depth);
    auto stagedRow = [&](uint64_t y, uint64_t z) { return staged.data() + (z * rows + y) * width; };
    for (uint64_t z = 0; z < depth && src.application; ++z) {
      for (uint64_t y = 0; y < rows; ++y) {
        if (!c.session().readApplication(rowAddress(src, y, z), stagedRow(y, z), width).isOk()) {
          return CUDA_ERROR_INVALID_VALUE;
        }
      }
    }
    restage(staged.data(), src.application);
    // The buffer lives until the copy is done: synchronous whatever was asked.
    CUresult r = finish(c, direct(), false, s);
    for (uint64_t z = 0; z < depth && dst.application && r == CUDA_SUCCESS; ++z) {
      for (uint64_t y = 0; y < rows && r == CUDA_SUCCESS; ++y) {
        if (!c.session().writeApplication(rowAddress(dst, y, z), stagedRow(y, z), width).isOk()) {
          r = CUDA_ERROR_INVALID_VALUE;
        }
      }
    }
    return r;
  }
  CUresult r = CUDA_SUCCESS;
  for (uint64_t z = 0; z < depth && r == CUDA_SUCCESS; ++z) {
    for (uint64_t y = 0; y < rows && r == CUDA_SUCCESS; ++y) {
      const uint64_t from = rowAddress(src, y, z);
      const uint64_t to = rowAddress(dst, y, z);
      if (src.application && dst.application) {
        r = copyWithinApplication(c, to, from, width);
      } else if (src.application) {
        r = copyFromApplication(c, to, from, width, s);
      } else {
        r = copyToApplication(c, to, from, width, s);
      }
    }
  }
  return r;
}

CUresult copy2D(ServerCall& c, const CUDA_MEMCPY2D& p, CUstream s, bool async) {
  auto side = [&](CUmemorytype type, const void* host, CUdeviceptr device, size_t x, size_t y, size_t pitch) {
    RowSide r;
    r.type = type;
    r.base = type == CU_MEMORYTYPE_HOST ? reinterpret_cast<uintptr_t>(host) : device;
    r.x = x;
    r.y = y;
    r.height = y + p.Height;
    // A single row needs no pitch.
    r.pitch = p.Height <= 1 ? std::max<uint64_t>(pitch, x + p.WidthInBytes) : pitch;
    return r;
  };
  RowSide src = side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcXInBytes, p.srcY, p.srcPitch);
  RowSide dst = side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstXInBytes, p.dstY, p.dstPitch);
  CUDA_MEMCPY2D asked = p;
  asked.srcMemoryType = driverType(c.session(), p.srcMemoryType, p.srcDevice);
  asked.dstMemoryType = driverType(c.session(), p.dstMemoryType, p.dstDevice);
  if (!driverArray(c, p.srcMemoryType, asked.srcArray) ||
      !driverArray(c, p.dstMemoryType, asked.dstArray)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto restage = [&](void* buffer, bool source) {
    if (source) {
      asked.srcHost = buffer;
      asked.srcXInBytes = asked.srcY = 0;
      asked.srcPitch = p.WidthInBytes;
    } else {
      asked.dstHost = buffer;
      asked.dstXInBytes = asked.dstY = 0;
      asked.dstPitch = p.WidthInBytes;
    }
  };
  return rowCopy(
      c, src, dst, p.WidthInBytes, p.Height, 1, s, async,
      [&] { return PHOS_DRIVER(c.driverTable(), Memcpy2DAsync_v2)(&asked, s); }, restage);
}

// `peer`: the contexts of a 3D peer copy (the driver's), which the driver
// call takes in place of the reserved fields.
CUresult copy3D(ServerCall& c, const CUDA_MEMCPY3D& p, CUstream s, bool async,
                std::optional<std::pair<CUcontext, CUcontext>> peer = std::nullopt) {
  // "reserved0/reserved1: Must be NULL"; "srcLOD and dstLOD ... must be set to 0".
  if (p.reserved0 != nullptr || p.reserved1 != nullptr || p.srcLOD != 0 || p.dstLOD != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto side = [&](CUmemorytype type, const void* host, CUdeviceptr device, size_t x, size_t y, size_t z, size_t pitch,
                  size_t height) {
    RowSide r;
    r.type = type;
    r.base = type == CU_MEMORYTYPE_HOST ? reinterpret_cast<uintptr_t>(host) : device;
    r.x = x;
    r.y = y;
    r.z = z;
    // "srcHeight ... may be 0 if Depth==1"; a single row needs no pitch.
    r.height = p.Depth == 1 ? std::max<uint64_t>(height, y + p.Height) : height;
    r.pitch = p.Height <= 1 && p.Depth <= 1 ? std::max<uint64_t>(pitch, x + p.WidthInBytes) : pitch;
    return r;
  };
  RowSide src = side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch, p.srcHeight);
  RowSide dst = side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight);
  CUDA_MEMCPY3D asked = p;
  asked.srcMemoryType = driverType(c.session(), p.srcMemoryType, p.srcDevice);
  asked.dstMemoryType = driverType(c.session(), p.dstMemoryType, p.dstDevice);
  if (!driverArray(c, p.srcMemoryType, asked.srcArray) ||
      !driverArray(c, p.dstMemoryType, asked.dstArray)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto restage = [&](void* buffer, bool source) {
    if (source) {
      asked.srcHost = buffer;
      asked.srcXInBytes = asked.srcY = asked.srcZ = 0;
      asked.srcPitch = p.WidthInBytes;
      asked.srcHeight = p.Height;
    } else {
      asked.dstHost = buffer;
      asked.dstXInBytes = asked.dstY = asked.dstZ = 0;
      asked.dstPitch = p.WidthInBytes;
      asked.dstHeight = p.Height;
    }
  };
  return rowCopy(
      c, src, dst, p.WidthInBytes, p.Height, p.Depth, s, async,
      [&] {
        if (!peer) return PHOS_DRIVER(c.driverTable(), Memcpy3DAsync_v2)(&asked, s);
        const CUDA_MEMCPY3D_PEER both =
            memcpy3d_peer::withContexts(asked, peer->first, peer->second);
        return PHOS_DRIVER(c.driverTable(), Memcpy3DPeerAsync)(&both, s);
      },
      restage);
}

// A 3D peer copy: its contexts are the session's (ids), the rest a 3D copy's.
// Arrays are not the session's objects.
CUresult copy3DPeer(ServerCall& c, const CUDA_MEMCPY3D_PEER* p, CUstream s, bool async) {
  if (p == nullptr || p->srcMemoryType == CU_MEMORYTYPE_ARRAY ||
      p->dstMemoryType == CU_MEMORYTYPE_ARRAY) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto real = [&](CUcontext id) -> CUcontext {
    const SessionContext* ctx = c.session().contexts().find(reinterpret_cast<uint64_t>(id));
    return ctx != nullptr && !c.session().contextDestroyed(reinterpret_cast<uint64_t>(id))
               ? ctx->real
               : nullptr;
  };
  CUcontext src = real(p->srcContext), dst = real(p->dstContext);
  if (src == nullptr || dst == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return copy3D(c, memcpy3d_peer::withoutContexts(*p), s, async, std::make_pair(src, dst));
}

}  // namespace

// ---- 1D copies ---------------------------------------------------------------------
CUresult cuMemcpyHtoD(ServerCall& c, CUdeviceptr dst, uint64_t src, size_t bytes) {
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return hostToDevice(c, dst, src, bytes, s, false);
}

CUresult cuMemcpyHtoDAsync(ServerCall& c, CUdeviceptr dst, uint64_t src, size_t bytes, Handle<CUstream> s) {
  return hostToDevice(c, dst, src, bytes, s.real, true);
}

CUresult cuMemcpyDtoH(ServerCall& c, uint64_t dst, CUdeviceptr src, size_t bytes) {
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return deviceToHost(c, dst, src, bytes, s, false);
}

CUresult cuMemcpyDtoHAsync(ServerCall& c, uint64_t dst, CUdeviceptr src, size_t bytes, Handle<CUstream> s) {
  return deviceToHost(c, dst, src, bytes, s.real, true);
}

CUresult cuMemcpy(ServerCall& c, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return unifiedCopy(c, dst, src, bytes, s, false, false);
}

CUresult cuMemcpyAsync(ServerCall& c, CUdeviceptr dst, CUdeviceptr src, size_t bytes, Handle<CUstream> s) {
  return unifiedCopy(c, dst, src, bytes, s.real, true, false);
}

CUresult cuMemcpyDtoD(ServerCall& c, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return unifiedCopy(c, dst, src, bytes, s, false, true);
}

CUresult cuMemcpyDtoDAsync(ServerCall& c, CUdeviceptr dst, CUdeviceptr src, size_t bytes, Handle<CUstream> s) {
  return unifiedCopy(c, dst, src, bytes, s.real, true, true);
}

CUresult cuMemcpyPeer(ServerCall& c, CUdeviceptr dst, Handle<CUcontext> dstContext, CUdeviceptr src,
                      Handle<CUcontext> srcContext, size_t bytes) {
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return peerCopy(c, dst, dstContext, src, srcContext, bytes, s, false);
}

CUresult cuMemcpyPeerAsync(ServerCall& c, CUdeviceptr dst, Handle<CUcontext> dstContext, CUdeviceptr src,
                           Handle<CUcontext> srcContext, size_t bytes, Handle<CUstream> s) {
  return peerCopy(c, dst, dstContext, src, srcContext, bytes, s.real, true);
}

// ---- copies of arrays -------------------------------------------------------------------
CUresult cuMemcpyHtoA(ServerCall& c, Handle<CUarray> dst, size_t offset, uint64_t src,
                      size_t bytes) {
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return hostToArray(c, dst.real, offset, src, bytes, s, false);
}

CUresult cuMemcpyHtoAAsync(ServerCall& c, Handle<CUarray> dst, size_t offset, uint64_t src,
                           size_t bytes, Handle<CUstream> s) {
  return hostToArray(c, dst.real, offset, src, bytes, s.real, true);
}

CUresult cuMemcpyAtoH(ServerCall& c, uint64_t dst, Handle<CUarray> src, size_t offset,
                      size_t bytes) {
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return arrayToHost(c, dst, src.real, offset, bytes, s, false);
}

CUresult cuMemcpyAtoHAsync(ServerCall& c, uint64_t dst, Handle<CUarray> src, size_t offset,
                           size_t bytes, Handle<CUstream> s) {
  return arrayToHost(c, dst, src.real, offset, bytes, s.real, true);
}

// Device memory and arrays: the driver's synchronous copies (there are no
// asynchronous ones), of the variant the application called.
CUresult cuMemcpyDtoA(ServerCall& c, Handle<CUarray> dst, size_t offset, CUdeviceptr src,
                      size_t bytes) {
  if (!c.checkDeviceRange(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
  passCopyGate(c.session(), 0, src, bytes);
  if (c.perThreadEntry()) {
    return PHOS_DRIVER(c.driverTable(), MemcpyDtoA_v2_ptds)(dst.real, offset, src, bytes);
  }
  return PHOS_DRIVER(c.driverTable(), MemcpyDtoA_v2)(dst.real, offset, src, bytes);
}

CUresult cuMemcpyAtoD(ServerCall& c, CUdeviceptr dst, Handle<CUarray> src, size_t offset,
                      size_t bytes) {
  if (!c.checkDeviceRange(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
  passCopyGate(c.session(), dst, 0, bytes);
  if (c.perThreadEntry()) {
    return PHOS_DRIVER(c.driverTable(), MemcpyAtoD_v2_ptds)(dst, src.real, offset, bytes);
  }
  return PHOS_DRIVER(c.driverTable(), MemcpyAtoD_v2)(dst, src.real, offset, bytes);
}

CUresult cuMemcpyAtoA(ServerCall& c, Handle<CUarray> dst, size_t dstOffset, Handle<CUarray> src,
                      size_t srcOffset, size_t bytes) {
  if (c.perThreadEntry()) {
    return PHOS_DRIVER(c.driverTable(), MemcpyAtoA_v2_ptds)(dst.real, dstOffset, src.real,
                                                            srcOffset, bytes);
  }
  return PHOS_DRIVER(c.driverTable(), MemcpyAtoA_v2)(dst.real, dstOffset, src.real, srcOffset,
                                                     bytes);
}

// ---- sets ---------------------------------------------------------------------------
#define PHOS_MEMSET_HOOKS(Name, T)                                            \
  CUresult Name(ServerCall& c, CUdeviceptr dst, T value, size_t count) {      \
    CUstream s{};                                                             \
    if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;       \
    return memset<T>(c, dst, value, count, s, true);                          \
  }                                                                           \
  CUresult Name##Async(ServerCall& c, CUdeviceptr dst, T value, size_t count, \
                       Handle<CUstream> s) {                                  \
    return memset<T>(c, dst, value, count, s.real, false);                    \
  }
PHOS_MEMSET_HOOKS(cuMemsetD8, unsigned char)
PHOS_MEMSET_HOOKS(cuMemsetD16, unsigned short)
PHOS_MEMSET_HOOKS(cuMemsetD32, unsigned int)
#undef PHOS_MEMSET_HOOKS

#define PHOS_MEMSET2D_HOOKS(Name, T)                                                        \
  CUresult Name(ServerCall& c, CUdeviceptr dst, size_t pitch, T value, size_t width,        \
                size_t height) {                                                            \
    CUstream s{};                                                                           \
    if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;                     \
    return memset2D<T>(c, dst, pitch, value, width, height, s, true);                       \
  }                                                                                         \
  CUresult Name##Async(ServerCall& c, CUdeviceptr dst, size_t pitch, T value, size_t width, \
                       size_t height, Handle<CUstream> s) {                                 \
    return memset2D<T>(c, dst, pitch, value, width, height, s.real, false);                 \
  }
PHOS_MEMSET2D_HOOKS(cuMemsetD2D8, unsigned char)
PHOS_MEMSET2D_HOOKS(cuMemsetD2D16, unsigned short)
PHOS_MEMSET2D_HOOKS(cuMemsetD2D32, unsigned int)
#undef PHOS_MEMSET2D_HOOKS

// ---- 2D and 3D copies ----------------------------------------------------------------
// The application waits for the answer: a side in its pageable memory is done
// when the call returns.
CUresult cuMemcpy2D(ServerCall& c, const CUDA_MEMCPY2D* pCopy) {
  if (pCopy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return copy2D(c, *pCopy, s, false);
}

CUresult cuMemcpy2DUnaligned(ServerCall& c, const CUDA_MEMCPY2D* pCopy) { return cuMemcpy2D(c, pCopy); }

CUresult cuMemcpy2DAsync(ServerCall& c, const CUDA_MEMCPY2D* pCopy, Handle<CUstream> s) {
  if (pCopy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy2D(c, *pCopy, s.real, true);
}

CUresult cuMemcpy3D(ServerCall& c, const CUDA_MEMCPY3D* pCopy) {
  if (pCopy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return copy3D(c, *pCopy, s, false);
}

CUresult cuMemcpy3DAsync(ServerCall& c, const CUDA_MEMCPY3D* pCopy, Handle<CUstream> s) {
  if (pCopy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy3D(c, *pCopy, s.real, true);
}

CUresult cuMemcpy3DPeer(ServerCall& c, const CUDA_MEMCPY3D_PEER* pCopy) {
  CUstream s{};
  if (CUresult r = defaultStream(c, &s); r != CUDA_SUCCESS) return r;
  return copy3DPeer(c, pCopy, s, false);
}

CUresult cuMemcpy3DPeerAsync(ServerCall& c, const CUDA_MEMCPY3D_PEER* pCopy, Handle<CUstream> s) {
  return copy3DPeer(c, pCopy, s.real, true);
}

}  // namespace phos::daemon::hooks
