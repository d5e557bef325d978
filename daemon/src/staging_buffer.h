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
    if (registered_) {
      // cuMemHostUnregister needs a current context: the one that registered
      // it (the caller may have made none current by now). A registration
      // left behind would cover whatever memory reuses these addresses.
      CUcontext saved = nullptr;
      PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
      PHOS_DRIVER(driver_, CtxSetCurrent)(context_);
      PHOS_DRIVER(driver_, MemHostUnregister)(data_);
      PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
    }
    std::free(data_);
  }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  // Registered portable, in the current context: any context may copy
  // through it. Unregistered (the driver refused) it still works, at pageable
  // speed.
  Status allocate() {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes_) != 0) return makeError(Code::kResourceExhausted, "no staging memory");
    data_ = static_cast<std::byte*>(p);
    PHOS_DRIVER(driver_, CtxGetCurrent)(&context_);
    registered_ = PHOS_DRIVER(driver_, MemHostRegister_v2)(p, bytes_, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
    return Status::ok();
  }
  std::byte* data() const { return data_; }

 private:
  const DriverTable& driver_;
  size_t bytes_;
  std::byte* data_ = nullptr;
  CUcontext context_ = nullptr;  // current when it was registered
  bool registered_ = false;
};

}  // namespace phos::daemon
