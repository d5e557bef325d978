// SPDX-License-Identifier: Apache-2.0
// Which Driver API entry points the application reaches: a debug line at the
// first call of each (PHOS_LOG=shim:debug), a warning naming every entry point
// PhOS cannot serve and why, and, with PHOS_TRACE_API=FILE (phos run
// --trace-api), a table of every entry point called, written at exit.
#pragma once

#include <atomic>
#include <cstdint>

#include "phos/cuda_api/entry_points.h"

namespace phos::shim::trace {

enum class Served : uint8_t { kRemoted = 1, kLocal, kExcluded };

namespace detail {
extern std::atomic<uint64_t> gCalls[cuda_api::kEntryPointCount];
extern thread_local int tInternal;
void firstCall(cuda_api::EntryPointId id, Served how);
}  // namespace detail

// Marks the shim's own calls of entry points it exports (parameter sizes
// before a launch, occupancy from attributes): they are not the application's
// and are not counted.
class InternalCalls {
 public:
  InternalCalls() { ++detail::tInternal; }
  ~InternalCalls() { --detail::tInternal; }
  InternalCalls(const InternalCalls&) = delete;
  InternalCalls& operator=(const InternalCalls&) = delete;
};

// Whether this thread is inside the shim's own calls.
inline bool internal() { return detail::tInternal != 0; }

// Counts a call (one relaxed atomic add on the call path).
inline void note(cuda_api::EntryPointId id, Served how) {
  if (detail::tInternal != 0) return;
  if (detail::gCalls[static_cast<size_t>(id)].fetch_add(1, std::memory_order_relaxed) == 0) detail::firstCall(id, how);
}

// An entry point PhOS does not serve: counted, logged once with `reason`,
// CUDA_ERROR_NOT_SUPPORTED.
int excluded(cuda_api::EntryPointId id, const char* reason);

// Registers the table written at exit when PHOS_TRACE_API names a file ("-": stderr).
void writeSummaryAtExit();

}  // namespace phos::shim::trace
