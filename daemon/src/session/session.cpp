// SPDX-License-Identifier: Apache-2.0
// A client session of phosd: its serving thread and its resources.
#include "session/session.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "phos/common/ipc/control.h"
#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "session/host_calls.h"
#include "session/session_files.h"

namespace phos::daemon {
namespace {

}  // namespace

Session::Session(uint64_t id, pid_t pid, uid_t uid, const DriverTable& driver, ContextPool& pool,
                 const ServerTable& servers, std::string runtimeDir)
    : id_(id), pid_(pid), uid_(uid), driver_(driver), pool_(pool), servers_(servers),
      runtimeDir_(std::move(runtimeDir)) {}

Session::~Session() { stop(); }

Status Session::start(const ipc::RingGeometry& geometry) {
  ringPath_ = fmt::format("{}/phos-{}-{}", ipc::sessionDir(), getpid(), id_);
  // Named by this live worker's pid: one that exists was left by a dead
  // worker that had the same pid.
  unlink(ringPath_.c_str());
  ASSIGN_OR_RETURN(auto ring, ipc::CallRing::create(ringPath_, geometry, &ringLock_));
  ring_.emplace(std::move(ring));
  // Only the application's user may map its ring.
  if (chown(ringPath_.c_str(), uid_, static_cast<gid_t>(-1)) != 0 && geteuid() == 0) {
    return errnoError(errno, fmt::format("cannot give {} to uid {}", ringPath_, uid_));
  }
  chmod(ringPath_.c_str(), 0600);
  replyBuffer_.resize(ring_->payloadCapacity());
  servingSince_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { serve(); });
  return Status::ok();
}

void Session::startServing() {
  if (thread_.joinable() || !ring_.has_value()) return;
  replyBuffer_.resize(ring_->payloadCapacity());
  servingSince_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { serve(); });
}

Status Session::pause(std::chrono::milliseconds timeout) {
  std::unique_lock lock(pauseMutex_);
  pauseRequested_ = true;
  if (!thread_.joinable()) return Status::ok();  // not serving (yet)
  if (!pauseChanged_.wait_for(lock, timeout, [&] { return parked_ || stopping_.load(); })) {
    pauseRequested_ = false;
    pauseChanged_.notify_all();
    return makeError(
        Code::kUnavailable,
        "session {} (pid {}) is still serving a call after {} ms (a synchronization waiting for a "
        "kernel or a host function?)",
        id_, pid(), timeout.count());
  }
  return Status::ok();
}

Status Session::pause(std::chrono::milliseconds timeout, std::chrono::milliseconds captureWait) {
  captureDeadlineNs_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           (std::chrono::steady_clock::now() + captureWait).time_since_epoch())
                           .count();
  Status paused = pause(timeout);
  captureDeadlineNs_ = 0;
  return paused;
}

bool Session::servingBeforePause() {
  std::lock_guard lock(mutex_);
  const bool waits = streamWaits_.pending(driver_);
  // A deferred synchronization holding no wait ends by itself; parked, its
  // caller would go into the image without an answer.
  if (!deferredCalls_.empty() && !waits) return true;
  const int64_t deadline = captureDeadlineNs_.load();
  if (deadline == 0 || (captures_.active() == 0 && !waits)) return false;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  return now < deadline;
}

void Session::resume() {
  std::lock_guard lock(pauseMutex_);
  pauseRequested_ = false;
  pauseChanged_.notify_all();
}

