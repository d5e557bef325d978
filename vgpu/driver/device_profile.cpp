// SPDX-License-Identifier: Apache-2.0
// Device profiles, their configuration from the environment or JSON, and every CUdevice_attribute value.
#include "device_profile.h"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace phos::vgpu {
namespace {

Result<long long> parseInteger(std::string_view what, std::string_view text) {
  long long value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return makeError(Code::kInvalidArgument, "{}: '{}' is not an integer", what, text);
  }
  return value;
}

// The compute capabilities vgpu has a profile for, as PHOS_VGPU_CC and the
// configuration's "cc" spell them.
constexpr std::pair<int, int> kSupportedCc[] = {{8, 0}, {9, 0}, {12, 0}};
constexpr const char* kSupportedCcText = "8.0, 9.0 or 12.0";
// What a device is without PHOS_VGPU_CC or "cc": the newest profile, because
// libraries built with CUDA 12.8 and later ship PTX only for compute_120 (next
// to machine code for every architecture), which no older device can run,
// while PTX for older targets (nvcc's default compute_75, numba-cuda's) runs
// on it too.
constexpr std::pair<int, int> kDefaultCc{12, 0};

Result<std::pair<int, int>> parseCc(std::string_view text) {
  for (auto [major, minor] : kSupportedCc) {
    if (text == fmt::format("{}.{}", major, minor)) return std::pair{major, minor};
  }
  return makeError(Code::kInvalidArgument, "compute capability '{}' is not supported ({})", text,
                   kSupportedCcText);
}

// A UUID that is stable for a device ordinal and says where it comes from.
CUuuid uuidFor(int ordinal) {
  CUuuid uuid{};
  const char prefix[] = "phos-vgpu-dev";
  for (std::size_t i = 0; i + 1 < sizeof(prefix) && i < 13; ++i) uuid.bytes[i] = prefix[i];
  uuid.bytes[13] = static_cast<char>((ordinal >> 16) & 0xff);
  uuid.bytes[14] = static_cast<char>((ordinal >> 8) & 0xff);
  uuid.bytes[15] = static_cast<char>(ordinal & 0xff);
  return uuid;
}

const char* envOrNull(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

Status applyScale(PlatformConfig& config) {
  if (const char* scale = envOrNull("PHOS_VGPU_BANDWIDTH_SCALE")) {
    char* end = nullptr;
    double value = std::strtod(scale, &end);
    if (end == scale || *end != '\0' || value < 0) {
      return makeError(Code::kInvalidArgument,
                       "PHOS_VGPU_BANDWIDTH_SCALE='{}' is not a non-negative number", scale);
    }
    config.bandwidthScale = value;
  }
  return Status::ok();
}

void connectAll(PlatformConfig& config, double gbps) {
  int n = static_cast<int>(config.devices.size());
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) config.nvlinkGBps[{a, b}] = gbps;
  }
}

constexpr int kMaxDevices = 16;  // 16 windows of 64 GiB fit below the VMM arena

}  // namespace

Result<DeviceProfile> profileFor(int ccMajor, int ccMinor, int ordinal) {
  DeviceProfile p;
  p.ccMajor = ccMajor;
  p.ccMinor = ccMinor;
  p.uuid = uuidFor(ordinal);
  p.pciBusId = 0x10 + ordinal;
  if (ccMajor == 8 && ccMinor == 0) {
    p.name = "PhOS vGPU (A100-SXM4 profile)";
    return p;
  }
  if (ccMajor == 9 && ccMinor == 0) {
    p.name = "PhOS vGPU (H100-SXM5 profile)";
    p.multiprocessors = 132;
    p.maxSharedPerMultiprocessor = 228 * 1024;
    p.maxSharedPerBlockOptin = 227 * 1024;
    p.l2CacheBytes = 50 * 1024 * 1024;
    p.clockKhz = 1980000;
    p.memoryClockKhz = 2619000;
    p.pciDeviceId = 0x233010de;
    p.pciSubsystemId = 0x16c110de;
    return p;
  }
  if (ccMajor == 12 && ccMinor == 0) {
    // GeForce RTX 5090 (GB202): 170 SMs, 2407 MHz boost clock, 32 GB of GDDR7 at
    // 28 Gbit/s per pin on a 512-bit bus (CUDA reports half the data rate as the
    // memory clock), 96 MB of L2; no ECC, FP64 at 1/64 of FP32. Compute
    // capability 12.0 itself: 1536 resident threads (48 warps) and 32 resident
    // blocks per SM, 100 KB of shared memory per SM of which 99 KB per block.
    p.name = "PhOS vGPU (RTX 5090 profile)";
    p.multiprocessors = 170;
    p.maxThreadsPerMultiprocessor = 1536;
    p.maxBlocksPerMultiprocessor = 32;
    p.maxSharedPerMultiprocessor = 100 * 1024;
    p.maxSharedPerBlockOptin = 99 * 1024;
    p.l2CacheBytes = 96 * 1024 * 1024;
    p.clockKhz = 2407000;
    p.memoryClockKhz = 14001000;
    p.memoryBusWidth = 512;
    p.eccEnabled = false;
    p.singleToDoublePerfRatio = 64;
    p.pciDeviceId = 0x2b8510de;
    // GeForce boards carry their maker's subsystem id; vgpu reports NVIDIA's
    // vendor id with board 0 rather than invent one.
    p.pciSubsystemId = 0x000010de;
    return p;
  }
  return makeError(Code::kInvalidArgument, "compute capability {}.{} is not supported ({})", ccMajor, ccMinor,
                   kSupportedCcText);
}

