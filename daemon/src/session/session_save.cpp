// SPDX-License-Identifier: Apache-2.0
// A session at a checkpoint: what the engine (engine.cpp) asks of it. What a
// checkpoint writes of its objects (Session::describe), domain by domain: the
// description a restore makes each object again from (session_rebuild.cpp),
// the device memory to copy into the image, and the files it shares with its
// process (describeShared); the windows of the concurrent protocols.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "session/module_globals.h"
#include "session/host_calls.h"
#include "phos/common/log.h"
#include "phos/image/writer.h"
#include "session/session.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

class Session::Describer {
 public:
  Describer(Session& s, image::ImageWriter& writer, json& state, std::vector<DeviceBuffer>& copies)
      : s_(s),
        d_(s.driver_),
        scope_{s.driver_, s.handles_, s.contexts_, s.currentContext_},
        writer_(writer),
        state_(state),
        copies_(copies) {}

  Status run() {
    state_ = {{"session", s_.id_},      {"pid", s_.pid()},
              {"uid", s_.uid_},         {"driver", d_.path()},
              {"worker_pid", getpid()}, {"handles_last_serial", s_.handles_.lastSerial()}};
    RETURN_IF_ERROR(contexts());
    // The stream-ordered allocator's pools (memory_pools.h).
    s_.memoryPools_.save(s_, state_);
    // The application's VMM (application_vmm.h): its mappings' bytes are
    // allocations, saved below.
    s_.vmm_.save(state_, lost_);
    s_.rehomeMappings();
    for (const auto& [address, a] : s_.memory_.allocations()) {
      if (a.physical != 0 && a.context == 0) {
        lost_.push_back(
            {{"id", address}, {"what", "a VMM mapping of a device with no context left"}});
      }
    }
    // What is copied: allocations, then module globals (modules()).
    RETURN_IF_ERROR(s_.memory_.save(writer_, state_, copies_));
    RETURN_IF_ERROR(s_.modules_.save(scope_, {writer_, copies_, s_.memory_, s_.pool_.deviceCount(), lost_}, state_));
    RETURN_IF_ERROR(s_.streamsAndEvents_.save(scope_, state_));
    for (const auto& [stream, what] : s_.streamsAndEvents_.unsavedAttributes()) {
      lost_.push_back({{"id", stream}, {"what", what + ", which the engine does not save"}});
    }
    RETURN_IF_ERROR(s_.links_.save(writer_, state_));
    s_.graphs_.save(scope_, state_, lost_);
    s_.userObjects_.save(state_, lost_);
    // Arrays' texels are copied here, at the cut: no protocol tracks them.
    RETURN_IF_ERROR(s_.arrays_.save(scope_, writer_, state_, lost_));
    unsaved();
    // A checkpoint that cannot save an object the program holds fails, naming
    // it, rather than publish an image whose restore would run wrong.
    if (!lost_.empty()) {
      std::string named;
      for (const json& l : lost_) {
        if (!named.empty()) named += "; ";
        named += fmt::format("{} ({})", l["what"].get<std::string>(), hex(l["id"].get<uint64_t>()));
      }
      return makeError(Code::kFailedPrecondition,
                       "the checkpoint cannot save {} object{} the program holds: {}", lost_.size(),
                       lost_.size() == 1 ? "" : "s", named);
    }
    // An error of a posted call not reported yet: the next synchronizing call
    // of the restored process reports it, as it would have.
    state_["deferred_error"] = static_cast<int>(s_.deferred_);
    // `phos run --validate`: the restored session validates as well.
    state_["validate"] = s_.validator_.mode() == ValidationMode::kValidate;
    return Status::ok();
  }

 private:
  // Every context, drained: nothing may write device memory while it is
  // copied. Its flags, limits and cache preference; the primary contexts'
  // references.
  Status contexts() {
    RETURN_IF_ERROR(s_.drainContexts());
    RETURN_IF_ERROR(s_.contexts_.save(d_, state_));
    s_.currentReal_ = nullptr;  // changed above; the next call makes its own current
    return Status::ok();
  }

  // Objects of a kind the engine does not save (a kind remoted later and
  // not taught to the engine): restored, the program would hold handles
  // that name nothing.
  void unsaved() {
    static const std::set<HandleType> kSaved = {
        HandleType::kCUctx_st,           HandleType::kCUevent_st,     HandleType::kCUfunc_st,
        HandleType::kCUkern_st,          HandleType::kCUlib_st,       HandleType::kCUmod_st,
        HandleType::kCUmemPoolHandle_st, HandleType::kCUstream_st,    HandleType::kCUlinkState_st,
        HandleType::kCUgraph_st,         HandleType::kCUgraphExec_st, HandleType::kCUgraphNode_st,
        HandleType::kCUarray_st,         HandleType::kCUuserObject_st};
    for (HandleType type : s_.handles_.liveTypes()) {
      if (kSaved.count(type) != 0) continue;
      for (uint64_t id : s_.handles_.ids(type)) {
        lost_.push_back(
            {{"id", id},
             {"what", fmt::format("an object of type {}, which the engine does not save",
                                  handleTypeName(type))}});
      }
    }
  }

