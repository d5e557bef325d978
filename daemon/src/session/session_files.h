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

// Whether a live session holds the ring file at `path` (the shared flock that
// CallRing::create takes for it, kept in Session::ringLock_).
bool ringLocked(const std::string& path);

// A session file of an image is about to be re-created at `path`: one left
// by a session that is gone is removed; while a live session holds the ring
// at `ringPath` locked (CallRing::create), the checkpointed session still runs
// here (kFailedPrecondition). An empty `ringPath`: the caller holds the
// session's ring itself. The path comes from the manifest, which its writer
// controls: only phos-* in the session directory (ipc::sessionDir(); kDataLoss
// otherwise), and a file there that
// does not belong to `owner` (the restored session's uid) is another user's
// session file, never removed for this one (kPermissionDenied).
Status claimSessionPath(const std::string& path, const std::string& ringPath, pid_t process, uid_t owner);

}  // namespace phos::daemon
