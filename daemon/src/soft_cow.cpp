// SPDX-License-Identifier: Apache-2.0
// Soft copy-on-write: the saving loop and the gate (soft_cow.h).
#include "soft_cow.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "phos/common/log.h"
#include "staging_buffer.h"

namespace phos::daemon {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

SoftCopyOnWrite::SoftCopyOnWrite(const DriverTable& driver, image::ImageWriter& writer,
                                 std::vector<SavedBuffer> buffers, const std::vector<DeviceSpace>& devices,
                                 std::map<std::pair<int, int>, uint64_t> peerQuota, size_t chunkBytes)
    : driver_(driver),
      writer_(writer),
      chunkBytes_(chunkBytes),
      quotaLeft_(std::move(peerQuota)),
      gateStreams_(driver),
      copyStreams_(driver) {
  for (const DeviceSpace& d : devices) spaces_[d.device] = Space{d.context, d.reserveBytes, 0};
  for (const SavedBuffer& b : buffers) {
    for (uint64_t at = 0, chunk = 0; at < b.bytes; at += chunkBytes_, ++chunk) {
      SavedBuffer part{b.blob, b.address + at, std::min<uint64_t>(chunkBytes_, b.bytes - at), b.context, b.device};
      entries_.emplace(part.address, Entry{part, chunk});
    }
    // A device nobody described has no reserve: its writers wait.
    spaces_.try_emplace(b.device, Space{b.context, 0, 0});
  }
}

SoftCopyOnWrite::~SoftCopyOnWrite() {
  CUcontext saved = nullptr;
  PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
  for (auto& [address, e] : entries_) {
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
  for (const auto& [address, e] : entries_) {
    RETURN_IF_ERROR(copyStreams_.add(e.buffer.context, "a copy stream"));
    RETURN_IF_ERROR(gateStreams_.add(e.buffer.context, "a gate stream"));
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  return Status::ok();
}

AccessGate SoftCopyOnWrite::gate() {
  return [this](const CallAccess& access) {
    if (access.everything) {
      // It ends memory, shadows included (they live in its context): it
      // waits until everything is saved.
      std::unique_lock lock(mutex_);
      ++stats_.anythingCalls;
      const auto start = Clock::now();
      bool waited = false;
      changed_.wait(lock, [&] {
        const bool done = failed_ || std::all_of(entries_.begin(), entries_.end(),
                                                 [](const auto& e) { return e.second.state == State::kSaved; });
        waited = waited || !done;
        return done;
      });
      if (waited) {
        ++stats_.waitedCalls;
        stats_.waitedSeconds += std::chrono::duration<double>(Clock::now() - start).count();
      }
      return;
    }
    if (access.mayWriteAnything()) {
      // It may write anything: every buffer not saved yet is protected first.
      {
        std::lock_guard lock(mutex_);
        ++stats_.anythingCalls;
      }
      beforeWrite(0, UINT64_MAX);
      return;
    }
    for (const instrument::Buffer& w : access.writes) beforeWrite(w.base, w.base + w.size);
  };
}

// On the serving thread, before a call that writes [begin, end).
void SoftCopyOnWrite::beforeWrite(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  std::unique_lock lock(mutex_);
  std::vector<Entry*> touched;
  auto it = entries_.upper_bound(begin);
  if (it != entries_.begin()) --it;
  for (; it != entries_.end() && it->first < end; ++it) {
    if (it->second.buffer.address + it->second.buffer.bytes > begin) touched.push_back(&it->second);
  }
  // Shadows first, then the waits: waiting chunk by chunk in address order
  // would follow the saving loop, which goes in that order too, and wait for
  // every chunk.
  for (Entry* e : touched) {
    if (e->state == State::kPending) protect(lock, *e);
  }
  for (Entry* e : touched) protect(lock, *e);
}

int SoftCopyOnWrite::shadowPlace(const Entry& e) {
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
void SoftCopyOnWrite::releaseShadow(Entry& e) {
  Space& space = spaces_.at(e.shadowDevice);
  space.usedBytes -= e.buffer.bytes;
  reserveUsed_ -= e.buffer.bytes;
  if (e.shadowDevice != e.buffer.device) quotaLeft_[{e.buffer.device, e.shadowDevice}] += e.buffer.bytes;
  e.shadowDevice = -1;
  e.shadowContext = nullptr;
}

// Returns once `e` is shadowed or saved (or the protocol failed).
void SoftCopyOnWrite::protect(std::unique_lock<std::mutex>& lock, Entry& e) {
  Clock::time_point waitStart{};
  auto waited = [&] {
    if (waitStart == Clock::time_point{}) {
      waitStart = Clock::now();
      ++stats_.waitedCalls;
    }
  };
  while (!failed_) {
    if (e.state == State::kShadowed || e.state == State::kSaved) break;
    const int place = e.state == State::kPending ? shadowPlace(e) : -1;
    if (place < 0) {
      // Being saved (or shadowed) right now, or no room for a shadow: the
      // saving loop takes this buffer next and frees shadows as it goes.
      if (e.state == State::kPending) next_ = &e;
      waited();
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
      waited();
      changed_.wait(lock);
    }
  }
  if (waitStart != Clock::time_point{}) {
    stats_.waitedSeconds += std::chrono::duration<double>(Clock::now() - waitStart).count();
  }
}

namespace {

// Writes chunks into an image on threads of their own, in the order they
// were added; each chunk is known by the staging slot it is written from.
class ChunkWriters {
 public:
  ChunkWriters(image::ImageWriter& writer, size_t slots) : writer_(writer), done_(slots), bytes_(slots) {
    for (unsigned t = 0; t < std::clamp(std::thread::hardware_concurrency(), 1u, 2u); ++t) {
      threads_.emplace_back([this] { work(); });
    }
  }
  ~ChunkWriters() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_) t.join();
  }
  ChunkWriters(const ChunkWriters&) = delete;
  ChunkWriters& operator=(const ChunkWriters&) = delete;

  void add(size_t slot, size_t blob, uint64_t chunk, std::span<const std::byte> bytes) {
    {
      std::lock_guard lock(mutex_);
      done_[slot].reset();
      queue_.push_back({slot, blob, chunk, bytes});
    }
    changed_.notify_all();
  }
  // The bytes written from `slot`, once they are in the image, or the error.
  Result<uint64_t> wait(size_t slot) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_[slot].has_value(); });
    Status st = *done_[slot];
    if (!st.isOk()) return st;
    return bytes_[slot];
  }

