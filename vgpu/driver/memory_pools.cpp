// SPDX-License-Identifier: Apache-2.0
// The stream-ordered allocator's pools (memory_pools.h).
#include "memory_pools.h"

#include <algorithm>

#include <cuda.h>

#include "cu_status.h"

namespace phos::vgpu {

Status MemoryPools::notAPool(std::uint64_t pool) {
  return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a memory pool", pool);
}

std::uint64_t MemoryPools::defaultPool(int device) {
  std::lock_guard lock(mutex_);
  const std::uint64_t id = tag_ | static_cast<std::uint64_t>(device + 1);
  auto [it, added] = pools_.try_emplace(id);
  if (added) {
    it->second.id = id;
    it->second.device = device;
    it->second.isDefault = true;
  }
  return id;
}

std::uint64_t MemoryPools::currentPool(int device) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = current_.find(device); it != current_.end()) return it->second;
  }
  return defaultPool(device);
}

Status MemoryPools::setCurrent(int device, std::uint64_t pool) {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(pool);
  if (it == pools_.end() || it->second.destroyed) return notAPool(pool);
  if (it->second.device != device) {
    return cuErrorf(CUDA_ERROR_INVALID_DEVICE, "the pool is of device {}, not {}", it->second.device, device);
  }
  current_[device] = pool;
  return Status::ok();
}

std::uint64_t MemoryPools::create(int device, std::size_t maxSize) {
  std::lock_guard lock(mutex_);
  const std::uint64_t id = tag_ | next_++;
  MemoryPool& p = pools_[id];
  p.id = id;
  p.device = device;
  p.maxSize = maxSize;
  return id;
}

Status MemoryPools::destroy(std::uint64_t pool) {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(pool);
  if (it == pools_.end() || it->second.destroyed) return notAPool(pool);
  if (it->second.isDefault) return cuError(CUDA_ERROR_INVALID_VALUE, "a device's default memory pool cannot be destroyed");
  // "Destroying the current mempool of a device sets the default mempool of
  // that device as the current mempool for that device."
  if (auto c = current_.find(it->second.device); c != current_.end() && c->second == pool) current_.erase(c);
  // Released "once there are no more outstanding allocations".
  if (it->second.reserved == 0) {
    pools_.erase(it);
  } else {
    it->second.destroyed = true;
  }
  return Status::ok();
}

Result<MemoryPool> MemoryPools::get(std::uint64_t pool) {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(pool);
  if (it == pools_.end() || it->second.destroyed) return notAPool(pool);
  return it->second;
}

Status MemoryPools::charge(std::uint64_t pool, std::size_t bytes, std::size_t reserved) {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(pool);
  if (it == pools_.end() || it->second.destroyed) return notAPool(pool);
  MemoryPool& p = it->second;
  if (p.maxSize != 0 && (bytes > p.maxSize || p.used + bytes > p.maxSize)) {
    return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY, "the pool holds {} of its {} bytes; {} more do not fit", p.used,
                    p.maxSize, bytes);
  }
  p.used += bytes;
  p.usedHigh = std::max(p.usedHigh, p.used);
  p.reserved += reserved;
  p.reservedHigh = std::max(p.reservedHigh, p.reserved);
  return Status::ok();
}

void MemoryPools::uncharge(std::uint64_t pool, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (auto it = pools_.find(pool); it != pools_.end()) it->second.used -= std::min<std::uint64_t>(it->second.used, bytes);
}

void MemoryPools::release(std::uint64_t pool, std::size_t reserved) {
  std::lock_guard lock(mutex_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) return;
  it->second.reserved -= std::min<std::uint64_t>(it->second.reserved, reserved);
  if (it->second.destroyed && it->second.reserved == 0) pools_.erase(it);
}

}  // namespace phos::vgpu
