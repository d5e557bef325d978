// SPDX-License-Identifier: Apache-2.0
// NVIDIA's device files (/dev/nvidiactl, /dev/nvidia0, /dev/nvidia-uvm, ...)
// kept from the application: under PhOS its GPU is phosd's, and a process
// holding one of them cannot be checkpointed (CRIU dumps no such character
// device). NVML opens them directly, not through libcuda: PyTorch's
// torch.cuda.device_count() asks NVML first and keeps its files open, which
// made every checkpoint of a PyTorch job fail on a GPU host (docs/gpu.md).
// Refused with ENOENT, as on a host without NVIDIA's driver: NVML fails to
// initialize and its callers fall back to the CUDA runtime, which PhOS serves.
// Each of open and open64 is defined here under its own name, which
// _FILE_OFFSET_BITS=64 (the project's) would fold into open64.
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <fcntl.h>

#include <cerrno>
#include <cstdarg>
#include <mutex>
#include <string_view>

#include "phos/common/log.h"

namespace phos::shim {
namespace {

bool isNvidiaDeviceFile(const char* path) {
  if (path == nullptr) return false;
  return std::string_view(path).starts_with("/dev/nvidia");
}

bool refused(const char* path) {
  if (!isNvidiaDeviceFile(path)) return false;
  static std::once_flag once;
  std::call_once(once, [path] {
    log::get("shim")->warn(
        "{} refused to the application: under PhOS its GPU is phosd's (NVML and other direct "
        "users of NVIDIA's device files see no GPU)",
        path);
  });
  errno = ENOENT;
  return true;
}

template <typename Fn>
Fn next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

// open's mode is there only with O_CREAT or O_TMPFILE.
mode_t modeOf(int flags, va_list args) {
  return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(args, mode_t) : 0;
}

}  // namespace
}  // namespace phos::shim

// Exported (libphos.map): the libc entries that open a file by name.
#define PHOS_OPEN(name)                                                                          \
  extern "C" __attribute__((visibility("default"))) int name(const char* path, int flags, ...) { \
    va_list args;                                                                                \
    va_start(args, flags);                                                                       \
    const mode_t mode = phos::shim::modeOf(flags, args);                                         \
    va_end(args);                                                                                \
    if (phos::shim::refused(path)) return -1;                                                    \
    static auto real = phos::shim::next<int (*)(const char*, int, ...)>(#name);                  \
    return real(path, flags, mode);                                                              \
  }
#define PHOS_OPENAT(name)                                                                          \
  extern "C" __attribute__((visibility("default"))) int name(int dir, const char* path, int flags, \
                                                             ...) {                                \
    va_list args;                                                                                  \
    va_start(args, flags);                                                                         \
    const mode_t mode = phos::shim::modeOf(flags, args);                                           \
    va_end(args);                                                                                  \
    if (phos::shim::refused(path)) return -1;                                                      \
    static auto real = phos::shim::next<int (*)(int, const char*, int, ...)>(#name);               \
    return real(dir, path, flags, mode);                                                           \
  }
PHOS_OPEN(open)
PHOS_OPEN(open64)
PHOS_OPENAT(openat)
PHOS_OPENAT(openat64)

// The fortified entries (_FORTIFY_SOURCE) take no mode.
extern "C" __attribute__((visibility("default"))) int __open_2(const char* path, int flags) {
  if (phos::shim::refused(path)) return -1;
  static auto real = phos::shim::next<int (*)(const char*, int)>("__open_2");
  return real(path, flags);
}
extern "C" __attribute__((visibility("default"))) int __open64_2(const char* path, int flags) {
  if (phos::shim::refused(path)) return -1;
  static auto real = phos::shim::next<int (*)(const char*, int)>("__open64_2");
  return real(path, flags);
}
