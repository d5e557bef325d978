// SPDX-License-Identifier: Apache-2.0
// Entry points: initialization, versions, error strings, devices, export tables.
#include "entry.h"

#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "phos/export_tables/export_tables.h"
#include "phos/vgpu/export_table.h"
#include "unsupported.h"

#ifdef PHOS_VGPU_HAVE_ENGINE
#include "phos/vgpu/engine.h"
#endif

namespace phos::vgpu::api {

std::shared_ptr<spdlog::logger> logger() {
  static auto log = phos::log::get("vgpu");
  return log;
}

int reportUnsupported(const char* name, std::once_flag& once) noexcept {
  try {
    std::call_once(once, [&] { logger()->warn("{} is not supported by vgpu", name); });
  } catch (...) {
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

namespace {

// libcuda.so.1 keeps its own loggers (it links its own copy of the common
// library): set up when it is loaded, from the environment. PHOS_LOG itself
// asks for vgpu's lines: they go to stderr unless PHOS_LOG_FILE says where.
__attribute__((constructor)) void setupLogging() {
  log::Sinks sinks = log::sinksFromEnvironment();
  if (sinks.file.empty() && std::getenv("PHOS_LOG") != nullptr) sinks.toStderr = true;
  log::setup(sinks);
}

constexpr int kDriverVersion = 13000;

void setProgramLoader(std::shared_ptr<ProgramLoader> loader) {
  Driver::instance().setProgramLoader(std::move(loader));
}

bool isAccessible(CUcontext handle, std::uint64_t address, std::size_t size) {
  Driver& driver = Driver::instance();
  if (!driver.initialized()) return false;
  auto context = driver.context(handle);
  return context.isOk() && driver.isAccessible(**context, address, size);
}

CUresult setRecordAccesses(CUcontext context, bool enabled) {
  return call(__func__, [&](Driver& d) { return d.setRecordAccesses(context, enabled); });
}

CUresult lastLaunchAccesses(CUstream stream, LaunchAccesses* out) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(out, "out"));
    ASSIGN_OR_RETURN(*out, d.lastLaunchAccesses(stream));
    return Status::ok();
  });
}

CUresult setPrintfSink(CUcontext context, std::shared_ptr<PrintfSink> sink) {
  return call(__func__, [&](Driver& d) { return d.setPrintfSink(context, std::move(sink)); });
}

CUresult placeNextModuleGlobals(CUcontext context, const std::map<std::string, std::uint64_t>& placement) {
  return call(__func__, [&](Driver& d) { return d.placeNextModuleGlobals(context, placement); });
}

const ExportTable kExportTable = {sizeof(ExportTable), &setProgramLoader,  &isAccessible,          &setRecordAccesses,
                                  &lastLaunchAccesses,  &setPrintfSink,     &placeNextModuleGlobals};

}  // namespace
}  // namespace phos::vgpu::api

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::requireNonNull;

