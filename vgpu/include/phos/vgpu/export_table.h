// SPDX-License-Identifier: Apache-2.0
// vgpu's private export table: how an engine or a test reaches the driver without non-cu symbols.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

// One allocation a recorded launch touched, as vgpu's allocation map knows it (a
// cuMemAlloc* block, one module global, pinned or registered host memory, a VMM
// mapping): the range cuMemGetAddressRange reports. Offsets are relative to `base`.
struct AllocationAccesses {
  std::uint64_t base = 0;
  std::size_t size = 0;
  std::vector<ByteRange> reads;   // bytes loaded (atomics included), sorted, coalesced
  std::vector<ByteRange> writes;  // bytes stored (atomics included), sorted, coalesced
  friend bool operator==(const AllocationAccesses&, const AllocationAccesses&) = default;
};

// What one recorded launch read and wrote in global and constant memory.
struct LaunchAccesses {
  CUfunction function = nullptr;                 // as given to the launch
  std::vector<AllocationAccesses> allocations;  // the allocations touched, by base
};

struct ExportTable {
  std::size_t size;  // sizeof(ExportTable) of the driver; fields are only appended
  // Installs (or, with nullptr, removes) the engine used by module loading.
  // Modules already loaded keep the Program they were loaded with.
  void (*setProgramLoader)(std::shared_ptr<ProgramLoader> loader);
  // The check a kernel of `context` gets through LaunchContext::memory.
  // False for an invalid context.
  bool (*isAccessible)(CUcontext context, std::uint64_t address, std::size_t size);

  // The access recorder, for speculation tests (docs/vgpu.md). Turns recording on or
  // off for the launches enqueued in `context` (null: the current context) from now
  // on; a launch enqueued before the switch keeps the state it was enqueued with.
  // Recording costs a range per lane access. CUDA_ERROR_INVALID_CONTEXT for a bad
  // context.
  CUresult (*setRecordAccesses)(CUcontext context, bool enabled);
  // The accesses of the last launch enqueued on `stream` (NULL, CU_STREAM_LEGACY and
  // CU_STREAM_PER_THREAD as in cu* calls) while recording was on. Synchronize the
  // stream first: CUDA_ERROR_NOT_READY while that launch has not run,
  // CUDA_ERROR_NOT_FOUND when no recorded launch was enqueued on the stream,
  // CUDA_ERROR_NOT_SUPPORTED when the engine that ran it cannot record,
  // CUDA_ERROR_INVALID_VALUE for a null `out`.
  CUresult (*lastLaunchAccesses)(CUstream stream, LaunchAccesses* out);

  // Where device printf (and assert) output of launches enqueued in `context`
  // (null: the current context) from now on goes; a null sink restores the
  // default, the process's stdout. phosd gives each session's contexts a sink
  // that forwards to the application. CUDA_ERROR_INVALID_CONTEXT for a bad context.
  CUresult (*setPrintfSink)(CUcontext context, std::shared_ptr<PrintfSink> sink);

  // Where the globals of the next module loaded into `context` go (a module
  // loaded there, or a library used there for the first time), by name: a
  // restore puts a module's globals back at the addresses the application
  // knew. A global not named goes wherever there is room. The addresses must
  // be free: else that load fails with CUDA_ERROR_INVALID_VALUE.
  // CUDA_ERROR_INVALID_CONTEXT for a bad context.
  CUresult (*placeNextModuleGlobals)(CUcontext context, const std::map<std::string, std::uint64_t>& placement);
};

}  // namespace phos::vgpu
