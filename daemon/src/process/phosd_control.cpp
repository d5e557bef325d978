// SPDX-License-Identifier: Apache-2.0
// phosd's control socket (phos/common/ipc/control.h): connections read as
// their bytes arrive, each request line answered by main itself (ps, ping,
// stop, validate, ...) or handed to the worker of its session (checkpoint)
// or to a spare worker (attach, restore). Who asks (SO_PEERCRED) decides what
// it may see and do (docs/security.md).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "phos/common/ipc/control.h"
#include "phos/common/log.h"
#include "process/phosd_impl.h"
#include "session/session.h"

namespace phos::daemon {

namespace {

// Which image a restore request names, for telling two restores of one image
// apart: its canonical path when it resolves (the worker opens it safely later).

std::string restoreKey(const json& request) {
  const std::string given = request.value("image", std::string());
  std::unique_ptr<char, decltype(&free)> resolved(realpath(given.c_str(), nullptr), &free);
  return resolved ? std::string(resolved.get()) : given;
}

const char* stateName(WorkerHandle::State s) {
  switch (s) {
    case WorkerHandle::State::kStarting: return "starting";
    case WorkerHandle::State::kSpare: return "spare";
    case WorkerHandle::State::kAssigned: return "assigned";
    case WorkerHandle::State::kServing: return "serving";
    case WorkerHandle::State::kRestoring: return "restoring";
    case WorkerHandle::State::kEnding: return "ending";
  }
  return "?";
}

}  // namespace

json Daemon::Impl::sessionJson(const WorkerHandle& w) const {
  // What main knows; the worker's answer fills in the rest. Without one
  // (the worker did not answer in time) the counters stay 0 and "busy" true.
  return json{{"session", w.session}, {"pid", w.clientPid}, {"uid", w.uid}, {"command", w.command},
              {"worker_pid", w.pid}, {"device_bytes", 0}, {"allocations", 0}, {"pinned_bytes", 0},
              {"modules", 0}, {"contexts", 0}, {"calls", 0}, {"launches", 0}, {"kernels", json::array()},
              {"busy", true}};
}

void Daemon::Impl::answerPs(UniqueFd client, const ucred& peer) {
  struct Gather {
    UniqueFd client;
    std::map<uint64_t, json> sessions;
    int outstanding = 0;
    void finish() {
      json list = json::array();
      for (auto& [id, s] : sessions) list.push_back(std::move(s));
      answerAndClose(std::move(client), {{"ok", true}, {"sessions", list}});
    }
  };
  auto gather = std::make_shared<Gather>();
  gather->client = std::move(client);
  std::vector<pid_t> asked;
  for (auto& [pid, w] : workers) {
    if (w.state != WorkerHandle::State::kServing) continue;
    if (peer.uid != 0 && peer.uid != w.uid) continue;
    gather->sessions.emplace(w.session, sessionJson(w));
    asked.push_back(pid);
  }
  gather->outstanding = static_cast<int>(asked.size());
  if (asked.empty()) {
    gather->finish();
    return;
  }
  for (pid_t pid : asked) {
    const uint64_t id = workers.at(pid).session;
    // Short: Session::info() answers even while a call runs.
    ask(workers.at(pid), {{"op", "info"}}, std::chrono::seconds(1), [gather, id](const json* answer) {
      if (answer != nullptr && answer->contains("session") && (*answer)["session"].is_object()) {
        json& entry = gather->sessions[id];
        for (const auto& [key, value] : (*answer)["session"].items()) entry[key] = value;
      }
      if (--gather->outstanding == 0) gather->finish();
    });
  }
}

json Daemon::Impl::pingAnswer() const {
  // Spare workers' contexts: those an attach or a restore gets at once.
  std::vector<int> free(static_cast<size_t>(deviceCount), 0);
  json list = json::array();
  uint64_t misses = workerMisses + retiredContextMisses;
  for (const auto& [pid, w] : workers) {
    misses += w.misses;
    list.push_back({{"pid", pid}, {"state", stateName(w.state)}, {"session", w.session}});
    if (w.state != WorkerHandle::State::kSpare) continue;
    for (const auto& s : w.pool) {
      const int device = s.value("device", -1);
      if (device >= 0 && device < deviceCount) free[static_cast<size_t>(device)] += s.value("free", 0);
    }
  }
  json pools = json::array();
  for (int d = 0; d < deviceCount; ++d) {
    pools.push_back({{"device", d}, {"free", free[static_cast<size_t>(d)]},
                     {"target", options.spareWorkers * options.contextsPerDevice}});
  }
  return {{"ok", true},
          {"daemon_pid", getpid()},
          {"driver", driverPath},
          {"driver_version", driverVersion},
          {"pool", pools},
          {"pool_misses", misses},
          {"spare_workers", countIn({WorkerHandle::State::kSpare})},
          {"spare_target", options.spareWorkers},
          {"workers", list},
          {"sessions", countIn({WorkerHandle::State::kServing})}};
}

std::optional<json> Daemon::Impl::handle(const json& request, const ucred& peer, UniqueFd& client) {
  if (!request.is_object() || !request.contains("op") || !request["op"].is_string()) {
    return refusal("a request is a JSON object with a string \"op\"");
  }
  const std::string op = request["op"];
  if (op == "ping") return pingAnswer();
  if (op == "ps") {
    answerPs(std::move(client), peer);
    return std::nullopt;
  }
  if (op == "stop") {
    if (peer.uid != 0 && peer.uid != geteuid()) {
      return refusal(fmt::format("uid {} may not stop this daemon", peer.uid));
    }
    stopRequested = true;
    return json{{"ok", true}};
  }
  if (op == "attach") {
    if (!request.contains("pid") || !request["pid"].is_number_integer()) {
      return refusal("attach needs an integer \"pid\"");
    }
    // Compared before narrowing to pid_t: 2^32 + pid must not pass as pid.
    const auto named = request["pid"].get<int64_t>();
    // A process attaches itself: a session serves the memory of the process
    // that connected, never one it names. In a container it names itself as
    // its own PID namespace numbers it (docs/containers.md); the session is
    // the connecting process's as phosd numbers it.
    auto ownView = pidInOwnNamespace(peer.pid);
    if (named != static_cast<int64_t>(peer.pid) &&
        (!ownView.isOk() || named != static_cast<int64_t>(*ownView))) {
      return refusal(fmt::format("pid {} is not the connecting process ({})", named, peer.pid));
    }
    UniqueFd pidfd(pidfdOpen(peer.pid));
    if (!pidfd) return refusal(fmt::format("cannot watch pid {}: {}", peer.pid, std::strerror(errno)));
    startOrQueue({WaitingClient::Kind::kAttach, std::move(client), peer, request, std::move(pidfd), {}});
    return std::nullopt;
  }
  json migrate;
  if (op == "migrate") {
    if (!request.contains("to") || !request["to"].is_string() || request["to"].get<std::string>().empty()) {
      return refusal("migrate needs a string \"to\" (HOST:PORT)");
    }
    for (const char* field : {"mode", "compress"}) {
      if (request.contains(field) && !request[field].is_string()) {
        return refusal(fmt::format("migrate: \"{}\" must be a string", field));
      }
    }
    std::string keyHex;
    if (request.contains("key")) {
      if (!request["key"].is_string() || !net::Key::fromHex(request["key"].get<std::string>()).isOk()) {
        return refusal("migrate: \"key\" must be the key in hex (at least 16 bytes)");
      }
      keyHex = request["key"].get<std::string>();
    } else if (key) {
      keyHex = key->hex();
    } else {
      return json{{"ok", false}, {"code", wireCode(Code::kInvalidArgument)},
                  {"error", "this daemon has no key to prove to the target: start it with --key FILE, or pass "
                            "phos migrate --key FILE"}};
    }
    migrate = {{"to", request["to"]}, {"key", keyHex}, {"compress", request.value("compress", "zstd") != "none"}};
  }
  if (op == "checkpoint" || op == "validation" || op == "migrate") {
    if (!request.contains("pid") || !request["pid"].is_number_integer()) {
      return refusal(op + " needs an integer \"pid\"");
    }
    const auto named = request["pid"].get<int64_t>();
    WorkerHandle* w = nullptr;
    for (auto& [pid, candidate] : workers) {
      if (candidate.state == WorkerHandle::State::kServing && static_cast<int64_t>(candidate.clientPid) == named) {
        w = &candidate;
      }
    }
    if (w == nullptr) {
      return json{{"ok", false}, {"code", ipc::kNoSession},
                  {"error", fmt::format("pid {} has no PhOS session in this phosd", named)}};
    }
    if (peer.uid != 0 && peer.uid != w->uid) {
      return json{{"ok", false}, {"code", wireCode(Code::kPermissionDenied)},
                  {"error", fmt::format("uid {} may not {} pid {} (a process of uid {})", peer.uid,
                                        op == "validation" ? "inspect the validation of" : op, named, w->uid)}};
    }
    if (op == "validation") {
      if (Status s = tell(*w, {{"op", "validation"}, {"request", request}}, client.get()); !s.isOk()) {
        return refusal(fmt::format("cannot ask worker {}: {}", w->pid, s.message()));
      }
      client.reset();  // the worker answers on its own copy
      return std::nullopt;
    }
    json forwarded = request;
    forwarded["peer_uid"] = peer.uid;  // the image is written for this user (engine.cpp)
    if (op == "migrate") {
      // The image is only the vehicle: phosd's own, in its runtime directory.
      forwarded = {{"op", "checkpoint"},
                   {"pid", named},
                   {"image", fmt::format("{}/migrations/out-{}-{}", runtimeDir, named,
                                         std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count())},
                   {"mode", request.value("mode", std::string("recopy"))},
                   {"leave_running", false},
                   {"peer_uid", peer.uid},
                   {"migrate", migrate}};
    }
    if (Status s = tell(*w, {{"op", "checkpoint"}, {"request", forwarded}}, client.get()); !s.isOk()) {
      return refusal(fmt::format("cannot hand the checkpoint to worker {}: {}", w->pid, s.message()));
    }
    log::get("daemon")->info("session {}: {} asked by uid {}", w->session, op, peer.uid);
    client.reset();  // the worker answers on its own copy
    return std::nullopt;
  }
  if (op == "restore") {
    if (!request.contains("image") || !request["image"].is_string() || request["image"].get<std::string>().empty()) {
      return refusal("restore needs a non-empty string \"image\"");
    }
    if (request.contains("eager") && !request["eager"].is_boolean()) {
      return refusal("restore: \"eager\" must be true or false");
    }
    startOrQueue({WaitingClient::Kind::kRestore, std::move(client), peer, request, {}, {}, restoreKey(request)});
    return std::nullopt;
  }
  return refusal(fmt::format("unknown op \"{}\"", op));
}

void Daemon::Impl::acceptControl(UniqueFd client) {
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (getsockopt(client.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) return;
  if (pendingControl.size() >= kMaxPendingControl) {
    auto oldest = std::min_element(pendingControl.begin(), pendingControl.end(), [](const auto& a, const auto& b) {
      return a.second.deadline < b.second.deadline;
    });
    pendingControl.erase(oldest);  // closes it
  }
  const int fd = client.get();
  pendingControl[fd] = {std::move(client), peer, {}, Clock::now() + kControlLineBound};
  readControl(fd);  // its request may be there already
}

void Daemon::Impl::readControl(int fd) {
  auto it = pendingControl.find(fd);
  if (it == pendingControl.end()) return;
  PendingControl& c = it->second;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // more later
    if (n < 0) {
      pendingControl.erase(it);  // closes it
      return;
    }
    if (n == 0) {  // the client finished sending without a whole line
      PendingControl done = std::move(c);
      pendingControl.erase(it);
      serveControl(std::move(done.connection), done.peer, nullptr);
      return;
    }
    const size_t searched = c.line.size();
    c.line.append(buf, static_cast<size_t>(n));
    if (auto nl = c.line.find('\n', searched); nl != std::string::npos) {
      c.line.resize(nl);
      break;
    }
    if (c.line.size() > ipc::kMaxControlMessage) break;
  }
  PendingControl done = std::move(c);
  pendingControl.erase(it);
  serveControl(std::move(done.connection), done.peer,
               done.line.size() <= ipc::kMaxControlMessage ? &done.line : nullptr);
}

void Daemon::Impl::serveControl(UniqueFd client, const ucred& peer, const std::string* line) {
  const int fd = client.get();
  // Answers are written blocking, bounded: a client that never reads
  // cannot hold the daemon longer than that.
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::optional<json> answer;
  if (line == nullptr) {
    answer = refusal("a request is one line of at most 1 MiB, sent within 2 s");
  } else {
    json request = json::parse(*line, nullptr, /*allow_exceptions=*/false);
    if (request.is_discarded()) {
      answer = refusal("the request is not valid JSON");
    } else {
      try {
        answer = handle(request, peer, client);
      } catch (const std::exception& e) {  // a JSON value of the wrong type
        answer = refusal(fmt::format("bad request: {}", e.what()));
      }
    }
  }
  if (answer) answerAndClose(std::move(client), *answer);
}

}  // namespace phos::daemon
