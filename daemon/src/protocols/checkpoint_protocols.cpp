// SPDX-License-Identifier: Apache-2.0
// Stop-the-world, soft copy-on-write and soft recopy (checkpoint_protocols.h).
//
// Stop-the-world: at the cut the session stops serving (its application's
// calls wait in the ring), every context drains, and device memory, module
// images and globals are copied (into host memory first when there is room,
// written into the image while CRIU dumps); CRIU then dumps the process.
// Soft copy-on-write (the job left running): the cut only lists the buffers;
// after the dump the session serves again behind a gate that saves a chunk
// before the job writes it. Soft recopy: before the cut, rounds of copies of
// what the job wrote since the last, while it runs; at the cut only what is
// still dirty is copied. Both run the job's launches as validator twins in
// their window; a launch that touched memory outside its speculated buffers
// makes the copy start over (recopy) or the image be discarded (copy-on-write).
#include "protocols/checkpoint_protocols.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "protocols/device_copy.h"
#include "migration/migration.h"
#include "phos/common/log.h"
#include "session/session.h"
#include "session/session_image.h"
#include "protocols/soft_cow.h"
#include "protocols/soft_recopy.h"

namespace phos::daemon {

using json = nlohmann::json;
using Clock = CheckpointTimes::Clock;

namespace {

// For tests of the concurrent protocols only (PHOS_TEST_REFERENCE_SNAPSHOT
// in phosd's environment): the bytes of every buffer at the quiesce point,
// read from the device while the session is paused, one file per buffer
// named by its address (0x...). A copy-on-write image must hold exactly these.
Status writeReferenceSnapshot(Session& s, const std::vector<DeviceBuffer>& buffers,
                              const std::string& dir) {
  std::vector<std::byte> bytes;
  for (const DeviceBuffer& b : buffers) {
    bytes.resize(b.bytes);
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(s.driver(), CtxSetCurrent)(b.context),
                                 "making a context current"));
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(s.driver(), MemcpyDtoH_v2)(bytes.data(), b.address, b.bytes),
                     "reading the reference snapshot"));
    std::ofstream out(std::filesystem::path(dir) / hex(b.address),
                      std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) return makeError(Code::kIo, "cannot write the reference snapshot into {}", dir);
  }
  PHOS_DRIVER(s.driver(), CtxSetCurrent)(nullptr);
  return Status::ok();
}

