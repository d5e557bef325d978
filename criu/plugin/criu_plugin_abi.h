// SPDX-License-Identifier: Apache-2.0
// The part of CRIU's plugin interface PhOS's plugin uses, declared from CRIU
// 4.1's documented ABI (criu/include/criu-plugin.h in CRIU's sources, which
// Debian does not package): CRIU dlopen()s every `*.so` of its plugin
// directory (--libdir, $CRIU_LIBS_DIR, else /usr/lib/criu), reads the
// descriptor `CR_PLUGIN_DESC`, calls `init(stage)`, the hooks at their
// points, and `exit(stage, ret)` at the end. A hook returns 0 when done,
// -ENOTSUP when the task is not the plugin's, anything else to fail CRIU.
#pragma once

#include <cstdint>

namespace phos::criu_plugin {

// Hook indices (CRIU 4.1: plugin interface 0.2, twelve hooks).
enum Hook : unsigned {
  kResumeDevicesLate = 9,   // int(int pid): restored, before the tasks run
  kPauseDevices = 10,       // int(int pid): dump, before the task is frozen
  kCheckpointDevices = 11,  // int(int pid): dump, the task frozen, before its memory is dumped
  kHookCount = 12,
};

// Stages passed to init and exit.
enum Stage : int { kDump = 0, kPreDump = 1, kRestore = 2 };

inline constexpr unsigned kInterfaceVersion = (0u << 16) + (2u << 8) + 0u;  // 0.2.0

struct Descriptor {
  const char* name;
  int (*init)(int stage);
  void (*exit)(int stage, int ret);
  unsigned version;
  unsigned maxHooks;
  void* hooks[kHookCount];
};

// CRIU's log levels (print_on_level).
enum LogLevel : unsigned { kLogError = 1, kLogWarn = 2, kLogInfo = 3 };

}  // namespace phos::criu_plugin

// Exported by the criu binary (weak here: the plugin also loads where they
// are missing, for its tests).
extern "C" {
int criu_get_image_dir(void) __attribute__((weak));
void print_on_level(unsigned int level, const char* format, ...) __attribute__((weak));
int add_inventory_plugin(const char* name) __attribute__((weak));
bool check_and_remove_inventory_plugin(const char* name, std::size_t length) __attribute__((weak));
}
