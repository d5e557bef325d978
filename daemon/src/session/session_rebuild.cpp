// SPDX-License-Identifier: Apache-2.0
// A session made again from an image (Session::rebuildFrom), domain by
// domain, in the order the objects depend on each other: the ring, contexts,
// device ranges and pools, allocations and modules in the order the job made
// them, the globals' and allocations' bytes, library modules, kernels,
// functions, streams, events, pinned memory, the host-call queue, and the
// ring's pending calls last. The description comes from
// Session::describe (session_save.cpp); the image is untrusted input, and
// anything it names wrongly is refused, naming what.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "protocols/device_copy.h"
#include "session/host_calls.h"
#include "session/session_files.h"
#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "session/session.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

class Session::Rebuilder {
 public:
  Rebuilder(Session& s, const image::ImageReader& reader, const json& state,
            const ProgressFn& progress, std::vector<DeviceBuffer>* deferred)
      : s_(s),
        d_(s.driver_),
        scope_{s.driver_, s.handles_, s.contexts_, s.currentContext_},
        reader_(reader),
        st_(state),
        progress_(progress),
        deferred_(deferred) {}

  Status run() {
    std::lock_guard lock(s_.mutex_);
    RETURN_IF_ERROR(claimRing());
    RETURN_IF_ERROR(contexts());
    uint64_t total = 0;
    for (const auto& b : reader_.manifest().blobs) {
      if ((b.kind == "gpu-memory" && deferred_ == nullptr) || b.kind == "module-global") {
        total += b.size;
      }
    }
    phase_.emplace(progress_, "gpu-memory", total);
    phase_->start();
    // Device memory, at its addresses, in the ranges it was in.
    memory_.emplace(s_.memory_, scope_, reader_, st_);
    RETURN_IF_ERROR(memory_->reserveRanges());
    // Memory pools, under the handles the application holds, before the
    // allocations made from them.
    RETURN_IF_ERROR(s_.memoryPools_.rebuild(s_, st_));
    // The application's VMM ranges, memory and mappings, before the
    // allocations whose bytes are copied through the mappings.
    RETURN_IF_ERROR(s_.vmm_.rebuild(st_));
    memory_->expectMappings([this](const Allocation& a) {
      const VmmMapping* m = s_.vmm_.mappingAt(a.address);
      return m != nullptr && m->address == a.address && m->bytes == a.bytes &&
             m->physical == a.physical;
    });
    // Allocations and modules come back in the order the job made them
    // (DeviceMemory::takeOrder): the allocations made before a module are
    // mapped before it is loaded. Modules and libraries, loaded again in
    // creation order; their globals.
    SessionModules::Load load(s_.modules_, scope_, reader_, s_.validator_, s_.memory_, eagerCopies_);
    auto before = [this](uint64_t order) -> Status {
      if (order != std::numeric_limits<uint64_t>::max()) memory_->noteOrder(order);
      return mapAllocationsBefore(order);
    };
    for (const json& m : st_.value("modules", json::array())) RETURN_IF_ERROR(load.module(m, before));
    s_.noteModule(static_cast<int>(s_.modules_.count()));
    RETURN_IF_ERROR(mapAllocationsBefore(std::numeric_limits<uint64_t>::max()));
    memory_->finish();
    for (const SessionModules::Load::Copy& e : eagerCopies_) {
      if (e.context != 0) RETURN_IF_ERROR(makeCurrent(e.context));
      ASSIGN_OR_RETURN(ChunkCopier * copier, copierFor(e.device));
      RETURN_IF_ERROR(
          copier->load(reader_, e.blob, e.address, [this](uint64_t n) { phase_->advance(n); }));
    }
    RETURN_IF_ERROR(s_.modules_.bindFunctions(scope_, st_, s_.pool_.deviceCount()));
    RETURN_IF_ERROR(s_.streamsAndEvents_.rebuild(scope_, st_));
    RETURN_IF_ERROR(s_.links_.rebuild(scope_, reader_, st_));
    RETURN_IF_ERROR(pinned());
    RETURN_IF_ERROR(hostCalls());
    // Arrays with their texels, then texture and surface objects under the
    // handles the kernels hold (over arrays, or device or pinned
    // memory made above).
    RETURN_IF_ERROR(s_.arrays_.rebuild(
        scope_, reader_, st_,
        [this](uint64_t address, uint64_t bytes) { return s_.ownsRange(address, bytes); }));
    // Graphs after the functions and events their nodes name, the pinned
    // memory their copies may name and the queue their host nodes run through.
    RETURN_IF_ERROR(s_.graphs_.rebuild(
        scope_, st_, [this](uint64_t context) { return makeCurrent(context); },
        [this](uint64_t address, uint64_t bytes) { return s_.ownsRange(address, bytes); },
        [this] { return s_.hostCalls(); }));
    // User objects after the graphs that hold their references.
    if (!st_.value("user_objects", nlohmann::json::array()).empty()) {
      ASSIGN_OR_RETURN(auto channel, s_.hostCalls());
      RETURN_IF_ERROR(s_.userObjects_.rebuild(scope_, st_, channel));
    }
    // The ring's contents last: the application's pending calls are in it.
    const std::string& path = ringPath_;
    ipc::CallRing::Snapshot snap;
    snap.bytes.resize(reader_.manifest().blobs[ringBlob_].size);
    RETURN_IF_ERROR(reader_.read(ringBlob_, 0, snap.bytes));
    snap.readPosition = st_["ring"].value("read_position", uint64_t{0});
    RETURN_IF_ERROR(created_->restoreSnapshot(snap));
    if (chown(path.c_str(), s_.uid_, static_cast<gid_t>(-1)) != 0 && geteuid() == 0) {
      return errnoError(errno, fmt::format("cannot give {} to uid {}", path, s_.uid_));
    }
    chmod(path.c_str(), 0600);
    s_.ring_.emplace(std::move(*created_));
    return Status::ok();
  }

