// SPDX-License-Identifier: Apache-2.0
// The files of a session that its application maps too (pinned host memory,
// the host-call queue; the ring has its own, phos/common/ipc/call_ring.h):
// created 0600 and owned by the application's uid, mapped shared in phosd.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "phos/common/status.h"

namespace phos::daemon {

// Creates `path` (it must not exist) of `bytes`, owned by `uid` when phosd
// runs as root, and maps it shared: at exactly `address`, or where the kernel
// chooses when `address` is 0. Nothing is left at `path` when it fails.
Result<void*> mapSessionFile(const std::string& path, size_t bytes, uid_t uid, uintptr_t address = 0);

}  // namespace phos::daemon
