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

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "phos/common/status.h"
#include "protocols/chunked_protocol.h"
#include "session/context_streams.h"

namespace phos::daemon {

// A call waits at the gate only when it frees a chunk being copied.
struct SoftRecopyStats : GateStats {
  std::vector<uint64_t> roundChunks;  // chunks copied in each round while the application ran
  double precopySeconds = 0;          // the rounds, first to last
};

// A chunk's state in soft recopy.
struct SoftRecopyChunk {
  uint64_t offset = 0;   // its slot in the staging memory
  bool dirty = true;
  bool gone = false;     // freed: never copied again
  bool copying = false;  // a copy of it is in flight
};

class SoftRecopy : public ChunkedProtocol<SoftRecopyChunk, SoftRecopyStats> {
 public:
  // `staging`: host memory of `capacity` bytes the chunks are copied into, in
  // address order (DeviceBuffer::blob is not used).
  SoftRecopy(const DriverTable& driver, const std::vector<DeviceBuffer>& buffers, std::byte* staging,
             uint64_t capacity, size_t chunkBytes);
  ~SoftRecopy() override;

  // Creates the private copy streams; before gate() is installed. Fails when
  // `capacity` is below the buffers' bytes.
  Status prepare();
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
  struct ChunkSlot {
    CUdeviceptr address = 0;
    uint64_t bytes = 0;
    uint64_t offset = 0;
    bool gone = false;
  };
  ChunkSlot slotOf(uint64_t index) const;
  // Every chunk dirty again (a launch wrote outside what its twin was told).
  void markAllDirty();

  // Where the chunk [address, address + bytes) is in host memory, if it is a
  // chunk of this protocol and clean (copied after its last write).
  std::optional<uint64_t> cleanSlot(CUdeviceptr address, uint64_t bytes) const;
  // Its slot, clean or not (a dirty chunk is copied there at t2).
  std::optional<uint64_t> slot(CUdeviceptr address, uint64_t bytes) const;
  // The host bytes the slots take; further copies go after them.
  uint64_t slotBytes() const { return slotBytes_; }

 private:
  void before(const CallAccess& access) override;
  void beforeWrite(uint64_t begin, uint64_t end);
  // Before a call that frees [begin, end): its chunks are dropped, once no
  // copy of them is in flight.
  void beforeEnd(uint64_t begin, uint64_t end);

  std::byte* const staging_;
  const uint64_t capacity_;
  uint64_t slotBytes_ = 0;
  uint64_t dirty_ = 0;
  ContextStreams streams_;
};

}  // namespace phos::daemon
