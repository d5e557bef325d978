// SPDX-License-Identifier: Apache-2.0
// Session: everything phosd holds for one application process: its call
// ring, its virtual handles, the thread that serves its calls in order, and
// its state in domain types that save and rebuild themselves (contexts,
// device memory, memory pools, modules, streams and events, pinned memory:
// docs/architecture.md).
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "phos/common/ipc/call_ring.h"
#include "phos/common/ipc/transfer_lane.h"
#include "phos/common/subprocess.h"
#include "phos/common/unique_fd.h"
#include "protocols/device_buffer.h"
#include "protocols/progress.h"
#include "session/application_vmm.h"
#include "session/context_pool.h"
#include "session/device_memory.h"
#include "session/driver_table.h"
#include "session/handle_table.h"
#include "session/launch_validator.h"
#include "session/link_states.h"
#include "session/memory_pools.h"
#include "session/pinned_memory.h"
#include "session/server_call.h"
#include "session/session_arrays.h"
#include "session/session_contexts.h"
#include "session/session_graphs.h"
#include "session/session_modules.h"
#include "session/stream_captures.h"
#include "session/stream_waits.h"
#include "session/streams_and_events.h"
#include "session/transfer_tracker.h"
#include "session/user_objects.h"

namespace phos::image {
class ImageReader;
class ImageWriter;
}  // namespace phos::image

namespace phos::daemon {

// Two host buffers registered with the driver, through which phosd copies
// between the application's pageable memory and the device (one chunk is
// copied by the driver while the next is read from the application), and the
// events that say when each is free again. One per context: registrations
// and events belong to a context.
struct CopyStaging {
  static constexpr size_t kBufferBytes = 8u << 20;
  std::byte* buffers[2] = {};
  CUevent done[2] = {};
  bool pending[2] = {};
  size_t bytes = kBufferBytes;  // of each buffer
  bool registered = false;
};

// Kernel printf output of the session's contexts, kept until the application
// fetches it at its next synchronizing call. vgpu writes into it from its
// stream workers; NVIDIA's driver prints to the process's stdout, which
// captureStdout() makes a memory file of this worker (it serves one session)
// and pending() empties into the output.
class KernelOutput final : public vgpu::PrintfSink {
 public:
  ~KernelOutput() override;
  void write(std::string_view text) override;
  // A failed assertion's message (vgpu's), for the application's stderr.
  void writeError(std::string_view text) override;
  bool pending();
  // Up to `max` bytes of stdout's text, then of stderr's, oldest first.
  std::pair<std::string, std::string> take(size_t max);
  // From now on, what this process writes to its stdout is kernel output.
  Status captureStdout();

 private:
  void drainStdout();
  void appendLocked(std::string_view text);

  static constexpr size_t kLimit = 64u << 20;  // beyond this, output is dropped (and said so)
  std::mutex mutex_;
  std::string text_;
  std::string errors_;
  bool truncated_ = false;
  int stdout_ = -1;        // the memory file behind fd 1, or -1
  size_t stdoutRead_ = 0;  // of it
};

struct SessionInfo {
  bool busy = false;  // in a call that outlasted the query: counters are from before it
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

class HostCallChannel;
class Engine;

class Session {
 public:
  Session(uint64_t id, pid_t pid, uid_t uid, const DriverTable& driver, ContextPool& pool,
          const ServerTable& servers, std::string runtimeDir);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Creates the ring file (owned by `uid`, mode 0600) and starts serving.
  Status start(const ipc::RingGeometry& geometry);
  // A session re-created by the engine from an image starts serving once its
  // process runs again.
  void startServing();
  // Seconds from startServing() to the end of the first call served (a
  // restored job's first call: where a migration's downtime ends), if any yet.
  std::optional<double> firstCallSeconds() const {
    const int64_t ns = firstCallNs_.load();
    if (ns < 0) return std::nullopt;
    return static_cast<double>(ns) / 1e9;
  }
  // Stops serving calls (waiting up to `timeout` for the call being served to
  // finish), so that the engine can read or change the session's state; the
  // application's calls wait in the ring. resume() serves them again.
  Status pause(std::chrono::milliseconds timeout);
  // pause() for a checkpoint, whose drain would invalidate a stream capture
  // in progress or wait forever behind a stream memory wait: parks only
  // between calls with neither, waiting up to `captureWait` for them to end
  // (the application's calls go on meanwhile); after that it parks anyway,
  // and drainContexts() names what is left. A deferred synchronization
  // holding no wait is waited for (pause's `timeout`).
  Status pause(std::chrono::milliseconds timeout, std::chrono::milliseconds captureWait);
  void resume();
  // Stops serving and frees everything: contexts go back to the pool
  // (destroyed, which frees their memory), files are removed.
  void stop();

