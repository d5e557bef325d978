// SPDX-License-Identifier: Apache-2.0
// Whether an image's GPU state agrees with its blobs: what `phos verify`
// checks beyond checksums, and what restore checks before anything runs.
#pragma once

#include <vector>

#include "phos/image/reader.h"

namespace phos::checkpoint {

// Each session of the manifest's state.gpu names blobs: its allocations and
// pinned ranges (whose sizes must equal their blobs'), its ring, host-call
// queue, module images and module globals. Every reference to a missing
// blob, a blob of another kind, or a size that disagrees is a problem
// ("gpu.sessions[0].allocations[3]: allocation 0x7f00... is 4096 bytes, its
// blob gpu/0/0x7f00... holds 8192"). A state that is not the shape the
// engine writes is a problem too. Empty: consistent (or no GPU state).
std::vector<image::Problem> checkGpuState(const image::ImageReader& reader);

}  // namespace phos::checkpoint
