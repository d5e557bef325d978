// SPDX-License-Identifier: Apache-2.0
// ContextStreams: the concurrent protocols' own streams, one per context.
#pragma once

#include <cuda.h>

#include <map>

#include "session/driver_table.h"
#include "phos/common/status.h"

namespace phos::daemon {

// Non-blocking streams: the application's legacy-stream work neither waits for
// a protocol's copies nor makes them wait. Destroyed with this object.
class ContextStreams {
 public:
  explicit ContextStreams(const DriverTable& driver) : driver_(driver) {}
  ~ContextStreams() {
    CUcontext saved = nullptr;
    PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
    for (auto& [context, stream] : streams_) {
      PHOS_DRIVER(driver_, CtxSetCurrent)(context);
      PHOS_DRIVER(driver_, StreamDestroy_v2)(stream);
    }
    PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
  }
  ContextStreams(const ContextStreams&) = delete;
  ContextStreams& operator=(const ContextStreams&) = delete;

  // Creates the stream of `context` (`what` names it in an error) unless it
  // has one; `context` may be left current.
  Status add(CUcontext context, const char* what) {
    if (streams_.count(context) != 0) return Status::ok();
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(driver_, CtxSetCurrent)(context), "making a context current"));
    CUstream stream = nullptr;
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(driver_, StreamCreate)(&stream, CU_STREAM_NON_BLOCKING), what));
    streams_[context] = stream;
    return Status::ok();
  }
  // The stream of `context`, or nullptr.
  CUstream of(CUcontext context) const {
    auto it = streams_.find(context);
    return it == streams_.end() ? nullptr : it->second;
  }
  const std::map<CUcontext, CUstream>& all() const { return streams_; }

 private:
  const DriverTable& driver_;
  std::map<CUcontext, CUstream> streams_;
};

}  // namespace phos::daemon
