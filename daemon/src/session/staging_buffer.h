// SPDX-License-Identifier: Apache-2.0
// StagingBuffer: page-aligned host memory registered with the driver, through
// which the engine moves chunks between the device and the image; and the
// registration itself (HostRegistration).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdlib>

#include "session/driver_table.h"
#include "phos/common/status.h"

namespace phos::daemon {

// A registration of host memory with the driver, portable (any context may
// copy through it), undone in the context that made it: cuMemHostUnregister
// needs a current context, and the owner may have made none (or another one)
// current by then. A registration left behind would cover whatever memory
// later reuses these addresses.
class HostRegistration {
 public:
  explicit HostRegistration(const DriverTable& driver) : driver_(driver) {}
  ~HostRegistration() { release(); }
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  // Registers [p, p + bytes) in the current context. Unregistered (the driver
  // refused) the memory still works, at pageable speed.
  void add(void* p, size_t bytes) {
    release();
    PHOS_DRIVER(driver_, CtxGetCurrent)(&context_);
    if (PHOS_DRIVER(driver_, MemHostRegister_v2)(p, bytes, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS) memory_ = p;
  }
  bool registered() const { return memory_ != nullptr; }
  void release() {
    if (memory_ == nullptr) return;
    CUcontext saved = nullptr;
    PHOS_DRIVER(driver_, CtxGetCurrent)(&saved);
    PHOS_DRIVER(driver_, CtxSetCurrent)(context_);
    PHOS_DRIVER(driver_, MemHostUnregister)(memory_);
    PHOS_DRIVER(driver_, CtxSetCurrent)(saved);
    memory_ = nullptr;
  }

 private:
  const DriverTable& driver_;
  void* memory_ = nullptr;
  CUcontext context_ = nullptr;  // current when it was registered
};

class StagingBuffer {
 public:
  StagingBuffer(const DriverTable& driver, size_t bytes) : registration_(driver), bytes_(bytes) {}
  ~StagingBuffer() {
    registration_.release();
    std::free(data_);
  }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  // Registered in the current context (HostRegistration).
  Status allocate() {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes_) != 0) return makeError(Code::kResourceExhausted, "no staging memory");
    data_ = static_cast<std::byte*>(p);
    registration_.add(p, bytes_);
    return Status::ok();
  }
  std::byte* data() const { return data_; }

 private:
  HostRegistration registration_;
  size_t bytes_;
  std::byte* data_ = nullptr;
};

}  // namespace phos::daemon
