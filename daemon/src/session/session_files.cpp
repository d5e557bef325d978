// SPDX-License-Identifier: Apache-2.0
#include "session/session_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "phos/common/unique_fd.h"

namespace phos::daemon {

Result<void*> mapSessionFile(const std::string& path, size_t bytes, uid_t uid, uintptr_t address) {
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) return errnoError(errno, fmt::format("cannot create {}", path));
  auto fail = [&](int error, std::string what) {
    unlink(path.c_str());
    return errnoError(error, what);
  };
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return fail(errno, fmt::format("cannot size {} to {} bytes", path, bytes));
  }
  if (fchown(fd.get(), uid, static_cast<gid_t>(-1)) != 0 && geteuid() == 0) {
    return fail(errno, fmt::format("cannot give {} to uid {}", path, uid));
  }
  const int fixed = address != 0 ? MAP_FIXED_NOREPLACE : 0;
  void* p = mmap(reinterpret_cast<void*>(address), bytes, PROT_READ | PROT_WRITE, MAP_SHARED | fixed, fd.get(), 0);
  if (p == MAP_FAILED) {
    return fail(errno, address != 0 ? fmt::format("cannot map {} at {:#x}", path, address)
                                    : fmt::format("cannot map {}", path));
  }
  if (address != 0 && p != reinterpret_cast<void*>(address)) {
    // A kernel without MAP_FIXED_NOREPLACE takes it as a hint.
    munmap(p, bytes);
    return fail(EEXIST, fmt::format("cannot map {} at {:#x}", path, address));
  }
  return p;
}

}  // namespace phos::daemon
