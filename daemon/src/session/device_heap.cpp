// SPDX-License-Identifier: Apache-2.0
// DeviceHeap: fixed-address device memory through the VMM API.
#include "session/device_heap.h"

#include <algorithm>
#include <iterator>

namespace phos::daemon {

namespace {

CUmemAllocationProp propertiesFor(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

DeviceHeap::~DeviceHeap() {
  for (const auto& [address, block] : used_) {
    PHOS_DRIVER(driver_, MemUnmap)(address, block.mapped);
    PHOS_DRIVER(driver_, MemRelease)(block.handle);
  }
  if (reserved_ != 0) PHOS_DRIVER(driver_, MemAddressFree)(base(), reserved_);
}

CUresult DeviceHeap::reserve() {
  if (reserved_ != 0) return CUDA_SUCCESS;
  using cuda_api::EntryPointId;
  for (auto id : {EntryPointId::kCuMemAddressReserve, EntryPointId::kCuMemCreate, EntryPointId::kCuMemMap,
                  EntryPointId::kCuMemSetAccess, EntryPointId::kCuMemGetAllocationGranularity}) {
    if (!driver_.has(id)) return CUDA_ERROR_NOT_SUPPORTED;  // a driver older than CUDA 10.2
  }
  CUmemAllocationProp prop = propertiesFor(device_);
  CUresult r = PHOS_DRIVER(driver_, MemGetAllocationGranularity)(&granularity_, &prop,
                                                                 CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS) return r;
  size_t total = 0;
  r = PHOS_DRIVER(driver_, DeviceTotalMem_v2)(&total, device_);
  if (r != CUDA_SUCCESS) return r;
  // Twice the device's memory: room for fragmentation, never more than the
  // device's share of the window.
  const size_t want = std::min<size_t>(round(total) * 2, kDeviceStride);
  const CUdeviceptr setBytes = kDevicesPerSet * kDeviceStride;
  const CUdeviceptr first = base_;
  for (uint64_t attempt = 0;; ++attempt) {
    CUdeviceptr got = 0;
    r = PHOS_DRIVER(driver_, MemAddressReserve)(&got, want, granularity_, base_, 0);
    if (r == CUDA_SUCCESS && got == base_) break;
    // The driver may treat the address as a hint: a range elsewhere is useless
    // to a restore.
    if (r == CUDA_SUCCESS) PHOS_DRIVER(driver_, MemAddressFree)(got, want);
    if (exact_ || attempt + 1 == kSets) return CUDA_ERROR_OUT_OF_MEMORY;
    // The same window of the next set (wrapping around).
    const CUdeviceptr offset = (first - kBase + (attempt + 1) * setBytes) % (kSets * setBytes);
    base_ = kBase + offset;
  }
  reserved_ = want;
  free_[base()] = want;
  return CUDA_SUCCESS;
}

CUresult DeviceHeap::map(CUdeviceptr address, size_t mapped) {
  CUmemAllocationProp prop = propertiesFor(device_);
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = PHOS_DRIVER(driver_, MemCreate)(&handle, mapped, &prop, 0);
  if (r != CUDA_SUCCESS) return r;
  r = PHOS_DRIVER(driver_, MemMap)(address, mapped, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    PHOS_DRIVER(driver_, MemRelease)(handle);
    return r;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = PHOS_DRIVER(driver_, MemSetAccess)(address, mapped, &access, 1);
  if (r != CUDA_SUCCESS) {
    PHOS_DRIVER(driver_, MemUnmap)(address, mapped);
    PHOS_DRIVER(driver_, MemRelease)(handle);
    return r;
  }
  used_[address] = {mapped, handle};
  return CUDA_SUCCESS;
}

CUresult DeviceHeap::allocate(size_t bytes, CUdeviceptr* address) {
  // cuMemAlloc: "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE".
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = reserve(); r != CUDA_SUCCESS) return r;
  const size_t mapped = round(bytes);
  if (mapped < bytes) return CUDA_ERROR_OUT_OF_MEMORY;  // wrapped around
  auto hole = std::find_if(free_.begin(), free_.end(), [&](const auto& h) { return h.second >= mapped; });
  if (hole == free_.end()) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUdeviceptr at = hole->first;
  if (CUresult r = map(at, mapped); r != CUDA_SUCCESS) return r;
  const size_t rest = hole->second - mapped;
  free_.erase(hole);
  if (rest != 0) free_[at + mapped] = rest;
  *address = at;
  return CUDA_SUCCESS;
}

CUresult DeviceHeap::allocateAt(CUdeviceptr address, size_t bytes) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = reserve(); r != CUDA_SUCCESS) return r;
  const size_t mapped = round(bytes);
  auto hole = free_.upper_bound(address);
  if (hole == free_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --hole;
  const CUdeviceptr start = hole->first;
  const size_t length = hole->second;
  if (address % granularity_ != 0 || address - start > length || mapped > length - (address - start)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = map(address, mapped); r != CUDA_SUCCESS) return r;
  free_.erase(hole);
  if (address > start) free_[start] = address - start;
  if (const size_t after = length - (address - start) - mapped; after != 0) free_[address + mapped] = after;
  return CUDA_SUCCESS;
}

CUresult DeviceHeap::free(CUdeviceptr address) {
  auto it = used_.find(address);
  if (it == used_.end()) return CUDA_ERROR_INVALID_VALUE;
  const Block block = it->second;
  CUresult r = PHOS_DRIVER(driver_, MemUnmap)(address, block.mapped);
  if (r != CUDA_SUCCESS) return r;
  PHOS_DRIVER(driver_, MemRelease)(block.handle);
  used_.erase(it);
  // Give the range back, merged with its neighbours.
  CUdeviceptr start = address;
  size_t length = block.mapped;
  auto next = free_.lower_bound(address);
  if (next != free_.end() && next->first == address + length) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = length;
  return CUDA_SUCCESS;
}

size_t DeviceHeap::mappedBytes(CUdeviceptr address) const {
  auto it = used_.find(address);
  return it == used_.end() ? 0 : it->second.mapped;
}

}  // namespace phos::daemon
