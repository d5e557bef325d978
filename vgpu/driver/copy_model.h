// SPDX-License-Identifier: Apache-2.0
// Copy engines with modelled bandwidths: PCIe, device memory and NVLink links that copies share.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <semaphore>
#include <utility>
#include <vector>

#include "device_profile.h"

namespace phos::vgpu {

// One direction of one link. Copies reserve time on it back to back, so two
// concurrent copies over the same link each see half its bandwidth.
class ModelledLink {
 public:
  explicit ModelledLink(double bytesPerSecond) : bytesPerSecond_(bytesPerSecond) {}
  // Books `bytes` (scaled by `scale`) and returns when the transfer ends.
  std::chrono::steady_clock::time_point book(std::size_t bytes, double scale);
  double bytesPerSecond() const { return bytesPerSecond_; }

 private:
  const double bytesPerSecond_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point busyUntil_{};
};

// Every copy takes one of its device's two copy engines, does the memcpy, and
// then sleeps until the modelled end of the transfer: a copy of N bytes takes at
// least N / bandwidth * PHOS_VGPU_BANDWIDTH_SCALE of wall time.
class CopyModel {
 public:
  explicit CopyModel(const PlatformConfig& platform);

  // `srcDevice`/`dstDevice` are device ordinals or -1 for host memory.
  void transfer(int srcDevice, int dstDevice, std::size_t bytes, const std::function<void()>& copy);

  // The links a copy between two endpoints uses (exposed for tests).
  std::vector<ModelledLink*> route(int srcDevice, int dstDevice);
  double scale() const { return scale_; }

 private:
  struct DeviceLinks {
    std::unique_ptr<ModelledLink> hostToDevice;
    std::unique_ptr<ModelledLink> deviceToHost;
    std::unique_ptr<ModelledLink> local;
    std::unique_ptr<std::counting_semaphore<2>> engines;
  };
  const double scale_;
  std::vector<DeviceLinks> devices_;
  std::map<std::pair<int, int>, std::unique_ptr<ModelledLink>> nvlinks_;  // directed
};

}  // namespace phos::vgpu