CUresult CUDAAPI cuInit(unsigned int Flags) {
  try {
    // "Flags parameter should be 0".
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    Driver& driver = Driver::instance();
    Status status = driver.init();
#ifdef PHOS_VGPU_HAVE_ENGINE
    // The built-in PTX engine, installed once; a loader set through the export
    // table afterwards (tests) replaces it.
    static std::once_flag engineOnce;
    if (status.isOk()) {
      std::call_once(engineOnce, [&] { driver.setProgramLoader(phos::vgpu::engine::makeProgramLoader()); });
    }
#endif
    return toCuResult(status);
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  // Works before cuInit, as the real driver's does.
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = api::kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const char* name = cuResultName(error);
  *pStr = name;
  return name != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const char* text = cuResultDescription(error);
  *pStr = text;
  return text != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) {
  if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (std::memcmp(pExportTableId->bytes, kExportTableId.bytes, sizeof(CUuuid)) == 0) {
    *ppExportTable = &api::kExportTable;
    return CUDA_SUCCESS;
  }
  // NVIDIA's private tables, which the CUDA runtime needs (docs/cudart.md).
  if (const void* table = export_tables::find(*pExportTableId); table != nullptr) {
    *ppExportTable = table;
    return CUDA_SUCCESS;
  }
  // A table nobody serves: the runtime probes some it can live without.
  api::logger()->debug("cuGetExportTable: no table {}", export_tables::uuidText(*pExportTableId));
  *ppExportTable = nullptr;
  return CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(count, "count"));
    *count = d.deviceCount();
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(device, "device"));
    RETURN_IF_ERROR(d.checkDevice(ordinal));
    *device = ordinal;
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(name, "name"));
    if (len <= 0) return cuError(CUDA_ERROR_INVALID_VALUE, "len must be positive");
    RETURN_IF_ERROR(d.checkDevice(dev));
    const std::string& n = d.platform().devices[static_cast<std::size_t>(dev)].name;
    std::size_t copied = std::min(n.size(), static_cast<std::size_t>(len - 1));
    std::memcpy(name, n.data(), copied);
    name[copied] = '\0';
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(uuid, "uuid"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    *uuid = d.platform().devices[static_cast<std::size_t>(dev)].uuid;
    return Status::ok();
  });
}

// "Return identifying information (luid and deviceNodeMask) to allow matching
// device with graphics APIs": LUIDs are Windows' (WDDM). NVIDIA's Linux driver
// answers CUDA_ERROR_NOT_SUPPORTED for a valid device and valid outputs.
CUresult CUDAAPI cuDeviceGetLuid(char* luid, unsigned int* deviceNodeMask, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(luid, "luid"));
    RETURN_IF_ERROR(requireNonNull(deviceNodeMask, "deviceNodeMask"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    return cuError(CUDA_ERROR_NOT_SUPPORTED,
                   "a LUID is a Windows notion (WDDM): Linux devices have none");
  });
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(bytes, "bytes"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    *bytes = d.platform().devices[static_cast<std::size_t>(dev)].totalMemory;
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pi, "pi"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    auto value = deviceAttribute(d.platform(), dev, attrib);
    if (!value.isOk()) return cuError(CUDA_ERROR_INVALID_VALUE, value.status().message());
    *pi = *value;
    return Status::ok();
  });
}

// Deprecated: the attributes the structure holds, as cuDeviceGetAttribute answers them.
CUresult CUDAAPI cuDeviceGetProperties(CUdevprop* prop, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(prop, "prop"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    CUdevprop out{};
    const std::pair<int*, CUdevice_attribute> fields[] = {
        {&out.maxThreadsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
        {&out.maxThreadsDim[0], CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X},
        {&out.maxThreadsDim[1], CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y},
        {&out.maxThreadsDim[2], CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z},
        {&out.maxGridSize[0], CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X},
        {&out.maxGridSize[1], CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y},
        {&out.maxGridSize[2], CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z},
        {&out.sharedMemPerBlock, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK},
        {&out.totalConstantMemory, CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY},
        {&out.SIMDWidth, CU_DEVICE_ATTRIBUTE_WARP_SIZE},
        {&out.memPitch, CU_DEVICE_ATTRIBUTE_MAX_PITCH},
        {&out.regsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK},
        {&out.clockRate, CU_DEVICE_ATTRIBUTE_CLOCK_RATE},
        {&out.textureAlign, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT},
    };
    for (const auto& [field, attribute] : fields) {
      auto value = deviceAttribute(d.platform(), dev, attribute);
      if (!value.isOk()) return cuError(CUDA_ERROR_INVALID_VALUE, value.status().message());
      *field = *value;
    }
    *prop = out;
    return Status::ok();
  });
}

// Memory of graphs' allocation nodes. vgpu builds no graphs, so there is none:
// every count is 0, the high watermarks reset to 0, and trimming has nothing to do.
CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value, "value"));
    RETURN_IF_ERROR(d.checkDevice(device));
    switch (attr) {
      case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
      case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
      case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        *static_cast<cuuint64_t*>(value) = 0;
        return Status::ok();
    }
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "graph memory attribute {} is not one of cuda.h's", static_cast<int>(attr));
  });
}

CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value, "value"));
    RETURN_IF_ERROR(d.checkDevice(device));
    if (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "graph memory attribute {} cannot be set", static_cast<int>(attr));
    }
    // "High watermark can only be reset to zero."
    if (*static_cast<const cuuint64_t*>(value) != 0) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "a high watermark can only be reset to zero");
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
  return call(__func__, [&](Driver& d) -> Status { return d.checkDevice(device); });
}

CUresult CUDAAPI cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(major, "major"));
    RETURN_IF_ERROR(requireNonNull(minor, "minor"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    *major = d.platform().devices[static_cast<std::size_t>(dev)].ccMajor;
    *minor = d.platform().devices[static_cast<std::size_t>(dev)].ccMinor;
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(pciBusId, "pciBusId"));
    if (len <= 0) return cuError(CUDA_ERROR_INVALID_VALUE, "len must be positive");
    RETURN_IF_ERROR(d.checkDevice(dev));
    std::string id = fmt::format("0000:{:02x}:00.0", d.platform().devices[static_cast<std::size_t>(dev)].pciBusId);
    std::size_t copied = std::min(id.size(), static_cast<std::size_t>(len - 1));
    std::memcpy(pciBusId, id.data(), copied);
    pciBusId[copied] = '\0';
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(dev, "dev"));
    RETURN_IF_ERROR(requireNonNull(pciBusId, "pciBusId"));
    for (int i = 0; i < d.deviceCount(); ++i) {
      std::string id = fmt::format("0000:{:02x}:00.0", d.platform().devices[static_cast<std::size_t>(i)].pciBusId);
      if (strcasecmp(id.c_str(), pciBusId) == 0 || strcasecmp(id.c_str() + 5, pciBusId) == 0) {
        *dev = i;
        return Status::ok();
      }
    }
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "no device has PCI bus id '{}'", pciBusId);
  });
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(canAccessPeer, "canAccessPeer"));
    RETURN_IF_ERROR(d.checkDevice(dev));
    RETURN_IF_ERROR(d.checkDevice(peerDev));
    // All vgpu devices share one host; peer access works between any two distinct
    // devices (over NVLink when the topology has a link, else over PCIe).
    *canAccessPeer = dev != peerDev ? 1 : 0;
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib, CUdevice srcDevice,
                                         CUdevice dstDevice) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value, "value"));
    RETURN_IF_ERROR(d.checkDevice(srcDevice));
    RETURN_IF_ERROR(d.checkDevice(dstDevice));
    if (srcDevice == dstDevice) return cuError(CUDA_ERROR_INVALID_DEVICE, "source and destination are the same device");
    const auto& links = d.platform().nvlinkGBps;
    bool nvlink = links.contains({std::min(srcDevice, dstDevice), std::max(srcDevice, dstDevice)});
    switch (attrib) {
      case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = nvlink ? 0 : 1; break;
      case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: *value = 1; break;
      case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: *value = nvlink ? 1 : 0; break;
      case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *value = 0; break;
      case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED: *value = 0; break;
      default: return cuErrorf(CUDA_ERROR_INVALID_VALUE, "P2P attribute {} is invalid", static_cast<int>(attrib));
    }
    return Status::ok();
  });
}

