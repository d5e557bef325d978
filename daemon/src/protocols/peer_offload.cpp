// SPDX-License-Identifier: Apache-2.0
// Peer offload in a copy-on-write checkpoint: measuring the links and planning (peer_offload.h).
#include "protocols/peer_offload.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>

#include "phos/common/log.h"
#include "phos/offload/plan.h"
#include "phos/offload/problem.h"
#include "session/staging_buffer.h"

namespace phos::daemon {
namespace {

using json = nlohmann::json;

// Bytes per second of `copy` (of `bytes`), timed after one warm-up run; 0 if it fails.
template <typename Copy>
double rateOf(size_t bytes, Copy copy) {
  if (copy() != CUDA_SUCCESS) return 0;
  const auto start = std::chrono::steady_clock::now();
  if (copy() != CUDA_SUCCESS) return 0;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) / std::max(seconds, 1e-9);
}

}  // namespace

LinkBandwidths measureLinks(const DriverTable& driver, const std::vector<std::pair<int, CUcontext>>& devices,
                            size_t chunkBytes) {
  // The devices of a phosd worker do not change: what was measured holds.
  static std::mutex mutex;
  static LinkBandwidths known;
  static std::set<std::pair<int, int>> tried;  // (device, device) pairs; (d, d) for d's host link
  std::lock_guard lock(mutex);

  auto pending = [&](int a, int b) { return tried.count({a, b}) == 0; };
  bool any = false;
  for (const auto& [a, ca] : devices) {
    for (const auto& [b, cb] : devices) any = any || pending(a, b);
  }
  if (!any) return known;

  CUcontext saved = nullptr;
  PHOS_DRIVER(driver, CtxGetCurrent)(&saved);
  std::map<int, std::pair<CUcontext, CUdeviceptr>> buffers;
  for (const auto& [device, context] : devices) {
    CUdeviceptr p = 0;
    if (PHOS_DRIVER(driver, CtxSetCurrent)(context) == CUDA_SUCCESS &&
        PHOS_DRIVER(driver, MemAlloc_v2)(&p, chunkBytes) == CUDA_SUCCESS) {
      buffers[device] = {context, p};
    } else {
      log::get("daemon")->info("peer offload: no room on device {} to measure its links", device);
    }
  }
  StagingBuffer staging(driver, chunkBytes);
  const bool staged = staging.allocate().isOk();
  for (const auto& [a, from] : buffers) {
    if (staged && pending(a, a)) {
      PHOS_DRIVER(driver, CtxSetCurrent)(from.first);
      const double rate = rateOf(chunkBytes, [&] {
        return PHOS_DRIVER(driver, MemcpyDtoH_v2)(staging.data(), from.second, chunkBytes);
      });
      if (rate > 0) known.host[a] = rate;
      tried.insert({a, a});
    }
    for (const auto& [b, to] : buffers) {
      if (a == b || !pending(a, b)) continue;
      tried.insert({a, b});
      CUdevice da = 0, db = 0;
      int can = 0;
      if (PHOS_DRIVER(driver, DeviceGet)(&da, a) != CUDA_SUCCESS || PHOS_DRIVER(driver, DeviceGet)(&db, b) != CUDA_SUCCESS ||
          PHOS_DRIVER(driver, DeviceCanAccessPeer)(&can, da, db) != CUDA_SUCCESS || can == 0) {
        continue;
      }
      PHOS_DRIVER(driver, CtxSetCurrent)(from.first);
      const double rate = rateOf(chunkBytes, [&] {
        return PHOS_DRIVER(driver, MemcpyPeer)(to.second, to.first, from.second, from.first, chunkBytes);
      });
      if (rate > 0) known.peer[{a, b}] = rate;
    }
  }
  for (const auto& [device, buffer] : buffers) {
    PHOS_DRIVER(driver, CtxSetCurrent)(buffer.first);
    PHOS_DRIVER(driver, MemFree_v2)(buffer.second);
  }
  PHOS_DRIVER(driver, CtxSetCurrent)(saved);
  for (const auto& [device, rate] : known.host) {
    log::get("daemon")->info("peer offload: device {} to host {:.2f} GB/s", device, rate / 1e9);
  }
  for (const auto& [pair, rate] : known.peer) {
    log::get("daemon")->info("peer offload: device {} to device {} {:.2f} GB/s", pair.first, pair.second, rate / 1e9);
  }
  return known;
}

Result<PeerShadowPlan> planPeerShadows(const std::vector<DeviceSpace>& devices, const LinkBandwidths& links,
                                       offload::Scheduler scheduler, size_t chunkBytes) {
  // The instance: every device of the session, its buffers and its reserve
  // as free memory; a link where both directions were measured, at the
  // slower one; every device's host link at the slowest measured.
  offload::Instance instance;
  instance.chunkBytes = static_cast<int64_t>(chunkBytes);
  double host = 0;
  for (const DeviceSpace& d : devices) {
    instance.gpus.push_back({static_cast<int64_t>(d.checkpointBytes), static_cast<int64_t>(d.reserveBytes), {}, {}});
    if (auto it = links.host.find(d.device); it != links.host.end()) {
      host = host == 0 ? it->second : std::min(host, it->second);
    }
  }
  instance.hostBandwidth = host > 0 ? host : 1;  // unmeasured: the host is the last resort anyway
  json linkReport = json::array();
  for (size_t i = 0; i < devices.size(); ++i) {
    for (size_t j = i + 1; j < devices.size(); ++j) {
      auto ab = links.peer.find({devices[i].device, devices[j].device});
      auto ba = links.peer.find({devices[j].device, devices[i].device});
      if (ab == links.peer.end() || ba == links.peer.end()) continue;
      const double bandwidth = std::min(ab->second, ba->second);
      instance.links.push_back({static_cast<int>(i), static_cast<int>(j), bandwidth});
      linkReport.push_back({{"a", devices[i].device}, {"b", devices[j].device}, {"bandwidth", bandwidth}});
    }
  }
  ASSIGN_OR_RETURN(offload::Problem problem, offload::makeProblem(instance));
  ASSIGN_OR_RETURN(offload::Outcome outcome, offload::runScheduler(problem, scheduler));
  RETURN_IF_ERROR(offload::verifyPlan(problem, outcome.plan));

  PeerShadowPlan plan;
  json deviceReport = json::array(), transfers = json::array();
  for (const DeviceSpace& d : devices) {
    deviceReport.push_back({{"device", d.device}, {"checkpoint_bytes", d.checkpointBytes},
                            {"reserve_bytes", d.reserveBytes}});
  }
  for (const offload::Transfer& t : outcome.plan.transfers) {
    const int from = devices[static_cast<size_t>(t.from)].device;
    json entry = {{"from", from}, {"chunks", t.chunks}, {"bytes", t.bytes}};
    if (t.to == offload::kHost) {
      entry["to"] = "host";
    } else {
      const int to = devices[static_cast<size_t>(t.to)].device;
      entry["to"] = to;
      plan.quota[{from, to}] = static_cast<uint64_t>(t.chunks) * chunkBytes;
    }
    transfers.push_back(std::move(entry));
  }
  plan.report = {{"scheduler", offload::schedulerName(scheduler)},
                 {"blocking_seconds", outcome.blockingSeconds},
                 {"solve_seconds", outcome.solveSeconds},
                 {"host_bandwidth", instance.hostBandwidth},
                 {"devices", std::move(deviceReport)},
                 {"links", std::move(linkReport)},
                 {"transfers", std::move(transfers)}};
  return plan;
}

}  // namespace phos::daemon
