// SPDX-License-Identifier: Apache-2.0
// PhOS's CRIU plugin (docs/containers.md): whoever runs CRIU (plain `criu`,
// runc, crun, Podman) checkpoints and restores PhOS jobs, their GPU half
// through phosd. At a dump it asks phosd to checkpoint each PhOS task's
// session into CRIU's image directory (`phos-PID/`, a PhOS image) in step
// with CRIU: the GPU state is cut before CRIU freezes the task, what its CPU
// could still change is saved while it is frozen, and the image is committed
// once CRIU's dump succeeded. At a restore phosd re-creates each session (and
// its shared-memory files) before CRIU maps them, and the restored task
// adopts it before it runs.
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "criu_plugin_abi.h"
#include "phos/common/ipc/control.h"
#include "phos/common/subprocess.h"
#include "phos/criu/criu.h"

namespace phos::criu_plugin {
namespace {

using json = nlohmann::json;

constexpr const char* kName = "phos";  // also the name in CRIU's inventory

template <typename... Args>
void say(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  const std::string text = fmt::format(format, std::forward<Args>(args)...);
  if (print_on_level != nullptr) {
    print_on_level(level, "phos: %s\n", text.c_str());
  } else {
    std::fprintf(stderr, "phos: %s\n", text.c_str());
  }
}

// PhOS's own CRIU runs (phos checkpoint, phos restore) carry the GPU half
// themselves.
bool standsAside() {
  const char* value = std::getenv(criu::kPluginOffVariable);
  return value != nullptr && std::string_view(value) == "off";
}

// A session ring's name: phos-WORKER-SESSION, in phosd's session directory
// (/dev/shm unless phosd was told another: docs/containers.md). The worker's
// pid, or 0 for any other name.
pid_t ringWorker(std::string_view path) {
  const std::string_view name = path.substr(path.rfind('/') + 1);
  constexpr std::string_view kPrefix = "phos-";
  if (!name.starts_with(kPrefix)) return 0;
  const char* p = name.data() + kPrefix.size();
  const char* end = name.data() + name.size();
  pid_t worker = 0;
  uint64_t session = 0;
  auto [afterWorker, ec1] = std::from_chars(p, end, worker);
  if (ec1 != std::errc() || afterWorker == end || *afterWorker != '-') return 0;
  auto [afterSession, ec2] = std::from_chars(afterWorker + 1, end, session);
  if (ec2 != std::errc() || afterSession != end || worker <= 0) return 0;
  return worker;
}

// The session ring a PhOS job maps, if `pid` maps one.
std::optional<std::string> phosRing(pid_t pid) {
  std::ifstream maps(fmt::format("/proc/{}/maps", pid));
  std::string line;
  while (std::getline(maps, line)) {
    const size_t at = line.find('/');
    if (at != std::string::npos && ringWorker(std::string_view(line).substr(at)) > 0)
      return line.substr(at);
  }
  return std::nullopt;
}

// CRIU's image directory (its descriptor, as a path phosd can open).
std::optional<std::string> imagesDirectory() {
  if (criu_get_image_dir == nullptr) return std::nullopt;
  const int fd = criu_get_image_dir();
  if (fd < 0) return std::nullopt;
  char path[4096];
  const ssize_t n = ::readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), path, sizeof(path) - 1);
  if (n <= 0) return std::nullopt;
  return std::string(path, static_cast<size_t>(n));
}

std::string imageName(pid_t pid) {
  return fmt::format("phos-{}", pid);
}
// Left in CRIU's image directory by a dump whose task had a session: a
// restore refuses the image unless phos-PID/ is there beside it.
std::string markerName(pid_t pid) {
  return fmt::format("phos-{}.required", pid);
}

