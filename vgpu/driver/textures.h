// SPDX-License-Identifier: Apache-2.0
// CUDA arrays, texture objects and surface objects on vgpu.
//
// An array is device memory of its context holding its texels row after row
// (a GPU's layout is opaque to programs: only copies and texture/surface
// instructions reach it). A texture or surface object is a TextureView of an
// array or of linear device memory, which kernels name by handle; launches
// find them through ContextTextures.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "phos/common/status.h"
#include "phos/vgpu/program.h"

namespace phos::vgpu {

struct ArrayObject {
  std::uint64_t id = 0;
  std::uint64_t context = 0;
  std::uint64_t address = 0;  // its device memory
  CUDA_ARRAY3D_DESCRIPTOR descriptor{};
  // Width in bytes of a row, rows per slice and slices (each at least 1).
  std::uint64_t rowBytes = 0, rows = 1, slices = 1;
  std::uint64_t bytes() const { return rowBytes * rows * slices; }
};

struct TextureObject {
  std::uint64_t id = 0;
  std::uint64_t context = 0;
  TextureView view;
  CUDA_RESOURCE_DESC resource{};
  CUDA_TEXTURE_DESC texture{};  // zero for a surface object
};

// Bytes per channel and the channel kind of an array format; an error naming
// the format for those vgpu does not sample (packed, block-compressed, NV12).
struct TexelFormat {
  TextureView::Channel channel = TextureView::Channel::kFloat;
  unsigned channelBytes = 4;
};
Result<TexelFormat> texelFormat(CUarray_format format);

// The array of a descriptor: checks its format, channels, sizes and flags.
Result<ArrayObject> describeArray(const CUDA_ARRAY3D_DESCRIPTOR& descriptor);

// The view of a resource description (`array`: the array it names, if it
// names one); `texture` null for a surface object.
Result<TextureView> viewOf(const CUDA_RESOURCE_DESC& resource, const CUDA_TEXTURE_DESC* texture,
                           const std::shared_ptr<ArrayObject>& array);

}  // namespace phos::vgpu
