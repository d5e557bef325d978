// SPDX-License-Identifier: Apache-2.0
// The transfer lanes' protocol (transfer_lane.h): the application's half and
// the waits both halves share.
#include "phos/common/ipc/transfer_lane.h"

#include <cstring>

#include "phos/common/ipc/shared_futex.h"

namespace phos::ipc {
namespace {

constexpr std::chrono::milliseconds kCheckPeriod{20};
// Both sides of a lane copy are busy while it lasts, each waiting for the
// other about once per chunk: a short spin saves the wake-up of a sleeping
// thread (tens of microseconds on a virtual machine) per chunk.
constexpr std::chrono::microseconds kSpin{100};

bool abandoned(const TransferLane& lane) { return lane.words->abandoned.load(std::memory_order_acquire) != 0; }

// The application's thread inside its half: not busy once it leaves,
// whichever way.
class BusyScope {
 public:
  explicit BusyScope(const TransferLane& lane) : lane_(lane) {}
  ~BusyScope() { done(); }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;
  void done() { lane_.words->busy.store(0, std::memory_order_release); }

 private:
  const TransferLane& lane_;
};

}  // namespace

void publish(std::atomic<uint32_t>& word, uint32_t value) {
  word.store(value, std::memory_order_release);
  futexWake(&word);
}

bool awaitAtLeast(std::atomic<uint32_t>& word, uint32_t value, std::chrono::milliseconds period,
                  const std::function<bool()>& stop) {
  const auto spinUntil = std::chrono::steady_clock::now() + kSpin;
  while (std::chrono::steady_clock::now() < spinUntil) {
    if (word.load(std::memory_order_acquire) >= value) return true;
    __builtin_ia32_pause();
  }
  for (;;) {
    const uint32_t now = word.load(std::memory_order_acquire);
    if (now >= value) return true;
    if (stop()) return false;
    futexWait(&word, now, period);
  }
}

void resetLane(const TransferLane& lane) {
  lane.words->produced.store(0, std::memory_order_relaxed);
  lane.words->consumed.store(0, std::memory_order_relaxed);
  lane.words->abandoned.store(0, std::memory_order_relaxed);
  lane.words->accepted.store(0, std::memory_order_relaxed);
  lane.words->busy.store(1, std::memory_order_release);
}

namespace {

void feed(const TransferLane& lane, const void* src, uint64_t bytes, BusyScope& busy,
          const std::function<bool()>& stop) {
  const auto* from = static_cast<const std::byte*>(src);
  const uint64_t chunks = lane.chunks(bytes);
  for (uint64_t i = 0; i < chunks; ++i) {
    // The buffer's previous chunk (i - 2) must have reached the device.
    if (i >= 2 && !awaitAtLeast(lane.words->consumed, static_cast<uint32_t>(i - 1), kCheckPeriod, stop)) return;
    if (abandoned(lane)) return;
    std::memcpy(lane.buffer(i), from + i * lane.bufferBytes, lane.chunkBytes(bytes, i));
    if (i + 1 == chunks) busy.done();  // before phosd can take the last chunk and answer
    publish(lane.words->produced, static_cast<uint32_t>(i + 1));
  }
}

void drain(const TransferLane& lane, void* dst, uint64_t bytes, BusyScope& busy, const std::function<bool()>& stop) {
  auto* to = static_cast<std::byte*>(dst);
  const uint64_t chunks = lane.chunks(bytes);
  for (uint64_t i = 0; i < chunks; ++i) {
    // Once abandoned, phosd writes what is left itself; chunks it had
    // produced are still whole in their buffers.
    if (!awaitAtLeast(lane.words->produced, static_cast<uint32_t>(i + 1), kCheckPeriod, stop)) return;
    std::memcpy(to + i * lane.bufferBytes, lane.buffer(i), lane.chunkBytes(bytes, i));
    if (i + 1 == chunks) busy.done();  // phosd answers once it sees the last chunk taken
    publish(lane.words->consumed, static_cast<uint32_t>(i + 1));
  }
}

}  // namespace

void serveLane(const TransferLane& lane, const void* src, void* dst, uint64_t bytes,
               const std::function<bool()>& daemonGone) {
  BusyScope busy(lane);
  auto stop = [&] { return abandoned(lane) || daemonGone(); };
  if (!awaitAtLeast(lane.words->accepted, kLaneToDevice, kCheckPeriod, stop)) return;
  const uint32_t direction = lane.words->accepted.load(std::memory_order_acquire);
  if (direction == kLaneToDevice && src != nullptr) feed(lane, src, bytes, busy, stop);
  if (direction == kLaneFromDevice && dst != nullptr) drain(lane, dst, bytes, busy, stop);
}

void accept(const TransferLane& lane, LaneDirection direction) { publish(lane.words->accepted, direction); }

bool leftBehind(const TransferLane& lane) {
  return lane.words->busy.load(std::memory_order_acquire) != 0 && abandoned(lane);
}

void abandon(const TransferLane& lane) {
  lane.words->abandoned.store(1, std::memory_order_release);
  futexWake(&lane.words->produced);
  futexWake(&lane.words->consumed);
  futexWake(&lane.words->accepted);
}

}  // namespace phos::ipc
