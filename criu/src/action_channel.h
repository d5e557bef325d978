// SPDX-License-Identifier: Apache-2.0
// CRIU's pre-dump and post-dump action scripts, answered by this process
// (checkpoint.cpp): how the GPU half runs at the moments CRIU freezes the
// job and holds it frozen.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "criu_support.h"
#include "phos/common/log.h"
#include "phos/common/unique_fd.h"
#include "phos/common/status.h"

namespace phos::checkpoint::detail {

// --- CRIU's pre-dump and post-dump actions, run in this process ------------

// CRIU runs `--action-script` for each step of a dump with the step in
// CRTOOLS_SCRIPT_ACTION. At "pre-dump" it has started up (about 30 ms here:
// its kernel probes) and is about to freeze the tasks, which still run. At
// "post-dump" it has written its images and still holds the tasks frozen. A
// script that exits non-zero makes CRIU fail the dump: before the freeze it
// never stops the tasks, after it it resumes them (verified with CRIU 4.1.1
// here: /proc/P/stat shows 't' during post-dump, and the task runs on after a
// failing one).
//
// The script is generated into a private directory with two FIFOs: it writes
// the step's name as a line into `request`, and waits for our answer on
// `reply`. This process holds both FIFOs open read-write, so neither side's
// open() blocks; if this process dies, the script reads EOF, fails, and CRIU
// resumes the tasks. The channel holds an flock on its directory while it
// lives: one left by a killed worker (no lock, and older than a minute) is
// removed by the next checkpoint of any worker. Not by pid: phosds of other
// pid namespaces (test hosts, containers) share /tmp, and a pid one of them
// cannot see may live.
class ActionChannel {
 public:
  enum Step { kPreDump, kPostDump };
  using Hooks = std::map<Step, std::function<Status()>>;

  static Result<std::unique_ptr<ActionChannel>> create(Hooks hooks) {
    removeAbandonedDirectories();
    std::string dirTemplate = fmt::format("{}{}.XXXXXX", kPrefix, ::getpid());
    if (::mkdtemp(dirTemplate.data()) == nullptr) {
      return errnoError(errno, "creating a directory for CRIU's action script");
    }
    std::unique_ptr<ActionChannel> channel(new ActionChannel(dirTemplate, std::move(hooks)));
    channel->lock_.reset(::open(dirTemplate.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!channel->lock_ || ::flock(channel->lock_.get(), LOCK_EX) != 0) {
      return errnoError(errno, fmt::format("locking {}", dirTemplate));
    }
    RETURN_IF_ERROR(channel->setUp());
    return channel;
  }

  // For a CRIU that runs as `who` (dumpAsUser): the script and the FIFOs
  // become its; the directory stays ours, searchable but not listable.
  Status lendTo(const DumpIdentity& who) {
    if (::chmod(dir_.c_str(), 0711) != 0) return errnoError(errno, fmt::format("chmod {}", dir_.string()));
    for (const fs::path& file : {script(), dir_ / "request", dir_ / "reply"}) {
      if (::lchown(file.c_str(), who.uid, who.gid) != 0) {
        return errnoError(errno, fmt::format("giving {} to uid {}", file.string(), who.uid));
      }
    }
    return Status::ok();
  }

  ~ActionChannel() {
    stop();
    request_.reset();
    reply_.reset();
    stop_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
    lock_.reset();  // last: the directory is gone
  }

  fs::path script() const { return dir_ / "action.sh"; }

  // Ends the serving thread (after CRIU returned).
  void stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }

  // After stop(): a step with a hook that CRIU never reached (nullptr if
  // none), and a step's outcome.
  const char* missedStep() const {
    for (const auto& [step, hook] : hooks_) {
      if (!outcomes_.contains(step)) return name(step);
    }
    return nullptr;
  }
  Status status(Step step) const {
    auto it = outcomes_.find(step);
    return it == outcomes_.end() ? Status::ok() : it->second;
  }

 private:
  static constexpr const char* kPrefix = "/tmp/phos-criu-action.";

  static const char* name(Step step) { return step == kPreDump ? "pre-dump" : "post-dump"; }

  ActionChannel(fs::path dir, Hooks hooks) : dir_(std::move(dir)), hooks_(std::move(hooks)) {}

