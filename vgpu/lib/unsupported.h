// SPDX-License-Identifier: Apache-2.0
// The fallback for entry points vgpu does not implement (log the name once, NOT_SUPPORTED) and the symbol table.
#pragma once

#include <cstddef>
#include <mutex>

namespace phos::vgpu::api {

// Logs "cuFoo is not supported by vgpu" once per name; returns CUDA_ERROR_NOT_SUPPORTED.
int reportUnsupported(const char* name, std::once_flag& once) noexcept;

// Every exported entry point, sorted by name (generated; see gen_unsupported.py).
struct SymbolAddress {
  const char* name;
  void* address;
};
extern const SymbolAddress kSymbolTable[];
extern const std::size_t kSymbolTableSize;

}  // namespace phos::vgpu::api

// A weak definition: a real implementation elsewhere in libcuda.so.1 replaces it.
// The parameter list is empty on purpose: the C ABI lets a callee ignore arguments,
// and the return value (an int-sized CUresult) is what the caller reads. This file
// never includes cuda.h, so the declarations do not clash with its prototypes.
#define PHOS_VGPU_UNSUPPORTED_ENTRY_POINT(name)                                        \
  extern "C" __attribute__((weak, visibility("default"))) int name() {                 \
    static std::once_flag once;                                                         \
    return ::phos::vgpu::api::reportUnsupported(#name, once);                          \
  }
