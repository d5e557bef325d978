// SPDX-License-Identifier: Apache-2.0
// A session's device memory: its allocations (cuMemAlloc*'s, the memory
// pools', and the module globals the application took the address of), each
// at an address of the session's heap on its device (device_heap.h), and the
// order the job made allocations and loaded modules in, which a restore
// repeats (NVIDIA's driver places a module's variables by what the process
// did before; docs/checkpoint.md). DeviceMemory saves itself into a
// checkpoint's state, with a blob per allocation, and maps itself again at
// a restore (Restore).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "protocols/device_buffer.h"
#include "session/device_heap.h"
#include "session/driver_table.h"

namespace phos::daemon {

struct SessionScope;
class SessionContexts;

// A device allocation of the session.
struct Allocation {
  CUdeviceptr address = 0;
  size_t bytes = 0;
  uint64_t context = 0;  // virtual id of the context it belongs to
  // The module or library (the driver's handle) whose global this is; null
  // for memory from cuMemAlloc*. Such a range is freed with its module.
  void* module = nullptr;
  int device = 0;
  uint64_t pool = 0;   // the memory pool (handle) of a stream-ordered allocation
  uint64_t order = 0;  // DeviceMemory::takeOrder() when it was made (0: not yet numbered)
  // Non-zero: a mapping of the application's physical memory (that handle;
  // application_vmm.h), not of the heap. It outlives the context it was
  // mapped in (Session::destroyContext gives it another of its device).
  uint64_t physical = 0;
};

class DeviceMemory {
 public:
  DeviceMemory(const DriverTable& driver, uint64_t session) : driver_(driver), session_(session) {}
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // The allocation holding `p`, or null.
  const Allocation* find(CUdeviceptr p) const;
  const std::map<CUdeviceptr, Allocation>& allocations() const { return allocations_; }
  // Records `a`, numbering it in the job's order if it is not yet.
  void add(const Allocation& a);
  void remove(CUdeviceptr p) { allocations_.erase(p); }
  // The VMM mappings left without a context (removeContext) get `pick`'s
  // context of their device (0: none yet).
  void rehome(const std::function<uint64_t(int device)>& pick);
  // Forgets the globals of a module or library (the driver's handle) once unloaded.
  void removeGlobalsOf(void* module);
  // Forgets every allocation of context `context` (destroyed), calling
  // `dropping` for each first; the heap's ranges of those from cuMemAlloc*
  // are given back. The application's VMM mappings stay, with context 0.
  void removeContext(uint64_t context, const std::function<void(const Allocation&)>& dropping);
  // The next number in the job's order (a module load takes one too).
  uint64_t takeOrder() { return nextOrder_++; }

  // `bytes` of `device`'s heap (created on first use); a context of the
  // device is current.
  CUresult allocate(int device, size_t bytes, CUdeviceptr* address);
  // Gives back what allocate() gave and forgets its allocation.
  CUresult free(CUdeviceptr address);
  // Reserves the heap's range of `device`, before the session's first module
  // there: NVIDIA's driver places a module's variables by what the process
  // holds, and a restore, which reserves the range before it loads modules,
  // must find the same layout (docs/checkpoint.md). A driver without the VMM
  // API is left alone (its cuMemAlloc says so).
  void reserve(int device);
  // Gives a range of `device`'s heap back at once, and how many bytes its
  // mapping holds.
  CUresult releaseRange(int device, CUdeviceptr address);
  size_t mappedBytes(int device, CUdeviceptr address) const;
  // Every allocation forgotten and every heap unmapped and released.
  void clear();

  // The allocations from cuMemAlloc* (not module globals), each with a
  // context of its device as `contexts` has it now.
  std::vector<DeviceBuffer> buffers(const SessionContexts& contexts) const;

  // At a checkpoint: each heap's range, and each allocation from cuMemAlloc*
  // with a blob of `writer` for its bytes, listed in `copies`, into `state`
  // ("heaps", "allocations").
  Status save(image::ImageWriter& writer, nlohmann::json& state,
              std::vector<DeviceBuffer>& copies) const;

  // At a restore, into an empty DeviceMemory, the contexts rebuilt: the
  // heaps' ranges first (reserveRanges), then the allocations mapped at
  // their addresses in the job's order (mapBefore, which the caller
  // interleaves with loading modules), then finish().
  class Restore {
   public:
    // An allocation mapped again, and the blob of its bytes.
    using Mapped = std::function<Status(const Allocation&, size_t blob)>;
    Restore(DeviceMemory& memory, SessionScope& scope, const image::ImageReader& reader,
            const nlohmann::json& state);
    Status reserveRanges();
    // Whether the application's VMM mapping an allocation of the image names
    // was made again (ApplicationVmm::rebuild): its bytes are copied through
    // it. Without it, an image with such allocations is refused.
    void expectMappings(std::function<bool(const Allocation&)> mappedAgain) {
      mappedAgain_ = std::move(mappedAgain);
    }
    // Maps every allocation of the job's order below `limit` not mapped yet.
    Status mapBefore(uint64_t limit, const Mapped& mapped);
    // Notes that a module of order `order` was loaded again.
    void noteOrder(uint64_t order) { lastOrder_ = std::max(lastOrder_, order); }
    // What the job makes next is numbered after what the image holds.
    void finish() { memory_.nextOrder_ = lastOrder_ + 1; }

   private:
    Result<DeviceHeap*> heapOf(int device, CUdeviceptr address);

    DeviceMemory& memory_;
    SessionScope& scope_;
    const image::ImageReader& reader_;
    std::map<int, CUdeviceptr> bases_;            // the heaps' ranges, by device
    nlohmann::json heaps_;                        // the state's
    nlohmann::json allocations_;                  // the state's
    std::vector<const nlohmann::json*> byOrder_;  // allocations_, in the job's order
    size_t next_ = 0;
    uint64_t lastOrder_ = 0;
    std::function<bool(const Allocation&)> mappedAgain_;
  };

 private:
  DeviceHeap& heap(int device);

  const DriverTable& driver_;
  const uint64_t session_;
  std::map<CUdeviceptr, Allocation> allocations_;
  std::map<int, std::unique_ptr<DeviceHeap>> heaps_;
  uint64_t nextOrder_ = 1;
};

}  // namespace phos::daemon
