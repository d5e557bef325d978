// SPDX-License-Identifier: Apache-2.0
// A phosd worker process (worker.h): its driver, context pool and session,
// and the checkpoint and restore it runs for main.
#include "process/worker.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "phos/common/ipc/control.h"
#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "protocols/engine.h"
#include "protocols/on_demand_restore.h"
#include "session/context_pool.h"
#include "session/driver_table.h"
#include "session/jit_helper.h"
#include "session/server_call.h"
#include "session/session.h"

namespace phos::daemon {

using json = nlohmann::json;

namespace detail {

Status sendMessage(int channel, const json& message, int fd, bool wait) {
  std::string text = message.dump();
  if (text.size() > kMaxChannelMessage) {
    return makeError(Code::kOutOfRange, "a {}-byte message exceeds the worker channel's {} bytes",
                     text.size(), kMaxChannelMessage);
  }
  iovec iov{text.data(), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  for (;;) {
    if (sendmsg(channel, &msg, MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT)) >= 0) return Status::ok();
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return makeError(Code::kUnavailable,
                       "the worker channel is full (the other side does not read)");
    }
    return errnoError(errno, "sending on the worker channel");
  }
}

Result<Message> receiveMessage(int channel, bool wait, bool* empty) {
  if (empty != nullptr) *empty = false;
  std::string buffer(kMaxChannelMessage + 1, '\0');
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = 0;
  for (;;) {
    n = recvmsg(channel, &msg, MSG_CMSG_CLOEXEC | (wait ? 0 : MSG_DONTWAIT));
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (empty != nullptr) *empty = true;
      return makeError(Code::kUnavailable, "no message on the worker channel");
    }
    return errnoError(errno, "receiving on the worker channel");
  }
  Message out;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
      out.fd.reset(fd);
    }
  }
  // (A message refused below closes the descriptor it brought.)
  if (n == 0) return makeError(Code::kUnavailable, "the other end of the worker channel is gone");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ||
      static_cast<size_t>(n) > kMaxChannelMessage) {
    return makeError(Code::kOutOfRange, "a worker channel message was truncated ({} bytes)", n);
  }
  buffer.resize(static_cast<size_t>(n));
  out.body = json::parse(buffer, nullptr, /*allow_exceptions=*/false);
  if (out.body.is_discarded() || !out.body.is_object()) {
    return makeError(Code::kInvalidArgument, "a worker channel message is not a JSON object");
  }
  return out;
}

