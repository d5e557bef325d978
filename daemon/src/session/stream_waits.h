// SPDX-License-Identifier: Apache-2.0
// StreamWaits: the stream memory waits (cuStreamWaitValue32 and the others)
// that may still hold a session's streams. Such a wait holds its stream until
// memory takes a value, and what writes the value may be a later call of
// another application thread. So phosd never blocks its serving thread on work
// that may sit behind one (Session::serve answers those synchronizations
// later), a checkpoint cannot drain it (Session::drainContexts names it), and a
// context is destroyed around it without being synchronized first.
//
// Each wait is followed on its stream by an event of phosd's (its mark): the
// wait is over once the mark has completed.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "session/driver_table.h"

namespace phos::daemon {

struct StreamWait {
  uint64_t stream = 0;   // the application's id (0: the legacy stream)
  uint64_t context = 0;  // the session's id of the stream's context
  CUdeviceptr address = 0;
  uint64_t value = 0;
  bool wide = false;       // 64-bit
  unsigned condition = 0;  // CU_STREAM_WAIT_VALUE_GEQ, _EQ, _AND or _NOR
  CUevent mark = nullptr;
  CUstream real =
      nullptr;           // the driver's stream (CU_STREAM_LEGACY, or null, for the legacy stream)
  bool blocking = true;  // not CU_STREAM_NON_BLOCKING: the legacy stream's work waits for it
};

class StreamWaits {
 public:
  // After `real` (current context's stream) enqueued `wait`: records its mark.
  CUresult add(const DriverTable& d, CUstream real, StreamWait wait);
  // No wait was added since the last pending() found them all over (no
  // driver call: what a call's serving path asks first).
  bool empty() const { return waits_.empty(); }
  // Forgets the waits that are over; true if one may still hold its stream.
  bool pending(const DriverTable& d);
  // The same, for one context's streams.
  bool pendingIn(const DriverTable& d, uint64_t context);
  // Whether a synchronous call on a default stream would wait behind one:
  // the legacy stream waits for itself and every blocking stream; a
  // thread's per-thread stream (`perThread`, else null) for itself and the
  // legacy stream.
  bool holdDefaultStream(const DriverTable& d, CUstream perThread);
  // The first wait that may still hold its stream, in words; none if all are over.
  std::optional<std::string> describePending(const DriverTable& d);
  // A context is being destroyed: its waits and their marks go with it.
  void forgetContext(uint64_t context);
  // The session ends: its contexts (and the marks) are destroyed by the pool.
  void clear() { waits_.clear(); }

 private:
  std::vector<StreamWait> waits_;
};

}  // namespace phos::daemon
