// SPDX-License-Identifier: Apache-2.0
// Opening an image's files as untrusted input (docs/security.md).
//
// phosd runs as root and restores images that unprivileged users name on a
// world-writable socket, so an image is whatever such a user put there: its
// files may be symbolic links to /etc/shadow, FIFOs that block a reader,
// `..` paths, and its manifest may claim any owner. Everything here decides
// from what the kernel says about the opened objects (fstat of descriptors),
// never from names or from the manifest, and nothing follows a link.
#pragma once

#include <sys/types.h>

#include <fcntl.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "phos/common/status.h"
#include "phos/common/unique_fd.h"

namespace phos::image {

// A file descriptor, closed when it goes.
using Fd = UniqueFd;

// On whose behalf an image is read. Root (or nobody named: the caller's own
// privileges, as for `phos verify` run by a user) is only protected from
// links; another uid gets the ownership and readability rules below.
struct Requester {
  std::optional<uid_t> uid;
  bool privileged() const { return !uid || *uid == 0; }
};

// Opens the image directory itself: O_DIRECTORY|O_NOFOLLOW, so that a link
// in the last component is refused (ELOOP names it a link). Trailing slashes
// are dropped first: "img/" would otherwise follow a link named img.
// kNotFound when it does not exist.
Result<Fd> openImageDirectory(const std::filesystem::path& path);

// The ownership rule, on the opened directory: an unprivileged requester may
// use only an image directory it owns that neither group nor others may write
// (else someone else could have put or swapped its files). `shownAs` names it
// in the error.
Status checkImageOwner(int directory, const std::string& shownAs, const Requester& requester);

// Opens `relative` ("blobs/000000", "late/0.3") beneath `directory`:
// openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS and
// O_NOFOLLOW (openat per component where the kernel has no openat2), then
// fstat: only a regular file is returned. Absolute paths and `..` or `.`
// components are refused before anything is opened. For reading, O_NONBLOCK
// is set during the open (a FIFO would block it) and cleared after.
//
// For an unprivileged requester the opened file must also be one it could
// read itself (owner with read permission, or readable by others; groups are
// not looked up). That makes a hard link harmless: it can only name a file
// the requester reads anyway (with fs.protected_hardlinks=0 a user may link
// /etc/shadow into its image; the check is on the inode, so it is refused).
//
// Errors name `relative` and what is wrong: kNotFound (missing),
// kPermissionDenied (a link, not a regular file, outside the directory,
// unreadable for the requester), kIo otherwise.
// `flags` are O_RDONLY, or O_WRONLY|O_APPEND|O_CREAT (mode 0644) for the few
// files a reader writes (late/wanted).
Result<Fd> openBeneath(int directory, std::string_view relative, const Requester& requester,
                       int flags = O_RDONLY);

namespace detail {
// Tests: whether openBeneath tries openat2 first (true, the default) or goes
// straight to its per-component openat fallback.
void setUseOpenat2(bool use);
}  // namespace detail

// The file's size, from fstat of the descriptor.
Result<uint64_t> fileSize(int fd, std::string_view shownAs);

}  // namespace phos::image
