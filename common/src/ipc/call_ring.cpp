// SPDX-License-Identifier: Apache-2.0
// CallRing implementation: Vyukov-style slot sequences plus shared futexes.
#include "phos/common/ipc/call_ring.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "phos/common/ipc/shared_futex.h"
#include "phos/common/ipc/transfer_lane.h"
#include "phos/common/subprocess.h"

namespace phos::ipc {
namespace detail {

constexpr uint64_t kMagic = 0x474e4952534f4850ull;  // "PHOSRING"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 4096;

// First page of the file. Positions count calls since the ring was created;
// slot(p) = p % slotCount. Each slot's sequence tells whose turn it is:
//   p             free, for the producer that claims position p
//   p + 1         request published, for the daemon
//   p + slotCount free again, for the producer of the next lap
struct RingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t slotCount;
  uint32_t slotBytes;
  std::atomic<int32_t> ownerPid;  // the daemon, for liveness checks by callers
  alignas(64) std::atomic<uint64_t> claimPosition;
  alignas(64) std::atomic<uint64_t> readPosition;  // the daemon's, for information only
  alignas(64) std::atomic<uint32_t> doorbell;      // futex: bumped after each publish
  std::atomic<uint32_t> daemonWaiting;
  alignas(64) std::atomic<uint32_t> spaceBell;     // futex: bumped when a slot frees
  std::atomic<uint32_t> producersWaiting;
  // Transfer lanes after the slots (zero in rings made before lanes existed).
  alignas(64) uint32_t laneCount;
  uint32_t laneSlotBytes;
};
static_assert(sizeof(RingHeader) <= kHeaderBytes);

constexpr uint32_t kExpectsReply = 1;

struct alignas(64) SlotHeader {
  std::atomic<uint64_t> sequence;
  std::atomic<uint32_t> replied;  // futex: 0 until the daemon has replied
  uint32_t flags;
  uint32_t requestBytes;
  uint32_t replyBytes;
};
static_assert(sizeof(SlotHeader) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

}  // namespace detail

namespace {

using detail::RingHeader;
using detail::SlotHeader;

// The header and the slots: what a snapshot holds.
size_t ringBytes(const RingGeometry& g) { return detail::kHeaderBytes + size_t{g.slotCount} * g.slotBytes; }

// A lane: its words' page, then its two buffers.
size_t laneBytes(const RingGeometry& g) { return kLaneWordsBytes + 2 * size_t{g.laneSlotBytes}; }

size_t fileBytes(const RingGeometry& g) {
  // Lanes start on a page, for the driver to register them.
  const size_t ring = (ringBytes(g) + kLaneWordsBytes - 1) / kLaneWordsBytes * kLaneWordsBytes;
  return ring + size_t{g.laneCount} * laneBytes(g);
}

Status checkGeometry(const RingGeometry& g) {
  if (g.slotCount == 0 || (g.slotCount & (g.slotCount - 1)) != 0 || g.slotCount > (1u << 20)) {
    return makeError(Code::kInvalidArgument, "ring slot count {} is not a power of two <= 2^20",
                     g.slotCount);
  }
  if (g.slotBytes < 128 || g.slotBytes % 64 != 0 || g.slotBytes > (64u << 20)) {
    return makeError(Code::kInvalidArgument,
                     "ring slot size {} is not a multiple of 64 in [128, 64 MiB]", g.slotBytes);
  }
  if (g.laneCount > RingGeometry::kMaxLanes) {
    return makeError(Code::kInvalidArgument, "ring has {} transfer lanes, at most {}", g.laneCount,
                     RingGeometry::kMaxLanes);
  }
  if (g.laneCount != 0 && (g.laneSlotBytes == 0 || g.laneSlotBytes % 4096 != 0 || g.laneSlotBytes > (64u << 20))) {
    return makeError(Code::kInvalidArgument,
                     "transfer lane buffer size {} is not a multiple of 4096 in [4096, 64 MiB]", g.laneSlotBytes);
  }
  return Status::ok();
}

Result<void*> mapFile(int fd, size_t bytes, const std::string& path) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return errnoError(errno, "mmap " + path);
  return base;
}

}  // namespace

size_t CallRing::payloadCapacity(const RingGeometry& g) {
  return g.slotBytes - sizeof(SlotHeader);
}

CallRing::CallRing(void* base, size_t size, RingGeometry geometry, bool owner)
    : base_(base), size_(size), geometry_(geometry), owner_(owner) {}

CallRing::CallRing(CallRing&& other) noexcept { *this = std::move(other); }

