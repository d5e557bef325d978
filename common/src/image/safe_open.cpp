// SPDX-License-Identifier: Apache-2.0
// Opening an image's files without following links, beneath the image directory.
#include "phos/image/safe_open.h"

#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

namespace phos::image {

namespace fs = std::filesystem;

namespace {

std::string_view kindOf(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

// The components of a path inside the image, or why it is not one. Checked
// by name first, so that the per-component fallback is as strict as
// RESOLVE_BENEATH: nothing it walks can climb out.
Result<std::vector<std::string>> componentsOf(std::string_view relative) {
  if (relative.empty()) return makeError(Code::kPermissionDenied, "an empty path is not a file of the image");
  if (relative.front() == '/') {
    return makeError(Code::kPermissionDenied, "{} is an absolute path, not a file inside the image", relative);
  }
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= relative.size()) {
    size_t end = relative.find('/', start);
    if (end == std::string_view::npos) end = relative.size();
    std::string_view part = relative.substr(start, end - start);
    if (part == "..") return makeError(Code::kPermissionDenied, "{} leaves the image directory (..)", relative);
    if (part == ".") return makeError(Code::kPermissionDenied, "{}: a \".\" component is not allowed", relative);
    if (!part.empty()) parts.emplace_back(part);
    start = end + 1;
  }
  if (parts.empty()) return makeError(Code::kPermissionDenied, "{} names no file", relative);
  return parts;
}

// Why opening `relative` failed with `err`: which component is a link or not
// a directory, found by lstat-ing the prefixes (nothing is opened; it only
// words the refusal).
Status explain(int directory, std::string_view relative, const std::vector<std::string>& parts, int err) {
  if (err == ENOENT) return makeError(Code::kNotFound, "{} is missing", relative);
  if (err == ELOOP || err == ENOTDIR || err == EXDEV) {
    std::string prefix;
    for (size_t i = 0; i < parts.size(); ++i) {
      prefix += (i == 0 ? "" : "/") + parts[i];
      struct stat st {};
      if (::fstatat(directory, prefix.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) break;
      const bool last = i + 1 == parts.size();
      if (S_ISLNK(st.st_mode)) {
        return makeError(Code::kPermissionDenied,
                         "{} is a symbolic link: an image's files are opened without following links",
                         prefix == relative ? std::string(relative) : fmt::format("{} (in {})", prefix, relative));
      }
      if (!last && !S_ISDIR(st.st_mode)) {
        return makeError(Code::kPermissionDenied, "{} (in {}) is not a directory", prefix, relative);
      }
    }
    if (err == EXDEV) return makeError(Code::kPermissionDenied, "{} leaves the image directory", relative);
    // The link was replaced meanwhile: still a link when it was opened.
    return makeError(Code::kPermissionDenied, "{} passes through a symbolic link", relative);
  }
  if (err == ENXIO || err == ENODEV) {
    return makeError(Code::kPermissionDenied, "{} is not a regular file", relative);
  }
  return errnoError(err, fmt::format("opening {}", relative));
}

std::atomic<bool> haveOpenat2{true};

// openat2 confined to `directory`, no links at all; -1 with errno, ENOSYS
// when the kernel (before 5.6) or a seccomp filter lacks it.
int openat2Beneath(int directory, const std::string& relative, int flags, mode_t mode) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = (flags & O_CREAT) != 0 ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    long fd = ::syscall(SYS_openat2, directory, relative.c_str(), &how, sizeof(how));
    if (fd < 0 && errno == EAGAIN) continue;  // RESOLVE_* raced with a rename: try again
    if (fd < 0 && errno == EINTR) continue;
    return static_cast<int>(fd);
  }
}

// The fallback: one openat per component, each with O_NOFOLLOW, directories
// with O_DIRECTORY (a link there fails with ENOTDIR or ELOOP). `..` and `.`
// were refused by name, so this cannot leave `directory` either.
int openatPerComponent(int directory, const std::vector<std::string>& parts, int flags, mode_t mode) {
  Fd current;
  int at = directory;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int next = ::openat(at, parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return -1;
    current = Fd(next);
    at = current.get();
  }
  return ::openat(at, parts.back().c_str(), flags | O_NOFOLLOW, mode);
}

bool readableBy(const struct stat& st, uid_t uid) {
  return (st.st_uid == uid && (st.st_mode & S_IRUSR) != 0) || (st.st_mode & S_IROTH) != 0;
}

}  // namespace

