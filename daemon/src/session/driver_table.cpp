// SPDX-License-Identifier: Apache-2.0
// Loading the driver phosd runs on.
#include "session/driver_table.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include "phos/cuda_api/api_table.h"

namespace phos::daemon {

Result<DriverTable*> DriverTable::load(const std::string& path) {
  // RTLD_DEEPBIND is not needed: the driver binds its own symbols.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return makeError(Code::kNotFound, "cannot load the CUDA driver {}: {}", path, dlerror());
  }
  auto* table = new DriverTable();
  table->path_ = path;
  for (const auto& entry : cuda_api::entryPoints()) {
    std::string symbol(entry.symbol);
    table->fns_[index(entry.id)] = dlsym(handle, symbol.c_str());
  }
  using cuda_api::EntryPointId;
  const EntryPointId required[] = {
      EntryPointId::kCuInit, EntryPointId::kCuDriverGetVersion, EntryPointId::kCuDeviceGetCount,
      EntryPointId::kCuCtxCreate_v2, EntryPointId::kCuCtxDestroy_v2, EntryPointId::kCuCtxSetCurrent,
      EntryPointId::kCuCtxPopCurrent_v2, EntryPointId::kCuMemAlloc_v2, EntryPointId::kCuMemFree_v2,
      EntryPointId::kCuMemcpyHtoD_v2, EntryPointId::kCuMemcpyDtoH_v2, EntryPointId::kCuLaunchKernel,
      EntryPointId::kCuStreamCreate, EntryPointId::kCuStreamSynchronize, EntryPointId::kCuMemHostRegister_v2,
  };
  for (EntryPointId id : required) {
    if (!table->has(id)) {
      std::string name(cuda_api::entryPoint(id).symbol);
      delete table;
      return makeError(Code::kNotSupported, "the CUDA driver {} does not export {}", path, name);
    }
  }
  CUresult r = PHOS_DRIVER(*table, Init)(0);
  if (r != CUDA_SUCCESS) {
    delete table;
    return makeError(Code::kUnavailable, "cuInit of the CUDA driver {} failed with CUresult {}", path,
                     static_cast<int>(r));
  }
  PHOS_DRIVER(*table, DriverGetVersion)(&table->version_);
  if (table->has(EntryPointId::kCuGetExportTable)) {
    const void* vgpuTable = nullptr;
    if (PHOS_DRIVER(*table, GetExportTable)(&vgpuTable, &vgpu::kExportTableId) == CUDA_SUCCESS &&
        vgpuTable != nullptr &&
        static_cast<const vgpu::ExportTable*>(vgpuTable)->size >= sizeof(vgpu::ExportTable)) {
      table->vgpu_ = static_cast<const vgpu::ExportTable*>(vgpuTable);
    }
  }
  // The handle stays open for the life of the daemon: the driver is never unloaded.
  return table;
}

}  // namespace phos::daemon
