// SPDX-License-Identifier: Apache-2.0
// The PTX execution engine of vgpu: a ProgramLoader that runs kernels on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "phos/vgpu/program.h"

namespace phos::vgpu::engine {

// The loader the driver registers. Programs it returns run launches with as many
// worker threads as PHOS_VGPU_THREADS says (default: the hardware concurrency).
std::shared_ptr<phos::vgpu::ProgramLoader> makeProgramLoader();

// Counters of one launch: dynamic instructions executed, per warp and per lane.
struct LaunchStats {
  uint64_t warpInstructions = 0;
  uint64_t laneInstructions = 0;
};

// The counters of the last launch of `program` (a Program this engine loaded);
// all zero for another Program.
LaunchStats lastLaunchStats(const phos::vgpu::Program& program);

// Overrides the worker-thread count of launches of `program` (0: the default).
void setWorkerThreads(phos::vgpu::Program& program, uint32_t workers);

// Half-open byte range [begin, end) of device memory.
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

// The global/constant memory one launch touched, sorted and coalesced: every byte a
// load (or an atomic) read, every byte a store (or an atomic) wrote. Shared, local
// and parameter memory are not included.
struct AccessRecord {
  std::vector<ByteRange> reads;
  std::vector<ByteRange> writes;
};

// Turns the per-launch access recorder of `program` on or off (off by default; it
// costs a record per lane access).
void setRecordAccesses(phos::vgpu::Program& program, bool enabled);

// What the last launch of `program` read and wrote (empty when not recording).
AccessRecord lastLaunchAccesses(const phos::vgpu::Program& program);

}  // namespace phos::vgpu::engine