Result<PlatformConfig> parsePlatformConfig(std::string_view text) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return makeError(Code::kInvalidArgument, "vgpu config is not a JSON object");
  }
  PlatformConfig config;
  auto number = [&](const nlohmann::json& obj, const char* key, double fallback) -> Result<double> {
    if (!obj.contains(key)) return fallback;
    if (!obj[key].is_number() || obj[key].get<double>() < 0) {
      return makeError(Code::kInvalidArgument, "vgpu config: '{}' must be a non-negative number", key);
    }
    return obj[key].get<double>();
  };
  ASSIGN_OR_RETURN(config.pcieGBps, number(doc, "pcie_gbps", config.pcieGBps));
  ASSIGN_OR_RETURN(config.localGBps, number(doc, "local_gbps", config.localGBps));
  ASSIGN_OR_RETURN(double defaultLink, number(doc, "nvlink_gbps", 50.0));
  if (!doc.contains("devices") || !doc["devices"].is_array() || doc["devices"].empty()) {
    return makeError(Code::kInvalidArgument, "vgpu config: 'devices' must be a non-empty array");
  }
  for (const auto& dev : doc["devices"]) {
    int ordinal = static_cast<int>(config.devices.size());
    if (!dev.is_object()) {
      return makeError(Code::kInvalidArgument, "vgpu config: device {} is not an object", ordinal);
    }
    std::pair<int, int> cc = kDefaultCc;
    if (dev.contains("cc")) {
      if (!dev["cc"].is_string()) {
        return makeError(Code::kInvalidArgument, "vgpu config: device {}: 'cc' must be a string", ordinal);
      }
      ASSIGN_OR_RETURN(cc, parseCc(dev["cc"].get<std::string>()));
    }
    ASSIGN_OR_RETURN(DeviceProfile profile, profileFor(cc.first, cc.second, ordinal));
    if (dev.contains("memory")) {
      if (!dev["memory"].is_number_unsigned() || dev["memory"].get<std::uint64_t>() == 0) {
        return makeError(Code::kInvalidArgument,
                         "vgpu config: device {}: 'memory' must be a positive byte count", ordinal);
      }
      profile.totalMemory = dev["memory"].get<std::uint64_t>();
    }
    if (dev.contains("name") && dev["name"].is_string()) profile.name = dev["name"].get<std::string>();
    config.devices.push_back(std::move(profile));
  }
  if (config.devices.size() > kMaxDevices) {
    return makeError(Code::kInvalidArgument, "vgpu config: {} devices, at most {}",
                     config.devices.size(), kMaxDevices);
  }
  int n = static_cast<int>(config.devices.size());
  if (doc.contains("nvlink")) {
    if (!doc["nvlink"].is_array()) {
      return makeError(Code::kInvalidArgument, "vgpu config: 'nvlink' must be an array of links");
    }
    for (const auto& link : doc["nvlink"]) {
      if (!link.is_object() || !link.contains("a") || !link.contains("b") ||
          !link["a"].is_number_integer() || !link["b"].is_number_integer()) {
        return makeError(Code::kInvalidArgument, "vgpu config: an nvlink entry needs integer 'a' and 'b'");
      }
      int a = link["a"].get<int>();
      int b = link["b"].get<int>();
      if (a < 0 || b < 0 || a >= n || b >= n || a == b) {
        return makeError(Code::kInvalidArgument, "vgpu config: nvlink {}-{} names no device pair", a, b);
      }
      ASSIGN_OR_RETURN(double gbps, number(link, "gbps", defaultLink));
      ASSIGN_OR_RETURN(double links, number(link, "links", 1.0));
      config.nvlinkGBps[{std::min(a, b), std::max(a, b)}] = gbps * links;
    }
  } else {
    connectAll(config, defaultLink);
  }
  return config;
}