CallRing& CallRing::operator=(CallRing&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) munmap(base_, size_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    geometry_ = other.geometry_;
    owner_ = other.owner_;
    readPosition_ = other.readPosition_;
    livenessPeriod_ = other.livenessPeriod_;
    path_ = std::move(other.path_);
  }
  return *this;
}

CallRing::~CallRing() {
  if (base_ != nullptr) munmap(base_, size_);
}

RingHeader& CallRing::header() const { return *static_cast<RingHeader*>(base_); }

SlotHeader& CallRing::slot(uint64_t position) const {
  auto* first = static_cast<std::byte*>(base_) + detail::kHeaderBytes;
  size_t index = position & (geometry_.slotCount - 1);
  return *reinterpret_cast<SlotHeader*>(first + index * geometry_.slotBytes);
}

std::byte* CallRing::payload(uint64_t position) const {
  return reinterpret_cast<std::byte*>(&slot(position)) + sizeof(SlotHeader);
}

Result<CallRing> CallRing::create(const std::string& path, RingGeometry geometry, UniqueFd* sharedLock) {
  RETURN_IF_ERROR(checkGeometry(geometry));
  // Made unnamed in the ring's directory (O_TMPFILE), sized, filled in and
  // locked, then linked to `path`: a link never replaces a file, and no one
  // ever sees the ring unlocked or half made (a restore that found it
  // unlocked would take it for a stale one and remove it).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  UniqueFd file(::open(dir.c_str(), O_RDWR | O_TMPFILE | O_CLOEXEC, 0600));
  if (!file) return errnoError(errno, "create ring file " + path);
  const int fd = file.get();
  size_t bytes = fileBytes(geometry);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return errnoError(errno, "size ring file " + path);
  if (sharedLock != nullptr && flock(fd, LOCK_SH) != 0) return errnoError(errno, "lock ring file " + path);
  ASSIGN_OR_RETURN(void* base, mapFile(fd, bytes, path));
  CallRing ring(base, bytes, geometry, true);
  // The file is fresh (zero-filled) and nobody else has mapped it yet.
  auto& h = ring.header();
  h.magic = detail::kMagic;
  h.version = detail::kVersion;
  h.slotCount = geometry.slotCount;
  h.slotBytes = geometry.slotBytes;
  h.laneCount = geometry.laneCount;
  h.laneSlotBytes = geometry.laneSlotBytes;
  h.ownerPid.store(getpid());
  for (uint64_t p = 0; p < geometry.slotCount; ++p) ring.slot(p).sequence.store(p);
  // linkat(AT_EMPTY_PATH) would need CAP_DAC_READ_SEARCH; the /proc link does not.
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) != 0) {
    if (errno == EEXIST) {
      return makeError(Code::kFailedPrecondition, "ring file {} exists: another session (or a restore of it) has it",
                       path);
    }
    return errnoError(errno, "create ring file " + path);
  }
  if (sharedLock != nullptr) *sharedLock = std::move(file);
  return ring;
}

Result<CallRing> CallRing::open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) return errnoError(errno, "open ring file " + path);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return errnoError(errno, "stat ring file " + path);
  size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < detail::kHeaderBytes) {
    return makeError(Code::kDataLoss, "ring file {} is {} bytes, too small for a header", path,
                     bytes);
  }
  auto base = mapFile(fd.get(), bytes, path);
  fd.reset();
  if (!base) return base.status();
  const auto* h = static_cast<const RingHeader*>(*base);
  RingGeometry g{h->slotCount, h->slotBytes, h->laneCount, h->laneSlotBytes};
  Status bad;
  if (h->magic != detail::kMagic) {
    bad = makeError(Code::kDataLoss, "{} is not a PhOS ring (bad magic)", path);
  } else if (h->version != detail::kVersion) {
    bad = makeError(Code::kFailedPrecondition, "ring {} has version {}, this build speaks {}",
                    path, h->version, detail::kVersion);
  } else if (Status s = checkGeometry(g); !s.isOk()) {
    bad = std::move(s).withContext(path);
  } else if (fileBytes(g) != bytes) {
    bad = makeError(Code::kDataLoss, "ring file {} is {} bytes, its geometry needs {}", path,
                    bytes, fileBytes(g));
  }
  if (!bad.isOk()) {
    munmap(*base, bytes);
    return bad;
  }
  CallRing ring(*base, bytes, g, false);
  ring.path_ = path;
  return ring;
}

