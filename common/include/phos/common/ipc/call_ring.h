// SPDX-License-Identifier: Apache-2.0
// CallRing: the shared-memory channel between an application (libphos.so) and
// its phosd session: a ring of call records with futex doorbells.
//
// The ring lives in a file (/dev/shm/phos-<session>) mapped by both processes.
// Many application threads post calls (multi-producer); one daemon thread
// consumes them in the order their slots were claimed, which is the order the
// application issued them. A call that expects a reply keeps its slot until the
// caller has read the reply; a call that does not (kernel launches, async
// copies) frees its slot as soon as the daemon has taken it.
//
// CRIU dumps a shared file mapping by path, not by content: after a checkpoint
// the daemon saves the file's bytes (snapshot()) and, before CRIU restores the
// application, re-creates the file and writes them back (restoreSnapshot()).
// A client blocked in a futex wait on the old mapping then wakes on the new one.
//
// After the slots, the file holds the ring's transfer lanes (transfer_lane.h):
// double-buffered areas through which the application and the daemon pass the
// bytes of a large copy between the application's pageable memory and the
// device. They carry nothing between calls, so snapshots leave them out.
//
// Trust: the daemon never trusts a field the client can write. It keeps its own
// copies of the geometry and of its read position, and checks every length.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "phos/common/status.h"
#include "phos/common/unique_fd.h"

namespace phos::ipc {

struct RingGeometry {
  uint32_t slotCount = 256;  // power of two
  uint32_t slotBytes = 4096; // bytes per slot, header included; multiple of 64
  uint32_t laneCount = 2;    // transfer lanes, at most kMaxLanes
  uint32_t laneSlotBytes = 4u << 20;  // bytes of each of a lane's two buffers; multiple of 4096
  static constexpr uint32_t kMaxLanes = 16;
};

struct TransferLane;

namespace detail {
struct RingHeader;
struct SlotHeader;
}  // namespace detail

// A mapping of the ring file. Movable, not copyable; unmaps on destruction.
class CallRing {
 public:
  // Largest request or reply a slot of `g` carries.
  static size_t payloadCapacity(const RingGeometry& g);

  // Daemon side: creates the file at `path` with an empty ring whose owner is
  // the calling process; kFailedPrecondition if a file is there (someone's
  // ring: it is never replaced). The file appears at `path` whole and, with
  // `sharedLock`, already holding a shared flock on the descriptor stored
  // there (the session's liveness lock, which the caller keeps and closes).
  static Result<CallRing> create(const std::string& path, RingGeometry geometry, UniqueFd* sharedLock = nullptr);
  // Application side: maps an existing ring, checking its magic and version.
  static Result<CallRing> open(const std::string& path);

  CallRing(CallRing&&) noexcept;
  CallRing& operator=(CallRing&&) noexcept;
  CallRing(const CallRing&) = delete;
  CallRing& operator=(const CallRing&) = delete;
  ~CallRing();

  size_t payloadCapacity() const { return payloadCapacity(geometry_); }
  const RingGeometry& geometry() const { return geometry_; }

  // ---- application side -------------------------------------------------
  // Posts a call and waits for its reply, copied into `reply`; returns the
  // reply's length. Fails with kUnavailable if the daemon dies (checked at
  // least every `livenessPeriod`), kInvalidArgument if the request does not
  // fit a slot, kOutOfRange if the reply does not fit `reply`.
  Result<size_t> call(std::span<const std::byte> request, std::span<std::byte> reply);
  // The same, running `meanwhile` once the call is in the ring, before waiting
  // for its reply (the application's half of a copy through a lane);
  // `replied()` tells it whether the reply came already.
  using Meanwhile = std::function<void(const std::function<bool()>& replied)>;
  Result<size_t> call(std::span<const std::byte> request, std::span<std::byte> reply, const Meanwhile& meanwhile);
  // OK while the daemon that owns the ring runs; kUnavailable once it is gone.
  // Its pid says so, or, where that pid is out of this process's sight (a
  // job in a container's PID namespace), the shared lock the daemon holds on
  // the ring file for its life.
  Status ownerAlive() const;
  // Posts a call that has no reply and returns as soon as it is in the ring.
  Status post(std::span<const std::byte> request);

  // ---- daemon side --------------------------------------------------------
  // A request being served; its bytes stay valid until reply()/finish().
  struct Request {
    uint64_t position = 0;
    std::span<const std::byte> bytes;
    bool expectsReply = false;
  };
  // Waits up to `timeout` for the next request in order. Returns kNotFound on
  // timeout (nothing arrived), kDataLoss if the client wrote a malformed slot.
  Result<Request> next(std::chrono::milliseconds timeout);
  // Answers a request that expects a reply (and wakes its caller).
  Status reply(const Request& request, std::span<const std::byte> bytes);
  // Releases a request that expects no reply.
  void finish(const Request& request);

  // Transfer lane `index` (< geometry().laneCount), in this process's mapping.
  TransferLane lane(uint32_t index) const;

  // Number of requests claimed by the application and not yet taken by next().
  uint64_t pending() const;

  // ---- checkpoint support (daemon side) -----------------------------------
  // The ring's bytes (not its lanes) and the daemon's read position (which is
  // kept outside the shared file, where the client cannot change it), to be
  // stored in an image while the session is quiesced.
  struct Snapshot {
    std::vector<std::byte> bytes;
    uint64_t readPosition = 0;
  };
  Snapshot snapshot() const;
  // Replaces the ring's contents with a snapshot of a ring of the same
  // geometry, and makes the calling process its owner.
  Status restoreSnapshot(const Snapshot& snapshot);

  // How often a waiting client checks that the daemon is still alive.
  void setLivenessPeriod(std::chrono::milliseconds period) { livenessPeriod_ = period; }

 private:
  CallRing(void* base, size_t size, RingGeometry geometry, bool owner);
  detail::RingHeader& header() const;
  detail::SlotHeader& slot(uint64_t position) const;
  std::byte* payload(uint64_t position) const;
  // Claims the next slot (waiting while the ring is full).
  Result<uint64_t> claim();
  // Claims a slot, fills it and publishes it to the daemon.
  Result<uint64_t> enqueue(std::span<const std::byte> request, bool expectsReply);
  Result<size_t> awaitReply(uint64_t position, std::span<std::byte> reply);

  void* base_ = nullptr;
  size_t size_ = 0;
  RingGeometry geometry_;
  bool owner_ = false;
  uint64_t readPosition_ = 0;  // daemon's own copy; the shared one is advisory
  std::chrono::milliseconds livenessPeriod_{100};
  std::string path_;  // application side: the file, whose lock says the daemon lives
};

}  // namespace phos::ipc
