// SPDX-License-Identifier: Apache-2.0
// The bandwidth model of vgpu's copy engines.
#include "copy_model.h"

#include <algorithm>
#include <thread>

namespace phos::vgpu {

std::chrono::steady_clock::time_point ModelledLink::book(std::size_t bytes, double scale) {
  auto duration = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / bytesPerSecond_ * scale));
  std::lock_guard lock(mutex_);
  auto start = std::max(std::chrono::steady_clock::now(), busyUntil_);
  busyUntil_ = start + duration;
  return busyUntil_;
}

CopyModel::CopyModel(const PlatformConfig& platform) : scale_(platform.bandwidthScale) {
  constexpr double kGB = 1e9;
  for (std::size_t i = 0; i < platform.devices.size(); ++i) {
    DeviceLinks links;
    links.hostToDevice = std::make_unique<ModelledLink>(platform.pcieGBps * kGB);
    links.deviceToHost = std::make_unique<ModelledLink>(platform.pcieGBps * kGB);
    links.local = std::make_unique<ModelledLink>(platform.localGBps * kGB);
    links.engines = std::make_unique<std::counting_semaphore<2>>(2);
    devices_.push_back(std::move(links));
  }
  for (const auto& [pair, gbps] : platform.nvlinkGBps) {
    nvlinks_[pair] = std::make_unique<ModelledLink>(gbps * kGB);
    nvlinks_[{pair.second, pair.first}] = std::make_unique<ModelledLink>(gbps * kGB);
  }
}

std::vector<ModelledLink*> CopyModel::route(int src, int dst) {
  std::vector<ModelledLink*> links;
  if (src < 0 && dst < 0) return links;  // host to host: a plain memcpy
  if (src < 0) {
    links.push_back(devices_.at(static_cast<std::size_t>(dst)).hostToDevice.get());
  } else if (dst < 0) {
    links.push_back(devices_.at(static_cast<std::size_t>(src)).deviceToHost.get());
  } else if (src == dst) {
    links.push_back(devices_.at(static_cast<std::size_t>(src)).local.get());
  } else if (auto it = nvlinks_.find({src, dst}); it != nvlinks_.end()) {
    links.push_back(it->second.get());
  } else {
    // No NVLink: peer traffic crosses PCIe out of one device and into the other.
    links.push_back(devices_.at(static_cast<std::size_t>(src)).deviceToHost.get());
    links.push_back(devices_.at(static_cast<std::size_t>(dst)).hostToDevice.get());
  }
  return links;
}

void CopyModel::transfer(int src, int dst, std::size_t bytes, const std::function<void()>& copy) {
  if (scale_ <= 0 || (src < 0 && dst < 0)) {
    copy();
    return;
  }
  auto& engines = *devices_.at(static_cast<std::size_t>(src >= 0 ? src : dst)).engines;
  engines.acquire();
  auto end = std::chrono::steady_clock::now();
  for (ModelledLink* link : route(src, dst)) end = std::max(end, link->book(bytes, scale_));
  copy();
  std::this_thread::sleep_until(end);
  engines.release();
}

}  // namespace phos::vgpu
