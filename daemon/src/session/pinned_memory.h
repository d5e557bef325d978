// SPDX-License-Identifier: Apache-2.0
// A session's pinned host memory (cuMemHostAlloc, cuMemAllocHost), its
// managed memory (cuMemAllocManaged, which PhOS serves as pinned memory that
// answers as managed: docs/remoting.md) and the application's memory it
// registered (cuMemHostRegister): each range a file named after the session's
// ring, mapped shared in phosd and in the application at the same address, so
// that a pointer to it means the same memory on both sides (unified
// addressing) and kernels may use it. The ranges phosd allocates lie in a
// slice of a window of their own; registered ranges are where the
// application's pages were.
//
// PinnedMemory owns the ranges' files and mappings, and saves and rebuilds
// them; registering a range with the driver is the session's (it takes a
// context: Session::unregisterPinned).
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

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
  // cuMemHostRegister's pointer and size (0: phosd allocated the range). The
  // range is the registration's whole pages (`bytes` == `mapped`): they hold
  // the application's other data too, which the range's file keeps.
  uintptr_t registered = 0;
  size_t registeredBytes = 0;
  std::string path;
  uint64_t context = 0;  // the context it was allocated in (it goes with it)
};

// The flags phosd registers the application's memory with: its own, and
// portable and mapped, as the ranges phosd allocates (any context of the
// session may use it, at the pointer the application holds).
constexpr unsigned registrationFlags(unsigned applicationFlags) {
  return applicationFlags | CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
}

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
  // The pages of the application's [p, p+bytes) as a new range at their own
  // address (the application copies its bytes in: docs/remoting.md).
  // kAlreadyExists when they overlap a range of the session; kNotSupported
  // when they lie in a window phosd hands out or phosd has memory there;
  // kResourceExhausted when the session's registrations would exceed the
  // host's memory.
  Result<PinnedRange> createRegistered(const std::string& ringPath, uintptr_t p, size_t bytes,
                                       unsigned flags, uint64_t context);
  // The range registered at `p` (cuMemHostRegister's pointer), or null.
  const PinnedRange* findRegistered(uintptr_t p) const;
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
