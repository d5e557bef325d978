// SPDX-License-Identifier: Apache-2.0
// A client session of phosd: its serving thread and its resources.
#include "session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"

namespace phos::daemon {
namespace {

// Pinned host memory is mapped at the same address in phosd and in the
// application, so that pointers to it mean the same thing on both sides
// (unified addressing) and kernels may use them. Each session places its
// ranges in its own slice of this window.
constexpr uintptr_t kPinnedWindow = 0x500000000000ull;
constexpr uintptr_t kPinnedSlice = 16ull << 30;  // 16 GiB per session
constexpr uint64_t kPinnedSlices = 1024;
constexpr size_t kStagingBytes = 8u << 20;

size_t pageRound(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

}  // namespace

Session::Session(uint64_t id, pid_t pid, uid_t uid, const DriverTable& driver, ContextPool& pool,
                 const ServerTable& servers, std::string runtimeDir)
    : id_(id), pid_(pid), uid_(uid), driver_(driver), pool_(pool), servers_(servers),
      runtimeDir_(std::move(runtimeDir)) {}

Session::~Session() { stop(); }

Status Session::start(const ipc::RingGeometry& geometry) {
  ringPath_ = fmt::format("/dev/shm/phos-{}-{}", getpid(), id_);
  ASSIGN_OR_RETURN(auto ring, ipc::CallRing::create(ringPath_, geometry));
  ring_.emplace(std::move(ring));
  // Only the application's user may map its ring.
  if (chown(ringPath_.c_str(), uid_, static_cast<gid_t>(-1)) != 0 && geteuid() == 0) {
    return errnoError(errno, fmt::format("cannot give {} to uid {}", ringPath_, uid_));
  }
  chmod(ringPath_.c_str(), 0600);
  replyBuffer_.resize(ring_->payloadCapacity());
  thread_ = std::thread([this] { serve(); });
  return Status::ok();
}

void Session::stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  // Contexts go first: destroying one frees its allocations, streams and
  // modules, and drains its work.
  PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
  for (auto& [vid, ctx] : contexts_) {
    if (ctx.real != nullptr) pool_.retire(ctx.real, ctx.device);
  }
  contexts_.clear();
  allocations_.clear();
  for (auto& [address, range] : pinned_) {
    munmap(reinterpret_cast<void*>(range.address), range.mapped);
    unlink(range.path.c_str());
  }
  pinned_.clear();
  if (staging_ != nullptr) {
    std::free(staging_);
    staging_ = nullptr;
  }
  ring_.reset();
  if (!ringPath_.empty()) unlink(ringPath_.c_str());
}

void Session::serve() {
  auto log = log::get("daemon");
  while (!stopping_.load()) {
    auto request = ring_->next(std::chrono::milliseconds(100));
    if (!request.isOk()) {
      if (request.status().code() == Code::kNotFound) continue;
      // A malformed slot: the application wrote garbage into its ring.
      log->warn("session {} (pid {}): {}", id_, pid_, request.status().message());
      continue;
    }
    dispatch(*request);
  }
}

bool Session::makeCurrent(uint64_t context) {
  CUcontext real = nullptr;
  if (context != 0) {
    auto it = contexts_.find(context);
    if (it != contexts_.end()) real = it->second.real;
  }
  currentContext_ = real != nullptr ? context : 0;
  if (real == currentReal_) return true;
  if (PHOS_DRIVER(driver_, CtxSetCurrent)(real) != CUDA_SUCCESS) return false;
  currentReal_ = real;
  return true;
}

void Session::dispatch(const ipc::CallRing::Request& request) {
  std::lock_guard lock(mutex_);
  ++calls_;
  ipc::CallHeader header{};
  const bool wellFormed = request.bytes.size() >= sizeof(header);
  if (wellFormed) std::memcpy(&header, request.bytes.data(), sizeof(header));
  std::span<const std::byte> args =
      wellFormed ? request.bytes.subspan(sizeof(header)) : std::span<const std::byte>{};
  ServerCall call(*this, header, args, request.expectsReply, replyBuffer_);
  if (!wellFormed) {
    call.fail(CUDA_ERROR_INVALID_VALUE);
  } else if (header.entry >= cuda_api::kEntryPointCount || servers_[header.entry] == nullptr) {
    call.fail(CUDA_ERROR_NOT_SUPPORTED);
  } else if (!makeCurrent(header.context)) {
    call.fail(CUDA_ERROR_INVALID_CONTEXT);
  } else {
    servers_[header.entry](call);
    if (!call.answered()) call.fail(CUDA_ERROR_UNKNOWN);  // a server function forgot to answer
  }
  if (auto log = log::get("daemon"); log->should_log(spdlog::level::debug) && wellFormed &&
      header.entry < cuda_api::kEntryPointCount) {
    ipc::Decoder reply(call.replyBytes());
    log->debug("session {}: {} -> {}{}", id_, cuda_api::entryPoint(static_cast<cuda_api::EntryPointId>(header.entry)).symbol,
               reply.value<ipc::ReplyHeader>().result, request.expectsReply ? "" : " (posted)");
  }
  if (request.expectsReply) {
    (void)ring_->reply(request, call.replyBytes());
  } else {
    ring_->finish(request);
  }
}

SessionInfo Session::info() const {
  std::lock_guard lock(mutex_);
  SessionInfo i;
  i.id = id_;
  i.pid = pid_;
  i.uid = uid_;
  i.allocations = allocations_.size();
  for (const auto& [a, alloc] : allocations_) i.deviceBytes += alloc.bytes;
  for (const auto& [a, range] : pinned_) i.pinnedBytes += range.bytes;
  i.modules = modules_ > 0 ? static_cast<uint64_t>(modules_) : 0;
  i.contexts = contexts_.size();
  i.calls = calls_;
  i.launches = launches_;
  for (const auto& [fn, n] : launchesByFunction_) {
    auto it = functionNames_.find(fn);
    i.kernels.push_back(it != functionNames_.end() ? it->second : fmt::format("{:#x}", fn));
  }
  return i;
}

const Allocation* Session::findAllocation(CUdeviceptr p) const {
  auto it = allocations_.upper_bound(p);
  if (it == allocations_.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  return p - a.address < a.bytes ? &a : nullptr;
}

const PinnedRange* Session::findPinned(uintptr_t p) const {
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return nullptr;
  --it;
  const PinnedRange& r = it->second;
  return p - r.address < r.bytes ? &r : nullptr;
}

bool Session::ownsRange(CUdeviceptr p, size_t bytes) const {
  if (const Allocation* a = findAllocation(p)) return bytes <= a->bytes - (p - a->address);
  if (const PinnedRange* r = findPinned(p)) return bytes <= r->bytes - (p - r->address);
  return false;
}

void Session::addAllocation(const Allocation& a) { allocations_[a.address] = a; }
void Session::removeAllocation(CUdeviceptr p) { allocations_.erase(p); }

Result<PinnedRange> Session::createPinned(size_t bytes, unsigned flags) {
  PinnedRange r;
  r.bytes = bytes;
  r.mapped = pageRound(bytes == 0 ? 1 : bytes);
  r.flags = flags;
  r.context = currentContext_;
  r.path = fmt::format("/dev/shm/phos-{}-{}-pinned-{}", getpid(), id_, ++pinnedSerial_);
  // Place it after the session's last range, inside the session's slice.
  const uintptr_t slice = kPinnedWindow + (id_ % kPinnedSlices) * kPinnedSlice;
  uintptr_t at = slice;
  if (!pinned_.empty()) {
    const auto& last = pinned_.rbegin()->second;
    at = last.address + last.mapped;
  }
  if (at + r.mapped > slice + kPinnedSlice) {
    return makeError(Code::kResourceExhausted, "pinned memory of session {} exceeds {} bytes", id_, kPinnedSlice);
  }
  int fd = open(r.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errnoError(errno, fmt::format("cannot create {}", r.path));
  if (ftruncate(fd, static_cast<off_t>(r.mapped)) != 0) {
    int e = errno;
    close(fd);
    unlink(r.path.c_str());
    return errnoError(e, fmt::format("cannot size {} to {} bytes", r.path, r.mapped));
  }
  if (fchown(fd, uid_, static_cast<gid_t>(-1)) != 0 && geteuid() == 0) {
    int e = errno;
    close(fd);
    unlink(r.path.c_str());
    return errnoError(e, fmt::format("cannot give {} to uid {}", r.path, uid_));
  }
  void* p = mmap(reinterpret_cast<void*>(at), r.mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE,
                 fd, 0);
  close(fd);
  if (p == MAP_FAILED || p != reinterpret_cast<void*>(at)) {
    int e = errno;
    if (p != MAP_FAILED) munmap(p, r.mapped);
    unlink(r.path.c_str());
    return errnoError(e, fmt::format("cannot map {} at {:#x}", r.path, at));
  }
  r.address = at;
  pinned_[r.address] = r;
  return r;
}

Status Session::freePinned(uintptr_t address) {
  auto it = pinned_.find(address);
  if (it == pinned_.end()) return makeError(Code::kNotFound, "{:#x} is not pinned memory of this session", address);
  munmap(reinterpret_cast<void*>(it->second.address), it->second.mapped);
  unlink(it->second.path.c_str());
  pinned_.erase(it);
  return Status::ok();
}

Result<CUstream> Session::perThreadStream(uint64_t thread) {
  auto key = std::make_pair(thread, currentContext_);
  if (auto it = perThreadStreams_.find(key); it != perThreadStreams_.end()) return it->second;
  CUstream s = nullptr;
  // "The per-thread default stream is not a non-blocking stream and will
  // synchronize with the legacy default stream": a blocking stream (flags 0).
  CUresult r = PHOS_DRIVER(driver_, StreamCreate)(&s, CU_STREAM_DEFAULT);
  if (r != CUDA_SUCCESS) {
    return makeError(Code::kResourceExhausted, "cannot create a per-thread stream (CUresult {})", static_cast<int>(r));
  }
  perThreadStreams_[key] = s;
  return s;
}

Status Session::readApplication(uintptr_t address, void* out, size_t bytes) const {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(out) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    ssize_t n = process_vm_readv(pid_, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      return errnoError(n < 0 ? errno : EFAULT,
                        fmt::format("cannot read {} bytes at {:#x} of pid {}", bytes - done, address + done, pid_));
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
    ssize_t n = process_vm_writev(pid_, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      return errnoError(n < 0 ? errno : EFAULT,
                        fmt::format("cannot write {} bytes at {:#x} of pid {}", bytes - done, address + done, pid_));
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

std::span<std::byte> Session::staging() {
  if (staging_ == nullptr) {
    if (posix_memalign(&staging_, 4096, kStagingBytes) != 0) return {};
    stagingBytes_ = kStagingBytes;
  }
  return {static_cast<std::byte*>(staging_), stagingBytes_};
}

void Session::destroyContext(uint64_t id) {
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return;
  const CUcontext real = it->second.real;
  const int device = it->second.device;
  for (auto a = allocations_.begin(); a != allocations_.end();) {
    a = a->second.context == id ? allocations_.erase(a) : std::next(a);
  }
  for (auto s = perThreadStreams_.begin(); s != perThreadStreams_.end();) {
    s = s->first.second == id ? perThreadStreams_.erase(s) : std::next(s);
  }
  if (currentReal_ == real) {
    PHOS_DRIVER(driver_, CtxSetCurrent)(nullptr);
    currentReal_ = nullptr;
  }
  handles_.erase(id);
  contexts_.erase(it);
  pool_.retire(real, device);
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

}  // namespace phos::daemon
