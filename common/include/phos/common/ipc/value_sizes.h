// SPDX-License-Identifier: Apache-2.0
// The size of a value the Driver API passes through a void* whose type an
// attribute names: both halves of the wire read and write exactly that many
// bytes (the in_value encoding of apigen/remoting.json), so the shim never
// reads past the application's variable and phosd refuses a short one.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace phos::ipc {

// cuMemPoolSetAttribute / cuMemPoolGetAttribute: int flags and cuuint64_t
// byte counts; 0 for an attribute cuda.h does not define.
inline size_t valueBytes(CUmemPool_attribute attribute) {
  switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      return sizeof(int);
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      return sizeof(cuuint64_t);
    default:
      return 0;
  }
}

// cuDeviceSetGraphMemAttribute / cuDeviceGetGraphMemAttribute: byte counts.
inline size_t valueBytes(CUgraphMem_attribute attribute) {
  switch (attribute) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      return sizeof(cuuint64_t);
  }
  return 0;
}

}  // namespace phos::ipc
