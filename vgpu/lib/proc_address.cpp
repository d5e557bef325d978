// SPDX-License-Identifier: Apache-2.0
// Entry points: cuGetProcAddress (both ABIs) over apigen's version map and vgpu's own symbol table.
#include "entry.h"

#include "proc_lookup.h"

using namespace phos;
using namespace phos::vgpu;

namespace {

constexpr int kDriverVersion = 13000;

// Returns the CUresult; *status receives the CUdriverProcAddressQueryResult.
CUresult lookup(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr cuuint64_t kKnown = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  // "If the specified CUDA version is greater than the driver version, the API
  // will return CUDA_ERROR_INVALID_VALUE."
  if (cudaVersion > kDriverVersion || cudaVersion <= 0) return CUDA_ERROR_INVALID_VALUE;
  auto result = api::lookupProcAddress(symbol, cudaVersion, flags, pfn);
  if (status != nullptr) *status = static_cast<CUdriverProcAddressQueryResult>(result);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* symbolStatus) {
  try {
    // "The API will return CUDA_SUCCESS and set the returned pfn to NULL if the
    // requested driver function is not supported on the platform, no ABI
    // compatible driver function exists for the specified cudaVersion or if the
    // driver symbol is invalid", with symbolStatus saying which.
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

// The CUDA 11 ABI without symbolStatus; it reports a missing symbol as an error.
#undef cuGetProcAddress
PHOS_CU_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  try {
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult result = lookup(symbol, pfn, cudaVersion, flags, &status);
    if (result != CUDA_SUCCESS) return result;
    return status == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}