  uint64_t id() const { return id_; }
  pid_t pid() const { return pid_.load(); }
  bool applicationAlive() const { return !processEnded(pid()); }
  // A restored session is taken by another pid than the one it saved (a
  // container restored into a new PID namespace: docs/containers.md). Called
  // before the session serves the new process.
  void adoptedBy(pid_t pid);
  uid_t uid() const { return uid_; }
  const std::string& ringPath() const { return ringPath_; }
  SessionInfo info() const;

  // Serves one request (a CallHeader and its arguments) on the calling thread
  // and returns its reply, written into `reply`. The serving thread calls it
  // for every request of the ring; the decoder tests and the ring fuzzer call
  // it directly on a session that was never started, without a ring.
  std::span<const std::byte> serveOne(std::span<const std::byte> request, bool expectsReply,
                                      std::span<std::byte> reply);

  // ---- used by server functions (on the session's thread) -----------------
  const DriverTable& driver() const { return driver_; }
  ContextPool& pool() { return pool_; }
  HandleTable& handles() { return handles_; }
  SessionContexts& contexts() { return contexts_; }
  PrimaryContext& primary(int device) { return contexts_.primary(device); }
  // The virtual id of the context current for the call being served.
  uint64_t currentContext() const { return currentContext_; }

  // The session's device memory (device_memory.h).
  DeviceMemory& memory() { return memory_; }
  const PinnedRange* findPinned(uintptr_t p) const;
  // Inside an allocation or a pinned range of this session.
  bool ownsRange(CUdeviceptr p, size_t bytes) const;
  // Device memory of the session at an address of its heap for `device`
  // (device_heap.h); a context must be current. A protocol's memory relief
  // runs before it gives up.
  CUresult allocateDevice(int device, size_t bytes, CUdeviceptr* address);
  // Frees what allocateDevice gave (after the session's work is done).
  CUresult freeDevice(CUdeviceptr address);
  // Waits for the work of the session's contexts (those of `device`, or
  // all) that may still use memory about to be freed; while a capture is in
  // progress, for every stream that is not capturing.
  void waitForWork(std::optional<int> device);
  // Defers `call` (ServerCall::defer) while a stream memory wait may hold the
  // work waitForWork(device) would wait for: the call's thread waits, and the
  // session serves the call that may release the wait. false: not deferred.
  bool deferBehindStreamWaits(ServerCall& call, std::optional<int> device);
  // Loads the validator's twin modules not loaded yet, compiling them while
  // the application's calls go on (the lock is held only to list and keep
  // them): a checkpoint calls it before its window, whose first launches
  // would otherwise wait for the compilation (docs/twins.md).
  void prepareTwinModules();
  // A context of the session on `device` (the current one if it is on it), or null.
  CUcontext contextOn(int device) const;
  // The driver's context current for the call being served.
  CUcontext currentRealContext() const { return currentReal_; }
  // The stream-ordered allocator's pools (memory_pools.h).
  MemoryPools& memoryPools() { return memoryPools_; }
  // Arrays and texture and surface objects (session_arrays.h).
  SessionArrays& arrays() { return arrays_; }
  // User objects and who holds their references (user_objects.h).
  UserObjects& userObjects() { return userObjects_; }
  // The application's own VMM reservations, memory and mappings (application_vmm.h).
  ApplicationVmm& vmm() { return vmm_; }
  // The linker states the program holds, by id (remoting/linker.cpp).
  std::map<uint64_t, LinkState>& links() { return links_.all(); }
  // The device of the current context (0 without one).
  int currentDevice() const;
  // A module or library loaded (numbered in the job's order), or unloaded.
  void recordModule(uint64_t id, ModuleRecord record) {
    if (record.order == 0) record.order = memory_.takeOrder();
    modules_.record(id, std::move(record));
  }
  void forgetModule(uint64_t id) { modules_.forget(id); }
  // What the session knows of its streams and events (streams_and_events.h).
  StreamsAndEvents& streamsAndEvents() { return streamsAndEvents_; }
  // The application's stream captures and its threads' capture modes
  // (stream_captures.h).
  StreamCaptures& captures() { return captures_; }
  // The stream memory waits that may still hold a stream (stream_waits.h).
  StreamWaits& streamWaits() { return streamWaits_; }
  // What a checkpoint saves of the application's graphs (session_graphs.h).
  SessionGraphs& graphs() { return graphs_; }
  // The scope the domains save and rebuild in (session_image.h).
  SessionScope scope() { return SessionScope{driver_, handles_, contexts_, currentContext_}; }
  // The context a stream, event, module or function (virtual id) was created
  // in; the current one when it is not known.
  uint64_t contextOf(uint64_t handle) const;
  Result<PinnedRange> createPinned(size_t bytes, unsigned flags, bool managed = false);
  // The pages of the application's [p, p+bytes) as a pinned range at their
  // address (PinnedMemory::createRegistered), not registered with the driver yet.
  Result<PinnedRange> createRegistered(uintptr_t p, size_t bytes, unsigned flags);
  const PinnedRange* findRegistered(uintptr_t p) const { return pinned_.findRegistered(p); }
  // Waits for the work of every context of the session (it may still use
  // the range), unregisters the range with the driver and removes it.
  Status freePinned(uintptr_t address);
  // Unregisters a pinned range with the driver, even when its context faulted.
  void unregisterPinned(const PinnedRange& range);

