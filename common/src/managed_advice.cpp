// SPDX-License-Identifier: Apache-2.0
#include "phos/common/managed_advice.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace phos {

namespace {

// The CPU page size: "rounded down and rounded up respectively to be aligned
// to CPU page size".
std::size_t pageSize() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// A failure as cuda.h names it: resultOf() reads the code back.
template <typename... Args>
Status invalidValue(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kInvalidArgument,
                "CUDA_ERROR_INVALID_VALUE: " + fmt::format(f, std::forward<Args>(args)...));
}
Status invalidDevice(int device) {
  return Status(Code::kOutOfRange,
                fmt::format("CUDA_ERROR_INVALID_DEVICE: device {} does not exist", device));
}

}  // namespace

CUresult ManagedAdvice::resultOf(const Status& status) {
  if (status.isOk()) return CUDA_SUCCESS;
  return status.code() == Code::kOutOfRange ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
}

void ManagedAdvice::add(std::uint64_t base, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  ranges_[base] = Range{bytes, std::vector<Page>((bytes + pageSize() - 1) / pageSize())};
}

void ManagedAdvice::remove(std::uint64_t base) {
  std::lock_guard lock(mutex_);
  ranges_.erase(base);
}

Result<std::span<const ManagedAdvice::Page>> ManagedAdvice::pages(std::uint64_t address,
                                                                  std::size_t bytes) const {
  if (bytes == 0) return invalidValue("the range is empty");
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) {
    return invalidValue("0x{:x} is not managed memory", address);
  }
  --it;
  const std::uint64_t base = it->first;
  // "The start address and end address of the memory range will be rounded
  // down and rounded up respectively to be aligned to CPU page size".
  const std::size_t size = it->second.bytes;
  if (address - base >= size || bytes > size - (address - base)) {
    return invalidValue("{} bytes at 0x{:x} are not inside one managed allocation", bytes, address);
  }
  const std::vector<Page>& all = it->second.pages;
  const std::size_t first = (address - base) / pageSize();
  const std::size_t last = (address - base + bytes - 1) / pageSize();
  return std::span<const Page>(all).subspan(first, last - first + 1);
}

Result<std::span<ManagedAdvice::Page>> ManagedAdvice::pages(std::uint64_t address,
                                                            std::size_t bytes) {
  ASSIGN_OR_RETURN(std::span<const Page> found, std::as_const(*this).pages(address, bytes));
  return std::span<Page>(const_cast<Page*>(found.data()), found.size());
}

Result<CUmemLocation> ManagedAdvice::location(CUmemLocation where, bool numaAllowed, int devices) {
  switch (where.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (where.id < 0 || where.id >= devices) {
        return invalidDevice(where.id);
      }
      return where;
    case CU_MEM_LOCATION_TYPE_HOST:
      return CUmemLocation{CU_MEM_LOCATION_TYPE_HOST, 0};  // "the id is ignored"
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      if (!numaAllowed) break;
      // vgpu's host is one NUMA node, 0: the current thread's closest too.
      if (where.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && where.id != 0) {
        return invalidValue("host NUMA node {} does not exist (the host is taken as one node, 0)",
                            where.id);
      }
      return CUmemLocation{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};
    default:
      break;
  }
  return invalidValue("location type {} is not valid here", static_cast<int>(where.type));
}

Status ManagedAdvice::advise(std::uint64_t address, std::size_t bytes, CUmem_advise advice,
                             CUmemLocation where, int devices) {
  std::lock_guard lock(mutex_);
  ASSIGN_OR_RETURN(std::span<Page> range, pages(address, bytes));
  switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:  // "The location argument is ignored"
      for (Page& p : range) p.readMostly = advice == CU_MEM_ADVISE_SET_READ_MOSTLY;
      return Status::ok();
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION: {
      ASSIGN_OR_RETURN(CUmemLocation at, location(where, true, devices));
      for (Page& p : range) p.preferred = at;
      return Status::ok();
    }
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
      for (Page& p : range) p.preferred = {CU_MEM_LOCATION_TYPE_INVALID, 0};
      return Status::ok();
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY: {
      // "must be either CU_MEM_LOCATION_TYPE_DEVICE ... or CU_MEM_LOCATION_TYPE_HOST".
      ASSIGN_OR_RETURN(CUmemLocation at, location(where, false, devices));
      const std::uint64_t bit = std::uint64_t{1}
                                << (at.type == CU_MEM_LOCATION_TYPE_HOST ? kHostBit : at.id);
      for (Page& p : range) {
        p.accessedBy =
            advice == CU_MEM_ADVISE_SET_ACCESSED_BY ? p.accessedBy | bit : p.accessedBy & ~bit;
      }
      return Status::ok();
    }
  }
  return invalidValue("advice {} does not exist", static_cast<int>(advice));
}

