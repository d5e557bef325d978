// SPDX-License-Identifier: Apache-2.0
// phos_sdk_checkpoint: what the application SDK (sdk/include/phos/sdk.h,
// sdk/python/phos_sdk.py) calls to checkpoint its own process.
//
// Under `phos run --ft` ($PHOS_FT_HINTS names its supervisor's socket) the
// request is a hint to the supervisor, which checkpoints the job at once into
// its storage levels with the mode asked for (the image name is not used).
// Otherwise:
//
// The request runs as `phos checkpoint --pid SELF --leave-running`, started
// outside this process's tree (CRIU dumps the tree; the checkpoint must not be
// in it): a child forks the command and exits at once, so the command is
// reparented. Its output (the JSON report, or its error) goes to IMAGE.log.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "phos/common/unique_fd.h"
#include "phos/common/ipc/control.h"

namespace {

namespace fs = std::filesystem;

// The phos command: $PHOS_CLI (phos run sets it), else `phos` on PATH.
std::string phosCommand() {
  if (const char* cli = std::getenv("PHOS_CLI"); cli != nullptr && *cli != '\0') return cli;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    fs::path candidate = fs::path(dirs.substr(start, end - start)) / "phos";
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  return {};
}

// A hint to phos run --ft's supervisor: one datagram "checkpoint MODE" to the
// abstract UNIX socket $PHOS_FT_HINTS names ("@NAME"). False if it is not set.
bool hintSupervisor(const std::string& mode, int& result) {
  const char* name = std::getenv("PHOS_FT_HINTS");
  if (name == nullptr || name[0] != '@' || std::strlen(name) < 2 || std::strlen(name) >= sizeof(sockaddr_un::sun_path)) {
    return false;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t length = std::strlen(name);
  std::memcpy(addr.sun_path + 1, name + 1, length - 1);  // abstract: a leading NUL
  phos::UniqueFd fd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    result = -1;
    return true;
  }
  const std::string text = "checkpoint " + mode;
  const ssize_t sent = sendto(fd.get(), text.data(), text.size(), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&addr),
                              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length));
  const int e = errno;
  fd.reset();
  errno = e;
  result = sent == static_cast<ssize_t>(text.size()) ? 0 : -1;
  return true;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int phos_sdk_checkpoint(const char* image, const char* mode) {
  const std::string m = mode == nullptr ? "cow" : mode;
  if (image == nullptr || *image == '\0' || (m != "cow" && m != "recopy" && m != "stop")) {
    errno = EINVAL;
    return -1;
  }
  if (int hinted = 0; hintSupervisor(m, hinted)) return hinted;
  std::error_code ec;
  const fs::path target = fs::absolute(image, ec);
  if (ec) {
    errno = ec.value();
    return -1;
  }
  if (fs::exists(target, ec)) {
    errno = EEXIST;
    return -1;
  }
  const std::string phos = phosCommand();
  if (phos.empty()) {
    errno = ENOENT;
    return -1;
  }
  // Everything the child needs is built here: after fork only
  // async-signal-safe calls are allowed (the application has threads).
  const std::vector<std::string> args = {phos,           "checkpoint",    "--pid",  std::to_string(getpid()),
                                         "--image",      target.string(), "--mode", m,
                                         "--leave-running", "--runtime-dir", phos::ipc::runtimeDir(), "--json"};
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string logPath = target.string() + ".log";
  phos::UniqueFd log(open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!log) return -1;
  phos::UniqueFd devnull(open("/dev/null", O_RDONLY | O_CLOEXEC));
  const pid_t child = fork();
  if (child < 0) {
    const int e = errno;
    log.reset();
    devnull.reset();
    errno = e;
    return -1;
  }
  if (child == 0) {
    if (fork() == 0) {
      setsid();
      if (devnull) dup2(devnull.get(), 0);
      dup2(log.get(), 1);
      dup2(log.get(), 2);
      close_range(3, ~0U, 0);  // none of the application's descriptors
      execv(argv[0], argv.data());
      _exit(127);
    }
    _exit(0);
  }
  log.reset();
  devnull.reset();
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return 0;
}
