// SPDX-License-Identifier: Apache-2.0
// What vgpu runs of a module image: the PTX it holds for a device (the formats
// themselves are read by phos/common/fatbin.h).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"

namespace phos::vgpu {

// A module image copied out of the caller's memory, its size taken from its
// format (phos/common/module_image.h): a damaged wrapper or a wild pointer is
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

// The virtual architecture PTX was written for, from its first `.target sm_XY`
// (any `a`/`f` suffix dropped): 80 for compute_80 PTX, 120 for compute_120;
// 0 when there is none.
int ptxArchitecture(std::string_view ptx);

// The PTX to link from an image (the linker and nvJitLink): the newest PTX
// entry of a fatbin (or its wrapper) no newer than `computeCapability`, or PTX
// text. CUDA_ERROR_NO_BINARY_FOR_GPU when there is none.
Result<std::string> extractPtx(const void* image, int computeCapability);

}  // namespace phos::vgpu