Status CallRing::ownerAlive() const {
  // A worker whose daemon died is reaped by init, which may take a second or
  // more: its zombie must not keep a caller waiting.
  pid_t pid = header().ownerPid.load();
  if (!processEnded(pid)) return Status::ok();
  // Out of sight, or gone: a daemon holds a shared flock on the ring file
  // while it serves it (create's sharedLock), which an exclusive one tried
  // here runs into. (The descriptor lives for this check only.)
  if (!path_.empty()) {
    UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd && flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) return Status::ok();
  }
  return makeError(Code::kUnavailable, "phosd (pid {}) serving this ring is gone", pid);
}

Result<uint64_t> CallRing::claim() {
  auto& h = header();
  uint64_t pos = h.claimPosition.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t seq = slot(pos).sequence.load(std::memory_order_acquire);
    auto diff = static_cast<int64_t>(seq - pos);
    if (diff == 0) {
      if (h.claimPosition.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
        return pos;
      }
      continue;  // `pos` was reloaded by the failed exchange
    }
    if (diff < 0) {
      // Full: the slot still holds the call from one lap ago. Sleep until a
      // slot frees, checking that someone is still there to free it.
      uint32_t bell = h.spaceBell.load();
      h.producersWaiting.fetch_add(1);
      if (slot(pos).sequence.load(std::memory_order_acquire) == seq) {
        futexWait(&h.spaceBell, bell, livenessPeriod_);
      }
      h.producersWaiting.fetch_sub(1);
      RETURN_IF_ERROR(ownerAlive());
    }
    pos = h.claimPosition.load(std::memory_order_relaxed);
  }
}

namespace {
void publish(RingHeader& h, SlotHeader& s, uint64_t pos) {
  s.sequence.store(pos + 1, std::memory_order_release);
  h.doorbell.fetch_add(1);
  if (h.daemonWaiting.load() != 0) futexWake(&h.doorbell);
}

void release(RingHeader& h, SlotHeader& s, uint64_t pos, uint32_t slotCount) {
  s.sequence.store(pos + slotCount, std::memory_order_release);
  h.spaceBell.fetch_add(1);
  if (h.producersWaiting.load() != 0) futexWake(&h.spaceBell);
}
}  // namespace

Result<uint64_t> CallRing::enqueue(std::span<const std::byte> request, bool expectsReply) {
  if (request.size() > payloadCapacity()) {
    return makeError(Code::kInvalidArgument, "call of {} bytes exceeds the ring's {}-byte slots",
                     request.size(), payloadCapacity());
  }
  ASSIGN_OR_RETURN(uint64_t pos, claim());
  SlotHeader& s = slot(pos);
  std::memcpy(payload(pos), request.data(), request.size());
  s.requestBytes = static_cast<uint32_t>(request.size());
  s.replyBytes = 0;
  s.flags = expectsReply ? detail::kExpectsReply : 0;
  s.replied.store(0, std::memory_order_relaxed);
  publish(header(), s, pos);
  return pos;
}

Status CallRing::post(std::span<const std::byte> request) {
  return enqueue(request, false).status();
}

Result<size_t> CallRing::call(std::span<const std::byte> request, std::span<std::byte> reply) {
  ASSIGN_OR_RETURN(uint64_t pos, enqueue(request, true));
  return awaitReply(pos, reply);
}

Result<size_t> CallRing::call(std::span<const std::byte> request, std::span<std::byte> reply,
                              const Meanwhile& meanwhile) {
  ASSIGN_OR_RETURN(uint64_t pos, enqueue(request, true));
  SlotHeader& s = slot(pos);
  meanwhile([&s] { return s.replied.load(std::memory_order_acquire) != 0; });
  return awaitReply(pos, reply);
}

Result<size_t> CallRing::awaitReply(uint64_t pos, std::span<std::byte> reply) {
  SlotHeader& s = slot(pos);
  while (s.replied.load(std::memory_order_acquire) == 0) {
    futexWait(&s.replied, 0, livenessPeriod_);
    if (s.replied.load(std::memory_order_acquire) != 0) break;
    // The slot stays claimed if the daemon is gone: nobody will serve it again.
    RETURN_IF_ERROR(ownerAlive());
  }
  size_t n = s.replyBytes;
  Status fits = Status::ok();
  if (n > reply.size() || n > payloadCapacity()) {
    fits = makeError(Code::kOutOfRange, "reply of {} bytes does not fit the caller's {} bytes", n,
                     reply.size());
  } else {
    std::memcpy(reply.data(), payload(pos), n);
  }
  release(header(), s, pos, geometry_.slotCount);
  RETURN_IF_ERROR(fits);
  return n;
}

