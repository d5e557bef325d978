// SPDX-License-Identifier: Apache-2.0
// cuGetProcAddress's lookup rule over the generated version map, free of any driver.
#pragma once

#include <cstdint>
#include <string_view>

#include "phos/cuda_api/api_table.h"

namespace phos::cuda_api {

// Values of CUdriverProcAddressQueryResult (checked against cuda.h).
enum class ProcAddressStatus : int {
  kSuccess = 0,
  kSymbolNotFound = 1,
  kVersionNotSufficient = 2,
};

// Bits of CUdriverProcAddress_flags (checked against cuda.h).
inline constexpr std::uint64_t kProcAddressDefault = 0;
inline constexpr std::uint64_t kProcAddressLegacyStream = 1u << 0;
inline constexpr std::uint64_t kProcAddressPerThreadDefaultStream = 1u << 1;

// What lookupProcAddress found: the CUdriverProcAddressQueryResult to report
// and, on kSuccess, the entry point whose address to hand out.
struct ProcAddressLookup {
  ProcAddressStatus status;
  EntryPointId entry;  // kNoEntryPoint unless kSuccess
  int version;         // version of the chosen variant, 0 unless kSuccess
  bool perThread;      // the chosen variant is a _ptds/_ptsz symbol

  bool found() const { return status == ProcAddressStatus::kSuccess; }
};

// Answers cuGetProcAddress_v2(symbol, &pfn, cudaVersion, flags, &symbolStatus):
// the newest variant of `symbol` whose version is <= cudaVersion. Per-thread
// variants are candidates only when `flags` has the per-thread bit, and win a
// tie with the legacy variant of the same version. The caller (the shim) still
// owns the checks that need a driver or concern the CUresult: a cudaVersion
// above the driver's version is CUDA_ERROR_INVALID_VALUE ("If the specified
// CUDA version is greater than the driver version, the API will return
// CUDA_ERROR_INVALID_VALUE"); flag bits other than the two below are not
// looked at here; and on anything but kSuccess pfn is set to
// NULL with CUDA_SUCCESS returned ("The API will return CUDA_SUCCESS and set the
// returned pfn to NULL if ... no ABI compatible driver function exists for the
// specified cudaVersion or if the driver symbol is invalid"). `flags` is a
// cuuint64_t (uint64_t on every platform PhOS builds for).
ProcAddressLookup lookupProcAddress(std::string_view symbol, int cudaVersion, std::uint64_t flags);

}  // namespace phos::cuda_api
