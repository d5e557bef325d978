// SPDX-License-Identifier: Apache-2.0
// phosd's main process: the control socket and a pool of spare workers, one
// worker process per session (worker.h). It never loads the CUDA driver
// itself: NVIDIA's driver does not survive fork() after cuInit, and main forks
// every worker.
#include "phos/daemon/phosd.h"

#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "phos/common/ipc/control.h"
#include "phos/common/log.h"
#include "migration/migration.h"
#include "phos/net/channel.h"
#include "session/session.h"
#include "session/session_files.h"
#include "process/phosd_impl.h"
#include "process/worker.h"

namespace phos::daemon {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Whether the session that file `name` (phos-<pid>-<session>[-...]) belongs
// to is alive: its worker holds its ring file locked (CallRing::create). A
// restored session keeps the names of the worker it was saved from, whose pid
// is gone.
bool sessionAlive(std::string_view name) {
  size_t dash = name.find('-', 5);
  if (dash == std::string_view::npos) return false;
  return ringLocked(ipc::sessionDir() + "/" +
                    std::string(name.substr(0, name.find('-', dash + 1))));
}

// Removes phos-<owner>-... files of the session directory that belong to this user (root:
// anyone's), whose owner `gone` says is gone and whose session no live worker
// serves.
template <typename Gone>
void removeSessionFiles(Gone gone) {
  const std::string sessions = ipc::sessionDir();
  DIR* dir = opendir(sessions.c_str());
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    std::string_view name(e->d_name);
    if (!name.starts_with("phos-")) continue;
    std::string_view rest = name.substr(5);
    pid_t owner = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), owner);
    if (ec != std::errc() || end == rest.data() || *end != '-' || owner <= 0) continue;
    if (!gone(owner)) continue;
    struct stat st {};
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (geteuid() != 0 && st.st_uid != geteuid()) continue;
    if (sessionAlive(name)) continue;
    if (unlinkat(dirfd(dir), e->d_name, 0) == 0) {
      log::get("daemon")->info("removed {}/{}: left by phosd process {}, which is gone", sessions,
                               name, owner);
    }
  }
  closedir(dir);
}

// Files of a phosd that was killed (SIGKILL, a crash) stay in the session
// directory (/dev/shm unless --session-dir): rings,
// pinned memory, host-call queues, all named phos-<worker pid>-<session>...
// Removes those whose process is gone.
void removeStaleSessionFiles() {
  removeSessionFiles([](pid_t owner) { return owner != getpid() && kill(owner, 0) != 0 && errno == ESRCH; });
}

// Removes the session directory's <ring> and the files named after it (<ring>-pinned-N,
// <ring>-registered-N, <ring>-hostcalls).
void removeFilesOfRing(const std::string& ring) {
  const std::string sessions = ipc::sessionDir();
  DIR* dir = opendir(sessions.c_str());
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    std::string_view name(e->d_name);
    if (name == ring || (name.starts_with(ring) && name.substr(ring.size()).starts_with("-"))) {
      unlinkat(dirfd(dir), e->d_name, 0);
    }
  }
  closedir(dir);
}

std::string commandOf(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (auto& ch : raw) {
    if (ch == '\0') ch = ' ';
  }
  while (!raw.empty() && raw.back() == ' ') raw.pop_back();
  return raw;
}

// How long a restore waits behind another restore of its image.
constexpr std::chrono::seconds kImageWait{600};

}  // namespace

Daemon::Impl::~Impl() {
  stopMigrationListener();
  shutdownWorkers();
  waitingForWorker.clear();
  pendingControl.clear();
  if (listenFd) {
    listenFd.reset();
    // Only the socket it bound: never one a later daemon made there.
    struct stat st {};
    if (stat(socketPath.c_str(), &st) == 0 && st.st_dev == socketDevice && st.st_ino == socketInode) {
      unlink(socketPath.c_str());
    }
  }
  lockFd.reset();  // last: the directory is free once the socket is gone
}