  // Posted calls report errors at the next synchronizing call.
  void deferError(CUresult r) {
    if (deferred_ == CUDA_SUCCESS) deferred_ = r;
  }
  CUresult takeDeferredError() {
    CUresult r = deferred_;
    deferred_ = CUDA_SUCCESS;
    return r;
  }

  // Transfer lane `index` of the session's ring (none past its last), and
  // the lanes registered with the driver (once, at their first use).
  std::optional<ipc::TransferLane> transferLane(uint32_t index) const;
  void registerLanes();
  // A lane an application thread is still inside although phosd is done
  // with it (ipc::leftBehind).
  std::optional<uint32_t> busyLane() const;

  // Application memory (process_vm_readv/writev).
  Status readApplication(uintptr_t address, void* out, size_t bytes) const;
  Status writeApplication(uintptr_t address, const void* data, size_t bytes) const;
  // Routes the kernel printf output of `context` to this session (vgpu only;
  // with NVIDIA's driver it goes to phosd's stdout).
  void captureOutput(CUcontext context);
  bool outputPending() { return output_->pending(); }

  // The current context's staging buffers (created on first use); nullptr
  // without a current context.
  CopyStaging* staging();

  // Destroys a context the session owns (and what lived in it).
  void destroyContext(uint64_t id);
  // The application's VMM mappings, which outlive contexts, each get a live
  // context of its device (none: 0, and a checkpoint refuses them).
  void rehomeMappings();
  // True for the id of a context the session destroyed (and did not re-bind,
  // as a retained primary context is).
  bool contextDestroyed(uint64_t id) const { return contexts_.destroyed(id); }
  // A stream or event the application destroyed: its id must never reach the
  // driver again (a checkpoint would query or time a freed object, and
  // NVIDIA's driver crashes on one), nor come back at a restore.
  void forgetHandle(uint64_t id);
  // Records that handle `id` is an object of the current context (a stream,
  // event, module or function): it dies with the context.
  void noteContextObject(HandleType type, uint64_t id);
  // The queue through which the session's streams run the application's host
  // functions (created on first use; its file is removed with the session).
  Result<std::shared_ptr<HostCallChannel>> hostCalls();
  // A graph's host node running the application's `function(userData)`
  // through hostCalls() at each launch (SessionGraphs::hostNode); `queue`,
  // if given, gets the queue's path for the shim.
  Result<CUDA_HOST_NODE_PARAMS> graphHostNode(uint64_t function, uint64_t userData,
                                              std::string* queue);
  // Speculation and validation of the session's launches (launch_validator.h).
  LaunchValidator& validator() { return validator_; }
  void setValidation(ValidationMode mode);
  // Parks the session, drains its contexts, collects what the twins reported,
  // and resumes it: the answer of `phos validate`.
  Result<nlohmann::json> validationReport(std::chrono::milliseconds timeout);
  // Installs (or, with an empty function, removes) the gate every call that
  // touches GPU state passes first; on the serving thread or while paused.
  void setAccessGate(AccessGate gate) { gate_ = std::move(gate); }
  bool hasAccessGate() const { return static_cast<bool>(gate_); }
  void passGate(const CallAccess& access) {
    if (gate_) gate_(access);
  }
  // Installed with a protocol's gate when the protocol holds device memory of
  // its own (copy-on-write shadows): an allocation of the application that
  // finds its device full calls it, and tries once more once it returns (the
  // protocol has given that device's memory back). Empty: none.
  using MemoryRelief = std::function<void(int device)>;
  void setMemoryRelief(MemoryRelief relief) { relief_ = std::move(relief); }
  // The application's own transfers, which the protocols' copies give way to.
  TransferTracker& transfers() { return transfers_; }
  // The session's allocations and pinned ranges as speculation sees them.
  std::optional<instrument::Buffer> bufferAt(uint64_t address) const;

