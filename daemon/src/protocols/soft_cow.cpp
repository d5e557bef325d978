// SPDX-License-Identifier: Apache-2.0
// Soft copy-on-write: the saving loop and the gate (soft_cow.h).
#include "protocols/soft_cow.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <fmt/format.h>

#include "phos/common/log.h"
#include "session/staging_buffer.h"

namespace phos::daemon {

SoftCopyOnWrite::SoftCopyOnWrite(const DriverTable& driver, image::ImageWriter& writer,
                                 std::vector<DeviceBuffer> buffers, const std::vector<DeviceSpace>& devices,
                                 std::map<std::pair<int, int>, uint64_t> peerQuota, size_t chunkBytes)
    : ChunkedProtocol(driver, cut(buffers, chunkBytes)),
      writer_(writer),
      chunkBytes_(chunkBytes),
      quotaLeft_(std::move(peerQuota)),
      gateStreams_(driver),
      copyStreams_(driver) {
  for (const DeviceSpace& d : devices) spaces_[d.device] = Space{d.context, d.reserveBytes, 0};
  // A device nobody described has no reserve: its writers wait.
  for (const DeviceBuffer& b : buffers) spaces_.try_emplace(b.device, Space{b.context, 0, 0});
}

SoftCopyOnWrite::~SoftCopyOnWrite() {
  CUcontext saved = nullptr;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
  for (const Chunk& e : chunks_) {
    if (e.shadow == 0) continue;
    PHOS_DRIVER(driver_, CtxSetCurrent)(e.shadowContext);
    PHOS_DRIVER(driver_, MemFree_v2)(e.shadow);
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
}

Status SoftCopyOnWrite::prepare() {
  for (const auto& [device, space] : spaces_) {
    RETURN_IF_ERROR(copyStreams_.add(space.context, "a copy stream"));
    RETURN_IF_ERROR(gateStreams_.add(space.context, "a gate stream"));
  }
  for (const Chunk& e : chunks_) {
    RETURN_IF_ERROR(copyStreams_.add(e.buffer.context, "a copy stream"));
    RETURN_IF_ERROR(gateStreams_.add(e.buffer.context, "a gate stream"));
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  return Status::ok();
}

void SoftCopyOnWrite::before(const CallAccess& access) {
  if (access.everything) {
    // It ends memory, shadows included (they live in its context): it waits
    // until everything is saved.
    std::unique_lock lock(mutex_);
    ++stats_.anythingCalls;
    CallWait wait(stats_);
    auto allSaved = [&] {
      return failed_ || std::all_of(chunks_.begin(), chunks_.end(), [](const Chunk& e) { return e.state == State::kSaved; });
    };
    if (!allSaved()) {
      wait.waiting();
      changed_.wait(lock, allSaved);
    }
    return;
  }
  // (A call that may write anything has every chunk not saved yet protected first.)
  forEachWrite(access, [this](uint64_t begin, uint64_t end) { beforeWrite(begin, end); });
}

// On the serving thread, before a call that writes [begin, end).
void SoftCopyOnWrite::beforeWrite(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  std::unique_lock lock(mutex_);
  std::vector<Chunk*> touched;
  forEachOverlapping(begin, end, [&](Chunk& e) { touched.push_back(&e); });
  // Shadows first, then the waits: waiting chunk by chunk in address order
  // would follow the saving loop, which goes in that order too, and wait for
  // every chunk.
  for (Chunk* e : touched) {
    if (e->state == State::kPending) protect(lock, *e);
  }
  for (Chunk* e : touched) protect(lock, *e);
}

int SoftCopyOnWrite::shadowPlace(const Chunk& e) {
  const int own = e.buffer.device;
  auto fits = [&](int device) {
    const Space& space = spaces_.at(device);
    return space.usedBytes + e.buffer.bytes <= space.reserveBytes;
  };
  if (fits(own)) return own;
  int best = -1;
  uint64_t mostLeft = 0;
  for (const auto& [pair, left] : quotaLeft_) {
    if (pair.first != own || left < e.buffer.bytes || left <= mostLeft || spaces_.count(pair.second) == 0 ||
        !fits(pair.second)) {
      continue;
    }
    best = pair.second;
    mostLeft = left;
  }
  return best;
}

// Under the mutex: the shadow of `e` was saved (or never filled); its room goes back.
void SoftCopyOnWrite::releaseShadow(Chunk& e) {
  Space& space = spaces_.at(e.shadowDevice);
  space.usedBytes -= e.buffer.bytes;
  reserveUsed_ -= e.buffer.bytes;
  if (e.shadowDevice != e.buffer.device) quotaLeft_[{e.buffer.device, e.shadowDevice}] += e.buffer.bytes;
  e.shadowDevice = -1;
  e.shadowContext = nullptr;
}

// Returns once `e` is shadowed or saved (or the protocol failed).
void SoftCopyOnWrite::protect(std::unique_lock<std::mutex>& lock, Chunk& e) {
  CallWait wait(stats_);
  while (!failed_) {
    if (e.state == State::kShadowed || e.state == State::kSaved) break;
    const int place = e.state == State::kPending ? shadowPlace(e) : -1;
    if (place < 0) {
      // Being saved (or shadowed) right now, or no room for a shadow: the
      // saving loop takes this buffer next and frees shadows as it goes.
      if (e.state == State::kPending) next_ = &e;
      wait.waiting();
      changed_.wait(lock);
      continue;
    }
    // Pending, and a reserve has room: shadow it on that device.
    e.state = State::kShadowing;
    e.shadowDevice = place;
    Space& space = spaces_.at(place);
    const bool peer = place != e.buffer.device;
    if (peer) quotaLeft_[{e.buffer.device, place}] -= e.buffer.bytes;
    space.usedBytes += e.buffer.bytes;
    reserveUsed_ += e.buffer.bytes;
    stats_.peakReserveBytes = std::max(stats_.peakReserveBytes, reserveUsed_);
    // On its own device in the buffer's own context, on a peer in the session's context there.
    const CUcontext shadowContext = peer ? space.context : e.buffer.context;
    e.shadowContext = shadowContext;
    lock.unlock();
    CUcontext saved = nullptr;
    PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
    CUdeviceptr shadow = 0;
    CUstream stream = gateStreams_.of(e.buffer.context);
    CUresult r = PHOS_DRIVER(driver_, CtxSetCurrent)(shadowContext);
    if (r == CUDA_SUCCESS) r = PHOS_DRIVER(driver_, MemAlloc_v2)(&shadow, e.buffer.bytes);
    if (r == CUDA_SUCCESS) r = PHOS_DRIVER(driver_, CtxSetCurrent)(e.buffer.context);
    if (r == CUDA_SUCCESS) {
      // Ordered after nothing the application queued: every call that wrote
      // this buffer since t1 passed this gate, so the device holds t1's bytes.
      r = peer ? PHOS_DRIVER(driver_, MemcpyPeerAsync)(shadow, shadowContext, e.buffer.address, e.buffer.context,
                                                      e.buffer.bytes, stream)
               : PHOS_DRIVER(driver_, MemcpyDtoDAsync_v2)(shadow, e.buffer.address, e.buffer.bytes, stream);
      if (r == CUDA_SUCCESS) r = PHOS_DRIVER(driver_, StreamSynchronize)(stream);
    }
    if (r != CUDA_SUCCESS && shadow != 0) {
      PHOS_DRIVER(driver_, CtxSetCurrent)(shadowContext);
      PHOS_DRIVER(driver_, MemFree_v2)(shadow);
    }
    PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
    lock.lock();
    if (r == CUDA_SUCCESS) {
      e.shadow = shadow;
      e.state = State::kShadowed;
      ++stats_.shadowedChunks;
      stats_.shadowedBytes += e.buffer.bytes;
      if (peer) {
        ++stats_.peerShadowedChunks;
        stats_.peerShadowedBytes += e.buffer.bytes;
      }
      changed_.notify_all();  // the saving loop may wait for this chunk
    } else {
      // No device memory for it after all: give the room back and wait for
      // the saving loop, which takes it next.
      log::get("daemon")->debug("copy-on-write: no shadow for {:#x} ({} bytes) on device {}: CUresult {}",
                                e.buffer.address, e.buffer.bytes, place, static_cast<int>(r));
      releaseShadow(e);
      e.state = State::kPending;
      next_ = &e;
      changed_.notify_all();
      wait.waiting();
      changed_.wait(lock);
    }
  }
}

// The chunk a writer waits for, else the next one not saved in address order
// (from the start again once at the end: a chunk whose shadow could not be
// made goes back to pending); nullptr when all are saved.
SoftCopyOnWrite::Chunk* SoftCopyOnWrite::pick(std::unique_lock<std::mutex>& lock) {
  if (next_ != nullptr && next_->state == State::kPending) return std::exchange(next_, nullptr);
  next_ = nullptr;
  // Shadows on a device the application wants memory back on go first.
  if (givingBack_) {
    for (Chunk& candidate : chunks_) {
      if (candidate.state == State::kShadowed && spaces_.at(candidate.shadowDevice).reserveBytes == 0) {
        return &candidate;
      }
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (; cursor_ < chunks_.size(); ++cursor_) {
      Chunk& candidate = chunks_[cursor_];
      if (candidate.state == State::kShadowing) {
        // The gate is copying it into a shadow: wait for that.
        changed_.wait(lock, [&] { return candidate.state != State::kShadowing || failed_; });
      }
      if (candidate.state == State::kPending || candidate.state == State::kShadowed) return &candidate;
    }
    cursor_ = 0;
  }
  return nullptr;
}

Status SoftCopyOnWrite::run(const std::function<void(uint64_t)>& advanced) {
  const auto start = std::chrono::steady_clock::now();
  StagingBuffer staging(driver_, chunkBytes_);
  Status status = Status::ok();
  auto fail = [&](Status failure) {
    std::lock_guard lock(mutex_);
    failed_ = true;
    changed_.notify_all();
    return failure;
  };
  if (!chunks_.empty()) {
    Status ready = driverStatus(PHOS_DRIVER(driver_, CtxSetCurrent)(chunks_.front().buffer.context),
                                "making a context current");
    if (ready.isOk()) ready = staging.allocate();
    if (!ready.isOk()) return fail(ready);
  }
  std::unique_lock lock(mutex_);
  for (;;) {
    // The application's own transfers first, unless a writer waits for us.
    if (next_ == nullptr) giveWay(lock);
    Chunk* e = pick(lock);
    if (e == nullptr) break;
    const bool fromShadow = e->state == State::kShadowed;
    const CUdeviceptr source = fromShadow ? e->shadow : e->buffer.address;
    if (!fromShadow) e->state = State::kSaving;
    lock.unlock();

    // A shadow is read in its own device's context (a peer's, perhaps).
    const CUcontext context = fromShadow ? e->shadowContext : e->buffer.context;
    CUstream stream = copyStreams_.of(context);
    const uint64_t bytes = e->buffer.bytes;
    const char* step = "cuCtxSetCurrent";
    CUresult r = PHOS_DRIVER(driver_, CtxSetCurrent)(context);
    if (r == CUDA_SUCCESS) {
      step = "cuMemcpyDtoHAsync";
      r = PHOS_DRIVER(driver_, MemcpyDtoHAsync_v2)(staging.data(), source, bytes, stream);
    }
    if (r == CUDA_SUCCESS) {
      step = "cuStreamSynchronize";
      r = PHOS_DRIVER(driver_, StreamSynchronize)(stream);
    }
    if (r != CUDA_SUCCESS) {
      status = driverStatus(r, fmt::format("saving device memory at {:#x}{} ({})", e->buffer.address,
                                           fromShadow ? fmt::format(" from its shadow at {:#x}", source) : "", step));
    } else {
      status = writer_.writeChunk(e->buffer.blob, e->index, {staging.data(), bytes});
    }
    if (!status.isOk()) return fail(status);
    advanced(bytes);

    // The shadow goes outside the mutex: freeing device memory waits for the
    // device's work, which a stream memory wait of the job may hold until a
    // call the gate must let through (docs/remoting.md, "Stream memory
    // operations"). Its state keeps writers from it meanwhile.
    if (fromShadow) PHOS_DRIVER(driver_, MemFree_v2)(source);  // its context is current
    lock.lock();
    e->state = State::kSaved;
    if (fromShadow) {
      e->shadow = 0;
      releaseShadow(*e);
    }
    changed_.notify_all();
  }
  stats_.copySeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  lock.unlock();
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  return Status::ok();
}

void SoftCopyOnWrite::giveBack(int device) {
  std::unique_lock lock(mutex_);
  auto space = spaces_.find(device);
  if (space == spaces_.end()) return;
  ++stats_.givenBack;
  space->second.reserveBytes = 0;  // shadowPlace finds no room there from now on
  givingBack_ = true;
  changed_.notify_all();
  changed_.wait(lock, [&] { return space->second.usedBytes == 0 || failed_; });
}

}  // namespace phos::daemon
