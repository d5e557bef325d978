// SPDX-License-Identifier: Apache-2.0
// Which CUDA driver phosd's workers load (phos/daemon/phosd.h): the one asked
// for, NVIDIA's when it sees a GPU, else the built-in vgpu.
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "phos/common/log.h"
#include "phos/common/unique_fd.h"
#include "phos/daemon/phosd.h"

#ifndef PHOS_VGPU_DRIVER
#define PHOS_VGPU_DRIVER ""
#endif

namespace phos::daemon {

using Clock = std::chrono::steady_clock;

std::string defaultVgpuDriver() { return PHOS_VGPU_DRIVER; }

namespace {

struct GpuProbe {
  int gpus = 0;
  std::string path;
};

// Whether NVIDIA's libcuda.so.1 loads and sees a GPU, asked in a short-lived
// child: cuInit in the caller would make every later fork() of it (phosd's
// workers) unable to use the driver.
GpuProbe probeNvidiaDriver() {
  int pipeFds[2];
  if (pipe2(pipeFds, O_CLOEXEC) != 0) return {};
  UniqueFd readEnd(pipeFds[0]), writeEnd(pipeFds[1]);
  pid_t child = fork();
  if (child < 0) return {};
  if (child == 0) {
    readEnd.reset();
    std::string answer = "0\n";
    if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); h != nullptr) {
      auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(h, "cuInit"));
      auto count = reinterpret_cast<CUresult (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
      int n = 0;
      bool gpu = init != nullptr && count != nullptr && init(0) == CUDA_SUCCESS && count(&n) == CUDA_SUCCESS;
      Dl_info info{};
      std::string path = "libcuda.so.1";
      if (init != nullptr && dladdr(reinterpret_cast<void*>(init), &info) != 0 && info.dli_fname != nullptr) {
        path = info.dli_fname;
      }
      answer = fmt::format("{}\n{}", gpu ? n : 0, path);
    }
    (void)!write(writeEnd.get(), answer.data(), answer.size());
    _exit(0);
  }
  writeEnd.reset();
  std::string text;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      log::get("daemon")->warn("the NVIDIA driver probe did not answer within 30 s; using vgpu");
      kill(child, SIGKILL);
      text.clear();
      break;
    }
    pollfd p{readEnd.get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) break;
    char buf[4096];
    ssize_t n = read(readEnd.get(), buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  readEnd.reset();
  while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
  GpuProbe probe;
  auto nl = text.find('\n');
  if (nl == std::string::npos) return probe;
  std::from_chars(text.data(), text.data() + nl, probe.gpus);
  probe.path = text.substr(nl + 1);
  return probe;
}

}  // namespace

DriverChoice chooseDriver(const std::string& requested) {
  if (!requested.empty()) return {requested, "given on the command line"};
  if (const char* env = std::getenv("PHOS_DRIVER"); env != nullptr && *env != '\0') {
    return {env, "PHOS_DRIVER"};
  }
  // NVIDIA's driver when it is installed and sees a GPU.
  GpuProbe probe = probeNvidiaDriver();
  if (probe.gpus > 0 && probe.path != defaultVgpuDriver()) {
    return {probe.path, fmt::format("{} sees {} GPU(s)", probe.path, probe.gpus)};
  }
  return {defaultVgpuDriver(), "no GPU found: the built-in vgpu"};
}

}  // namespace phos::daemon
