// SPDX-License-Identifier: Apache-2.0
// vgpu as a Driver API client sees it: initialization, versions, errors, cuGetProcAddress, devices.
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "vgpu_test_support.h"

namespace phos::vgpu::testing {
namespace {

// Runs first in this process (gtest keeps declaration order): nothing but
// version queries works before cuInit.
TEST(BeforeInit, OnlyVersionQueriesWork) {
  int count = -1;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&count));
  CUdevice dev = -1;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGet(&dev, 0));
  CUdeviceptr p = 0;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_INITIALIZED, cuMemAlloc(&p, 16));
  int version = 0;
  EXPECT_CU(cuDriverGetVersion(&version));
  EXPECT_EQ(version, 13000);
}

TEST(Init, FlagsMustBeZero) {
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuInit(1));
  EXPECT_CU(cuInit(0));
  EXPECT_CU(cuInit(0));  // idempotent
}

TEST(Init, DriverVersionNeedsAnOutPointer) {
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDriverGetVersion(nullptr));
}

TEST(Errors, NamesAndStringsComeFromCudaH) {
  const char* s = nullptr;
  EXPECT_CU(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
  EXPECT_STREQ(s, "CUDA_ERROR_INVALID_VALUE");
  EXPECT_CU(cuGetErrorName(CUDA_SUCCESS, &s));
  EXPECT_STREQ(s, "CUDA_SUCCESS");
  EXPECT_CU(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_THAT(std::string(s), ::testing::HasSubstr("memory"));
  // "CUDA_ERROR_INVALID_VALUE if error is not a valid CUresult", with *pStr NULL.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetErrorName(static_cast<CUresult>(12345), &s));
  EXPECT_EQ(s, nullptr);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetErrorString(static_cast<CUresult>(12345), &s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetErrorName(CUDA_SUCCESS, nullptr));
}

// NVIDIA's private tables the CUDA runtime needs are served
// (tests/export_tables checks what they do); others are not found.
TEST(ExportTable, RuntimeTablesAreServedAndOthersNotFound) {
  ASSERT_CU(cuInit(0));
  const void* table = reinterpret_cast<const void*>(0x1);
  CUuuid unknown{};
  std::memset(unknown.bytes, 0x6e, sizeof(unknown.bytes));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuGetExportTable(&table, &unknown));
  EXPECT_EQ(table, nullptr);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetExportTable(nullptr, &unknown));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetExportTable(&table, nullptr));
  // CUDART_INTERFACE: 13 slots, slot 0 its size in bytes.
  const CUuuid cudart = {{'\x6b', '\xd5', '\xfb', '\x6c', '\x5b', '\xf4', '\xe7', '\x4a', '\x89', '\x87',
                          '\xd9', '\x39', '\x12', '\xfd', '\x9d', '\xf9'}};
  ASSERT_CU(cuGetExportTable(&table, &cudart));
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(reinterpret_cast<const uintptr_t*>(table)[0], 13 * sizeof(void*));
}

TEST(ExportTable, VgpuHasItsOwnTable) {
  ASSERT_CU(cuInit(0));
  ASSERT_NE(exportTable(), nullptr);
  EXPECT_GE(exportTable()->size, sizeof(ExportTable));
}

TEST(Unsupported, EntryPointsVgpuLacksReturnNotSupported) {
  ASSERT_CU(cuInit(0));
  CUmipmappedArray array = nullptr;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = 4;
  desc.Height = 4;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 1;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuMipmappedArrayCreate(&array, &desc, 2));
  CUgraphNode node = nullptr;
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuGraphAddMemAllocNode(&node, nullptr, nullptr, 0, &alloc));
}

// --- cuGetProcAddress ------------------------------------------------------------------

void* ownSymbol(const char* name) {
  // The test links libcuda.so.1: its handle is already loaded.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void* symbol = handle != nullptr ? dlsym(handle, name) : nullptr;
  if (handle != nullptr) dlclose(handle);
  return symbol;
}

