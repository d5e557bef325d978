// SPDX-License-Identifier: Apache-2.0
// Runs one kernel launch over the executable form: CTAs on worker threads, warps of
// 32 lanes with an active mask and an IPDOM reconvergence stack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "code.h"
#include "phos/common/status.h"
#include "phos/vgpu/engine.h"
#include "phos/vgpu/program.h"

namespace phos::vgpu::engine::detail {

struct KernelLaunch {
  const ExecModule* code = nullptr;
  uint32_t function = 0;  // index into code->functions
  LaunchConfig config;
  std::span<const std::byte> params;
  LaunchContext context;
  uint32_t workers = 1;   // threads running CTAs in parallel
  AccessRecord* record = nullptr;  // when set, receives the global accesses
};

// Runs the grid to completion. Returns OK, kernelFaultStatus(...) for a fault, or
// another error for a launch the engine cannot run (deadlocked barrier, ...).
Status runKernel(const KernelLaunch& launch, LaunchStats* stats);

}  // namespace phos::vgpu::engine::detail