  Session& s_;
  const DriverTable& d_;
  SessionScope scope_;
  image::ImageWriter& writer_;
  json& state_;
  std::vector<DeviceBuffer>& copies_;
  json lost_ = json::array();  // what cannot be saved (refused at the end)
};

Status Session::describe(image::ImageWriter& writer, json& state,
                         std::vector<DeviceBuffer>& copies) {
  return Describer(*this, writer, state, copies).run();
}

Status Session::drainContexts() {
  // Synchronizing a context invalidates the captures of its streams: the
  // application's capture would fail because of a checkpoint.
  if (captures_.active() != 0) {
    return makeError(
        Code::kFailedPrecondition,
        "{} stream capture{} in progress: phosd cannot wait for the session's work without "
        "invalidating {} (checkpoint after cuStreamEndCapture)",
        captures_.active(), captures_.active() == 1 ? " is" : "s are",
        captures_.active() == 1 ? "it" : "them");
  }
  // A stream held by a stream memory wait would hold the drain forever; a
  // synchronization answered later would leave its caller without an answer
  // in the image.
  if (auto wait = streamWaits_.describePending(driver_)) {
    return makeError(
        Code::kFailedPrecondition,
        "{}: phosd cannot wait for the session's work while a stream memory wait holds it "
        "(checkpoint once the word is written)",
        *wait);
  }
  if (!deferredCalls_.empty()) {
    return makeError(
        Code::kFailedPrecondition,
        "{} synchronization{} of the application still wait{} for work behind a stream memory wait",
        deferredCalls_.size(), deferredCalls_.size() == 1 ? "" : "s",
        deferredCalls_.size() == 1 ? "s" : "");
  }
  Status drained = contexts_.drain(driver_);
  currentReal_ = nullptr;  // the next call makes its own current
  return drained;
}

std::vector<DeviceBuffer> Session::allocationList() const { return memory_.buffers(contexts_); }

std::map<int, CUcontext> Session::contextsByDevice() const { return contexts_.byDevice(); }

void Session::openWindow(AccessGate gate, ValidationMode twins) {
  setAccessGate(std::move(gate));
  validator_.setMode(twins);
  transfers_.track(true);
}

std::vector<Violation> Session::closeWindow(ValidationMode after) {
  (void)drainContexts();  // a context's sticky error is the application's to see
  std::vector<Violation> found = validator_.collect();
  if (after == ValidationMode::kOff) validator_.releaseReports();
  setAccessGate({});
  setMemoryRelief({});
  validator_.setMode(after);
  transfers_.track(false);
  return found;
}

// Parsing a large module's PTX took most of CuPy's pause
// (docs/checkpoint.md): the images are copied under the mutex and parsed
// without it; a module that cannot be read is left for describe() to refuse.
void Session::listModuleGlobals() {
  std::vector<std::pair<uint64_t, std::vector<char>>> unlisted;
  {
    std::lock_guard lock(mutex_);
    unlisted = modules_.unlisted();
  }
  for (auto& [id, image] : unlisted) {
    auto names = moduleGlobalNames(image);
    if (!names.isOk()) continue;
    auto listed = std::make_shared<const std::vector<std::string>>(std::move(*names));
    std::lock_guard lock(mutex_);
    modules_.setGlobalNames(id, std::move(listed));
  }
}

Status Session::describeShared(image::ImageWriter& writer, json& state, uint64_t& bytes,
                               const ProgressFn& progress) {
  if (auto lane = busyLane()) {
    return makeError(
        Code::kFailedPrecondition,
        "a thread of pid {} is inside a copy through transfer lane {} of its ring, which phosd "
        "gave up on (the thread was stopped in it?): the image could not give the thread the "
        "lane's bytes back; checkpoint again once the copy has returned",
        pid(), *lane);
  }
  const uint64_t total = pinned_.bytes();
  PhaseProgress phase(progress, "pinned", total);
  phase.start();
  ASSIGN_OR_RETURN(state["pinned"], pinned_.save(writer, phase));
  bytes += total;
  if (ring_.has_value()) {
    auto snap = ring_->snapshot();
    const ipc::RingGeometry& geometry = ring_->geometry();
    ASSIGN_OR_RETURN(size_t blob, writer.addBlob("session/ring", "call-ring", snap.bytes.size()));
    RETURN_IF_ERROR(writer.writeBlob(blob, snap.bytes));
    state["ring"] = {{"path", ringPath_},
                     {"blob", "session/ring"},
                     {"read_position", snap.readPosition},
                     {"slot_count", geometry.slotCount},
                     {"slot_bytes", geometry.slotBytes},
                     {"lane_count", geometry.laneCount},
                     {"lane_slot_bytes", geometry.laneSlotBytes}};
  }
  std::lock_guard lock(hostCallsMutex_);
  if (hostCalls_ != nullptr) {
    auto queue = hostCalls_->bytes();
    ASSIGN_OR_RETURN(size_t blob, writer.addBlob("session/hostcalls", "host-call-queue", queue.size()));
    RETURN_IF_ERROR(writer.writeBlob(blob, queue));
    state["host_calls"] = {{"path", hostCalls_->path()}, {"blob", "session/hostcalls"}};
  }
  return Status::ok();
}

}  // namespace phos::daemon
