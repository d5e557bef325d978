// SPDX-License-Identifier: Apache-2.0
// PTX compiled to the device's code in a process of its own (`phos jit`), so
// that a worker's driver does not compile while its session runs: NVIDIA's
// driver holds a process's launches while it JIT-compiles PTX. A session's
// validator twins, compiled in its worker as its copy-on-write checkpoint
// began, stalled the job 0.3 to 0.5 s on an H100 (docs/gpu.md); compiled by a
// helper, the worker only loads the finished image.
#pragma once

#include <string>
#include <string_view>

#include "phos/common/status.h"

namespace phos::daemon {

// Once per worker, before its first session: the phos binary that runs
// `phos jit`, and the driver it loads (the worker's own).
void configureJitHelper(std::string cli, std::string driverPath);

// `ptx` compiled by the driver in a helper process for device `ordinal`:
// the image cuModuleLoadData takes (NVIDIA's driver: a cubin for that
// device; vgpu: the PTX itself). kUnavailable when no helper is configured
// (the engine run inside a test); kFailedPrecondition, with the helper's
// message, when it cannot start or the driver refuses the PTX.
Result<std::string> compileOutOfProcess(int ordinal, std::string_view ptx);

// `phos jit` itself is runJitHelper (phos/daemon/phosd.h).

}  // namespace phos::daemon
