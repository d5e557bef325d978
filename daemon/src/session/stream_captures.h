// SPDX-License-Identifier: Apache-2.0
// StreamCaptures: the application's stream captures as its threads see them.
//
// CUDA's capture rules are per thread: cuThreadExchangeStreamCaptureMode sets
// a thread's mode, a capture begun in global or thread-local mode must end
// in the thread that began it, and a "potentially unsafe" call (an
// allocation, a free) is refused in a thread that has a capture of its own
// in progress, or, in global mode, while any thread has a global capture.
// phosd serves every thread of the application on one thread, which began
// every capture as far as the driver knows; the session keeps which
// application thread began each and in which mode, and before each call it
// gives its serving thread the mode that makes the driver answer as it
// would have answered the calling thread (docs/remoting.md: stream capture).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "session/driver_table.h"

namespace phos::daemon {

class StreamCaptures {
 public:
  struct Capture {
    uint64_t thread = 0;  // the application thread that began it
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    CUgraph graph = nullptr;      // the graph being built, once cuStreamGetCaptureInfo named it
    std::set<CUgraphNode> nodes;  // its nodes cuStreamGetCaptureInfo handed out
    bool intoApplicationGraph = false;  // cuStreamBeginCaptureToGraph: a failed end keeps it
  };

  // A capture began on `stream` (its origin) for application thread `thread`,
  // into a graph of its own or into the application's `into`.
  void begin(CUstream stream, uint64_t thread, CUstreamCaptureMode mode, CUgraph into = nullptr) {
    captures_[stream] = Capture{thread, mode, into, {}, into != nullptr};
  }
  // It ended (or its stream is gone).
  void end(CUstream stream) { captures_.erase(stream); }
  Capture* find(CUstream stream) {
    auto it = captures_.find(stream);
    return it == captures_.end() ? nullptr : &it->second;
  }
  size_t active() const { return captures_.size(); }
  std::map<CUstream, Capture>& byOrigin() { return captures_; }

  // cuThreadExchangeStreamCaptureMode for application thread `thread`.
  CUstreamCaptureMode exchangeMode(uint64_t thread, CUstreamCaptureMode mode);
  CUstreamCaptureMode mode(uint64_t thread) const;

  // Whether CUDA refuses a potentially unsafe call of `thread` now.
  bool prohibited(uint64_t thread) const;
  // The origin streams of `thread`'s own captures that such a refusal
  // invalidates (those not begun in relaxed mode).
  std::vector<CUstream> ownStrictCaptures(uint64_t thread) const;

  // Gives the calling (serving) thread the driver mode under which the
  // driver refuses exactly what it would refuse application thread `thread`:
  // global while `thread` is prohibited (every capture the driver knows was
  // begun by the serving thread, so it refuses), relaxed otherwise. Nothing
  // while no capture is in progress.
  void applyServingMode(const DriverTable& driver, uint64_t thread);

 private:
  std::map<CUstream, Capture> captures_;                         // by origin stream
  std::map<uint64_t, CUstreamCaptureMode> threadModes_;          // absent: global
  CUstreamCaptureMode serving_ = CU_STREAM_CAPTURE_MODE_GLOBAL;  // the serving thread's driver mode
};

// Puts the calling thread of phosd in relaxed capture mode: phosd's own
// threads (a checkpoint's, its copies') must never have the driver refuse
// their calls, nor invalidate the application's capture with them.
void relaxStreamCapture(const DriverTable& driver);

}  // namespace phos::daemon
