// SPDX-License-Identifier: Apache-2.0
// phosd's main process inside (phos/daemon/phosd.h): its state (Daemon::Impl)
// and what its two halves share. phosd.cpp keeps the workers (a pool of spare
// ones, one per session, their messages and their ends); phosd_control.cpp
// answers the control socket's requests. Main never loads the CUDA driver.
#pragma once

#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "phos/common/unique_fd.h"
#include "phos/daemon/phosd.h"
#include "phos/net/channel.h"
#include "process/worker.h"

namespace phos::daemon {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline int pidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Answers a client whose request main handled (or gave up on) and closes it.
inline void answerAndClose(UniqueFd client, const json& answer) { detail::writeLine(client.get(), answer); }

inline json refusal(std::string error) { return {{"ok", false}, {"error", std::move(error)}}; }

// A worker process, as main sees it.
struct WorkerHandle {
  enum class State {
    kStarting,   // loading the driver, creating its contexts
    kSpare,      // ready, waiting for a session
    kAssigned,   // creating a session for an attach
    kServing,    // serving a session whose process main watches
    kRestoring,  // restoring an image; serving once the restored process is adopted
    kEnding,     // told to end; main waits for it to exit
  };
  pid_t pid = 0;
  UniqueFd channel;
  UniqueFd pidfd;
  State state = State::kStarting;
  std::string failure;  // what it said before exiting without becoming ready
  json pool = json::array();
  uint64_t misses = 0;
  // Its session.
  uint64_t session = 0;
  pid_t clientPid = 0;
  uid_t uid = 0;
  UniqueFd clientPidfd;
  std::string command;
  std::string ring;
  std::string image;  // restoring: the image (restoreKey), until the process is adopted
};

// A control connection whose request line has not fully arrived. Connections
// are read as their bytes come, beside everything else the main loop does:
// idle or slow clients (any user may connect) cannot delay anyone else.
struct PendingControl {
  UniqueFd connection;
  ucred peer{};
  std::string line;
  Clock::time_point deadline;  // the whole line by then
};

// A client waiting for a spare worker (attach or restore).
struct WaitingClient {
  enum class Kind { kAttach, kRestore } kind = Kind::kAttach;
  UniqueFd connection;
  ucred peer{};
  json request;
  UniqueFd pidfd;  // attach: the client process
  Clock::time_point deadline;
  std::string image;  // restore: restoreKey of its request, resolved once
};

struct Daemon::Impl {
  DaemonOptions options;
  std::string runtimeDir;
  std::string socketPath;
  WorkerConfig workerConfig;
  std::string driverPath;
  int driverVersion = 0;
  int deviceCount = 0;
  UniqueFd listenFd;
  UniqueFd lockFd;               // runtimeDir/phosd.lock, write-locked for the daemon's life
  dev_t socketDevice = 0;        // the socket this daemon bound: the only one it unlinks
  ino_t socketInode = 0;
  std::map<int, PendingControl> pendingControl;  // by its connection's descriptor
  std::optional<net::Key> key;  // options.keyFile's
  pid_t migrationListener = -1;
  uint64_t nextSession = 0;
  uint64_t nextRequest = 0;
  bool stopRequested = false;
  std::map<pid_t, WorkerHandle> workers;
  std::deque<WaitingClient> waitingForWorker;
  // Attaches and restores that found no spare worker ready, plus contexts
  // created on demand by workers that are gone.
  uint64_t workerMisses = 0;
  uint64_t retiredContextMisses = 0;
  // Worker start failures in a row slow down the next attempts.
  std::chrono::milliseconds forkBackoff{0};
  Clock::time_point nextForkAllowed{};
  std::string lastWorkerFailure;

  struct Waiting {
    pid_t worker = 0;
    Clock::time_point deadline;
    std::function<void(const json*)> done;  // nullptr: no answer in time, or the worker died
  };
  std::map<uint64_t, Waiting> waiting;  // main's requests to workers, by id

  ~Impl();

  Status bind();

  // ---- workers ---------------------------------------------------------