Status Daemon::Impl::bind() {
  if (mkdir(runtimeDir.c_str(), 0700) != 0 && errno != EEXIST) {
    return errnoError(errno, fmt::format("cannot create {}", runtimeDir));
  }
  // Who holds the lock owns the directory: a second daemon leaves it, and
  // the socket, alone however busy the first one is.
  ASSIGN_OR_RETURN(lockFd, ipc::lockDaemonDirectory(runtimeDir));
  unlink(socketPath.c_str());  // a dead daemon's
  listenFd.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listenFd) return errnoError(errno, "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socketPath.size() >= sizeof(addr.sun_path)) {
    return makeError(Code::kInvalidArgument, "socket path {} is too long", socketPath);
  }
  std::memcpy(addr.sun_path, socketPath.c_str(), socketPath.size() + 1);
  if (::bind(listenFd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return errnoError(errno, fmt::format("cannot bind {}", socketPath));
  }
  struct stat st {};
  if (stat(socketPath.c_str(), &st) != 0) return errnoError(errno, fmt::format("stat {}", socketPath));
  socketDevice = st.st_dev;
  socketInode = st.st_ino;
  // Anyone may connect; every request is checked against SO_PEERCRED.
  chmod(socketPath.c_str(), 0666);
  if (listen(listenFd.get(), 64) != 0) return errnoError(errno, "listen");
  return Status::ok();
}

void Daemon::Impl::closeMainDescriptors() {
  listenFd.reset();
  lockFd.reset();  // a record lock is the process's: the child holds none
  pendingControl.clear();
  workers.clear();
  waitingForWorker.clear();
  waiting.clear();  // clients' connections that answers to workers' replies hold (attach, ps)
}

Status Daemon::Impl::forkWorker() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return errnoError(errno, "socketpair for a worker");
  }
  UniqueFd mainEnd(sv[0]), workerEnd(sv[1]);
  pid_t pid = fork();
  if (pid < 0) return errnoError(errno, "fork of a worker");
  if (pid == 0) {
    mainEnd.reset();
    closeMainDescriptors();
    runWorker(workerConfig, workerEnd.release());
  }
  workerEnd.reset();
  WorkerHandle w;
  w.pid = pid;
  w.channel = std::move(mainEnd);
  w.pidfd.reset(pidfdOpen(pid));
  if (!w.pidfd) {
    int e = errno;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return errnoError(e, fmt::format("cannot watch worker {}", pid));
  }
  workers.emplace(pid, std::move(w));
  log::get("daemon")->debug("worker {} started", pid);
  return Status::ok();
}

int Daemon::Impl::countIn(std::initializer_list<WorkerHandle::State> states) const {
  int n = 0;
  for (const auto& [pid, w] : workers) {
    if (std::find(states.begin(), states.end(), w.state) != states.end()) ++n;
  }
  return n;
}

WorkerHandle* Daemon::Impl::spare() {
  for (auto& [pid, w] : workers) {
    if (w.state == WorkerHandle::State::kSpare) return &w;
  }
  return nullptr;
}

void Daemon::Impl::keepSpares() {
  const int needed = options.spareWorkers + static_cast<int>(waitingForWorker.size());
  int have = countIn({WorkerHandle::State::kStarting, WorkerHandle::State::kSpare});
  while (have < needed && Clock::now() >= nextForkAllowed) {
    if (Status s = forkWorker(); !s.isOk()) {
      log::get("daemon")->error("{}", s.message());
      noteWorkerFailure(s.message());
      return;
    }
    ++have;
  }
}

void Daemon::Impl::noteWorkerFailure(const std::string& why) {
  lastWorkerFailure = why;
  using std::chrono::milliseconds;
  forkBackoff = std::min<milliseconds>(std::max<milliseconds>(forkBackoff * 2, milliseconds(250)),
                                       std::chrono::seconds(30));
  nextForkAllowed = Clock::now() + forkBackoff;
  // Nobody waits for a worker that cannot start: tell them now.
  if (countIn({WorkerHandle::State::kStarting, WorkerHandle::State::kSpare}) == 0) {
    while (!waitingForWorker.empty()) {
      WaitingClient c = std::move(waitingForWorker.front());
      waitingForWorker.pop_front();
      answerAndClose(std::move(c.connection), refusal(fmt::format("no phosd worker could start: {}", why)));
    }
  }
}

Status Daemon::Impl::tell(WorkerHandle& w, const json& message, int fd) {
  // Never blocks main: a worker that does not read its channel is broken.
  return detail::sendMessage(w.channel.get(), message, fd, /*wait=*/false);
}

