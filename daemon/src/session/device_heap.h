// SPDX-License-Identifier: Apache-2.0
// DeviceHeap: a session's device memory, at addresses phosd chooses.
//
// cuMemAlloc lets the driver choose addresses, and a restored process holds the
// old ones in its CPU memory. So every allocation of a session is made with the
// virtual memory management API: one virtual range reserved at a fixed base per
// device, and for each allocation physical memory created (cuMemCreate) and
// mapped (cuMemMap) at an address of that range. A restore reserves the same
// range in a fresh worker and maps every allocation back at its address.
//
// VMM mappings are granted to a device, not to a context: every context of the
// device in this process can reach them. That is why a phosd worker process
// serves one session only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>

#include "session/driver_table.h"

namespace phos::daemon {

class DeviceHeap {
 public:
  // Where a session's range of a device starts: a window per device, and four
  // sets of windows picked by session id, so that sessions sharing a process
  // (the in-process tests and fuzzer; phosd serves one per worker) do not
  // collide. A restore uses the base its image recorded.
  // 16 TiB from 0x400000000000: above vgpu's own windows (0x200000000000 for
  // cuMemAlloc, 0x300000000000 for VMM), below the pinned-memory window
  // (0x500000000000), and clear of AddressSanitizer's allocator
  // (0x600000000000), which the fuzzer and sanitizer builds run with.
  static constexpr CUdeviceptr kBase = 0x400000000000ull;
  static constexpr uint64_t kDeviceStride = 512ull << 30;  // 512 GiB per device
  static constexpr int kDevicesPerSet = 8;
  static constexpr uint64_t kSets = 4;
  static CUdeviceptr windowBase(uint64_t session, int device) {
    return kBase + ((session % kSets) * kDevicesPerSet + static_cast<uint64_t>(device)) * kDeviceStride;
  }

  // `exact`: the range must start at `base` (a restore); otherwise, when
  // another session of this process holds that window, the next set's is used.
  DeviceHeap(const DriverTable& driver, int device, CUdeviceptr base, bool exact)
      : driver_(driver), device_(device), base_(base), exact_(exact) {}
  ~DeviceHeap();
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  // `bytes` of device memory at an address of the range (first fit, so the
  // same calls give the same addresses). A context must be current.
  CUresult allocate(size_t bytes, CUdeviceptr* address);
  // Restore: `bytes` at exactly `address` (inside the range, not in use).
  CUresult allocateAt(CUdeviceptr address, size_t bytes);
  // Unmaps and releases an allocation made here; CUDA_ERROR_INVALID_VALUE if
  // `address` does not start one. Work using it must be finished.
  CUresult free(CUdeviceptr address);

  int device() const { return device_; }
  CUdeviceptr base() const { return base_; }
  // Bytes mapped for the allocation at `address` (its size rounded up to the
  // granularity); 0 if there is none.
  size_t mappedBytes(CUdeviceptr address) const;
  size_t granularity() const { return granularity_; }

  // Reserves the range now (allocate and allocateAt do it when first
  // needed); CUDA_SUCCESS if it already is.
  CUresult reserve();

 private:
  CUresult map(CUdeviceptr address, size_t mapped);
  size_t round(size_t bytes) const { return (bytes + granularity_ - 1) / granularity_ * granularity_; }

  struct Block {
    size_t mapped = 0;
    CUmemGenericAllocationHandle handle = 0;
  };
  const DriverTable& driver_;
  const int device_;
  CUdeviceptr base_;
  const bool exact_;
  size_t granularity_ = 0;
  size_t reserved_ = 0;  // 0 until the range is reserved
  std::map<CUdeviceptr, Block> used_;
  std::map<CUdeviceptr, size_t> free_;  // start -> length, coalesced
};

}  // namespace phos::daemon
