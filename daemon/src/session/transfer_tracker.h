// SPDX-License-Identifier: Apache-2.0
// TransferTracker: whether the application has transfers of its own pending,
// so that the concurrent protocols' copies give way to them (the application's
// transfers first, docs/checkpoint.md).
//
// The session's serving thread brackets each of the application's copies
// between its memory and the device with begin()/end(). A synchronous copy is
// pending while it is served; an asynchronous one until its stream has run it
// (an event recorded after it), tracked only while a protocol is interested
// (track(true)), so that ordinary serving records nothing. The protocols' copy
// loops call yield() before each chunk.
#pragma once

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>

#include "session/driver_table.h"

namespace phos::daemon {

class TransferTracker {
 public:
  explicit TransferTracker(const DriverTable& driver) : driver_(driver) {}
  ~TransferTracker() { track(false); }
  TransferTracker(const TransferTracker&) = delete;
  TransferTracker& operator=(const TransferTracker&) = delete;

  // While a protocol's window is open: asynchronous copies are followed.
  void track(bool on);

  // On the serving thread, around the issue of one of the application's
  // copies (a context of it current). `stream`: where an asynchronous copy
  // runs (for a synchronous one, ignored).
  void begin() { serving_.fetch_add(1); }
  void end(bool async, CUstream stream);

  // Whether a transfer of the application is being served or still runs.
  bool pending();
  // Waits while one is pending, at most `limit` (a job that always transfers
  // must not starve the protocol); how long it waited.
  std::chrono::duration<double> yield(std::chrono::milliseconds limit = std::chrono::milliseconds(100));

 private:
  const DriverTable& driver_;
  std::atomic<int> serving_{0};
  std::atomic<bool> tracking_{false};
  std::mutex mutex_;
  std::deque<CUevent> events_;  // recorded after asynchronous copies, oldest first
};

}  // namespace phos::daemon
