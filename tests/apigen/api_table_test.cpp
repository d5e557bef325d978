// SPDX-License-Identifier: Apache-2.0
// The generated API table against the symbols NVIDIA's driver exports (the toolkit's stub libcuda.so).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "elf_symbols.h"
#include "phos/cuda_api/api_table.h"
#include "status_matchers.h"

namespace phos::cuda_api {
namespace {

using ::phos::testing::IsOk;
using ::testing::IsEmpty;

std::set<std::string> tableSymbols() {
  std::set<std::string> out;
  for (const EntryPointInfo& e : entryPoints()) out.emplace(e.symbol);
  return out;
}

TEST(ApiTable, IdsIndexTheTable) {
  auto table = entryPoints();
  ASSERT_EQ(table.size(), kEntryPointCount);
  for (std::size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(table[i].id), i);
    if (i > 0) {
      EXPECT_LT(table[i - 1].symbol, table[i].symbol);
    }
    EXPECT_EQ(&entryPoint(table[i].id), &table[i]);
    EXPECT_EQ(findEntryPoint(table[i].symbol), &table[i]);
  }
  EXPECT_EQ(findEntryPoint("cuNoSuchFunction"), nullptr);
  EXPECT_EQ(findEntryPoint(""), nullptr);
  EXPECT_EQ(headerCudaVersion(), 13000);
  EXPECT_EQ(entryPoint(EntryPointId::kCuMemAlloc_v2).symbol, "cuMemAlloc_v2");
  EXPECT_EQ(entryPoint(EntryPointId::kCuLaunchKernel).streamParam, 8);
  EXPECT_TRUE(entryPoint(EntryPointId::kCuLaunchKernel).hasStream());
  const EntryPointInfo& dtoh = entryPoint(EntryPointId::kCuMemcpyDtoH_v2);
  EXPECT_EQ(dtoh.params[0].kind, ParamKind::kAddress);
  EXPECT_EQ(dtoh.params[0].direction, ParamDirection::kOut);  // from apigen/param_directions.json
  EXPECT_EQ(entryPoint(EntryPointId::kCuMemAlloc_v2).params[0].direction, ParamDirection::kOut);
  EXPECT_EQ(entryPoint(EntryPointId::kCuMemcpyHtoD_v2).params[1].direction, ParamDirection::kIn);
}

TEST(ApiTable, ProcAddressNamesAreSortedAndPointIntoTheTable) {
  auto names = procAddressNames();
  ASSERT_EQ(names.size(), kProcAddressNameCount);
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(names[i - 1].publicName, names[i].publicName);
    }
    ASSERT_FALSE(names[i].variants.empty()) << names[i].publicName;
    for (const ProcAddressVariant& v : names[i].variants) {
      EXPECT_EQ(entryPoint(v.entry).publicName, names[i].publicName);
      EXPECT_EQ(v.perThread, entryPoint(v.entry).origin == EntryPointOrigin::kPerThread);
    }
  }
  EXPECT_EQ(findProcAddressName("cuMemAlloc_v2"), nullptr);  // names are the base names
  ASSERT_NE(findProcAddressName("cuMemAlloc"), nullptr);
}

// NVIDIA's driver exports what `nm -D` lists for the toolkit's stub; the shim
// has to export at least the same.
TEST(ApiTable, CoversTheDriverStubExports) {
  Result<std::set<std::string>> stub = phos::testing::definedDynamicSymbols(PHOS_CUDA_STUB);
  ASSERT_THAT(stub, IsOk());
  ASSERT_GT(stub->size(), 600u) << "is " << PHOS_CUDA_STUB << " the stub libcuda.so?";
  std::set<std::string> table = tableSymbols();

  std::vector<std::string> stubOnly;
  std::set_difference(stub->begin(), stub->end(), table.begin(), table.end(), std::back_inserter(stubOnly));
  // cuda.h and cudaProfiler.h together declare every export of the driver.
  EXPECT_THAT(stubOnly, IsEmpty());
  EXPECT_TRUE(table.contains("cuProfilerStart")) << "the profiler control API of cudaProfiler.h is missing";

  std::vector<std::string> tableOnly;
  std::set_difference(table.begin(), table.end(), stub->begin(), stub->end(), std::back_inserter(tableOnly));
  // Every symbol cuda.h declares (in either configuration) is exported by the driver.
  EXPECT_THAT(tableOnly, IsEmpty());
}

}  // namespace
}  // namespace phos::cuda_api
