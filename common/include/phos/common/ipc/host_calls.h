// SPDX-License-Identifier: Apache-2.0
// HostCallQueue: the host functions of an application's streams
// (cuLaunchHostFunc, cuStreamAddCallback) that phosd asks the application to
// run, in a shared-memory file both processes map.
//
// A host function runs in stream order: the driver's stream thread in phosd
// reaches it, posts it here and waits until the application has run it, so
// the stream stays blocked for as long as the function runs, as CUDA's does.
#pragma once

#include <atomic>
#include <cstdint>

#include "phos/common/ipc/shared_futex.h"

namespace phos::ipc {

enum HostCallState : uint32_t {
  kHostCallFree = 0,
  kHostCallClaimed = 1,    // phosd is filling it in
  kHostCallRequested = 2,  // waiting for the application
  kHostCallRunning = 3,    // the application runs it
  kHostCallDone = 4,       // phosd may release it
};

enum HostCallKind : uint32_t {
  kHostFunction = 0,    // CUhostFn(userData)
  kStreamCallback = 1,  // CUstreamCallback(stream, status, userData)
};

struct HostCallSlot {
  std::atomic<uint32_t> state;  // HostCallState; a futex word
  uint32_t kind;
  int32_t status;               // the stream's CUresult, for stream callbacks
  uint32_t reserved;
  uint64_t function;            // addresses in the application
  uint64_t userData;
  uint64_t stream;              // the stream handle the application passed
};

struct HostCallQueue {
  static constexpr uint32_t kSlots = 256;
  std::atomic<uint32_t> doorbell;  // futex: bumped after each request
  uint32_t reserved[15];
  HostCallSlot slots[kSlots];
};

}  // namespace phos::ipc
