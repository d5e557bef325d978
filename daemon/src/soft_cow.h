// SPDX-License-Identifier: Apache-2.0
// Soft copy-on-write (DESIGN.md section 6): the GPU half of a checkpoint whose
// image is the state at the quiesce point t1, saved while the application runs.
//
// The engine quiesces the session, describes its GPU state, lets CRIU dump the
// process, then installs gate() as the session's access gate and resumes it.
// run() saves every buffer of t1 into the image, chunk by chunk (the image's
// chunks), while the application runs; before a call writes a chunk not saved
// yet, the gate copies that chunk on the device into a shadow (from a bounded
// reserve) and the chunk is saved from the shadow. A writer waits when its chunk
// is being saved at that moment, and when the reserve is exhausted (the chunk
// is then saved next).
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "context_streams.h"
#include "driver_table.h"
#include "launch_validator.h"
#include "transfer_tracker.h"
#include "phos/image/writer.h"
#include "phos/common/status.h"

namespace phos::daemon {

// One buffer of the state at t1 and where it goes in the image.
struct SavedBuffer {
  size_t blob = 0;
  CUdeviceptr address = 0;
  uint64_t bytes = 0;
  CUcontext context = nullptr;  // a context of its device
};

struct SoftCowStats {
  uint64_t shadowedChunks = 0;  // chunks copied into a shadow before a write
  uint64_t shadowedBytes = 0;
  uint64_t peakReserveBytes = 0;  // most shadow bytes held at once
  uint64_t waitedCalls = 0;       // calls the gate made wait (buffer being saved, reserve exhausted)
  double waitedSeconds = 0;       // how long those calls waited in total
  uint64_t anythingCalls = 0;     // calls that may write anything (a launch without twin, an unload)
  double copySeconds = 0;         // run(): the first chunk to the last
  double yieldedSeconds = 0;      // run() gave way to the application's own transfers
};

class SoftCopyOnWrite {
 public:
  // `reserveBytes`: device memory the shadows may hold at once (all devices).
  SoftCopyOnWrite(const DriverTable& driver, image::ImageWriter& writer, std::vector<SavedBuffer> buffers,
                  uint64_t reserveBytes, size_t chunkBytes);
  ~SoftCopyOnWrite();
  SoftCopyOnWrite(const SoftCopyOnWrite&) = delete;
  SoftCopyOnWrite& operator=(const SoftCopyOnWrite&) = delete;

  // Creates the private streams; before gate() is installed.
  Status prepare();
  // The saving loop waits while the application has transfers pending.
  void giveWayTo(TransferTracker* transfers) { transfers_ = transfers; }
  // The session's access gate for the window (valid while this object lives).
  AccessGate gate();
  // Saves every buffer, on the calling thread, and returns when all are in
  // the image (or the first error; writers are then let through, since the
  // image is discarded anyway). `advanced(n)` reports progress.
  Status run(const std::function<void(uint64_t)>& advanced);
  SoftCowStats stats() const;

 private:
  enum class State : uint8_t { kPending, kShadowing, kShadowed, kSaving, kSaved };
  // One chunk of a buffer: the unit that is saved, shadowed and waited for.
  struct Entry {
    SavedBuffer buffer;  // address and bytes of this chunk
    uint64_t chunk = 0;  // its index in the blob
    State state = State::kPending;
    CUdeviceptr shadow = 0;
  };

  void beforeWrite(uint64_t begin, uint64_t end);
  void protect(std::unique_lock<std::mutex>& lock, Entry& e);

  const DriverTable& driver_;
  image::ImageWriter& writer_;
  const uint64_t reserveBytes_;
  const size_t chunkBytes_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<CUdeviceptr, Entry> entries_;  // chunks by address; buffers do not overlap
  Entry* next_ = nullptr;                 // saved next: a writer waits for it
  uint64_t reserveUsed_ = 0;
  bool failed_ = false;
  ContextStreams gateStreams_, copyStreams_;
  TransferTracker* transfers_ = nullptr;
  SoftCowStats stats_;
};

}  // namespace phos::daemon
