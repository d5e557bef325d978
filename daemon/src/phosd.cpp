// SPDX-License-Identifier: Apache-2.0
// phosd's main loop: the control socket, session creation and cleanup.
#include "phos/daemon/phosd.h"

#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "context_pool.h"
#include "driver_table.h"
#include "phos/common/ipc/control.h"
#include "phos/common/log.h"
#include "server_call.h"
#include "session.h"

#ifndef PHOS_VGPU_DRIVER
#define PHOS_VGPU_DRIVER ""
#endif

namespace phos::daemon {

using json = nlohmann::json;

std::string defaultVgpuDriver() { return PHOS_VGPU_DRIVER; }

DriverChoice chooseDriver(const std::string& requested) {
  if (!requested.empty()) return {requested, "given on the command line"};
  if (const char* env = std::getenv("PHOS_DRIVER"); env != nullptr && *env != '\0') {
    return {env, "PHOS_DRIVER"};
  }
  // NVIDIA's driver when it is installed and sees a GPU.
  if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); h != nullptr) {
    auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(h, "cuInit"));
    auto count = reinterpret_cast<CUresult (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
    int n = 0;
    bool gpu = init != nullptr && count != nullptr && init(0) == CUDA_SUCCESS && count(&n) == CUDA_SUCCESS && n > 0;
    Dl_info info{};
    std::string path = "libcuda.so.1";
    if (init != nullptr && dladdr(reinterpret_cast<void*>(init), &info) != 0 && info.dli_fname != nullptr) {
      path = info.dli_fname;
    }
    dlclose(h);
    if (gpu && path != defaultVgpuDriver()) return {path, fmt::format("{} sees {} GPU(s)", path, n)};
  }
  return {defaultVgpuDriver(), "no GPU found: the built-in vgpu"};
}

namespace {

// Files of a phosd that was killed (SIGKILL, a crash) stay in /dev/shm: rings,
// pinned memory, host-call queues, all named phos-<daemon pid>-<session>...
// Removes those whose daemon is gone and that belong to this user.
void removeStaleSessionFiles() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    std::string_view name(e->d_name);
    if (!name.starts_with("phos-")) continue;
    std::string_view rest = name.substr(5);
    pid_t owner = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), owner);
    if (ec != std::errc() || end == rest.data() || *end != '-' || owner <= 0) continue;
    if (owner == getpid() || kill(owner, 0) == 0 || errno != ESRCH) continue;
    struct stat st {};
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (geteuid() != 0 && st.st_uid != geteuid()) continue;
    if (unlinkat(dirfd(dir), e->d_name, 0) == 0) {
      log::get("daemon")->info("removed /dev/shm/{}: left by phosd {}, which is gone", name, owner);
    }
  }
  closedir(dir);
}

int pidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

std::string commandOf(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (auto& ch : raw) {
    if (ch == '\0') ch = ' ';
  }
  while (!raw.empty() && raw.back() == ' ') raw.pop_back();
  return raw;
}

struct Client {
  std::unique_ptr<Session> session;
  int pidfd = -1;
  std::string command;
};

}  // namespace

struct Daemon::Impl {
  DaemonOptions options;
  std::string runtimeDir;
  std::string socketPath;
  DriverTable* driver = nullptr;
  std::unique_ptr<ContextPool> pool;
  ServerTable servers{};
  int listenFd = -1;
  uint64_t nextSession = 0;
  std::map<uint64_t, Client> clients;
  bool stopRequested = false;
  struct Reaper {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Reaper> reapers;  // sessions being freed

  ~Impl() {
    clients.clear();
    joinReapers(/*finishedOnly=*/false);
    pool.reset();
    if (listenFd >= 0) {
      close(listenFd);
      unlink(socketPath.c_str());
    }
  }