// Soft recopy before t2, while the job runs: the dirty-tracking gate goes in
// and its launches run as twins; the first round copies every allocation
// into host memory, and each further round the chunks written since, while
// that set shrinks (at most kRecopyRounds). kResourceExhausted: no host
// memory for the copy (nothing was changed).
constexpr int kRecopyRounds = 8;
Status precopy(Session& s, std::unique_ptr<StagedWrite>& staged,
               std::shared_ptr<SoftRecopy>& recopier, const ProgressFn& progress, json& report,
               migration::Outgoing* outgoing) {
  const DriverTable& d = s.driver();
  std::vector<DeviceBuffer> buffers;
  uint64_t total = 0;
  {
    auto lock = s.lockCalls();
    buffers = s.allocationList();
  }
  for (const DeviceBuffer& b : buffers) total += b.bytes;
  // Room for buffers allocated before t2 and module globals as well.
  const uint64_t reserve = total + total / 4 + (64u << 20);
  if (reserve > stagingBudget()) {
    return makeError(
        Code::kResourceExhausted,
        "soft recopy keeps a copy of the GPU memory in host memory: {} bytes needed, {} available",
        reserve, stagingBudget());
  }
  ASSIGN_OR_RETURN(staged, StagedWrite::reserve(d, reserve));
  if (!buffers.empty()) {
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(buffers.front().context),
                                 "making a context current"));
    staged->registerMemory();
    PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
  }
  recopier = std::make_shared<SoftRecopy>(d, buffers, staged->data(), staged->capacity(),
                                          image::kDefaultChunkBytes);
  RETURN_IF_ERROR(recopier->prepare());
  PhaseProgress phase(progress, "gpu-precopy", total);
  phase.start();
  uint64_t previous = UINT64_MAX;
  for (int round = 0; round < kRecopyRounds; ++round) {
    const uint64_t dirty = recopier->dirtyChunks();
    if (round > 0 && (dirty == 0 || dirty >= previous)) break;
    previous = dirty;
    // A write that passed the gate before its chunk is taken must have run
    // before the chunk is copied: the session's work drains first.
    RETURN_IF_ERROR(s.pause(kPauseTimeout, kCaptureWait));
    std::vector<uint64_t> taken;
    Status drained;
    {
      auto lock = s.lockCalls();
      drained = s.drainContexts();
      if (drained.isOk() && round == 0) {
        recopier->giveWayTo(&s.transfers());
        s.openWindow(
            [recopier, gate = recopier->gate()](const CallAccess& access) { gate(access); },
            ValidationMode::kValidate);
        // The job ran between the list above and the gate: what it freed
        // meanwhile passed no gate of ours, and its chunks may be unmapped
        // now (or another allocation's, of another size): they are not
        // copied. An allocation made meanwhile is one made in the window.
        const std::vector<DeviceBuffer> now = s.allocationList();
        const AccessGate ended = recopier->gate();
        for (const DeviceBuffer& b : buffers) {
          if (std::none_of(now.begin(), now.end(), [&](const DeviceBuffer& n) {
                return n.address == b.address && n.bytes == b.bytes;
              })) {
            ended({.writes = {{b.address, b.bytes}}, .ends = true});
          }
        }
      }
      if (drained.isOk()) taken = recopier->takeDirty();
    }
    s.resume();
    RETURN_IF_ERROR(drained);
    RETURN_IF_ERROR(recopier->copy(taken, [&](uint64_t n) { phase.advance(n); }));
    // A migration streams each round to the target while the job runs.
    if (outgoing == nullptr) continue;
    for (uint64_t index : taken) {
      const SoftRecopy::ChunkSlot c = recopier->slotOf(index);
      if (c.gone) continue;
      RETURN_IF_ERROR(outgoing->precopyChunk(c.address, {staged->data() + c.offset, c.bytes}));
    }
  }
  const SoftRecopyStats stats = recopier->stats();
  report = {{"rounds", stats.roundChunks.size()},
            {"round_chunks", stats.roundChunks},
            {"precopy_seconds", stats.precopySeconds},
            {"yielded_seconds", stats.yieldedSeconds}};
  return Status::ok();
}

// t2 (the session paused, its mutex held): its work drains, the twins'
// reports are read and the gate goes. A write outside the speculated
// buffers may have left a chunk clean that is not: then every chunk is
// copied again.
Status endRecopyWindow(Session& s, SoftRecopy& recopier, ValidationMode before, json& report) {
  RETURN_IF_ERROR(s.drainContexts());
  const std::vector<Violation> found = s.closeWindow(before);
  if (!found.empty()) {
    log::get("daemon")->warn(
        "session {}: {} access(es) outside the speculated buffers while copying (first: kernel "
        "{} at {}); every chunk is copied again",
        s.id(), found.size(), found.front().kernel, hex(found.front().address));
    recopier.markAllDirty();
  }
  const SoftRecopyStats stats = recopier.stats();
  report["misspeculations"] = found.size();
  report["anything_calls"] = stats.anythingCalls;
  report["dirty_chunks_at_quiesce"] = recopier.dirtyChunks();
  return Status::ok();
}

// One context of the session per device it uses, by device.
std::vector<std::pair<int, CUcontext>> sessionDevices(Session& s) {
  auto lock = s.lockCalls();
  const std::map<int, CUcontext> found = s.contextsByDevice();
  return {found.begin(), found.end()};
}