void Session::stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard lock(pauseMutex_);
    pauseChanged_.notify_all();
  }
  {
    // Streams blocked in a host function of the application let go first.
    std::lock_guard lock(hostCallsMutex_);
    if (hostCalls_ != nullptr) hostCalls_->close();
  }
  if (thread_.joinable()) thread_.join();
  transfers_.track(false);  // its events die with the contexts below
  std::lock_guard lock(mutex_);
  // Contexts go first: destroying one frees its allocations, streams and
  // modules, and drains its work.
  for (const auto& [vid, ctx] : contexts_) {
    if (ctx.real == nullptr) continue;
    PHOS_DRIVER(driver_, CtxSetCurrent)(ctx.real);
    // The pool destroys contexts later, on its own thread: work still queued
    // (an asynchronous copy into pinned memory) must not outlive the
    // mappings unmapped below. (A stream held by a stream memory wait is
    // not waited for: the context's destruction ends it.)
    if (!streamWaits_.pendingIn(driver_, vid)) PHOS_DRIVER(driver_, CtxSynchronize)();
    freeStaging(vid);
  }
  if (validator_.mode() != ValidationMode::kOff) {
    auto found = validator_.collect();
    const auto& n = validator_.counters();
    log::get("daemon")->info(
        "session {} (pid {}): validation: {} launches, {} as twins, {} without twin, {} reported "
        "accesses{}",
        id_, pid(), n.launches, n.twinLaunches, n.unvalidated, n.violations,
        found.empty() ? "" : fmt::format(" (first: {} {:#x})", found[0].kernel, found[0].address));
  }
  validator_.release(nullptr);
  // The linker states the program left: they belong to no context.
  links_.destroyAll(driver_);
  // Registered in a context of the session (portable): unregistered while
  // one is current, so that the next session's range at this address can be.
  for (const auto& entry : pinned_.ranges()) unregisterPinned(entry.second);
  if (lanesRegistered_) PHOS_DRIVER(driver_, MemHostUnregister)(lanesBase_);
  lanesRegistered_ = false;
  vmm_.clear();
  streamWaits_.clear();  // their marks went with the contexts
  deferredCalls_.clear();
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  currentReal_ = nullptr;
  for (const auto& [vid, ctx] : contexts_) {
    if (ctx.real != nullptr) pool_.retire(ctx.real, ctx.device);
  }
  contexts_ = SessionContexts();
  memory_.clear();
  pinned_.clear();
  ring_.reset();
  if (!ringPath_.empty()) unlink(ringPath_.c_str());
  ringLock_.reset();
}

void Session::serve() {
  auto log = log::get("daemon");
  while (!stopping_.load()) {
    // (The ring is polled every 100 ms: a capture's deadline is seen even
    // when the application sends nothing.)
    serveDeferred();
    if (pauseRequested_.load() && !servingBeforePause()) {
      std::unique_lock lock(pauseMutex_);
      if (pauseRequested_.load()) {
        parked_ = true;
        pauseChanged_.notify_all();
        pauseChanged_.wait(lock, [&] { return !pauseRequested_.load() || stopping_.load(); });
        parked_ = false;
        continue;
      }
    }
    // Deferred calls are polled every millisecond.
    auto request = ring_->next(std::chrono::milliseconds(deferredCalls_.empty() ? 100 : 1));
    if (!request.isOk()) {
      if (request.status().code() == Code::kNotFound) continue;
      // A malformed slot: the application wrote garbage into its ring.
      log->warn("session {} (pid {}): {}", id_, pid(), request.status().message());
      continue;
    }
    dispatch(*request);
  }
}

bool Session::makeCurrent(uint64_t context) {
  CUcontext real = nullptr;
  if (const SessionContext* c = contexts_.find(context); c != nullptr && context != 0) real = c->real;
  currentContext_ = real != nullptr ? context : 0;
  if (real == currentReal_) return true;
  if (PHOS_DRIVER(driver_, CtxSetCurrent)(real) != CUDA_SUCCESS) return false;
  currentReal_ = real;
  return true;
}

void Session::dispatch(const ipc::CallRing::Request& request) {
  auto reply = serveOne(request.bytes, request.expectsReply, replyBuffer_);
  if (lastDeferred_) {
    deferredCalls_.push_back({request, std::move(lastDeferred_)});
    lastDeferred_ = nullptr;
    return;
  }
  if (request.expectsReply) {
    (void)ring_->reply(request, reply);
  } else {
    ring_->finish(request);
  }
  if (firstCallNs_.load(std::memory_order_relaxed) < 0) {
    firstCallNs_ = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - servingSince_)
                       .count();
  }
}

