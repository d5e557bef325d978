// SPDX-License-Identifier: Apache-2.0
// The driver's error log (cuLogs*, "Error Log Management" in the Driver API
// documentation): messages about failed calls, kept in a bounded buffer,
// handed to registered callbacks and, with CUDA_LOG_FILE set (stdout, stderr
// or a path), written out as they happen. libphos.so and vgpu's libcuda.so.1
// each keep one per process: vgpu logs why its calls fail; the shim logs the
// failures the application sees (entry points PhOS does not serve, errors
// that come back from phosd).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string_view>

namespace phos::driver_logs {

// The most bytes of messages kept, as NVIDIA's driver documents; older
// messages are dropped, and a dump that misses some says so.
inline constexpr std::size_t kBufferBytes = 25600;

// Adds one message: "[HH:MM:SS.mmm][tid][CUDA][E] <message>".
void record(CUlogLevel level, std::string_view message);
// "Returning 201 (CUDA_ERROR_INVALID_CONTEXT) from cuCtxGetDevice[: why]";
// `name` is the CUresult's (the caller's table of names).
void returning(std::string_view entryPoint, CUresult result, std::string_view name, std::string_view why = {});

// The entry points, with the documented semantics.
CUresult registerCallback(CUlogsCallback callback, void* userData, CUlogsCallbackHandle* handleOut);
CUresult unregisterCallback(CUlogsCallbackHandle handle);
CUresult current(CUlogIterator* iteratorOut, unsigned int flags);
CUresult dumpToFile(CUlogIterator* iterator, const char* path, unsigned int flags);
CUresult dumpToMemory(CUlogIterator* iterator, char* buffer, std::size_t* size, unsigned int flags);

// Forgets every message and callback, and reads CUDA_LOG_FILE again (tests).
void resetForTesting();

}  // namespace phos::driver_logs
