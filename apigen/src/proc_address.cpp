// SPDX-License-Identifier: Apache-2.0
// cuGetProcAddress's lookup rule over the generated version map.
#include "phos/cuda_api/proc_address.h"

#include <cuda.h>

#include <type_traits>

namespace phos::cuda_api {

static_assert(static_cast<int>(ProcAddressStatus::kSuccess) == CU_GET_PROC_ADDRESS_SUCCESS);
static_assert(static_cast<int>(ProcAddressStatus::kSymbolNotFound) == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
static_assert(static_cast<int>(ProcAddressStatus::kVersionNotSufficient) ==
              CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
static_assert(std::is_same_v<cuuint64_t, std::uint64_t>);
static_assert(kProcAddressDefault == CU_GET_PROC_ADDRESS_DEFAULT);
static_assert(kProcAddressLegacyStream == CU_GET_PROC_ADDRESS_LEGACY_STREAM);
static_assert(kProcAddressPerThreadDefaultStream == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);

ProcAddressLookup lookupProcAddress(std::string_view symbol, int cudaVersion, std::uint64_t flags) {
  const ProcAddressName* name = findProcAddressName(symbol);
  if (name == nullptr) return {ProcAddressStatus::kSymbolNotFound, kNoEntryPoint, 0, false};

  // cuda.h: "CU_GET_PROC_ADDRESS_LEGACY_STREAM: This will enable the search for
  // all driver symbols that match the requested driver symbol name except the
  // corresponding per-thread versions. CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM:
  // ... including the per-thread versions. If a per-thread version is not found,
  // the API will return the legacy version of the driver function."
  // CU_GET_PROC_ADDRESS_DEFAULT means per-thread only for callers compiled for
  // it, and cuda.h's inline cuGetProcAddress_v2_ptsz sets the per-thread bit
  // for exactly those; so the driver sees DEFAULT as legacy.
  const bool perThreadWanted = (flags & kProcAddressPerThreadDefaultStream) != 0;

  // "if the specified CUDA version is greater than or equal to the CUDA version
  // in which the driver symbol was introduced, this API will return the function
  // pointer to the corresponding versioned function": the newest ABI not newer
  // than cudaVersion. A per-thread variant older than the newest legacy ABI has
  // the old ABI, so it never beats it; at equal versions it wins.
  const ProcAddressVariant* best = nullptr;
  for (const ProcAddressVariant& v : name->variants) {
    if (v.version > cudaVersion || (v.perThread && !perThreadWanted)) continue;
    if (best == nullptr || v.version > best->version || (v.version == best->version && v.perThread)) best = &v;
  }
  if (best == nullptr) return {ProcAddressStatus::kVersionNotSufficient, kNoEntryPoint, 0, false};
  return {ProcAddressStatus::kSuccess, best->entry, best->version, best->perThread};
}

}  // namespace phos::cuda_api