std::function<bool()> Session::heldBehindStreamWait(const ipc::CallHeader& header) {
  // Synchronous copies, which run on a default stream and return once it is
  // done (phosd waits for copies between device memory too, which CUDA only
  // queues: deferred, they hold their own thread instead of the session).
  // Sets of device memory only queue their work, and are not deferred: the
  // thread that set a word may release the wait next.
  static const std::set<std::string_view> kOnDefaultStream = {
      "cuMemcpy",     "cuMemcpyPeer",  "cuMemcpyHtoD",        "cuMemcpyDtoH",
      "cuMemcpyDtoD", "cuMemcpyHtoA",  "cuMemcpyAtoH",        "cuMemcpyDtoA",
      "cuMemcpyAtoD", "cuMemcpyAtoA",  "cuMemcpy2DUnaligned", "cuMemcpy2D",
      "cuMemcpy3D",   "cuMemcpy3DPeer"};
  // On every call's path: nothing more while no wait was made.
  if (streamWaits_.empty()) return nullptr;
  const cuda_api::EntryPointInfo& e =
      cuda_api::entryPoint(static_cast<cuda_api::EntryPointId>(header.entry));
  if (kOnDefaultStream.count(e.publicName) == 0 || !streamWaits_.pending(driver_)) return nullptr;
  CUstream perThread = nullptr;
  if (e.origin == cuda_api::EntryPointOrigin::kPerThread) {
    auto s = streamsAndEvents_.perThreadStream(driver_, header.thread, currentContext_);
    if (!s.isOk()) return nullptr;  // the call fails as it would have
    perThread = *s;
  }
  if (!streamWaits_.holdDefaultStream(driver_, perThread)) return nullptr;
  return [this, perThread] { return !streamWaits_.holdDefaultStream(driver_, perThread); };
}

void Session::serveDeferred() {
  if (deferredCalls_.empty()) return;
  std::vector<DeferredCall> waiting;
  waiting.swap(deferredCalls_);
  for (DeferredCall& call : waiting) {
    bool ready = false;
    {
      std::lock_guard lock(mutex_);
      ready = call.ready();
    }
    if (ready) {
      dispatch(call.request);
    } else {
      deferredCalls_.push_back(std::move(call));
    }
  }
}

std::span<const std::byte> Session::serveOne(std::span<const std::byte> request, bool expectsReply,
                                             std::span<std::byte> reply) {
  std::lock_guard lock(mutex_);
  ++calls_;
  // What `phos ps` shows if this call runs long (a synchronization waiting
  // for a kernel); posted calls are cheap and frequent and need no snapshot.
  if (expectsReply) (void)infoLocked();
  ipc::CallHeader header{};
  const bool wellFormed = request.size() >= sizeof(header);
  if (wellFormed) std::memcpy(&header, request.data(), sizeof(header));
  std::span<const std::byte> args = wellFormed ? request.subspan(sizeof(header)) : std::span<const std::byte>{};
  ServerCall call(*this, header, args, expectsReply, reply);
  if (!wellFormed) {
    call.fail(CUDA_ERROR_INVALID_VALUE);
  } else if (header.entry == ipc::kTakeOutputEntry) {
    serveTakeOutput(call, reply.size());
  } else if (header.entry >= cuda_api::kEntryPointCount || servers_[header.entry] == nullptr) {
    call.fail(CUDA_ERROR_NOT_SUPPORTED);
  } else if (!makeCurrent(header.context)) {
    call.fail(CUDA_ERROR_INVALID_CONTEXT);
  } else if (auto held = expectsReply ? heldBehindStreamWait(header) : nullptr) {
    // Served again once no stream memory wait holds its default stream; the
    // call has not started (a copy through a lane goes on waiting for phosd).
    lastDeferred_ = std::move(held);
    return {};
  } else {
    captures_.applyServingMode(driver_, header.thread);
    servers_[header.entry](call);
    if (!call.answered()) call.fail(CUDA_ERROR_UNKNOWN);  // a server function forgot to answer
    if (call.deferredUntil()) {
      lastDeferred_ = call.deferredUntil();
      return {};
    }
  }
  // The application's half of a lane copy stops at once if the call ended
  // before its last chunk (a failure, a lane not used); after a complete
  // copy it has left the lane already.
  if (auto lane = call.lane()) ipc::abandon(*lane);
  if (auto log = log::get("daemon"); log->should_log(spdlog::level::debug) && wellFormed &&
      header.entry < cuda_api::kEntryPointCount) {
    ipc::Decoder decoded(call.replyBytes());
    log->debug("session {}: {} -> {}{}", id_, cuda_api::entryPoint(static_cast<cuda_api::EntryPointId>(header.entry)).symbol,
               decoded.value<ipc::ReplyHeader>().result, expectsReply ? "" : " (posted)");
  }
  return call.replyBytes();
}

void Session::serveTakeOutput(ServerCall& call, size_t capacity) {
  if (!call.argumentsComplete()) return;
  constexpr size_t kOverhead = sizeof(ipc::ReplyHeader) + 2 * sizeof(uint32_t);
  auto [text, errors] = output_->take(capacity > kOverhead ? capacity - kOverhead : 0);
  auto& w = call.reply(CUDA_SUCCESS);
  w.blob(text.data(), text.size());
  w.blob(errors.data(), errors.size());
  if (output_->pending()) {
    // The header was written first; mark it now that the blob is in.
    auto bytes = call.replyBytes();
    ipc::ReplyHeader h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    h.flags |= ipc::kReplyOutputPending;
    std::memcpy(const_cast<std::byte*>(bytes.data()), &h, sizeof(h));
  }
  call.send();
}