  // Called when a launch of `function` (virtual id) was served.
  void noteLaunch(uint64_t function);
  // The program set an attribute of library kernel `kernel` (virtual id) used
  // as a function of the current context (cuFuncSetAttribute on the kernel's
  // handle): that function's own attributes are state a checkpoint saves.
  void noteKernelFunction(uint64_t kernel) { modules_.noteKernelFunction(kernel, currentContext_); }
  void noteModule(int delta) { moduleCount_ += delta; }
  void setFunctionName(uint64_t function, std::string name);
  const std::string* functionName(uint64_t function) const;

  // ---- for the checkpoint engine (engine.cpp; session_save.cpp) ------------
  // Holds the session's mutex, which the serving thread holds while it
  // serves a call: no call runs meanwhile.
  [[nodiscard]] std::unique_lock<std::timed_mutex> lockCalls() { return std::unique_lock(mutex_); }
  // Waits for everything the session's contexts run, every one of them; fails
  // naming the first context whose work failed (its memory cannot be
  // trusted). Mutex held.
  Status drainContexts();
  // The session's device allocations (not module globals), each with a
  // context of its device. Mutex held.
  std::vector<DeviceBuffer> allocationList() const;
  // One context of the session per device it uses. Mutex held.
  std::map<int, CUcontext> contextsByDevice() const;
  // A concurrent protocol's window (docs/checkpoint.md), opened while paused
  // with the mutex held: every call passes `gate` before it runs, launches
  // run as twins in mode `twins`, and the application's own transfers are
  // tracked for the protocol's copies to give way to.
  void openWindow(AccessGate gate, ValidationMode twins);
  // The window's end (paused, mutex held): the contexts drained, what the
  // twins reported since it opened (their report buffers freed when `after`
  // is off); no gate or memory relief, validation back to `after`, transfers
  // no longer tracked.
  std::vector<Violation> closeWindow(ValidationMode after);
  // Lists the variables of every module that has no list yet
  // (ModuleRecord::globalNames), while the application runs; takes the mutex.
  void listModuleGlobals();
  // Pinned memory, the ring and the host-call queue, into `state` and
  // `writer` (`bytes` grows by the pinned memory's): the application's CPU
  // writes them, so CRIU holds it frozen meanwhile. Mutex held.
  Status describeShared(image::ImageWriter& writer, nlohmann::json& state, uint64_t& bytes,
                        const ProgressFn& progress);
  // At a checkpoint (paused, mutex_ held; session_save.cpp): the description
  // of every object into `state` (contexts, pools, allocations, modules with
  // their globals, library modules, functions, kernels, streams, events),
  // each device buffer to copy (allocations, then module globals) into
  // `copies` with its blob in `writer`. Fails naming any object the program
  // holds that a restore could not make again.
  Status describe(image::ImageWriter& writer, nlohmann::json& state, std::vector<DeviceBuffer>& copies);
  // At a restore, before the process runs (session_rebuild.cpp): every
  // object of `state` (describe's, read from `reader`'s manifest) made again
  // under the id the application holds, with its files, pinned memory and
  // pending calls. With `deferred`, allocations are mapped and listed there,
  // their bytes not loaded.
  Status rebuildFrom(const image::ImageReader& reader, const nlohmann::json& state, const ProgressFn& progress,
                     std::vector<DeviceBuffer>* deferred);