void Daemon::Impl::ask(WorkerHandle& w, json message, std::chrono::milliseconds timeout, std::function<void(const json*)> done) {
  const uint64_t id = ++nextRequest;
  message["id"] = id;
  if (Status s = tell(w, message); !s.isOk()) {
    log::get("daemon")->warn("worker {}: {}", w.pid, s.message());
    done(nullptr);
    return;
  }
  waiting.emplace(id, Waiting{w.pid, Clock::now() + timeout, std::move(done)});
}

void Daemon::Impl::endWorker(WorkerHandle& w) {
  w.clientPidfd.reset();
  if (w.state == WorkerHandle::State::kEnding) return;
  w.state = WorkerHandle::State::kEnding;
  if (Status s = tell(w, {{"op", "end"}}); !s.isOk()) {
    log::get("daemon")->warn("worker {} does not listen ({}); killing it", w.pid, s.message());
    kill(w.pid, SIGKILL);
  }
}

void Daemon::Impl::onWorkerMessage(WorkerHandle& w, const json& m) {
  auto log = log::get("daemon");
  if (m.contains("reply_to")) {
    auto it = waiting.find(m.value("reply_to", uint64_t{0}));
    if (it == waiting.end() || it->second.worker != w.pid) return;  // answered too late
    auto done = std::move(it->second.done);
    waiting.erase(it);
    done(&m);
    return;
  }
  const std::string event = m.value("event", "");
  if (event == "ready") {
    if (w.state != WorkerHandle::State::kStarting) return;
    w.state = WorkerHandle::State::kSpare;
    w.pool = m.value("pool", json::array());
    w.misses = m.value("misses", uint64_t{0});
    if (driverPath.empty()) {
      driverPath = m.value("driver", std::string());
      driverVersion = m.value("version", 0);
      deviceCount = static_cast<int>(w.pool.size());
    }
    forkBackoff = std::chrono::milliseconds(0);
    log->debug("worker {} ready", w.pid);
    serveWaitingClients();
  } else if (event == "failed") {
    w.failure = m.value("error", std::string());
  } else if (event == "pool") {
    w.pool = m.value("pool", json::array());
    w.misses = m.value("misses", uint64_t{0});
  } else if (event == "restored") {
    if (w.state != WorkerHandle::State::kRestoring) return;
    w.clientPid = m.value("pid", pid_t{0});
    w.uid = m.value("uid", uid_t{0});
    w.ring = m.value("ring", std::string());
  } else if (m.value("op", "") == "adopt") {
    json answer = adopt(w, m);
    answer["reply_to"] = m.value("id", uint64_t{0});
    if (Status s = tell(w, answer); !s.isOk()) log->warn("worker {}: {}", w.pid, s.message());
  } else {
    log->warn("worker {}: unknown message {}", w.pid, m.dump());
  }
}

json Daemon::Impl::adopt(WorkerHandle& w, const json& m) {
  const auto pid = m.value("pid", pid_t{0});
  // "was": the pid the session was saved with, when the restored process
  // has another (the worker checked that it maps the session's ring).
  const auto was = m.value("was", pid);
  if (w.state != WorkerHandle::State::kRestoring || pid <= 0 || was != w.clientPid) {
    return refusal(fmt::format("worker {} restored no session for pid {}", w.pid, was));
  }
  UniqueFd pidfd(pidfdOpen(pid));
  if (!pidfd) return refusal(fmt::format("cannot watch pid {}: {}", pid, std::strerror(errno)));
  struct stat st {};
  if (stat(fmt::format("/proc/{}", pid).c_str(), &st) != 0 || st.st_uid != w.uid) {
    return refusal(fmt::format("pid {} is not a process of uid {}, whose session was restored", pid, w.uid));
  }
  w.clientPidfd = std::move(pidfd);
  w.clientPid = pid;
  w.command = commandOf(pid);
  w.state = WorkerHandle::State::kServing;
  w.image.clear();
  log::get("daemon")->info("session {}: restored pid {} uid {} ({}) in worker {}", w.session, pid, w.uid,
                           w.command, w.pid);
  serveWaitingClients();  // a restore of the same image may start now
  return {{"ok", true}};
}

bool Daemon::Impl::drainChannel(pid_t pid) {
  for (;;) {
    auto it = workers.find(pid);
    if (it == workers.end()) return false;
    bool empty = false;
    auto message = detail::receiveMessage(it->second.channel.get(), /*wait=*/false, &empty);
    if (!message.isOk()) {
      if (empty) return true;
      if (message.status().code() == Code::kUnavailable) return false;
      log::get("daemon")->warn("worker {}: {}", pid, message.status().message());
      continue;
    }
    onWorkerMessage(it->second, message->body);
  }
}

