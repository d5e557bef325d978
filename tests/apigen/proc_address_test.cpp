// SPDX-License-Identifier: Apache-2.0
// lookupProcAddress against the rules cuGetProcAddress_v2's documentation states.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cuda.h>

#include "phos/cuda_api/proc_address.h"

namespace phos::cuda_api {
namespace {

constexpr cuuint64_t kDefault = CU_GET_PROC_ADDRESS_DEFAULT;
constexpr cuuint64_t kLegacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

std::string_view found(std::string_view symbol, int cudaVersion, cuuint64_t flags) {
  ProcAddressLookup r = lookupProcAddress(symbol, cudaVersion, flags);
  if (!r.found()) return "(not found)";
  EXPECT_EQ(r.version != 0, true);
  return entryPoint(r.entry).symbol;
}

// "if the specified CUDA version is greater than or equal to the CUDA version
// in which the driver symbol was introduced, this API will return the function
// pointer to the corresponding versioned function."
TEST(LookupProcAddress, NewestVariantNotNewerThanTheRequestedVersion) {
  EXPECT_EQ(found("cuMemAlloc", 2000, kDefault), "cuMemAlloc");
  EXPECT_EQ(found("cuMemAlloc", 3010, kDefault), "cuMemAlloc");
  EXPECT_EQ(found("cuMemAlloc", 3020, kDefault), "cuMemAlloc_v2");
  EXPECT_EQ(found("cuMemAlloc", 13000, kDefault), "cuMemAlloc_v2");
  // Asking for a version newer than the header (a newer driver) still picks
  // the newest ABI known here; the shim compares with the driver version.
  EXPECT_EQ(found("cuMemAlloc", 99000, kDefault), "cuMemAlloc_v2");

  EXPECT_EQ(found("cuCtxCreate", 11040, kDefault), "cuCtxCreate_v3");
  EXPECT_EQ(found("cuCtxCreate", 12040, kDefault), "cuCtxCreate_v3");
  EXPECT_EQ(found("cuCtxCreate", 12050, kDefault), "cuCtxCreate_v4");
  EXPECT_EQ(found("cuGetProcAddress", 11030, kDefault), "cuGetProcAddress");
  EXPECT_EQ(found("cuGetProcAddress", 12000, kDefault), "cuGetProcAddress_v2");
  // cuda-bindings asks for these exact pairs.
  EXPECT_EQ(found("cuGraphInstantiate", 11000, kDefault), "cuGraphInstantiate_v2");
  EXPECT_EQ(found("cuGraphInstantiateWithFlags", 11040, kDefault), "cuGraphInstantiateWithFlags");

  ProcAddressLookup r = lookupProcAddress("cuMemAlloc", 3020, kDefault);
  EXPECT_EQ(r.status, ProcAddressStatus::kSuccess);
  EXPECT_EQ(r.entry, EntryPointId::kCuMemAlloc_v2);
  EXPECT_EQ(r.version, 3020);
  EXPECT_FALSE(r.perThread);
}

// "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: ... including the per-thread
// versions. If a per-thread version is not found, the API will return the
// legacy version of the driver function."
TEST(LookupProcAddress, PerThreadDefaultStream) {
  EXPECT_EQ(found("cuMemcpyHtoD", 12000, kPerThread), "cuMemcpyHtoD_v2_ptds");
  EXPECT_EQ(found("cuMemcpyHtoDAsync", 12000, kPerThread), "cuMemcpyHtoDAsync_v2_ptsz");
  EXPECT_EQ(found("cuLaunchKernel", 12000, kPerThread), "cuLaunchKernel_ptsz");
  EXPECT_EQ(found("cuStreamBatchMemOp", 12000, kPerThread), "cuStreamBatchMemOp_v2_ptsz");
  EXPECT_EQ(found("cuStreamBatchMemOp", 11000, kPerThread), "cuStreamBatchMemOp_ptsz");
  // Per-thread variants appeared in CUDA 7.0: older versions fall back.
  EXPECT_EQ(found("cuMemcpyHtoD", 6050, kPerThread), "cuMemcpyHtoD_v2");
  // No per-thread variant at all: the legacy one.
  EXPECT_EQ(found("cuInit", 12000, kPerThread), "cuInit");
  EXPECT_EQ(found("cuMemAlloc", 12000, kPerThread), "cuMemAlloc_v2");
  // Both bits: the per-thread search includes everything the legacy one does.
  EXPECT_EQ(found("cuLaunchKernel", 12000, kPerThread | kLegacy), "cuLaunchKernel_ptsz");

  ProcAddressLookup r = lookupProcAddress("cuLaunchKernel", 12000, kPerThread);
  EXPECT_EQ(r.entry, EntryPointId::kCuLaunchKernel_ptsz);
  EXPECT_EQ(r.version, 7000);
  EXPECT_TRUE(r.perThread);
}

// "CU_GET_PROC_ADDRESS_LEGACY_STREAM: ... all driver symbols that match the
// requested driver symbol name except the corresponding per-thread versions."
// CU_GET_PROC_ADDRESS_DEFAULT is legacy unless the caller was compiled for
// per-thread streams, and then cuda.h's inline cuGetProcAddress_v2_ptsz has
// already replaced DEFAULT by the per-thread flag.
TEST(LookupProcAddress, LegacyStreamAndDefault) {
  for (cuuint64_t flags : {kLegacy, kDefault}) {
    SCOPED_TRACE(flags);
    EXPECT_EQ(found("cuMemcpyHtoD", 12000, flags), "cuMemcpyHtoD_v2");
    EXPECT_EQ(found("cuLaunchKernel", 12000, flags), "cuLaunchKernel");
    EXPECT_EQ(found("cuStreamBatchMemOp", 12000, flags), "cuStreamBatchMemOp_v2");
  }
}

// CUdriverProcAddressQueryResult: "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND - The
// requested symbol was not found; CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT -
// The requested symbol was found but is not supported by cudaVersion specified".
TEST(LookupProcAddress, NotFoundAndVersionNotSufficient) {
  for (std::string_view symbol : {"cuNoSuchFunction", "", "cuMemAlloc_v2", "cuLaunchKernel_ptsz", "cumemalloc"}) {
    ProcAddressLookup r = lookupProcAddress(symbol, 13000, kDefault);
    EXPECT_EQ(r.status, ProcAddressStatus::kSymbolNotFound) << symbol;
    EXPECT_EQ(static_cast<int>(r.status), CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    EXPECT_EQ(r.entry, kNoEntryPoint);
  }
  ProcAddressLookup r = lookupProcAddress("cuGetProcAddress", 11020, kDefault);
  EXPECT_EQ(r.status, ProcAddressStatus::kVersionNotSufficient);
  EXPECT_EQ(static_cast<int>(r.status), CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(r.entry, kNoEntryPoint);
  EXPECT_FALSE(r.found());
  EXPECT_EQ(lookupProcAddress("cuMemAlloc", 1000, kDefault).status, ProcAddressStatus::kVersionNotSufficient);
  EXPECT_EQ(lookupProcAddress("cuLaunchKernelEx", 11050, kPerThread).status,
            ProcAddressStatus::kVersionNotSufficient);
  EXPECT_EQ(found("cuLaunchKernelEx", 11060, kPerThread), "cuLaunchKernelEx_ptsz");
}

// Over the whole table: each variant is what a request at its own version
// with its own stream mode returns, so no ABI is unreachable.
TEST(LookupProcAddress, EveryVariantIsReachable) {
  std::size_t variants = 0;
  for (const ProcAddressName& n : procAddressNames()) {
    for (const ProcAddressVariant& v : n.variants) {
      ProcAddressLookup r = lookupProcAddress(n.publicName, v.version, v.perThread ? kPerThread : kLegacy);
      EXPECT_TRUE(r.found()) << n.publicName << " @" << v.version;
      EXPECT_EQ(r.entry, v.entry) << n.publicName << " @" << v.version << " got " << entryPoint(r.entry).symbol;
      ++variants;
    }
  }
  EXPECT_EQ(variants, kEntryPointCount);
}

}  // namespace
}  // namespace phos::cuda_api
