// SPDX-License-Identifier: Apache-2.0
#include "session/stream_waits.h"

#include <fmt/format.h>

#include <algorithm>

namespace phos::daemon {

CUresult StreamWaits::add(const DriverTable& d, CUstream real, StreamWait wait) {
  wait.real = real;
  const bool legacy = real == nullptr || real == CU_STREAM_LEGACY;
  unsigned flags = 0;
  if (!legacy && PHOS_DRIVER(d, StreamGetFlags)(real, &flags) == CUDA_SUCCESS) {
    wait.blocking = (flags & CU_STREAM_NON_BLOCKING) == 0;
  }
  CUresult r = PHOS_DRIVER(d, EventCreate)(&wait.mark, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) return r;
  r = PHOS_DRIVER(d, EventRecord)(wait.mark, real);
  if (r != CUDA_SUCCESS) {
    PHOS_DRIVER(d, EventDestroy)(wait.mark);
    return r;
  }
  waits_.push_back(wait);
  return CUDA_SUCCESS;
}

bool StreamWaits::pending(const DriverTable& d) {
  // A mark that answers anything but NOT_READY is over (or broken with its
  // context's sticky error, which then reaches the application elsewhere).
  std::erase_if(waits_, [&](const StreamWait& w) {
    if (PHOS_DRIVER(d, EventQuery)(w.mark) == CUDA_ERROR_NOT_READY) return false;
    PHOS_DRIVER(d, EventDestroy)(w.mark);
    return true;
  });
  return !waits_.empty();
}

bool StreamWaits::pendingIn(const DriverTable& d, uint64_t context) {
  if (!pending(d)) return false;
  return std::any_of(waits_.begin(), waits_.end(),
                     [&](const StreamWait& w) { return w.context == context; });
}

bool StreamWaits::holdDefaultStream(const DriverTable& d, CUstream perThread) {
  if (!pending(d)) return false;
  return std::any_of(waits_.begin(), waits_.end(), [&](const StreamWait& w) {
    const bool legacy = w.real == nullptr || w.real == CU_STREAM_LEGACY;
    return legacy || (perThread != nullptr ? w.real == perThread : w.blocking);
  });
}

std::optional<std::string> StreamWaits::describePending(const DriverTable& d) {
  if (!pending(d)) return std::nullopt;
  const StreamWait& w = waits_.front();
  static constexpr const char* kConditions[] = {"GEQ", "EQ", "AND", "NOR"};
  const auto legacy = reinterpret_cast<uint64_t>(CU_STREAM_LEGACY);
  const auto perThread = reinterpret_cast<uint64_t>(CU_STREAM_PER_THREAD);
  const std::string stream = w.stream == 0 || w.stream == legacy ? std::string("the legacy stream")
                             : w.stream == perThread ? std::string("a per-thread default stream")
                                                     : fmt::format("stream {}", w.stream);
  return fmt::format("{} waits (cuStreamWaitValue{}) for the word at {:#x} to satisfy {} {:#x}{}",
                     stream, w.wide ? 64 : 32, w.address, kConditions[w.condition & 3], w.value,
                     waits_.size() > 1 ? fmt::format(" ({} waits in all)", waits_.size()) : "");
}

void StreamWaits::forgetContext(uint64_t context) {
  std::erase_if(waits_, [&](const StreamWait& w) { return w.context == context; });
}

}  // namespace phos::daemon
