// SPDX-License-Identifier: Apache-2.0
// A buffer of device memory and the blob of an image that holds (or will
// hold) its bytes: what the copy-on-write and recopy protocols save, what a
// concurrent restore loads, and what a checkpoint copies.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace phos::daemon {

struct DeviceBuffer {
  size_t blob = 0;  // its index in the image's manifest
  CUdeviceptr address = 0;
  uint64_t bytes = 0;
  CUcontext context = nullptr;  // a context of its device
  int device = 0;
};

}  // namespace phos::daemon
