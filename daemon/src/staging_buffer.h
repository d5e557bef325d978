// SPDX-License-Identifier: Apache-2.0
// StagingBuffer: page-aligned host memory registered with the driver, through
// which the concurrent protocols move chunks between the device and the image.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdlib>

#include "driver_table.h"
#include "phos/common/status.h"

namespace phos::daemon {

class StagingBuffer {
 public:
  StagingBuffer(const DriverTable& driver, size_t bytes) : driver_(driver), bytes_(bytes) {}
  ~StagingBuffer() {
    if (data_ == nullptr) return;
    if (registered_) PHOS_DRIVER(driver_, MemHostUnregister)(data_);
    std::free(data_);
  }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  // Registered portable: any context may copy through it. Unregistered (the
  // driver refused) it still works, at pageable speed.
  Status allocate() {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes_) != 0) return makeError(Code::kResourceExhausted, "no staging memory");
    data_ = static_cast<std::byte*>(p);
    registered_ = PHOS_DRIVER(driver_, MemHostRegister_v2)(p, bytes_, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
    return Status::ok();
  }
  std::byte* data() const { return data_; }

 private:
  const DriverTable& driver_;
  size_t bytes_;
  std::byte* data_ = nullptr;
  bool registered_ = false;
};

}  // namespace phos::daemon
