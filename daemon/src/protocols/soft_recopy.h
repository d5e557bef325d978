// SPDX-License-Identifier: Apache-2.0
// Soft recopy (docs/checkpoint.md): the GPU half of a checkpoint whose image is
// the state at the end t2, copied mostly while the application runs (the
// protocol migration uses).
//
// The engine installs gate() as the session's access gate and calls
// copyDirty() in rounds: the first copies every chunk (the image's 4 MiB
// chunks) of the session's buffers into host memory while the application
// runs; the gate marks each chunk a call writes as dirty, and each further round
// copies the chunks dirtied since. Before a round takes the dirty set, the
// engine drains the session's GPU work (a write that passed the gate has then
// run), so that a chunk copied clean holds every write marked before. At the
// quiesce point t2 only the chunks still dirty (and buffers allocated since)
// are copied; the clean ones go into the image from host memory.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "session/context_streams.h"
#include "session/driver_table.h"
#include "session/launch_validator.h"
#include "phos/common/status.h"
#include "protocols/soft_cow.h"
#include "session/transfer_tracker.h"

namespace phos::daemon {

struct SoftRecopyStats {
  std::vector<uint64_t> roundChunks;  // chunks copied in each round while the application ran
  uint64_t anythingCalls = 0;         // calls that may write anything (all chunks dirty again)
  double precopySeconds = 0;          // the rounds, first to last
  double yieldedSeconds = 0;          // the rounds gave way to the application's own transfers
};

class SoftRecopy {
 public:
  // `staging`: host memory of `capacity` bytes the chunks are copied into, in
  // the order of `buffers` (DeviceBuffer::blob is not used).
  SoftRecopy(const DriverTable& driver, const std::vector<DeviceBuffer>& buffers, std::byte* staging,
             uint64_t capacity, size_t chunkBytes);
  ~SoftRecopy();
  SoftRecopy(const SoftRecopy&) = delete;
  SoftRecopy& operator=(const SoftRecopy&) = delete;

  // Creates the private copy streams; before gate() is installed. Fails when
  // `capacity` is below the buffers' bytes.
  Status prepare();
  // The session's access gate for the window (valid while this object lives).
  AccessGate gate();
  // The rounds wait while the application has transfers pending.
  void giveWayTo(TransferTracker* transfers) { transfers_ = transfers; }

  // Chunks dirty now (all of them before the first round).
  uint64_t dirtyChunks() const;
  // Takes the dirty set (they are clean from here on, unless written again).
  // The session's GPU work must be drained, and the session paused.
  std::vector<uint64_t> takeDirty();
  // Copies the chunks `taken` named into their host slots, while the application
  // runs. `advanced(n)` reports progress.
  Status copy(const std::vector<uint64_t>& taken, const std::function<void(uint64_t)>& advanced);
  // A chunk takeDirty() named: its device address, size and slot; `gone`
  // once it was freed.
  struct Chunk {
    CUdeviceptr address = 0;
    uint64_t bytes = 0;
    uint64_t offset = 0;
    bool gone = false;
  };
  Chunk chunk(uint64_t index) const;
  // Every chunk dirty again (a launch wrote outside what its twin was told).
  void markAllDirty();

  // Where the chunk [address, address + bytes) is in host memory, if it is a
  // chunk of this protocol and clean (copied after its last write).
  std::optional<uint64_t> cleanSlot(CUdeviceptr address, uint64_t bytes) const;
  // Its slot, clean or not (a dirty chunk is copied there at t2).
  std::optional<uint64_t> slot(CUdeviceptr address, uint64_t bytes) const;
  // The host bytes the slots take; further copies go after them.
  uint64_t slotBytes() const { return slotBytes_; }
  SoftRecopyStats stats() const;

 private:
  struct Entry {
    DeviceBuffer chunk;  // address and bytes of this chunk
    uint64_t offset = 0;  // its slot in the staging memory
    bool dirty = true;
    bool gone = false;     // freed: never copied again
    bool copying = false;  // a copy of it is in flight
  };

  void beforeWrite(uint64_t begin, uint64_t end);
  // Before a call that frees [begin, end): its chunks are dropped, once no
  // copy of them is in flight.
  void beforeEnd(uint64_t begin, uint64_t end);

  const DriverTable& driver_;
  std::byte* const staging_;
  const uint64_t capacity_;
  uint64_t slotBytes_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable copied_;          // a batch of copies finished
  std::vector<Entry> entries_;              // by address
  std::map<CUdeviceptr, size_t> byAddress_;  // chunk address -> index in entries_
  uint64_t dirty_ = 0;
  ContextStreams streams_;
  TransferTracker* transfers_ = nullptr;
  SoftRecopyStats stats_;
};

}  // namespace phos::daemon
