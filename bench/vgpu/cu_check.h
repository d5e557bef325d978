// SPDX-License-Identifier: Apache-2.0
// CU_CHECK for benchmarks: a failing Driver API call ends the run with its name.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda.h>

#define CU_CHECK(expr)                                                       \
  do {                                                                       \
    CUresult r_ = (expr);                                                    \
    if (r_ != CUDA_SUCCESS) {                                                \
      const char* name_ = nullptr;                                           \
      cuGetErrorName(r_, &name_);                                            \
      std::fprintf(stderr, "%s failed: %s\n", #expr, name_ ? name_ : "?");   \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)