void Session::captureOutput(CUcontext context) {
  if (const vgpu::ExportTable* vgpu = driver_.vgpu(); vgpu != nullptr) {
    if (context != nullptr) vgpu->setPrintfSink(context, output_);
  } else if (Status s = output_->captureStdout(); !s.isOk()) {
    log::get("daemon")->warn("session {}: kernel printf output stays in phosd's stdout: {}", id_,
                             s.message());
  }
}

KernelOutput::~KernelOutput() {
  if (stdout_ >= 0) close(stdout_);
}

Status KernelOutput::captureStdout() {
  std::lock_guard lock(mutex_);
  if (stdout_ >= 0) return Status::ok();
  std::fflush(stdout);
  int fd = memfd_create("phos-kernel-printf", MFD_CLOEXEC);
  if (fd < 0) return errnoError(errno, "cannot create a memory file for kernel printf output");
  // Every write lands at the end, whatever was read and released before.
  if (fcntl(fd, F_SETFL, O_APPEND) != 0 || dup2(fd, STDOUT_FILENO) < 0) {
    Status s = errnoError(errno, "cannot make the memory file phosd's stdout");
    close(fd);
    return s;
  }
  stdout_ = fd;
  return Status::ok();
}

// What the driver printed since the last call: read where it was written, and
// the pages read given back (the file's offsets keep growing; its memory does not).
void KernelOutput::drainStdout() {
  if (stdout_ < 0) return;
  std::fflush(stdout);
  struct stat st {};
  if (fstat(stdout_, &st) != 0 || st.st_size <= static_cast<off_t>(stdoutRead_)) return;
  std::string fresh(static_cast<size_t>(st.st_size) - stdoutRead_, '\0');
  ssize_t n = pread(stdout_, fresh.data(), fresh.size(), static_cast<off_t>(stdoutRead_));
  if (n <= 0) return;
  fresh.resize(static_cast<size_t>(n));
  stdoutRead_ += static_cast<size_t>(n);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (size_t whole = stdoutRead_ / page * page; whole > 0) {
    fallocate(stdout_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(whole));
  }
  appendLocked(fresh);
}

void KernelOutput::write(std::string_view text) {
  std::lock_guard lock(mutex_);
  appendLocked(text);
}

void KernelOutput::writeError(std::string_view text) {
  std::lock_guard lock(mutex_);
  if (errors_.size() + text.size() <= kLimit) errors_.append(text);
}

void KernelOutput::appendLocked(std::string_view text) {
  if (text_.size() + text.size() > kLimit) {
    if (!truncated_) text_ += "\n[phosd: kernel printf output beyond 64 MiB was dropped]\n";
    truncated_ = true;
    return;
  }
  text_.append(text);
}

bool KernelOutput::pending() {
  std::lock_guard lock(mutex_);
  drainStdout();
  return !text_.empty() || !errors_.empty();
}

std::pair<std::string, std::string> KernelOutput::take(size_t max) {
  std::lock_guard lock(mutex_);
  size_t n = std::min(max, text_.size());
  std::string out = text_.substr(0, n);
  text_.erase(0, n);
  if (text_.empty()) truncated_ = false;
  size_t e = std::min(max - n, errors_.size());
  std::string err = errors_.substr(0, e);
  errors_.erase(0, e);
  return {std::move(out), std::move(err)};
}

void Session::adoptedBy(pid_t pid) {
  pid_.store(pid);
  if (hostCalls_ != nullptr) hostCalls_->setPid(pid);
}

SessionInfo Session::info() const {
  std::unique_lock lock(mutex_, std::chrono::milliseconds(50));
  if (lock.owns_lock()) return infoLocked();
  // A call is running (maybe waiting for a long kernel): the snapshot of the
  // last synchronous call, with the live counters.
  std::lock_guard last(infoMutex_);
  SessionInfo i = lastInfo_;
  i.id = id_;
  i.pid = pid();
  i.uid = uid_;
  i.calls = calls_.load();
  i.launches = launches_.load();
  i.modules = static_cast<uint64_t>(std::max<int64_t>(0, moduleCount_.load()));
  i.busy = true;
  return i;
}

