// SPDX-License-Identifier: Apache-2.0
// Concurrent restore: the loading loop and the gate (on_demand_restore.h).
#include "protocols/on_demand_restore.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace phos::daemon {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

OnDemandRestore::OnDemandRestore(const DriverTable& driver, std::shared_ptr<const image::ImageReader> reader,
                                 std::vector<DeviceBuffer> buffers)
    : driver_(driver), reader_(std::move(reader)), streams_(driver) {
  for (const DeviceBuffer& b : buffers) {
    const image::BlobInfo& info = reader_->manifest().blobs[b.blob];
    if (info.size == 0) continue;
    chunkBytes_ = std::max<size_t>(chunkBytes_, info.chunkBytes);
    for (uint64_t i = 0; i < info.chunkCount(); ++i) {
      DeviceBuffer part{b.blob, b.address + i * uint64_t{info.chunkBytes}, info.chunkRawBytes(i), b.context};
      entries_.emplace(part.address, Entry{part, i});
    }
  }
  remaining_ = entries_.size();
  stats_.chunks = remaining_;
  cursor_ = entries_.begin();
}

OnDemandRestore::~OnDemandRestore() = default;

Status OnDemandRestore::prepare() {
  for (const auto& [address, e] : entries_) RETURN_IF_ERROR(streams_.add(e.buffer.context, "a load stream"));
  if (!entries_.empty()) {
    // Two buffers: one chunk is read and decompressed while the other is copied.
    for (auto& buffer : staging_) {
      buffer = std::make_unique<StagingBuffer>(driver_, chunkBytes_);
      RETURN_IF_ERROR(buffer->allocate());
    }
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  return Status::ok();
}

AccessGate OnDemandRestore::gate() {
  return [this](const CallAccess& access) { before(access); };
}

// On the serving thread, before a call that reads and writes `access`.
void OnDemandRestore::before(const CallAccess& access) {
  std::unique_lock lock(mutex_);
  if (released_ || remaining_ == 0) return;
  Clock::time_point waitStart{};
  auto waitUntil = [&](auto&& done) {
    if (done()) return;
    if (waitStart == Clock::time_point{}) {
      waitStart = Clock::now();
      ++stats_.waitedCalls;
    }
    changed_.wait(lock, [&] { return released_ || done(); });
  };
  if (access.mayWriteAnything()) {
    // It may read or write any buffer: everything is loaded first.
    ++stats_.anythingCalls;
    waitUntil([&] { return remaining_ == 0; });
  } else {
    auto overlapping = [&](uint64_t begin, uint64_t end, auto&& visit) {
      if (begin >= end) return;
      auto it = entries_.upper_bound(begin);
      if (it != entries_.begin()) --it;
      for (; it != entries_.end() && it->first < end; ++it) {
        if (it->second.buffer.address + it->second.buffer.bytes > begin) visit(it->second);
      }
    };
    auto readBy = [&](const Entry& e) {
      return std::any_of(access.reads.begin(), access.reads.end(), [&](const instrument::Buffer& r) {
        return r.base < e.buffer.address + e.buffer.bytes && e.buffer.address < r.base + r.size;
      });
    };
    // A copy or set that overwrites a whole chunk it does not read (a free
    // ends it likewise) makes loading it pointless. Not so for a kernel or a
    // 2D set, which may leave bytes of their spans as they were
    // (CallAccess::overwrites).
    if (access.overwrites || access.ends) {
      bool skipped = false;
      for (const instrument::Buffer& w : access.writes) {
        overlapping(w.base, w.base + w.size, [&](Entry& e) {
          const bool whole = w.base <= e.buffer.address && e.buffer.address + e.buffer.bytes <= w.base + w.size;
          if (e.state == State::kPending && whole && !readBy(e)) {
            e.state = State::kLoaded;
            --remaining_;
            ++stats_.skippedChunks;
            skipped = true;
          }
        });
      }
      if (skipped) changed_.notify_all();
    }
    std::vector<Entry*> needed;
    for (const auto* set : {&access.reads, &access.writes}) {
      for (const instrument::Buffer& b : *set) {
        overlapping(b.base, b.base + b.size, [&](Entry& e) {
          if (e.state == State::kLoaded) return;
          needed.push_back(&e);
          if (e.state == State::kPending && !e.demanded) {
            e.demanded = true;
            demanded_.push_back(&e);
          }
        });
      }
    }
    if (!needed.empty()) changed_.notify_all();
    waitUntil([&] {
      return std::all_of(needed.begin(), needed.end(), [](const Entry* e) { return e->state == State::kLoaded; });
    });
  }
  if (waitStart != Clock::time_point{}) {
    stats_.waitedSeconds += std::chrono::duration<double>(Clock::now() - waitStart).count();
  }
}

// The chunk to load next: those calls wait for first, then address order.
OnDemandRestore::Entry* OnDemandRestore::pickLocked() {
  while (!demanded_.empty()) {
    Entry* e = demanded_.front();
    demanded_.pop_front();
    if (e->state == State::kPending) {
      ++stats_.demandedChunks;
      return e;
    }
  }
  while (cursor_ != entries_.end() && cursor_->second.state != State::kPending) ++cursor_;
  return cursor_ == entries_.end() ? nullptr : &cursor_->second;
}

Status OnDemandRestore::run(const std::function<void(uint64_t)>& advanced, const std::function<bool()>& cancelled) {
  const auto start = Clock::now();
  Status status = Status::ok();
  Entry* inFlight = nullptr;
  CUcontext current = nullptr;
  int k = 0;
  // Waits for the copy of `e` and publishes it.
  auto finish = [&](Entry* e) -> Status {
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
    Entry* next = nullptr;
    if (status.isOk() && transfers_ != nullptr) {
      bool waitedFor = false;
      {
        std::lock_guard lock(mutex_);
        waitedFor = !demanded_.empty();
      }
      // The application's own transfers first, unless a call waits for a chunk.
      if (!waitedFor) {
        const double yielded = transfers_->yield().count();
        std::lock_guard lock(mutex_);
        stats_.yieldedSeconds += yielded;
      }
    }
    if (status.isOk()) {
      std::lock_guard lock(mutex_);
      next = pickLocked();
      if (next != nullptr) next->state = State::kLoading;
    }
    // The next chunk is read while the previous one is being copied.
    if (next != nullptr) {
      status = reader_->readChunk(next->buffer.blob, next->chunk, {staging_[k]->data(), next->buffer.bytes});
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
    stats_.loadSeconds = std::chrono::duration<double>(Clock::now() - start).count();
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

OnDemandStats OnDemandRestore::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace phos::daemon