// Every device of the session with its buffers to save and its shadow
// reserve: `reserve` bytes, or half of the device's free memory (at least
// one chunk where there is room for one). The session is paused.
std::vector<DeviceSpace> shadowSpaces(Session& s, const std::vector<DeviceBuffer>& buffers,
                                      uint64_t reserve) {
  std::vector<DeviceSpace> spaces;
  for (const auto& [device, context] : sessionDevices(s)) {
    DeviceSpace space{device, context, 0, reserve};
    for (const DeviceBuffer& b : buffers) {
      if (b.device == device) space.checkpointBytes += b.bytes;
    }
    if (reserve == 0) {
      size_t free = 0, total = 0;
      if (PHOS_DRIVER(s.driver(), CtxSetCurrent)(context) == CUDA_SUCCESS) {
        PHOS_DRIVER(s.driver(), MemGetInfo_v2)(&free, &total);
      }
      space.reserveBytes =
          std::max<uint64_t>(free / 2, std::min<uint64_t>(image::kDefaultChunkBytes, free));
    }
    spaces.push_back(space);
  }
  PHOS_DRIVER(s.driver(), CtxSetCurrent)(nullptr);
  return spaces;
}

// Soft copy-on-write after the dump: the session serves again with the
// copy-on-write gate and its launches run as validator twins while every
// buffer of t1 is saved; then the twins' reports are read. A launch that
// wrote outside its speculated buffers fails it (report["misspeculations"]):
// the image cannot be trusted. With several devices, shadows that do not fit
// in a device's reserve go to peers as `peerOffload` plans over `links`.
Status saveConcurrently(Session& s, image::ImageWriter& writer, std::vector<DeviceBuffer> buffers,
                        uint64_t reserve, offload::Scheduler peerOffload,
                        const LinkBandwidths& links, const ProgressFn& progress, json& report,
                        std::chrono::steady_clock::time_point& resumedAt) {
  uint64_t total = 0;
  for (const DeviceBuffer& b : buffers) total += b.bytes;
  const std::vector<DeviceSpace> spaces = shadowSpaces(s, buffers, reserve);
  PeerShadowPlan plan;
  if (spaces.size() > 1) {
    auto planned = planPeerShadows(spaces, links, peerOffload, image::kDefaultChunkBytes);
    if (planned.isOk()) {
      plan = std::move(*planned);
    } else {
      // Without a plan the checkpoint is still right: no peer shadows.
      log::get("daemon")->warn("session {}: no peer offload: {}", s.id(),
                               planned.status().message());
      plan.report = {{"error", planned.status().message()}};
    }
  }
  auto protocol = std::make_shared<SoftCopyOnWrite>(s.driver(), writer, std::move(buffers), spaces,
                                                    plan.quota, image::kDefaultChunkBytes);
  const ValidationMode before = s.validator().mode();
  Status status = protocol->prepare();
  if (status.isOk()) {
    // The gate keeps the protocol alive: should the window fail to close
    // below, it stays installed (every chunk is saved, so it passes all).
    protocol->giveWayTo(&s.transfers());
    s.openWindow([protocol, gate = protocol->gate()](const CallAccess& access) { gate(access); },
                 ValidationMode::kValidate);
    s.setMemoryRelief([protocol](int device) { protocol->giveBack(device); });
  }
  s.resume();  // the application runs from here on
  resumedAt = std::chrono::steady_clock::now();
  if (status.isOk()) {
    PhaseProgress phase(progress, "gpu-memory", total);
    phase.start();
    status = protocol->run([&](uint64_t n) { phase.advance(n); });
  }
  // The window ends: the twins' reports of everything launched in it.
  std::vector<Violation> found;
  if (Status paused = s.pause(kPauseTimeout); paused.isOk()) {
    {
      auto lock = s.lockCalls();
      found = s.closeWindow(before);
    }
    s.resume();
  } else if (status.isOk()) {
    log::get("daemon")->warn("session {}: copy-on-write window not closed: {}", s.id(),
                             paused.message());
    status = makeError(Code::kFailedPrecondition,
                       "the window could not be closed to read the validator's reports: {}",
                       paused.message());
  }
  const SoftCowStats stats = protocol->stats();
  uint64_t reserveBytes = 0;
  for (const DeviceSpace& space : spaces) reserveBytes += space.reserveBytes;
  report = {{"shadowed_chunks", stats.shadowedChunks},
            {"shadowed_bytes", stats.shadowedBytes},
            {"reserve_bytes", reserveBytes},
            {"peak_reserve_bytes", stats.peakReserveBytes},
            {"peer_shadowed_chunks", stats.peerShadowedChunks},
            {"peer_shadowed_bytes", stats.peerShadowedBytes},
            {"waited_calls", stats.waitedCalls},
            {"waited_seconds", stats.waitedSeconds},
            {"given_back", stats.givenBack},
            {"anything_calls", stats.anythingCalls},
            {"copy_seconds", stats.copySeconds},
            {"yielded_seconds", stats.yieldedSeconds},
            {"misspeculations", found.size()}};
  if (!plan.report.is_null()) report["peer_offload"] = plan.report;
  if (status.isOk() && !found.empty()) {
    return makeError(Code::kFailedPrecondition,
                     "{} access(es) outside the speculated buffers while copying (first: kernel {} "
                     "at {})",
                     found.size(), found.front().kernel, hex(found.front().address));
  }
  return status;
}