  Status bind() {
    if (mkdir(runtimeDir.c_str(), 0700) != 0 && errno != EEXIST) {
      return errnoError(errno, fmt::format("cannot create {}", runtimeDir));
    }
    // A daemon already answering there: do not steal its socket.
    if (auto pong = ipc::controlRequest(socketPath, R"({"op":"ping"})", std::chrono::seconds(2)); pong.isOk()) {
      return makeError(Code::kAlreadyExists, "a phosd already serves {}", socketPath);
    }
    unlink(socketPath.c_str());
    listenFd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listenFd < 0) return errnoError(errno, "socket");
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (socketPath.size() >= sizeof(addr.sun_path)) {
      return makeError(Code::kInvalidArgument, "socket path {} is too long", socketPath);
    }
    std::memcpy(addr.sun_path, socketPath.c_str(), socketPath.size() + 1);
    if (::bind(listenFd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return errnoError(errno, fmt::format("cannot bind {}", socketPath));
    }
    // Anyone may connect; every request is checked against SO_PEERCRED.
    chmod(socketPath.c_str(), 0666);
    if (listen(listenFd, 64) != 0) return errnoError(errno, "listen");
    return Status::ok();
  }

  json sessionJson(const Client& client) const {
    SessionInfo i = client.session->info();
    return json{{"session", i.id},        {"pid", i.pid},
                {"uid", i.uid},           {"command", client.command},
                {"device_bytes", i.deviceBytes}, {"allocations", i.allocations},
                {"pinned_bytes", i.pinnedBytes}, {"modules", i.modules},
                {"contexts", i.contexts}, {"calls", i.calls},
                {"launches", i.launches}, {"kernels", i.kernels},
                {"busy", i.busy}};
  }

  json handle(const json& request, const ucred& peer) {
    auto log = log::get("daemon");
    if (!request.is_object() || !request.contains("op") || !request["op"].is_string()) {
      return {{"ok", false}, {"error", "a request is a JSON object with a string \"op\""}};
    }
    const std::string op = request["op"];
    if (op == "ping") {
      json pools = json::array();
      for (const auto& s : pool->stats()) pools.push_back({{"device", s.device}, {"free", s.free}, {"target", s.target}});
      return {{"ok", true}, {"daemon_pid", getpid()}, {"driver", driver->path()},
              {"driver_version", driver->version()}, {"pool", pools}, {"pool_misses", pool->misses()},
              {"sessions", clients.size()}};
    }
    if (op == "ps") {
      json list = json::array();
      for (const auto& [id, client] : clients) {
        if (peer.uid == 0 || peer.uid == client.session->uid()) list.push_back(sessionJson(client));
      }
      return {{"ok", true}, {"sessions", list}};
    }
    if (op == "stop") {
      if (peer.uid != 0 && peer.uid != geteuid()) {
        return {{"ok", false}, {"error", fmt::format("uid {} may not stop this daemon", peer.uid)}};
      }
      stopRequested = true;
      return {{"ok", true}};
    }
    if (op == "attach") {
      if (!request.contains("pid") || !request["pid"].is_number_integer()) {
        return {{"ok", false}, {"error", "attach needs an integer \"pid\""}};
      }
      // Compared before narrowing to pid_t: 2^32 + pid must not pass as pid.
      const auto named = request["pid"].get<int64_t>();
      // A process attaches itself: a session serves the memory of the process
      // that connected, never one it names.
      if (named != static_cast<int64_t>(peer.pid)) {
        return {{"ok", false}, {"error", fmt::format("pid {} is not the connecting process ({})", named, peer.pid)}};
      }
      const pid_t pid = peer.pid;
      int pidfd = pidfdOpen(pid);
      if (pidfd < 0) return {{"ok", false}, {"error", fmt::format("cannot watch pid {}: {}", pid, std::strerror(errno))}};
      uint64_t id = ++nextSession;
      auto session = std::make_unique<Session>(id, pid, peer.uid, *driver, *pool, servers, runtimeDir);
      if (Status s = session->start(options.ring); !s.isOk()) {
        close(pidfd);
        return {{"ok", false}, {"error", s.message()}};
      }
      std::string ring = session->ringPath();
      Client client{std::move(session), pidfd, commandOf(pid)};
      log->info("session {}: pid {} uid {} ({})", id, pid, peer.uid, client.command);
      clients.emplace(id, std::move(client));
      return {{"ok", true}, {"session", id}, {"ring", ring}, {"daemon_pid", getpid()}};
    }
    return {{"ok", false}, {"error", fmt::format("unknown op \"{}\"", op)}};
  }

