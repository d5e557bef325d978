// SPDX-License-Identifier: Apache-2.0
// The size of a module image handed to cuModuleLoadData and friends, which
// the Driver API passes without one: PTX text, a fatbin (or the wrapper nvcc
// embeds), or an ELF cubin.
#pragma once

#include <cstddef>

namespace phos::shim {

struct ModuleImage {
  const void* data = nullptr;  // where the image starts (a wrapper points elsewhere)
  size_t bytes = 0;            // 0: not a recognizable image
};

ModuleImage moduleImage(const void* image);

}  // namespace phos::shim