 private:
  struct Job {
    size_t slot;
    size_t blob;
    uint64_t chunk;
    std::span<const std::byte> bytes;
  };
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Job job = queue_.front();
      queue_.pop_front();
      lock.unlock();
      Status st = writer_.writeChunk(job.blob, job.chunk, job.bytes);
      lock.lock();
      bytes_[job.slot] = job.bytes.size();
      done_[job.slot] = std::move(st);
      changed_.notify_all();
    }
  }

  image::ImageWriter& writer_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  std::vector<std::optional<Status>> done_;  // per slot: its last chunk's outcome
  std::vector<uint64_t> bytes_;              // per slot: its last chunk's size
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

Status SoftCopyOnWrite::run(const std::function<void(uint64_t)>& advanced, uint64_t hostBytes,
                            const std::function<void()>& copied) {
  const auto start = Clock::now();
  // Chunks go through slots of one registered host region. A chunk is copied
  // into a free slot; once it has arrived, the writer threads write it into
  // the image from there. The copies run ahead of the writes by as many slots as the region
  // holds, so the copy engine is not held to the image's write rate (ext4
  // here: about 450 MB/s, below a modelled 1 GB/s link). One chunk copied,
  // waited for and written in turn kept the copy engine busy 42% of the time
  // at 1 GB/s.
  const size_t slotCount =
      std::clamp<size_t>(hostBytes / std::max<size_t>(chunkBytes_, 1), 2, std::max<size_t>(entries_.size(), 2));
  struct Slot {
    std::byte* data = nullptr;
    Entry* entry = nullptr;  // its copy is in flight
    bool fromShadow = false;
    CUdeviceptr source = 0;
    CUcontext context = nullptr;
    CUstream stream = nullptr;
    bool writing = false;  // queued to the writers, or being written
  };
  StagingBuffer region(driver_, slotCount * chunkBytes_);
  std::vector<Slot> slots(slotCount);
  ChunkWriters writers(writer_, slotCount);
  // On every way out, no copy still lands in the region about to be freed.
  auto drainCopies = [&] {
    for (Slot& slot : slots) {
      if (slot.entry == nullptr) continue;
      PHOS_DRIVER(driver_, CtxSetCurrent)(slot.context);
      PHOS_DRIVER(driver_, StreamSynchronize)(slot.stream);
      slot.entry = nullptr;
    }
  };
  struct OnExit {
    std::function<void()> run;
    ~OnExit() { run(); }
  } drained{drainCopies};
  auto fail = [&](Status failure) {
    drainCopies();
    std::lock_guard lock(mutex_);
    failed_ = true;
    changed_.notify_all();
    return failure;
  };
  // The chunk written from slot `k` is in the image (and counted), or its error.
  auto written = [&](size_t k) -> Status {
    if (!slots[k].writing) return Status::ok();
    slots[k].writing = false;
    ASSIGN_OR_RETURN(uint64_t bytes, writers.wait(k));
    advanced(bytes);
    return Status::ok();
  };
  // Waits for the copy in flight in slot `k`: t1's bytes are then in host
  // memory, so the chunk is saved (the device's bytes may change from here)
  // and goes to the writers.
  auto land = [&](size_t k) -> Status {
    Slot& slot = slots[k];
    if (slot.entry == nullptr) return Status::ok();
    Entry* e = slot.entry;
    CUresult r = PHOS_DRIVER(driver_, CtxSetCurrent)(slot.context);
    if (r == CUDA_SUCCESS) r = PHOS_DRIVER(driver_, StreamSynchronize)(slot.stream);
    slot.entry = nullptr;
    if (r != CUDA_SUCCESS) {
      return driverStatus(r, fmt::format("saving device memory at {:#x}{} (cuStreamSynchronize)", e->buffer.address,
                                         slot.fromShadow ? fmt::format(" from its shadow at {:#x}", slot.source) : ""));
    }
    writers.add(k, e->buffer.blob, e->chunk, {slot.data, e->buffer.bytes});
    slot.writing = true;
    std::lock_guard lock(mutex_);
    stats_.copiedBytes += e->buffer.bytes;
    e->state = State::kSaved;
    if (e->shadow != 0) {
      PHOS_DRIVER(driver_, MemFree_v2)(e->shadow);  // its context is current
      e->shadow = 0;
      releaseShadow(*e);
    }
    changed_.notify_all();
    return Status::ok();
  };
  if (!entries_.empty()) {
    Status ready = driverStatus(PHOS_DRIVER(driver_, CtxSetCurrent)(entries_.begin()->second.buffer.context),
                                "making a context current");
    if (ready.isOk()) ready = region.allocate();
    if (!ready.isOk()) return fail(ready);
    for (size_t k = 0; k < slotCount; ++k) slots[k].data = region.data() + k * chunkBytes_;
  }
  std::unique_lock lock(mutex_);
  auto cursor = entries_.begin();
  // The buffer a writer waits for, else the next one not saved in address
  // order (from the start again once at the end: a buffer whose shadow could
  // not be made goes back to pending); nullptr when all are saved.
  auto pick = [&]() -> Entry* {
    if (next_ != nullptr && next_->state == State::kPending) return std::exchange(next_, nullptr);
    next_ = nullptr;
    // Shadows on a device the application wants memory back on go first.
    if (givingBack_) {
      for (auto& [address, candidate] : entries_) {
        if (candidate.state == State::kShadowed && spaces_.at(candidate.shadowDevice).reserveBytes == 0) {
          return &candidate;
        }
      }
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (; cursor != entries_.end(); ++cursor) {
        Entry& candidate = cursor->second;
        if (candidate.state == State::kShadowing) {
          // The gate is copying it into a shadow: wait for that.
          changed_.wait(lock, [&] { return candidate.state != State::kShadowing || failed_; });
        }
        if (candidate.state == State::kPending || candidate.state == State::kShadowed) return &candidate;
      }
      cursor = entries_.begin();
    }
    return nullptr;
  };
  for (size_t k = 0;; k = (k + 1) % slotCount) {
    // The application's own transfers first, unless a writer waits for us.
    if (transfers_ != nullptr && next_ == nullptr) {
      lock.unlock();
      const double yielded = transfers_->yield().count();
      lock.lock();
      stats_.yieldedSeconds += yielded;
    }
    Entry* e = pick();
    if (e == nullptr) break;
    Slot& slot = slots[k];
    slot.fromShadow = e->state == State::kShadowed;
    slot.source = slot.fromShadow ? e->shadow : e->buffer.address;
    if (!slot.fromShadow) e->state = State::kSaving;
    lock.unlock();

    // This slot's last chunk is in the image before it is reused.
    if (Status st = written(k); !st.isOk()) return fail(st);
    // A shadow is read in its own device's context (a peer's, perhaps).
    slot.context = slot.fromShadow ? e->shadowContext : e->buffer.context;
    slot.stream = copyStreams_.of(slot.context);
    const char* step = "cuCtxSetCurrent";
    CUresult r = PHOS_DRIVER(driver_, CtxSetCurrent)(slot.context);
    if (r == CUDA_SUCCESS) {
      step = "cuMemcpyDtoHAsync";
      r = PHOS_DRIVER(driver_, MemcpyDtoHAsync_v2)(slot.data, slot.source, e->buffer.bytes, slot.stream);
    }
    if (r != CUDA_SUCCESS) {
      return fail(driverStatus(r, fmt::format("saving device memory at {:#x}{} ({})", e->buffer.address,
                                              slot.fromShadow ? fmt::format(" from its shadow at {:#x}", slot.source)
                                                              : "",
                                              step)));
    }
    slot.entry = e;
    // One chunk in flight: the job's own transfers, and its writes to the
    // chunk being copied, wait for one chunk at most. (Two in flight kept the
    // copy engine busier on vgpu, 81-94% of the link against 53-72%, but a
    // job that writes a buffer of two chunks then waited for both copies.)
    if (Status st = land(k); !st.isOk()) return fail(st);
    lock.lock();
  }
  lock.unlock();
  for (size_t k = 0; k < slotCount; ++k) {
    if (Status st = land(k); !st.isOk()) return fail(st);
  }
  lock.lock();
  stats_.copySeconds = std::chrono::duration<double>(Clock::now() - start).count();
  lock.unlock();
  if (copied) copied();
  for (size_t k = 0; k < slotCount; ++k) {
    if (Status st = written(k); !st.isOk()) return fail(st);
  }
  lock.lock();
  stats_.saveSeconds = std::chrono::duration<double>(Clock::now() - start).count();
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

SoftCowStats SoftCopyOnWrite::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace phos::daemon