Result<CallRing::Request> CallRing::next(std::chrono::milliseconds timeout) {
  auto& h = header();
  const uint64_t pos = readPosition_;
  SlotHeader& s = slot(pos);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (s.sequence.load(std::memory_order_acquire) != pos + 1) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return makeError(Code::kNotFound, "no call within {} ms", timeout.count());
    }
    h.daemonWaiting.store(1);
    uint32_t bell = h.doorbell.load();
    if (s.sequence.load(std::memory_order_acquire) != pos + 1) futexWait(&h.doorbell, bell, left);
    h.daemonWaiting.store(0);
  }
  // Everything below is client-written: check it before use.
  uint32_t bytes = s.requestBytes;
  if (bytes > payloadCapacity()) {
    return makeError(Code::kDataLoss, "call at position {} claims {} bytes, slots carry {}", pos,
                     bytes, payloadCapacity());
  }
  readPosition_ = pos + 1;
  h.readPosition.store(readPosition_, std::memory_order_relaxed);
  return Request{pos, {payload(pos), bytes}, (s.flags & detail::kExpectsReply) != 0};
}

Status CallRing::reply(const Request& request, std::span<const std::byte> bytes) {
  if (!request.expectsReply) {
    return makeError(Code::kFailedPrecondition, "call at position {} expects no reply",
                     request.position);
  }
  if (bytes.size() > payloadCapacity()) {
    return makeError(Code::kInvalidArgument, "reply of {} bytes exceeds the ring's {}-byte slots",
                     bytes.size(), payloadCapacity());
  }
  SlotHeader& s = slot(request.position);
  std::memcpy(payload(request.position), bytes.data(), bytes.size());
  s.replyBytes = static_cast<uint32_t>(bytes.size());
  s.replied.store(1, std::memory_order_release);
  futexWake(&s.replied);
  return Status::ok();
}

void CallRing::finish(const Request& request) {
  if (request.expectsReply) return;  // the caller frees the slot after reading the reply
  release(header(), slot(request.position), request.position, geometry_.slotCount);
}

uint64_t CallRing::pending() const {
  return header().claimPosition.load(std::memory_order_relaxed) - readPosition_;
}

TransferLane CallRing::lane(uint32_t index) const {
  const size_t first = fileBytes(RingGeometry{geometry_.slotCount, geometry_.slotBytes, 0, 0});
  auto* base = static_cast<std::byte*>(base_) + first + index * laneBytes(geometry_);
  TransferLane lane;
  lane.words = reinterpret_cast<LaneWords*>(base);
  lane.buffers[0] = base + kLaneWordsBytes;
  lane.buffers[1] = lane.buffers[0] + geometry_.laneSlotBytes;
  lane.bufferBytes = geometry_.laneSlotBytes;
  return lane;
}

CallRing::Snapshot CallRing::snapshot() const {
  Snapshot snap;
  snap.bytes.resize(ringBytes(geometry_));
  std::memcpy(snap.bytes.data(), base_, snap.bytes.size());
  snap.readPosition = readPosition_;
  return snap;
}

Status CallRing::restoreSnapshot(const Snapshot& snap) {
  if (snap.bytes.size() != ringBytes(geometry_)) {
    return makeError(Code::kInvalidArgument,
                     "ring snapshot is {} bytes, this ring is {} (different geometry)",
                     snap.bytes.size(), ringBytes(geometry_));
  }
  // The snapshot's header names the lanes of the ring it was taken of: this
  // ring must have the same (restore creates it from the image's geometry).
  uint32_t lanes = 0, laneSlotBytes = 0;
  std::memcpy(&lanes, snap.bytes.data() + offsetof(RingHeader, laneCount), sizeof(lanes));
  std::memcpy(&laneSlotBytes, snap.bytes.data() + offsetof(RingHeader, laneSlotBytes), sizeof(laneSlotBytes));
  if (lanes != geometry_.laneCount || laneSlotBytes != geometry_.laneSlotBytes) {
    return makeError(Code::kInvalidArgument,
                     "ring snapshot has {} transfer lanes of 2 x {} bytes, this ring {} of 2 x {}", lanes,
                     laneSlotBytes, geometry_.laneCount, geometry_.laneSlotBytes);
  }
  std::memcpy(base_, snap.bytes.data(), snap.bytes.size());
  readPosition_ = snap.readPosition;
  header().readPosition.store(readPosition_);
  header().ownerPid.store(getpid());
  owner_ = true;
  return Status::ok();
}

}  // namespace phos::ipc