 private:
  void serve();
  void dispatch(const ipc::CallRing::Request& request);
  // Serves again the deferred calls (ServerCall::defer) that are ready now.
  void serveDeferred();
  // For a synchronous copy that a stream memory wait would hold (its
  // default stream waits behind one): when it may be served; else null.
  std::function<bool()> heldBehindStreamWait(const ipc::CallHeader& header);
  bool makeCurrent(uint64_t context);
  // Frees the staging buffers of a context; it must be current.
  void freeStaging(uint64_t context);
  void freeStagingBuffers(CopyStaging& staging);
  void serveTakeOutput(ServerCall& call, size_t capacity);
  class Describer;  // session_save.cpp
  class Rebuilder;  // session_rebuild.cpp

  const uint64_t id_;
  std::atomic<pid_t> pid_;
  const uid_t uid_;
  const DriverTable& driver_;
  ContextPool& pool_;
  const ServerTable& servers_;
  const std::string runtimeDir_;
  std::string ringPath_;
  // Held (flock LOCK_SH) while the session owns its files: a restore of the
  // same image elsewhere sees them in use (session_rebuild.cpp).
  UniqueFd ringLock_;
  std::optional<ipc::CallRing> ring_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::chrono::steady_clock::time_point servingSince_{};
  std::atomic<int64_t> firstCallNs_{-1};

  // Owned by the serving thread, which holds mutex_ while it serves a call;
  // info() waits for it only briefly (a call may run for as long as a kernel).
  mutable std::timed_mutex mutex_;
  mutable std::mutex infoMutex_;
  mutable SessionInfo lastInfo_;  // guarded by infoMutex_: what info() says while a call runs
  // Takes the snapshot info() falls back on; mutex_ held.
  SessionInfo infoLocked() const;
  HandleTable handles_;
  SessionContexts contexts_;
  std::mutex hostCallsMutex_;  // not mutex_: stop() closes the queue while a call may be served
  std::shared_ptr<HostCallChannel> hostCalls_;
  PinnedMemory pinned_{id_, uid_};
  std::map<uint64_t, std::string> functionNames_;
  std::map<uint64_t, uint64_t> launchesByFunction_;
  uint64_t currentContext_ = 0;
  CUcontext currentReal_ = nullptr;
  CUresult deferred_ = CUDA_SUCCESS;
  // Read by info() without mutex_, while a call may be running.
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> launches_{0};
  std::atomic<int64_t> moduleCount_{0};
  std::map<uint64_t, CopyStaging> staging_;  // by context
  bool lanesRegistered_ = false;
  std::byte* lanesBase_ = nullptr;  // what was registered, for MemHostUnregister
  std::shared_ptr<KernelOutput> output_ = std::make_shared<KernelOutput>();
  std::vector<std::byte> replyBuffer_;
  DeviceMemory memory_{driver_, id_};
  ApplicationVmm vmm_{driver_, id_};  // its mappings are allocations of memory_
  MemoryPools memoryPools_{driver_};  // after memory_: its pending frees give heap ranges back
  SessionModules modules_;
  SessionArrays arrays_;
  UserObjects userObjects_;
  LinkStates links_;
  LaunchValidator validator_{driver_};
  TransferTracker transfers_{driver_};
  AccessGate gate_;
  MemoryRelief relief_;
  std::vector<Violation> violations_;  // collected so far (the last kMaxViolations)
  StreamsAndEvents streamsAndEvents_;
  StreamCaptures captures_;
  StreamWaits streamWaits_;
  // Calls whose callers wait for a later answer (ServerCall::defer), in the
  // order they came; the serving thread's alone.
  struct DeferredCall {
    ipc::CallRing::Request request;
    std::function<bool()> ready;
  };
  std::vector<DeferredCall> deferredCalls_;
  std::function<bool()> lastDeferred_;  // serveOne's call, if it deferred
  SessionGraphs graphs_;
  // pause()/resume(): the serving thread parks between calls.
  std::mutex pauseMutex_;
  std::condition_variable pauseChanged_;
  std::atomic<bool> pauseRequested_{false};  // read without the mutex on every call
  // pause(timeout, captureWait): until this steady-clock time (ns), the
  // serving thread parks only where no capture is in progress; 0: at once.
  std::atomic<int64_t> captureDeadlineNs_{0};
  // On the serving thread: a pause must wait for a capture or a stream
  // memory wait to end (until the deadline), or for a deferred call.
  bool servingBeforePause();
  bool parked_ = false;
};

}  // namespace phos::daemon
