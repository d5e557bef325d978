// SPDX-License-Identifier: Apache-2.0
// JIT options across the wire (the jit_options encoding of
// apigen/remoting.json: cuModuleLoadDataEx, cuLibraryLoadData*, cuLink*).
// cuda.h passes each option's value in a void *: a scalar cast into it, a
// pointer to the application's log buffers, or a pointer to arrays of names.
// Only scalars travel as they are; the logs travel as their capacities (the
// *_SIZE_BYTES options) and come back as text; options whose value points to
// anything else are refused, so phosd never hands the driver an address of
// the application.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "phos/common/ipc/wire_codec.h"

namespace phos::ipc {

enum class JitValue : uint8_t {
  kScalar,  // an input cast into the void *
  kOutput,  // the driver overwrites it (CU_JIT_WALL_TIME; in/out: THREADS_PER_BLOCK, the log sizes)
  kInfoLog,   // char * of CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES bytes
  kErrorLog,  // char * of CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES bytes
  kPointer,   // arrays of names or addresses: not remoted
  kUnknown,   // not an option of this cuda.h: the driver refuses it too
};

inline JitValue jitValue(CUjit_option option) {
  switch (option) {
    case CU_JIT_WALL_TIME:
    case CU_JIT_THREADS_PER_BLOCK:
    case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
    case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
      return JitValue::kOutput;
    case CU_JIT_INFO_LOG_BUFFER:
      return JitValue::kInfoLog;
    case CU_JIT_ERROR_LOG_BUFFER:
      return JitValue::kErrorLog;
    case CU_JIT_GLOBAL_SYMBOL_NAMES:
    case CU_JIT_GLOBAL_SYMBOL_ADDRESSES:
    case CU_JIT_REFERENCED_KERNEL_NAMES:
    case CU_JIT_REFERENCED_VARIABLE_NAMES:
      return JitValue::kPointer;
    default:
      return option >= 0 && option < CU_JIT_NUM_OPTIONS ? JitValue::kScalar : JitValue::kUnknown;
  }
}

// Options that change what the compiler makes (a restore loads the module
// again with them): the inputs, less the logs and the values the driver
// only reports.
inline bool jitShapesCode(CUjit_option option) {
  switch (jitValue(option)) {
    case JitValue::kScalar:
      return true;
    case JitValue::kOutput:
      return option == CU_JIT_THREADS_PER_BLOCK;
    default:
      return false;
  }
}

// More options than cuda.h defines is a malformed call.
constexpr uint32_t kMaxJitOptions = 64;
// The logs come back at most this long (with the terminator); the rest is cut.
constexpr uint32_t kMaxJitLogBytes = 4096;

// A request's options: count x int32 (CUjit_option), count x uint64 (values;
// 0 for the log buffers).
struct JitOptions {
  Blob options;
  Blob values;
};
// What the driver wrote back: count x uint64 (every value after the call, in
// the request's order), and the logs' text. Empty when the driver never ran.
struct JitOutputs {
  Blob values;
  Text infoLog;
  Text errorLog;
};

inline void put(Encoder& e, const JitOptions& o) {
  put(e, o.options);
  put(e, o.values);
}
inline void get(Decoder& d, JitOptions& o) {
  get(d, o.options);
  get(d, o.values);
}
inline void put(Encoder& e, const JitOutputs& o) {
  put(e, o.values);
  put(e, o.infoLog);
  put(e, o.errorLog);
}
inline void get(Decoder& d, JitOutputs& o) {
  get(d, o.values);
  get(d, o.infoLog);
  get(d, o.errorLog);
}

}  // namespace phos::ipc