SessionInfo Session::infoLocked() const {
  SessionInfo i;
  i.id = id_;
  i.pid = pid();
  i.uid = uid_;
  // What the application allocated: module globals are its modules' memory.
  for (const auto& [a, alloc] : memory_.allocations()) {
    if (alloc.module != nullptr) continue;
    ++i.allocations;
    i.deviceBytes += alloc.bytes;
  }
  i.pinnedBytes += pinned_.bytes();
  i.modules = static_cast<uint64_t>(std::max<int64_t>(0, moduleCount_.load()));
  i.contexts = contexts_.size();
  i.calls = calls_.load();
  i.launches = launches_.load();
  for (const auto& [fn, n] : launchesByFunction_) {
    auto it = functionNames_.find(fn);
    i.kernels.push_back(it != functionNames_.end() ? it->second : fmt::format("{:#x}", fn));
  }
  std::lock_guard last(infoMutex_);
  lastInfo_ = i;
  return i;
}

const PinnedRange* Session::findPinned(uintptr_t p) const { return pinned_.find(p); }

bool Session::ownsRange(CUdeviceptr p, size_t bytes) const {
  if (const Allocation* a = memory_.find(p)) return bytes <= a->bytes - (p - a->address);
  if (const PinnedRange* r = findPinned(p)) return bytes <= r->bytes - (p - r->address);
  return false;
}

int Session::currentDevice() const {
  return contexts_.deviceOf(currentContext_, 0);
}

CUresult Session::allocateDevice(int device, size_t bytes, CUdeviceptr* address) {
  // A context with a sticky error refuses allocations, as cuMemAlloc does;
  // the heap's VMM calls would not notice.
  CUdevice current = 0;
  if (CUresult r = PHOS_DRIVER(driver_, CtxGetDevice)(&current); r != CUDA_SUCCESS) return r;
  CUresult r = memory_.allocate(device, bytes, address);
  // A checkpoint never makes the application's allocation fail: what its
  // protocol holds on this device comes back first.
  if (r == CUDA_ERROR_OUT_OF_MEMORY && relief_) {
    relief_(device);
    r = memory_.allocate(device, bytes, address);
  }
  return r;
}

void Session::prepareTwinModules() {
  std::vector<LaunchValidator::TwinLoad> loads;
  {
    std::lock_guard lock(mutex_);
    loads = validator_.twinLoadsPending();
  }
  for (LaunchValidator::TwinLoad& load : loads) validator_.loadTwins(load);
  std::lock_guard lock(mutex_);
  for (const LaunchValidator::TwinLoad& load : loads) validator_.keepTwins(load);
}

CUresult Session::freeDevice(CUdeviceptr address) {
  const Allocation* a = memory_.find(address);
  if (a == nullptr || a->address != address || a->module != nullptr || a->physical != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // cuMemFree waits for the work that may use the memory; unmapping under a
  // running kernel would fault it.
  waitForWork(a->device);
  return memory_.free(address);
}

bool Session::deferBehindStreamWaits(ServerCall& call, std::optional<int> device) {
  // Captures are not deferred around: querying a capturing stream would
  // invalidate its capture (waitForWork does not wait for those streams).
  if (streamWaits_.empty() || captures_.active() != 0) return false;
  auto held = [this, device] {
    for (const auto& [vid, ctx] : contexts_) {
      if (ctx.real != nullptr && (!device || ctx.device == *device) &&
          streamWaits_.pendingIn(driver_, vid)) {
        return true;
      }
    }
    return false;
  };
  if (!held()) return false;
  call.defer([held] { return !held(); });
  return true;
}

void Session::waitForWork(std::optional<int> device) {
  if (captures_.active() == 0) {
    for (const auto& [vid, ctx] : contexts_) {
      if (ctx.real == nullptr || (device && ctx.device != *device)) continue;
      PHOS_DRIVER(driver_, CtxSetCurrent)(ctx.real);
      PHOS_DRIVER(driver_, CtxSynchronize)();
    }
    PHOS_DRIVER(driver_, CtxSetCurrent)(currentReal_);
    return;
  }
  // A context's synchronization would invalidate the captures of its streams
  // (a free in relaxed capture mode must not): each stream that is not
  // capturing is waited for instead, the legacy ones where no capture
  // involves them. Captured work does not run, so it uses no memory.
  auto wait = [&](CUstream stream) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (PHOS_DRIVER(driver_, StreamIsCapturing)(stream, &status) == CUDA_SUCCESS &&
        status == CU_STREAM_CAPTURE_STATUS_NONE) {
      (void)PHOS_DRIVER(driver_, StreamSynchronize)(stream);
    }
  };
  for (uint64_t id : handles_.ids(HandleType::kCUstream_st)) {
    wait(static_cast<CUstream>(handles_.resolve(HandleType::kCUstream_st, id)));
  }
  for (CUstream stream : streamsAndEvents_.perThreadStreams()) wait(stream);
  for (const auto& [vid, ctx] : contexts_) {
    if (ctx.real == nullptr) continue;
    PHOS_DRIVER(driver_, CtxSetCurrent)(ctx.real);
    wait(CU_STREAM_LEGACY);
  }
  PHOS_DRIVER(driver_, CtxSetCurrent)(currentReal_);
}

