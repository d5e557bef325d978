// SPDX-License-Identifier: Apache-2.0
// The generator's model of cuda.h / cudaTypedefs.h (CUDA 13.0) against facts read from the headers by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "directions.h"
#include "header_parser.h"
#include "status_matchers.h"
#include "version_map.h"

namespace phos::apigen {
namespace {

using ::phos::testing::IsOk;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

ParseOptions realHeaders() {
  ParseOptions o;
  o.cudaHeader = PHOS_CUDA_H;
  o.typedefsHeader = PHOS_CUDA_TYPEDEFS_H;
  if (std::string_view(PHOS_CLANG_RESOURCE_DIR).size() != 0) {
    o.clangArgs.push_back(std::string("-resource-dir=") + PHOS_CLANG_RESOURCE_DIR);
  }
  return o;
}

class RealHeaders : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<ApiModel> parsed = parseHeaders(realHeaders());
    ASSERT_THAT(parsed, IsOk());
    model_ = std::move(parsed).value();
    ASSERT_THAT(buildProcAddressMap(*model_), IsOk());
    Result<DirectionStats> directions = assignDirections(*model_, PHOS_PARAM_DIRECTIONS);
    ASSERT_THAT(directions, IsOk());
    directions_ = *directions;
  }
  static const ApiModel& model() { return *model_; }

  static const EntryPoint& entry(const std::string& symbol) {
    const EntryPoint* e = model_->find(symbol);
    if (e == nullptr) {
      ADD_FAILURE() << symbol << " is not in the model";
      static const EntryPoint kNone;
      return kNone;
    }
    return *e;
  }
  static std::vector<std::string> variantsOf(const std::string& publicName) {
    std::vector<std::string> out;
    for (const ProcAddressName& n : model_->procAddress) {
      if (n.publicName != publicName) continue;
      for (const ProcAddressVariant& v : n.variants) {
        out.push_back(std::to_string(v.version) + (v.perThread ? "p:" : ":") + v.symbol);
      }
    }
    return out;
  }

  static inline std::optional<ApiModel> model_;
  static inline DirectionStats directions_;
};

TEST_F(RealHeaders, HeaderVersionAndCounts) {
  // cuda.h: `#define CUDA_VERSION 13000`.
  EXPECT_EQ(model().cudaVersion, 13000);
  // cudaTypedefs.h has one PFN typedef per exported ABI (634 `typedef ... PFN_`
  // lines, counted with grep), and every one binds a distinct symbol.
  EXPECT_EQ(model().typedefs.size(), 634u);
  EXPECT_EQ(model().entryPoints.size(), 634u);
  EXPECT_THAT(model().unversionedSymbols, IsEmpty());
  EXPECT_TRUE(std::is_sorted(model().entryPoints.begin(), model().entryPoints.end(),
                             [](const EntryPoint& a, const EntryPoint& b) { return a.symbol < b.symbol; }));
}

TEST_F(RealHeaders, MemAllocIsRenamedToV2From3020) {
  // cuda.h: `#define cuMemAlloc cuMemAlloc_v2`; cudaTypedefs.h:
  // PFN_cuMemAlloc_v3020 (CUdeviceptr_v2 *, size_t) and, under
  // __CUDA_API_VERSION_INTERNAL, PFN_cuMemAlloc_v2000 (CUdeviceptr_v1 *, unsigned int).
  ASSERT_TRUE(model().renames.contains("cuMemAlloc"));
  EXPECT_EQ(model().renames.at("cuMemAlloc").defaultSymbol, "cuMemAlloc_v2");
  EXPECT_EQ(model().renames.at("cuMemAlloc").perThreadSymbol, "");
  EXPECT_THAT(variantsOf("cuMemAlloc"), ElementsAre("2000:cuMemAlloc", "3020:cuMemAlloc_v2"));

  const EntryPoint& v2 = entry("cuMemAlloc_v2");
  EXPECT_EQ(v2.publicName, "cuMemAlloc");
  EXPECT_EQ(v2.origin, Origin::kDefault);
  ASSERT_EQ(v2.params.size(), 2u);
  EXPECT_EQ(v2.params[0].name, "dptr");
  EXPECT_EQ(v2.params[0].type, "CUdeviceptr *");
  EXPECT_EQ(v2.params[0].canonicalType, "unsigned long long *");
  EXPECT_EQ(v2.params[1].type, "size_t");

  const EntryPoint& v1 = entry("cuMemAlloc");
  EXPECT_EQ(v1.origin, Origin::kLegacy);
  EXPECT_EQ(v1.canonicalSignature(), "enum cudaError_enum (unsigned int *, unsigned int)");
}

