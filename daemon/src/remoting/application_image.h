// SPDX-License-Identifier: Apache-2.0
// Images the application hands the driver (modules, libraries, linker
// inputs) stay in its memory: phosd reads them there (process_vm_readv).
#pragma once

#include <cuda.h>

#include <vector>

#include "phos/common/ipc/wire_codec.h"
#include "session/server_call.h"

namespace phos::daemon::hooks {

// The image's bytes, and one NUL after them (PTX is NUL-terminated text in
// the application). CUDA_ERROR_INVALID_VALUE for a null address, no bytes,
// more than 1 GiB, or memory phosd cannot read.
CUresult readImage(ServerCall& c, const ipc::ImageRef& ref, std::vector<char>* image);

}  // namespace phos::daemon::hooks
