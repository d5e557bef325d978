// SPDX-License-Identifier: Apache-2.0
// Reading module images: NVIDIA fatbin containers (with compressed entries), cubins and PTX text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "phos/common/status.h"

namespace phos::vgpu {

// The fatbin container as nvcc -fatbin writes it (learned from CUDA 13's output):
//
//   container header, 16 bytes:  u32 magic 0xBA55ED50, u16 version (1),
//                                u16 header size (16), u64 size of the entries that follow
//   entry header (headerSize bytes, 64 for ELF, 80 for PTX), little endian:
//     0x00 u16 kind (1 PTX, 2 ELF cubin)   0x02 u16 (0x0101)
//     0x04 u32 header size                 0x08 u64 payload size (padded to 8)
//     0x10 u32 compressed size (0 when stored)
//     0x18 u16 minor, u16 major (PTX ISA or cubin version)
//     0x1c u32 arch (sm_XY as 10*X+Y)
//     0x28 u64 flags: 0x1 64-bit, 0x2 debug, 0x10 host Linux,
//                     0x2000 LZ4 compressed (raw block; nvcc --compress-mode=speed),
//                     0x8000 zstd compressed (frame; the CUDA 13 default for PTX)
//     0x38 u64 uncompressed size (0 when stored)
//   followed by the payload; the next entry starts right after it.
// A fatbin may also be passed wrapped in __fatBinC_Wrapper_t (magic 0x466243B1).
inline constexpr std::uint32_t kFatbinMagic = 0xBA55ED50;
inline constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1;

struct FatbinEntry {
  enum class Kind { kPtx = 1, kElf = 2, kOther = 0 };
  Kind kind = Kind::kOther;
  int arch = 0;
  std::uint64_t flags = 0;
  std::span<const std::byte> payload;  // as stored (maybe compressed)
  std::size_t uncompressedSize = 0;
  bool compressedLz4() const { return (flags & 0x2000) != 0; }
  bool compressedZstd() const { return (flags & 0x8000) != 0; }
};

// Parses one container starting at `data`; its size comes from the header.
// kInvalidArgument (CUDA_ERROR_INVALID_IMAGE) for a damaged header.
Result<std::vector<FatbinEntry>> parseFatbin(const std::byte* data);
// The payload of an entry, decompressed.
Result<std::string> entryContents(const FatbinEntry& entry);

// A module image copied out of the caller's memory, its size taken from its
// format (the fatbin wrapper nvcc embeds resolved to its fatbin; a cubin to
// its last section; PTX to its NUL). Read with process_vm_readv on this
// process, so that a damaged wrapper or a wild pointer is
// CUDA_ERROR_INVALID_IMAGE / INVALID_VALUE, never a crash.
Result<std::vector<std::byte>> copyModuleImage(const void* image);

// What a module image holds for a device of `computeCapability`: the PTX
// vgpu runs, or, for an image with machine code only (a cubin, a fatbin
// without PTX the device can JIT), why nothing of it can run. Such an image
// loads, as it does on a GPU of another architecture with lazy loading, and
// its kernels are refused (CUDA_ERROR_NO_BINARY_FOR_GPU) when asked for.
struct ModuleCode {
  std::string ptx;
  std::string noBinary;  // non-empty: the image has no code for the device
};
Result<ModuleCode> moduleCode(std::span<const std::byte> image, int computeCapability);

// What cuModuleLoadData & co. get, reduced to the PTX text to load:
//   - a fatbin (or its wrapper): the PTX entry with the highest arch <= the device's
//     compute capability (major*10+minor); none -> CUDA_ERROR_NO_BINARY_FOR_GPU;
//   - an ELF cubin: CUDA_ERROR_NO_BINARY_FOR_GPU (vgpu runs PTX only);
//   - otherwise NUL-terminated PTX text (must contain a .version directive, else
//     CUDA_ERROR_INVALID_IMAGE).
Result<std::string> extractPtx(const void* image, int computeCapability);

}  // namespace phos::vgpu
