// SPDX-License-Identifier: Apache-2.0
// ApplicationVmm: the virtual memory management API as the application uses
// it (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, ...), as
// PyTorch's expandable segments and NCCL do, over phosd's driver.
//
// A restored process holds the addresses it mapped in its CPU memory, so its
// memory must come back at the same addresses:
// - its reservations are ranges phosd picks in a window of the session's own
//   (as the heap's, device_heap.h), which is reserved whole in the driver at
//   exactly its address at the first, and again at a restore;
// - its physical allocations are the session's objects: the handles it holds
//   are numbers phosd gives out, each standing for a driver handle that a
//   restore creates anew with the same properties;
// - each mapping is an allocation of the session (Allocation::physical), whose
//   bytes the checkpoint protocols save, and a restore copies back, through
//   the mapping, like any other allocation's; the access granted on it is
//   granted again at a restore.
// Bytes are saved through their mapping only: physical memory the
// application still holds with written bytes that are mapped nowhere (after
// cuMemUnmap), or mapped at two addresses, cannot be saved faithfully, and a
// checkpoint refuses, naming it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <vector>

#include "phos/common/status.h"
#include "session/driver_table.h"

namespace phos::daemon {

class DeviceMemory;

// Physical memory of cuMemCreate.
struct VmmPhysical {
  uint64_t id = 0;  // the handle the application holds
  int device = 0;
  size_t bytes = 0;
  CUmemAllocationProp prop{};
  CUmemGenericAllocationHandle real = 0;  // the driver's
  uint32_t references = 1;  // cuMemCreate's and cuMemRetainAllocationHandle's, less cuMemRelease's
  uint32_t mappings = 0;    // how many mappings of it there are
  bool everMapped = false;  // its bytes may have been written
};

// A range of physical memory mapped at an address (cuMemMap).
struct VmmMapping {
  CUdeviceptr address = 0;
  size_t bytes = 0;
  size_t offset = 0;  // into the physical memory
  uint64_t physical = 0;
  // cuMemSetAccess on (part of) the mapping, in call order, clipped to it.
  struct Grant {
    size_t offset = 0;  // into the mapping
    size_t bytes = 0;
    CUmemAccessDesc desc{};
  };
  std::vector<Grant> grants;
};

class ApplicationVmm {
 public:
  // The session's window: 1 TiB per session, four sets picked by session id
  // (as the heap's windows), below vgpu's own windows (from 0x200000000000),
  // the heaps' (0x400000000000..0x500000000000) and the pinned memory's
  // (0x500000000000..0x540000000000). A restored session keeps the ranges
  // its image holds and reserves new ones in its own window.
  static constexpr CUdeviceptr kBase = 0x100000000000ull;
  static constexpr uint64_t kWindowBytes = 1ull << 40;
  static constexpr uint64_t kSets = 4;
  static CUdeviceptr windowBase(uint64_t session) {
    return kBase + (session % kSets) * kWindowBytes;
  }

  ApplicationVmm(const DriverTable& driver, uint64_t session)
      : driver_(driver), session_(session) {}
  ~ApplicationVmm() { clear(); }
  ApplicationVmm(const ApplicationVmm&) = delete;
  ApplicationVmm& operator=(const ApplicationVmm&) = delete;

  // cuMemAddressReserve: `bytes` at an address of the window aligned to
  // `alignment` (0: the granularity), `hint` if it is free there.
  CUresult reserve(size_t bytes, size_t alignment, CUdeviceptr hint, CUdeviceptr* address);
  // cuMemAddressFree: a whole reservation, with nothing mapped in it.
  CUresult free(CUdeviceptr address, size_t bytes);
  // cuMemCreate (the properties checked by the caller).
  CUresult create(size_t bytes, const CUmemAllocationProp& prop, uint64_t* id);
  // cuMemRelease: one reference less; the memory goes once unmapped.
  CUresult release(uint64_t id);
  // cuMemMap inside one reservation, where nothing is mapped; the mapping
  // is recorded in `memory` as an allocation of `context`.
  CUresult map(CUdeviceptr address, size_t bytes, size_t offset, uint64_t id, uint64_t context,
               DeviceMemory& memory);
  // cuMemUnmap of whole mappings (work that may use them finished by the
  // caller); forgets their allocations in `memory`.
  CUresult unmap(CUdeviceptr address, size_t bytes, DeviceMemory& memory);
  // cuMemSetAccess on mapped bytes.
  CUresult setAccess(CUdeviceptr address, size_t bytes, std::span<const CUmemAccessDesc> descs);
  // cuMemRetainAllocationHandle: the physical memory mapped at `address`.
  CUresult retain(CUdeviceptr address, uint64_t* id);

  const VmmPhysical* physical(uint64_t id) const;
  // The mapping holding `address`, or null.
  const VmmMapping* mappingAt(CUdeviceptr address) const;

  // At a checkpoint: reservations, physical memory and mappings into
  // `state` ("application_vmm"); what cannot be saved faithfully into `lost`.
  void save(nlohmann::json& state, nlohmann::json& lost) const;
  // At a restore, before the allocations are mapped back (their bytes are
  // copied through these mappings): every reservation at its address, the
  // physical memory under the handles the application holds, the mappings
  // and their access.
  Status rebuild(const nlohmann::json& state);
  // Everything unmapped and given back to the driver.
  void clear();

 private:
  // Reserves the window at `base` in the driver, whole, unless it is already.
  CUresult reserveWindow(CUdeviceptr base);
  CUresult granularity(int device, size_t* bytes) const;
  // The reservation holding [address, address + bytes), or end().
  std::map<CUdeviceptr, size_t>::const_iterator reservationOf(CUdeviceptr address,
                                                              size_t bytes) const;
  void dropIfUnused(uint64_t id);
  // Whether a mapping holds a byte of [address, address + bytes).
  bool anyMappingIn(CUdeviceptr address, size_t bytes) const;

  const DriverTable& driver_;
  const uint64_t session_;
  std::map<CUdeviceptr, size_t> reservations_;  // address -> bytes
  std::set<CUdeviceptr> windows_;               // reserved in the driver, whole
  std::map<uint64_t, VmmPhysical> physical_;    // by handle
  std::map<CUdeviceptr, VmmMapping> mappings_;  // by address
  uint64_t nextId_ = 1;
};

}  // namespace phos::daemon
