// SPDX-License-Identifier: Apache-2.0
// The device VA windows, the allocation map and address-range reservation with mmap.
#include "address_space.h"

#include <sys/mman.h>

#include <cerrno>

#include <cuda.h>

#include "cu_status.h"

namespace phos::vgpu {
namespace {

// Above every device window (16 x 64 GiB from 0x200000000000).
constexpr std::uint64_t kVmmArenaBase = 0x300000000000ull;
constexpr std::uint64_t kVmmArenaEnd = 0x400000000000ull;

std::mutex& arenaMutex() {
  static std::mutex mutex;
  return mutex;
}

// Reserves exactly [address, address+size) or fails without touching existing mappings.
bool reserveExactly(std::uint64_t address, std::size_t size) {
  void* want = reinterpret_cast<void*>(address);
  void* got = mmap(want, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (got == MAP_FAILED) return false;
  if (got != want) {  // kernels before 4.17 treat the flag as a hint
    munmap(got, size);
    return false;
  }
  return true;
}

}  // namespace

Status AllocationMap::insert(const Allocation& allocation) {
  std::unique_lock lock(mutex_);
  auto next = byBase_.lower_bound(allocation.base);
  if (next != byBase_.end() && next->first < allocation.base + allocation.size) {
    return makeError(Code::kAlreadyExists, "range 0x{:x}+{} overlaps the allocation at 0x{:x}",
                     allocation.base, allocation.size, next->first);
  }
  if (next != byBase_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > allocation.base) {
      return makeError(Code::kAlreadyExists, "range 0x{:x}+{} overlaps the allocation at 0x{:x}",
                       allocation.base, allocation.size, prev->first);
    }
  }
  byBase_.emplace(allocation.base, allocation);
  return Status::ok();
}

std::optional<Allocation> AllocationMap::erase(std::uint64_t base) {
  std::unique_lock lock(mutex_);
  auto it = byBase_.find(base);
  if (it == byBase_.end()) return std::nullopt;
  Allocation a = it->second;
  byBase_.erase(it);
  return a;
}

std::optional<Allocation> AllocationMap::find(std::uint64_t address) const {
  std::shared_lock lock(mutex_);
  auto it = byBase_.upper_bound(address);
  if (it == byBase_.begin()) return std::nullopt;
  --it;
  if (address - it->first >= it->second.size) return std::nullopt;
  return it->second;
}

std::optional<Allocation> AllocationMap::findRange(std::uint64_t address, std::size_t size) const {
  auto a = find(address);
  if (!a || size == 0 || size > a->size || address - a->base > a->size - size) return std::nullopt;
  return a;
}

std::vector<Allocation> AllocationMap::overlapping(std::uint64_t address, std::size_t size) const {
  std::shared_lock lock(mutex_);
  std::vector<Allocation> out;
  auto it = byBase_.upper_bound(address);
  if (it != byBase_.begin()) --it;
  for (; it != byBase_.end() && it->first < address + size; ++it) {
    if (it->first + it->second.size > address) out.push_back(it->second);
  }
  return out;
}

Status AllocationMap::update(const Allocation& allocation) {
  std::unique_lock lock(mutex_);
  auto it = byBase_.find(allocation.base);
  if (it == byBase_.end()) {
    return makeError(Code::kNotFound, "no allocation at 0x{:x}", allocation.base);
  }
  it->second = allocation;
  return Status::ok();
}

std::vector<Allocation> AllocationMap::ownedBy(std::uint64_t context) const {
  std::shared_lock lock(mutex_);
  std::vector<Allocation> out;
  for (const auto& [base, a] : byBase_) {
    if (a.context == context) out.push_back(a);
  }
  return out;
}

DeviceHeap::DeviceHeap(int device, std::uint64_t base, std::uint64_t window, std::size_t capacity)
    : device_(device), base_(base), window_(window), capacity_(capacity) {
  free_.emplace(0, window);
}

DeviceHeap::~DeviceHeap() {
  if (reserved_) munmap(reinterpret_cast<void*>(base_), window_);
}

Status DeviceHeap::reserveWindow() {
  if (reserved_) return Status::ok();
  if (!reserveExactly(base_, window_)) {
    return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY,
                    "cannot reserve device {}'s window 0x{:x}+0x{:x}: {}", device_, base_,
                    window_, errno == EEXIST ? "something else is mapped there" : "mmap failed");
  }
  reserved_ = true;
  return Status::ok();
}

