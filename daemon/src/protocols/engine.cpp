// SPDX-License-Identifier: Apache-2.0
// The checkpoint/restore engine of a phosd worker (engine.h).
//
// Checkpoint: the request is parsed once; its protocol
// (checkpoint_protocols.h: stop-the-world, soft copy-on-write or soft
// recopy) runs at each moment of CRIU's dump (CheckpointHooks) and saves the
// session's GPU state with it; a migration sends the image to its target as
// it is made (migration.h). The manifest's state.gpu.sessions[0] describes
// everything a restore re-creates (Session::describe, docs/checkpoint.md).
//
// Restore, in a fresh worker: the image is opened as its requester may
// (docs/security.md), the session made again from it
// (Session::rebuildFrom: contexts from the pool, device memory mapped back at
// its addresses, modules, streams and events under the ids the application
// holds, the shared-memory files at their paths before CRIU maps them), and,
// for a concurrent restore, its device memory loaded while it runs.
#include "protocols/engine.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>

#include "protocols/checkpoint_protocols.h"
#include "protocols/device_copy.h"
#include "session/host_calls.h"
#include "migration/migration.h"
#include "session/module_globals.h"
#include "protocols/on_demand_restore.h"
#include "protocols/peer_offload.h"
#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "phos/common/unique_fd.h"
#include "phos/criu/checkpoint.h"
#include "session/session.h"
#include "session/session_image.h"
#include "protocols/soft_cow.h"
#include "protocols/soft_recopy.h"
#include "session/staging_buffer.h"

