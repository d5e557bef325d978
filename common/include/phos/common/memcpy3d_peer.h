// SPDX-License-Identifier: Apache-2.0
// A 3D peer copy's descriptor (CUDA_MEMCPY3D_PEER) is a 3D copy's with a
// context per side where CUDA_MEMCPY3D has reserved fields. vgpu runs a 3D
// peer copy as a 3D copy, and phosd checks it as one and hands its driver the
// peer descriptor again: one conversion each way, for both.
#pragma once

#include <cuda.h>

namespace phos::memcpy3d_peer {

// Every field the two descriptors share.
template <typename From, typename To>
void copySharedFields(const From& from, To& to) {
  to.srcXInBytes = from.srcXInBytes;
  to.srcY = from.srcY;
  to.srcZ = from.srcZ;
  to.srcLOD = from.srcLOD;
  to.srcMemoryType = from.srcMemoryType;
  to.srcHost = from.srcHost;
  to.srcDevice = from.srcDevice;
  to.srcArray = from.srcArray;
  to.srcPitch = from.srcPitch;
  to.srcHeight = from.srcHeight;
  to.dstXInBytes = from.dstXInBytes;
  to.dstY = from.dstY;
  to.dstZ = from.dstZ;
  to.dstLOD = from.dstLOD;
  to.dstMemoryType = from.dstMemoryType;
  to.dstHost = from.dstHost;
  to.dstDevice = from.dstDevice;
  to.dstArray = from.dstArray;
  to.dstPitch = from.dstPitch;
  to.dstHeight = from.dstHeight;
  to.WidthInBytes = from.WidthInBytes;
  to.Height = from.Height;
  to.Depth = from.Depth;
}

// The 3D copy of `p`, its contexts left out.
inline CUDA_MEMCPY3D withoutContexts(const CUDA_MEMCPY3D_PEER& p) {
  CUDA_MEMCPY3D copy{};
  copySharedFields(p, copy);
  return copy;
}

// The 3D peer copy of `p` between contexts `src` and `dst`.
inline CUDA_MEMCPY3D_PEER withContexts(const CUDA_MEMCPY3D& p, CUcontext src, CUcontext dst) {
  CUDA_MEMCPY3D_PEER copy{};
  copySharedFields(p, copy);
  copy.srcContext = src;
  copy.dstContext = dst;
  return copy;
}

}  // namespace phos::memcpy3d_peer