  // Every descriptor main holds, closed in a new worker.
  void closeMainDescriptors();

  Status forkWorker();

  int countIn(std::initializer_list<WorkerHandle::State> states) const;

  WorkerHandle* spare();

  // Keeps options.spareWorkers workers ready (or starting), plus one for
  // each client waiting for one.
  void keepSpares();

  void noteWorkerFailure(const std::string& why);

  Status tell(WorkerHandle& w, const json& message, int fd = -1);

  // Sends `message` with a fresh id; `done` gets the worker's answer, or
  // nullptr when none came within `timeout` (or the worker died).
  void ask(WorkerHandle& w, json message, std::chrono::milliseconds timeout, std::function<void(const json*)> done);

  // The worker's client is gone, or the daemon stops: it finishes what it
  // runs, stops its session and exits; main reaps it then.
  void endWorker(WorkerHandle& w);

  void onWorkerMessage(WorkerHandle& w, const json& m);

  // A restored process runs again: from now on its session is as an attached one.
  json adopt(WorkerHandle& w, const json& m);

  // Reads everything the worker sent; false once its channel is closed.
  bool drainChannel(pid_t pid);

  // The worker exited (or was killed): reaps it, removes its files, fails
  // what waited for it.
  void onWorkerExit(pid_t pid);

  void onClientExit(pid_t workerPid);

  // ---- requests ------------------------------------------------------------

  // A restore re-creates its session's files at the paths they had; a worker
  // still ending may be a session of that image (killed, or checkpointed
  // without --leave-running, the moment before) about to remove them. So a
  // restore waits until no worker is ending (at most the 5 s a worker gives
  // its session to stop).
  bool restoreMayStart() const { return countIn({WorkerHandle::State::kEnding}) == 0; }

  void serveWaitingClients();

  void startAttach(WorkerHandle& w, WaitingClient& c);

  void startRestore(WorkerHandle& w, WaitingClient& c);

  // Either gets a spare worker now or waits for one (keepSpares forks it).
  // Two restores of one image would re-create the same session files: a
  // restore waits while another request restores its image, until that one
  // hands its session to the restored process or ends (a restore of a copy
  // finds the session's ring held instead: Session::rebuildFrom).
  bool imageBeingRestored(const WaitingClient& c) const;

  void startOrQueue(WaitingClient c);

  json sessionJson(const WorkerHandle& w) const;

  void answerPs(UniqueFd client, const ucred& peer);

  json pingAnswer() const;

  // The answer, or nullopt when the connection `client` was handed on (to a
  // worker, or to wait for one) and is answered later.
  std::optional<json> handle(const json& request, const ucred& peer, UniqueFd& client);

  // A new control connection: its request is read as it arrives (readControl).
  // At most kMaxPendingControl wait at once; beyond, the one waiting longest
  // is dropped (a client that sends its request at once is never the oldest).
  static constexpr size_t kMaxPendingControl = 256;
  static constexpr auto kControlLineBound = std::chrono::seconds(2);

  void acceptControl(UniqueFd client);

  // Reads what arrived on a pending connection; once the line is complete,
  // serves it.
  void readControl(int fd);

  // One request per connection; `line` is null when it was not one line of
  // at most kMaxControlMessage bytes in time.
  void serveControl(UniqueFd client, const ucred& peer, const std::string* line);

  // Answers what waited too long: requests to workers, clients waiting for one.
  void expire();

  // One round of the main loop: waits up to `timeout` for a worker, a
  // client process or (with `accept`) the control socket.
  Status pollOnce(bool accept, std::chrono::milliseconds timeout);

  // Waits until a worker is ready (the driver loads and its contexts exist),
  // or fails with what the workers said.
  Status waitForFirstWorker();

  // Every worker ends (finishing a running checkpoint); one that is still
  // there after the bound is killed. Files of all of them are removed.
  void shutdownWorkers();

  void stopMigrationListener();

  static constexpr auto kShutdownBound = std::chrono::seconds(8);
};

}  // namespace phos::daemon