TEST_F(RealHeaders, MemcpyHtoDHasAPerThreadVariant) {
  // cuda.h: `#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)`;
  // cudaTypedefs.h: PFN_cuMemcpyHtoD_v7000_ptds.
  ASSERT_TRUE(model().renames.contains("cuMemcpyHtoD"));
  EXPECT_EQ(model().renames.at("cuMemcpyHtoD").defaultSymbol, "cuMemcpyHtoD_v2");
  EXPECT_EQ(model().renames.at("cuMemcpyHtoD").perThreadSymbol, "cuMemcpyHtoD_v2_ptds");
  EXPECT_THAT(variantsOf("cuMemcpyHtoD"),
              ElementsAre("2000:cuMemcpyHtoD", "3020:cuMemcpyHtoD_v2", "7000p:cuMemcpyHtoD_v2_ptds"));
  const EntryPoint& ptds = entry("cuMemcpyHtoD_v2_ptds");
  EXPECT_EQ(ptds.origin, Origin::kPerThread);
  EXPECT_EQ(ptds.publicName, "cuMemcpyHtoD");
  EXPECT_EQ(ptds.canonicalSignature(), entry("cuMemcpyHtoD_v2").canonicalSignature());
}

TEST_F(RealHeaders, GetProcAddressV2) {
  // cuda.h: `#define cuGetProcAddress cuGetProcAddress_v2`, declared as
  // (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
  //  CUdriverProcAddressQueryResult *symbolStatus); the 4-parameter
  // cuGetProcAddress only under __CUDA_API_VERSION_INTERNAL.
  const EntryPoint& v2 = entry("cuGetProcAddress_v2");
  EXPECT_EQ(v2.origin, Origin::kDefault);
  ASSERT_EQ(v2.params.size(), 5u);
  EXPECT_EQ(v2.params[0].type, "const char *");
  EXPECT_EQ(v2.params[3].type, "cuuint64_t");
  EXPECT_EQ(v2.params[4].type, "CUdriverProcAddressQueryResult *");
  EXPECT_EQ(entry("cuGetProcAddress").origin, Origin::kLegacy);
  EXPECT_EQ(entry("cuGetProcAddress").params.size(), 4u);
  EXPECT_THAT(variantsOf("cuGetProcAddress"), ElementsAre("11030:cuGetProcAddress", "12000:cuGetProcAddress_v2"));
  // The static inline cuGetProcAddress_v2_ptsz of per-thread builds is compiled
  // into the caller; no driver exports it.
  EXPECT_EQ(model().find("cuGetProcAddress_v2_ptsz"), nullptr);
}

TEST_F(RealHeaders, LaunchKernelStreamParameter) {
  // cuLaunchKernel(CUfunction f, gridDimX, gridDimY, gridDimZ, blockDimX,
  // blockDimY, blockDimZ, sharedMemBytes, CUstream hStream, void **kernelParams, void **extra).
  for (const char* symbol : {"cuLaunchKernel", "cuLaunchKernel_ptsz"}) {
    SCOPED_TRACE(symbol);
    const EntryPoint& e = entry(symbol);
    ASSERT_EQ(e.params.size(), 11u);
    EXPECT_EQ(e.streamParam, 8);
    EXPECT_EQ(e.params[8].name, "hStream");
    EXPECT_TRUE(e.params[8].isStream);
    EXPECT_EQ(e.params[9].type, "void **");
    EXPECT_FALSE(e.params[9].pointeeConst);
    EXPECT_EQ(e.params[0].type, "CUfunction");
    EXPECT_TRUE(e.params[0].isPointer);  // CUfunction is `struct CUfunc_st *`
  }
  EXPECT_EQ(entry("cuLaunchKernel_ptsz").origin, Origin::kPerThread);
  EXPECT_THAT(variantsOf("cuLaunchKernel"), ElementsAre("4000:cuLaunchKernel", "7000p:cuLaunchKernel_ptsz"));
  EXPECT_EQ(entry("cuMemAlloc_v2").streamParam, -1);
  // cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream).
  EXPECT_EQ(entry("cuMemcpyHtoDAsync_v2").streamParam, 3);
}

TEST_F(RealHeaders, ConstPointees) {
  // cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
  const EntryPoint& htod = entry("cuMemcpyHtoD_v2");
  EXPECT_FALSE(htod.params[0].isPointer);
  EXPECT_TRUE(htod.params[1].isPointer);
  EXPECT_TRUE(htod.params[1].pointeeConst);
  // cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
  const EntryPoint& dtoh = entry("cuMemcpyDtoH_v2");
  EXPECT_TRUE(dtoh.params[0].isPointer);
  EXPECT_FALSE(dtoh.params[0].pointeeConst);
  // cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy): the const survives the typedef.
  const EntryPoint& m2d = entry("cuMemcpy2D_v2");
  EXPECT_EQ(m2d.params[0].type, "const CUDA_MEMCPY2D *");
  EXPECT_EQ(m2d.params[0].canonicalType, "const struct CUDA_MEMCPY2D_st *");
  EXPECT_TRUE(m2d.params[0].pointeeConst);
  // cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
  const EntryPoint& gf = entry("cuModuleGetFunction");
  EXPECT_FALSE(gf.params[0].pointeeConst);
  EXPECT_TRUE(gf.params[2].pointeeConst);
  // cuKernelGetName(const char **name, CUkernel hfunc): the pointee is a
  // (non-const) pointer to const char, written by the callee.
  const EntryPoint& kn = entry("cuKernelGetName");
  EXPECT_EQ(kn.params[0].type, "const char **");
  EXPECT_FALSE(kn.params[0].pointeeConst);
}

