// SPDX-License-Identifier: Apache-2.0
// Soft recopy: the dirty-tracking gate and the copy rounds (soft_recopy.h).
#include "protocols/soft_recopy.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace phos::daemon {

SoftRecopy::SoftRecopy(const DriverTable& driver, const std::vector<DeviceBuffer>& buffers, std::byte* staging,
                       uint64_t capacity, size_t chunkBytes)
    : driver_(driver), staging_(staging), capacity_(capacity), streams_(driver) {
  std::vector<DeviceBuffer> sorted = buffers;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  for (const DeviceBuffer& b : sorted) {
    for (uint64_t at = 0; at < b.bytes; at += chunkBytes) {
      DeviceBuffer part{0, b.address + at, std::min<uint64_t>(chunkBytes, b.bytes - at), b.context};
      byAddress_[part.address] = entries_.size();
      entries_.push_back({part, slotBytes_, true});
      slotBytes_ += part.bytes;
    }
  }
  dirty_ = entries_.size();
}

SoftRecopy::~SoftRecopy() = default;

Status SoftRecopy::prepare() {
  if (slotBytes_ > capacity_) {
    return makeError(Code::kResourceExhausted, "soft recopy needs {} bytes of host memory, {} were reserved",
                     slotBytes_, capacity_);
  }
  for (const Entry& e : entries_) RETURN_IF_ERROR(streams_.add(e.chunk.context, "a copy stream"));
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  return Status::ok();
}

SoftRecopy::Chunk SoftRecopy::chunk(uint64_t index) const {
  std::lock_guard lock(mutex_);
  const Entry& e = entries_.at(index);
  return {e.chunk.address, e.chunk.bytes, e.offset, e.gone};
}

AccessGate SoftRecopy::gate() {
  return [this](const CallAccess& access) {
    if (access.everything) {
      beforeEnd(0, UINT64_MAX);  // a context or module goes, with its memory
      return;
    }
    if (access.ends) {
      for (const instrument::Buffer& w : access.writes) beforeEnd(w.base, w.base + w.size);
      return;
    }
    if (access.mayWriteAnything()) {
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

void SoftRecopy::beforeWrite(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  std::lock_guard lock(mutex_);
  auto it = byAddress_.upper_bound(begin);
  if (it != byAddress_.begin()) --it;
  for (; it != byAddress_.end() && it->first < end; ++it) {
    Entry& e = entries_[it->second];
    if (e.chunk.address + e.chunk.bytes <= begin || e.dirty || e.gone) continue;
    e.dirty = true;
    ++dirty_;
  }
}

void SoftRecopy::beforeEnd(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  std::unique_lock lock(mutex_);
  std::vector<Entry*> ended;
  auto it = byAddress_.upper_bound(begin);
  if (it != byAddress_.begin()) --it;
  for (; it != byAddress_.end() && it->first < end; ++it) {
    Entry& e = entries_[it->second];
    if (e.chunk.address + e.chunk.bytes > begin) ended.push_back(&e);
  }
  for (Entry* e : ended) {
    if (e->gone) continue;
    e->gone = true;
    if (e->dirty) --dirty_;
    e->dirty = false;
  }
  copied_.wait(lock, [&] { return std::none_of(ended.begin(), ended.end(), [](const Entry* e) { return e->copying; }); });
}

uint64_t SoftRecopy::dirtyChunks() const {
  std::lock_guard lock(mutex_);
  return dirty_;
}

std::vector<uint64_t> SoftRecopy::takeDirty() {
  std::lock_guard lock(mutex_);
  std::vector<uint64_t> taken;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].dirty || entries_[i].gone) continue;
    entries_[i].dirty = false;
    taken.push_back(i);
  }
  dirty_ = 0;
  return taken;
}

void SoftRecopy::markAllDirty() {
  std::lock_guard lock(mutex_);
  dirty_ = 0;
  for (Entry& e : entries_) {
    e.dirty = !e.gone;
    dirty_ += e.dirty ? 1 : 0;
  }
}

Status SoftRecopy::copy(const std::vector<uint64_t>& taken, const std::function<void(uint64_t)>& advanced) {
  const auto start = std::chrono::steady_clock::now();
  CUcontext current = nullptr;
  // Up to this many chunks in flight before the copies are waited for.
  constexpr size_t kBatch = 8;
  std::vector<Entry*> inFlight;
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
      for (Entry* e : inFlight) {
        bytes += e->chunk.bytes;
        e->copying = false;
      }
    }
    copied_.notify_all();
    inFlight.clear();
    if (bytes != 0) advanced(bytes);
    return synced;
  };
  Status status = Status::ok();
  double yielded = 0;
  for (uint64_t index : taken) {
    if (transfers_ != nullptr) yielded += transfers_->yield().count();  // the application's transfers first
    Entry& e = entries_[index];  // entries_ never changes shape; its flags are shared
    {
      // A chunk freed since it was taken is not copied; one being freed
      // waits in beforeEnd() until its copy is done.
      std::lock_guard lock(mutex_);
      if (e.gone) continue;
      e.copying = true;
    }
    inFlight.push_back(&e);
    if (e.chunk.context != current) {
      current = e.chunk.context;
      status = driverStatus(PHOS_DRIVER(driver_, CtxSetCurrent)(current), "making a context current");
      if (!status.isOk()) break;
    }
    status = driverStatus(PHOS_DRIVER(driver_, MemcpyDtoHAsync_v2)(staging_ + e.offset, e.chunk.address, e.chunk.bytes,
                                                                   streams_.of(current)),
                          fmt::format("copying device memory at {:#x}", e.chunk.address));
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
  auto it = byAddress_.find(address);
  if (it == byAddress_.end() || entries_[it->second].chunk.bytes != bytes) return std::nullopt;
  return entries_[it->second].offset;
}

std::optional<uint64_t> SoftRecopy::cleanSlot(CUdeviceptr address, uint64_t bytes) const {
  auto it = byAddress_.find(address);
  if (it == byAddress_.end() || entries_[it->second].chunk.bytes != bytes) return std::nullopt;
  std::lock_guard lock(mutex_);
  if (entries_[it->second].dirty || entries_[it->second].gone) return std::nullopt;
  return entries_[it->second].offset;
}

SoftRecopyStats SoftRecopy::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace phos::daemon