void Daemon::Impl::onWorkerExit(pid_t pid) {
  drainChannel(pid);
  auto it = workers.find(pid);
  if (it == workers.end()) return;
  WorkerHandle w = std::move(it->second);
  workers.erase(it);
  auto log = log::get("daemon");
  // The exit status without reaping: until it is reaped, no other process
  // can get its pid (and name files after it).
  siginfo_t info{};
  while (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  const bool clean = info.si_code == CLD_EXITED && info.si_status == 0;
  if (!clean) {
    // A worker that ended normally removed its session's files itself; one
    // that crashed, was killed or could not stop its session left them.
    removeSessionFiles([pid](pid_t owner) { return owner == pid; });
    // A restored session keeps the file names of the worker it was saved
    // from; removed unless another worker serves a session of that name.
    const std::string sessions = ipc::sessionDir() + "/";
    if (!w.ring.starts_with(sessions + "phos-" + std::to_string(pid) + "-") &&
        w.ring.starts_with(sessions + "phos-")) {
      bool claimed = false;
      for (const auto& [other, ow] : workers) claimed = claimed || ow.ring == w.ring;
      if (!claimed) removeFilesOfRing(w.ring.substr(sessions.size()));
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string how = WIFSIGNALED(status) ? fmt::format("was killed by signal {}", WTERMSIG(status))
                                        : fmt::format("exited with status {}", WEXITSTATUS(status));
  retiredContextMisses += w.misses;
  switch (w.state) {
    case WorkerHandle::State::kStarting: {
      std::string why = !w.failure.empty() ? w.failure : fmt::format("worker {} {} before it was ready", pid, how);
      log->error("worker {}: {}", pid, why);
      noteWorkerFailure(why);
      break;
    }
    case WorkerHandle::State::kEnding:
    case WorkerHandle::State::kSpare:
      if (w.session != 0) {
        log->info("session {}: worker {} {}", w.session, pid, how);
      } else if (w.state == WorkerHandle::State::kSpare) {
        log->warn("spare worker {} {}", pid, how);
      }
      break;
    case WorkerHandle::State::kRestoring:
      log->info("session {}: restore ended (failed or abandoned); worker {} {}", w.session, pid, how);
      break;
    default:
      // Its client's calls fail from now on: the ring's owner is gone.
      log->error("session {}: worker {} serving pid {} {}; the session is lost", w.session, pid, w.clientPid, how);
      break;
  }
  w.clientPidfd.reset();
  w.channel.reset();
  w.pidfd.reset();
  serveWaitingClients();  // restores that waited for it to end
  for (auto r = waiting.begin(); r != waiting.end();) {
    if (r->second.worker != pid) {
      ++r;
      continue;
    }
    auto done = std::move(r->second.done);
    r = waiting.erase(r);
    done(nullptr);
  }
}

void Daemon::Impl::onClientExit(pid_t workerPid) {
  auto it = workers.find(workerPid);
  if (it == workers.end()) return;
  WorkerHandle& w = it->second;
  log::get("daemon")->info("session {}: pid {} exited; worker {} ends the session", w.session, w.clientPid,
                           w.pid);
  endWorker(w);
}

void Daemon::Impl::serveWaitingClients() {
  for (auto c = waitingForWorker.begin(); c != waitingForWorker.end();) {
    WorkerHandle* w = spare();
    if (w == nullptr) return;
    if (c->kind == WaitingClient::Kind::kRestore && (!restoreMayStart() || imageBeingRestored(*c))) {
      ++c;
      continue;
    }
    WaitingClient client = std::move(*c);
    c = waitingForWorker.erase(c);
    if (client.kind == WaitingClient::Kind::kAttach) {
      startAttach(*w, client);
    } else {
      startRestore(*w, client);
    }
  }
}

void Daemon::Impl::startAttach(WorkerHandle& w, WaitingClient& c) {
  const uint64_t id = ++nextSession;
  const pid_t pid = c.peer.pid;
  w.state = WorkerHandle::State::kAssigned;
  w.session = id;
  w.clientPid = pid;
  w.uid = c.peer.uid;
  w.clientPidfd = std::move(c.pidfd);  // watched from now on: a client dying meanwhile ends the worker
  // The answer waits for the worker (ask's callbacks are copied): shared.
  auto client = std::make_shared<UniqueFd>(std::move(c.connection));
  const pid_t workerPid = w.pid;
  json assign = {{"op", "assign"}, {"session", id}, {"pid", pid}, {"uid", c.peer.uid}};
  if (c.request.contains("validate") && c.request["validate"].is_boolean()) {
    assign["validate"] = c.request["validate"];
  }
  ask(w, assign, std::chrono::seconds(10),
      [this, client, workerPid, id, pid](const json* answer) {
        auto it = workers.find(workerPid);
        WorkerHandle* assigned = it == workers.end() ? nullptr : &it->second;
        if (answer == nullptr || !answer->value("ok", false) || assigned == nullptr ||
            assigned->state != WorkerHandle::State::kAssigned) {
          std::string why = answer == nullptr ? fmt::format("worker {} did not create the session", workerPid)
                            : !answer->value("ok", false)
                                ? answer->value("error", std::string("the worker refused"))
                                : fmt::format("pid {} exited while its session was created", pid);
          log::get("daemon")->warn("session {}: attach of pid {} failed: {}", id, pid, why);
          if (assigned != nullptr) endWorker(*assigned);
          answerAndClose(std::move(*client), refusal(why));
          return;
        }
        assigned->state = WorkerHandle::State::kServing;
        assigned->ring = answer->value("ring", std::string());
        assigned->command = commandOf(pid);
        log::get("daemon")->info("session {}: pid {} uid {} ({}) in worker {}", id, pid, assigned->uid,
                                 assigned->command, workerPid);
        answerAndClose(std::move(*client), {{"ok", true}, {"session", id}, {"ring", assigned->ring},
                                            {"daemon_pid", getpid()}, {"worker_pid", workerPid}});
      });
}

void Daemon::Impl::startRestore(WorkerHandle& w, WaitingClient& c) {
  const uint64_t id = ++nextSession;
  w.state = WorkerHandle::State::kRestoring;
  w.session = id;
  w.image = c.image;
  log::get("daemon")->info("session {}: restore of {} in worker {}", id, c.request.value("image", std::string()),
                           w.pid);
  Status s = tell(w, {{"op", "restore"}, {"session", id}, {"peer_uid", c.peer.uid}, {"request", c.request}},
                  c.connection.get());
  if (!s.isOk()) {
    answerAndClose(std::move(c.connection),
                   refusal(fmt::format("cannot hand the restore to worker {}: {}", w.pid, s.message())));
    endWorker(w);
  }
  // (Otherwise the worker has its own copy of the connection and answers the client.)
}

bool Daemon::Impl::imageBeingRestored(const WaitingClient& c) const {
  if (c.kind != WaitingClient::Kind::kRestore) return false;
  for (const auto& [pid, w] : workers) {
    if (w.state == WorkerHandle::State::kRestoring && w.image == c.image) return true;
  }
  return false;
}

void Daemon::Impl::startOrQueue(WaitingClient c) {
  WorkerHandle* w = spare();
  if (w != nullptr &&
      (c.kind == WaitingClient::Kind::kAttach || (restoreMayStart() && !imageBeingRestored(c)))) {
    if (c.kind == WaitingClient::Kind::kAttach) {
      startAttach(*w, c);
    } else {
      startRestore(*w, c);
    }
    return;
  }
  if (w == nullptr) ++workerMisses;
  // Behind another restore of its image: as long as a restore may take.
  c.deadline = Clock::now() + (imageBeingRestored(c) ? kImageWait : options.workerWait);
  waitingForWorker.push_back(std::move(c));
  keepSpares();
}

void Daemon::Impl::expire() {
  const auto now = Clock::now();
  for (auto c = pendingControl.begin(); c != pendingControl.end();) {
    if (c->second.deadline > now) {
      ++c;
      continue;
    }
    UniqueFd client = std::move(c->second.connection);
    const ucred peer = c->second.peer;
    c = pendingControl.erase(c);
    serveControl(std::move(client), peer, nullptr);
  }
  for (auto r = waiting.begin(); r != waiting.end();) {
    if (r->second.deadline > now) {
      ++r;
      continue;
    }
    auto done = std::move(r->second.done);
    r = waiting.erase(r);
    done(nullptr);
  }
  for (auto c = waitingForWorker.begin(); c != waitingForWorker.end();) {
    if (c->deadline > now || !imageBeingRestored(*c)) {
      ++c;
      continue;
    }
    answerAndClose(std::move(c->connection), json{{"ok", false},
                               {"code", ipc::kBusy},
                               {"error", fmt::format("{} is still being restored by another request after {} s",
                                                     c->image, kImageWait.count())}});
    c = waitingForWorker.erase(c);
  }
  for (auto it = waitingForWorker.begin(); it != waitingForWorker.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    WaitingClient c = std::move(*it);
    it = waitingForWorker.erase(it);
    std::string why = fmt::format("no phosd worker became ready within {} s ({} starting{})",
                                  options.workerWait.count(), countIn({WorkerHandle::State::kStarting}),
                                  lastWorkerFailure.empty() ? "" : "; the last one failed: " + lastWorkerFailure);
    log::get("daemon")->error("{}", why);
    answerAndClose(std::move(c.connection), refusal(why));
  }
}

Status Daemon::Impl::pollOnce(bool accept, std::chrono::milliseconds timeout) {
  if (accept) keepSpares();
  std::vector<pollfd> fds;
  enum class Kind { kListen, kChannel, kWorkerExit, kClientExit, kControl };
  std::vector<std::pair<Kind, pid_t>> owners;
  if (accept) {
    fds.push_back({listenFd.get(), POLLIN, 0});
    owners.emplace_back(Kind::kListen, 0);
    for (const auto& [fd, c] : pendingControl) {
      fds.push_back({fd, POLLIN, 0});
      owners.emplace_back(Kind::kControl, fd);
    }
  }
  for (const auto& [pid, w] : workers) {
    fds.push_back({w.channel.get(), POLLIN, 0});
    owners.emplace_back(Kind::kChannel, pid);
    fds.push_back({w.pidfd.get(), POLLIN, 0});
    owners.emplace_back(Kind::kWorkerExit, pid);
    if (w.clientPidfd) {
      fds.push_back({w.clientPidfd.get(), POLLIN, 0});
      owners.emplace_back(Kind::kClientExit, pid);
    }
  }
  auto wait = timeout;
  const auto now = Clock::now();
  auto sooner = [&](Clock::time_point t) {
    wait = std::min(wait, std::max(std::chrono::milliseconds(0),
                                   std::chrono::duration_cast<std::chrono::milliseconds>(t - now)));
  };
  for (const auto& [id, w] : waiting) sooner(w.deadline);
  for (const WaitingClient& c : waitingForWorker) sooner(c.deadline);
  if (accept) {
    for (const auto& [fd, c] : pendingControl) sooner(c.deadline);
  }
  if (nextForkAllowed > now) sooner(nextForkAllowed);
  int ready = poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  if (ready < 0) {
    if (errno == EINTR) return Status::ok();
    return errnoError(errno, "poll");
  }
  // Messages first: a worker's last words come before its exit is handled.
  for (size_t i = 0; i < fds.size(); ++i) {
    if (owners[i].first == Kind::kChannel && fds[i].revents != 0) drainChannel(owners[i].second);
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    if (owners[i].first == Kind::kWorkerExit) onWorkerExit(owners[i].second);
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0 || owners[i].first != Kind::kClientExit) continue;
    auto it = workers.find(owners[i].second);
    if (it != workers.end() && it->second.clientPidfd.get() == fds[i].fd) onClientExit(owners[i].second);
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents != 0 && owners[i].first == Kind::kControl) readControl(owners[i].second);
  }
  expire();
  if (accept && (fds[0].revents & POLLIN) != 0) {
    for (;;) {
      UniqueFd client(accept4(listenFd.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!client) break;
      acceptControl(std::move(client));
    }
  }
  return Status::ok();
}

Status Daemon::Impl::waitForFirstWorker() {
  const auto deadline = Clock::now() + options.workerWait;
  while (Clock::now() < deadline) {
    if (countIn({WorkerHandle::State::kSpare}) > 0) return Status::ok();
    if (countIn({WorkerHandle::State::kStarting}) == 0) {
      return makeError(Code::kUnavailable, "{}",
                       lastWorkerFailure.empty() ? std::string("no phosd worker started") : lastWorkerFailure);
    }
    RETURN_IF_ERROR(pollOnce(/*accept=*/false, std::chrono::milliseconds(200)));
  }
  return makeError(Code::kUnavailable, "no phosd worker loaded the driver {} within {} s", workerConfig.driverPath,
                   options.workerWait.count());
}

void Daemon::Impl::shutdownWorkers() {
  for (auto& [pid, w] : workers) endWorker(w);
  const auto deadline = Clock::now() + kShutdownBound;
  while (!workers.empty() && Clock::now() < deadline) {
    if (!pollOnce(/*accept=*/false, std::chrono::milliseconds(100)).isOk()) break;
  }
  for (auto& [pid, w] : workers) {
    log::get("daemon")->warn("worker {} (session {}) did not exit within {} s; killing it", pid, w.session,
                             kShutdownBound.count());
    kill(pid, SIGKILL);
  }
  while (!workers.empty()) onWorkerExit(workers.begin()->first);
}

void Daemon::Impl::stopMigrationListener() {
  if (migrationListener <= 0) return;
  kill(migrationListener, SIGKILL);
  while (waitpid(migrationListener, nullptr, 0) < 0 && errno == EINTR) {
  }
  migrationListener = -1;
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() = default;

const std::string& Daemon::socketPath() const { return impl_->socketPath; }
const std::string& Daemon::driverPath() const { return impl_->driverPath; }

Result<std::unique_ptr<Daemon>> Daemon::start(const DaemonOptions& options) {
  if (options.spareWorkers < 0 || options.contextsPerDevice < 0) {
    return makeError(Code::kInvalidArgument, "spare workers ({}) and contexts per device ({}) must be >= 0",
                     options.spareWorkers, options.contextsPerDevice);
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->runtimeDir = options.runtimeDir.empty() ? ipc::runtimeDir() : options.runtimeDir;
  impl->socketPath = ipc::controlSocketPath(impl->runtimeDir);
  DriverChoice choice = chooseDriver(options.driver);
  if (choice.path.empty()) return makeError(Code::kNotFound, "no CUDA driver: no GPU, and this build has no vgpu");
  if (!options.signatures.empty()) {
    // Loaded before the workers fork: each inherits it.
    auto db = instrument::SignatureDatabase::load(options.signatures);
    if (!db.isOk()) {
      return makeError(Code::kInvalidArgument, "signature database {}: {}", options.signatures,
                       db.status().message());
    }
    log::get("daemon")->info("signature database {}: {} kernel(s)", options.signatures, db->size());
    setSignatureDatabase(std::make_shared<const instrument::SignatureDatabase>(std::move(*db)));
  }
  RETURN_IF_ERROR(impl->bind());
  if (!options.keyFile.empty()) {
    auto key = net::Key::load(options.keyFile);
    if (!key.isOk()) return makeError(Code::kInvalidArgument, "{}", key.status().message());
    impl->key = std::move(*key);
  }
  if (!options.listen.empty()) {
    if (!impl->key) {
      return makeError(Code::kInvalidArgument,
                       "--listen needs --key FILE: migrations are accepted only from peers that hold the key");
    }
    // Forked before any worker, while this process has no other thread.
    auto listener = migration::startListener({options.listen, *impl->key, impl->runtimeDir});
    if (!listener.isOk()) return makeError(Code::kInvalidArgument, "{}", listener.status().message());
    impl->migrationListener = *listener;
  }
  removeStaleSessionFiles();
  impl->workerConfig = {getpid(), choice.path, impl->runtimeDir, options.contextsPerDevice, options.ring, options.cli};
  // The first worker says whether the driver loads at all; with --pool 0 it
  // only does that.
  RETURN_IF_ERROR(impl->forkWorker());
  RETURN_IF_ERROR(impl->waitForFirstWorker());
  if (options.spareWorkers == 0) {
    if (WorkerHandle* w = impl->spare()) impl->endWorker(*w);
  }
  log::get("daemon")->info("driver {} ({}), version {}; {} spare worker(s) with {} context(s) per device",
                           impl->driverPath, choice.reason, impl->driverVersion, options.spareWorkers,
                           options.contextsPerDevice);
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Status Daemon::run(const std::atomic<bool>& stop) {
  Impl& d = *impl_;
  while (!stop.load() && !d.stopRequested) {
    RETURN_IF_ERROR(d.pollOnce(/*accept=*/true, std::chrono::milliseconds(200)));
  }
  d.stopMigrationListener();
  d.shutdownWorkers();
  return Status::ok();
}

}  // namespace phos::daemon