bool writeLine(int fd, const json& line) {
  std::string text = line.dump() + "\n";
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace detail

namespace {

using detail::Message;
using detail::writeLine;

// How long a session may take to stop when its worker exits: a call stuck
// in a kernel that never ends must not keep the worker (and its files) alive;
// the process's exit frees what the driver holds.
constexpr auto kStopBound = std::chrono::seconds(5);
// The exit status of a worker whose session could not be stopped: phosd
// removes the files it left.
constexpr int kExitFilesLeft = 3;

json poolJson(const ContextPool& pool) {
  json list = json::array();
  for (const auto& s : pool.stats())
    list.push_back({{"device", s.device}, {"free", s.free}, {"target", s.target}});
  return list;
}

json sessionInfoJson(const SessionInfo& i) {
  json kernels = json::array();
  size_t bytes = 0;
  for (const auto& k : i.kernels) {
    // The channel bounds a message; ps lists the first kernels of a session
    // that launched very many.
    bytes += k.size() + 4;
    if (bytes > detail::kMaxChannelMessage / 2) break;
    kernels.push_back(k);
  }
  return json{{"session", i.id},
              {"pid", i.pid},
              {"uid", i.uid},
              {"device_bytes", i.deviceBytes},
              {"allocations", i.allocations},
              {"pinned_bytes", i.pinnedBytes},
              {"modules", i.modules},
              {"contexts", i.contexts},
              {"calls", i.calls},
              {"launches", i.launches},
              {"kernels", kernels},
              {"busy", i.busy}};
}

// Whether `pid` maps `path` (/proc/PID/maps).
bool mapsFile(pid_t pid, const std::string& path) {
  std::ifstream maps(fmt::format("/proc/{}/maps", pid));
  std::string line;
  while (std::getline(maps, line)) {
    if (line.size() > path.size() && line.ends_with(path) &&
        line[line.size() - path.size() - 1] == ' ')
      return true;
  }
  return false;
}

// Reads one line (at most 64 KiB) from a client's connection; nullopt at
// end of file or on an error.
std::optional<std::string> readLine(int fd) {
  std::string line;
  char c = 0;
  while (line.size() < (64u << 10)) {
    ssize_t n = recv(fd, &c, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return std::nullopt;
}

class Worker {
 public:
  Worker(WorkerConfig config, int channel) : config_(std::move(config)), channel_(channel) {}

  [[noreturn]] void run() {
    auto log = log::get("daemon");
    auto driver = DriverTable::load(config_.driverPath);
    if (!driver.isOk()) {
      log->error("worker: {}", driver.status().message());
      (void)detail::sendMessage(channel_,
                                {{"event", "failed"}, {"error", driver.status().message()}});
      exitNow(1);
    }
    driver_ = *driver;
    // Validator twins are compiled by `phos jit` helpers, never by this
    // process's driver while a session runs (jit_helper.h).
    configureJitHelper(config_.cli, config_.driverPath);
    pool_ = std::make_unique<ContextPool>(*driver_, config_.contextsPerDevice);
    generated::installGenerated(servers_);
    lastPool_ = poolJson(*pool_);
    lastMisses_ = pool_->misses();
    if (Status s = detail::sendMessage(channel_, {{"event", "ready"},
                                                  {"driver", driver_->path()},
                                                  {"version", driver_->version()},
                                                  {"pool", lastPool_},
                                                  {"misses", lastMisses_}});
        !s.isOk()) {
      exitNow(1);  // main is gone
    }
    log->debug("worker: ready ({} context(s) per device)", config_.contextsPerDevice);
    for (;;) {
      if (ending_.load() && !operationRunning_.load()) exitNow(0);
      if (!operationRunning_.load() && operation_.joinable()) operation_.join();
      pollfd p{channel_, POLLIN, 0};
      int ready = poll(&p, 1, 200);
      if (ready < 0 && errno != EINTR) exitNow(1);
      if (ready > 0) {
        auto message = detail::receiveMessage(channel_, /*wait=*/false);
        if (!message.isOk()) {
          if (message.status().code() == Code::kUnavailable &&
              (p.revents & (POLLHUP | POLLERR)) != 0) {
            // Main is gone (PR_SET_PDEATHSIG kills us too; this is the
            // path when it closed the channel without dying).
            ending_ = true;
            continue;
          }
          log->warn("{}: {}", who(), message.status().message());
          continue;
        }
        handle(std::move(*message));
      }
      pushPoolIfChanged();
    }
  }

 private:
  std::string who() const {
    std::lock_guard lock(mutex_);
    return session_ != nullptr ? fmt::format("session {}", session_->id()) : std::string("worker");
  }

  void send(const json& message) {
    std::lock_guard lock(sendMutex_);
    if (Status s = detail::sendMessage(channel_, message); !s.isOk()) {
      // Not who(): callers may hold mutex_.
      log::get("daemon")->warn("worker {}: cannot tell phosd: {}", getpid(), s.message());
    }
  }

  void reply(const json& request, json answer) {
    answer["reply_to"] = request.value("id", uint64_t{0});
    send(answer);
  }

  // Asks main and waits for its answer (on an operation's thread; the
  // worker's main thread receives it).
  json ask(json message) {
    uint64_t id = 0;
    {
      std::lock_guard lock(repliesMutex_);
      id = ++nextRequest_;
    }
    message["id"] = id;
    send(message);
    std::unique_lock lock(repliesMutex_);
    bool answered = repliesCv_.wait_for(lock, std::chrono::seconds(30),
                                        [&] { return replies_.count(id) != 0; });
    if (!answered) return {{"ok", false}, {"error", "phosd did not answer within 30 s"}};
    json answer = std::move(replies_[id]);
    replies_.erase(id);
    return answer;
  }

  void pushPoolIfChanged() {
    if (pool_ == nullptr) return;
    json now = poolJson(*pool_);
    uint64_t misses = pool_->misses();
    if (now == lastPool_ && misses == lastMisses_) return;
    lastPool_ = now;
    lastMisses_ = misses;
    send({{"event", "pool"}, {"pool", now}, {"misses", misses}});
  }

  void handle(Message message) {
    const json& m = message.body;
    if (m.contains("reply_to")) {
      {
        std::lock_guard lock(repliesMutex_);
        replies_[m.value("reply_to", uint64_t{0})] = m;
      }
      repliesCv_.notify_all();
      return;
    }
    const std::string op = m.value("op", "");
    if (op == "assign") {
      assign(m);
    } else if (op == "info") {
      info(m);
    } else if (op == "checkpoint" && message.fd) {
      checkpoint(m, std::move(message.fd));
    } else if (op == "validation" && message.fd) {
      validation(std::move(message.fd));
    } else if (op == "restore" && message.fd) {
      restore(m, std::move(message.fd));
    } else if (op == "end") {
      if (operationRunning_.load()) {
        log::get("daemon")->info("{}: its process is gone; finishing the {} first", who(),
                                 operationName_);
      }
      ending_ = true;
    } else {
      log::get("daemon")->warn("{}: unknown message from phosd: {}", who(), m.dump());
    }
  }

  void assign(const json& m) {
    auto log = log::get("daemon");
    std::lock_guard lock(mutex_);
    if (session_ != nullptr || operationRunning_.load()) {
      reply(m, {{"ok", false}, {"error", "this worker already serves a session"}});
      return;
    }
    const uint64_t id = m.value("session", uint64_t{0});
    auto session = std::make_unique<Session>(id, m.value("pid", pid_t{0}), m.value("uid", uid_t{0}),
                                             *driver_, *pool_, servers_, config_.runtimeDir);
    if (Status s = session->start(config_.ring); !s.isOk()) {
      log->error("session {}: cannot start: {}", id, s.message());
      reply(m, {{"ok", false}, {"error", s.message()}});
      session_ = std::move(session);  // stopped (files removed) as the worker exits
      ending_ = true;
      return;
    }
    session_ = std::move(session);
    if (m.value("validate", false)) {
      session_->setValidation(ValidationMode::kValidate);
      log->info("session {}: every launch runs as its validator twin", id);
    }
    log->info("session {}: serving pid {} in worker {}", id, session_->pid(), getpid());
    reply(m, {{"ok", true}, {"ring", session_->ringPath()}});
  }

  void info(const json& m) {
    json answer = {{"ok", true}, {"pool", poolJson(*pool_)}, {"misses", pool_->misses()}};
    Session* session = nullptr;
    {
      std::lock_guard lock(mutex_);
      session = session_.get();
    }
    // Not under mutex_: info() may wait briefly for the session's call, and
    // session_ is only replaced on this thread or before it is published.
    if (session != nullptr) answer["session"] = sessionInfoJson(session->info());
    reply(m, std::move(answer));
  }

  // Starts an operation on a thread of its own; false (and the client told
  // why) if one runs already.
  bool beginOperation(const char* name, int fd) {
    // One that has begun its last answer only finishes writing it: a client
    // that read that answer and asks again at once is served, not told "busy".
    if (operationRunning_.load() && answering_.load() && operation_.joinable()) operation_.join();
    if (ending_.load()) {
      writeLine(fd, {{"ok", false},
                     {"code", ipc::kNoSession},
                     {"error", fmt::format("{} has ended", who())}});
      return false;
    }
    if (operationRunning_.load()) {
      writeLine(fd, {{"ok", false},
                     {"code", ipc::kBusy},
                     {"error", fmt::format("{} is running a {} already; try again when it is done",
                                           who(), operationName_)}});
      return false;
    }
    if (operation_.joinable()) operation_.join();
    operationName_ = name;
    answering_ = false;
    operationRunning_ = true;
    // The control socket's 2 s send limit was for requests; progress lines
    // may wait for a slow reader a little longer.
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    return true;
  }

  void checkpoint(const json& m, UniqueFd client) {
    Session* session = nullptr;
    {
      std::lock_guard lock(mutex_);
      session = session_.get();
    }
    if (session == nullptr) {
      writeLine(client.get(),
                {{"ok", false}, {"code", ipc::kNoSession}, {"error", "this worker serves no session"}});
      return;
    }
    if (!beginOperation("checkpoint", client.get())) return;
    json request = m.value("request", json::object());
    operation_ = std::thread([this, session, request, client = std::move(client)]() mutable {
      relaxStreamCapture(*driver_);  // never refused, nor invalidating the application's captures
      const int fd = client.get();
      auto log = log::get("daemon");
      log->info("session {}: checkpoint of pid {} into {}", session->id(), session->pid(),
                request.value("image", std::string("?")));
      bool clientListens = true;
      auto progress = [&](const json& p) {
        if (clientListens) clientListens = writeLine(fd, {{"progress", p}});
      };
      // CRIU run by another program with PhOS's plugin (docs/containers.md):
      // each step answered on this connection, the plugin's next read back.
      // CRIU's dump takes as long as the process's memory: no time limit,
      // the plugin's closing the connection (CRIU gone) ends the wait.
      checkpoint::PluginSteps pluginSteps;
      // (A field of another type is refused by the engine, naming it.)
      const bool throughPlugin = request.contains("criu_plugin") &&
                                 request["criu_plugin"].is_boolean() &&
                                 request["criu_plugin"].get<bool>();
      if (throughPlugin) {
        timeval none{0, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
        pluginSteps.next = [fd](std::string_view done) -> Result<std::string> {
          if (!writeLine(fd, {{"step", done}})) {
            return makeError(Code::kFailedPrecondition, "CRIU's plugin closed the connection");
          }
          auto line = readLine(fd);
          if (!line)
            return makeError(Code::kFailedPrecondition, "CRIU's plugin closed the connection");
          json step = json::parse(*line, nullptr, false);
          if (!step.is_object() || !step.contains("step") || !step["step"].is_string()) {
            return makeError(Code::kInvalidArgument, "CRIU's plugin sent {} instead of a step",
                             *line);
          }
          return step["step"].get<std::string>();
        };
      }
      json answer;
      try {
        answer =
            checkpointSession(*session, request, progress, throughPlugin ? &pluginSteps : nullptr);
      } catch (const std::exception& e) {
        answer = {{"ok", false}, {"error", fmt::format("checkpoint failed: {}", e.what())}};
      }
      if (!answer.is_object() || !answer.contains("ok")) {
        answer = {{"ok", false}, {"error", "the checkpoint engine gave no answer"}};
      }
      if (answer.value("ok", false)) {
        log->info("session {}: checkpoint done", session->id());
      } else {
        log->warn("session {}: checkpoint failed: {}", session->id(),
                  answer.value("error", std::string("?")));
      }
      // (Through the plugin, CRIU kills the process or not, and the session
      // ends with it.)
      const bool ended =
          answer.value("ok", false) && !throughPlugin && !request.value("leave_running", false);
      if (ended) {
        // The dump ended the process: its session is freed before the client
        // hears that the checkpoint is done, so that a restore right after
        // finds none of its files in use.
        stopSession(*session);
        ending_ = true;
      }
      answering_ = true;
      writeLine(fd, answer);
      client.reset();  // the client sees the end of the answer before the next operation may start
      operationRunning_ = false;
    });
  }

  // `phos validate`: what the session's twins reported so far. The session
  // is parked while its contexts drain and the reports are read.
  void validation(UniqueFd client) {
    Session* session = nullptr;
    {
      std::lock_guard lock(mutex_);
      session = session_.get();
    }
    if (session == nullptr) {
      writeLine(client.get(),
                {{"ok", false}, {"code", ipc::kNoSession}, {"error", "this worker serves no session"}});
      return;
    }
    if (!beginOperation("validation report", client.get())) return;
    operation_ = std::thread([this, session, client = std::move(client)]() mutable {
      relaxStreamCapture(*driver_);  // never refused, nor invalidating the application's captures
      const int fd = client.get();
      auto answer = session->validationReport(std::chrono::seconds(10));
      answering_ = true;
      if (answer.isOk()) {
        (*answer)["ok"] = true;
        writeLine(fd, *answer);
      } else {
        writeLine(fd, {{"ok", false}, {"error", answer.status().message()}});
      }
      client.reset();
      operationRunning_ = false;
    });
  }

  void restore(const json& m, UniqueFd client) {
    const int fd = client.get();
    {
      std::lock_guard lock(mutex_);
      if (session_ != nullptr) {
        writeLine(fd, {{"ok", false}, {"error", "this worker already serves a session"}});
        return;
      }
    }
    if (!beginOperation("restore", fd)) return;
    const uint64_t id = m.value("session", uint64_t{0});
    // phosd always says who asked (SO_PEERCRED); without it nothing is
    // restored, rather than restoring as root.
    if (!m.contains("peer_uid") || !m["peer_uid"].is_number_unsigned()) {
      writeLine(fd, {{"ok", false}, {"code", wireCode(Code::kInternal)}, {"error", "phosd did not say which uid asks to restore"}});
      ending_ = true;
      operationRunning_ = false;
      return;
    }
    const auto peerUid = m["peer_uid"].get<uid_t>();
    json request = m.value("request", json::object());
    operation_ = std::thread([this, id, peerUid, request, client = std::move(client)]() mutable {
      relaxStreamCapture(*driver_);  // never refused, nor invalidating the application's captures
      restoreAndWaitForAdopt(id, peerUid, request, client.get());
      client.reset();
      operationRunning_ = false;
    });
  }

  void restoreAndWaitForAdopt(uint64_t id, uid_t peerUid, const json& request, int fd) {
    auto log = log::get("daemon");
    const std::string image = request.value("image", std::string());
    log->info("session {}: restoring {}", id, image);
    bool clientListens = true;
    auto progress = [&](const json& p) {
      if (clientListens) clientListens = writeLine(fd, {{"progress", p}});
    };
    Result<RestoredSession> restored = makeError(Code::kInternal, "restore did not run");
    try {
      restored =
          restoreSession(id, *driver_, *pool_, servers_, config_.runtimeDir, request, peerUid, progress);
    } catch (const std::exception& e) {
      restored = makeError(Code::kInternal, "restore of {} failed: {}", image, e.what());
    }
    if (!restored.isOk()) {
      log->warn("session {}: restore of {} failed: {}", id, image, restored.status().message());
      writeLine(fd, {{"ok", false},
                     {"code", std::string(wireCode(restored.status().code()))},
                     {"error", restored.status().message()}});
      ending_ = true;  // a worker that restored nothing is replaced by a fresh one
      return;
    }
    std::unique_ptr<Session> session = std::move(restored->session);
    std::shared_ptr<OnDemandRestore> loading = std::move(restored->loading);
    // restoreSession refused this already, before reading the image's data;
    // kept as the last word before the session is announced.
    if (peerUid != 0 && peerUid != session->uid()) {
      writeLine(fd, {{"ok", false},
                     {"code", wireCode(Code::kPermissionDenied)},
                     {"error", fmt::format("uid {} may not restore a session of uid {}", peerUid,
                                           session->uid())}});
      std::lock_guard lock(mutex_);
      session_ = std::move(session);  // stopped as the worker exits
      ending_ = true;
      return;
    }
    const pid_t pid = session->pid();
    {
      std::lock_guard lock(mutex_);
      session_ = std::move(session);
    }
    send({{"event", "restored"},
          {"session", id},
          {"pid", pid},
          {"uid", session_->uid()},
          {"ring", session_->ringPath()}});
    log->info("session {}: restored for pid {}; waiting for it to be adopted", id, pid);
    writeLine(fd, {{"ok", true}, {"session", id}, {"pid", pid}});
    // The client runs CRIU now, which takes as long as the process's memory
    // needs: no time limit, its closing the connection is the signal.
    timeval none{0, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
    auto line = readLine(fd);
    json adopt = line ? json::parse(*line, nullptr, false) : json();
    // The restored process has the pid it had, or, restored into a new PID
    // namespace (a container, by CRIU's plugin: docs/containers.md), another
    // one as phosd numbers it: then it must map this session's ring.
    auto adopter = [&]() -> std::optional<pid_t> {
      if (!adopt.is_object() || !adopt.contains("adopt") || !adopt["adopt"].is_number_integer())
        return std::nullopt;
      const int64_t named = adopt["adopt"].get<int64_t>();
      if (named == static_cast<int64_t>(pid)) return pid;
      if (named <= 0 || named > std::numeric_limits<pid_t>::max()) return std::nullopt;
      if (!mapsFile(static_cast<pid_t>(named), session_->ringPath())) return std::nullopt;
      return static_cast<pid_t>(named);
    };
    const std::optional<pid_t> adopting = line ? adopter() : std::nullopt;
    if (!adopting) {
      std::string why =
          !line ? "the client closed the connection" : fmt::format("the client sent {}", *line);
      log->warn("session {}: abandoned: {} instead of {{\"adopt\": {}}}", id, why, pid);
      if (line)
        writeLine(fd, {{"ok", false},
                       {"error",
                        fmt::format("expected {{\"adopt\": {}}}; the session is abandoned", pid)}});
      ending_ = true;
      return;
    }
    json answer = ask({{"op", "adopt"}, {"session", id}, {"pid", *adopting}, {"was", pid}});
    if (!answer.value("ok", false)) {
      std::string error = answer.value("error", std::string("phosd refused the adoption"));
      log->warn("session {}: abandoned: {}", id, error);
      writeLine(fd, {{"ok", false}, {"error", error}});
      ending_ = true;
      return;
    }
    if (*adopting != pid) {
      log->info("session {}: restored as pid {} (pid {} when it was saved)", id, *adopting, pid);
      session_->adoptedBy(*adopting);
    }
    session_->startServing();
    log->info("session {}: pid {} adopted; serving it{}", id, *adopting,
              loading != nullptr ? " while its device memory loads" : "");
    writeLine(fd, {{"ok", true}, {"loading", loading != nullptr}});
    if (loading != nullptr) finishLoading(*session_, *loading, restored->validation, fd);
  }

  // A concurrent restore's window (loadConcurrently) and its outcome for the
  // client: {"loaded": report}, or {"rollback": why} once the process, which
  // may have run on memory that was not loaded yet, is gone with its session
  // (the client then restores again, eagerly).
  void finishLoading(Session& session, OnDemandRestore& loading, ValidationMode validation, int fd) {
    auto log = log::get("daemon");
    json report;
    Status loaded = loadConcurrently(session, loading, validation, [this] { return ending_.load(); }, report);
    if (auto first = session.firstCallSeconds()) report["first_call_seconds"] = *first;
    if (loaded.isOk()) {
      log->info("session {}: device memory loaded ({} of {} chunks on demand, {} calls waited {:.3f} s)",
                session.id(), report.value("demanded_chunks", 0), report.value("chunks", 0),
                report.value("waited_calls", 0), report.value("waited_seconds", 0.0));
      writeLine(fd, {{"loaded", report}});
      return;
    }
    if (ending_.load()) {
      log->info("session {}: its process ended before its device memory was loaded", session.id());
      writeLine(fd, {{"ended", true}, {"report", report}});
      return;
    }
    log->warn("session {}: {}; ending pid {} to restore it again eagerly", session.id(), loaded.message(),
              session.pid());
    // A failed load keeps every call that waits for the chunk waiting: the
    // process ends before anything it could read from that memory reaches it.
    ::kill(session.pid(), SIGKILL);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!processEnded(session.pid()) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    loading.release();
    stopSession(session);
    ending_ = true;
    // A damaged image would fail again eagerly: the restore fails instead.
    writeLine(fd, {{loaded.code() == Code::kDataLoss ? "damaged" : "rollback", loaded.message()}, {"report", report}});
  }

  // Stops the session (its files are removed), waiting at most kStopBound;
  // false if it is still in a call then.
  bool stopSession(Session& session) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([&session, done] {
      session.stop();
      done->store(true);
    }).detach();
    const auto deadline = std::chrono::steady_clock::now() + kStopBound;
    while (!done->load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!done->load()) {
      log::get("daemon")->warn(
          "session {}: still in a call after {} s; its worker exits anyway (phosd removes its "
          "files)",
          session.id(), kStopBound.count());
      filesLeft_ = true;
    }
    return done->load();
  }

  [[noreturn]] void exitNow(int code) {
    Session* session = nullptr;
    {
      std::lock_guard lock(mutex_);
      session = session_.get();
    }
    if (session != nullptr && stopSession(*session)) {
      log::get("daemon")->info("session {}: stopped; worker {} exits", session->id(), getpid());
    }
    log::get("daemon")->flush();
    // Main removes a worker's files only after an abnormal end: a normal one
    // removed them itself, and a restore may already have re-created them.
    if (filesLeft_ && code == 0) code = kExitFilesLeft;
    // No destructors: the driver's threads and the session's may still run;
    // the process's exit frees what the driver holds.
    _exit(code);
  }

  const WorkerConfig config_;
  const int channel_;
  DriverTable* driver_ = nullptr;
  std::unique_ptr<ContextPool> pool_;
  ServerTable servers_{};
  json lastPool_;
  uint64_t lastMisses_ = 0;

  mutable std::mutex mutex_;  // guards session_
  std::unique_ptr<Session> session_;
  std::mutex sendMutex_;
  std::thread operation_;  // a checkpoint or restore
  std::atomic<bool> operationRunning_{false};
  // Set by an operation's thread just before it writes its last answer.
  std::atomic<bool> answering_{false};
  std::string operationName_;
  std::atomic<bool> ending_{false};
  std::atomic<bool> filesLeft_{false};  // a session that could not be stopped

  std::mutex repliesMutex_;
  std::condition_variable repliesCv_;
  std::map<uint64_t, json> replies_;
  uint64_t nextRequest_ = 0;
};

}  // namespace

void runWorker(const WorkerConfig& config, int channel) {
  // Dies with main: a worker outliving phosd would keep serving a session
  // nobody can see or stop.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != config.mainPid) _exit(0);
  // Main decides when workers end (a ^C reaches the whole process group).
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_NAME, "phosd-worker");
  static Worker* worker = new Worker(config, channel);  // never destroyed: it ends with _exit
  worker->run();
}

}  // namespace phos::daemon
