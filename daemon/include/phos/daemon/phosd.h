// SPDX-License-Identifier: Apache-2.0
// phosd: the daemon that owns every GPU context of its clients. Its main
// process listens on the control socket and keeps spare worker processes
// ready (each has loaded the driver and pre-created its contexts); each client
// process's session is served by a worker of its own, which exits when the
// client dies. Main never loads the driver (docs/remoting.md, "Processes").
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "phos/common/ipc/call_ring.h"
#include "phos/common/status.h"

namespace phos::daemon {

struct DaemonOptions {
  // The libcuda.so.1 to drive; empty: NVIDIA's driver when it finds a GPU,
  // else the built-in vgpu (defaultVgpuDriver()).
  std::string driver;
  std::string runtimeDir;        // empty: ipc::runtimeDir()
  // Workers kept ready for the next attach or restore (`phos daemon --pool`);
  // one is forked in the background whenever one is taken.
  int spareWorkers = 2;
  // Contexts each worker creates on each device before it is ready
  // (`--pool-contexts`); a session taking them gets replacements in the
  // background.
  int contextsPerDevice = 1;
  // How long an attach or restore waits for a worker when none is ready,
  // and how long start() waits for the first one.
  std::chrono::seconds workerWait{30};
  // A signature database (`phos-instrument scan`, docs/speculation.md) whose
  // declarations refine the speculation of the kernels it names; empty: none.
  std::string signatures;
  ipc::RingGeometry ring{256, 16384};
  // Live migration (docs/migration.md): the shared key's file, which this
  // daemon proves when it migrates a job out and demands of peers migrating
  // one in; "ADDR:PORT" to accept migrations on (needs keyFile); and the phos
  // binary that restores what arrives and compiles validator twins in
  // helper processes (`phos jit`; phos daemon passes itself).
  std::string keyFile;
  std::string listen;
  std::string cli;
};

// The vgpu driver this build ships (its path), empty if none was built.
std::string defaultVgpuDriver();
// What DaemonOptions::driver empty resolves to, and why. NVIDIA's driver is
// probed in a short-lived child process: the caller never initializes it.
struct DriverChoice {
  std::string path;
  std::string reason;
};
DriverChoice chooseDriver(const std::string& requested);

// `phos jit`, which workers run to compile validator twins out of their own
// process (daemon/src/session/jit_helper.h): PTX from descriptor `input`, the image
// the driver made of it for device `ordinal` to stdout. Returns the exit status.
int runJitHelper(const std::string& driverPath, int ordinal, int input);

class Daemon {
 public:
  // Binds the control socket (refusing to start when another daemon answers
  // on it) and starts the spare workers, waiting for the first one to load
  // the driver. Workers are forked from the calling process: it must not
  // have initialized a CUDA driver, and should have no other threads.
  static Result<std::unique_ptr<Daemon>> start(const DaemonOptions& options);
  ~Daemon();

  // Serves until `stop` becomes true or a client asks it to stop.
  Status run(const std::atomic<bool>& stop);

  const std::string& socketPath() const;
  const std::string& driverPath() const;

  struct Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace phos::daemon
