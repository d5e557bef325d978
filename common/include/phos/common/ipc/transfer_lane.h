// SPDX-License-Identifier: Apache-2.0
// TransferLane: one of a call ring's transfer lanes, two buffers and a page
// of futex words through which the application (libphos.so) and its phosd
// session pass the bytes of one large copy between the application's pageable
// memory and the device, while the call itself travels through the ring.
//
// Without lanes phosd reads and writes the application's memory itself
// (process_vm_readv/writev), which copies at about half of memcpy's rate. With
// a lane the application copies its bytes into (or out of) shared memory and
// phosd moves them between that memory and the device, chunk by chunk: the
// two copies overlap, one in each process.
//
// Chunk i of a copy uses buffer i % 2. One side produces chunks, the other
// consumes them:
//   to the device:   the application copies chunk i in (produced = i + 1);
//                    phosd copies it to the device (consumed = i + 1);
//   from the device: phosd copies chunk i out of the device (produced = i + 1);
//                    the application copies it out (consumed = i + 1).
// A producer writes chunk i once consumed >= i - 1 (the buffer's last chunk,
// i - 2, is done with). phosd sets `abandoned` when it stops using the lane
// before the copy is complete (it failed, or the application stopped keeping
// up and phosd finished the copy with process_vm_readv/writev): the
// application then stops and waits for the call's reply.
//
// The application's thread starts on its half once phosd has taken the call
// (`accepted`): a call still queued in the ring when a checkpoint pauses the
// session has not touched its lane, and after a restore (which re-creates the
// lanes empty) it starts afresh. `busy` is 1 while the thread is inside its
// half. phosd answers a lane call only once the thread has left it, unless
// phosd abandoned the lane and the thread has not left yet (stopped by a
// signal): `busy` and `abandoned` both set. A checkpoint then fails rather
// than save a thread that would read a lane the restore cannot give back (CRIU
// saves the ring's file by path).
//
// Trust: phosd never trusts the words. They only tell it when to look; the
// copy's range comes from the call, and a lane that stalls is abandoned,
// never waited on without bound. A wrong word can only spoil the
// application's own copy.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace phos::ipc {

// A lane's words take the first page of the lane; its buffers follow.
inline constexpr size_t kLaneWordsBytes = 4096;

struct LaneWords {
  alignas(64) std::atomic<uint32_t> produced;   // futex: chunks ready for the consumer
  alignas(64) std::atomic<uint32_t> consumed;   // futex: chunks the consumer is done with
  alignas(64) std::atomic<uint32_t> abandoned;  // 1: phosd no longer uses the lane
  alignas(64) std::atomic<uint32_t> busy;       // 1: the application's thread is inside its half
  alignas(64) std::atomic<uint32_t> accepted;   // LaneDirection: phosd has taken the call, this way
};
static_assert(sizeof(LaneWords) <= kLaneWordsBytes);

// Which way phosd moves a lane's chunks (the value of `accepted`). A copy
// between unified addresses lets phosd say, since only phosd knows which
// side is the device.
enum LaneDirection : uint32_t { kLaneNotAccepted = 0, kLaneToDevice = 1, kLaneFromDevice = 2 };

struct TransferLane {
  LaneWords* words = nullptr;
  std::byte* buffers[2] = {};
  size_t bufferBytes = 0;

  // The chunks of a copy of `bytes`, and chunk i's size and buffer.
  uint64_t chunks(uint64_t bytes) const { return (bytes + bufferBytes - 1) / bufferBytes; }
  size_t chunkBytes(uint64_t bytes, uint64_t chunk) const {
    const uint64_t left = bytes - chunk * bufferBytes;
    return static_cast<size_t>(left < bufferBytes ? left : bufferBytes);
  }
  std::byte* buffer(uint64_t chunk) const { return buffers[chunk % 2]; }

  // Whether a copy of `bytes` fits the words' chunk counts.
  bool carries(uint64_t bytes) const { return bufferBytes != 0 && chunks(bytes) < (uint64_t{1} << 31); }
};

// Sets `word` to `value` and wakes whoever waits on it.
void publish(std::atomic<uint32_t>& word, uint32_t value);

// Waits until `word` >= `value` and returns true, or returns false as soon as
// `stop()` says so (asked before each sleep, and at least every `period`).
bool awaitAtLeast(std::atomic<uint32_t>& word, uint32_t value, std::chrono::milliseconds period,
                  const std::function<bool()>& stop);

// ---- the application's half (libphos.so) ------------------------------------
// A lane is the application's to claim (among its own threads): it resets
// the words before the call that uses it (and marks the lane busy).
void resetLane(const TransferLane& lane);
// Run while the call is served: once phosd accepts the call, streams `bytes`
// from `src` into the lane (to the device) or from the lane into `dst` (from
// the device), whichever way phosd says; a way whose pointer is null is not
// taken. Returns when the copy's last chunk is done, when phosd abandons the
// lane, or when `daemonGone()` says phosd is gone.
void serveLane(const TransferLane& lane, const void* src, void* dst, uint64_t bytes,
               const std::function<bool()>& daemonGone);

// ---- phosd's half -----------------------------------------------------------
// Lets the application's half start, moving chunks `direction`.
void accept(const TransferLane& lane, LaneDirection direction);
// Stops the application's half (it then waits for the reply).
void abandon(const TransferLane& lane);
// The application's thread is still inside a lane phosd is done with.
bool leftBehind(const TransferLane& lane);

}  // namespace phos::ipc
