// SPDX-License-Identifier: Apache-2.0
// The application's own virtual memory management (application_vmm.h).
#include "session/application_vmm.h"

#include <fmt/format.h>

#include <algorithm>

#include "phos/common/log.h"
#include "session/device_memory.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

CUresult ApplicationVmm::granularity(int device, size_t* bytes) const {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return PHOS_DRIVER(driver_, MemGetAllocationGranularity)(bytes, &prop,
                                                           CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

std::map<CUdeviceptr, size_t>::const_iterator ApplicationVmm::reservationOf(CUdeviceptr address,
                                                                            size_t bytes) const {
  auto it = reservations_.upper_bound(address);
  if (it == reservations_.begin()) return reservations_.end();
  --it;
  const bool inside =
      address - it->first <= it->second && bytes <= it->second - (address - it->first);
  return inside ? it : reservations_.end();
}

CUresult ApplicationVmm::reserve(size_t bytes, size_t alignment, CUdeviceptr hint,
                                 CUdeviceptr* address) {
  if (bytes == 0 || (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  size_t unit = 0;
  if (CUresult r = granularity(0, &unit); r != CUDA_SUCCESS) return r;
  if (bytes % unit != 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t align = std::max(alignment, unit);
  const CUdeviceptr base = windowBase(session_), end = base + kWindowBytes;
  if (bytes > kWindowBytes) return CUDA_ERROR_OUT_OF_MEMORY;
  auto isFree = [&](CUdeviceptr at) {
    if (at < base || at > end - bytes) return false;
    auto next = reservations_.lower_bound(at);
    if (next != reservations_.end() && next->first < at + bytes) return false;
    if (next == reservations_.begin()) return true;
    --next;
    return next->first + next->second <= at;
  };
  // The hint when it is free in the window ("a hint", as the documentation
  // says), else the first fit.
  CUdeviceptr at = 0;
  if (hint != 0 && hint % align == 0 && isFree(hint)) {
    at = hint;
  } else {
    CUdeviceptr candidate = base;
    for (const auto& [start, size] : reservations_) {
      if (candidate + bytes <= start) break;
      candidate = std::max(candidate, (start + size + align - 1) / align * align);
    }
    if (!isFree(candidate)) return CUDA_ERROR_OUT_OF_MEMORY;
    at = candidate;
  }
  if (CUresult r = reserveWindow(base); r != CUDA_SUCCESS) return r;
  reservations_[at] = bytes;
  *address = at;
  return CUDA_SUCCESS;
}

// The whole window, once, at exactly its address: NVIDIA's driver 580 takes
// the address of a small reservation as a hint and reserves elsewhere (an
// H200: 12 MiB asked at 0x100000000000 came at 0x7fc5fe800000), and honours
// it for a large one, as for the heaps' (docs/gpu.md).
CUresult ApplicationVmm::reserveWindow(CUdeviceptr base) {
  if (windows_.contains(base)) return CUDA_SUCCESS;
  CUdeviceptr got = 0;
  if (CUresult r = PHOS_DRIVER(driver_, MemAddressReserve)(&got, kWindowBytes, 0, base, 0);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (got != base) {  // the driver treats the address as a hint: useless to a restore
    PHOS_DRIVER(driver_, MemAddressFree)(got, kWindowBytes);
    log::get("daemon")->warn("session {}: the driver reserved the VMM window at {}, not at {}",
                             session_, hex(got), hex(base));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  windows_.insert(base);
  return CUDA_SUCCESS;
}

CUresult ApplicationVmm::free(CUdeviceptr address, size_t bytes) {
  auto it = reservations_.find(address);
  if (it == reservations_.end() || it->second != bytes) return CUDA_ERROR_INVALID_VALUE;
  if (anyMappingIn(address, bytes)) return CUDA_ERROR_INVALID_VALUE;  // cuMemUnmap first
  reservations_.erase(it);  // its window stays reserved for the next
  return CUDA_SUCCESS;
}

CUresult ApplicationVmm::create(size_t bytes, const CUmemAllocationProp& prop, uint64_t* id) {
  CUmemGenericAllocationHandle real = 0;
  if (CUresult r = PHOS_DRIVER(driver_, MemCreate)(&real, bytes, &prop, 0); r != CUDA_SUCCESS) {
    return r;
  }
  VmmPhysical& p = physical_[nextId_];
  p.id = nextId_++;
  p.device = prop.location.id;
  p.bytes = bytes;
  p.prop = prop;
  p.real = real;
  *id = p.id;
  return CUDA_SUCCESS;
}

void ApplicationVmm::dropIfUnused(uint64_t id) {
  auto it = physical_.find(id);
  if (it == physical_.end() || it->second.references != 0 || it->second.mappings != 0) return;
  PHOS_DRIVER(driver_, MemRelease)(it->second.real);
  physical_.erase(it);
}

bool ApplicationVmm::anyMappingIn(CUdeviceptr address, size_t bytes) const {
  auto next = mappings_.lower_bound(address);
  if (next != mappings_.end() && next->first - address < bytes) return true;
  if (next == mappings_.begin()) return false;
  --next;
  return address - next->first < next->second.bytes;
}

CUresult ApplicationVmm::release(uint64_t id) {
  auto it = physical_.find(id);
  if (it == physical_.end() || it->second.references == 0) return CUDA_ERROR_INVALID_VALUE;
  --it->second.references;
  dropIfUnused(id);
  return CUDA_SUCCESS;
}

const VmmPhysical* ApplicationVmm::physical(uint64_t id) const {
  auto it = physical_.find(id);
  return it == physical_.end() || it->second.references == 0 ? nullptr : &it->second;
}

const VmmMapping* ApplicationVmm::mappingAt(CUdeviceptr address) const {
  auto it = mappings_.upper_bound(address);
  if (it == mappings_.begin()) return nullptr;
  --it;
  return address - it->first < it->second.bytes ? &it->second : nullptr;
}

CUresult ApplicationVmm::map(CUdeviceptr address, size_t bytes, size_t offset, uint64_t id,
                             uint64_t context, DeviceMemory& memory) {
  auto p = physical_.find(id);
  if (p == physical_.end() || p->second.references == 0 || bytes == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (offset > p->second.bytes || bytes > p->second.bytes - offset) return CUDA_ERROR_INVALID_VALUE;
  if (reservationOf(address, bytes) == reservations_.end()) return CUDA_ERROR_INVALID_VALUE;
  if (anyMappingIn(address, bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = PHOS_DRIVER(driver_, MemMap)(address, bytes, offset, p->second.real, 0);
      r != CUDA_SUCCESS) {
    return r;
  }
  p->second.everMapped = true;
  ++p->second.mappings;
  mappings_[address] =
      VmmMapping{.address = address, .bytes = bytes, .offset = offset, .physical = id};
  memory.add(Allocation{.address = address,
                        .bytes = bytes,
                        .context = context,
                        .device = p->second.device,
                        .physical = id});
  return CUDA_SUCCESS;
}

CUresult ApplicationVmm::unmap(CUdeviceptr address, size_t bytes, DeviceMemory& memory) {
  // Whole mappings, one after the other, covering the range exactly.
  std::vector<CUdeviceptr> covered;
  CUdeviceptr at = address;
  for (auto it = mappings_.find(address);
       it != mappings_.end() && at - address < bytes && it->first == at; ++it) {
    covered.push_back(at);
    at += it->second.bytes;
  }
  if (covered.empty() || at - address != bytes) return CUDA_ERROR_INVALID_VALUE;
  for (CUdeviceptr m : covered) {
    VmmMapping& mapping = mappings_.at(m);
    if (CUresult r = PHOS_DRIVER(driver_, MemUnmap)(m, mapping.bytes); r != CUDA_SUCCESS) return r;
    const uint64_t id = mapping.physical;
    memory.remove(m);
    mappings_.erase(m);
    --physical_.at(id).mappings;
    dropIfUnused(id);
  }
  return CUDA_SUCCESS;
}

CUresult ApplicationVmm::setAccess(CUdeviceptr address, size_t bytes,
                                   std::span<const CUmemAccessDesc> descs) {
  if (descs.empty() || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  // Mapped bytes only, without a gap.
  std::vector<VmmMapping*> touched;
  CUdeviceptr at = address;
  while (at - address < bytes) {
    auto it = mappings_.upper_bound(at);
    if (it == mappings_.begin()) return CUDA_ERROR_INVALID_VALUE;
    --it;
    if (at - it->first >= it->second.bytes) return CUDA_ERROR_INVALID_VALUE;
    touched.push_back(&it->second);
    at = it->first + it->second.bytes;
  }
  CUresult r = PHOS_DRIVER(driver_, MemSetAccess)(address, bytes, descs.data(), descs.size());
  if (r != CUDA_SUCCESS) return r;
  for (VmmMapping* m : touched) {
    const CUdeviceptr from = std::max(address, m->address);
    const CUdeviceptr to = std::min(address + bytes, m->address + m->bytes);
    for (const CUmemAccessDesc& d : descs) {
      m->grants.push_back({.offset = from - m->address, .bytes = to - from, .desc = d});
    }
  }
  return CUDA_SUCCESS;
}

CUresult ApplicationVmm::retain(CUdeviceptr address, uint64_t* id) {
  const VmmMapping* m = mappingAt(address);
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  VmmPhysical& p = physical_.at(m->physical);
  ++p.references;
  *id = p.id;
  return CUDA_SUCCESS;
}

void ApplicationVmm::save(json& state, json& lost) const {
  json reservations = json::array(), physical = json::array(), mappings = json::array();
  std::map<uint64_t, std::vector<std::pair<size_t, size_t>>>
      spansOf;  // physical -> (offset, bytes)
  for (const auto& [at, m] : mappings_) spansOf[m.physical].emplace_back(m.offset, m.bytes);
  for (const auto& [at, bytes] : reservations_) {
    reservations.push_back({{"address", at}, {"bytes", bytes}});
  }
  for (const auto& [id, p] : physical_) {
    physical.push_back(
        {{"id", id},
         {"device", p.device},
         {"bytes", p.bytes},
         {"type", static_cast<int>(p.prop.type)},
         {"compression", static_cast<int>(p.prop.allocFlags.compressionType)},
         {"gpu_direct_rdma", static_cast<int>(p.prop.allocFlags.gpuDirectRDMACapable)},
         {"usage", static_cast<int>(p.prop.allocFlags.usage)},
         {"references", p.references}});
    // Its bytes are saved through its mappings: each byte mapped once, or
    // (the handle released) unreachable but through them.
    std::vector<std::pair<size_t, size_t>>& spans = spansOf[id];
    std::sort(spans.begin(), spans.end());
    size_t reached = 0;
    bool twice = false, gap = false;
    for (const auto& [offset, bytes] : spans) {
      twice = twice || offset < reached;
      gap = gap || offset > reached;
      reached = std::max(reached, offset + bytes);
    }
    gap = gap || reached < p.bytes;
    if (twice) {
      lost.push_back({{"id", id},
                      {"what",
                       "physical memory of cuMemCreate mapped at two addresses, which "
                       "PhOS would save twice and restore as two copies"}});
    } else if (gap && p.everMapped && p.references != 0) {
      lost.push_back({{"id", id},
                      {"what",
                       "physical memory of cuMemCreate with bytes mapped nowhere (PhOS "
                       "saves such memory through its mappings)"}});
    }
  }
  for (const auto& [at, m] : mappings_) {
    json grants = json::array();
    for (const VmmMapping::Grant& g : m.grants) {
      grants.push_back({{"offset", g.offset},
                        {"bytes", g.bytes},
                        {"location_type", static_cast<int>(g.desc.location.type)},
                        {"location", g.desc.location.id},
                        {"flags", static_cast<int>(g.desc.flags)}});
    }
    mappings.push_back({{"address", at},
                        {"bytes", m.bytes},
                        {"offset", m.offset},
                        {"physical", m.physical},
                        {"grants", grants}});
  }
  state["application_vmm"] = {{"reservations", reservations},
                              {"physical", physical},
                              {"mappings", mappings},
                              {"next_id", nextId_}};
}

Status ApplicationVmm::rebuild(const json& state) {
  if (!state.contains("application_vmm")) {
    return Status::ok();  // images of sessions before the VMM was remoted
  }
  const json& vmm = state["application_vmm"];
  nextId_ = vmm.value("next_id", uint64_t{1});
  for (const json& r : vmm.value("reservations", json::array())) {
    ASSIGN_OR_RETURN(uint64_t at, field<uint64_t>(r, "address", "VMM reservation"));
    ASSIGN_OR_RETURN(uint64_t bytes, field<uint64_t>(r, "bytes", "VMM reservation"));
    // Only where a session's window lies: an image names no other address.
    const CUdeviceptr windowsEnd = kBase + kSets * kWindowBytes;
    if (at < kBase || at >= windowsEnd || bytes == 0 || bytes > windowsEnd - at) {
      return makeError(Code::kDataLoss,
                       "the VMM reservation {}+{} lies outside the sessions' windows", hex(at),
                       bytes);
    }
    // In the window it was made in, which the restore reserves whole.
    const CUdeviceptr window = kBase + (at - kBase) / kWindowBytes * kWindowBytes;
    if (bytes > window + kWindowBytes - at) {
      return makeError(Code::kDataLoss, "the VMM reservation {}+{} crosses the end of its window",
                       hex(at), bytes);
    }
    if (CUresult res = reserveWindow(window); res != CUDA_SUCCESS) {
      return makeError(
          Code::kFailedPrecondition,
          "cannot reserve the application's range {}+{} again: its window {} (CUresult {})",
          hex(at), bytes, hex(window), static_cast<int>(res));
    }
    reservations_[at] = bytes;
  }
  for (const json& j : vmm.value("physical", json::array())) {
    VmmPhysical p;
    ASSIGN_OR_RETURN(p.id, field<uint64_t>(j, "id", "VMM physical memory"));
    ASSIGN_OR_RETURN(p.device, field<int>(j, "device", "VMM physical memory"));
    ASSIGN_OR_RETURN(p.bytes, field<uint64_t>(j, "bytes", "VMM physical memory"));
    p.references = j.value("references", 1u);
    p.everMapped = true;
    p.prop.type = static_cast<CUmemAllocationType>(j.value("type", 1));
    p.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.prop.location.id = p.device;
    p.prop.allocFlags.compressionType = static_cast<unsigned char>(j.value("compression", 0));
    p.prop.allocFlags.gpuDirectRDMACapable =
        static_cast<unsigned char>(j.value("gpu_direct_rdma", 0));
    p.prop.allocFlags.usage = static_cast<unsigned short>(j.value("usage", 0));
    if (CUresult r = PHOS_DRIVER(driver_, MemCreate)(&p.real, p.bytes, &p.prop, 0);
        r != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition,
                       "cannot create {} bytes of device {} for VMM handle {} (CUresult {})",
                       p.bytes, p.device, p.id, static_cast<int>(r));
    }
    nextId_ = std::max(nextId_, p.id + 1);
    physical_[p.id] = p;
  }
  for (const json& j : vmm.value("mappings", json::array())) {
    VmmMapping m;
    ASSIGN_OR_RETURN(m.address, field<uint64_t>(j, "address", "VMM mapping"));
    ASSIGN_OR_RETURN(m.bytes, field<uint64_t>(j, "bytes", "VMM mapping"));
    ASSIGN_OR_RETURN(m.offset, field<uint64_t>(j, "offset", "VMM mapping"));
    ASSIGN_OR_RETURN(m.physical, field<uint64_t>(j, "physical", "VMM mapping"));
    if (m.bytes == 0 || reservationOf(m.address, m.bytes) == reservations_.end() ||
        anyMappingIn(m.address, m.bytes)) {
      return makeError(Code::kDataLoss,
                       "VMM mapping {}+{} lies outside the image's reservations or over another",
                       hex(m.address), m.bytes);
    }
    auto p = physical_.find(m.physical);
    if (p == physical_.end()) {
      return makeError(Code::kDataLoss,
                       "VMM mapping {} is of handle {}, which the image does not have",
                       hex(m.address), m.physical);
    }
    if (CUresult r = PHOS_DRIVER(driver_, MemMap)(m.address, m.bytes, m.offset, p->second.real, 0);
        r != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition,
                       "cannot map VMM handle {} at {} again (CUresult {})", m.physical,
                       hex(m.address), static_cast<int>(r));
    }
    mappings_[m.address] = m;
    ++p->second.mappings;
    for (const json& g : j.value("grants", json::array())) {
      VmmMapping::Grant grant;
      grant.offset = g.value("offset", size_t{0});
      grant.bytes = g.value("bytes", size_t{0});
      grant.desc.location.type = static_cast<CUmemLocationType>(g.value("location_type", 1));
      grant.desc.location.id = g.value("location", 0);
      grant.desc.flags = static_cast<CUmemAccess_flags>(g.value("flags", 0));
      if (grant.offset > m.bytes || grant.bytes > m.bytes - grant.offset) {
        return makeError(Code::kDataLoss, "an access grant of VMM mapping {} lies outside it",
                         hex(m.address));
      }
      if (CUresult r = PHOS_DRIVER(driver_, MemSetAccess)(m.address + grant.offset, grant.bytes,
                                                          &grant.desc, 1);
          r != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition,
                         "cannot grant access to VMM mapping {} again (CUresult {})",
                         hex(m.address), static_cast<int>(r));
      }
      mappings_[m.address].grants.push_back(grant);
    }
  }
  return Status::ok();
}

void ApplicationVmm::clear() {
  for (const auto& [at, m] : mappings_) PHOS_DRIVER(driver_, MemUnmap)(at, m.bytes);
  for (const auto& [id, p] : physical_) PHOS_DRIVER(driver_, MemRelease)(p.real);
  for (CUdeviceptr base : windows_) PHOS_DRIVER(driver_, MemAddressFree)(base, kWindowBytes);
  mappings_.clear();
  physical_.clear();
  reservations_.clear();
  windows_.clear();
}

}  // namespace phos::daemon
