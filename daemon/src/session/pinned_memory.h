// SPDX-License-Identifier: Apache-2.0
// A session's pinned host memory (cuMemHostAlloc, cuMemAllocHost) and its
// managed memory (cuMemAllocManaged, which PhOS serves as pinned memory that
// answers as managed: docs/remoting.md): each range a file named after the
// session's ring, mapped shared in phosd and in the application at the same
// address, so that a pointer to it means the same memory on both sides
// (unified addressing) and kernels may use it. The ranges of a session lie in
// a slice of a window of their own.
//
// PinnedMemory owns the ranges' files and mappings, and saves and rebuilds
// them; registering a range with the driver is the session's (it takes a
// context: Session::unregisterPinned).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "protocols/progress.h"

namespace phos::daemon {

struct PinnedRange {
  uintptr_t address = 0;
  size_t bytes = 0;      // what the application asked for
  size_t mapped = 0;     // page-rounded
  unsigned flags = 0;    // cuMemHostAlloc's; cuMemAllocManaged's CU_MEM_ATTACH_* when managed
  bool managed = false;  // cuMemAllocManaged's: freed with cuMemFree, not cuMemFreeHost
  std::string path;
  uint64_t context = 0;  // the context it was allocated in (it goes with it)
};

class PinnedMemory {
 public:
  PinnedMemory(uint64_t session, uid_t uid) : session_(session), uid_(uid) {}
  ~PinnedMemory() { clear(); }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  // A new range of `bytes` in the first gap of the slice that holds it, its
  // file named after `ringPath` (whose lock keeps a starting phosd from taking
  // it for a dead session's file). kResourceExhausted when none does.
  Result<PinnedRange> create(const std::string& ringPath, size_t bytes, unsigned flags,
                             bool managed, uint64_t context);
  // The range holding `p`, or null.
  const PinnedRange* find(uintptr_t p) const;
  // Unmaps range `address` and removes its file; false if there is none.
  bool remove(uintptr_t address);
  // Every range, unmapped and removed.
  void clear();
  // Where the ranges go: the slice of the window the session's id picks, or
  // (restored) the one its ranges are in.
  uintptr_t slice() const;
  const std::map<uintptr_t, PinnedRange>& ranges() const { return ranges_; }
  uint64_t bytes() const;

  // At a checkpoint (the application frozen): every range's bytes into a
  // blob of `writer`; what the image's state holds of them.
  Result<nlohmann::json> save(image::ImageWriter& writer, PhaseProgress& phase) const;
  // At a restore: every range of `saved` (save()'s) at its path and address
  // with its bytes; `mapped(range)` right after each one is (the session
  // registers it with the driver). `pid`: the restored process, whose ring
  // the caller holds.
  Status rebuild(const image::ImageReader& reader, const nlohmann::json& saved, pid_t pid,
                 const std::function<Status(const PinnedRange&)>& mapped);

 private:
  const uint64_t session_;
  const uid_t uid_;
  std::map<uintptr_t, PinnedRange> ranges_;  // by address
  uint64_t serial_ = 0;                      // names the files
};

}  // namespace phos::daemon
