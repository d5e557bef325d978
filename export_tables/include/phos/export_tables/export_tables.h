// SPDX-License-Identifier: Apache-2.0
// NVIDIA's private export tables, which the CUDA runtime (cudart, static in
// every nvcc program and inside cuBLAS, cuDNN, NCCL) asks the driver for with
// cuGetExportTable, served over the public Driver API. libphos.so and vgpu's
// libcuda.so.1 link the same implementation (docs/cudart.md).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <span>
#include <string>

namespace phos::export_tables {

// The table `id` names, or nullptr for a UUID this library does not serve
// (cuGetExportTable answers CUDA_ERROR_NOT_FOUND: a runtime probes tables it
// can live without, and one it takes for NVIDIA's would change its behaviour).
const void* find(const CUuuid& id);

// The name of a table (CUDART_INTERFACE, ...) for logs, or nullptr.
const char* name(const CUuuid& id);
// A UUID as the logs and docs write it: its bytes in order, 8-4-4-4-12.
std::string uuidText(const CUuuid& id);

// The library serving the tables says a context is gone (destroyed, or a
// primary context reset or released for the last time): the values the
// runtime kept in its context-local storage are destroyed, as the driver does.
void contextDestroyed(CUcontext context);

// The integrity check's hash: HMAC-MD2 (RFC 1319, RFC 2104 with 16-byte
// blocks) of `message` under the runtime's fixed key. Exposed for its tests.
void integrityHash(std::span<const std::uint8_t> message, std::uint64_t out[2]);

}  // namespace phos::export_tables
