// SPDX-License-Identifier: Apache-2.0
// The exported cu* boundary: default visibility for cuda.h's declarations and the call wrapper.
#pragma once

// Must come first in every entry-point file: cuda.h's declarations get default
// visibility here, so the definitions below are exported while everything else in
// libcuda.so.1 stays hidden (the version script keeps only cu* as a second fence).
#pragma GCC visibility push(default)
#include <cuda.h>
#include <cudaProfiler.h>
#pragma GCC visibility pop

#include <exception>
#include <new>

#include "cu_status.h"
#include "driver.h"
#include "phos/common/log.h"
#include "phos/export_tables/driver_logs.h"

// Entry points cuda.h does not declare unless CUDA_API_PER_THREAD_DEFAULT_STREAM is
// set (the _ptsz/_ptds variants) are declared in the .cpp files with this.
#define PHOS_CU_EXPORT extern "C" __attribute__((visibility("default")))

namespace phos::vgpu::api {

std::shared_ptr<spdlog::logger> logger();

// Runs one entry point: checks cuInit was called, runs `body(driver)`, maps its
// Status to a CUresult, and keeps exceptions from crossing the C ABI.
template <typename Body>
CUresult call(const char* name, Body&& body) noexcept {
  try {
    Driver& driver = Driver::instance();
    if (!driver.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    Status status = body(driver);
    if (status.isOk()) return CUDA_SUCCESS;
    CUresult result = toCuResult(status);
    if (result != CUDA_ERROR_NOT_READY) {
      logger()->debug("{}: {}", name, status.message());
      // The error log says why, without the CUresult's name the message starts with.
      const std::string_view resultName = cuResultName(result) != nullptr ? cuResultName(result) : "?";
      std::string_view why = status.message();
      if (why.starts_with(resultName) && why.substr(resultName.size()).starts_with(": ")) {
        why.remove_prefix(resultName.size() + 2);
      }
      driver_logs::returning(name, result, resultName, why);
    }
    return result;
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    logger()->error("{}: unexpected exception: {}", name, e.what());
    return CUDA_ERROR_UNKNOWN;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

inline Status requireNonNull(const void* p, const char* what) {
  if (p == nullptr) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} is null", what);
  return Status::ok();
}

template <typename T>
T handleOf(std::uint64_t id) {
  return reinterpret_cast<T>(static_cast<std::uintptr_t>(id));
}

}  // namespace phos::vgpu::api
