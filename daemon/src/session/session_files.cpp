// SPDX-License-Identifier: Apache-2.0
#include "session/session_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "phos/common/ipc/control.h"
#include "phos/common/subprocess.h"
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

bool ringLocked(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  return flock(fd.get(), LOCK_EX | LOCK_NB) != 0;  // closing releases the lock if it was taken
}

Status claimSessionPath(const std::string& path, const std::string& ringPath, pid_t process, uid_t owner) {
  const std::string prefix = ipc::sessionDir() + "/phos-";
  if (path.rfind(prefix, 0) != 0 || path.find("..") != std::string::npos) {
    return makeError(Code::kDataLoss, "the image names a session file outside {}*: {}", prefix,
                     path);
  }
  auto inUse = [&](std::string why) {
    return makeError(Code::kFailedPrecondition,
                     "{} is in use ({}): the checkpointed session still runs on this host, or "
                     "another restore of it "
                     "does",
                     path, why);
  };
  bool held = !ringPath.empty() && ringLocked(ringPath);
  if (held && !processEnded(process))
    return inUse(fmt::format("a session holds its ring, and pid {} runs", process));
  // A session whose process just ended is still being freed by its worker for
  // a moment: wait for that.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (held && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    held = ringLocked(ringPath);
  }
  if (held) return inUse("a session holds its ring");
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return Status::ok();
  if (st.st_uid != owner && geteuid() == 0) {
    return makeError(Code::kPermissionDenied,
                     "{} belongs to uid {}, not to uid {} whose session is restored", path,
                     st.st_uid, owner);
  }
  if (unlink(path.c_str()) != 0)
    return errnoError(errno, fmt::format("cannot remove the stale {}", path));
  return Status::ok();
}

}  // namespace phos::daemon
