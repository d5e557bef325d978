// SPDX-License-Identifier: Apache-2.0
// Concurrent restore (docs/checkpoint.md): the GPU half of a restore whose
// application runs before its device memory is back.
//
// The engine re-creates the session with every buffer mapped at its address
// but not loaded, installs gate() as the session's access gate, and the
// application runs as soon as CRIU has restored it. run() loads the buffers
// from the image chunk by chunk (the image's chunks) in address order; a call
// whose speculated reads or writes touch a chunk not loaded yet waits for it,
// and that chunk is loaded next. A chunk that a copy or set overwrites whole
// before it was loaded is not loaded at all (a free ends it the same way).
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "session/context_pool.h"
#include "session/context_streams.h"
#include "protocols/device_buffer.h"
#include "session/driver_table.h"
#include "session/launch_validator.h"
#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "session/staging_buffer.h"
#include "session/transfer_tracker.h"

namespace phos::daemon {

struct OnDemandStats {
  uint64_t chunks = 0;          // chunks to load at the start
  uint64_t demandedChunks = 0;  // loaded out of order because a call needed them
  uint64_t skippedChunks = 0;   // overwritten whole (or freed) before they were loaded
  uint64_t waitedCalls = 0;     // calls the gate made wait for a chunk
  double waitedSeconds = 0;     // how long those calls waited in total
  uint64_t anythingCalls = 0;   // calls that may touch anything (a launch without twin, an unload)
  double loadSeconds = 0;       // run(): the first chunk to the last
  double yieldedSeconds = 0;    // run() gave way to the application's own transfers
};

class OnDemandRestore {
 public:
  OnDemandRestore(const DriverTable& driver, std::shared_ptr<const image::ImageReader> reader,
                  std::vector<DeviceBuffer> buffers);
  ~OnDemandRestore();
  OnDemandRestore(const OnDemandRestore&) = delete;
  OnDemandRestore& operator=(const OnDemandRestore&) = delete;

  // Keeps the contexts the job destroys while its memory loads until this
  // object, and its streams in them, are gone (ContextPool::Hold).
  void keepContexts(ContextPool& pool) { contextsKept_ = std::make_unique<ContextPool::Hold>(pool); }

  // Creates the private streams and staging buffers; before gate() is installed.
  Status prepare();
  // The session's access gate for the window (valid while this object lives).
  AccessGate gate();
  // Chunks no call waits for are loaded only while the application has no
  // transfers pending.
  void giveWayTo(TransferTracker* transfers) { transfers_ = transfers; }
  // Loads every chunk on the calling thread and returns when all are on the
  // device, at the first error, or when `cancelled()` says the application is
  // gone (the gate then lets every call through). After an error (a damaged
  // chunk, a failed copy) the gate stays shut for every call that waits for a
  // chunk not loaded, so the application can never observe that memory: the
  // caller ends the application, and only then calls release() so that the
  // session's threads can stop. `advanced(n)` reports progress.
  Status run(const std::function<void(uint64_t)>& advanced, const std::function<bool()>& cancelled);
  // Lets every waiting call through (after a failed run, once the
  // application is gone).
  void release();
  OnDemandStats stats() const;

 private:
  enum class State : uint8_t { kPending, kLoading, kLoaded };
  struct Entry {
    DeviceBuffer buffer;  // address and bytes of this chunk
    uint64_t chunk = 0;    // its index in the blob (the image's chunks)
    State state = State::kPending;
    bool demanded = false;
  };

  void before(const CallAccess& access);
  Entry* pickLocked();

  std::unique_ptr<ContextPool::Hold> contextsKept_;  // first: released after the streams and staging
  const DriverTable& driver_;
  std::shared_ptr<const image::ImageReader> reader_;
  size_t chunkBytes_ = 0;  // the largest chunk of the blobs
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<CUdeviceptr, Entry> entries_;  // chunks by address; buffers do not overlap
  std::deque<Entry*> demanded_;           // loaded before the address order goes on
  std::map<CUdeviceptr, Entry>::iterator cursor_;
  uint64_t remaining_ = 0;                // chunks not loaded (nor skipped)
  bool released_ = false;                 // failed or cancelled: the gate lets everything through
  ContextStreams streams_;
  TransferTracker* transfers_ = nullptr;
  std::unique_ptr<StagingBuffer> staging_[2];
  OnDemandStats stats_;
};

}  // namespace phos::daemon