TEST_F(RealHeaders, DeprecationAndAbiRevisions) {
  // cuda.h: `__CUDA_DEPRECATED CUresult CUDAAPI cuCtxAttach(...)`.
  EXPECT_TRUE(entry("cuCtxAttach").deprecated);
  EXPECT_FALSE(entry("cuCtxCreate_v4").deprecated);
  // Four ABIs of cuCtxCreate: _v2000 (legacy), _v3020, _v11040, _v12050.
  EXPECT_THAT(variantsOf("cuCtxCreate"), ElementsAre("2000:cuCtxCreate", "3020:cuCtxCreate_v2",
                                                     "11040:cuCtxCreate_v3", "12050:cuCtxCreate_v4"));
  // Equal signatures, told apart by order: PFN_cuDeviceGetUuid_v9020 and _v11040.
  EXPECT_EQ(entry("cuDeviceGetUuid").canonicalSignature(), entry("cuDeviceGetUuid_v2").canonicalSignature());
  EXPECT_THAT(variantsOf("cuDeviceGetUuid"), ElementsAre("9020:cuDeviceGetUuid", "11040:cuDeviceGetUuid_v2"));
  // `#define cuGraphInstantiate cuGraphInstantiateWithFlags`: a rename to
  // another name, whose own typedef is PFN_cuGraphInstantiateWithFlags_v11040.
  EXPECT_EQ(model().renames.at("cuGraphInstantiate").defaultSymbol, "cuGraphInstantiateWithFlags");
  EXPECT_THAT(variantsOf("cuGraphInstantiateWithFlags"), ElementsAre("11040:cuGraphInstantiateWithFlags"));
}

TEST_F(RealHeaders, ParameterKindsAndDirections) {
  const EntryPoint& htod = entry("cuMemcpyHtoDAsync_v2");
  EXPECT_EQ(htod.params[0].kind, ParamKind::kValue);  // CUdeviceptr is an integer
  EXPECT_EQ(htod.params[1].kind, ParamKind::kPointer);
  EXPECT_EQ(htod.params[1].direction, Direction::kIn);  // const void *srcHost
  EXPECT_EQ(htod.params[3].kind, ParamKind::kHandle);   // CUstream
  EXPECT_EQ(htod.params[3].direction, Direction::kIn);

  const EntryPoint& alloc = entry("cuMemAlloc_v2");
  EXPECT_EQ(alloc.params[0].direction, Direction::kOut);  // CUdeviceptr *dptr
  EXPECT_TRUE(alloc.params[0].directionWhy.empty());

  // cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
  const EntryPoint& host = entry("cuLaunchHostFunc");
  EXPECT_EQ(host.params[1].kind, ParamKind::kCallback);
  EXPECT_EQ(host.params[2].kind, ParamKind::kAddress);
  EXPECT_EQ(host.params[2].direction, Direction::kIn);

  // Overrides: a non-const void * the driver fills, in every variant...
  for (const char* symbol : {"cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoH"}) {
    const EntryPoint& dtoh = entry(symbol);
    EXPECT_EQ(dtoh.params[0].kind, ParamKind::kAddress) << symbol;
    EXPECT_EQ(dtoh.params[0].direction, Direction::kOut) << symbol;
    EXPECT_FALSE(dtoh.params[0].directionWhy.empty()) << symbol;
  }
  // ...arrays cuda.h declares without const...
  const EntryPoint& batch = entry("cuMemcpyBatchAsync_v2");
  EXPECT_EQ(batch.params[0].name, "dsts");
  EXPECT_EQ(batch.params[0].direction, Direction::kIn);
  // ...and counts that are both capacity and result.
  const EntryPoint& nodes = entry("cuGraphGetNodes");
  EXPECT_EQ(nodes.params[2].name, "numNodes");
  EXPECT_EQ(nodes.params[2].direction, Direction::kInOut);
  EXPECT_EQ(entry("cuThreadExchangeStreamCaptureMode").params[0].direction, Direction::kInOut);

  EXPECT_EQ(directions_.pointers, 692);
  EXPECT_EQ(directions_.overridden, 157);
}

TEST(PublicNames, StripRevisionAndStreamSuffix) {
  EXPECT_EQ(publicNameOf("cuMemcpyHtoDAsync_v2_ptsz"), "cuMemcpyHtoDAsync");
  EXPECT_EQ(publicNameOf("cuMemAlloc_v2"), "cuMemAlloc");
  EXPECT_EQ(publicNameOf("cuInit"), "cuInit");
  EXPECT_EQ(publicNameOf("cuLaunchKernel_ptsz"), "cuLaunchKernel");
  EXPECT_EQ(publicNameOf("cuGraphAddNode_v"), "cuGraphAddNode_v");  // no digits: not a revision
  EXPECT_TRUE(isPerThreadSymbol("cuMemcpy_ptds"));
  EXPECT_FALSE(isPerThreadSymbol("cuMemcpy"));
}

}  // namespace
}  // namespace phos::apigen
