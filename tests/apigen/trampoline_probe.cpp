// SPDX-License-Identifier: Apache-2.0
// Test-only hooks into a shared library built from the trampolines: its dispatch table and its log sink.
#include "phos/common/log.h"
#include "phos/cuda_api/dispatch.h"

#define PHOS_PROBE_EXPORT extern "C" __attribute__((visibility("default")))

PHOS_PROBE_EXPORT phos::cuda_api::Dispatch* phosProbeDispatch() { return &phos::cuda_api::dispatch(); }

PHOS_PROBE_EXPORT void phosProbeLogTo(const char* file) { phos::log::setup({.toStderr = false, .file = file}); }

PHOS_PROBE_EXPORT phos::cuda_api::GenericFn phosProbeTrampoline(phos::cuda_api::EntryPointId id) {
  return phos::cuda_api::trampoline(id);
}
