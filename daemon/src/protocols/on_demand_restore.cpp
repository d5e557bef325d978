// SPDX-License-Identifier: Apache-2.0
// Concurrent restore: the loading loop and the gate (on_demand_restore.h).
#include "protocols/on_demand_restore.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace phos::daemon {
namespace {

// Every buffer cut into the chunks its blob has in the image.
std::vector<OnDemandRestore::Chunk> imageChunks(const image::ImageReader& reader,
                                                const std::vector<DeviceBuffer>& buffers) {
  std::vector<OnDemandRestore::Chunk> chunks;
  for (const DeviceBuffer& b : buffers) {
    const image::BlobInfo& info = reader.manifest().blobs[b.blob];
    for (uint64_t i = 0; info.size != 0 && i < info.chunkCount(); ++i) {
      DeviceBuffer part = b;
      part.address = b.address + i * uint64_t{info.chunkBytes};
      part.bytes = info.chunkRawBytes(i);
      chunks.emplace_back(part, i);
    }
  }
  return chunks;
}

}  // namespace

OnDemandRestore::OnDemandRestore(const DriverTable& driver, std::shared_ptr<const image::ImageReader> reader,
                                 std::vector<DeviceBuffer> buffers)
    : ChunkedProtocol(driver, imageChunks(*reader, buffers)), reader_(std::move(reader)), streams_(driver) {
  for (const Chunk& c : chunks_) chunkBytes_ = std::max<size_t>(chunkBytes_, c.buffer.bytes);
  remaining_ = chunks_.size();
  stats_.chunks = remaining_;
}

OnDemandRestore::~OnDemandRestore() = default;

