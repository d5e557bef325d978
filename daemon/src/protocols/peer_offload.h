// SPDX-License-Identifier: Apache-2.0
// Peer offload in a copy-on-write checkpoint (issue 10, part 2): where the
// shadows of a device short of reserve go.
//
// At t1 each device of the session has buffers to save and a shadow reserve.
// A device whose buffers exceed its reserve would make writers wait for the
// copy to the image once its reserve is full; its peers may have reserve to
// spare. The offload library (offload/, docs/offload.md) decides, per the
// scheduler asked for, how many chunks of each such device may be shadowed on
// each peer; SoftCopyOnWrite places shadows there over the peer link when the
// device's own reserve is full, and saves them from there. The instance's
// bandwidths are measured on the session's own devices, once per process.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "session/driver_table.h"
#include "phos/common/status.h"
#include "phos/offload/schedulers.h"

namespace phos::daemon {

// One device of the session at t1.
struct DeviceSpace {
  int device = 0;
  CUcontext context = nullptr;   // a context of the session on it
  uint64_t checkpointBytes = 0;  // its buffers to save
  uint64_t reserveBytes = 0;     // device memory its shadows (and its peers') may hold at once
};

// Bytes per second of each device's link to host memory and of each ordered
// pair of devices that can copy to each other directly (cuDeviceCanAccessPeer).
struct LinkBandwidths {
  std::map<int, double> host;
  std::map<std::pair<int, int>, double> peer;
};

// Measures the links between the given devices (one context each) by timing
// one `chunkBytes` copy per link after a warm-up copy; the figures are kept
// for the life of the process and measured only for links not seen yet. A
// link whose buffers cannot be allocated is left out (no peer shadows over it).
LinkBandwidths measureLinks(const DriverTable& driver, const std::vector<std::pair<int, CUcontext>>& devices,
                            size_t chunkBytes);

struct PeerShadowPlan {
  // Bytes of device `first`'s chunks that may be shadowed on device `second`
  // at once (the plan's chunks times the chunk size).
  std::map<std::pair<int, int>, uint64_t> quota;
  // The instance, the scheduler's transfers and its modelled blocking time.
  nlohmann::json report;
};

// The plan for `devices` with `scheduler` (kBaseline: no peer shadows, every
// chunk that does not fit waits for the copy to the image).
Result<PeerShadowPlan> planPeerShadows(const std::vector<DeviceSpace>& devices, const LinkBandwidths& links,
                                       offload::Scheduler scheduler, size_t chunkBytes);

}  // namespace phos::daemon
