// SPDX-License-Identifier: Apache-2.0
// `phos daemon` (run phosd in the foreground), `phos run -- CMD` (run a
// program under PhOS, starting a per-user daemon if none runs) and `phos ps`
// (sessions of the daemon).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "byte_units.h"
#include "phos/common/crash_report.h"
#include "phos/common/ipc/control.h"
#include "phos/common/log.h"
#include "fault_tolerance.h"
#include "phos/daemon/phosd.h"
#include "subcommands.h"

#ifndef PHOS_SDK_PYTHON_DIR
#define PHOS_SDK_PYTHON_DIR ""
#endif
#ifndef PHOS_SHIM_LIBRARY
#define PHOS_SHIM_LIBRARY ""
#endif

namespace phos::cli {
namespace {

using json = nlohmann::json;

std::atomic<bool> stopRequested{false};

void onSignal(int) { stopRequested.store(true); }

struct DaemonArgs {
  std::string driver;
  std::string runtimeDir;
  int pool = 2;
  int poolContexts = 1;
  std::string signatures;
  std::string keyFile;
  std::string listen;
  std::string sessionDir;
  bool stop = false;
};

std::string runtimeDirOf(const std::string& given) { return given.empty() ? ipc::runtimeDir() : given; }

int runDaemon(const DaemonArgs& args) {
  const std::string dir = runtimeDirOf(args.runtimeDir);
  if (args.stop) {
    auto answer = ipc::controlRequest(ipc::controlSocketPath(dir), R"({"op":"stop"})");
    if (!answer.isOk()) {
      std::fprintf(stderr, "phos daemon --stop: %s\n", answer.status().message().c_str());
      return kExitFailure;
    }
    auto reply = json::parse(*answer, nullptr, false);
    if (reply.is_discarded() || !reply.value("ok", false)) {
      std::fprintf(stderr, "phos daemon --stop: refused: %s\n", answer->c_str());
      return kExitFailure;
    }
    return kExitOk;
  }
  if (args.pool < 0 || args.pool > 64) {
    std::fprintf(stderr, "phos daemon: --pool must be 0..64, not %d\n", args.pool);
    return kExitBadInput;
  }
  if (args.poolContexts < 0 || args.poolContexts > 16) {
    std::fprintf(stderr, "phos daemon: --pool-contexts must be 0..16, not %d\n", args.poolContexts);
    return kExitBadInput;
  }
  if (!args.sessionDir.empty()) {
    std::error_code ec;
    if (args.sessionDir.front() != '/' || !std::filesystem::is_directory(args.sessionDir, ec)) {
      std::fprintf(stderr,
                   "phos daemon: --session-dir must be an existing directory named by its absolute "
                   "path, not '%s'\n",
                   args.sessionDir.c_str());
      return kExitBadInput;
    }
    // ipc::sessionDir() reads it, here and in the workers forked from here
    // (no thread runs yet).
    ::setenv("PHOS_SESSION_DIR", args.sessionDir.c_str(), 1);
  }
  log::setup({.toStderr = true});
  installCrashReport("phosd");  // its workers, forked from it, too
  daemon::DaemonOptions options;
  options.driver = args.driver;
  options.runtimeDir = dir;
  options.spareWorkers = args.pool;
  options.contextsPerDevice = args.poolContexts;
  options.signatures = args.signatures;
  options.keyFile = args.keyFile;
  options.listen = args.listen;
  // What restores the jobs migrated in: this very binary (phos restore).
  std::error_code ec;
  options.cli = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  auto started = daemon::Daemon::start(options);
  if (!started.isOk()) {
    std::fprintf(stderr, "phos daemon: %s\n", started.status().message().c_str());
    return started.status().code() == Code::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  auto& d = **started;
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::fprintf(stderr, "phosd: listening on %s (driver %s)\n", d.socketPath().c_str(), d.driverPath().c_str());
  Status s = d.run(stopRequested);
  if (!s.isOk()) {
    std::fprintf(stderr, "phos daemon: %s\n", s.message().c_str());
    return kExitFailure;
  }
  return kExitOk;
}

struct RunArgs {
  std::string driver;
  std::string runtimeDir;
  std::vector<std::string> command;
  bool validate = false;  // PHOS_VALIDATE=1: launches run as validator twins
  std::string traceApi;   // PHOS_TRACE_API: where the shim writes the entry points the job called
  bool faultTolerant = false;  // --ft: supervised, checkpointed, restored (fault_tolerance.h)
  FaultToleranceOptions ft;
  std::string ftLevels = "dram,disk";
};

// Whether execvp would find `name`: a path, or a file of $PATH. Otherwise
// `why` says what is wrong.
bool findsProgram(const std::string& name, std::string* why) {
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) == 0) return true;
    *why = std::strerror(errno);
    return false;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    if (access((dir + "/" + name).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  *why = "not found in PATH";
  return false;
}

// A directory whose libcuda.so.1 is the shim, first on the job's library
// path: a program linked with -lcuda (libcuda.so.1 in DT_NEEDED) loads PhOS,
// not NVIDIA's driver, and starts on a host that has none. The dynamic loader
// maps the file the shim is preloaded from only once.
//
// It lives in the runtime directory, "driver/". A user of a root phosd
// (/run/phos) may not write there: such a job uses the directory if it already
// links to this shim, else a private one of the user's own.
Status linkShim(const std::string& dir, const std::string& target) {
  const std::string link = dir + "/libcuda.so.1";
  std::error_code ec;
  if (std::filesystem::read_symlink(link, ec) == target) return Status::ok();
  // Replaced atomically: a job starting now sees the old link or the new one.
  const std::string tmp = link + fmt::format(".{}", getpid());
  std::filesystem::remove(tmp, ec);
  if (symlink(target.c_str(), tmp.c_str()) != 0 || rename(tmp.c_str(), link.c_str()) != 0) {
    Status s = makeError(Code::kIo, "cannot link {} to {}: {}", link, target, std::strerror(errno));
    std::filesystem::remove(tmp, ec);
    return s;
  }
  return Status::ok();
}

// A directory only this user may change: created 0700, or an existing one it
// owns that no one else may write (anything else could plant a libcuda.so.1).
Status ownPrivateDirectory(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return makeError(Code::kIo, "cannot create {}: {}", dir, std::strerror(errno));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return makeError(Code::kIo, "cannot stat {}: {}", dir, std::strerror(errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return makeError(Code::kPermissionDenied,
                     "{} is not a private directory of uid {} (a directory it owns, not writable by others)", dir,
                     geteuid());
  }
  return Status::ok();
}

Result<std::string> driverDirectory(const std::string& runtimeDir, const std::string& shim) {
  std::error_code ec;
  const std::string target = std::filesystem::absolute(shim, ec).string();
  const std::string shared = runtimeDir + "/driver";
  const bool created = mkdir(shared.c_str(), 0755) == 0 || errno == EEXIST;
  Status linked = created ? linkShim(shared, target) : makeError(Code::kIo, "cannot create {}: {}", shared,
                                                                 std::strerror(errno));
  if (linked.isOk()) return shared;
  if (geteuid() == 0) return linked;
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const std::string own = xdg != nullptr && *xdg != '\0' ? fmt::format("{}/phos-driver", xdg)
                                                         : fmt::format("/tmp/phos-driver-{}", geteuid());
  Status mine = ownPrivateDirectory(own);
  if (mine.isOk()) mine = linkShim(own, target);
  if (!mine.isOk()) {
    return makeError(Code::kIo, "{}; and no directory of this user's own: {}", linked.message(), mine.message());
  }
  return own;
}

int runRun(const RunArgs& args) {
  if (args.command.empty()) {
    std::fprintf(stderr, "phos run: no command given (phos run -- CMD ARGS...)\n");
    return kExitBadInput;
  }
  // Before a daemon is started for it.
  if (std::string why; !findsProgram(args.command.front(), &why)) {
    std::fprintf(stderr, "phos run: cannot run %s: %s\n", args.command.front().c_str(), why.c_str());
    return kExitBadInput;
  }
  const char* shimEnv = std::getenv("PHOS_SHIM");
  const std::string shim = shimEnv != nullptr && *shimEnv != '\0' ? shimEnv : PHOS_SHIM_LIBRARY;
  if (shim.empty() || access(shim.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "phos run: libphos.so not found at '%s' (set PHOS_SHIM)\n", shim.c_str());
    return kExitFailure;
  }
  const std::string dir = runtimeDirOf(args.runtimeDir);
  if (Status s = ensureDaemon(dir, args.driver); !s.isOk()) {
    std::fprintf(stderr, "phos run: %s\n", s.message().c_str());
    return kExitFailure;
  }
  std::string preload = shim;
  if (const char* old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0') preload += std::string(":") + old;
  // The job's own: phos run --ft stays around to restore it, and what it
  // runs (phos restore, a daemon that one starts) must not load the shim.
  std::vector<std::pair<std::string, std::string>> jobEnvironment{{"LD_PRELOAD", preload}};
  if (args.validate) jobEnvironment.emplace_back("PHOS_VALIDATE", "1");
  if (!args.traceApi.empty()) jobEnvironment.emplace_back("PHOS_TRACE_API", args.traceApi);
  auto driverDir = driverDirectory(dir, shim);
  if (!driverDir.isOk()) {
    std::fprintf(stderr, "phos run: %s\n", driverDir.status().message().c_str());
    return kExitFailure;
  }
  std::string libraryPath = *driverDir;
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old != nullptr && *old != '\0') {
    libraryPath += std::string(":") + old;
  }
  jobEnvironment.emplace_back("LD_LIBRARY_PATH", libraryPath);
  setenv("PHOS_RUNTIME_DIR", dir.c_str(), 1);
  // The application SDK (sdk/): its checkpoints run this phos, and Python
  // finds phos_sdk.
  std::error_code ec;
  if (auto self = std::filesystem::read_symlink("/proc/self/exe", ec); !ec) setenv("PHOS_CLI", self.c_str(), 1);
  if (std::string sdk = PHOS_SDK_PYTHON_DIR; !sdk.empty()) {
    if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') sdk += std::string(":") + old;
    setenv("PYTHONPATH", sdk.c_str(), 1);
  }
  std::vector<char*> argv;
  for (const auto& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
#ifdef PHOS_HAVE_FAULT_TOLERANCE
  if (args.faultTolerant) {
    FaultToleranceOptions ft = args.ft;
    ft.runtimeDir = dir;
    ft.jobEnvironment = jobEnvironment;
    ft.levels.clear();
    for (size_t start = 0; start <= args.ftLevels.size();) {
      size_t end = args.ftLevels.find(',', start);
      if (end == std::string::npos) end = args.ftLevels.size();
      if (end > start) ft.levels.push_back(args.ftLevels.substr(start, end - start));
      start = end + 1;
    }
    return runFaultTolerant(ft, argv.data());
  }
#endif
  for (const auto& [name, value] : jobEnvironment) setenv(name.c_str(), value.c_str(), 1);
  // exec: the program keeps this pid (what `phos checkpoint --pid` takes),
  // and its exit code is ours.
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "phos run: cannot run %s: %s\n", argv[0], std::strerror(errno));
  return errno == ENOENT ? kExitBadInput : kExitFailure;
}

struct ValidateArgs {
  std::string runtimeDir;
  int64_t pid = 0;
  bool json = false;
};

// What the validator twins of a session reported so far (the session runs
// under `phos run --validate`, or a checkpoint or restore is in progress).
int runValidate(const ValidateArgs& args) {
  if (args.pid <= 0) {
    std::fprintf(stderr, "phos validate: --pid must name a process (got %lld)\n", static_cast<long long>(args.pid));
    return kExitBadInput;
  }
  const std::string socket = ipc::controlSocketPath(runtimeDirOf(args.runtimeDir));
  json request{{"op", "validation"}, {"pid", args.pid}};
  auto answer = ipc::controlRequest(socket, request.dump(), std::chrono::seconds(30));
  if (!answer.isOk()) {
    std::fprintf(stderr, "phos validate: %s\n", answer.status().message().c_str());
    return kExitFailure;
  }
  auto reply = json::parse(*answer, nullptr, false);
  if (reply.is_discarded() || !reply.is_object()) {
    std::fprintf(stderr, "phos validate: unexpected answer from the daemon: %s\n", answer->c_str());
    return kExitFailure;
  }
  if (!reply.value("ok", false)) {
    std::fprintf(stderr, "phos validate: %s\n", reply.value("error", std::string("the daemon refused")).c_str());
    return ipc::isBadRequest(reply.value("code", std::string())) ? kExitBadInput : kExitFailure;
  }
  if (args.json) {
    std::puts(reply.dump(2).c_str());
    return kExitOk;
  }
  std::printf("pid %lld: validation %s\n", static_cast<long long>(args.pid), reply.value("mode", "?").c_str());
  std::printf("  launches %llu, as twins %llu, without twin %llu, incomplete speculation %llu\n",
              reply.value("launches", 0ull), reply.value("twin_launches", 0ull),
              reply.value("unvalidated_launches", 0ull), reply.value("incomplete_speculations", 0ull));
  std::printf("  accesses outside the speculated buffers: %llu\n", reply.value("violations", 0ull));
  for (const auto& v : reply.value("reported", json::array())) {
    std::printf("    %s %s of %u bytes at %s (instruction %u)\n", v.value("kernel", "?").c_str(),
                v.value("kind", "?").c_str(), v.value("size", 0u), v.value("address", "?").c_str(),
                v.value("instruction", 0u));
  }
  return kExitOk;
}

struct PsArgs {
  std::string runtimeDir;
  bool json = false;
};

int runPs(const PsArgs& args) {
  const std::string socket = ipc::controlSocketPath(runtimeDirOf(args.runtimeDir));
  auto answer = ipc::controlRequest(socket, R"({"op":"ps"})");
  if (!answer.isOk()) {
    std::fprintf(stderr, "phos ps: %s\n", answer.status().message().c_str());
    return kExitFailure;
  }
  auto reply = json::parse(*answer, nullptr, false);
  if (reply.is_discarded() || !reply.value("ok", false) || !reply.contains("sessions")) {
    std::fprintf(stderr, "phos ps: unexpected answer from the daemon: %s\n", answer->c_str());
    return kExitFailure;
  }
  if (args.json) {
    std::puts(reply["sessions"].dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-8s %-8s %-6s %12s %12s %8s %8s %10s  %s\n", "SESSION", "PID", "UID", "DEVICE-MEM", "PINNED",
              "CONTEXTS", "MODULES", "LAUNCHES", "COMMAND");
  for (const auto& s : reply["sessions"]) {
    std::printf("%-8llu %-8d %-6u %12s %12s %8llu %8llu %10llu  %s\n",
                static_cast<unsigned long long>(s.value("session", 0ull)), s.value("pid", 0),
                s.value("uid", 0u), formatBytes(s.value("device_bytes", 0ull)).c_str(),
                formatBytes(s.value("pinned_bytes", 0ull)).c_str(),
                static_cast<unsigned long long>(s.value("contexts", 0ull)),
                static_cast<unsigned long long>(s.value("modules", 0ull)),
                static_cast<unsigned long long>(s.value("launches", 0ull)), s.value("command", "").c_str());
    if (s.contains("kernels") && !s["kernels"].empty()) {
      std::string kernels;
      for (const auto& k : s["kernels"]) kernels += (kernels.empty() ? "" : ", ") + k.get<std::string>();
      std::printf("         kernels: %s\n", kernels.c_str());
    }
  }
  return kExitOk;
}

}  // namespace

// Drops libphos.so from LD_PRELOAD (the other entries stay).
static void unsetShimPreload() {
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload == nullptr) return;
  std::string kept, entries = preload;
  for (size_t start = 0; start <= entries.size();) {
    size_t end = entries.find_first_of(": ", start);
    if (end == std::string::npos) end = entries.size();
    const std::string entry = entries.substr(start, end - start);
    if (!entry.empty() && !entry.ends_with("libphos.so")) kept += (kept.empty() ? "" : ":") + entry;
    start = end + 1;
  }
  if (kept.empty()) {
    unsetenv("LD_PRELOAD");
  } else {
    setenv("LD_PRELOAD", kept.c_str(), 1);
  }
}

namespace {

// A daemon that holds `dir` but did not answer a ping: busy, not dead. Waits
// for it rather than starting a second one.
Status waitForDaemon(const std::string& dir, pid_t holder) {
  const std::string socket = ipc::controlSocketPath(dir);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ipc::controlRequest(socket, R"({"op":"ping"})", std::chrono::seconds(5)).isOk()) return Status::ok();
    Result<pid_t> now = ipc::daemonHoldingLock(dir);
    if (now.isOk() && *now == 0) return makeError(Code::kUnavailable, "phosd (pid {}) serving {} exited", holder, dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return makeError(Code::kUnavailable, "phosd (pid {}) holds {} but has not answered for 20 s", holder, dir);
}

Status startBackgroundDaemon(const std::string& dir, const std::string& driver) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errnoError(errno, fmt::format("cannot create {}", dir));
  const std::string logPath = dir + "/phosd.log";
  pid_t child = fork();
  if (child < 0) return errnoError(errno, "fork");
  if (child == 0) {
    setsid();
    int fd = open(logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    if (null >= 0) dup2(null, STDIN_FILENO);
    // A daemon under libphos.so would forward its own driver calls to itself.
    unsetShimPreload();
    // A second fork: the daemon is not our child, nobody has to reap it.
    if (fork() != 0) _exit(0);
    std::vector<std::string> argv{"phos", "daemon", "--runtime-dir", dir};
    if (!driver.empty()) {
      argv.push_back("--driver");
      argv.push_back(driver);
    }
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv("/proc/self/exe", cargv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const std::string socket = ipc::controlSocketPath(dir);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ipc::controlRequest(socket, R"({"op":"ping"})", std::chrono::seconds(2)).isOk()) return Status::ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return makeError(Code::kUnavailable, "the daemon did not start within 20 s (see {})", logPath);
}

}  // namespace

Status ensureDaemon(const std::string& dir, const std::string& driver) {
  if (ipc::controlRequest(ipc::controlSocketPath(dir), R"({"op":"ping"})", std::chrono::seconds(2)).isOk()) {
    return Status::ok();
  }
  Result<pid_t> holder = ipc::daemonHoldingLock(dir);
  if (holder.isOk() && *holder > 0) return waitForDaemon(dir, *holder);
  return startBackgroundDaemon(dir, driver);
}


void addDaemon(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("daemon", "Run phosd in the foreground (for systemd: see daemon/phosd.service)");
  auto args = std::make_shared<DaemonArgs>();
  cmd->add_option("--driver", args->driver,
                  "the libcuda.so.1 to drive (default: NVIDIA's driver if it sees a GPU, else vgpu)");
  cmd->add_option("--runtime-dir", args->runtimeDir, "where the control socket lives (default: $PHOS_RUNTIME_DIR, "
                                                      "/run/phos for root, else $XDG_RUNTIME_DIR/phos)");
  cmd->add_option("--pool", args->pool,
                  "worker processes kept ready for new sessions, each with the driver loaded (default 2)");
  cmd->add_option("--pool-contexts", args->poolContexts,
                  "contexts each worker pre-creates per device (default 1)");
  cmd->add_option("--signatures", args->signatures,
                  "a signature database from `phos-instrument scan` (kernel argument types from the sources)")
      ->envname("PHOS_SIGNATURES");
  cmd->add_option("--key", args->keyFile,
                  "shared key file for live migration: proven to targets, demanded of peers migrating in "
                  "(at least 16 bytes; e.g. head -c 32 /dev/urandom > FILE)");
  cmd->add_option("--session-dir", args->sessionDir,
                  "where sessions' shared files live, which applications map (default /dev/shm; "
                  "for containers "
                  "that share no /dev/shm with the host: docs/containers.md)")
      ->envname("PHOS_SESSION_DIR");
  cmd->add_option("--listen", args->listen, "accept migrations from peers holding the key on ADDR:PORT (needs --key)");
  cmd->add_flag("--stop", args->stop, "ask the running daemon to exit");
  cmd->callback([&runner, args] { runner = [args] { return runDaemon(*args); }; });
}

// Not listed in --help: phosd's workers run it to compile PTX outside their
// own process (daemon/src/session/jit_helper.h).
void addJit(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("jit", "Compile PTX read from a descriptor with a driver (phosd runs it)");
  cmd->group("");
  auto driver = std::make_shared<std::string>();
  auto device = std::make_shared<int>(0);
  auto input = std::make_shared<int>(0);
  cmd->add_option("--driver", *driver, "the libcuda.so.1 that compiles")->required();
  cmd->add_option("--device", *device, "the device ordinal to compile for")->check(CLI::NonNegativeNumber);
  cmd->add_option("--input-fd", *input, "the descriptor the PTX is read from")->check(CLI::NonNegativeNumber);
  cmd->callback([&runner, driver, device, input] {
    runner = [driver, device, input] { return daemon::runJitHelper(*driver, *device, *input); };
  });
}

void addRun(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("run", "Run a program under PhOS (starts a per-user daemon if none runs)");
  auto args = std::make_shared<RunArgs>();
  cmd->add_option("--driver", args->driver, "driver of a daemon started by this command");
  cmd->add_option("--runtime-dir", args->runtimeDir, "the daemon's runtime directory");
  cmd->add_flag("--validate", args->validate,
                "run every kernel as its validator twin, checked against speculation (see phos validate)");
  cmd->add_option("--trace-api", args->traceApi,
                  "at the job's exit, write every CUDA Driver API entry point it called, with counts and how PhOS "
                  "served it, to FILE ('-': stderr)")
      ->option_text("FILE")
      ->expected(0, 1)
      ->default_str("-");
#ifdef PHOS_HAVE_FAULT_TOLERANCE
  cmd->add_option("--ft", args->ft.directory,
                  "fault tolerance: checkpoint the job periodically (the interval the PhOS paper's model gives for its "
                  "measured stall and restore time) into host memory and DIR, and restore it from the newest good "
                  "image when it, or its daemon, dies (docs/fault-tolerance.md)")
      ->each([args](const std::string&) { args->faultTolerant = true; });
  cmd->add_option("--ft-levels", args->ftLevels,
                  "storage levels, least durable first: dram (host memory), disk (the --ft DIR), dir:PATH (any "
                  "directory, e.g. remote storage mounted here); default dram,disk");
  cmd->add_option("--ft-failures-per-gpu-hour", args->ft.failuresPerGpuHour,
                  "F of the model: expected failures of one GPU per hour (default 0.1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ft-interval", args->ft.intervalSeconds,
                  "a fixed interval in seconds instead of the model's")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ft-first-interval", args->ft.firstIntervalSeconds,
                  "seconds before the first checkpoint, whose stall the model then uses (default 10)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ft-promote-every", args->ft.promoteEvery,
                  "every k-th checkpoint of a level is copied to the next level (default: the multi-level model's "
                  "factor for the levels' measured costs, 4 until they are measured)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--ft-level-failures-per-hour", args->ft.levelFailuresPerHour,
                  "failures per hour that only the 2nd, 3rd... level survives (a host, a node's disk); default: a "
                  "quarter of the level below's")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ft-mode", args->ft.mode, "the checkpoints' protocol: cow (default), recopy or stop")
      ->check(CLI::IsMember({"cow", "recopy", "stop"}));
#endif
  cmd->add_option("command", args->command, "the program and its arguments (after --)")->required();
  cmd->prefix_command(false);
  cmd->callback([&runner, args] { runner = [args] { return runRun(*args); }; });
}

void addValidate(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("validate", "Show what a session's validator twins reported (phos run --validate)");
  auto args = std::make_shared<ValidateArgs>();
  cmd->add_option("--pid", args->pid, "the process")->required();
  cmd->add_option("--runtime-dir", args->runtimeDir, "the daemon's runtime directory");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([&runner, args] { runner = [args] { return runValidate(*args); }; });
}

void addPs(CLI::App& app, SubcommandRunner& runner) {
  auto* cmd = app.add_subcommand("ps", "List the daemon's sessions: processes, their memory and kernels");
  auto args = std::make_shared<PsArgs>();
  cmd->add_option("--runtime-dir", args->runtimeDir, "the daemon's runtime directory");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([&runner, args] { runner = [args] { return runPs(*args); }; });
}

}  // namespace phos::cli