namespace phos::daemon {

using json = nlohmann::json;

namespace {

// The driver entry points the engine calls beyond those phosd needs to run:
// a driver without one (older than CUDA 12.4) cannot checkpoint.
Status requireEntryPoints(const DriverTable& d) {
  using cuda_api::EntryPointId;
  static constexpr std::pair<EntryPointId, const char*> kNeeded[] = {
      {EntryPointId::kCuCtxGetFlags, "cuCtxGetFlags"},
      {EntryPointId::kCuCtxGetLimit, "cuCtxGetLimit"},
      {EntryPointId::kCuCtxSetLimit, "cuCtxSetLimit"},
      {EntryPointId::kCuCtxGetCacheConfig, "cuCtxGetCacheConfig"},
      {EntryPointId::kCuCtxSetCacheConfig, "cuCtxSetCacheConfig"},
      {EntryPointId::kCuFuncGetName, "cuFuncGetName"},
      {EntryPointId::kCuFuncGetModule, "cuFuncGetModule"},
      {EntryPointId::kCuKernelGetName, "cuKernelGetName"},
      {EntryPointId::kCuKernelGetLibrary, "cuKernelGetLibrary"},
      {EntryPointId::kCuLibraryGetModule, "cuLibraryGetModule"},
      {EntryPointId::kCuLibraryGetGlobal, "cuLibraryGetGlobal"},
      {EntryPointId::kCuLibraryGetKernel, "cuLibraryGetKernel"},
      {EntryPointId::kCuLibraryLoadData, "cuLibraryLoadData"},
      {EntryPointId::kCuStreamGetFlags, "cuStreamGetFlags"},
      {EntryPointId::kCuStreamGetPriority, "cuStreamGetPriority"},
      {EntryPointId::kCuStreamCreateWithPriority, "cuStreamCreateWithPriority"},
      {EntryPointId::kCuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync"},
      {EntryPointId::kCuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync"},
      {EntryPointId::kCuModuleGetGlobal_v2, "cuModuleGetGlobal"},
      {EntryPointId::kCuModuleGetFunction, "cuModuleGetFunction"},
      {EntryPointId::kCuCtxGetCurrent, "cuCtxGetCurrent"},
  };
  for (const auto& [id, name] : kNeeded) {
    if (!d.has(id)) {
      return makeError(Code::kNotSupported, "the driver {} has no {}, which checkpoints need",
                       d.path(), name);
    }
  }
  return Status::ok();
}

// The codes the CLI tells apart (bad input, exit 2, or a failure, exit 1).
json failure(const Status& s) {
  return {{"ok", false}, {"error", s.message()}, {"code", wireCode(s.code())}};
}

// Whether `uid` may create entries in `dir` (its owner with write permission,
// or anyone with write permission for others; group membership is not
// looked up: a group-writable directory of another owner is refused).
Status writableBy(const std::filesystem::path& dir, uid_t uid) {
  struct stat st {};
  const std::filesystem::path where = dir.empty() ? std::filesystem::path(".") : dir;
  if (stat(where.c_str(), &st) != 0)
    return errnoError(errno, fmt::format("cannot use {}", where.string()));
  const bool owner = st.st_uid == uid && (st.st_mode & S_IWUSR) != 0;
  const bool anyone = (st.st_mode & S_IWOTH) != 0;  // /tmp
  if (owner || anyone) return Status::ok();
  return makeError(Code::kPermissionDenied, "uid {} may not write into {}", uid, where.string());
}

// ---- checkpoint ----------------------------------------------------------
// A checkpoint request (engine.h), parsed once: what the engine does with
// it, and every way it can be wrong, before anything is done.
struct CheckpointRequest {
  std::filesystem::path image;
  std::string mode = "stop";
  bool leaveRunning = false;
  image::Codec codec = image::Codec::kNone;
  uid_t peerUid = 0;            // the uid that asked (0: root, or phosd itself)
  std::optional<json> migrate;  // {"to": "HOST:PORT", "key": HEX, "compress"}
  uint64_t cowReserveBytes = 0;
  offload::Scheduler peerOffload = offload::Scheduler::kExact;
  bool criuPlugin = false;  // CRIU runs elsewhere, with PhOS's plugin
};

Result<CheckpointRequest> parseRequest(const json& request) {
  CheckpointRequest r;
  if (!request.contains("image") || !request["image"].is_string() ||
      request["image"].get<std::string>().empty()) {
    return makeError(Code::kInvalidArgument, "checkpoint needs an \"image\" directory");
  }
  r.image = request["image"].get<std::string>();
  if (request.contains("migrate")) r.migrate = request["migrate"];
  r.peerUid = request.value("peer_uid", uid_t{0});
  r.leaveRunning = request.value("leave_running", false);
  ASSIGN_OR_RETURN(r.codec, image::parseCodec(request.value("compress", std::string("none"))));
  if (request.contains("mode") && request["mode"].is_string())
    r.mode = request["mode"].get<std::string>();
  if (r.mode != "cow" && r.mode != "stop" && r.mode != "recopy") {
    return makeError(Code::kInvalidArgument,
                     "checkpoint mode must be \"cow\", \"recopy\" or \"stop\", not \"{}\"", r.mode);
  }
  // Copy-on-write lets the application run while its GPU state is saved;
  // a process that ends with the dump has nothing to run. Recopy copies
  // while it runs before the dump, so it serves both.
  if (r.migrate) {
    if (r.mode == "cow") {
      return makeError(Code::kInvalidArgument,
                       "a migration copies with \"recopy\" or \"stop\", not \"cow\"");
    }
    r.leaveRunning = false;  // the job ends here once the target runs it
  }
  if (request.contains("criu_plugin") && !request["criu_plugin"].is_boolean()) {
    return makeError(Code::kInvalidArgument, "criu_plugin must be true or false");
  }
  r.criuPlugin = request.value("criu_plugin", false);
  if (r.criuPlugin) {
    // CRIU 4.1 lets the process go only after its plugins' last step, which
    // is where copy-on-write's copies would end: it would stall the job as
    // long as stop-the-world does (docs/containers.md).
    if (r.mode != "stop" || r.migrate) {
      return makeError(Code::kInvalidArgument,
                       "a checkpoint through CRIU's plugin is stop-the-world, not \"{}\"",
                       r.migrate ? "migrate" : r.mode);
    }
    // Whether CRIU ends the process is CRIU's to say: the session runs on
    // after the dump and ends with its process, if CRIU kills it.
    r.leaveRunning = true;
  }
  r.cowReserveBytes = request.value("cow_reserve_bytes", uint64_t{0});
  if (request.contains("peer_offload")) {
    if (!request["peer_offload"].is_string()) {
      return makeError(Code::kInvalidArgument, "peer_offload must be a string");
    }
    ASSIGN_OR_RETURN(r.peerOffload,
                     offload::parseScheduler(request["peer_offload"].get<std::string>()));
  }
  return r;
}

// The report of a checkpoint that succeeded (docs/checkpoint.md, "Where the
// time goes").
json checkpointReport(const checkpoint::CheckpointReport& report, const CheckpointProtocol& p,
                      const CheckpointTimes& times, bool leaveRunning) {
  using Clock = CheckpointTimes::Clock;
  // How long the application's GPU calls waited: from the pause to the
  // resume (--leave-running), or to the end of the dump that ended it.
  const double stall =
      times.paused == Clock::time_point{}
          ? 0.0
          : std::chrono::duration<double>(
                (times.resumed != Clock::time_point{} ? times.resumed : Clock::now()) -
                times.paused)
                .count();
  auto seconds = [](Clock::time_point from, Clock::time_point to) {
    if (from == Clock::time_point{} || to == Clock::time_point{}) return 0.0;
    return std::chrono::duration<double>(to - from).count();
  };
  // The parts of the stall, in order; with the job ended by the dump,
  // "after_dump" is not a stall (nothing of it is served again).
  json stallParts = {{"quiesce_seconds", seconds(times.pauseAsked, times.paused)},
                     {"capture_seconds", seconds(times.paused, times.captured)},
                     {"criu_seconds", seconds(times.captured, times.dumped)},
                     {"after_dump_seconds", seconds(times.dumped, times.resumed)}};
  // Seconds from the request's start to each boundary it reached, in order.
  json timeline = json::object();
  const std::pair<const char*, Clock::time_point> boundaries[] = {{"before_dump", times.beforeDump},
                                                                  {"pause_asked", times.pauseAsked},
                                                                  {"paused", times.paused},
                                                                  {"captured", times.captured},
                                                                  {"dumped", times.dumped},
                                                                  {"resumed", times.resumed},
                                                                  {"saved", times.saved},
                                                                  {"finished", Clock::now()}};
  for (const auto& [name, at] : boundaries) {
    if (at != Clock::time_point{}) timeline[name] = seconds(times.started, at);
  }
  return {{"pid", report.pid},
          {"stall", stallParts},
          {"timeline", timeline},
          {"image", report.image.string()},
          {"cpu_bytes", report.cpuBytes},
          {"cpu_files", report.cpuFiles},
          {"gpu_bytes", p.gpuBytes()},
          {"freeze_seconds", report.freezeSeconds},
          {"total_seconds", report.totalSeconds},
          {"left_running", leaveRunning},
          {"gpu_stall_seconds", stall},
          {"gpu_copy_seconds", p.copySeconds()},
          {"copy_on_write", p.copyOnWriteReport()},
          {"recopy", p.recopyReport()}};
}

// The source's end of a migration: {"to": "HOST:PORT", "key": HEX}.
Result<std::unique_ptr<migration::Outgoing>> connectForMigration(const json& m) {
  if (!m.is_object() || !m.contains("to") || !m["to"].is_string() || !m.contains("key") ||
      !m["key"].is_string()) {
    return makeError(Code::kInvalidArgument, "a migration needs \"to\" and \"key\"");
  }
  ASSIGN_OR_RETURN(net::Key key, net::Key::fromHex(m["key"].get<std::string>()));
  ASSIGN_OR_RETURN(auto outgoing, migration::Outgoing::connect(m["to"].get<std::string>(), key));
  outgoing->setCompression(m.value("compress", true));
  return outgoing;
}

// Downtime (docs/migration.md): from the final quiesce here to the first
// call the target executed for the job.
json migrationReport(const migration::Outgoing& outgoing,
                     std::chrono::steady_clock::time_point pausedAt) {
  json report = outgoing.stats();
  const json& target = outgoing.targetReport();
  report["target_report"] = target;
  if (pausedAt != std::chrono::steady_clock::time_point{}) {
    // The stopped job's image is written here (CRIU's dump and the device
    // memory) before the hand-over begins.
    report["dump_seconds"] =
        std::chrono::duration<double>(outgoing.handOverAt() - pausedAt).count();
  }
  if (pausedAt != std::chrono::steady_clock::time_point{} && target.contains("running_seconds")) {
    // Up to the first call the target served: the call the job was waiting
    // in at the quiesce may itself wait there for memory still arriving.
    const json load = target.value("concurrent_load", json::object());
    report["downtime_seconds"] = std::chrono::duration<double>(outgoing.goAt() - pausedAt).count() +
                                 target.value("running_seconds", 0.0) +
                                 load.value("first_call_seconds", 0.0);
  }
  return report;
}

json runCheckpoint(Session& s, const json& request, const ProgressFn& progress,
                   const checkpoint::PluginSteps* plugin) {
  auto parsed = parseRequest(request);
  if (!parsed.isOk()) return failure(parsed.status());
  const CheckpointRequest& r = *parsed;
  if (r.criuPlugin != (plugin != nullptr)) {
    return failure(makeError(Code::kInvalidArgument, "{}",
                             r.criuPlugin
                                 ? "criu_plugin: this connection reports no CRIU steps"
                                 : "CRIU steps reported for a checkpoint phosd runs itself"));
  }
  if (Status usable = requireEntryPoints(s.driver()); !usable.isOk()) return failure(usable);
  checkpoint::CheckpointOptions options;
  options.image = r.image;
  options.leaveRunning = r.leaveRunning;
  options.codec = r.codec;
  // Live migration (migration.h): the image is phosd's own, in its runtime
  // directory, and goes to the target once published.
  std::unique_ptr<migration::Outgoing> outgoing;
  if (r.migrate) {
    auto connected = connectForMigration(*r.migrate);
    if (!connected.isOk()) return failure(connected.status());
    outgoing = std::move(*connected);
  }
  // phosd may run as root for users who are not: the image goes only where
  // the asking user could write it.
  if (r.peerUid != 0 && !outgoing) {
    if (Status allowed = writableBy(options.image.parent_path(), r.peerUid); !allowed.isOk())
      return failure(allowed);
    // ... and it is theirs: a user restores only image directories it owns.
    if (geteuid() == 0) options.owner = r.peerUid;
  }
  // The protocols' streams outlive any context the job destroys meanwhile
  // (its end, a cuCtxDestroy): held before the protocol, released after it.
  ContextPool::Hold contextsKept(s.pool());
  CheckpointTimes times;
  const ProtocolOptions protocolOptions{r.leaveRunning, outgoing.get(), r.cowReserveBytes,
                                        r.peerOffload};
  std::unique_ptr<CheckpointProtocol> protocol =
      CheckpointProtocol::make(r.mode, s, protocolOptions, progress, times);
  CheckpointProtocol& p = *protocol;
  options.protocol = p.name();
  options.hooks.progress = progress;
  options.hooks.beforeDump = [&](image::ImageWriter&) {
    Status prepared = p.beforeDump();
    options.protocol = p.name();  // a recopy without host memory is stop-the-world
    return prepared;
  };
  options.hooks.beforeFreeze = [&](image::ImageWriter& writer) { return p.beforeFreeze(writer); };
  options.hooks.whileFrozen = [&](image::ImageWriter& writer) { return p.whileFrozen(writer); };
  options.hooks.afterDump = [&](bool dumped) { p.afterDump(dumped); };
  options.hooks.beforeCommit = [&] { return p.beforeCommit(); };
  options.hooks.gpuState = [&] { return json{{"sessions", json::array({p.state()})}}; };
  // CRIU's end of the page relay (migration): our copy closes once CRIU has
  // exited, so that the relay sees the end of its pages.
  UniqueFd criuPages;
  bool leftStopped = false;  // the hand-over lost the target after "go"
  if (outgoing) {
    auto relay = outgoing->openPageRelay();
    if (!relay.isOk()) return failure(relay.status());
    criuPages = std::move(*relay);
    options.pageServerSocket = criuPages.get();
    // A stop-the-world migration restores eagerly on the target, as a copy
    // of an image would; after a recopy the job runs while memory loads.
    options.hooks.handOver = [&](const std::filesystem::path& image, bool& leaveStopped) -> Status {
      criuPages.reset();
      RETURN_IF_ERROR(outgoing->closePageRelay());
      Status handed = outgoing->handOver(image, p.restoresEagerly(), leaveStopped);
      leftStopped = leaveStopped;
      return handed;
    };
  }

  auto report = plugin != nullptr ? checkpoint::checkpointForPlugin(s.pid(), options, *plugin)
                                  : checkpoint::checkpointProcess(s.pid(), options);
  criuPages.reset();
  p.finish(report.isOk());
  if (!report.isOk()) {
    if (std::optional<std::string> why = p.retryStopTheWorld()) {
      // A launch wrote outside its speculated buffers while the copy ran:
      // the image may hold bytes of after t1. As the paper does: discard
      // it, and checkpoint again stop-the-world.
      log::get("daemon")->warn("session {}: {}; checkpointing again stop-the-world", s.id(), *why);
      json again = request;
      again["mode"] = "stop";
      json answer = runCheckpoint(s, again, progress, plugin);
      if (answer.value("ok", false)) {
        answer["report"]["fallback"] = *why;
        answer["report"]["copy_on_write"] = p.copyOnWriteReport();
        answer["report"]["requested_protocol"] = p.name();
      }
      return answer;
    }
  }
  if (outgoing) {
    // The image was only the vehicle (its memory pages went to the target's
    // page server); one left behind by a hand-over that lost the target
    // shows what was sent.
    (void)outgoing->closePageRelay();
    std::error_code ec;
    if (!leftStopped) std::filesystem::remove_all(options.image, ec);
    if (!report.isOk()) {
      outgoing->abort(report.status().message());
      return failure(report.status());
    }
  }
  if (!report.isOk()) return failure(report.status());
  json answer = checkpointReport(*report, p, times, r.leaveRunning);
  answer["migration"] = outgoing ? migrationReport(*outgoing, times.paused) : json::object();
  answer["session"] = s.id();
  answer["protocol"] = options.protocol;
  return {{"ok", true}, {"report", answer}};
}

// ---- restore -------------------------------------------------------------
Result<RestoredSession> restore(uint64_t id, const DriverTable& d, ContextPool& pool,
                                const ServerTable& servers, const std::string& runtimeDir,
                                const json& request, uid_t requester, const ProgressFn& progress) {
  if (!request.contains("image") || !request["image"].is_string()) {
    return makeError(Code::kInvalidArgument, "restore needs an \"image\" directory");
  }
  RETURN_IF_ERROR(requireEntryPoints(d));
  const std::string dir = request["image"].get<std::string>();
  if (request.contains("eager") && !request["eager"].is_boolean()) {
    return makeError(Code::kInvalidArgument, "restore: \"eager\" must be true or false");
  }
  const bool eager = request.value("eager", false);
  // The directory's owner and mode (fstat of it, opened without following
  // a link) say who may restore it; every file is opened beneath it.
  ASSIGN_OR_RETURN(std::shared_ptr<const image::ImageReader> reader,
                   image::ImageReader::open(dir, image::Requester{requester}));
  const json& all = reader->manifest().state;
  if (!all.contains("gpu") || !all["gpu"].contains("sessions") ||
      !all["gpu"]["sessions"].is_array() || all["gpu"]["sessions"].empty()) {
    return makeError(Code::kInvalidArgument,
                     "{} holds no GPU session (a CPU-only image needs no phosd)", dir);
  }
  if (all["gpu"]["sessions"].size() != 1) {
    return makeError(Code::kNotSupported, "{} holds {} GPU sessions; a worker restores one", dir,
                     all["gpu"]["sessions"].size());
  }
  const json& st = all["gpu"]["sessions"][0];
  const std::string where = "state.gpu.sessions[0]";
  ASSIGN_OR_RETURN(pid_t pid, field<pid_t>(st, "pid", where));
  ASSIGN_OR_RETURN(uid_t recorded, field<uid_t>(st, "uid", where));
  // The manifest's uid is what its writer claims, not a credential: for a
  // user it must be that user (a session of another uid would give it
  // that uid's ring and files); root restores another user's job as that
  // user, as CRIU restores the process with its own credentials.
  if (requester != 0 && recorded != requester) {
    return makeError(Code::kPermissionDenied,
                     "{}: its manifest names uid {} ({}.uid), but uid {} asks to restore it: a "
                     "user restores only "
                     "its own sessions",
                     dir, recorded, where, requester);
  }
  const uid_t uid = requester != 0 ? requester : recorded;
  RestoredSession restored;
  restored.session = std::make_unique<Session>(id, pid, uid, d, pool, servers, runtimeDir);
  Session& s = *restored.session;
  std::vector<DeviceBuffer> pending;
  Status done = s.rebuildFrom(*reader, st, progress, eager ? nullptr : &pending);
  if (!done.isOk()) return done.withContext(fmt::format("restoring {}", dir));
  // Twins run from the job's first launch on when it validates or loads its
  // memory concurrently: compiled now, before it runs again, not when its
  // first launches ask for them (docs/twins.md).
  if (s.validator().mode() != ValidationMode::kOff || !pending.empty())
    s.validator().loadTwinModules();
  restored.validation = s.validator().mode();
  if (pending.empty()) return restored;
  // Concurrent restore: the gate holds back every call that touches memory
  // not loaded yet, and launches run as restore twins, which check loads
  // too, until loadConcurrently() has loaded everything.
  auto loading = std::make_shared<OnDemandRestore>(d, reader, std::move(pending));
  loading->keepContexts(pool);
  if (Status prepared = loading->prepare(); !prepared.isOk()) {
    return prepared.withContext(fmt::format("restoring {}", dir));
  }
  loading->giveWayTo(&s.transfers());
  s.openWindow([loading, gate = loading->gate()](const CallAccess& access) { gate(access); },
               ValidationMode::kValidateRestore);
  restored.loading = std::move(loading);
  return restored;
}

Status loadConcurrentlyImpl(Session& s, OnDemandRestore& loading, ValidationMode validation,
                            const std::function<bool()>& cancelled, json& report) {
  Status status = loading.run([](uint64_t) {}, cancelled);
  // The window ends: the twins' reports of everything launched in it.
  std::vector<Violation> found;
  if (status.isOk()) {
    if (Status paused = s.pause(kPauseTimeout); paused.isOk()) {
      {
        auto lock = s.lockCalls();
        found = s.closeWindow(validation);
      }
      s.resume();
    } else {
      status = makeError(Code::kFailedPrecondition,
                         "the window could not be closed to read the validator's reports: {}",
                         paused.message());
    }
  }
  const OnDemandStats stats = loading.stats();
  report = {{"chunks", stats.chunks},
            {"demanded_chunks", stats.demandedChunks},
            {"skipped_chunks", stats.skippedChunks},
            {"waited_calls", stats.waitedCalls},
            {"waited_seconds", stats.waitedSeconds},
            {"anything_calls", stats.anythingCalls},
            {"load_seconds", stats.loadSeconds},
            {"yielded_seconds", stats.yieldedSeconds},
            {"misspeculations", found.size()}};
  if (status.isOk() && !found.empty()) {
    const Violation& v = found.front();
    return makeError(Code::kFailedPrecondition,
                     "{} access(es) outside the speculated buffers while loading (first: a {} by "
                     "kernel {} at {})",
                     found.size(), v.kind == instrument::ViolationKind::kLoad ? "load" : "store",
                     v.kernel, hex(v.address));
  }
  return status;
}
}  // namespace

json checkpointSession(Session& session, const json& request, const ProgressFn& progress,
                       const checkpoint::PluginSteps* plugin) {
  return runCheckpoint(session, request, progress, plugin);
}

Result<RestoredSession> restoreSession(uint64_t id, const DriverTable& driver, ContextPool& pool,
                                       const ServerTable& servers, const std::string& runtimeDir,
                                       const json& request, uid_t requester,
                                       const ProgressFn& progress) {
  return restore(id, driver, pool, servers, runtimeDir, request, requester, progress);
}

Status loadConcurrently(Session& session, OnDemandRestore& loading, ValidationMode validation,
                        const std::function<bool()>& cancelled, json& report) {
  return loadConcurrentlyImpl(session, loading, validation, cancelled, report);
}

}  // namespace phos::daemon