// Soft recopy at t2, into `staged`: the chunks of `list` not clean in their
// slots already (those are only listed in `items`); a chunk without a slot
// goes at `offset`, which grows.
Status recopyDirty(const DriverTable& d, const SoftRecopy& recopier, StagedWrite& staged,
                   const std::vector<const DeviceBuffer*>& list, uint64_t& offset,
                   std::vector<StagedWrite::Item>& items, uint64_t& reused, uint64_t& recopied) {
  const size_t chunk = image::kDefaultChunkBytes;
  for (const DeviceBuffer* c : list) {
    for (uint64_t at = 0; at < c->bytes; at += chunk) {
      const uint64_t n = std::min<uint64_t>(chunk, c->bytes - at);
      if (auto clean = recopier.cleanSlot(c->address + at, n)) {
        items.push_back({c->blob, *clean, n, at / chunk});
        reused += n;
        continue;
      }
      uint64_t to = offset;
      if (auto slot = recopier.slot(c->address + at, n)) {
        to = *slot;
      } else {
        offset += n;
      }
      RETURN_IF_ERROR(driverStatus(
          PHOS_DRIVER(d, MemcpyDtoHAsync_v2)(staged.data() + to, c->address + at, n, nullptr),
          fmt::format("copying device memory at {}", hex(c->address + at))));
      items.push_back({c->blob, to, n, at / chunk});
      recopied += n;
    }
  }
  return Status::ok();
}

