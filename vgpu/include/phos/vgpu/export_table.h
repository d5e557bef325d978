// SPDX-License-Identifier: Apache-2.0
// vgpu's private export table: how an engine or a test reaches the driver without non-cu symbols.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <cuda.h>

#include "phos/vgpu/program.h"

// libcuda.so.1 exports only cu* symbols. Extensions are reached the way NVIDIA's
// runtime reaches its private interfaces: cuGetExportTable with a table id.
//
//   const void* table = nullptr;
//   cuGetExportTable(&table, &phos::vgpu::kExportTableId);
//   auto* vgpu = static_cast<const phos::vgpu::ExportTable*>(table);
//   vgpu->setProgramLoader(std::make_shared<MyLoader>());
//
// The table is C++ (std::shared_ptr crosses it): both sides must be built with the
// same compiler and standard library, which holds inside this project.
namespace phos::vgpu {

// "PhOS vgpu table 1", as bytes.
inline constexpr CUuuid kExportTableId = {{'P', 'h', 'O', 'S', '-', 'v', 'g', 'p', 'u', '-', 't',
                                           'a', 'b', 'l', 'e', '1'}};

struct ExportTable {
  std::size_t size;  // sizeof(ExportTable) of the driver; fields are only appended
  // Installs (or, with nullptr, removes) the engine used by module loading.
  // Modules already loaded keep the Program they were loaded with.
  void (*setProgramLoader)(std::shared_ptr<ProgramLoader> loader);
  // The check a kernel of `context` gets through LaunchContext::memory.
  // False for an invalid context.
  bool (*isAccessible)(CUcontext context, std::uint64_t address, std::size_t size);
};

}  // namespace phos::vgpu
