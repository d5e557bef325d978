// SPDX-License-Identifier: Apache-2.0
// The formats inside module images: NVIDIA's fatbin container (with its
// compressed entries) and the cubin's ELF symbol table. Read by vgpu (to find
// the PTX to run) and phosd (to find a module's globals to save).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "phos/common/status.h"

namespace phos::fatbin {

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
inline constexpr std::uint32_t kMagic = 0xBA55ED50;
inline constexpr std::uint32_t kWrapperMagic = 0x466243B1;

struct Entry {
  enum class Kind { kPtx = 1, kElf = 2, kOther = 0 };
  Kind kind = Kind::kOther;
  int arch = 0;
  std::uint64_t flags = 0;
  std::span<const std::byte> payload;  // as stored (maybe compressed)
  std::size_t uncompressedSize = 0;
  bool compressedLz4() const { return (flags & 0x2000) != 0; }
  bool compressedZstd() const { return (flags & 0x8000) != 0; }
};

bool isFatbin(std::span<const std::byte> image);
bool isCubin(std::span<const std::byte> image);

// The entries of the container `image` starts with; every entry lies inside
// `image`. kDataLoss for a damaged header or entry.
Result<std::vector<Entry>> parse(std::span<const std::byte> image);
// An entry's payload, decompressed (kDataLoss if damaged).
Result<std::string> contents(const Entry& entry);

// The module-scope variables of a cubin (__device__ and __constant__: data
// objects in its .nv.global* and .nv.constant* sections), from its symbol table.
Result<std::vector<std::string>> cubinGlobals(std::span<const std::byte> elf);

}  // namespace phos::fatbin