// The marker says which task it was and which phosd saved it:
// {"pid": host pid, "ns_pid": the pid it saw itself as, "runtime_dir"}.
bool writeMarker(pid_t pid, const std::string& runtimeDirectory) {
  auto nsPid = pidInOwnNamespace(pid);
  const std::string text =
      json{{"pid", pid}, {"ns_pid", nsPid.isOk() ? *nsPid : pid}, {"runtime_dir", runtimeDirectory}}
          .dump();
  const int fd = ::openat(criu_get_image_dir(), markerName(pid).c_str(),
                          O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return written;
}

void removeMarker(pid_t pid) {
  ::unlinkat(criu_get_image_dir(), markerName(pid).c_str(), 0);
}

json readMarker(int directory, const std::string& name) {
  const int fd = ::openat(directory, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return json();
  std::string text(4096, '\0');
  const ssize_t n = ::read(fd, text.data(), text.size());
  ::close(fd);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  json marker = json::parse(text, nullptr, false);
  return marker.is_object() ? marker : json();
}

// The runtime directory of the phosd that serves `pid`, found from the
// task's ring (phos-WORKER-SESSION): the worker's parent is phosd,
// which holds RUNTIME/phosd.lock open for its life. So a plugin run by a
// container runtime, which gives CRIU no environment of ours, reaches the
// job's phosd wherever it runs.
std::optional<std::string> servingRuntimeDir(const std::string& ring) {
  const pid_t worker = ringWorker(ring);
  if (worker <= 0) return std::nullopt;
  std::ifstream status(fmt::format("/proc/{}/status", worker));
  std::string line;
  pid_t daemon = 0;
  while (std::getline(status, line)) {
    if (line.rfind("PPid:", 0) == 0) daemon = std::atoi(line.c_str() + 5);
  }
  if (daemon <= 0) return std::nullopt;
  const std::string fds = fmt::format("/proc/{}/fd", daemon);
  DIR* d = ::opendir(fds.c_str());
  if (d == nullptr) return std::nullopt;
  std::optional<std::string> found;
  while (dirent* entry = ::readdir(d)) {
    char target[4096];
    const ssize_t n =
        ::readlink(fmt::format("{}/{}", fds, entry->d_name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string path(target, static_cast<size_t>(n));
    const std::string kLock = ipc::daemonLockPath("");  // "/phosd.lock"
    if (path.size() > kLock.size() && path.ends_with(kLock)) {
      found = path.substr(0, path.size() - kLock.size());
      break;
    }
  }
  ::closedir(d);
  return found;
}

// $PHOS_RUNTIME_DIR when CRIU's environment names one, else `fallback`, else
// the default (/run/phos for root).
std::string runtimeDirectory(const std::optional<std::string>& fallback) {
  if (const char* env = std::getenv("PHOS_RUNTIME_DIR"); env != nullptr && *env != '\0') return env;
  if (fallback && !fallback->empty()) return *fallback;
  return ipc::runtimeDir();
}

// phosd's next line that is not progress.
Result<json> nextAnswer(ipc::ControlStream& stream) {
  for (;;) {
    ASSIGN_OR_RETURN(std::string line, stream.readLine());
    json answer = json::parse(line, nullptr, false);
    if (!answer.is_object()) return makeError(Code::kInternal, "phosd sent \"{}\"", line);
    if (!answer.contains("progress")) return answer;
  }
}

std::string refusal(const Result<json>& answer) {
  if (!answer.isOk()) return answer.status().message();
  return answer->value("error", answer->dump());
}

int gStage = -1;
bool gInInventory = false;
std::map<pid_t, ipc::ControlStream> gDumps;  // sessions phosd is checkpointing
// A session re-created, not adopted yet.
struct Restoring {
  pid_t dumpedPid;  // as phosd numbered the task at the dump
  pid_t nsPid;      // as the task numbered itself
  ipc::ControlStream stream;
};
std::vector<Restoring> gRestores;

int pauseDevices(int pid) {
  if (standsAside() || gStage != kDump) return -ENOTSUP;  // a pre-dump needs no GPU state
  const std::optional<std::string> ring = phosRing(pid);
  if (!ring) return -ENOTSUP;
  const std::optional<std::string> dir = imagesDirectory();
  if (!dir) {
    say(kLogError, "pid {} is a PhOS job, and CRIU named no image directory for its GPU state",
        pid);
    return -1;
  }
  const std::string runtime = runtimeDirectory(servingRuntimeDir(*ring));
  if (!writeMarker(pid, runtime)) {
    say(kLogError, "cannot write {}/{}: {}", *dir, markerName(pid), std::strerror(errno));
    return -1;
  }
  const std::string socket = ipc::controlSocketPath(runtime);
  const json request = {{"op", "checkpoint"},
                        {"pid", pid},
                        {"image", fmt::format("{}/{}", *dir, imageName(pid))},
                        {"mode", "stop"},
                        {"leave_running", true},
                        {"criu_plugin", true}};
  auto stream = ipc::ControlStream::open(socket, request.dump());
  Result<json> answer = stream.isOk() ? nextAnswer(*stream) : Result<json>(stream.status());
  if (!answer.isOk() || answer->value("step", "") != "paused") {
    removeMarker(pid);
    if (!stream.isOk()) {
      say(kLogError,
          "pid {} is a PhOS job (it maps {}), but no phosd answers at {} ({}): its GPU state "
          "cannot "
          "be saved, so CRIU stops before freezing it",
          pid, *ring, socket, stream.status().message());
    } else {
      say(kLogError, "phosd did not checkpoint pid {}: {}", pid, refusal(answer));
    }
    return -1;
  }
  // CRIU's inventory names the plugin: CRIU refuses to restore the image
  // without it, which would map the job's files without their session.
  if (!gInInventory && add_inventory_plugin != nullptr) {
    if (add_inventory_plugin(kName) != 0) {
      say(kLogError, "cannot add the plugin to CRIU's inventory");
      return -1;  // exit("failed") ends phosd's side
    }
    gInInventory = true;
  }
  say(kLogInfo, "pid {}: GPU state cut by phosd; CRIU may freeze it", pid);
  gDumps.emplace(pid, std::move(*stream));
  return 0;
}

int checkpointDevices(int pid) {
  auto it = gDumps.find(pid);
  if (it == gDumps.end()) return -ENOTSUP;
  ipc::ControlStream& stream = it->second;
  Status sent = stream.writeLine(json{{"step", "frozen"}}.dump());
  Result<json> answer = sent.isOk() ? nextAnswer(stream) : Result<json>(sent);
  if (!answer.isOk() || answer->value("step", "") != "saved") {
    say(kLogError, "saving the GPU state of pid {} failed: {}", pid, refusal(answer));
    removeMarker(pid);
    gDumps.erase(it);  // phosd has given its final answer, or is gone
    return -1;
  }
  return 0;
}

void finishDumps(int ret) {
  for (auto& [pid, stream] : gDumps) {
    Status sent = stream.writeLine(json{{"step", ret == 0 ? "dumped" : "failed"}}.dump());
    Result<json> answer = sent.isOk() ? nextAnswer(stream) : Result<json>(sent);
    if (ret != 0) {
      removeMarker(pid);
      continue;
    }
    if (answer.isOk() && answer->value("ok", false)) {
      const json& report = (*answer)["report"];
      say(kLogInfo, "pid {}: GPU state saved in {} ({} bytes)", pid,
          report.value("image", std::string("?")), report.value("gpu_bytes", uint64_t{0}));
    } else {
      // CRIU's dump stands (exit gives no way to fail it): the marker left
      // beside it makes a restore refuse the image.
      say(kLogError, "pid {}: its GPU state was NOT saved ({}); this image cannot be restored", pid,
          refusal(answer));
    }
  }
  gDumps.clear();
}

// phos-PID.required markers and phos-PID/ images in CRIU's image directory.
struct Found {
  std::set<pid_t> required;
  std::set<pid_t> images;
};

std::optional<pid_t> pidAfterPrefix(std::string_view name, std::string_view suffix) {
  constexpr std::string_view kPrefix = "phos-";
  if (!name.starts_with(kPrefix) || !name.ends_with(suffix)) return std::nullopt;
  const std::string_view digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - suffix.size());
  pid_t pid = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || pid <= 0)
    return std::nullopt;
  return pid;
}

Found scan(int directory) {
  Found found;
  const int fd = ::dup(directory);
  DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (d == nullptr) {
    if (fd >= 0) ::close(fd);
    return found;
  }
  ::rewinddir(d);
  while (dirent* entry = ::readdir(d)) {
    const std::string_view name = entry->d_name;
    if (auto pid = pidAfterPrefix(name, ".required")) found.required.insert(*pid);
    struct stat st {};
    if (auto pid = pidAfterPrefix(name, "");
        pid && ::fstatat(directory, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode)) {
      found.images.insert(*pid);
    }
  }
  ::closedir(d);
  return found;
}

int initRestore() {
  // CRIU's inventory says whether the dump used this plugin (an image of
  // CRIU before 4.1 has no list: then the directory says).
  if (check_and_remove_inventory_plugin != nullptr &&
      !check_and_remove_inventory_plugin(kName, std::strlen(kName))) {
    return 0;
  }
  const std::optional<std::string> dir = imagesDirectory();
  if (!dir) return 0;
  const Found found = scan(criu_get_image_dir());
  for (pid_t pid : found.required) {
    if (found.images.count(pid) == 0) {
      say(kLogError,
          "{}: the GPU state of pid {} was not saved ({} without {}/): this image cannot be "
          "restored",
          *dir, pid, markerName(pid), imageName(pid));
      return -1;
    }
  }
  for (pid_t pid : found.images) {
    // The phosd the marker names, unless CRIU's environment names one.
    // (The marker comes with the image: a field of another type is ignored.)
    const json marker = readMarker(criu_get_image_dir(), markerName(pid));
    const bool namesRuntime = marker.contains("runtime_dir") && marker["runtime_dir"].is_string();
    const std::string runtime =
        runtimeDirectory(namesRuntime ? marker["runtime_dir"].get<std::string>() : std::string());
    const std::string socket = ipc::controlSocketPath(runtime);
    const std::string image = fmt::format("{}/{}", *dir, imageName(pid));
    auto stream = ipc::ControlStream::open(
        socket, json{{"op", "restore"}, {"image", image}, {"eager", true}}.dump());
    if (!stream.isOk()) {
      say(kLogError,
          "{} holds the GPU state of pid {}, and no phosd answers at {} ({}): start one (`phos "
          "daemon --runtime-dir {}`) and restore again",
          image, pid, socket, stream.status().message(), runtime);
      return -1;
    }
    Result<json> answer = nextAnswer(*stream);
    if (!answer.isOk() || !answer->value("ok", false)) {
      say(kLogError, "phosd could not re-create the GPU session of {}: {}", image, refusal(answer));
      return -1;
    }
    say(kLogInfo, "pid {}: GPU session {} re-created from {}", pid, answer->value("session", 0),
        image);
    const bool namesNsPid = marker.contains("ns_pid") && marker["ns_pid"].is_number_integer();
    const pid_t nsPid = namesNsPid ? marker["ns_pid"].get<pid_t>() : pid;
    gRestores.push_back({pid, nsPid, std::move(*stream)});
  }
  return 0;
}

// A restored task takes the session it had. CRIU gives it back the pid it
// saw itself as (in a container: its namespace's); as phosd numbers it, it
// may be another than at the dump (a container restored with a new PID
// namespace), and phosd moves the session to it.
int resumeDevicesLate(int pid) {
  auto nsPid = pidInOwnNamespace(pid);
  auto it = std::find_if(gRestores.begin(), gRestores.end(), [&](const Restoring& r) {
    return nsPid.isOk() ? r.nsPid == *nsPid : r.dumpedPid == pid;
  });
  if (it == gRestores.end()) return -ENOTSUP;
  ipc::ControlStream& stream = it->stream;
  Status sent = stream.writeLine(json{{"adopt", pid}}.dump());
  Result<json> answer = sent.isOk() ? nextAnswer(stream) : Result<json>(sent);
  const pid_t dumped = it->dumpedPid;
  gRestores.erase(it);
  if (!answer.isOk() || !answer->value("ok", false)) {
    // CRIU 4.1 goes on whatever this hook returns: the task must not run
    // without its session.
    say(kLogError, "pid {} could not take its GPU session back ({}); it is killed before it runs",
        pid, refusal(answer));
    ::kill(pid, SIGKILL);
    return -1;
  }
  say(kLogInfo, "pid {} (pid {} at the dump): runs with its GPU session", pid, dumped);
  return 0;
}

int pluginInit(int stage) {
  gStage = stage;
  gInInventory = false;
  if (standsAside() || stage != kRestore) return 0;
  return initRestore();
}

void pluginExit(int stage, int ret) {
  if (stage == kDump) finishDumps(ret);
  gDumps.clear();
  gRestores.clear();  // phosd abandons the sessions no task adopted
}

Descriptor describe() {
  Descriptor d{};
  d.name = kName;
  d.init = pluginInit;
  d.exit = pluginExit;
  d.version = kInterfaceVersion;
  d.maxHooks = kHookCount;
  d.hooks[kPauseDevices] = reinterpret_cast<void*>(&pauseDevices);
  d.hooks[kCheckpointDevices] = reinterpret_cast<void*>(&checkpointDevices);
  d.hooks[kResumeDevicesLate] = reinterpret_cast<void*>(&resumeDevicesLate);
  return d;
}

}  // namespace
}  // namespace phos::criu_plugin

// What CRIU looks up after dlopen().
extern "C" {
__attribute__((visibility("default"))) phos::criu_plugin::Descriptor CR_PLUGIN_DESC =
    phos::criu_plugin::describe();
}