  // One request per connection. The socket has a receive timeout: a client
  // that connects and says nothing cannot stall the daemon.
  void serveControl(int fd) {
    ucred peer{};
    socklen_t len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
      close(fd);
      return;
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    timeval tv{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    // The whole line within 2 s, not each read: a client sending a byte now
    // and then would otherwise hold the daemon (which serves connections one
    // at a time) for as long as it likes.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    std::string line;
    char buf[4096];
    bool complete = false;
    while (line.size() <= ipc::kMaxControlMessage) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      timeval wait{static_cast<time_t>(left.count() / 1000000), static_cast<suseconds_t>(left.count() % 1000000)};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      const size_t searched = line.size();
      line.append(buf, static_cast<size_t>(n));
      if (auto nl = line.find('\n', searched); nl != std::string::npos) {
        line.resize(nl);
        // The newline may arrive in the read that crosses the limit.
        complete = nl <= ipc::kMaxControlMessage;
        break;
      }
    }
    json answer;
    if (!complete) {
      answer = {{"ok", false}, {"error", "a request is one line of at most 1 MiB"}};
    } else {
      json request = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (request.is_discarded()) {
        answer = {{"ok", false}, {"error", "the request is not valid JSON"}};
      } else {
        try {
          answer = handle(request, peer);
        } catch (const std::exception& e) {  // a JSON value of the wrong type
          answer = {{"ok", false}, {"error", fmt::format("bad request: {}", e.what())}};
        }
      }
    }
    std::string out = answer.dump() + "\n";
    (void)send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    close(fd);
  }

  // Freed on a thread of its own: stopping a session waits for the call it
  // is serving, which may be waiting for a kernel that runs for hours (or
  // forever); the control socket must keep answering meanwhile.
  void endSession(uint64_t id) {
    auto it = clients.find(id);
    if (it == clients.end()) return;
    log::get("daemon")->info("session {}: pid {} exited; freeing its session", id, it->second.session->pid());
    close(it->second.pidfd);
    std::shared_ptr<Session> session = std::move(it->second.session);
    clients.erase(it);
    joinReapers(/*finishedOnly=*/true);
    auto done = std::make_shared<std::atomic<bool>>(false);
    reapers.push_back({std::thread([session, done] {
                         session->stop();
                         done->store(true);
                       }),
                       done});
  }

  // Waits for sessions being freed: those already done, or (at shutdown) all.
  void joinReapers(bool finishedOnly) {
    for (auto r = reapers.begin(); r != reapers.end();) {
      if (finishedOnly && !r->done->load()) {
        ++r;
        continue;
      }
      r->thread.join();
      r = reapers.erase(r);
    }
  }
};

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() = default;

const std::string& Daemon::socketPath() const { return impl_->socketPath; }
const std::string& Daemon::driverPath() const { return impl_->driver->path(); }

Result<std::unique_ptr<Daemon>> Daemon::start(const DaemonOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->runtimeDir = options.runtimeDir.empty() ? ipc::runtimeDir() : options.runtimeDir;
  impl->socketPath = ipc::controlSocketPath(impl->runtimeDir);
  DriverChoice choice = chooseDriver(options.driver);
  if (choice.path.empty()) return makeError(Code::kNotFound, "no CUDA driver: no GPU, and this build has no vgpu");
  ASSIGN_OR_RETURN(impl->driver, DriverTable::load(choice.path));
  log::get("daemon")->info("driver {} ({}), version {}", choice.path, choice.reason, impl->driver->version());
  generated::installGenerated(impl->servers);
  installCustom(impl->servers);
  RETURN_IF_ERROR(impl->bind());
  removeStaleSessionFiles();
  impl->pool = std::make_unique<ContextPool>(*impl->driver, options.poolContextsPerDevice);
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Status Daemon::run(const std::atomic<bool>& stop) {
  Impl& d = *impl_;
  while (!stop.load() && !d.stopRequested) {
    std::vector<pollfd> fds;
    std::vector<uint64_t> owners;
    fds.push_back({d.listenFd, POLLIN, 0});
    owners.push_back(0);
    for (const auto& [id, client] : d.clients) {
      fds.push_back({client.pidfd, POLLIN, 0});
      owners.push_back(id);
    }
    int ready = poll(fds.data(), fds.size(), 200);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return errnoError(errno, "poll");
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) d.endSession(owners[i]);
    }
    if (fds[0].revents & POLLIN) {
      for (;;) {
        int fd = accept4(d.listenFd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) break;
        d.serveControl(fd);
      }
    }
  }
  return Status::ok();
}

}  // namespace phos::daemon
