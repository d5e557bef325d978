// SPDX-License-Identifier: Apache-2.0
// DriverTable: the libcuda.so.1 phosd drives (NVIDIA's, or vgpu), loaded with
// dlopen and resolved once into one function pointer per entry point.
#pragma once

#include <cuda.h>

#include <array>
#include <string>
#include <string_view>

#include "phos/common/status.h"
#include "phos/cuda_api/entry_points.h"
#include "phos/vgpu/export_table.h"

namespace phos::daemon {

class DriverTable {
 public:
  // Loads `path` (a file path, or a soname looked up the usual way) privately
  // (RTLD_LOCAL: its symbols never bind the daemon's own), checks the entry
  // points phosd cannot work without, and runs cuInit(0).
  static Result<DriverTable*> load(const std::string& path);

  bool has(cuda_api::EntryPointId id) const { return fns_[index(id)] != nullptr; }
  // The driver's function for `id`, cast to the caller's cuda.h type. Only
  // valid when has(id).
  template <typename Fn>
  Fn get(cuda_api::EntryPointId id) const {
    return reinterpret_cast<Fn>(fns_[index(id)]);
  }
  const std::string& path() const { return path_; }
  int version() const { return version_; }
  // vgpu's private table when the driver is vgpu (per-context printf sinks);
  // nullptr for NVIDIA's driver.
  const vgpu::ExportTable* vgpu() const { return vgpu_; }

 private:
  static size_t index(cuda_api::EntryPointId id) { return static_cast<size_t>(id); }
  std::array<void*, cuda_api::kEntryPointCount> fns_{};
  std::string path_;
  int version_ = 0;
  const vgpu::ExportTable* vgpu_ = nullptr;
};

// A driver entry point by its exported name without the "cu" prefix:
// `PHOS_DRIVER(table, MemAlloc_v2)(&p, n)` calls the driver's cuMemAlloc_v2.
#define PHOS_DRIVER(table, name) \
  (table).get<decltype(&::cu##name)>(::phos::cuda_api::EntryPointId::kCu##name)

// A driver call's result as a Status naming what was asked.
inline Status driverStatus(CUresult r, std::string_view what) {
  if (r == CUDA_SUCCESS) return Status::ok();
  return makeError(Code::kFailedPrecondition, "{}: CUresult {}", what, static_cast<int>(r));
}

}  // namespace phos::daemon
