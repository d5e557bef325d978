// SPDX-License-Identifier: Apache-2.0
// The contexts of a session: each by the virtual id its application holds,
// the session's primary context of each device, the ids of contexts it
// destroyed, and which context each stream, event, module and function was
// made in (it dies with it). SessionContexts saves itself into a checkpoint's
// state and rebuilds itself from one, first of a session's domains: every
// other object lives in one of its contexts (docs/checkpoint.md).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "phos/common/status.h"
#include "session/driver_table.h"

namespace phos::daemon {

class ContextPool;
class HandleTable;

// A context the session owns, by virtual id.
struct SessionContext {
  CUcontext real = nullptr;
  int device = 0;
  bool primary = false;
};

// A session's primary context of one device: the driver's primary context
// is one per process (here: shared by every session), so each session gets a
// context of its own from the pool, reference counted as CUDA documents.
struct PrimaryContext {
  uint64_t id = 0;  // stable for the session, across release and retain
  unsigned refs = 0;
  unsigned flags = 0;
};

class SessionContexts {
 public:
  using Map = std::map<uint64_t, SessionContext>;

  // The contexts the session holds now, by virtual id.
  Map::const_iterator begin() const { return byId_.begin(); }
  Map::const_iterator end() const { return byId_.end(); }
  size_t size() const { return byId_.size(); }
  bool contains(uint64_t id) const { return byId_.count(id) != 0; }
  const SessionContext* find(uint64_t id) const;
  // The virtual id of driver context `real`, 0 if it is none of the session's.
  uint64_t idOf(CUcontext real) const {
    for (const auto& [id, context] : byId_) {
      if (real != nullptr && context.real == real) return id;
    }
    return 0;
  }
  // Adds context `id`, or binds a released primary context's id again.
  void adopt(uint64_t id, const SessionContext& context) { byId_[id] = context; }
  // Forgets context `id` (the session has destroyed it) and the objects made
  // in it, whose ids it returns. A context that was not primary stays
  // destroyed(); a primary one's id comes back with the next retain.
  std::vector<uint64_t> remove(uint64_t id);
  // True for the id of a context the session destroyed (and did not bind
  // again, as a retained primary context is).
  bool destroyed(uint64_t id) const {
    return id != 0 && destroyed_.count(id) != 0 && !contains(id);
  }
  PrimaryContext& primary(int device) { return primaries_[device]; }

  // A context of `device`: `preferred` if it is on it, else the first; null
  // without one.
  CUcontext on(int device, uint64_t preferred) const;
  // One context per device the session uses.
  std::map<int, CUcontext> byDevice() const;
  // The device of context `id`; `fallback` when the session has no such context.
  int deviceOf(uint64_t id, int fallback) const;

  // Stream, event, module and function `handle` was made in context `context`.
  void noteObject(uint64_t handle, uint64_t context) { objects_.emplace(handle, context); }
  void forgetObject(uint64_t handle) { objects_.erase(handle); }
  // The context object `handle` was made in; `fallback` when not known.
  uint64_t ownerOf(uint64_t handle, uint64_t fallback) const;

  // Waits for the work of every context; fails naming the first whose work
  // failed (its memory cannot be trusted). Leaves the last one current.
  Status drain(const DriverTable& driver) const;
  // The driver's context of `id`; kDataLoss when the session has none of
  // that id (an image naming a context it does not hold).
  Result<CUcontext> real(uint64_t id) const;
  // Makes context `id` current; kDataLoss as real() says.
  Status makeCurrent(const DriverTable& driver, uint64_t id) const;

  // At a checkpoint, the contexts drained: each one's device, flags, limits
  // and cache preference, the primary contexts' references and the
  // destroyed ids, into `state` ("contexts", "primaries",
  // "destroyed_contexts"). Leaves some context current.
  Status save(const DriverTable& driver, nlohmann::json& state) const;
  // At a restore, into an empty SessionContexts: every context of `state`
  // (save()'s) taken from `pool` with its flags and bound to its id in
  // `handles`, its limits and cache preference set again; `adopted(real)`
  // for each. Refuses a context on a device this host lacks, naming both.
  Status rebuild(const DriverTable& driver, ContextPool& pool, HandleTable& handles,
                 const nlohmann::json& state, const std::function<void(CUcontext)>& adopted);

 private:
  Map byId_;
  std::set<uint64_t> destroyed_;
  std::map<int, PrimaryContext> primaries_;  // by device
  std::map<uint64_t, uint64_t> objects_;     // handle id -> context id
};

}  // namespace phos::daemon