Status OnDemandRestore::prepare() {
  for (const Chunk& c : chunks_) RETURN_IF_ERROR(streams_.add(c.buffer.context, "a load stream"));
  if (!chunks_.empty()) {
    // Two buffers: one chunk is read and decompressed while the other is copied.
    for (auto& buffer : staging_) {
      buffer = std::make_unique<StagingBuffer>(driver_, chunkBytes_);
      RETURN_IF_ERROR(buffer->allocate());
    }
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  return Status::ok();
}

// On the serving thread, before a call that reads and writes `access`.
void OnDemandRestore::before(const CallAccess& access) {
  std::unique_lock lock(mutex_);
  if (released_ || remaining_ == 0) return;
  CallWait wait(stats_);
  auto waitUntil = [&](auto&& done) {
    if (done()) return;
    wait.waiting();
    changed_.wait(lock, [&] { return released_ || done(); });
  };
  if (access.mayWriteAnything()) {
    // It may read or write any buffer: everything is loaded first.
    ++stats_.anythingCalls;
    waitUntil([&] { return remaining_ == 0; });
    return;
  }
  skipOverwritten(access);
  std::vector<Chunk*> needed;
  for (const auto* set : {&access.reads, &access.writes}) {
    for (const instrument::Buffer& b : *set) {
      forEachOverlapping(b.base, b.base + b.size, [&](Chunk& c) {
        if (c.state == State::kLoaded) return;
        needed.push_back(&c);
        if (c.state == State::kPending && !c.demanded) {
          c.demanded = true;
          demanded_.push_back(&c);
        }
      });
    }
  }
  if (!needed.empty()) changed_.notify_all();
  waitUntil([&] {
    return std::all_of(needed.begin(), needed.end(), [](const Chunk* c) { return c->state == State::kLoaded; });
  });
}

// A copy or set that overwrites a whole chunk it does not read (a free ends
// it likewise) makes loading it pointless. Not so for a kernel or a 2D set,
// which may leave bytes of their spans as they were (CallAccess::overwrites).
void OnDemandRestore::skipOverwritten(const CallAccess& access) {
  if (!access.overwrites && !access.ends) return;
  auto readBy = [&](const Chunk& c) {
    return std::any_of(access.reads.begin(), access.reads.end(),
                       [&](const instrument::Buffer& r) { return c.overlaps(r.base, r.base + r.size); });
  };
  bool skipped = false;
  for (const instrument::Buffer& w : access.writes) {
    forEachOverlapping(w.base, w.base + w.size, [&](Chunk& c) {
      const bool whole = w.base <= c.buffer.address && c.buffer.address + c.buffer.bytes <= w.base + w.size;
      if (c.state == State::kPending && whole && !readBy(c)) {
        c.state = State::kLoaded;
        --remaining_;
        ++stats_.skippedChunks;
        skipped = true;
      }
    });
  }
  if (skipped) changed_.notify_all();
}

// The chunk to load next: those calls wait for first, then address order.
OnDemandRestore::Chunk* OnDemandRestore::pickLocked() {
  while (!demanded_.empty()) {
    Chunk* e = demanded_.front();
    demanded_.pop_front();
    if (e->state == State::kPending) {
      ++stats_.demandedChunks;
      return e;
    }
  }
  while (cursor_ < chunks_.size() && chunks_[cursor_].state != State::kPending) ++cursor_;
  return cursor_ == chunks_.size() ? nullptr : &chunks_[cursor_];
}

Status OnDemandRestore::run(const std::function<void(uint64_t)>& advanced, const std::function<bool()>& cancelled) {
  const auto start = std::chrono::steady_clock::now();
  Status status = Status::ok();
  Chunk* inFlight = nullptr;
  CUcontext current = nullptr;
  int k = 0;
  // Waits for the copy of `e` and publishes it.
  auto finish = [&](Chunk* e) -> Status {
    Status done = driverStatus(PHOS_DRIVER(driver_, StreamSynchronize)(streams_.of(e->buffer.context)),
                               fmt::format("loading device memory at {:#x}", e->buffer.address));
    if (!done.isOk()) return done;
    {
      std::lock_guard lock(mutex_);
      e->state = State::kLoaded;
      --remaining_;
    }
    changed_.notify_all();
    advanced(e->buffer.bytes);
    return Status::ok();
  };
  for (;;) {
    if (cancelled && cancelled()) {
      status = makeError(Code::kFailedPrecondition, "the restored process is gone");
    }
    Chunk* next = nullptr;
    if (status.isOk()) {
      std::unique_lock lock(mutex_);
      // The application's own transfers first, unless a call waits for a chunk.
      if (demanded_.empty()) giveWay(lock);
      next = pickLocked();
      if (next != nullptr) next->state = State::kLoading;
    }
    // The next chunk is read while the previous one is being copied.
    if (next != nullptr) {
      status = reader_->readChunk(next->buffer.blob, next->index, {staging_[k]->data(), next->buffer.bytes});
    }
    if (inFlight != nullptr) {
      Status done = finish(inFlight);
      inFlight = nullptr;
      if (status.isOk()) status = done;
    }
    if (!status.isOk() || next == nullptr) break;
    if (next->buffer.context != current) {
      current = next->buffer.context;
      status = driverStatus(PHOS_DRIVER(driver_, CtxSetCurrent)(current), "making a context current");
      if (!status.isOk()) break;
    }
    status = driverStatus(PHOS_DRIVER(driver_, MemcpyHtoDAsync_v2)(next->buffer.address, staging_[k]->data(),
                                                                   next->buffer.bytes, streams_.of(current)),
                          fmt::format("loading device memory at {:#x}", next->buffer.address));
    if (!status.isOk()) break;
    inFlight = next;
    k ^= 1;
  }
  if (inFlight != nullptr) {
    // Not published: the loop ended with an error. The copy must be done
    // before its staging buffer goes.
    PHOS_DRIVER(driver_, StreamSynchronize)(streams_.of(inFlight->buffer.context));
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  {
    std::lock_guard lock(mutex_);
    stats_.loadSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The application is gone: nothing waits for what it would have read.
    if (!status.isOk() && cancelled && cancelled()) released_ = true;
  }
  changed_.notify_all();
  return status;
}

void OnDemandRestore::release() {
  {
    std::lock_guard lock(mutex_);
    released_ = true;
  }
  changed_.notify_all();
}

}  // namespace phos::daemon
