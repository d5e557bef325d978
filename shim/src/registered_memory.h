// SPDX-License-Identifier: Apache-2.0
// The application's memory registered with cuMemHostRegister. phosd cannot
// reach the application's own pages, and kernels and the driver's copies need
// them at the pointer the application holds (unified addressing). So the
// pages become a file: phosd creates it and maps it at their address in its
// own process, and the shim copies the pages' bytes into the file and moves
// the file's mapping over them (adopt). cuMemHostUnregister turns them back
// into private memory with the same bytes (release). docs/remoting.md has the
// limits: only private anonymous memory is served, and bytes another thread
// writes to these pages while the call runs may be lost.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace phos::shim::registered {

// The pages [address, address+bytes) (page-aligned) as the shim can adopt them:
// CUDA_SUCCESS when they are all mapped private, anonymous and read-write;
// CUDA_ERROR_INVALID_VALUE when some are not mapped; CUDA_ERROR_NOT_SUPPORTED
// (with a line in the shim's log naming the mapping) otherwise.
CUresult check(uintptr_t address, size_t bytes);

// Replaces the pages with the file at `path` holding their bytes; false (and
// the pages as they were) when it cannot.
bool adopt(const std::string& path, uintptr_t address, size_t bytes);

// Replaces the pages with private anonymous memory holding their bytes;
// false (and the file's mapping left in place) when it cannot.
bool release(uintptr_t address, size_t bytes);

}  // namespace phos::shim::registered
