// SPDX-License-Identifier: Apache-2.0
// The shim's link to phosd: the session's call ring, the state kept per
// application thread (its context stack), and what the shim knows of the
// session's objects (live contexts, pinned ranges, kernel parameter sizes).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "phos/common/ipc/call_ring.h"
#include "phos/common/ipc/transfer_lane.h"

namespace phos::shim {

class Connection {
 public:
  static Connection& instance();

  // Attaches to phosd (once per process; again in a forked child). Returns
  // the CUresult cuInit reports when it cannot.
  CUresult connect();
  bool connected() const { return ring_.has_value(); }
  ipc::CallRing& ring() { return *ring_; }
  uint64_t session() const { return session_; }
  const std::string& socketPath() const { return socketPath_; }

  // ---- what the shim knows of the session --------------------------------
  // A context and its device (created or retained through the shim: a
  // context's device never changes, so cuCtxGetDevice is answered here).
  void addContext(uint64_t id, int device);
  void removeContext(uint64_t id);
  bool knownContext(uint64_t id) const;
  std::optional<int> contextDevice(uint64_t id) const;  // nullopt: not known

  struct Pinned {
    uintptr_t address;
    size_t bytes;
    size_t mapped;
    // The application's own pages registered (cuMemHostRegister) in this
    // context; 0 for pinned memory phosd allocated.
    uint64_t registeredIn = 0;
  };
  void addPinned(const Pinned& p);
  std::optional<Pinned> removePinned(uintptr_t address);
  // Every range of [address, address+bytes): phosd freed them without a call
  // of the application's (with their context) and now hands the addresses out
  // again.
  std::vector<Pinned> removePinnedWithin(uintptr_t address, size_t bytes);
  // Every registration made in `context`: phosd ended them with it.
  std::vector<Pinned> removeRegisteredIn(uint64_t context);
  // True when [p, p+bytes) lies inside one pinned range.
  bool isPinned(uintptr_t p, size_t bytes) const;
  // Whether any byte of [address, address+bytes) is in a range.
  bool overlapsPinned(uintptr_t address, size_t bytes) const;

  // A primary context as the application holds it: retained `refs` times.
  // Returns the context whose last reference went (0 if none).
  void primaryRetained(int device, uint64_t context);
  uint64_t primaryReleased(int device);
  uint64_t primaryReset(int device);
  // cuDevicePrimaryCtxGetState's answer, as phosd last gave it: the state
  // changes only through the application's own calls (retain, release,
  // reset, set flags), which forget it. The runtime asks for it thousands of
  // times a second (PyTorch: 14662 calls in a 60-step job on an H200).
  struct PrimaryState {
    unsigned flags = 0;
    int active = 0;
  };
  std::optional<PrimaryState> primaryState(int device) const;
  void setPrimaryState(int device, PrimaryState state);
  void forgetPrimaryState(int device);

  // Parameter sizes of a function or kernel, cached (empty optional: unknown).
  std::optional<std::vector<uint32_t>> paramSizes(uint64_t function) const;
  void setParamSizes(uint64_t function, std::vector<uint32_t> sizes);

  // A transfer lane of the ring, the calling thread's until the claim goes
  // (none while every lane is in use by other threads).
  class LaneClaim {
   public:
    LaneClaim(std::atomic<uint32_t>& inUse, uint32_t index, ipc::TransferLane lane)
        : inUse_(&inUse), index_(index), lane_(lane) {}
    LaneClaim(LaneClaim&& other) noexcept
        : inUse_(std::exchange(other.inUse_, nullptr)), index_(other.index_), lane_(other.lane_) {}
    LaneClaim(const LaneClaim&) = delete;
    LaneClaim& operator=(const LaneClaim&) = delete;
    LaneClaim& operator=(LaneClaim&&) = delete;
    ~LaneClaim() {
      if (inUse_ != nullptr) inUse_->fetch_and(~(1u << index_), std::memory_order_release);
    }
    uint32_t index() const { return index_; }
    const ipc::TransferLane& lane() const { return lane_; }

   private:
    std::atomic<uint32_t>* inUse_;
    uint32_t index_;
    ipc::TransferLane lane_;
  };
  std::optional<LaneClaim> claimLane();

  // A copy of `value` that lives as long as the process: strings the
  // application may keep pointers to (cuFuncGetName).
  const char* intern(std::string_view value);

  // After fork(): the child has no session (CUDA: "the child process cannot
  // use the CUDA context of its parent").
  void forgetAfterFork();

 private:
  Connection() = default;
  std::mutex connectMutex_;
  std::optional<ipc::CallRing> ring_;
  uint64_t session_ = 0;
  std::string socketPath_;

  mutable std::shared_mutex mutex_;
  std::map<uint64_t, int> contexts_;  // id -> device
  std::map<uintptr_t, Pinned> pinned_;
  struct PrimaryRef {
    uint64_t context = 0;
    unsigned refs = 0;
    std::optional<PrimaryState> state;
  };
  std::map<int, PrimaryRef> primaries_;
  std::map<uint64_t, std::vector<uint32_t>> paramSizes_;
  std::set<std::string, std::less<>> strings_;
  std::atomic<uint32_t> lanesInUse_{0};  // bit i: lane i is claimed
};

// The calling thread's context stack (virtual ids), as CUDA keeps it per thread.
std::vector<uint64_t>& contextStack();
inline uint64_t currentContext() {
  auto& s = contextStack();
  return s.empty() ? 0 : s.back();
}
uint64_t threadId();

}  // namespace phos::shim