Result<PlatformConfig> loadPlatformConfig() {
  PlatformConfig config;
  if (const char* path = envOrNull("PHOS_VGPU_CONFIG")) {
    std::ifstream in(path);
    if (!in) return makeError(Code::kNotFound, "PHOS_VGPU_CONFIG: cannot open '{}'", path);
    std::stringstream text;
    text << in.rdbuf();
    ASSIGN_OR_RETURN(config, parsePlatformConfig(text.str()));
    RETURN_IF_ERROR(applyScale(config));
    return config;
  }
  long long count = 1;
  if (const char* text = envOrNull("PHOS_VGPU_DEVICES")) {
    ASSIGN_OR_RETURN(count, parseInteger("PHOS_VGPU_DEVICES", text));
    if (count < 0 || count > kMaxDevices) {
      return makeError(Code::kInvalidArgument, "PHOS_VGPU_DEVICES={} is outside 0..{}", count, kMaxDevices);
    }
  }
  std::pair<int, int> cc = kDefaultCc;
  if (const char* text = envOrNull("PHOS_VGPU_CC")) {
    ASSIGN_OR_RETURN(cc, parseCc(text));
  }
  std::size_t memory = std::size_t{16} << 30;
  if (const char* text = envOrNull("PHOS_VGPU_MEMORY")) {
    ASSIGN_OR_RETURN(long long bytes, parseInteger("PHOS_VGPU_MEMORY", text));
    // Leave a quarter of the 64 GiB window for allocation alignment slack.
    if (bytes <= 0 || static_cast<std::uint64_t>(bytes) > (config.vaWindow / 4) * 3) {
      return makeError(Code::kInvalidArgument, "PHOS_VGPU_MEMORY={} is outside 1..{}", bytes,
                       (config.vaWindow / 4) * 3);
    }
    memory = static_cast<std::size_t>(bytes);
  }
  for (int i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(DeviceProfile profile, profileFor(cc.first, cc.second, i));
    profile.totalMemory = memory;
    config.devices.push_back(std::move(profile));
  }
  connectAll(config, 50.0);
  RETURN_IF_ERROR(applyScale(config));
  return config;
}

Result<int> deviceAttribute(const PlatformConfig& platform, int ordinal,
                            CUdevice_attribute attribute) {
  const DeviceProfile& p = platform.devices.at(static_cast<std::size_t>(ordinal));
  // Thread block clusters, tensor maps and memory synchronization domains came
  // with compute capability 9.0 and are kept by every later one.
  const bool hopperOrLater = p.ccMajor >= 9;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 48 * 1024;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 64 * 1024;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return p.clockKhz;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return p.multiprocessors;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: return 0;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS: return 2048;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return p.eccEnabled ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return p.pciBusId;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return p.memoryClockKhz;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return p.memoryBusWidth;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return p.l2CacheBytes;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return p.maxThreadsPerMultiprocessor;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;  // the two modelled copy engines
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS: return 2048;
    case CU_DEVICE_ATTRIBUTE_CAN_TEX2D_GATHER: return 1;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE: return 8192;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE: return 8192;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE: return 32768;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS: return 2046;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS: return 2048;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS: return 2048;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS: return 2046;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH: return 268435456;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT: return 65000;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH: return 2097120;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT: return 32768;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return p.ccMajor;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return p.ccMinor;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return p.maxSharedPerMultiprocessor;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: return 0;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: return ordinal;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: return p.singleToDoublePerfRatio;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: return 0;
    // Host and kernels share one coherent memory: they may use managed
    // memory at the same time, as on Linux with Pascal or later.
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1: return 0;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return p.maxSharedPerBlockOptin;
    case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: return 0;
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: return 0;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return p.maxBlocksPerMultiprocessor;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: return p.l2CacheBytes / 8 * 3;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: return 134213632;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;  // the default pool only
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: return 0;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return hopperOrLater ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR:
      return 1;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: return hopperOrLater ? 4 : 1;
    case CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: return hopperOrLater ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS: return 1;
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: return CU_DEVICE_NUMA_CONFIG_NONE;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: return -1;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: return -1;
    case CU_DEVICE_ATTRIBUTE_D3D12_CIG_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK: return 0;
    case CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_MAXIMUM_LENGTH: return 0;
    case CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID: return p.pciDeviceId;
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID: return p.pciSubsystemId;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX: break;
  }
  return makeError(Code::kInvalidArgument, "device attribute {} does not exist",
                   static_cast<int>(attribute));
}

}  // namespace phos::vgpu
