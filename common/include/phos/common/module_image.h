// SPDX-License-Identifier: Apache-2.0
// Where a module image handed to cuModuleLoadData and friends lies and how
// long it is: the Driver API passes images without a size, so it comes from
// their format. Shared by libphos.so (which sends phosd the image's extent)
// and vgpu (which copies the image).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "phos/common/status.h"

namespace phos::module_image {

inline constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;         // fatBinaryHeader
inline constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1u;  // __fatBinC_Wrapper_t
inline constexpr std::uint64_t kMaxImageBytes = std::uint64_t{1} << 30;

struct Extent {
  const void* data = nullptr;  // where the image starts (a wrapper points elsewhere)
  std::size_t bytes = 0;
};

// The extent of an image: the fatbin wrapper nvcc embeds resolved to its
// fatbin, a fatbin by its header, a cubin (64-bit ELF) to the end of its last
// table or section, PTX text to its NUL. Headers are read with
// process_vm_readv on this process, so that a wild pointer or a damaged
// wrapper is an error, never a crash:
//   kInvalidArgument  the image is null or cannot be read at all
//   kDataLoss         it is damaged: a wrapper without a fatbin, a header
//                     claiming more than is mapped, text without an end
Result<Extent> extent(const void* image);

// The image's bytes, copied with process_vm_readv.
Result<std::vector<std::byte>> copy(const Extent& extent);

}  // namespace phos::module_image
