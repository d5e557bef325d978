// SPDX-License-Identifier: Apache-2.0
// Session: everything phosd holds for one application process: its call
// ring, virtual handles, contexts, allocations and pinned memory, and the
// thread that serves its calls in order.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "context_pool.h"
#include "driver_table.h"
#include "handle_table.h"
#include "phos/common/ipc/call_ring.h"
#include "server_call.h"

namespace phos::daemon {

// A device allocation of the session.
struct Allocation {
  CUdeviceptr address = 0;
  size_t bytes = 0;
  uint64_t context = 0;  // virtual id of the context it belongs to
};

// Pinned host memory: a shared-memory file mapped at the same address in the
// application and in phosd.
struct PinnedRange {
  uintptr_t address = 0;
  size_t bytes = 0;      // what the application asked for
  size_t mapped = 0;     // page-rounded
  unsigned flags = 0;
  std::string path;
  uint64_t context = 0;
};

// A context the session owns, by virtual id.
struct SessionContext {
  CUcontext real = nullptr;
  int device = 0;
  bool primary = false;
};

// A session's primary context of one device: the driver's primary context
// is one per process (here: shared by every session), so each session gets a
// context of its own from the pool, reference counted as CUDA documents.
struct PrimaryContext {
  uint64_t id = 0;  // stable for the session, across release and retain
  unsigned refs = 0;
  unsigned flags = 0;
};

struct SessionInfo {
  uint64_t id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  std::string command;
  uint64_t allocations = 0;
  uint64_t deviceBytes = 0;
  uint64_t pinnedBytes = 0;
  uint64_t modules = 0;
  uint64_t contexts = 0;
  uint64_t calls = 0;
  uint64_t launches = 0;
  std::vector<std::string> kernels;  // names of the functions it has launched
};

class Session {
 public:
  Session(uint64_t id, pid_t pid, uid_t uid, const DriverTable& driver, ContextPool& pool,
          const ServerTable& servers, std::string runtimeDir);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Creates the ring file (owned by `uid`, mode 0600) and starts serving.
  Status start(const ipc::RingGeometry& geometry);
  // Stops serving and frees everything: contexts go back to the pool
  // (destroyed, which frees their memory), files are removed.
  void stop();

  uint64_t id() const { return id_; }
  pid_t pid() const { return pid_; }
  uid_t uid() const { return uid_; }
  const std::string& ringPath() const { return ringPath_; }
  SessionInfo info() const;

  // ---- used by server functions (on the session's thread) -----------------
  const DriverTable& driver() const { return driver_; }
  ContextPool& pool() { return pool_; }
  HandleTable& handles() { return handles_; }
  std::map<uint64_t, SessionContext>& contexts() { return contexts_; }
  PrimaryContext& primary(int device) { return primaries_[device]; }
  // The virtual id of the context current for the call being served.
  uint64_t currentContext() const { return currentContext_; }

  const Allocation* findAllocation(CUdeviceptr p) const;
  const PinnedRange* findPinned(uintptr_t p) const;
  // Inside an allocation or a pinned range of this session.
  bool ownsRange(CUdeviceptr p, size_t bytes) const;
  void addAllocation(const Allocation& a);
  void removeAllocation(CUdeviceptr p);
  Result<PinnedRange> createPinned(size_t bytes, unsigned flags);
  Status freePinned(uintptr_t address);

  // The per-thread default stream of application thread `thread` in the
  // current context (created on first use).
  Result<CUstream> perThreadStream(uint64_t thread);

  // Posted calls report errors at the next synchronizing call.
  void deferError(CUresult r) {
    if (deferred_ == CUDA_SUCCESS) deferred_ = r;
  }
  CUresult takeDeferredError() {
    CUresult r = deferred_;
    deferred_ = CUDA_SUCCESS;
    return r;
  }

  // Application memory (process_vm_readv/writev).
  Status readApplication(uintptr_t address, void* out, size_t bytes) const;
  Status writeApplication(uintptr_t address, const void* data, size_t bytes) const;
  // A host staging buffer of the session (registered with the driver).
  std::span<std::byte> staging();

  // Destroys a context the session owns (and what lived in it).
  void destroyContext(uint64_t id);
  // Called when a launch of `function` (virtual id) was served.
  void noteLaunch(uint64_t function);
  void noteModule(int delta) { modules_ += delta; }
  void setFunctionName(uint64_t function, std::string name);
  const std::string* functionName(uint64_t function) const;

 private:
  void serve();
  void dispatch(const ipc::CallRing::Request& request);
  bool makeCurrent(uint64_t context);

  const uint64_t id_;
  const pid_t pid_;
  const uid_t uid_;
  const DriverTable& driver_;
  ContextPool& pool_;
  const ServerTable& servers_;
  const std::string runtimeDir_;
  std::string ringPath_;
  std::optional<ipc::CallRing> ring_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  // Owned by the serving thread; info() takes mutex_ for the counters it reads.
  mutable std::mutex mutex_;
  HandleTable handles_;
  std::map<uint64_t, SessionContext> contexts_;
  std::map<int, PrimaryContext> primaries_;
  std::map<CUdeviceptr, Allocation> allocations_;
  std::map<uintptr_t, PinnedRange> pinned_;
  std::map<std::pair<uint64_t, uint64_t>, CUstream> perThreadStreams_;
  std::map<uint64_t, std::string> functionNames_;
  std::map<uint64_t, uint64_t> launchesByFunction_;
  uint64_t currentContext_ = 0;
  CUcontext currentReal_ = nullptr;
  CUresult deferred_ = CUDA_SUCCESS;
  uint64_t calls_ = 0;
  uint64_t launches_ = 0;
  int64_t modules_ = 0;
  uint64_t pinnedSerial_ = 0;
  void* staging_ = nullptr;
  size_t stagingBytes_ = 0;
  std::vector<std::byte> replyBuffer_;
};

}  // namespace phos::daemon