CUcontext Session::contextOn(int device) const {
  return contexts_.on(device, currentContext_);
}

uint64_t Session::contextOf(uint64_t handle) const {
  return contexts_.ownerOf(handle, currentContext_);
}

Result<PinnedRange> Session::createPinned(size_t bytes, unsigned flags, bool managed) {
  return pinned_.create(ringPath_, bytes, flags, managed, currentContext_);
}

Result<PinnedRange> Session::createRegistered(uintptr_t p, size_t bytes, unsigned flags) {
  return pinned_.createRegistered(ringPath_, p, bytes, flags, currentContext_);
}

void Session::unregisterPinned(const PinnedRange& range) {
  void* p = reinterpret_cast<void*>(range.registered != 0 ? range.registered : range.address);
  CUresult r = PHOS_DRIVER(driver_, MemHostUnregister)(p);
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) return;
  // The driver unregisters only in a usable context, and one that faulted
  // (a sticky error such as CUDA_ERROR_ILLEGAL_ADDRESS) is not: then a fresh
  // context of the pool does it. Left registered, the range would stay the
  // driver's after it is unmapped, and the next session whose slice holds this
  // address could not register its own.
  const int device = contexts_.deviceOf(range.context, 0);
  auto fresh = pool_.take(device, 0);
  if (!fresh.isOk()) return;
  PHOS_DRIVER(driver_, CtxSetCurrent)(*fresh);
  PHOS_DRIVER(driver_, MemHostUnregister)(p);
  PHOS_DRIVER(driver_, CtxSetCurrent)(currentReal_);
  pool_.retire(*fresh, device);
}

Status Session::freePinned(uintptr_t address) {
  if (!pinned_.ranges().contains(address)) {
    return makeError(Code::kNotFound, "{:#x} is not pinned memory of this session", address);
  }
  // Work of any of the session's contexts may still use the range.
  waitForWork(std::nullopt);
  unregisterPinned(
      pinned_.ranges().at(address));  // not registered yet: the driver says so, and nothing changes
  pinned_.remove(address);
  return Status::ok();
}

std::optional<ipc::TransferLane> Session::transferLane(uint32_t index) const {
  if (!ring_.has_value() || index >= ring_->geometry().laneCount) return std::nullopt;
  return ring_->lane(index);
}

std::optional<uint32_t> Session::busyLane() const {
  const uint32_t lanes = ring_.has_value() ? ring_->geometry().laneCount : 0;
  for (uint32_t i = 0; i < lanes; ++i) {
    if (ipc::leftBehind(ring_->lane(i))) return i;
  }
  return std::nullopt;
}

void Session::registerLanes() {
  if (lanesRegistered_ || !ring_.has_value() || ring_->geometry().laneCount == 0) return;
  const ipc::TransferLane first = ring_->lane(0);
  const ipc::TransferLane last = ring_->lane(ring_->geometry().laneCount - 1);
  lanesBase_ = reinterpret_cast<std::byte*>(first.words);
  const auto bytes = static_cast<size_t>(last.buffers[1] + last.bufferBytes - lanesBase_);
  // Registered, the driver copies to and from the lanes by DMA; a driver that
  // refuses copies them all the same, through its own staging.
  lanesRegistered_ = PHOS_DRIVER(driver_, MemHostRegister_v2)(lanesBase_, bytes, CU_MEMHOSTREGISTER_PORTABLE) ==
                     CUDA_SUCCESS;
  if (!lanesRegistered_) log::get("daemon")->debug("session {}: the driver did not register the transfer lanes", id_);
}

