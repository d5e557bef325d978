// SPDX-License-Identifier: Apache-2.0
// The stream-ordered allocator's pools (cuMemPool*, cuMemAllocAsync): what
// each pool is and counts. Its memory comes from the device heap like
// cuMemAlloc's and goes back to it when a free runs in its stream, so a pool
// reserves nothing beyond what its allocations and pending frees hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "address_space.h"
#include "phos/common/status.h"

namespace phos::vgpu {

// What an allocation of `bytes` holds of the device heap: whole pages.
inline std::size_t pooledBytes(std::size_t bytes) { return (bytes + kPageSize - 1) / kPageSize * kPageSize; }

struct MemoryPool {
  std::uint64_t id = 0;  // the handle's value
  int device = 0;
  bool isDefault = false;
  bool destroyed = false;  // cuMemPoolDestroy with allocations outstanding
  std::size_t maxSize = 0;  // 0: no limit but the device's
  std::uint64_t releaseThreshold = 0;
  int reuse[3] = {1, 1, 1};  // FOLLOW_EVENT_DEPENDENCIES, ALLOW_OPPORTUNISTIC, ALLOW_INTERNAL_DEPENDENCIES
  std::uint64_t used = 0, usedHigh = 0;          // bytes of the allocations the application holds
  std::uint64_t reserved = 0, reservedHigh = 0;  // bytes of the heap behind them and pending frees
};

class MemoryPools {
 public:
  // Handles carry this tag in bits 44 and up (HandleKind::kMemPool).
  explicit MemoryPools(std::uint64_t tag) : tag_(tag) {}

  // The default pool of `device`, whose handle is always the same.
  std::uint64_t defaultPool(int device);
  std::uint64_t currentPool(int device);
  Status setCurrent(int device, std::uint64_t pool);
  std::uint64_t create(int device, std::size_t maxSize);
  Status destroy(std::uint64_t pool);
  // A copy of a live (not destroyed) pool, or NOT_FOUND.
  Result<MemoryPool> get(std::uint64_t pool);
  // Runs `change` on a live pool under the lock.
  template <typename Change>
  Status update(std::uint64_t pool, Change&& change) {
    std::lock_guard lock(mutex_);
    auto it = pools_.find(pool);
    if (it == pools_.end() || it->second.destroyed) return notAPool(pool);
    return change(it->second);
  }

  // Charges an allocation of `bytes` (`reserved` of the heap) to a pool:
  // OUT_OF_MEMORY past its maximum size.
  Status charge(std::uint64_t pool, std::size_t bytes, std::size_t reserved);
  // The application freed it (in stream order: it no longer holds it).
  void uncharge(std::uint64_t pool, std::size_t bytes);
  // Its memory went back to the heap.
  void release(std::uint64_t pool, std::size_t reserved);

 private:
  static Status notAPool(std::uint64_t pool);
  std::uint64_t tag_;
  std::mutex mutex_;
  std::map<std::uint64_t, MemoryPool> pools_;
  std::map<int, std::uint64_t> current_;
  std::uint64_t next_ = 0x1000;  // created pools; default pools are device + 1
};

}  // namespace phos::vgpu
