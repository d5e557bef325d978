// SPDX-License-Identifier: Apache-2.0
// Where device memory lives in this process: per-device VA windows, the allocation map, VMM reservations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <vector>

#include "phos/common/status.h"

namespace phos::vgpu {

inline constexpr std::size_t kPageSize = 4096;
inline constexpr std::size_t kVmmGranularity = std::size_t{2} << 20;  // 2 MiB, as on A100/H100

enum class MemoryKind {
  kDevice,          // cuMemAlloc*, module globals
  kHostPinned,      // cuMemAllocHost / cuMemHostAlloc
  kHostRegistered,  // cuMemHostRegister
  kVmmMapping,      // cuMemMap of a cuMemCreate handle
};

// One live range of the unified address space that vgpu knows about.
struct Allocation {
  std::uint64_t base = 0;
  std::size_t size = 0;
  MemoryKind kind = MemoryKind::kDevice;
  int device = -1;               // owning device; -1 for host memory
  std::uint64_t context = 0;     // owning context id; 0 for VMM mappings
  std::uint64_t bufferId = 0;    // CU_POINTER_ATTRIBUTE_BUFFER_ID, unique per allocation
  unsigned hostFlags = 0;        // CU_MEMHOSTALLOC_* / CU_MEMHOSTREGISTER_*
  std::uint64_t vmmHandle = 0;   // kVmmMapping: the physical allocation mapped here
  std::uint32_t accessDevices = 0;  // kVmmMapping: bit d set when device d has access
  bool readOnlyAccess = false;
  std::uint64_t pool = 0;        // kDevice from a memory pool: its handle
  bool managed = false;          // kDevice from cuMemAllocManaged: every context may use it
};

// The map from addresses to allocations: interval lookup in O(log n).
class AllocationMap {
 public:
  // kAlreadyExists if [base, base+size) overlaps a live range.
  Status insert(const Allocation& allocation);
  // The allocation starting exactly at `base`.
  std::optional<Allocation> erase(std::uint64_t base);
  // The allocation containing `address`.
  std::optional<Allocation> find(std::uint64_t address) const;
  // The allocation containing all of [address, address+size), size >= 1.
  std::optional<Allocation> findRange(std::uint64_t address, std::size_t size) const;
  // Allocations overlapping [address, address+size).
  std::vector<Allocation> overlapping(std::uint64_t address, std::size_t size) const;
  // Replaces the record of a live allocation (same base).
  Status update(const Allocation& allocation);
  std::vector<Allocation> ownedBy(std::uint64_t context) const;
  // Runs `access` with the map locked if all of [address, address+size) is in
  // a live allocation, and says whether it ran. Memory is unmapped or made
  // inaccessible only after its allocation left the map, so `access` cannot
  // fault on memory freed meanwhile (a stream memory wait still polling it).
  template <typename F>
  bool whileLive(std::uint64_t address, std::size_t size, F&& access) const {
    std::shared_lock lock(mutex_);
    auto it = byBase_.upper_bound(address);
    if (it == byBase_.begin()) return false;
    --it;
    const Allocation& a = it->second;
    if (size == 0 || size > a.size || address - a.base > a.size - size) return false;
    access();
    return true;
  }

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::uint64_t, Allocation> byBase_;
};

// The cuMemAlloc window of one device: [base, base+window) reserved PROT_NONE at
// first use; allocations are page-granular placements inside it made read-write,
// and dropped (contents discarded) again when freed. Also the device's memory
// budget, which VMM physical allocations draw from too.
class DeviceHeap {
 public:
  DeviceHeap(int device, std::uint64_t base, std::uint64_t window, std::size_t capacity);
  ~DeviceHeap();
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  // CUDA_ERROR_OUT_OF_MEMORY when the budget or the window is exhausted.
  Result<std::uint64_t> allocate(std::size_t bytes, std::size_t alignment);
  // At exactly `address` (page-aligned), if that range is free.
  Result<std::uint64_t> allocateAt(std::uint64_t address, std::size_t bytes);
  Status release(std::uint64_t address, std::size_t bytes);
  // Budget only (VMM physical memory, which is backed by memfds).
  Status charge(std::size_t bytes);
  void refund(std::size_t bytes);

  std::size_t capacity() const { return capacity_; }
  std::size_t used() const;
  std::uint64_t base() const { return base_; }
  std::uint64_t window() const { return window_; }

 private:
  Status reserveWindow();

  const int device_;
  const std::uint64_t base_;
  const std::uint64_t window_;
  const std::size_t capacity_;
  mutable std::mutex mutex_;
  bool reserved_ = false;
  std::size_t used_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_;  // offset -> length, coalesced
};

// Reserves PROT_NONE address space: at `fixed` when non-zero and free, else anywhere
// in the VMM arena (above every device window). Returns the base.
Result<std::uint64_t> reserveAddressRange(std::uint64_t fixed, std::size_t size,
                                          std::size_t alignment);
Status releaseAddressRange(std::uint64_t base, std::size_t size);
// Makes a range inaccessible again and discards its contents (keeps it reserved).
Status discardRange(std::uint64_t base, std::size_t size);

inline std::size_t roundUp(std::size_t value, std::size_t to) {
  return (value + to - 1) / to * to;
}

}  // namespace phos::vgpu