Status Session::readApplication(uintptr_t address, void* out, size_t bytes) const {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(out) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    ssize_t n = process_vm_readv(pid(), &local, 1, &remote, 1, 0);
    if (n <= 0) {
      return errnoError(n < 0 ? errno : EFAULT,
                        fmt::format("cannot read {} bytes at {:#x} of pid {}", bytes - done,
                                    address + done, pid()));
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status Session::writeApplication(uintptr_t address, const void* data, size_t bytes) const {
  size_t done = 0;
  while (done < bytes) {
    iovec local{const_cast<char*>(static_cast<const char*>(data)) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    ssize_t n = process_vm_writev(pid(), &local, 1, &remote, 1, 0);
    if (n <= 0) {
      return errnoError(n < 0 ? errno : EFAULT,
                        fmt::format("cannot write {} bytes at {:#x} of pid {}", bytes - done,
                                    address + done, pid()));
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

CopyStaging* Session::staging() {
  if (currentContext_ == 0) return nullptr;
  if (auto it = staging_.find(currentContext_); it != staging_.end()) return &it->second;
  CopyStaging st;
  for (int k = 0; k < 2; ++k) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, st.bytes) != 0) {
      for (int j = 0; j < k; ++j) std::free(st.buffers[j]);
      return nullptr;
    }
    st.buffers[k] = static_cast<std::byte*>(p);
  }
  // Registered, the driver copies from them asynchronously; unregistered
  // (a driver that refuses), copies still work, one chunk at a time.
  st.registered = true;
  for (int k = 0; k < 2; ++k) {
    if (PHOS_DRIVER(driver_, MemHostRegister_v2)(st.buffers[k], st.bytes, 0) != CUDA_SUCCESS) st.registered = false;
  }
  for (int k = 0; k < 2; ++k) {
    if (PHOS_DRIVER(driver_, EventCreate)(&st.done[k], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      st.done[k] = nullptr;
    }
  }
  if (st.done[0] == nullptr || st.done[1] == nullptr) {
    freeStagingBuffers(st);
    return nullptr;
  }
  return &staging_.emplace(currentContext_, st).first->second;
}

void Session::freeStagingBuffers(CopyStaging& st) {
  for (int k = 0; k < 2; ++k) {
    if (st.done[k] != nullptr) PHOS_DRIVER(driver_, EventDestroy_v2)(st.done[k]);
    if (st.buffers[k] != nullptr) {
      if (st.registered) PHOS_DRIVER(driver_, MemHostUnregister)(st.buffers[k]);
      std::free(st.buffers[k]);
    }
    st.done[k] = nullptr;
    st.buffers[k] = nullptr;
  }
}

void Session::freeStaging(uint64_t context) {
  auto it = staging_.find(context);
  if (it == staging_.end()) return;
  freeStagingBuffers(it->second);
  staging_.erase(it);
}

void Session::rehomeMappings() {
  memory_.rehome([this](int device) -> uint64_t {
    for (const auto& [vid, ctx] : contexts_) {
      if (ctx.real != nullptr && ctx.device == device && !contexts_.destroyed(vid)) return vid;
    }
    return 0;
  });
}

void Session::destroyContext(uint64_t id) {
  const SessionContext* context = contexts_.find(id);
  if (context == nullptr) return;
  const CUcontext real = context->real;
  const int device = context->device;
  // Its memory goes with it, as cuMemAlloc's does.
  PHOS_DRIVER(driver_, CtxSetCurrent)(real);
  currentReal_ = real;
  // A stream held by a stream memory wait is not waited for: the context's
  // destruction ends the wait, as a GPU's does.
  if (!streamWaits_.pendingIn(driver_, id)) PHOS_DRIVER(driver_, CtxSynchronize)();
  streamWaits_.forgetContext(id);
  validator_.release(real);
  // Frees in flight (their events are of this context, perhaps) end first.
  memoryPools_.reap(*this, true);
  memory_.removeContext(id, [this](const Allocation& a) { memoryPools_.forget(*this, a.address); });
  streamsAndEvents_.forgetContext(id);
  modules_.forgetContext(id);
  arrays_.forgetContext(id);
  if (staging_.count(id) != 0) {
    PHOS_DRIVER(driver_, CtxSetCurrent)(real);
    currentReal_ = real;
    freeStaging(id);
  }
  // Pinned memory allocated in it goes with it, as cuMemHostAlloc's does. The
  // driver unregisters only with a context current: left registered, the
  // range would stay the driver's after it is unmapped, and the next session
  // whose slice holds this address could not register its own.
  std::vector<PinnedRange> ofContext;
  for (const auto& [address, range] : pinned_.ranges()) {
    if (range.context == id) ofContext.push_back(range);
  }
  if (!ofContext.empty()) {
    PHOS_DRIVER(driver_, CtxSetCurrent)(real);
    currentReal_ = real;
    PHOS_DRIVER(driver_, CtxSynchronize)();
  }
  for (const PinnedRange& range : ofContext) {
    unregisterPinned(range);
    pinned_.remove(range.address);
  }
  if (currentReal_ == real) {
    PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
    currentReal_ = nullptr;
  }
  // Its streams, events, modules and functions die with it: their handles
  // must never reach the driver again.
  // A released primary context is not "destroyed" to its threads: a retain
  // brings it back under the same id (SessionContexts::remove).
  for (uint64_t object : contexts_.remove(id)) {
    handles_.erase(object);
    modules_.forget(object);
    streamsAndEvents_.forgetEvent(object);
  }
  handles_.erase(id);
  rehomeMappings();
  pool_.retire(real, device);
}

Result<std::shared_ptr<HostCallChannel>> Session::hostCalls() {
  std::lock_guard lock(hostCallsMutex_);
  if (hostCalls_ == nullptr) {
    // Named after the ring, as pinned memory is (createPinned).
    ASSIGN_OR_RETURN(hostCalls_,
                     HostCallChannel::create(fmt::format("{}-hostcalls", ringPath_), uid_, pid()));
  }
  return hostCalls_;
}

Result<CUDA_HOST_NODE_PARAMS> Session::graphHostNode(uint64_t function, uint64_t userData,
                                                     std::string* queue) {
  ASSIGN_OR_RETURN(auto channel, hostCalls());
  if (queue != nullptr) *queue = channel->path();
  return graphs_.hostNode(std::move(channel), function, userData);
}

void Session::forgetHandle(uint64_t id) {
  // A graph's or executable graph's references to user objects go with it.
  userObjects_.holderGone(driver_, handles_, id);
  handles_.erase(id);
  graphs_.forget(id, driver_);
  streamsAndEvents_.forgetEvent(id);
  contexts_.forgetObject(id);
}

void Session::noteContextObject(HandleType type, uint64_t id) {
  const bool owned = type == HandleType::kCUstream_st || type == HandleType::kCUevent_st ||
                     type == HandleType::kCUmod_st || type == HandleType::kCUfunc_st ||
                     type == HandleType::kCUarray_st;
  if (owned && id != 0 && currentContext_ != 0) contexts_.noteObject(id, currentContext_);
}

void Session::noteLaunch(uint64_t function) {
  ++launches_;
  ++launchesByFunction_[function];
}

void Session::setFunctionName(uint64_t function, std::string name) { functionNames_[function] = std::move(name); }

const std::string* Session::functionName(uint64_t function) const {
  auto it = functionNames_.find(function);
  return it == functionNames_.end() ? nullptr : &it->second;
}

void Session::setValidation(ValidationMode mode) {
  std::lock_guard lock(mutex_);
  validator_.setMode(mode);
}

std::optional<instrument::Buffer> Session::bufferAt(uint64_t address) const {
  if (const Allocation* a = memory_.find(address)) return instrument::Buffer{a->address, a->bytes};
  if (const PinnedRange* r = findPinned(address)) return instrument::Buffer{r->address, r->bytes};
  return std::nullopt;
}

Result<nlohmann::json> Session::validationReport(std::chrono::milliseconds timeout) {
  RETURN_IF_ERROR(pause(timeout));
  std::vector<Violation> found;
  {
    std::lock_guard lock(mutex_);
    // The twins write their reports as they run: everything launched so far
    // must have finished.
    for (const auto& [vid, ctx] : contexts_) {
      if (ctx.real == nullptr) continue;
      PHOS_DRIVER(driver_, CtxSetCurrent)(ctx.real);
      PHOS_DRIVER(driver_, CtxSynchronize)();
    }
    PHOS_DRIVER(driver_, CtxSetCurrent)(currentReal_);
    found = validator_.collect();
    constexpr size_t kMaxViolations = 1000;
    violations_.insert(violations_.end(), found.begin(), found.end());
    if (violations_.size() > kMaxViolations) {
      violations_.erase(violations_.begin(), violations_.end() - kMaxViolations);
    }
    found = violations_;
  }
  resume();
  nlohmann::json answer = validator_.report(found);
  answer["pid"] = pid();
  answer["session"] = id_;
  return answer;
}

}  // namespace phos::daemon
