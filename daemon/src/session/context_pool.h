// SPDX-License-Identifier: Apache-2.0
// ContextPool: GPU contexts created when phosd starts, so that no session
// (and no restore) creates one on its critical path.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "session/driver_table.h"

namespace phos::daemon {

class ContextPool {
 public:
  // Creates `perDevice` contexts on each of the driver's devices.
  ContextPool(const DriverTable& driver, int perDevice);
  ~ContextPool();
  ContextPool(const ContextPool&) = delete;
  ContextPool& operator=(const ContextPool&) = delete;

  int deviceCount() const { return static_cast<int>(free_.size()); }
  // A context of `device`, not current on any thread. From the pool when it
  // has one, else created now. A worker serves one session: the pool is not
  // refilled once the session took from it. A context created in the
  // background while the session (or its restore) loads modules takes driver
  // memory where NVIDIA's driver would put the modules' variables, at a place
  // that varies from run to run, and a restore must find them where the job
  // had them (docs/gpu.md).
  Result<CUcontext> take(int device, unsigned flags);
  // Destroys a context a session no longer uses (freeing its memory), in the
  // background.
  void retire(CUcontext context, int device);

  // While one is held, retired contexts are kept, and destroyed when the last
  // goes: a checkpoint's or restore's own streams may be in a context the
  // application destroys meanwhile, and NVIDIA's driver faults on a stream
  // of a destroyed context (vgpu reports an error).
  class Hold {
   public:
    explicit Hold(ContextPool& pool) : pool_(pool) { pool_.hold(+1); }
    ~Hold() { pool_.hold(-1); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    ContextPool& pool_;
  };

  struct Stats {
    int device;
    int free;
    int target;
  };
  std::vector<Stats> stats() const;
  uint64_t misses() const;

 private:
  Result<CUcontext> create(int device, unsigned flags);
  void refill();
  void hold(int delta);

  const DriverTable& driver_;
  int perDevice_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::vector<CUcontext>> free_;
  std::vector<std::pair<CUcontext, int>> retired_;
  uint64_t misses_ = 0;
  int holds_ = 0;
  bool taken_ = false;  // a session took a context: the pool is no longer refilled
  bool stop_ = false;
  std::thread refiller_;
};

}  // namespace phos::daemon