 private:
  Status claimRing() {
    // The session's files first: if it still runs here, nothing is done.
    if (!st_.contains("ring")) {
      return makeError(Code::kDataLoss, "the session's call ring is not in the image");
    }
    ASSIGN_OR_RETURN(ringPath_, field<std::string>(st_["ring"], "path", "ring"));
    RETURN_IF_ERROR(claimSessionPath(ringPath_, ringPath_, s_.pid(), s_.uid_));
    // The ring is created and locked at once: another restore of this session
    // (a copy of the image) now finds it held and claims none of its files.
    // Its contents, the application's pending calls, come last.
    const json& ring = st_["ring"];
    ASSIGN_OR_RETURN(ringBlob_, blobOf(reader_, ring, "ring"));
    // Images of rings without transfer lanes name none.
    ipc::RingGeometry geometry{ring.value("slot_count", 0u), ring.value("slot_bytes", 0u),
                               ring.value("lane_count", 0u), ring.value("lane_slot_bytes", 0u)};
    ASSIGN_OR_RETURN(ipc::CallRing created,
                     ipc::CallRing::create(ringPath_, geometry, &s_.ringLock_));
    created_.emplace(std::move(created));
    s_.ringPath_ = ringPath_;  // from here on stop() removes it
    ASSIGN_OR_RETURN(uint64_t lastSerial, field<uint64_t>(st_, "handles_last_serial", "session"));
    s_.handles_.setLastSerial(lastSerial);
    s_.deferred_ = static_cast<CUresult>(st_.value("deferred_error", 0));
    if (st_.value("validate", false)) s_.validator_.setMode(ValidationMode::kValidate);
    return Status::ok();
  }

  // Contexts, from the pool.
  Status contexts() {
    return s_.contexts_.rebuild(d_, s_.pool_, s_.handles_, st_,
                                [this](CUcontext real) { s_.captureOutput(real); });
  }

  Status makeCurrent(uint64_t vid) { return s_.contexts_.makeCurrent(d_, vid); }

  Result<ChunkCopier*> copierFor(int device) {
    auto& c = copiers_[device];
    if (c == nullptr) {
      c = std::make_unique<ChunkCopier>(d_, image::kDefaultChunkBytes);
      RETURN_IF_ERROR(c->prepare());
    }
    return c.get();
  }

