// SPDX-License-Identifier: Apache-2.0
// Client side of phosd's control socket.
#include "phos/common/ipc/control.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace phos::ipc {

bool isBadRequest(std::string_view code) {
  for (Code bad : {Code::kInvalidArgument, Code::kNotFound, Code::kAlreadyExists, Code::kDataLoss}) {
    if (code == wireCode(bad)) return true;
  }
  return code == kNoSession;
}

std::string runtimeDir() {
  if (const char* d = std::getenv("PHOS_RUNTIME_DIR"); d != nullptr && *d != '\0') return d;
  if (geteuid() == 0) return "/run/phos";
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x != '\0') return std::string(x) + "/phos";
  return fmt::format("/tmp/phos-{}", geteuid());
}

std::string sessionDir() {
  const char* d = std::getenv("PHOS_SESSION_DIR");
  std::string dir = d != nullptr && *d == '/' ? std::string(d) : std::string("/dev/shm");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string controlSocketPath(const std::string& runtimeDirectory) { return runtimeDirectory + "/phosd.sock"; }

std::string daemonLockPath(const std::string& runtimeDirectory) { return runtimeDirectory + "/phosd.lock"; }

namespace {

// The pid holding a write lock on the whole of `fd`'s file, or 0.
Result<pid_t> lockHolder(int fd, const std::string& path) {
  struct flock query {};
  query.l_type = F_WRLCK;
  query.l_whence = SEEK_SET;
  if (fcntl(fd, F_GETLK, &query) != 0) return errnoError(errno, fmt::format("cannot query the lock {}", path));
  return query.l_type == F_UNLCK ? pid_t{0} : query.l_pid;
}

}  // namespace

Result<UniqueFd> lockDaemonDirectory(const std::string& runtimeDirectory) {
  const std::string path = daemonLockPath(runtimeDirectory);
  UniqueFd file(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!file) return errnoError(errno, fmt::format("cannot open the daemon lock {}", path));
  const int fd = file.get();
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  if (fcntl(fd, F_SETLK, &lock) != 0) {
    const int e = errno;
    Result<pid_t> holder = lockHolder(fd, path);
    if (e == EAGAIN || e == EACCES) {
      return makeError(Code::kAlreadyExists, "a phosd (pid {}) already serves {}",
                       holder.isOk() ? std::to_string(*holder) : std::string("unknown"), runtimeDirectory);
    }
    return errnoError(e, fmt::format("cannot lock {}", path));
  }
  // For people: who holds it.
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) == 0) (void)!pwrite(fd, pid.data(), pid.size(), 0);  // a courtesy: the lock is what counts
  return file;
}

Result<pid_t> daemonHoldingLock(const std::string& runtimeDirectory) {
  const std::string path = daemonLockPath(runtimeDirectory);
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    if (errno == ENOENT) return pid_t{0};
    return errnoError(errno, fmt::format("cannot open the daemon lock {}", path));
  }
  return lockHolder(fd.get(), path);  // ours holds no lock: closing it releases nothing
}

namespace {

Result<UniqueFd> connectTo(const std::string& socketPath) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socketPath.size() >= sizeof(addr.sun_path)) {
    return makeError(Code::kInvalidArgument, "control socket path {} is too long", socketPath);
  }
  std::memcpy(addr.sun_path, socketPath.c_str(), socketPath.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return errnoError(errno, "socket");
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status(Code::kUnavailable, fmt::format("no phosd at {}: {}", socketPath, std::strerror(errno)));
  }
  return fd;
}

Status sendAll(int fd, std::string_view bytes) {
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError(errno, "cannot send to phosd");
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

Result<ControlStream> ControlStream::open(const std::string& socketPath, const std::string& request) {
  ASSIGN_OR_RETURN(UniqueFd fd, connectTo(socketPath));
  ControlStream stream(std::move(fd));
  RETURN_IF_ERROR(stream.writeLine(request));
  return stream;
}

Result<std::string> ControlStream::readLine() {
  char buf[4096];
  for (;;) {
    if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (buffer_.size() > kMaxControlMessage) return makeError(Code::kDataLoss, "a line of phosd is too long");
    ssize_t n = recv(fd_.get(), buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError(errno, "cannot read from phosd");
    }
    if (n == 0) return makeError(Code::kUnavailable, "phosd closed the connection");
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

Status ControlStream::writeLine(std::string_view line) {
  std::string out(line);
  out += '\n';
  return sendAll(fd_.get(), out);
}

Result<std::string> controlRequest(const std::string& socketPath, const std::string& request,
                                   std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(UniqueFd connection, connectTo(socketPath));
  const int fd = connection.get();
  RETURN_IF_ERROR_CTX(sendAll(fd, request + "\n"), fmt::format("phosd at {}", socketPath));
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return makeError(Code::kUnavailable, "phosd at {} did not answer in time", socketPath);
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return errnoError(errno, "poll");
    }
    if (ready == 0) continue;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError(errno, fmt::format("cannot read from phosd at {}", socketPath));
    }
    if (n == 0) break;
    answer.append(buf, static_cast<size_t>(n));
    if (answer.size() > kMaxControlMessage) return makeError(Code::kDataLoss, "answer of phosd is too long");
    if (auto nl = answer.find('\n'); nl != std::string::npos) {
      answer.resize(nl);
      return answer;
    }
  }
  if (answer.empty()) return makeError(Code::kUnavailable, "phosd at {} closed the connection", socketPath);
  return answer;
}

}  // namespace phos::ipc
