// SPDX-License-Identifier: Apache-2.0
// The slots behind the exported cu* trampolines: one implementation pointer per entry point.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>

#include "phos/cuda_api/entry_points.h"  // generated: enum class EntryPointId

namespace phos::cuda_api {

// A slot holds its entry point's implementation type-erased; the trampoline
// casts it back to the exact cuda.h signature of its symbol. As with dlsym,
// installing a function of another signature is undefined behaviour: install
// through toSlot(&impl) next to a `decltype(&::cuX)` check where the
// declaration is visible.
using GenericFn = void (*)();

template <typename Fn>
GenericFn toSlot(Fn* fn) {
  return reinterpret_cast<GenericFn>(fn);
}

// Indexed by EntryPointId. An empty slot means "not remoted yet": the
// trampoline answers notSupported(). Slots may be changed while other threads
// call through them; a call sees either the old or the new implementation.
class Dispatch {
 public:
  constexpr Dispatch() = default;
  Dispatch(const Dispatch&) = delete;
  Dispatch& operator=(const Dispatch&) = delete;

  void install(EntryPointId id, GenericFn fn) { slots_[index(id)].store(fn, std::memory_order_release); }
  void reset(EntryPointId id) { install(id, nullptr); }
  void resetAll() {
    for (auto& s : slots_) s.store(nullptr, std::memory_order_release);
  }
  GenericFn slot(EntryPointId id) const { return slots_[index(id)].load(std::memory_order_acquire); }

 private:
  static constexpr std::size_t index(EntryPointId id) { return static_cast<std::size_t>(id); }
  std::atomic<GenericFn> slots_[kEntryPointCount]{};
};

// The process's table. Constant-initialized (all slots empty) before any code
// runs, so a cu* call from an application's static constructor, or one made
// while the shim is still initializing, finds a valid table.
Dispatch& dispatch();

// The exported trampoline of an entry point (nullptr for kNoEntryPoint): what
// the shim returns from cuGetProcAddress and from dlsym on its own handle.
GenericFn trampoline(EntryPointId id);

// The default implementation of every entry point: logs "<symbol> is not
// supported" once per entry point (logger "shim") and returns
// CUDA_ERROR_NOT_SUPPORTED.
CUresult notSupported(EntryPointId id);

}  // namespace phos::cuda_api
