// SPDX-License-Identifier: Apache-2.0
// Managed memory's advice (cuMemAdvise) and prefetch locations
// (cuMemPrefetchAsync), page by page, as cuMemRangeGetAttribute reports them.
// Neither vgpu nor PhOS moves managed memory between processors: vgpu's is
// memory of its own process that every device reads in place, PhOS's is
// shared host memory mapped in the application and registered with the driver
// (docs/remoting.md). Advice and prefetches change nothing but what these
// queries answer, so one model serves both: vgpu's driver and libphos.so,
// which answers the queries in the application.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "phos/common/status.h"

namespace phos {

class ManagedAdvice {
 public:
  void add(std::uint64_t base, std::size_t bytes);
  void remove(std::uint64_t base);

  // cuMemAdvise: the range, rounded out to whole pages, must lie in one
  // managed allocation; `where` is checked as the advice requires (a device
  // below `devices`: every device is taken to have concurrent managed access).
  Status advise(std::uint64_t address, std::size_t bytes, CUmem_advise advice, CUmemLocation where,
                int devices);
  // cuMemPrefetchAsync: records `where` as the pages' last prefetch location.
  Status prefetch(std::uint64_t address, std::size_t bytes, CUmemLocation where, int devices);
  // cuMemRangeGetAttribute: one attribute of the range into `data`
  // (`dataSize` bytes, as the documentation sizes each attribute).
  Status attribute(CUmem_range_attribute attribute, std::uint64_t address, std::size_t bytes,
                   void* data, std::size_t dataSize, int devices) const;

  // The CUresult a failure of the calls above stands for (its message starts
  // with the result's name too): CUDA_ERROR_INVALID_DEVICE for a device that
  // does not exist, CUDA_ERROR_INVALID_VALUE for everything else.
  static CUresult resultOf(const Status& status);

 private:
  struct Page {
    bool readMostly = false;
    CUmemLocation preferred{CU_MEM_LOCATION_TYPE_INVALID, 0};
    std::uint64_t accessedBy = 0;  // bit d: device d; kHostBit: the host
    CUmemLocation lastPrefetch{CU_MEM_LOCATION_TYPE_INVALID, 0};
  };
  static constexpr unsigned kHostBit = 63;

  // The pages of [address, address+bytes), rounded out; an error outside
  // managed memory.
  Result<std::span<Page>> pages(std::uint64_t address, std::size_t bytes);
  Result<std::span<const Page>> pages(std::uint64_t address, std::size_t bytes) const;
  // `where` as a page keeps it (HOST_NUMA_CURRENT is node 0), or an error
  // naming what is wrong with it.
  static Result<CUmemLocation> location(CUmemLocation where, bool numaAllowed, int devices);

  struct Range {
    std::size_t bytes = 0;    // what was allocated
    std::vector<Page> pages;  // one per page, rounded up
  };
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Range> ranges_;  // by base
};

}  // namespace phos
