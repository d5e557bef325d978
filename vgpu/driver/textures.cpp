// SPDX-License-Identifier: Apache-2.0
#include "textures.h"

#include <algorithm>
#include <limits>

#include "cu_status.h"

namespace phos::vgpu {

using Channel = TextureView::Channel;

Result<TexelFormat> texelFormat(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
      return TexelFormat{Channel::kUnsigned, 1};
    case CU_AD_FORMAT_UNSIGNED_INT16:
      return TexelFormat{Channel::kUnsigned, 2};
    case CU_AD_FORMAT_UNSIGNED_INT32:
      return TexelFormat{Channel::kUnsigned, 4};
    case CU_AD_FORMAT_SIGNED_INT8:
      return TexelFormat{Channel::kSigned, 1};
    case CU_AD_FORMAT_SIGNED_INT16:
      return TexelFormat{Channel::kSigned, 2};
    case CU_AD_FORMAT_SIGNED_INT32:
      return TexelFormat{Channel::kSigned, 4};
    case CU_AD_FORMAT_HALF:
      return TexelFormat{Channel::kHalf, 2};
    case CU_AD_FORMAT_FLOAT:
      return TexelFormat{Channel::kFloat, 4};
    default:
      return cuErrorf(
          CUDA_ERROR_NOT_SUPPORTED,
          "array format {:#x} is not supported by vgpu (8/16/32-bit integers, half and float are)",
          static_cast<unsigned>(format));
  }
}

Result<ArrayObject> describeArray(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  ASSIGN_OR_RETURN(TexelFormat format, texelFormat(d.Format));
  if (d.NumChannels != 1 && d.NumChannels != 2 && d.NumChannels != 4) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "an array has 1, 2 or 4 channels, not {}",
                    d.NumChannels);
  }
  if (d.Width == 0 || (d.Height == 0 && d.Depth != 0)) {
    return cuErrorf(
        CUDA_ERROR_INVALID_VALUE,
        "array of {} x {} x {} texels: the width must not be 0, nor the height of a 3D array",
        d.Width, d.Height, d.Depth);
  }
  constexpr unsigned kSupported = CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_TEXTURE_GATHER;
  if ((d.Flags & ~kSupported) != 0) {
    return cuErrorf(
        CUDA_ERROR_NOT_SUPPORTED,
        "array flags {:#x} are not supported by vgpu (layered, cubemap, depth, sparse and deferred "
        "arrays are not; SURFACE_LDST and TEXTURE_GATHER are)",
        d.Flags & ~kSupported);
  }
  ArrayObject a;
  a.descriptor = d;
  const std::uint64_t texel = std::uint64_t{format.channelBytes} * d.NumChannels;
  a.rowBytes = texel * d.Width;
  a.rows = std::max<std::uint64_t>(d.Height, 1);
  a.slices = std::max<std::uint64_t>(d.Depth, 1);
  // Sizes a device could hold at all (the 3D limit of a GPU is 16384 per side).
  constexpr std::uint64_t kMaxSide = std::uint64_t{1} << 27;
  if (d.Width > kMaxSide || a.rows > kMaxSide || a.slices > kMaxSide ||
      a.rowBytes * a.rows > std::numeric_limits<std::uint64_t>::max() / a.slices) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "array of {} x {} x {} texels is larger than any device supports", d.Width,
                    d.Height, d.Depth);
  }
  return a;
}

