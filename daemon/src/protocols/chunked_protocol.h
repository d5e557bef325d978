// SPDX-License-Identifier: Apache-2.0
// What the three concurrent protocols of docs/checkpoint.md (soft copy-on-write,
// soft recopy, concurrent restore) share: the session's buffers cut into
// chunks and found by address, one lock and condition between the session's
// gate and the copying loop, the gate itself, giving way to the application's
// own transfers, and the statistics of the calls the gate saw.
//
// A protocol derives from ChunkedProtocol<ItsChunkState, ItsStats>: every
// chunk carries the protocol's own state (ItsChunkState's fields), and
// ItsStats extends GateStats.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "protocols/device_buffer.h"
#include "session/driver_table.h"
#include "session/launch_validator.h"
#include "session/transfer_tracker.h"

namespace phos::daemon {

// What every concurrent protocol counts of the calls its gate saw.
struct GateStats {
  uint64_t waitedCalls = 0;    // calls the gate made wait
  double waitedSeconds = 0;    // how long those calls waited in total
  uint64_t anythingCalls = 0;  // calls that may touch anything (a launch without twin, an unload)
  double yieldedSeconds = 0;   // the copying loop gave way to the application's own transfers
};

template <typename ChunkState, typename Stats>
class ChunkedProtocol {
 public:
  // One chunk of a buffer: the unit a protocol saves, copies or loads, and
  // that a call waits for.
  struct Chunk : ChunkState {
    Chunk(DeviceBuffer part, uint64_t index) : buffer(part), index(index) {}
    DeviceBuffer buffer;  // address and bytes of this chunk (blob, context and device of its buffer)
    uint64_t index = 0;   // its index among its buffer's chunks (the image's chunks)
    bool overlaps(uint64_t begin, uint64_t end) const { return begin < buffer.address + buffer.bytes && buffer.address < end; }
  };

  ChunkedProtocol(const ChunkedProtocol&) = delete;
  ChunkedProtocol& operator=(const ChunkedProtocol&) = delete;
  virtual ~ChunkedProtocol() = default;

  // The session's access gate for the window (valid while this object lives).
  AccessGate gate() {
    return [this](const CallAccess& access) { before(access); };
  }
  // The copying loop waits while the application has transfers pending.
  void giveWayTo(TransferTracker* transfers) { transfers_ = transfers; }
  Stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 protected:
  // `chunks` of buffers that do not overlap, in any order.
  ChunkedProtocol(const DriverTable& driver, std::vector<Chunk> chunks) : driver_(driver), chunks_(std::move(chunks)) {
    std::sort(chunks_.begin(), chunks_.end(),
              [](const Chunk& a, const Chunk& b) { return a.buffer.address < b.buffer.address; });
  }

  // `buffers` cut into chunks of `chunkBytes` (the last of each shorter).
  static std::vector<Chunk> cut(const std::vector<DeviceBuffer>& buffers, uint64_t chunkBytes) {
    std::vector<Chunk> chunks;
    for (const DeviceBuffer& buffer : buffers) {
      for (uint64_t at = 0, index = 0; at < buffer.bytes; at += chunkBytes, ++index) {
        DeviceBuffer part = buffer;
        part.address = buffer.address + at;
        part.bytes = std::min<uint64_t>(chunkBytes, buffer.bytes - at);
        chunks.emplace_back(part, index);
      }
    }
    return chunks;
  }

  // On the serving thread, before a call that reads and writes `access`.
  virtual void before(const CallAccess& access) = 0;

  // Calls visit(Chunk&) for every chunk that overlaps [begin, end), in address order.
  template <typename Visit>
  void forEachOverlapping(uint64_t begin, uint64_t end, Visit&& visit) {
    if (begin >= end) return;
    auto it = std::upper_bound(chunks_.begin(), chunks_.end(), begin,
                               [](uint64_t at, const Chunk& c) { return at < c.buffer.address; });
    if (it != chunks_.begin()) --it;
    for (; it != chunks_.end() && it->buffer.address < end; ++it) {
      if (it->overlaps(begin, end)) visit(*it);
    }
  }

  // Calls write(begin, end) for each span `access` may write; a call whose
  // writes are not known may write anything: [0, UINT64_MAX), counted in
  // anythingCalls.
  template <typename Write>
  void forEachWrite(const CallAccess& access, Write&& write) {
    if (access.mayWriteAnything()) {
      {
        std::lock_guard lock(mutex_);
        ++stats_.anythingCalls;
      }
      write(0, UINT64_MAX);
      return;
    }
    for (const instrument::Buffer& w : access.writes) write(w.base, w.base + w.size);
  }

  // The chunk that is exactly [address, address + bytes), if any.
  const Chunk* find(CUdeviceptr address, uint64_t bytes) const {
    auto it = std::lower_bound(chunks_.begin(), chunks_.end(), address,
                               [](const Chunk& c, uint64_t at) { return c.buffer.address < at; });
    if (it == chunks_.end() || it->buffer.address != address || it->buffer.bytes != bytes) return nullptr;
    return &*it;
  }

  // The copying loop, holding `lock`: gives way to the application's own
  // transfers (the lock is released meanwhile).
  void giveWay(std::unique_lock<std::mutex>& lock) {
    if (transfers_ == nullptr) return;
    lock.unlock();
    const double yielded = transfers_->yield().count();
    lock.lock();
    stats_.yieldedSeconds += yielded;
  }

  // The wait of one call at the gate, under the lock: counted once however
  // often the call waits, its time added when it ends.
  class CallWait {
   public:
    explicit CallWait(GateStats& stats) : stats_(stats) {}
    CallWait(const CallWait&) = delete;
    CallWait& operator=(const CallWait&) = delete;
    ~CallWait() {
      if (start_ != Clock::time_point{}) {
        stats_.waitedSeconds += std::chrono::duration<double>(Clock::now() - start_).count();
      }
    }
    // The call is about to wait.
    void waiting() {
      if (start_ != Clock::time_point{}) return;
      start_ = Clock::now();
      ++stats_.waitedCalls;
    }

   private:
    using Clock = std::chrono::steady_clock;
    GateStats& stats_;
    Clock::time_point start_{};
  };

  const DriverTable& driver_;
  std::vector<Chunk> chunks_;  // by address; its shape never changes, so pointers to chunks stay valid
  mutable std::mutex mutex_;   // guards the chunks' states and stats_
  std::condition_variable changed_;  // a chunk's state changed
  TransferTracker* transfers_ = nullptr;
  Stats stats_;
};

}  // namespace phos::daemon
