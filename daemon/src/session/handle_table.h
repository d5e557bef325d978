// SPDX-License-Identifier: Apache-2.0
// HandleTable: the virtual handles a session gives its application, and the
// driver objects they stand for.
//
// An application never sees a driver pointer. It holds ids that stay valid
// across a restore (they are re-bound to new driver objects), that cannot
// name another session's objects (each session has its own table), and that
// carry their type, so a stream id passed where a module is expected is
// refused instead of reaching the driver.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <vector>

#include "phos/cuda_api/handle_types.h"  // generated: enum class HandleType

namespace phos::daemon {

class HandleTable {
 public:
  // The id of `real`, registering it on first sight: the driver returning the
  // same object twice (cuModuleGetFunction, cuStreamGetCtx) gives the same id.
  uint64_t exportHandle(HandleType type, void* real) {
    if (real == nullptr) return 0;
    auto it = byReal_.find(real);
    if (it != byReal_.end() && typeOf(it->second) == type) return it->second;
    uint64_t id = (static_cast<uint64_t>(type) << kTypeShift) | ++next_;
    byId_[id] = real;
    byReal_[real] = id;
    return id;
  }
  // Re-binds an existing id to a new driver object of the same type (a
  // released primary context retained again, a restored object).
  void bind(HandleType type, uint64_t id, void* real) {
    if (typeOf(id) != type) return;
    erase(id);
    byId_[id] = real;
    byReal_[real] = id;
  }
  // The driver object of `id` if it is a live handle of `type`.
  void* resolve(HandleType type, uint64_t id) const {
    if (typeOf(id) != type) return nullptr;
    auto it = byId_.find(id);
    return it == byId_.end() ? nullptr : it->second;
  }
  // Forgets a destroyed object. Its id is never reused.
  void erase(uint64_t id) {
    auto it = byId_.find(id);
    if (it == byId_.end()) return;
    byReal_.erase(it->second);
    byId_.erase(it);
  }
  void eraseReal(void* real) {
    auto it = byReal_.find(real);
    if (it != byReal_.end()) erase(it->second);
  }
  size_t count(HandleType type) const {
    size_t n = 0;
    for (const auto& [id, real] : byId_) n += typeOf(id) == type;
    return n;
  }
  static HandleType typeOf(uint64_t id) { return static_cast<HandleType>(id >> kTypeShift); }
  // The serial part of an id: ids are handed out in increasing serial order,
  // whatever their type (a restore re-creates objects in that order).
  static uint64_t serialOf(uint64_t id) { return id & ((uint64_t{1} << kTypeShift) - 1); }
  // The id of a registered driver object, 0 if it has none.
  uint64_t idOf(void* real) const {
    auto it = byReal_.find(real);
    return it == byReal_.end() ? 0 : it->second;
  }
  // Every live id of `type`, in serial order.
  std::vector<uint64_t> ids(HandleType type) const {
    std::vector<uint64_t> out;
    for (const auto& [id, real] : byId_) {
      if (typeOf(id) == type) out.push_back(id);
    }
    std::sort(out.begin(), out.end(), [](uint64_t a, uint64_t b) { return serialOf(a) < serialOf(b); });
    return out;
  }
  // The types that have live ids.
  std::set<HandleType> liveTypes() const {
    std::set<HandleType> out;
    for (const auto& [id, real] : byId_) out.insert(typeOf(id));
    return out;
  }
  // The last serial handed out; a restored table continues after it, so no
  // id the application saw is ever reused.
  uint64_t lastSerial() const { return next_; }
  void setLastSerial(uint64_t serial) { next_ = std::max(next_, serial); }

 private:
  static constexpr int kTypeShift = 48;
  std::unordered_map<uint64_t, void*> byId_;
  std::unordered_map<void*, uint64_t> byReal_;
  uint64_t next_ = 0;
};

}  // namespace phos::daemon
