// SPDX-License-Identifier: Apache-2.0
#include "registered_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "phos/common/log.h"
#include "phos/common/unique_fd.h"

namespace phos::shim::registered {
namespace {

struct Mapping {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  std::string perms;
  unsigned long inode = 0;
  std::string path;
};

bool parseHex(std::string_view text, uintptr_t* out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out, 16);
  return ec == std::errc() && end == text.data() + text.size();
}

// One line of /proc/self/maps: "begin-end perms offset dev inode [path]".
bool parse(const std::string& line, Mapping* m) {
  std::istringstream in(line);
  std::string range, offset, device;
  if (!(in >> range >> m->perms >> offset >> device >> m->inode)) return false;
  std::getline(in >> std::ws, m->path);
  const size_t dash = range.find('-');
  return dash != std::string::npos &&
         parseHex(std::string_view(range).substr(0, dash), &m->begin) &&
         parseHex(std::string_view(range).substr(dash + 1), &m->end);
}

// Moves `bytes` at `from` (a mapping of their own) over the pages at `to`,
// in one step: the pages are never unmapped on the way.
bool moveOver(void* from, uintptr_t to, size_t bytes) {
  void* moved =
      mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(to));
  return moved == reinterpret_cast<void*>(to);
}

}  // namespace

CUresult check(uintptr_t address, size_t bytes) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uintptr_t covered = address;
  const uintptr_t end = address + bytes;
  while (covered < end && std::getline(maps, line)) {
    Mapping m;
    if (!parse(line, &m) || m.end <= covered) continue;
    if (m.begin > covered) break;  // a hole
    // The heap and anonymous mappings only: a file's pages (a memory-mapped
    // array) would stop being the file's, and the stack would stop growing.
    const bool anonymous = m.inode == 0 && (m.path.empty() || m.path == "[heap]");
    if (!anonymous || m.perms != "rw-p") {
      log::get("shim")->warn(
          "cuMemHostRegister: {:#x}+{} is not served under PhOS: its pages {:#x}-{:#x} ({} {}) are "
          "not "
          "private anonymous read-write memory",
          address, bytes, m.begin, m.end, m.perms, m.path.empty() ? "anonymous" : m.path);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    covered = m.end;
  }
  return covered >= end ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

bool adopt(const std::string& path, uintptr_t address, size_t bytes) {
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) {
    log::get("shim")->error("cannot open registered memory {}: {}", path, std::strerror(errno));
    return false;
  }
  void* file = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (file == MAP_FAILED) {
    log::get("shim")->error("cannot map registered memory {}: {}", path, std::strerror(errno));
    return false;
  }
  std::memcpy(file, reinterpret_cast<const void*>(address), bytes);
  if (!moveOver(file, address, bytes)) {
    log::get("shim")->error("cannot move registered memory {} to {:#x}: {}", path, address,
                            std::strerror(errno));
    munmap(file, bytes);
    return false;
  }
  return true;
}

bool release(uintptr_t address, size_t bytes) {
  void* copy = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED) {
    log::get("shim")->error("cannot copy registered memory at {:#x}: {}", address,
                            std::strerror(errno));
    return false;
  }
  std::memcpy(copy, reinterpret_cast<const void*>(address), bytes);
  if (!moveOver(copy, address, bytes)) {
    log::get("shim")->error("cannot make registered memory at {:#x} private: {}", address,
                            std::strerror(errno));
    munmap(copy, bytes);
    return false;
  }
  return true;
}

}  // namespace phos::shim::registered
