// SPDX-License-Identifier: Apache-2.0
// Formats one device-side printf (vprintf) call the way CUDA's printf buffer does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "phos/common/status.h"

namespace phos::vgpu::engine::detail {

// Reads `n` bytes of device memory at a generic address; false if inaccessible.
using DeviceReader = std::function<bool(uint64_t address, void* out, size_t n)>;

struct FormattedPrintf {
  std::string text;
  int arguments = 0;  // what vprintf returns: the number of arguments consumed
};

// `format` points to the NUL-terminated format string; `args` to the argument
// buffer nvcc builds: each argument at the next multiple of its own size (int and
// 32-bit values 4 bytes, long long / double / pointers 8 bytes; float arguments
// arrive promoted to double). Fails with kOutOfRange on an unreadable address.
Result<FormattedPrintf> formatDevicePrintf(uint64_t format, uint64_t args,
                                           const DeviceReader& read);

}  // namespace phos::vgpu::engine::detail
