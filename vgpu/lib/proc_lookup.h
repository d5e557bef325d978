// SPDX-License-Identifier: Apache-2.0
// cuGetProcAddress's lookup, kept free of cuda.h (apigen's generated enum collides with its #defines).
#pragma once

#include <cstdint>

namespace phos::vgpu::api {

// Values of CUdriverProcAddressQueryResult.
enum class ProcLookup : int { kSuccess = 0, kSymbolNotFound = 1, kVersionNotSufficient = 2 };

// The address of vgpu's entry point for `symbol` at `cudaVersion` with the
// CU_GET_PROC_ADDRESS_* `flags`, in *pfn (null unless kSuccess).
ProcLookup lookupProcAddress(const char* symbol, int cudaVersion, std::uint64_t flags, void** pfn);

}  // namespace phos::vgpu::api
