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

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "protocols/chunked_protocol.h"
#include "session/context_pool.h"
#include "session/context_streams.h"
#include "session/staging_buffer.h"

namespace phos::daemon {

struct OnDemandStats : GateStats {
  uint64_t chunks = 0;          // chunks to load at the start
  uint64_t demandedChunks = 0;  // loaded out of order because a call needed them
  uint64_t skippedChunks = 0;   // overwritten whole (or freed) before they were loaded
  double loadSeconds = 0;       // run(): the first chunk to the last
};

// A chunk's state in a concurrent restore.
struct OnDemandChunk {
  enum class State : uint8_t { kPending, kLoading, kLoaded };
  State state = State::kPending;
  bool demanded = false;
};

class OnDemandRestore : public ChunkedProtocol<OnDemandChunk, OnDemandStats> {
 public:
  OnDemandRestore(const DriverTable& driver, std::shared_ptr<const image::ImageReader> reader,
                  std::vector<DeviceBuffer> buffers);
  ~OnDemandRestore() override;

  // Keeps the contexts the job destroys while its memory loads until this
  // object, and its streams in them, are gone (ContextPool::Hold).
  void keepContexts(ContextPool& pool) { contextsKept_ = std::make_unique<ContextPool::Hold>(pool); }

  // Creates the private streams and staging buffers; before gate() is installed.
  Status prepare();
  // (Chunks no call waits for are loaded only while the application has no
  // transfers pending: giveWayTo.)
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

 private:
  using State = OnDemandChunk::State;

  void before(const CallAccess& access) override;
  // Under the lock: a call's access is to overwrite whole chunks it does not
  // read, which need not be loaded at all.
  void skipOverwritten(const CallAccess& access);
  Chunk* pickLocked();

  std::unique_ptr<ContextPool::Hold> contextsKept_;  // first: released after the streams and staging
  std::shared_ptr<const image::ImageReader> reader_;
  size_t chunkBytes_ = 0;       // the largest chunk of the blobs
  std::deque<Chunk*> demanded_;  // loaded before the address order goes on
  size_t cursor_ = 0;           // the loading loop's place in address order
  uint64_t remaining_ = 0;      // chunks not loaded (nor skipped)
  bool released_ = false;       // failed or cancelled: the gate lets everything through
  ContextStreams streams_;
  std::unique_ptr<StagingBuffer> staging_[2];
};

}  // namespace phos::daemon
