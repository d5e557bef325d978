// SPDX-License-Identifier: Apache-2.0
#include "session/stream_captures.h"

#include "phos/cuda_api/api_table.h"

namespace phos::daemon {

using cuda_api::EntryPointId;

CUstreamCaptureMode StreamCaptures::exchangeMode(uint64_t thread, CUstreamCaptureMode mode) {
  const CUstreamCaptureMode old = this->mode(thread);
  if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
    threadModes_.erase(thread);
  } else {
    threadModes_[thread] = mode;
  }
  return old;
}

CUstreamCaptureMode StreamCaptures::mode(uint64_t thread) const {
  auto it = threadModes_.find(thread);
  return it == threadModes_.end() ? CU_STREAM_CAPTURE_MODE_GLOBAL : it->second;
}

// CUDA's rule (cuThreadExchangeStreamCaptureMode): a thread in global mode is
// prohibited while it has a capture of its own not begun in relaxed mode, or
// while any other thread has a global capture; in thread-local mode only its
// own captures count; in relaxed mode nothing does.
bool StreamCaptures::prohibited(uint64_t thread) const {
  const CUstreamCaptureMode mine = mode(thread);
  if (mine == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  for (const auto& [stream, c] : captures_) {
    if (c.mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
    if (c.thread == thread) return true;
    if (mine == CU_STREAM_CAPTURE_MODE_GLOBAL && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
      return true;
    }
  }
  return false;
}

std::vector<CUstream> StreamCaptures::ownStrictCaptures(uint64_t thread) const {
  std::vector<CUstream> out;
  for (const auto& [stream, c] : captures_) {
    if (c.thread == thread && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED) out.push_back(stream);
  }
  return out;
}

void StreamCaptures::applyServingMode(const DriverTable& driver, uint64_t thread) {
  if (captures_.empty() || !driver.has(EntryPointId::kCuThreadExchangeStreamCaptureMode)) return;
  const CUstreamCaptureMode target =
      prohibited(thread) ? CU_STREAM_CAPTURE_MODE_GLOBAL : CU_STREAM_CAPTURE_MODE_RELAXED;
  if (target == serving_) return;
  CUstreamCaptureMode exchanged = target;
  if (PHOS_DRIVER(driver, ThreadExchangeStreamCaptureMode)(&exchanged) == CUDA_SUCCESS) {
    serving_ = target;
  }
}

void relaxStreamCapture(const DriverTable& driver) {
  if (!driver.has(EntryPointId::kCuThreadExchangeStreamCaptureMode)) return;
  CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
  (void)PHOS_DRIVER(driver, ThreadExchangeStreamCaptureMode)(&relaxed);
}

}  // namespace phos::daemon
