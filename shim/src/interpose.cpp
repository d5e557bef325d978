// SPDX-License-Identifier: Apache-2.0
// How calls reach the shim: its exported cu* trampolines (direct linking),
// dlopen("libcuda.so.1") answered with the shim's own handle (so dlsym finds
// the trampolines), and cuGetProcAddress (local_calls.cpp). Also the
// process-wide setup: dispatch table, logging, fork.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "api_trace.h"
#include "client_call.h"
#include "connection.h"
#include "phos/common/log.h"

namespace phos::shim {
namespace {

// The shim's own handle: what dlopen("libcuda.so.1") returns.
void* selfHandle() {
  static void* handle = [] {
    Dl_info info{};
    void* h = nullptr;
    if (dladdr(reinterpret_cast<void*>(&selfHandle), &info) != 0 && info.dli_fname != nullptr) {
      using DlopenFn = void* (*)(const char*, int);
      static auto realDlopen = reinterpret_cast<DlopenFn>(dlsym(RTLD_NEXT, "dlopen"));
      if (realDlopen != nullptr) h = realDlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    }
    return h;
  }();
  return handle;
}

// "libcuda.so", "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", ...
bool isDriverName(const char* filename) {
  if (filename == nullptr) return false;
  std::string_view name(filename);
  if (auto slash = name.rfind('/'); slash != std::string_view::npos) name.remove_prefix(slash + 1);
  return name == "libcuda.so" || name.starts_with("libcuda.so.");
}

__attribute__((constructor)) void installShim() {
  log::setup(log::sinksFromEnvironment());
  auto& table = cuda_api::dispatch();
  generated::installGenerated(table);
  trace::writeSummaryAtExit();
  pthread_atfork(nullptr, nullptr, [] { Connection::instance().forgetAfterFork(); });
}

}  // namespace
}  // namespace phos::shim

// Exported (libphos.map). Anything else is passed to the next dlopen.
extern "C" __attribute__((visibility("default"))) void* dlopen(const char* filename, int flags) {
  using DlopenFn = void* (*)(const char*, int);
  static auto realDlopen = reinterpret_cast<DlopenFn>(dlsym(RTLD_NEXT, "dlopen"));
  if (phos::shim::isDriverName(filename)) {
    if (void* self = phos::shim::selfHandle(); self != nullptr) return self;
  }
  return realDlopen != nullptr ? realDlopen(filename, flags) : nullptr;
}