// Device memory, modules, globals and the description of every object.
// The session is paused and its mutex held.
// With `deferred`, nothing is copied: the buffers to save go there.
// With `recopier`, chunks it holds clean in `staged` are not copied again;
// `recopyReport` gets what was copied and what was reused.
Status captureDevice(Session& s, image::ImageWriter& writer, json& state, uint64_t& gpuBytes,
                     std::unique_ptr<StagedWrite>& staged, double& copySeconds,
                     const ProgressFn& progress, std::vector<DeviceBuffer>* deferred,
                     const SoftRecopy* recopier = nullptr, json* recopyReport = nullptr) {
  const DriverTable& d = s.driver();
  std::vector<DeviceBuffer> copies;
  RETURN_IF_ERROR(s.describe(writer, state, copies));
  // Arrays' texels, which describe() copied (session_arrays.h).
  for (const json& a : state.value("arrays", json::array())) {
    gpuBytes += a.value("bytes", uint64_t{0});
  }
  const std::map<int, CUcontext> contexts = s.contextsByDevice();
  auto contextOnDevice = [&](int device) -> CUcontext {
    auto it = contexts.find(device);
    return it == contexts.end() ? nullptr : it->second;
  };

  // The copies: into host memory when it has room (the application then
  // waits for the copy engine only), else chunk by chunk into the image.
  uint64_t total = 0;
  for (const DeviceBuffer& c : copies) total += c.bytes;
  if (deferred != nullptr) {
    for (const DeviceBuffer& c : copies) {
      CUcontext ctx = contextOnDevice(c.device);
      if (ctx == nullptr)
        return makeError(Code::kInternal, "device {} memory without a context of the session",
                         c.device);
      deferred->push_back({c.blob, c.address, c.bytes, ctx, c.device});
    }
    PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
    gpuBytes += total;
    return Status::ok();
  }
  PhaseProgress phase(progress, "gpu-memory", total);
  phase.start();
  std::map<int, std::vector<const DeviceBuffer*>> byDevice;
  for (const DeviceBuffer& c : copies) byDevice[c.device].push_back(&c);
  const size_t chunk = image::kDefaultChunkBytes;
  if (recopier != nullptr) {
    // The copy at t2 goes into the same memory: the chunks without a slot
    // after the slots.
    uint64_t unslotted = 0;
    for (const DeviceBuffer& c : copies) {
      for (uint64_t at = 0; at < c.bytes; at += chunk) {
        const uint64_t n = std::min<uint64_t>(chunk, c.bytes - at);
        if (!recopier->slot(c.address + at, n)) unslotted += n;
      }
    }
    if (staged == nullptr || staged->capacity() < recopier->slotBytes() + unslotted)
      recopier = nullptr;
  }
  const bool stage = recopier != nullptr || total <= stagingBudget();
  if (stage && !byDevice.empty()) {
    // Reserved before the pause for what the session had then; more was
    // allocated since: reserve again (now, while the application waits).
    if (recopier == nullptr && (staged == nullptr || staged->capacity() < total)) {
      staged.reset();
      ASSIGN_OR_RETURN(staged, StagedWrite::reserve(d, total));
    }
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(contextOnDevice(byDevice.begin()->first)),
                     "making a context current"));
    staged->registerMemory();
  } else {
    staged.reset();
  }
  const auto copyStart = std::chrono::steady_clock::now();
  std::vector<StagedWrite::Item> items;
  uint64_t offset = recopier != nullptr ? recopier->slotBytes() : 0, advanced = 0;
  uint64_t reused = 0, recopied = 0;
  for (const auto& [device, list] : byDevice) {
    CUcontext ctx = contextOnDevice(device);
    if (ctx == nullptr)
      return makeError(Code::kInternal, "device {} memory without a context of the session",
                       device);
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(ctx), "making a context current"));
    if (stage && recopier != nullptr) {
      RETURN_IF_ERROR(recopyDirty(d, *recopier, *staged, list, offset, items, reused, recopied));
      RETURN_IF_ERROR(
          driverStatus(PHOS_DRIVER(d, CtxSynchronize)(), "waiting for the device copies"));
      uint64_t bytes = 0;
      for (const DeviceBuffer* c : list) bytes += c->bytes;
      phase.advance(bytes);
      continue;
    }
    if (stage) {
      for (const DeviceBuffer* c : list) {
        RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, MemcpyDtoHAsync_v2)(
                                         staged->data() + offset, c->address, c->bytes, nullptr),
                                     fmt::format("copying device memory at {}", hex(c->address))));
        items.push_back({c->blob, offset, c->bytes});
        offset += c->bytes;
      }
      RETURN_IF_ERROR(
          driverStatus(PHOS_DRIVER(d, CtxSynchronize)(), "waiting for the device copies"));
      phase.advance(offset - advanced);
      advanced = offset;
      continue;
    }
    ChunkCopier copier(d, image::kDefaultChunkBytes);
    RETURN_IF_ERROR(copier.prepare());
    for (const DeviceBuffer* c : list) {
      RETURN_IF_ERROR(copier.save(writer, c->blob, c->address, c->bytes,
                                  [&](uint64_t n) { phase.advance(n); }));
    }
  }
  copySeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - copyStart).count();
  if (recopyReport != nullptr) {
    (*recopyReport)["reused_bytes"] = reused;
    (*recopyReport)["recopied_bytes"] = recopier != nullptr ? recopied : total;
  }
  PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
  if (staged != nullptr) staged->plan(writer, std::move(items));
  gpuBytes += total;
  return Status::ok();
}

}  // namespace

CheckpointProtocol::CheckpointProtocol(Session& session, const ProtocolOptions& options,
                                       const ProgressFn& progress, CheckpointTimes& times)
    : s_(session), options_(options), progress_(progress), times_(times) {}

CheckpointProtocol::~CheckpointProtocol() = default;

void CheckpointProtocol::reserveStaging() {
  // Module globals may need a little more.
  if (const uint64_t expected = s_.info().deviceBytes + (1u << 20); expected <= stagingBudget()) {
    if (auto reserved = StagedWrite::reserve(s_.driver(), expected); reserved.isOk())
      staged_ = std::move(*reserved);
  }
}

