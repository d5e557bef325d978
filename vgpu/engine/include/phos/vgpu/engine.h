// SPDX-License-Identifier: Apache-2.0
// The PTX execution engine of vgpu: a ProgramLoader that runs kernels on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "phos/vgpu/program.h"

namespace phos::vgpu::engine {

// The loader the driver registers. Programs it returns run launches with as many
// worker threads as PHOS_VGPU_THREADS says (default: the hardware concurrency; read once).
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

// Byte ranges and access records are the driver seam's (program.h): the driver asks
// for a launch's accesses through LaunchContext::accesses; the functions below are
// the engine's own switch for tests that hold a Program directly.
using phos::vgpu::AccessRecord;
using phos::vgpu::ByteRange;

// Turns the per-launch access recorder of `program` on or off (off by default; it
// costs a record per lane access).
void setRecordAccesses(phos::vgpu::Program& program, bool enabled);

// What the last launch of `program` read and wrote (empty when not recording).
AccessRecord lastLaunchAccesses(const phos::vgpu::Program& program);

}  // namespace phos::vgpu::engine