  // The allocations of the image before `limit` in the job's order, mapped
  // at their addresses (their bytes are copied after the modules, or, for a
  // concurrent restore, listed in `deferred_`), counted in their pools.
  Status mapAllocationsBefore(uint64_t limit) {
    return memory_->mapBefore(limit, [this](const Allocation& a, size_t blob) -> Status {
      if (a.pool != 0) {
        MemoryPool* pool = s_.memoryPools_.find(a.pool);
        if (pool == nullptr) {
          return makeError(Code::kDataLoss, "allocation {} is of memory pool {}, which the image does not have",
                           hex(a.address), hex(a.pool));
        }
        pool->used += a.bytes;
        pool->reserved += s_.memory_.mappedBytes(a.device, a.address);
      }
      if (deferred_ != nullptr) {
        ASSIGN_OR_RETURN(CUcontext real, s_.contexts_.real(a.context));
        deferred_->push_back({blob, a.address, a.bytes, real});
      } else {
        eagerCopies_.push_back({a.context, a.device, blob, a.address});
      }
      return Status::ok();
    });
  }

  Status pinned() {
    // Pinned memory: the same file path, mapped at the same address, and
    // registered with the driver again in its context.
    auto registerAgain = [&](const PinnedRange& r) -> Status {
      RETURN_IF_ERROR(makeCurrent(r.context));
      if (r.registered != 0) {
        return driverStatus(
            PHOS_DRIVER(d_, MemHostRegister_v2)(reinterpret_cast<void*>(r.registered),
                                                r.registeredBytes, registrationFlags(r.flags)),
            fmt::format("registering the application's memory at {} again", hex(r.registered)));
      }
      return driverStatus(PHOS_DRIVER(d_, MemHostRegister_v2)(reinterpret_cast<void*>(r.address), r.mapped,
                                                              CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
                          fmt::format("registering pinned memory at {} again", hex(r.address)));
    };
    RETURN_IF_ERROR(
        s_.pinned_.rebuild(reader_, st_.value("pinned", json::array()), s_.pid(), registerAgain));
    PHOS_DRIVER(d_, CtxSetCurrent)(nullptr);
    s_.currentReal_ = nullptr;
    return Status::ok();
  }

  Status hostCalls() {
    if (st_.contains("host_calls")) {
      const json& h = st_["host_calls"];
      ASSIGN_OR_RETURN(std::string path, field<std::string>(h, "path", "host_calls"));
      ASSIGN_OR_RETURN(size_t blob, blobOf(reader_, h, "host_calls"));
      RETURN_IF_ERROR(claimSessionPath(path, "", s_.pid(), s_.uid_));  // the ring is ours
      ASSIGN_OR_RETURN(auto channel, HostCallChannel::create(path, s_.uid_, s_.pid()));
      std::vector<std::byte> bytes(reader_.manifest().blobs[blob].size);
      RETURN_IF_ERROR(reader_.read(blob, 0, bytes));
      RETURN_IF_ERROR(channel->restoreBytes(bytes));
      std::lock_guard hostLock(s_.hostCallsMutex_);
      s_.hostCalls_ = std::move(channel);
    }
    return Status::ok();
  }

  Session& s_;
  const DriverTable& d_;
  SessionScope scope_;
  const image::ImageReader& reader_;
  const json& st_;
  const ProgressFn& progress_;
  std::vector<DeviceBuffer>* deferred_;  // null: the bytes are copied here
  std::optional<PhaseProgress> phase_;
  std::string ringPath_;
  size_t ringBlob_ = 0;
  std::optional<ipc::CallRing> created_;  // the ring, locked; its contents come last
  std::optional<DeviceMemory::Restore> memory_;  // from the ranges on
  std::vector<SessionModules::Load::Copy> eagerCopies_;  // after the modules
  std::map<int, std::unique_ptr<ChunkCopier>> copiers_;
};

Status Session::rebuildFrom(const image::ImageReader& reader, const json& state,
                            const ProgressFn& progress, std::vector<DeviceBuffer>* deferred) {
  return Rebuilder(*this, reader, state, progress, deferred).run();
}

}  // namespace phos::daemon