Status CheckpointProtocol::beforeDump() {
  times_.beforeDump = Clock::now();
  s_.listModuleGlobals();
  return prepare();
}

Status CheckpointProtocol::beforeFreeze(image::ImageWriter& writer) {
  times_.pauseAsked = Clock::now();
  RETURN_IF_ERROR(s_.pause(kPauseTimeout, kCaptureWait));
  paused_ = true;
  times_.paused = Clock::now();
  auto lock = s_.lockCalls();
  const char* snapshot = std::getenv("PHOS_TEST_REFERENCE_SNAPSHOT");
  RETURN_IF_ERROR(capture(writer, snapshot != nullptr ? snapshot : ""));
  // The staged chunks are written into the image while CRIU dumps when the
  // job ends with the dump; a job left running gets the CPU for CRIU's
  // freeze, and the writes start once it runs again (afterDump).
  if (staged_ != nullptr && !options_.leaveRunning) staged_->start();
  times_.captured = Clock::now();
  return Status::ok();
}

Status CheckpointProtocol::whileFrozen(image::ImageWriter& writer) {
  auto lock = s_.lockCalls();
  return s_.describeShared(writer, state_, gpuBytes_, progress_);
}

void CheckpointProtocol::afterDump(bool dumped) {
  times_.dumped = Clock::now();
  // Without --leave-running the process is gone after a good dump: its
  // calls are never served again (the worker frees the session).
  if (paused_ && (!dumped || options_.leaveRunning)) {
    s_.resume();
    times_.resumed = Clock::now();
  }
  paused_ = paused_ && dumped && !options_.leaveRunning;
  // The staged device memory reaches the image (the application may run
  // meanwhile); commit follows.
  if (staged_ != nullptr) {
    if (dumped) {
      written_ = staged_->finish(progress_);
    } else {
      staged_->abandon();
    }
    staged_.reset();
  }
  times_.saved = Clock::now();
}

void CheckpointProtocol::finish(bool succeeded) {
  if (paused_ && !succeeded) s_.resume();  // a failure after the dump
  if (!succeeded) paused_ = false;
}

json CheckpointProtocol::copyOnWriteReport() const {
  return cowReport_.is_null() ? json::object() : cowReport_;
}

json CheckpointProtocol::recopyReport() const {
  return recopyReport_.is_null() ? json::object() : recopyReport_;
}

namespace {

class StopTheWorld : public CheckpointProtocol {
 public:
  StopTheWorld(Session& session, const ProtocolOptions& options, const ProgressFn& progress,
               CheckpointTimes& times)
      : CheckpointProtocol(session, options, progress, times) {}
  const char* name() const override { return "stop-the-world"; }

  Status prepare() override {
    reserveStaging();
    return Status::ok();
  }

 protected:
  Status capture(image::ImageWriter& writer, const std::string&) override {
    return captureDevice(s_, writer, state_, gpuBytes_, staged_, copySeconds_, progress_, nullptr);
  }
};

class CopyOnWrite : public CheckpointProtocol {
 public:
  CopyOnWrite(Session& session, const ProtocolOptions& options, const ProgressFn& progress,
              CheckpointTimes& times)
      : CheckpointProtocol(session, options, progress, times) {}
  const char* name() const override { return "soft-copy-on-write"; }

  Status prepare() override {
    // The window validates every launch: its twins compiled now, while the
    // application runs, not by its first launches in the window.
    s_.prepareTwinModules();
    // Several devices: their links, measured (once per worker) while the
    // application still runs.
    if (auto devices = sessionDevices(s_); devices.size() > 1) {
      links_ = measureLinks(s_.driver(), devices, image::kDefaultChunkBytes);
    }
    return Status::ok();
  }

  void afterDump(bool dumped) override {
    if (!dumped || !paused_) return CheckpointProtocol::afterDump(dumped);
    times_.dumped = Clock::now();
    written_ =
        saveConcurrently(s_, *writer_, std::move(buffers_), options_.cowReserveBytes,
                         options_.peerOffload, links_, progress_, cowReport_, times_.resumed);
    paused_ = false;
    copySeconds_ = cowReport_.value("copy_seconds", 0.0);
    times_.saved = Clock::now();
  }

