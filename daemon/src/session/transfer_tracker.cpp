// SPDX-License-Identifier: Apache-2.0
// TransferTracker (transfer_tracker.h).
#include "session/transfer_tracker.h"

#include <thread>

namespace phos::daemon {

void TransferTracker::track(bool on) {
  tracking_.store(on);
  if (on) return;
  std::lock_guard lock(mutex_);
  for (CUevent e : events_) PHOS_DRIVER(driver_, EventDestroy_v2)(e);
  events_.clear();
}

void TransferTracker::end(bool async, CUstream stream) {
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  // A captured transfer runs only when its graph is launched (and an event
  // recorded in a capture may not be queried).
  if (async && tracking_.load() &&
      PHOS_DRIVER(driver_, StreamIsCapturing)(stream, &capture) == CUDA_SUCCESS &&
      capture == CU_STREAM_CAPTURE_STATUS_NONE) {
    CUevent event = nullptr;
    if (PHOS_DRIVER(driver_, EventCreate)(&event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
      if (PHOS_DRIVER(driver_, EventRecord)(event, stream) == CUDA_SUCCESS) {
        std::lock_guard lock(mutex_);
        events_.push_back(event);
      } else {
        PHOS_DRIVER(driver_, EventDestroy_v2)(event);
      }
    }
  }
  serving_.fetch_sub(1);
}

bool TransferTracker::pending() {
  if (serving_.load() > 0) return true;
  std::lock_guard lock(mutex_);
  // Streams run their work in order, but the events are on several streams:
  // finished ones are dropped from the front only.
  while (!events_.empty() && PHOS_DRIVER(driver_, EventQuery)(events_.front()) != CUDA_ERROR_NOT_READY) {
    PHOS_DRIVER(driver_, EventDestroy_v2)(events_.front());
    events_.pop_front();
  }
  return !events_.empty();
}

std::chrono::duration<double> TransferTracker::yield(std::chrono::milliseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  while (pending() && std::chrono::steady_clock::now() - start < limit) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return std::chrono::steady_clock::now() - start;
}

}  // namespace phos::daemon
