// SPDX-License-Identifier: Apache-2.0
// phosd: the daemon that owns every GPU context of its clients. It loads the
// driver, keeps a context pool, listens on its control socket, serves one
// session per client process and frees a session when its process dies.
#pragma once

#include <atomic>
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
  int poolContextsPerDevice = 2;
  ipc::RingGeometry ring{256, 16384};
};

// The vgpu driver this build ships (its path), empty if none was built.
std::string defaultVgpuDriver();
// What DaemonOptions::driver empty resolves to, and why.
struct DriverChoice {
  std::string path;
  std::string reason;
};
DriverChoice chooseDriver(const std::string& requested);

class Daemon {
 public:
  // Loads the driver, fills the context pool and binds the control socket
  // (refusing to start when another daemon answers on it).
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