TEST(ProcAddress, PicksTheVariantOfTheRequestedVersion) {
  ASSERT_CU(cuInit(0));
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  EXPECT_CU(cuGetProcAddress("cuMemAlloc", &pfn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(pfn, ownSymbol("cuMemAlloc_v2"));
  EXPECT_EQ(pfn, reinterpret_cast<void*>(&cuMemAlloc_v2));
  // CUDA 3.0 predates the 64-bit ABI: the old symbol.
  EXPECT_CU(cuGetProcAddress("cuMemAlloc", &pfn, 3000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(pfn, ownSymbol("cuMemAlloc"));
  // cuCtxCreate's newest ABI appeared in 12.5.
  EXPECT_CU(cuGetProcAddress("cuCtxCreate", &pfn, 12050, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(pfn, ownSymbol("cuCtxCreate_v4"));
  EXPECT_CU(cuGetProcAddress("cuCtxCreate", &pfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(pfn, ownSymbol("cuCtxCreate_v3"));
}

TEST(ProcAddress, PerThreadFlagSelectsPtdsVariants) {
  ASSERT_CU(cuInit(0));
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status{};
  EXPECT_CU(cuGetProcAddress("cuMemcpyHtoD", &pfn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(pfn, ownSymbol("cuMemcpyHtoD_v2_ptds"));
  EXPECT_CU(cuGetProcAddress("cuLaunchKernel", &pfn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(pfn, ownSymbol("cuLaunchKernel_ptsz"));
  EXPECT_CU(cuGetProcAddress("cuLaunchKernel", &pfn, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status));
  EXPECT_EQ(pfn, ownSymbol("cuLaunchKernel"));
  // "If a per-thread version is not found, the API will return the legacy version".
  EXPECT_CU(cuGetProcAddress("cuMemAlloc", &pfn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(pfn, ownSymbol("cuMemAlloc_v2"));
}

TEST(ProcAddress, ReportsMissingSymbolsAndOldVersions) {
  ASSERT_CU(cuInit(0));
  void* pfn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_CU(cuGetProcAddress("cuNoSuchFunction", &pfn, 13000, 0, &status));
  EXPECT_EQ(pfn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  pfn = reinterpret_cast<void*>(0x1);
  EXPECT_CU(cuGetProcAddress("cuLaunchKernelEx", &pfn, 11000, 0, &status));
  EXPECT_EQ(pfn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  // "If the specified CUDA version is greater than the driver version, the API
  // will return CUDA_ERROR_INVALID_VALUE."
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress("cuMemAlloc", &pfn, 99000, 0, &status));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress(nullptr, &pfn, 13000, 0, &status));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress("cuMemAlloc", nullptr, 13000, 0, &status));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress("cuMemAlloc", &pfn, 13000, 0x80, &status));
  // symbolStatus is optional.
  EXPECT_CU(cuGetProcAddress("cuInit", &pfn, 13000, 0, nullptr));
  EXPECT_EQ(pfn, reinterpret_cast<void*>(&cuInit));
}

TEST(ProcAddress, TheCuda11AbiReportsNotFound) {
  using Legacy = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto legacy = reinterpret_cast<Legacy>(ownSymbol("cuGetProcAddress"));
  ASSERT_NE(legacy, nullptr);
  void* pfn = nullptr;
  EXPECT_CU(legacy("cuInit", &pfn, 11000, 0));
  EXPECT_EQ(pfn, reinterpret_cast<void*>(&cuInit));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, legacy("cuNoSuchFunction", &pfn, 11000, 0));
}

// --- devices ---------------------------------------------------------------------------------

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_CU(cuInit(0)); }
};

TEST_F(DeviceTest, CountAndOrdinals) {
  int count = 0;
  EXPECT_CU(cuDeviceGetCount(&count));
  EXPECT_EQ(count, 1);  // PHOS_VGPU_DEVICES defaults to 1
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetCount(nullptr));
  CUdevice dev = -1;
  EXPECT_CU(cuDeviceGet(&dev, 0));
  EXPECT_EQ(dev, 0);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&dev, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&dev, -1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGet(nullptr, 0));
}

TEST_F(DeviceTest, NameUuidMemoryAndPciId) {
  char name[256] = {};
  EXPECT_CU(cuDeviceGetName(name, sizeof(name), 0));
  EXPECT_THAT(std::string(name), ::testing::HasSubstr("RTX 5090"));  // the default profile
  char small[5] = {'x', 'x', 'x', 'x', 'x'};
  EXPECT_CU(cuDeviceGetName(small, sizeof(small), 0));
  EXPECT_EQ(std::strlen(small), 4u);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetName(nullptr, 16, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetName(name, sizeof(name), 7));

  CUuuid uuid{};
  EXPECT_CU(cuDeviceGetUuid(&uuid, 0));
  CUuuid zero{};
  EXPECT_NE(std::memcmp(uuid.bytes, zero.bytes, sizeof(uuid.bytes)), 0);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetUuid(nullptr, 0));

  // A LUID is Windows' (WDDM): on Linux a valid query is NOT_SUPPORTED, as
  // NVIDIA's driver answers it; through PhOS too.
  char luid[8] = {};
  unsigned mask = 0;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuDeviceGetLuid(luid, &mask, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetLuid(nullptr, &mask, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetLuid(luid, nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetLuid(luid, &mask, 7));

  size_t total = 0;
  EXPECT_CU(cuDeviceTotalMem(&total, 0));
  EXPECT_EQ(total, size_t{16} << 30);

  char bus[32] = {};
  EXPECT_CU(cuDeviceGetPCIBusId(bus, sizeof(bus), 0));
  CUdevice back = -1;
  EXPECT_CU(cuDeviceGetByPCIBusId(&back, bus));
  EXPECT_EQ(back, 0);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetByPCIBusId(&back, "0000:ff:00.0"));
}

TEST_F(DeviceTest, ComputeCapabilityDefaultsTo120) {
  int major = 0, minor = -1;
  EXPECT_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
  EXPECT_CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0));
  EXPECT_EQ(major, 12);
  EXPECT_EQ(minor, 0);
}

TEST_F(DeviceTest, EveryAttributeHasAValue) {
  int answered = 0;
  for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
    int value = -12345;
    CUresult r = cuDeviceGetAttribute(&value, static_cast<CUdevice_attribute>(a), 0);
    if (r == CUDA_SUCCESS) {
      ++answered;
      EXPECT_NE(value, -12345) << "attribute " << a;
    } else {
      // Only numbers cuda.h leaves unassigned may be refused.
      EXPECT_EQ(r, CUDA_ERROR_INVALID_VALUE) << "attribute " << a;
    }
  }
  EXPECT_GT(answered, 130);
  int value = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAX, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(nullptr, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 3));
}

TEST_F(DeviceTest, AttributesDescribeAnRtx5090ByDefault) {
  auto attr = [](CUdevice_attribute a) {
    int v = 0;
    EXPECT_CU(cuDeviceGetAttribute(&v, a, 0));
    return v;
  };
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE), 32);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), 170);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), 99 * 1024);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR), 1536);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING), 1);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT), 2);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), 1);
}