Result<TextureView> viewOf(const CUDA_RESOURCE_DESC& resource, const CUDA_TEXTURE_DESC* texture,
                           const std::shared_ptr<ArrayObject>& array) {
  if (resource.flags != 0) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "CUDA_RESOURCE_DESC::flags must be 0");
  }
  TextureView v;
  auto setFormat = [&](CUarray_format f, unsigned channels) -> Status {
    ASSIGN_OR_RETURN(TexelFormat format, texelFormat(f));
    if (channels != 1 && channels != 2 && channels != 4) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "a texture has 1, 2 or 4 channels, not {}",
                      channels);
    }
    v.channel = format.channel;
    v.channelBytes = format.channelBytes;
    v.channels = channels;
    return Status::ok();
  };
  switch (resource.resType) {
    case CU_RESOURCE_TYPE_ARRAY: {
      if (array == nullptr) {
        return cuError(CUDA_ERROR_INVALID_HANDLE, "the resource's array does not exist");
      }
      const CUDA_ARRAY3D_DESCRIPTOR& d = array->descriptor;
      RETURN_IF_ERROR(setFormat(d.Format, d.NumChannels));
      v.address = array->address;
      v.dimensions = d.Depth != 0 ? 3 : d.Height != 0 ? 2 : 1;
      v.width = d.Width;
      v.height = array->rows;
      v.depth = array->slices;
      v.pitch = array->rowBytes;
      v.slicePitch = array->rowBytes * array->rows;
      break;
    }
    case CU_RESOURCE_TYPE_LINEAR: {
      const auto& l = resource.res.linear;
      if (l.devPtr == 0) {
        return cuError(CUDA_ERROR_INVALID_VALUE, "the linear resource's devPtr is 0");
      }
      RETURN_IF_ERROR(setFormat(l.format, l.numChannels));
      v.address = l.devPtr;
      v.linearResource = true;
      v.width = l.sizeInBytes / v.texelBytes();
      v.pitch = l.sizeInBytes;
      if (v.width == 0) {
        return cuError(CUDA_ERROR_INVALID_VALUE, "the linear resource holds no texel");
      }
      break;
    }
    case CU_RESOURCE_TYPE_PITCH2D: {
      const auto& p = resource.res.pitch2D;
      if (p.devPtr == 0) {
        return cuError(CUDA_ERROR_INVALID_VALUE, "the pitch2D resource's devPtr is 0");
      }
      RETURN_IF_ERROR(setFormat(p.format, p.numChannels));
      if (p.width == 0 || p.height == 0 || p.pitchInBytes < p.width * v.texelBytes()) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                        "pitch2D resource of {} x {} texels with a pitch of {} bytes", p.width,
                        p.height, p.pitchInBytes);
      }
      v.address = p.devPtr;
      v.dimensions = 2;
      v.width = p.width;
      v.height = p.height;
      v.pitch = p.pitchInBytes;
      v.slicePitch = p.pitchInBytes * p.height;
      break;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      return cuError(CUDA_ERROR_NOT_SUPPORTED, "mipmapped arrays are not supported by vgpu");
    default:
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "resource type {} is invalid",
                      static_cast<int>(resource.resType));
  }
  if (texture == nullptr) return v;
  const CUDA_TEXTURE_DESC& t = *texture;
  for (std::size_t d = 0; d < 3; ++d) {
    switch (t.addressMode[d]) {
      case CU_TR_ADDRESS_MODE_WRAP:
        v.addressMode[d] = TextureView::Address::kWrap;
        break;
      case CU_TR_ADDRESS_MODE_CLAMP:
        v.addressMode[d] = TextureView::Address::kClamp;
        break;
      case CU_TR_ADDRESS_MODE_MIRROR:
        v.addressMode[d] = TextureView::Address::kMirror;
        break;
      case CU_TR_ADDRESS_MODE_BORDER:
        v.addressMode[d] = TextureView::Address::kBorder;
        break;
      default:
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "address mode {} of dimension {} is invalid",
                        static_cast<int>(t.addressMode[d]), d);
    }
  }
  if (t.filterMode != CU_TR_FILTER_MODE_POINT && t.filterMode != CU_TR_FILTER_MODE_LINEAR) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "filter mode {} is invalid",
                    static_cast<int>(t.filterMode));
  }
  if ((t.flags & CU_TRSF_SRGB) != 0) {
    return cuError(CUDA_ERROR_NOT_SUPPORTED,
                   "sRGB textures (CU_TRSF_SRGB) are not supported by vgpu");
  }
  v.linearFilter = t.filterMode == CU_TR_FILTER_MODE_LINEAR;
  v.normalizedCoordinates = (t.flags & CU_TRSF_NORMALIZED_COORDINATES) != 0;
  v.readAsInteger = (t.flags & CU_TRSF_READ_AS_INTEGER) != 0;
  std::copy(std::begin(t.borderColor), std::end(t.borderColor), v.borderColor.begin());
  return v;
}

}  // namespace phos::vgpu
