// SPDX-License-Identifier: Apache-2.0
// Soft copy-on-write (docs/checkpoint.md): the GPU half of a checkpoint whose
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
//
// Each device has a reserve of its own. With several devices, a plan
// (peer_offload.h) may let a device whose reserve is full shadow a number of
// chunks on peers, over the peer link; they are saved from there.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "phos/common/status.h"
#include "phos/image/writer.h"
#include "protocols/chunked_protocol.h"
#include "protocols/peer_offload.h"
#include "session/context_streams.h"

namespace phos::daemon {

struct SoftCowStats : GateStats {
  uint64_t shadowedChunks = 0;  // chunks copied into a shadow before a write
  uint64_t shadowedBytes = 0;
  uint64_t peakReserveBytes = 0;  // most shadow bytes held at once (all devices)
  uint64_t peerShadowedChunks = 0;  // of shadowedChunks, those placed on a peer device
  uint64_t peerShadowedBytes = 0;
  uint64_t givenBack = 0;           // allocations of the application that needed the shadows' memory
  double copySeconds = 0;           // run(): the first chunk to the last
};

// A chunk's state in soft copy-on-write.
struct SoftCowChunk {
  enum class State : uint8_t { kPending, kShadowing, kShadowed, kSaving, kSaved };
  State state = State::kPending;
  CUdeviceptr shadow = 0;
  int shadowDevice = -1;              // where the shadow lives: the buffer's device or a peer
  CUcontext shadowContext = nullptr;  // the context it was allocated in
};

class SoftCopyOnWrite : public ChunkedProtocol<SoftCowChunk, SoftCowStats> {
 public:
  // `devices`: every device of the session, with a context and the device
  // memory shadows may hold there at once; `peerQuota`: bytes of device
  // `first`'s chunks that may be shadowed on device `second` at once, when
  // `first`'s own reserve is full (PeerShadowPlan::quota; empty: none).
  SoftCopyOnWrite(const DriverTable& driver, image::ImageWriter& writer, std::vector<DeviceBuffer> buffers,
                  const std::vector<DeviceSpace>& devices, std::map<std::pair<int, int>, uint64_t> peerQuota,
                  size_t chunkBytes);
  ~SoftCopyOnWrite() override;

  // Creates the private streams; before gate() is installed.
  Status prepare();
  // Saves every buffer, on the calling thread, and returns when all are in
  // the image (or the first error; writers are then let through, since the
  // image is discarded anyway). `advanced(n)` reports progress.
  Status run(const std::function<void(uint64_t)>& advanced);
  // The application needs the device memory the shadows hold on `device`:
  // no new shadows there for the rest of the window (writers wait for the
  // saving loop instead), and back once those it holds are saved and freed,
  // which the saving loop does first. On the serving thread, from the
  // session's MemoryRelief.
  void giveBack(int device);

 private:
  using State = SoftCowChunk::State;
  struct Space {
    CUcontext context = nullptr;
    uint64_t reserveBytes = 0;
    uint64_t usedBytes = 0;
  };

  void before(const CallAccess& access) override;
  void beforeWrite(uint64_t begin, uint64_t end);
  void protect(std::unique_lock<std::mutex>& lock, Chunk& e);
  // The device to shadow `e` on: its own if its reserve has room, else a peer
  // the plan allows with room (the one with most quota left); -1 if none.
  int shadowPlace(const Chunk& e);
  void releaseShadow(Chunk& e);
  // The chunk to save next (nullptr when all are saved), holding `lock`.
  Chunk* pick(std::unique_lock<std::mutex>& lock);

  image::ImageWriter& writer_;
  const size_t chunkBytes_;
  Chunk* next_ = nullptr;                 // saved next: a writer waits for it
  size_t cursor_ = 0;                     // the saving loop's place in address order
  std::map<int, Space> spaces_;                         // by device
  std::map<std::pair<int, int>, uint64_t> quotaLeft_;  // (from, to): bytes of peer shadows it may still place
  uint64_t reserveUsed_ = 0;                           // all devices
  bool failed_ = false;
  bool givingBack_ = false;  // some device's shadows are wanted back (giveBack)
  ContextStreams gateStreams_, copyStreams_;
};

}  // namespace phos::daemon