// The deprecated structure holds what cuDeviceGetAttribute answers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_F(DeviceTest, PropertiesAreTheAttributes) {
  auto attr = [](CUdevice_attribute a) {
    int v = -1;
    EXPECT_CU(cuDeviceGetAttribute(&v, a, 0));
    return v;
  };
  CUdevprop p{};
  ASSERT_CU(cuDeviceGetProperties(&p, 0));
  EXPECT_EQ(p.maxThreadsPerBlock, attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK));
  EXPECT_EQ(p.maxThreadsDim[2], attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z));
  EXPECT_EQ(p.maxGridSize[0], attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X));
  EXPECT_EQ(p.sharedMemPerBlock, attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
  EXPECT_EQ(p.totalConstantMemory, 64 * 1024);
  EXPECT_EQ(p.SIMDWidth, 32);
  EXPECT_EQ(p.memPitch, attr(CU_DEVICE_ATTRIBUTE_MAX_PITCH));
  EXPECT_EQ(p.regsPerBlock, attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK));
  EXPECT_EQ(p.clockRate, attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE));
  EXPECT_EQ(p.textureAlign, attr(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceGetProperties(nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetProperties(&p, 7));
}
#pragma GCC diagnostic pop

TEST_F(DeviceTest, ASingleDeviceHasNoPeer) {
  int can = -1;
  EXPECT_CU(cuDeviceCanAccessPeer(&can, 0, 0));
  EXPECT_EQ(can, 0);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_DEVICE, cuDeviceCanAccessPeer(&can, 0, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuDeviceCanAccessPeer(nullptr, 0, 0));
}

}  // namespace
}  // namespace phos::vgpu::testing
