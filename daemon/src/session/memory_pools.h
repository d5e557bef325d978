// SPDX-License-Identifier: Apache-2.0
// MemoryPools: the stream-ordered allocator (cuMemAllocAsync, cuMemFreeAsync,
// cuMemPool*) of a session, over its device heap.
//
// The driver's own pools hand out addresses a restore cannot give back, so
// phosd keeps the pools itself: a pool is the session's object (its handle is
// the application's, as every handle), its allocations come from the
// session's heap at fixed addresses like cuMemAlloc's, and a restore re-creates
// the pools with their attributes and the allocations where they were.
//
// Stream order: an allocation is made when the call is served, before any
// work the application enqueues after it, which is what the stream promises.
// A free is an event recorded on the stream; the memory goes back to the heap
// once the event has completed (checked at the next allocation, trim or
// attribute query, and waited for when the heap is full), never before work
// enqueued ahead of the free has finished with it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "session/driver_table.h"

namespace phos::daemon {

class Session;

struct MemoryPool {
  uint64_t id = 0;  // the application's handle
  int device = 0;
  bool isDefault = false;
  // cuMemPoolDestroy with allocations outstanding: released when they are.
  bool destroyed = false;
  size_t maxSize = 0;  // 0: no limit but the device's
  // CU_MEMPOOL_ATTR_*: kept and answered. Memory goes back to the heap as
  // soon as its free completes, which every threshold and reuse policy allows.
  uint64_t releaseThreshold = 0;
  int followEventDependencies = 1;
  int allowOpportunistic = 1;
  int allowInternalDependencies = 1;
  uint64_t used = 0, usedHigh = 0;          // bytes of live allocations, as asked for
  uint64_t reserved = 0, reservedHigh = 0;  // device memory behind them and pending frees
};

class MemoryPools {
 public:
  explicit MemoryPools(const DriverTable& driver) : driver_(driver) {}
  ~MemoryPools();
  MemoryPools(const MemoryPools&) = delete;
  MemoryPools& operator=(const MemoryPools&) = delete;

  // The default pool of `device` (created, with its handle, on first use).
  MemoryPool& defaultPool(Session& s, int device);
  // The pool cuMemAllocAsync on `device` allocates from.
  MemoryPool& currentPool(Session& s, int device);
  // cuDeviceSetMemPool: `pool` must be of `device`.
  CUresult setCurrent(int device, MemoryPool& pool);
  // cuMemPoolCreate (props already checked).
  MemoryPool& create(Session& s, int device, size_t maxSize);
  // cuMemPoolDestroy.
  CUresult destroy(Session& s, MemoryPool& pool);
  MemoryPool* find(uint64_t id);

  // `bytes` from `pool` for the call being served; recorded as the session's
  // allocation (with its pool).
  CUresult allocate(Session& s, MemoryPool& pool, size_t bytes, CUdeviceptr* address);
  // Enqueues the free of a pool allocation on `stream` (the driver's).
  CUresult freeAsync(Session& s, CUdeviceptr address, CUstream stream);
  // A pool allocation freed with cuMemFree (which waited for the device).
  void forget(Session& s, CUdeviceptr address);
  // Returns the memory of completed frees to the heap; with `wait`, waits
  // for every pending free of `pool` (all pools when null) first.
  void reap(Session& s, bool wait = false, const MemoryPool* pool = nullptr);

  // At a checkpoint: the frees in flight finished (so that the image holds
  // what the application still holds), then every pool with its attributes
  // and each device's current pool, into `state` ("memory_pools",
  // "current_memory_pools").
  void save(Session& s, nlohmann::json& state);
  // At a restore, the contexts rebuilt and before the allocations made from
  // them: every pool of `state` (save()'s) under the handle the application
  // holds; the allocations count themselves in as they are mapped again.
  Status rebuild(Session& s, const nlohmann::json& state);

 private:
  struct PendingFree {
    CUdeviceptr address = 0;
    int device = 0;
    uint64_t pool = 0;
    size_t mapped = 0;
    CUevent done = nullptr;
  };
  MemoryPool& add(Session& s, std::unique_ptr<MemoryPool> pool);
  // A pool as its image describes it, under its old handle.
  MemoryPool& restore(Session& s, const MemoryPool& saved);
  void release(Session& s, const PendingFree& f);
  // Removes a destroyed pool once nothing of it is outstanding.
  void dropIfDone(uint64_t id);

  const DriverTable& driver_;
  std::map<uint64_t, std::unique_ptr<MemoryPool>> pools_;  // by handle
  std::map<int, uint64_t> defaults_;                      // device -> pool
  std::map<int, uint64_t> current_;                       // device -> pool
  std::vector<PendingFree> pending_;
};

}  // namespace phos::daemon