  // Directories "<kPrefix><pid>.XXXXXX" of ours that no channel holds.
  static void removeAbandonedDirectories() {
    const fs::path prefix(kPrefix);
    const std::string stem = prefix.filename().string();
    std::error_code ec;
    for (auto it = fs::directory_iterator(prefix.parent_path(), ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!name.starts_with(stem)) continue;
      char* end = nullptr;
      const long pid = std::strtol(name.c_str() + stem.size(), &end, 10);
      if (pid <= 0 || *end != '.') continue;
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
      // A channel is created, then locked: a young directory may be one
      // between the two.
      if (::time(nullptr) - st.st_mtime < 60) continue;
      const bool held = [&] {
        UniqueFd fd(::open(it->path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        return !fd || ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0;  // closing releases it
      }();
      if (held) continue;
      std::error_code removeError;
      fs::remove_all(it->path(), removeError);
      log::get("checkpoint")->info("removed {}, left by phosd process {}, which no longer holds it",
                                   it->path().string(), pid);
    }
  }

  Status setUp() {
    fs::path request = dir_ / "request", reply = dir_ / "reply";
    for (const fs::path& fifo : {request, reply}) {
      if (::mkfifo(fifo.c_str(), 0600) != 0) {
        return errnoError(errno, fmt::format("creating the FIFO {}", fifo.string()));
      }
    }
    request_.reset(::open(request.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
    reply_.reset(::open(reply.c_str(), O_RDWR | O_CLOEXEC));
    if (!request_ || !reply_) {
      return errnoError(errno, fmt::format("opening the FIFOs in {}", dir_.string()));
    }
    stop_.reset(::eventfd(0, EFD_CLOEXEC));
    if (!stop_) return errnoError(errno, "eventfd");
    std::string steps;
    for (const auto& [step, hook] : hooks_) steps += fmt::format("{}{}", steps.empty() ? "" : "|", name(step));
    std::string text = fmt::format(
        "#!/bin/sh\n"
        "# Generated by PhOS (pid {}) for one checkpoint: CRIU's steps {} run the\n"
        "# checkpoint's hooks for them in that process, and fail if they fail.\n"
        "case \"$CRTOOLS_SCRIPT_ACTION\" in {}) ;; *) exit 0 ;; esac\n"
        "echo \"$CRTOOLS_SCRIPT_ACTION\" > '{}' || exit 1\n"
        "read -r answer < '{}' || exit 1\n"
        "[ \"$answer\" = ok ]\n",
        ::getpid(), steps, steps, request.string(), reply.string());
    {
      std::ofstream out(script());
      out << text;
      if (!out) return makeError(Code::kIo, "cannot write {}", script().string());
    }
    if (::chmod(script().c_str(), 0700) != 0) {
      return errnoError(errno, fmt::format("chmod {}", script().string()));
    }
    thread_ = std::thread([this] { serve(); });
    return Status::ok();
  }

  void serve() {
    std::string line;
    for (;;) {
      pollfd fds[2] = {{request_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        // The script then waits for ever, and CRIU with it.
        log::get("checkpoint")->error("waiting for CRIU's action script: {}", std::strerror(errno));
        return;
      }
      if (fds[1].revents != 0) return;
      char buf[256];
      ssize_t n = ::read(request_.get(), buf, sizeof buf);
      if (n <= 0) continue;
      line.append(buf, static_cast<size_t>(n));
      const size_t end = line.find('\n');
      if (end == std::string::npos) continue;
      const std::string said = line.substr(0, end);
      line.clear();
      // Each step runs its hook once: the FIFOs may be the job user's (lendTo),
      // and a step asked for again fails the dump instead of running twice.
      bool ok = false;
      for (auto& [step, hook] : hooks_) {
        if (said != name(step)) continue;
        if (outcomes_.contains(step)) {
          outcomes_[step] = makeError(Code::kFailedPrecondition, "CRIU's {} step was asked for twice", said);
          break;
        }
        outcomes_[step] = hook();
        ok = outcomes_[step].isOk();
      }
      std::string answer = ok ? "ok\n" : "fail\n";
      (void)!::write(reply_.get(), answer.data(), answer.size());
    }
  }

  fs::path dir_;
  Hooks hooks_;
  UniqueFd request_, reply_, stop_;
  UniqueFd lock_;  // flock on dir_ while the channel lives
  std::thread thread_;
  // Written by the serving thread, read after stop() joined it.
  std::map<Step, Status> outcomes_;
};

}  // namespace phos::checkpoint::detail
