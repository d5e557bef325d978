// SPDX-License-Identifier: Apache-2.0
// Soft recopy: the dirty-tracking gate and the copy rounds (soft_recopy.h).
#include "protocols/soft_recopy.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace phos::daemon {

SoftRecopy::SoftRecopy(const DriverTable& driver, const std::vector<DeviceBuffer>& buffers, std::byte* staging,
                       uint64_t capacity, size_t chunkBytes)
    : ChunkedProtocol(driver, cut(buffers, chunkBytes)), staging_(staging), capacity_(capacity), streams_(driver) {
  for (Chunk& c : chunks_) {
    c.offset = slotBytes_;
    slotBytes_ += c.buffer.bytes;
  }
  dirty_ = chunks_.size();
}

SoftRecopy::~SoftRecopy() = default;

Status SoftRecopy::prepare() {
  if (slotBytes_ > capacity_) {
    return makeError(Code::kResourceExhausted, "soft recopy needs {} bytes of host memory, {} were reserved",
                     slotBytes_, capacity_);
  }
  for (const Chunk& c : chunks_) RETURN_IF_ERROR(streams_.add(c.buffer.context, "a copy stream"));
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  return Status::ok();
}

SoftRecopy::ChunkSlot SoftRecopy::slotOf(uint64_t index) const {
  std::lock_guard lock(mutex_);
  const Chunk& c = chunks_.at(index);
  return {c.buffer.address, c.buffer.bytes, c.offset, c.gone};
}

void SoftRecopy::before(const CallAccess& access) {
  if (access.everything) {
    beforeEnd(0, UINT64_MAX);  // a context or module goes, with its memory
    return;
  }
  if (access.ends) {
    for (const instrument::Buffer& w : access.writes) beforeEnd(w.base, w.base + w.size);
    return;
  }
  forEachWrite(access, [this](uint64_t begin, uint64_t end) { beforeWrite(begin, end); });
}

void SoftRecopy::beforeWrite(uint64_t begin, uint64_t end) {
  std::lock_guard lock(mutex_);
  forEachOverlapping(begin, end, [&](Chunk& c) {
    if (c.dirty || c.gone) return;
    c.dirty = true;
    ++dirty_;
  });
}

void SoftRecopy::beforeEnd(uint64_t begin, uint64_t end) {
  std::unique_lock lock(mutex_);
  std::vector<Chunk*> ended;
  forEachOverlapping(begin, end, [&](Chunk& c) {
    ended.push_back(&c);
    if (c.gone) return;
    c.gone = true;
    if (c.dirty) --dirty_;
    c.dirty = false;
  });
  auto settled = [&] { return std::none_of(ended.begin(), ended.end(), [](const Chunk* c) { return c->copying; }); };
  if (settled()) return;
  CallWait wait(stats_);
  wait.waiting();
  changed_.wait(lock, settled);
}

uint64_t SoftRecopy::dirtyChunks() const {
  std::lock_guard lock(mutex_);
  return dirty_;
}

std::vector<uint64_t> SoftRecopy::takeDirty() {
  std::lock_guard lock(mutex_);
  std::vector<uint64_t> taken;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (!chunks_[i].dirty || chunks_[i].gone) continue;
    chunks_[i].dirty = false;
    taken.push_back(i);
  }
  dirty_ = 0;
  return taken;
}

void SoftRecopy::markAllDirty() {
  std::lock_guard lock(mutex_);
  dirty_ = 0;
  for (Chunk& c : chunks_) {
    c.dirty = !c.gone;
    dirty_ += c.dirty ? 1 : 0;
  }
}

Status SoftRecopy::copy(const std::vector<uint64_t>& taken, const std::function<void(uint64_t)>& advanced) {
  const auto start = std::chrono::steady_clock::now();
  CUcontext current = nullptr;
  // Up to this many chunks in flight before the copies are waited for.
  constexpr size_t kBatch = 8;
  std::vector<Chunk*> inFlight;
  auto drain = [&]() -> Status {
    Status synced = Status::ok();
    // (Not a stream of a context destroyed meanwhile: that freed every chunk.)
    for (const auto& [context, stream] : streams_.all()) {
      if (synced.isOk() && !inFlight.empty()) {
        synced = driverStatus(PHOS_DRIVER(driver_, StreamSynchronize)(stream), "waiting for a recopy");
      }
    }
    uint64_t bytes = 0;
    {
      std::lock_guard lock(mutex_);
      for (Chunk* c : inFlight) {
        bytes += c->buffer.bytes;
        c->copying = false;
      }
    }
    changed_.notify_all();
    inFlight.clear();
    if (bytes != 0) advanced(bytes);
    return synced;
  };
  Status status = Status::ok();
  double yielded = 0;
  for (uint64_t index : taken) {
    if (transfers_ != nullptr) yielded += transfers_->yield().count();  // the application's transfers first
    Chunk& e = chunks_[index];  // chunks_ never changes shape; its flags are shared
    {
      // A chunk freed since it was taken is not copied; one being freed
      // waits in beforeEnd() until its copy is done.
      std::lock_guard lock(mutex_);
      if (e.gone) continue;
      e.copying = true;
    }
    inFlight.push_back(&e);
    if (e.buffer.context != current) {
      current = e.buffer.context;
      status = driverStatus(PHOS_DRIVER(driver_, CtxSetCurrent)(current), "making a context current");
      if (!status.isOk()) break;
    }
    status = driverStatus(PHOS_DRIVER(driver_, MemcpyDtoHAsync_v2)(staging_ + e.offset, e.buffer.address, e.buffer.bytes,
                                                                   streams_.of(current)),
                          fmt::format("copying device memory at {:#x}", e.buffer.address));
    if (!status.isOk()) break;
    if (inFlight.size() >= kBatch) {
      status = drain();
      if (!status.isOk()) break;
    }
  }
  Status drained = drain();
  if (status.isOk()) status = drained;
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  std::lock_guard lock(mutex_);
  stats_.roundChunks.push_back(taken.size());
  stats_.yieldedSeconds += yielded;
  stats_.precopySeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return status;
}

std::optional<uint64_t> SoftRecopy::slot(CUdeviceptr address, uint64_t bytes) const {
  const Chunk* c = find(address, bytes);
  if (c == nullptr) return std::nullopt;
  return c->offset;
}

std::optional<uint64_t> SoftRecopy::cleanSlot(CUdeviceptr address, uint64_t bytes) const {
  const Chunk* c = find(address, bytes);
  if (c == nullptr) return std::nullopt;
  std::lock_guard lock(mutex_);
  if (c->dirty || c->gone) return std::nullopt;
  return c->offset;
}

}  // namespace phos::daemon
