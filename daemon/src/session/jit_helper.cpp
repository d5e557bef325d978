// SPDX-License-Identifier: Apache-2.0
#include "session/jit_helper.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "session/driver_table.h"
#include "phos/common/subprocess.h"
#include "phos/common/unique_fd.h"
#include "phos/daemon/phosd.h"

namespace phos::daemon {

namespace {

struct JitHelper {
  std::string cli;
  std::string driverPath;
};

JitHelper& helper() {
  static JitHelper configured;
  return configured;
}

// The descriptor's number in the helper.
constexpr int kHelperInput = 3;

}  // namespace

void configureJitHelper(std::string cli, std::string driverPath) {
  helper() = {std::move(cli), std::move(driverPath)};
}

Result<std::string> compileOutOfProcess(int ordinal, std::string_view ptx) {
  const JitHelper& h = helper();
  if (h.cli.empty() || h.driverPath.empty()) return makeError(Code::kUnavailable, "no JIT helper in this process");
  UniqueFd memfd(memfd_create("phos-jit-ptx", MFD_CLOEXEC));
  if (!memfd) return errnoError(errno, "memfd for the JIT helper's PTX");
  const int input = memfd.get();
  size_t done = 0;
  while (done < ptx.size()) {
    const ssize_t n = ::write(input, ptx.data() + done, ptx.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errnoError(errno, "writing the JIT helper's PTX");
    done += static_cast<size_t>(n);
  }
  ::lseek(input, 0, SEEK_SET);
  auto ran = runCapture({h.cli, "jit", "--driver", h.driverPath, "--device", std::to_string(ordinal), "--input-fd",
                         std::to_string(kHelperInput)},
                        {.passFds = {{input, kHelperInput}}});
  memfd.reset();
  if (!ran.isOk()) return makeError(Code::kFailedPrecondition, "the JIT helper: {}", ran.status().message());
  if (ran->exitCode != 0 || ran->out.empty()) {
    std::string why = ran->err;
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    return makeError(Code::kFailedPrecondition, "the JIT helper ({} jit) exited with status {}: {}", h.cli,
                     ran->exitCode, why.empty() ? "no message" : why);
  }
  return std::move(ran->out);
}

int runJitHelper(const std::string& driverPath, int ordinal, int input) {
  std::string ptx;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(input, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::fprintf(stderr, "phos jit: cannot read the PTX from descriptor %d: %s\n", input, std::strerror(errno));
      return 1;
    }
    if (n == 0) break;
    ptx.append(buffer, static_cast<size_t>(n));
  }
  if (ptx.empty()) {
    std::fprintf(stderr, "phos jit: no PTX on descriptor %d\n", input);
    return 1;
  }
  auto loaded = DriverTable::load(driverPath);
  if (!loaded.isOk()) {
    std::fprintf(stderr, "phos jit: %s\n", loaded.status().message().c_str());
    return 1;
  }
  const DriverTable& d = **loaded;
  for (auto id : {cuda_api::EntryPointId::kCuLinkCreate_v2, cuda_api::EntryPointId::kCuLinkAddData_v2,
                  cuda_api::EntryPointId::kCuLinkComplete, cuda_api::EntryPointId::kCuLinkDestroy}) {
    if (!d.has(id)) {
      std::fprintf(stderr, "phos jit: the driver %s has no linker (cuLink*)\n", driverPath.c_str());
      return 1;
    }
  }
  auto fail = [&](std::string_view what, CUresult r, const char* log) {
    std::fprintf(stderr, "phos jit: %.*s failed (CUresult %d)%s%s\n", static_cast<int>(what.size()), what.data(),
                 static_cast<int>(r), log != nullptr && *log != '\0' ? ": " : "", log != nullptr ? log : "");
    return 1;
  };
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (CUresult r = PHOS_DRIVER(d, DeviceGet)(&device, ordinal); r != CUDA_SUCCESS) {
    return fail(fmt::format("cuDeviceGet({})", ordinal), r, nullptr);
  }
  if (CUresult r = PHOS_DRIVER(d, DevicePrimaryCtxRetain)(&context, device); r != CUDA_SUCCESS) {
    return fail("cuDevicePrimaryCtxRetain", r, nullptr);
  }
  PHOS_DRIVER(d, CtxSetCurrent)(context);
  static char errors[16384];
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {errors, reinterpret_cast<void*>(sizeof errors)};
  CUlinkState link = nullptr;
  if (CUresult r = PHOS_DRIVER(d, LinkCreate_v2)(2, options, values, &link); r != CUDA_SUCCESS) {
    return fail("cuLinkCreate", r, errors);
  }
  if (CUresult r = PHOS_DRIVER(d, LinkAddData_v2)(link, CU_JIT_INPUT_PTX, ptx.data(), ptx.size(), "twins", 0, nullptr,
                                                  nullptr);
      r != CUDA_SUCCESS) {
    return fail("cuLinkAddData", r, errors);
  }
  void* image = nullptr;
  size_t bytes = 0;
  if (CUresult r = PHOS_DRIVER(d, LinkComplete)(link, &image, &bytes); r != CUDA_SUCCESS) {
    return fail("cuLinkComplete", r, errors);
  }
  const bool written = std::fwrite(image, 1, bytes, stdout) == bytes && std::fflush(stdout) == 0;
  PHOS_DRIVER(d, LinkDestroy)(link);
  PHOS_DRIVER(d, DevicePrimaryCtxRelease_v2)(device);
  if (!written) {
    std::fprintf(stderr, "phos jit: cannot write the image: %s\n", std::strerror(errno));
    return 1;
  }
  return 0;
}

}  // namespace phos::daemon