Status ManagedAdvice::prefetch(std::uint64_t address, std::size_t bytes, CUmemLocation where,
                               int devices) {
  std::lock_guard lock(mutex_);
  ASSIGN_OR_RETURN(std::span<Page> range, pages(address, bytes));
  ASSIGN_OR_RETURN(CUmemLocation at, location(where, true, devices));
  for (Page& p : range) p.lastPrefetch = at;
  return Status::ok();
}

namespace {

bool same(const CUmemLocation& a, const CUmemLocation& b) {
  return a.type == b.type && a.id == b.id;
}

// The location all of `range` shares through `of`, or INVALID.
template <typename Pages, typename Of>
CUmemLocation common(const Pages& range, Of&& of) {
  const CUmemLocation first = of(range.front());
  for (const auto& p : range) {
    if (!same(of(p), first)) return {CU_MEM_LOCATION_TYPE_INVALID, 0};
  }
  return first;
}

// The legacy int form: a device ordinal, CU_DEVICE_CPU for the host, or
// CU_DEVICE_INVALID.
int legacyDevice(const CUmemLocation& l) {
  switch (l.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      return l.id;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      return CU_DEVICE_CPU;
    default:
      return CU_DEVICE_INVALID;
  }
}

}  // namespace

Status ManagedAdvice::attribute(CUmem_range_attribute attribute, std::uint64_t address,
                                std::size_t bytes, void* data, std::size_t dataSize,
                                int devices) const {
  if (data == nullptr) return invalidValue("data is null");
  std::lock_guard lock(mutex_);
  ASSIGN_OR_RETURN(std::span<const Page> range, pages(address, bytes));
  auto put = [&](auto value) -> Status {
    if (dataSize != sizeof(value)) {
      return invalidValue("attribute {} takes {} bytes, not {}", static_cast<int>(attribute),
                          sizeof(value), dataSize);
    }
    std::memcpy(data, &value, sizeof(value));
    return Status::ok();
  };
  auto preferred = [](const Page& p) { return p.preferred; };
  auto prefetched = [](const Page& p) { return p.lastPrefetch; };
  switch (attribute) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY:
      return put(static_cast<int>(
          std::all_of(range.begin(), range.end(), [](const Page& p) { return p.readMostly; })));
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION:
      return put(legacyDevice(common(range, preferred)));
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
      return put(legacyDevice(common(range, prefetched)));
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE:
      return put(common(range, preferred).type);
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID:
      return put(common(range, preferred).id);
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE:
      return put(common(range, prefetched).type);
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID:
      return put(common(range, prefetched).id);
    case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY: {
      // "a non-zero multiple of 4": the processors with the advice on every
      // page, then CU_DEVICE_INVALID in the rest.
      if (dataSize == 0 || dataSize % sizeof(int) != 0) {
        return invalidValue("{} bytes are not a non-zero multiple of 4", dataSize);
      }
      std::uint64_t all = ~std::uint64_t{0};
      for (const Page& p : range) all &= p.accessedBy;
      std::vector<int> ids;
      for (int d = 0; d < devices; ++d) {
        if ((all >> d) & 1U) ids.push_back(d);
      }
      if ((all >> kHostBit) & 1U) ids.push_back(CU_DEVICE_CPU);
      ids.resize(dataSize / sizeof(int), CU_DEVICE_INVALID);
      std::memcpy(data, ids.data(), dataSize);
      return Status::ok();
    }
  }
  return invalidValue("range attribute {} does not exist", static_cast<int>(attribute));
}

}  // namespace phos