  // (The report is null when the checkpoint failed before its copy began.)
  std::optional<std::string> retryStopTheWorld() const override {
    if (cowReport_.is_object() && cowReport_.value("misspeculations", 0) > 0)
      return written_.message();
    return std::nullopt;
  }

 protected:
  // t1: the buffers are listed, saved after the dump.
  Status capture(image::ImageWriter& writer, const std::string& snapshot) override {
    writer_ = &writer;
    RETURN_IF_ERROR(
        captureDevice(s_, writer, state_, gpuBytes_, staged_, copySeconds_, progress_, &buffers_));
    if (!snapshot.empty()) RETURN_IF_ERROR(writeReferenceSnapshot(s_, buffers_, snapshot));
    return Status::ok();
  }

 private:
  std::vector<DeviceBuffer> buffers_;  // of t1, saved after the dump
  LinkBandwidths links_;
  image::ImageWriter* writer_ = nullptr;
};

class Recopy : public StopTheWorld {
 public:
  Recopy(Session& session, const ProtocolOptions& options, const ProgressFn& progress,
         CheckpointTimes& times)
      : StopTheWorld(session, options, progress, times),
        validationBefore_(session.validator().mode()) {}
  const char* name() const override { return fellBack_ ? "stop-the-world" : "soft-recopy"; }

  Status prepare() override {
    s_.prepareTwinModules();
    Status copied = precopy(s_, staged_, recopier_, progress_, recopyReport_, options_.outgoing);
    if (copied.isOk() || copied.code() != Code::kResourceExhausted) return copied;
    // No host memory for a copy of the GPU state: stop-the-world, said in the report.
    log::get("daemon")->warn("session {}: {}; checkpointing stop-the-world", s_.id(),
                             copied.message());
    recopyReport_ = {{"fallback", copied.message()}};
    fellBack_ = true;
    reserveStaging();
    return Status::ok();
  }

  void finish(bool succeeded) override {
    CheckpointProtocol::finish(succeeded);
    // A failure before t2: the window closes without a copy.
    if (!fellBack_ && s_.hasAccessGate() && s_.pause(kPauseTimeout).isOk()) {
      {
        auto lock = s_.lockCalls();
        s_.closeWindow(validationBefore_);
      }
      s_.resume();
    }
  }

  bool restoresEagerly() const override { return fellBack_; }

 protected:
  // t2: what is still dirty is copied; the rest is in host memory already.
  Status capture(image::ImageWriter& writer, const std::string& snapshot) override {
    if (fellBack_) return StopTheWorld::capture(writer, snapshot);
    RETURN_IF_ERROR(endRecopyWindow(s_, *recopier_, validationBefore_, recopyReport_));
    if (!snapshot.empty())
      RETURN_IF_ERROR(writeReferenceSnapshot(s_, s_.allocationList(), snapshot));
    return captureDevice(s_, writer, state_, gpuBytes_, staged_, copySeconds_, progress_, nullptr,
                         recopier_.get(), &recopyReport_);
  }

 private:
  const ValidationMode validationBefore_;
  // The host copy of the buffers, kept fresh while the job runs.
  std::shared_ptr<SoftRecopy> recopier_;
  bool fellBack_ = false;
};

}  // namespace

std::unique_ptr<CheckpointProtocol> CheckpointProtocol::make(const std::string& mode,
                                                             Session& session,
                                                             const ProtocolOptions& options,
                                                             const ProgressFn& progress,
                                                             CheckpointTimes& times) {
  // Copy-on-write lets the application run while its GPU state is saved; a
  // process that ends with the dump has nothing to run.
  if (mode == "cow" && options.leaveRunning)
    return std::make_unique<CopyOnWrite>(session, options, progress, times);
  if (mode == "recopy") return std::make_unique<Recopy>(session, options, progress, times);
  return std::make_unique<StopTheWorld>(session, options, progress, times);
}

}  // namespace phos::daemon