namespace {

// The forms of `op` that CUDA's atomic functions have (the CUDA C++
// Programming Guide, "Atomic Functions") on a device of compute capability
// `ccMajor`, as CUatomicOperationCapability bits: a link that supports every
// CUDA-valid atomic natively supports these. Floating-point min and max are
// not among CUDA's atomic functions: none.
unsigned cudaAtomicForms(CUatomicOperation op, int ccMajor) {
  constexpr unsigned kInts = CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED |
                             CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
  const unsigned wide = ccMajor >= 9 ? unsigned{CU_ATOMIC_CAPABILITY_SCALAR_128} : 0u;  // 128-bit exch and cas
  switch (op) {
    case CU_ATOMIC_OPERATION_INTEGER_ADD:
    case CU_ATOMIC_OPERATION_INTEGER_MIN:
    case CU_ATOMIC_OPERATION_INTEGER_MAX:
    case CU_ATOMIC_OPERATION_AND:
    case CU_ATOMIC_OPERATION_OR:
    case CU_ATOMIC_OPERATION_XOR: return kInts | CU_ATOMIC_CAPABILITY_REDUCTION;
    case CU_ATOMIC_OPERATION_INTEGER_INCREMENT:
    case CU_ATOMIC_OPERATION_INTEGER_DECREMENT:  // unsigned int only
      return CU_ATOMIC_CAPABILITY_UNSIGNED | CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_REDUCTION;
    case CU_ATOMIC_OPERATION_EXCHANGE:
    case CU_ATOMIC_OPERATION_CAS: return kInts | wide;
    case CU_ATOMIC_OPERATION_FLOAT_ADD:  // float, double; float4 on compute capability 9.x
      return CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64 | CU_ATOMIC_CAPABILITY_REDUCTION |
             (ccMajor >= 9 ? unsigned{CU_ATOMIC_CAPABILITY_VECTOR_32x4} : 0u);
    default: return 0;
  }
}

// The checks both capability queries make of their arrays.
Status checkAtomicQuery(unsigned* capabilities, const CUatomicOperation* operations, unsigned count) {
  RETURN_IF_ERROR(requireNonNull(capabilities, "capabilities"));
  RETURN_IF_ERROR(requireNonNull(operations, "operations"));
  if (count == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "count is 0");
  for (unsigned i = 0; i < count; ++i) {
    if (static_cast<unsigned>(operations[i]) >= CU_ATOMIC_OPERATION_MAX) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "operations[{}] = {} is not an atomic operation", i,
                      static_cast<int>(operations[i]));
    }
  }
  return Status::ok();
}

}  // namespace

CUresult CUDAAPI cuDeviceGetHostAtomicCapabilities(unsigned int* capabilities, const CUatomicOperation* operations,
                                                   unsigned int count, CUdevice dev) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(d.checkDevice(dev));
    RETURN_IF_ERROR(checkAtomicQuery(capabilities, operations, count));
    // The device and the host share no atomics natively
    // (CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED is 0, and so is the
    // partial one): no operation has a native form over that link.
    std::fill(capabilities, capabilities + count, 0u);
    return Status::ok();
  });
}

CUresult CUDAAPI cuDeviceGetP2PAtomicCapabilities(unsigned int* capabilities, const CUatomicOperation* operations,
                                                  unsigned int count, CUdevice srcDevice, CUdevice dstDevice) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(d.checkDevice(srcDevice));
    RETURN_IF_ERROR(d.checkDevice(dstDevice));
    if (srcDevice == dstDevice) return cuError(CUDA_ERROR_INVALID_DEVICE, "source and destination are the same device");
    RETURN_IF_ERROR(checkAtomicQuery(capabilities, operations, count));
    // As cuDeviceGetP2PAttribute says: over an NVLink every CUDA-valid atomic
    // is native, over PCIe none is.
    const auto& links = d.platform().nvlinkGBps;
    const bool nvlink = links.contains({std::min(srcDevice, dstDevice), std::max(srcDevice, dstDevice)});
    const int ccMajor = std::min(d.platform().devices[static_cast<std::size_t>(srcDevice)].ccMajor,
                                 d.platform().devices[static_cast<std::size_t>(dstDevice)].ccMajor);
    for (unsigned i = 0; i < count; ++i) capabilities[i] = nvlink ? cudaAtomicForms(operations[i], ccMajor) : 0u;
    return Status::ok();
  });
}