Result<Fd> openImageDirectory(const fs::path& path) {
  std::string name = path.empty() ? std::string(".") : path.string();
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  int fd = ::open(name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return makeError(Code::kNotFound, "{}: no such image directory", path.string());
    struct stat st {};
    if ((err == ELOOP || err == ENOTDIR) && ::lstat(name.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode)) {
        return makeError(Code::kPermissionDenied,
                         "{} is a symbolic link: an image directory is opened without following links (name the "
                         "directory itself)",
                         path.string());
      }
      return makeError(Code::kNotFound, "{} is {}, not an image directory", path.string(), kindOf(st.st_mode));
    }
    return errnoError(err, fmt::format("opening the image directory {}", path.string()));
  }
  return Fd(fd);
}

Status checkImageOwner(int directory, const std::string& shownAs, const Requester& requester) {
  if (requester.privileged()) return Status::ok();
  struct stat st {};
  if (::fstat(directory, &st) != 0) return errnoError(errno, fmt::format("fstat of {}", shownAs));
  const uid_t uid = *requester.uid;
  if (st.st_uid != uid) {
    return makeError(Code::kPermissionDenied,
                     "uid {} may not use the image {}: it belongs to uid {} (an image is used only by the owner "
                     "of its directory, or by root)",
                     uid, shownAs, st.st_uid);
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return makeError(Code::kPermissionDenied,
                     "the image {} is writable by {} (mode {:04o}): others could have replaced its files; "
                     "chmod go-w it first",
                     shownAs, (st.st_mode & S_IWOTH) != 0 ? "anyone" : "its group", st.st_mode & 07777);
  }
  return Status::ok();
}

Result<Fd> openBeneath(int directory, std::string_view relative, const Requester& requester, int flags) {
  ASSIGN_OR_RETURN(std::vector<std::string> parts, componentsOf(relative));
  const bool writing = (flags & O_ACCMODE) != O_RDONLY;
  if (writing && !requester.privileged()) {
    // Only phosd's own images (migration targets, restored by root) have
    // files a reader writes; a user's image gets none written by root.
    return makeError(Code::kPermissionDenied, "{}: nothing is written into an image on behalf of uid {}", relative,
                     *requester.uid);
  }
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
  // (a hostile image could stall phosd's worker); cleared below for files.
  const int openFlags = flags | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | (writing ? 0 : O_NONBLOCK);
  const mode_t mode = 0644;
  std::string joined;
  for (const std::string& p : parts) joined += (joined.empty() ? "" : "/") + p;
  int fd = -1;
  if (haveOpenat2.load(std::memory_order_relaxed)) {
    fd = openat2Beneath(directory, joined, openFlags, mode);
    if (fd < 0 && errno == ENOSYS) haveOpenat2.store(false, std::memory_order_relaxed);
  }
  if (!haveOpenat2.load(std::memory_order_relaxed)) fd = openatPerComponent(directory, parts, openFlags, mode);
  if (fd < 0) return explain(directory, relative, parts, errno);
  Fd file(fd);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return errnoError(errno, fmt::format("fstat of {}", relative));
  if (!S_ISREG(st.st_mode)) {
    return makeError(Code::kPermissionDenied, "{} is {}, not a regular file", relative, kindOf(st.st_mode));
  }
  if (!requester.privileged() && !readableBy(st, *requester.uid)) {
    return makeError(Code::kPermissionDenied, "{}: uid {} may not read it (it belongs to uid {}, mode {:04o})",
                     relative, *requester.uid, st.st_uid, st.st_mode & 07777);
  }
  if (!writing && ::fcntl(file.get(), F_SETFL, ::fcntl(file.get(), F_GETFL) & ~O_NONBLOCK) != 0) {
    return errnoError(errno, fmt::format("opening {}", relative));
  }
  return file;
}

void detail::setUseOpenat2(bool use) { haveOpenat2.store(use); }

Result<uint64_t> fileSize(int fd, std::string_view shownAs) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errnoError(errno, fmt::format("fstat of {}", shownAs));
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace phos::image
