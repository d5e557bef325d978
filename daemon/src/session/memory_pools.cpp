// SPDX-License-Identifier: Apache-2.0
// The stream-ordered allocator of a session (memory_pools.h).
#include "session/memory_pools.h"

#include <algorithm>

#include "session/session.h"
#include "session/session_image.h"

namespace phos::daemon {
namespace {

// Runs `body` with a context of `device` current, then the call's own again:
// heap mappings and events are made in a context.
template <typename Body>
CUresult onDevice(Session& s, int device, Body&& body) {
  CUcontext ctx = s.contextOn(device);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const CUcontext current = s.currentRealContext();
  if (ctx != current) PHOS_DRIVER(s.driver(), CtxSetCurrent)(ctx);
  CUresult r = body();
  if (ctx != current) PHOS_DRIVER(s.driver(), CtxSetCurrent)(current);
  return r;
}

}  // namespace

MemoryPools::~MemoryPools() = default;  // pending frees' events die with their contexts

MemoryPool& MemoryPools::add(Session& s, std::unique_ptr<MemoryPool> pool) {
  MemoryPool* p = pool.get();
  if (p->id == 0) {
    p->id = s.handles().exportHandle(HandleType::kCUmemPoolHandle_st, p);
  } else if (!p->destroyed) {  // a destroyed pool's handle is gone; its allocations live on
    s.handles().bind(HandleType::kCUmemPoolHandle_st, p->id, p);
  }
  pools_[p->id] = std::move(pool);
  return *p;
}

MemoryPool& MemoryPools::defaultPool(Session& s, int device) {
  if (auto it = defaults_.find(device); it != defaults_.end()) return *pools_.at(it->second);
  auto pool = std::make_unique<MemoryPool>();
  pool->device = device;
  pool->isDefault = true;
  MemoryPool& p = add(s, std::move(pool));
  defaults_[device] = p.id;
  return p;
}

MemoryPool& MemoryPools::currentPool(Session& s, int device) {
  if (auto it = current_.find(device); it != current_.end()) {
    if (MemoryPool* p = find(it->second); p != nullptr && !p->destroyed) return *p;
  }
  return defaultPool(s, device);
}

CUresult MemoryPools::setCurrent(int device, MemoryPool& pool) {
  if (pool.device != device || pool.destroyed) return CUDA_ERROR_INVALID_VALUE;
  current_[device] = pool.id;
  return CUDA_SUCCESS;
}

MemoryPool& MemoryPools::create(Session& s, int device, size_t maxSize) {
  auto pool = std::make_unique<MemoryPool>();
  pool->device = device;
  pool->maxSize = maxSize;
  return add(s, std::move(pool));
}

MemoryPool* MemoryPools::find(uint64_t id) {
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : it->second.get();
}

CUresult MemoryPools::destroy(Session& s, MemoryPool& pool) {
  // "A device's default memory pool cannot be destroyed."
  if (pool.isDefault || pool.destroyed) return CUDA_ERROR_INVALID_VALUE;
  pool.destroyed = true;
  // "Destroying the current mempool of a device sets the default mempool of
  // that device as the current mempool for that device."
  if (auto it = current_.find(pool.device); it != current_.end() && it->second == pool.id) current_.erase(it);
  // The application's handle is gone at once; the pool itself lives on while
  // allocations or frees of it are outstanding.
  s.handles().erase(pool.id);
  dropIfDone(pool.id);
  return CUDA_SUCCESS;
}

void MemoryPools::dropIfDone(uint64_t id) {
  MemoryPool* p = find(id);
  if (p != nullptr && p->destroyed && p->reserved == 0) pools_.erase(id);
}

CUresult MemoryPools::allocate(Session& s, MemoryPool& pool, size_t bytes, CUdeviceptr* address) {
  if (bytes == 0 || pool.destroyed) return CUDA_ERROR_INVALID_VALUE;
  reap(s);
  if (pool.maxSize != 0 && (bytes > pool.maxSize || pool.used + bytes > pool.maxSize)) {
    reap(s, true, &pool);
    if (bytes > pool.maxSize || pool.used + bytes > pool.maxSize) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult r = onDevice(s, pool.device, [&] { return s.allocateDevice(pool.device, bytes, address); });
  if (r == CUDA_ERROR_OUT_OF_MEMORY && !pending_.empty()) {
    // Memory whose free is still in flight: wait for it rather than fail.
    reap(s, true);
    r = onDevice(s, pool.device, [&] { return s.allocateDevice(pool.device, bytes, address); });
  }
  if (r != CUDA_SUCCESS) return r;
  Allocation a;
  a.address = *address;
  a.bytes = bytes;
  a.context = s.currentContext();
  a.device = pool.device;
  a.pool = pool.id;
  s.memory().add(a);
  pool.used += bytes;
  pool.usedHigh = std::max(pool.usedHigh, pool.used);
  pool.reserved += s.memory().mappedBytes(pool.device, *address);
  pool.reservedHigh = std::max(pool.reservedHigh, pool.reserved);
  return CUDA_SUCCESS;
}

CUresult MemoryPools::freeAsync(Session& s, CUdeviceptr address, CUstream stream) {
  const Allocation* a = s.memory().find(address);
  if (a == nullptr || a->address != address || a->module != nullptr) return CUDA_ERROR_INVALID_VALUE;
  PendingFree f;
  f.address = address;
  f.device = a->device;
  f.pool = a->pool;
  f.mapped = s.memory().mappedBytes(a->device, address);
  // The event is made in the stream's context, which is the current one.
  CUresult r = PHOS_DRIVER(s.driver(), EventCreate)(&f.done, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) return r;
  r = PHOS_DRIVER(s.driver(), EventRecord)(f.done, stream);
  if (r != CUDA_SUCCESS) {
    PHOS_DRIVER(s.driver(), EventDestroy_v2)(f.done);
    return r;
  }
  if (MemoryPool* p = find(a->pool)) p->used -= std::min<uint64_t>(p->used, a->bytes);
  // (Memory from cuMemAlloc may be freed in stream order too: pool 0.)
  s.memory().remove(address);
  pending_.push_back(f);
  return CUDA_SUCCESS;
}

void MemoryPools::forget(Session& s, CUdeviceptr address) {
  const Allocation* a = s.memory().find(address);
  if (a == nullptr || a->pool == 0) return;
  MemoryPool* p = find(a->pool);
  if (p == nullptr) return;
  p->used -= std::min<uint64_t>(p->used, a->bytes);
  p->reserved -= std::min<uint64_t>(p->reserved, s.memory().mappedBytes(a->device, address));
  dropIfDone(p->id);
}

void MemoryPools::release(Session& s, const PendingFree& f) {
  PHOS_DRIVER(s.driver(), EventDestroy_v2)(f.done);
  (void)s.memory().releaseRange(f.device, f.address);
  if (MemoryPool* p = find(f.pool)) {
    p->reserved -= std::min<uint64_t>(p->reserved, f.mapped);
    dropIfDone(p->id);
  }
}

void MemoryPools::reap(Session& s, bool wait, const MemoryPool* pool) {
  std::vector<PendingFree> left;
  for (const PendingFree& f : pending_) {
    const bool mine = pool == nullptr || f.pool == pool->id;
    CUresult r = wait && mine ? PHOS_DRIVER(s.driver(), EventSynchronize)(f.done)
                              : PHOS_DRIVER(s.driver(), EventQuery)(f.done);
    if (r == CUDA_SUCCESS) {
      release(s, f);
    } else {
      left.push_back(f);
    }
  }
  pending_ = std::move(left);
}

MemoryPool& MemoryPools::restore(Session& s, const MemoryPool& saved) {
  auto pool = std::make_unique<MemoryPool>(saved);
  pool->used = pool->reserved = 0;  // counted again as its allocations are restored
  MemoryPool& p = add(s, std::move(pool));
  if (p.isDefault) defaults_[p.device] = p.id;
  return p;
}

void MemoryPools::save(Session& s, nlohmann::json& state) {
  reap(s, true);
  nlohmann::json pools = nlohmann::json::array();
  for (const auto& [id, p] : pools_) {
    pools.push_back({{"id", id},
                     {"device", p->device},
                     {"default", p->isDefault},
                     {"destroyed", p->destroyed},
                     {"max_size", p->maxSize},
                     {"release_threshold", p->releaseThreshold},
                     {"reuse_follow_event_dependencies", p->followEventDependencies},
                     {"reuse_allow_opportunistic", p->allowOpportunistic},
                     {"reuse_allow_internal_dependencies", p->allowInternalDependencies},
                     {"used_high", p->usedHigh},
                     {"reserved_high", p->reservedHigh}});
  }
  state["memory_pools"] = pools;
  nlohmann::json current = nlohmann::json::array();
  for (const auto& [device, pool] : current_) current.push_back({{"device", device}, {"pool", pool}});
  state["current_memory_pools"] = current;
}

Status MemoryPools::rebuild(Session& s, const nlohmann::json& state) {
  for (const nlohmann::json& p : state.value("memory_pools", nlohmann::json::array())) {
    MemoryPool pool;
    ASSIGN_OR_RETURN(pool.id, field<uint64_t>(p, "id", "memory pool"));
    ASSIGN_OR_RETURN(pool.device, field<int>(p, "device", "memory pool"));
    pool.isDefault = p.value("default", false);
    pool.destroyed = p.value("destroyed", false);
    pool.maxSize = p.value("max_size", size_t{0});
    pool.releaseThreshold = p.value("release_threshold", uint64_t{0});
    pool.followEventDependencies = p.value("reuse_follow_event_dependencies", 1);
    pool.allowOpportunistic = p.value("reuse_allow_opportunistic", 1);
    pool.allowInternalDependencies = p.value("reuse_allow_internal_dependencies", 1);
    pool.usedHigh = p.value("used_high", uint64_t{0});
    pool.reservedHigh = p.value("reserved_high", uint64_t{0});
    if (HandleTable::typeOf(pool.id) != HandleType::kCUmemPoolHandle_st) {
      return makeError(Code::kDataLoss, "memory pool {} has the handle of another type", hex(pool.id));
    }
    restore(s, pool);
  }
  for (const nlohmann::json& c : state.value("current_memory_pools", nlohmann::json::array())) {
    ASSIGN_OR_RETURN(int device, field<int>(c, "device", "current memory pool"));
    ASSIGN_OR_RETURN(uint64_t pool, field<uint64_t>(c, "pool", "current memory pool"));
    if (find(pool) == nullptr) {
      return makeError(Code::kDataLoss, "the current memory pool {} of device {} is not in the image", hex(pool),
                       device);
    }
    current_[device] = pool;
  }
  return Status::ok();
}

}  // namespace phos::daemon