Result<std::uint64_t> DeviceHeap::allocate(std::size_t bytes, std::size_t alignment) {
  std::size_t length = roundUp(bytes, kPageSize);
  alignment = std::max(alignment, kPageSize);
  std::lock_guard lock(mutex_);
  RETURN_IF_ERROR(reserveWindow());
  if (length > capacity_ - used_) {
    return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY, "device {}: {} bytes requested, {} of {} free",
                    device_, bytes, capacity_ - used_, capacity_);
  }
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    std::uint64_t start = roundUp(it->first, alignment);
    if (start + length > it->first + it->second) continue;
    std::uint64_t blockStart = it->first;
    std::uint64_t blockEnd = it->first + it->second;
    free_.erase(it);
    if (start > blockStart) free_.emplace(blockStart, start - blockStart);
    if (blockEnd > start + length) free_.emplace(start + length, blockEnd - (start + length));
    void* p = reinterpret_cast<void*>(base_ + start);
    if (mprotect(p, length, PROT_READ | PROT_WRITE) != 0) {
      int err = errno;
      free_.emplace(start, length);  // coalescing is restored by the next release
      return errnoError(err, "mprotect of device memory");
    }
    used_ += length;
    return base_ + start;
  }
  return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY, "device {}: no free range of {} bytes in the window",
                  device_, bytes);
}

Result<std::uint64_t> DeviceHeap::allocateAt(std::uint64_t address, std::size_t bytes) {
  const std::size_t length = roundUp(bytes, kPageSize);
  std::lock_guard lock(mutex_);
  RETURN_IF_ERROR(reserveWindow());
  if (address < base_ || address % kPageSize != 0 || address - base_ > window_ || length > window_ - (address - base_)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "device {}: 0x{:x} is not a page of the window", device_, address);
  }
  if (length > capacity_ - used_) {
    return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY, "device {}: {} bytes requested, {} of {} free", device_, bytes,
                    capacity_ - used_, capacity_);
  }
  const std::uint64_t start = address - base_;
  auto it = free_.upper_bound(start);
  if (it == free_.begin()) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "device {}: 0x{:x} is taken", device_, address);
  }
  --it;
  const std::uint64_t blockStart = it->first, blockEnd = it->first + it->second;
  if (start + length > blockEnd) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "device {}: [0x{:x}, +{}) is taken", device_, address, length);
  }
  free_.erase(it);
  if (start > blockStart) free_.emplace(blockStart, start - blockStart);
  if (blockEnd > start + length) free_.emplace(start + length, blockEnd - (start + length));
  if (mprotect(reinterpret_cast<void*>(address), length, PROT_READ | PROT_WRITE) != 0) {
    const int err = errno;
    free_.emplace(start, length);
    return errnoError(err, "mprotect of device memory");
  }
  used_ += length;
  return address;
}

Status DeviceHeap::release(std::uint64_t address, std::size_t bytes) {
  std::size_t length = roundUp(bytes, kPageSize);
  RETURN_IF_ERROR(discardRange(address, length));
  std::lock_guard lock(mutex_);
  std::uint64_t start = address - base_;
  std::uint64_t end = start + length;
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      free_.erase(prev);
    }
  }
  free_.emplace(start, end - start);
  used_ -= length;
  return Status::ok();
}

Status DeviceHeap::charge(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes > capacity_ - used_) {
    return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY, "device {}: {} bytes requested, {} of {} free",
                    device_, bytes, capacity_ - used_, capacity_);
  }
  used_ += bytes;
  return Status::ok();
}

void DeviceHeap::refund(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  used_ -= std::min(bytes, used_);
}

std::size_t DeviceHeap::used() const {
  std::lock_guard lock(mutex_);
  return used_;
}

Result<std::uint64_t> reserveAddressRange(std::uint64_t fixed, std::size_t size,
                                          std::size_t alignment) {
  if (fixed != 0 && fixed % kPageSize == 0 && reserveExactly(fixed, size)) return fixed;
  alignment = std::max(alignment, kVmmGranularity);
  std::lock_guard lock(arenaMutex());
  static std::uint64_t cursor = kVmmArenaBase;
  for (std::uint64_t at = roundUp(cursor, alignment); at + size <= kVmmArenaEnd;
       at = roundUp(at + alignment, alignment)) {
    if (reserveExactly(at, size)) {
      cursor = at + size;
      return at;
    }
  }
  return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY, "no free virtual range of {} bytes", size);
}

Status releaseAddressRange(std::uint64_t base, std::size_t size) {
  if (munmap(reinterpret_cast<void*>(base), size) != 0) return errnoError(errno, "munmap");
  return Status::ok();
}

Status discardRange(std::uint64_t base, std::size_t size) {
  void* p = mmap(reinterpret_cast<void*>(base), size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) return errnoError(errno, "mmap(MAP_FIXED) to discard a range");
  return Status::ok();
}

}  // namespace phos::vgpu
