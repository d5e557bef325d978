// SPDX-License-Identifier: Apache-2.0
// What vgpu's devices look like: per-device profiles, the NVLink topology and the copy model's bandwidths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <cuda.h>

#include "phos/common/status.h"

namespace phos::vgpu {

// One device. The field defaults describe an A100-SXM4 (compute capability
// 8.0); 9.0 gives an H100-SXM5 and 12.0 a GeForce RTX 5090 (what a device is
// when no compute capability is configured). What differs between those parts is
// a field (values from NVIDIA's product specifications and the CUDA C++
// Programming Guide's table of compute capabilities); every other attribute value
// is derived in deviceAttribute().
struct DeviceProfile {
  std::string name;
  int ccMajor = 8;
  int ccMinor = 0;
  std::size_t totalMemory = std::size_t{16} << 30;
  int multiprocessors = 108;
  int maxThreadsPerMultiprocessor = 2048;
  int maxBlocksPerMultiprocessor = 32;
  int maxSharedPerMultiprocessor = 164 * 1024;
  int maxSharedPerBlockOptin = 163 * 1024;
  int l2CacheBytes = 40 * 1024 * 1024;
  int clockKhz = 1410000;
  int memoryClockKhz = 1215000;
  int memoryBusWidth = 5120;
  bool eccEnabled = true;
  int singleToDoublePerfRatio = 2;
  // CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID/SUBSYSTEM_ID: the board's id in the high
  // half, NVIDIA's vendor id 0x10de in the low half.
  int pciDeviceId = 0x20b010de;
  int pciSubsystemId = 0x134f10de;
  int pciBusId = 0;
  CUuuid uuid{};
};

struct PlatformConfig {
  std::vector<DeviceProfile> devices;
  // NVLink bandwidth (GB/s, one direction) between two devices, keyed (min, max).
  std::map<std::pair<int, int>, double> nvlinkGBps;
  double pcieGBps = 25.0;      // host <-> device, per direction
  double localGBps = 1500.0;   // device <-> same device
  double bandwidthScale = 1.0; // modelled time multiplier; 0 disables the model
  std::uint64_t vaBase = 0x200000000000ull;     // device 0's cuMemAlloc window
  std::uint64_t vaWindow = 0x1000000000ull;     // 64 GiB per device
};

// Builds the profile for compute capability `major.minor` (8.0, 9.0 or 12.0).
Result<DeviceProfile> profileFor(int ccMajor, int ccMinor, int ordinal);

// Reads PHOS_VGPU_CONFIG (a JSON file, see docs/vgpu.md) if set, else
// PHOS_VGPU_DEVICES (default 1), PHOS_VGPU_MEMORY (bytes per device, default
// 16 GiB) and PHOS_VGPU_CC (8.0, 9.0 or 12.0; default 12.0); PHOS_VGPU_BANDWIDTH_SCALE applies to both.
Result<PlatformConfig> loadPlatformConfig();
// Parses the JSON configuration text (exposed for tests).
Result<PlatformConfig> parsePlatformConfig(std::string_view json);

// The value of `attribute` for a device; kInvalidArgument for an attribute cuda.h
// does not define.
Result<int> deviceAttribute(const PlatformConfig& platform, int ordinal,
                            CUdevice_attribute attribute);

// The pitch cuMemAllocPitch rounds to (CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT
// is 32, but allocations use the 512-byte row alignment real GPUs return).
inline constexpr std::size_t kPitchAlignment = 512;

}  // namespace phos::vgpu
