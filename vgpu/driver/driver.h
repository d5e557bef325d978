// SPDX-License-Identifier: Apache-2.0
// The vgpu driver: devices, contexts, memory, streams, events and modules behind the cu* entry points.
#pragma once

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "address_space.h"
#include "copy_model.h"
#include "device_profile.h"
#include "graph.h"
#include "memory_pools.h"
#include "phos/common/managed_advice.h"
#include "phos/vgpu/export_table.h"
#include "phos/vgpu/program.h"
#include "stream.h"
#include "textures.h"

namespace phos::vgpu {

// Handles given to the application are ids, never pointers: a destroyed object's
// handle stays invalid forever instead of aliasing a new object.
enum class HandleKind : std::uint64_t {
  kContext = 1,
  kStream,
  kEvent,
  kModule,
  kFunction,
  kLibrary,
  kMemPool,
  kKernel,
  kGraph,
  kGraphNode,
  kGraphExec,
  kArray,
  kTexObject,
  kSurfObject,
  kUserObject,
};
HandleKind kindOf(std::uint64_t handle);
std::uint64_t newHandle(HandleKind kind);

template <typename T>
class HandleTable {
 public:
  void add(std::uint64_t id, std::shared_ptr<T> object) {
    std::lock_guard lock(mutex_);
    objects_[id] = std::move(object);
  }
  std::shared_ptr<T> find(std::uint64_t id) const {
    std::lock_guard lock(mutex_);
    auto it = objects_.find(id);
    return it == objects_.end() ? nullptr : it->second;
  }
  template <typename Pred>
  std::shared_ptr<T> findIf(Pred pred) const {
    std::lock_guard lock(mutex_);
    for (const auto& [id, object] : objects_) {
      if (pred(*object)) return object;
    }
    return nullptr;
  }
  // Adds `object` under the lowest id from 1 up that no live object holds,
  // as slots of a descriptor heap are handed out (texture and surface
  // objects: docs/vgpu.md), and returns that id.
  std::uint64_t addAtLowestFree(std::shared_ptr<T> object) {
    std::lock_guard lock(mutex_);
    std::uint64_t id = 1;
    while (objects_.count(id) != 0) ++id;
    objects_[id] = std::move(object);
    return id;
  }
  std::shared_ptr<T> erase(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    auto it = objects_.find(id);
    if (it == objects_.end()) return nullptr;
    auto object = std::move(it->second);
    objects_.erase(it);
    return object;
  }
  template <typename Pred>
  std::vector<std::shared_ptr<T>> eraseIf(Pred pred) {
    std::lock_guard lock(mutex_);
    std::vector<std::shared_ptr<T>> out;
    for (auto it = objects_.begin(); it != objects_.end();) {
      if (pred(*it->second)) {
        out.push_back(std::move(it->second));
        it = objects_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<T>> objects_;
};

// One launch enqueued while its context recorded accesses; the stream worker fills
// it when the launch has run.
struct RecordedLaunch {
  std::atomic<bool> done{false};  // stored (release) once the fields below are final
  bool recorded = false;          // false: the Program that ran it cannot record
  LaunchAccesses accesses;
};

class Context {
 public:
  Context(std::uint64_t id, int device, unsigned flags, bool primary);
  ~Context();

  std::uint64_t id() const { return id_; }
  CUcontext handle() const { return reinterpret_cast<CUcontext>(id_); }
  int device() const { return device_; }
  unsigned flags() const { return flags_.load(); }
  void setFlags(unsigned flags) { flags_ = flags; }
  bool primary() const { return primary_; }
  bool destroyed() const { return destroyed_.load(); }
  void markDestroyed() { destroyed_ = true; }
  // Set as the context is destroyed, before its work drains: stream memory
  // waits (cuStreamWaitValue32) still blocked give up, as a GPU's end with
  // the context instead of holding its destruction forever.
  bool waitsAbandoned() const { return waitsAbandoned_.load(); }
  void abandonWaits() { waitsAbandoned_ = true; }

  // The sticky error (CUDA_SUCCESS if none): "the context cannot be used anymore".
  CUresult stickyError() const { return static_cast<CUresult>(sticky_.load()); }
  // Sticky if the error is of that class, else kept for the next synchronizing call.
  void reportAsyncError(const Status& status);
  Status takeAsyncError();
  // OK, or the sticky error as a Status.
  Status usable() const;

  Stream& legacyStream() { return *legacy_; }
  std::shared_ptr<Stream> legacyStreamPtr() { return legacy_; }
  std::shared_ptr<Stream> perThreadStream();
  std::shared_ptr<Stream> createStream(unsigned flags, int priority);
  void forgetStream(const std::shared_ptr<Stream>& stream);

  // Enqueues work on `stream` with CUDA's implicit synchronization: work on the
  // legacy default stream waits for all prior work of blocking streams, and work on
  // a blocking stream waits for prior work of the legacy stream ("the NULL stream
  // ... synchronizes with all other blocking streams in the context").
  // On a capturing stream the work becomes a node of the capture's graph
  // (`node` says what it is) and 0 is returned: nothing was enqueued.
  Result<std::uint64_t> submit(const std::shared_ptr<Stream>& stream, Stream::Work work,
                               std::vector<StreamDependency> extra = {}, const NodeInfo& node = {});
  // The capture sequences its streams are part of.
  std::vector<std::shared_ptr<CaptureSequence>> captures() const;
  // Waits for all work of all streams of the context.
  void drain();
  // cuCtxRecordEvent: enqueues `work` after all work of the context's
  // streams so far, on a stream of its own; returns where it went.
  Result<StreamDependency> afterAllWork(Stream::Work work);
  // cuCtxWaitEvent: all work submitted from now on, on any of the
  // context's streams, waits for `dependency` too.
  void waitForAll(StreamDependency dependency);

  std::map<CUlimit, std::size_t> limits;  // guarded by mutex()
  std::mutex& mutex() const { return mutex_; }
  // Peer access: whether kernels of this context may touch `owner`'s allocations.
  bool hasPeer(std::uint64_t owner) const;
  bool addPeer(std::uint64_t owner);     // false if already enabled
  bool removePeer(std::uint64_t owner);  // false if not enabled

  // The access recorder: whether launches enqueued now are recorded, and the last
  // recorded launch enqueued on each stream (by Stream::id()).
  bool recordsAccesses() const { return recordAccesses_.load(std::memory_order_relaxed); }
  void setRecordAccesses(bool enabled) { recordAccesses_ = enabled; }
  void setLastRecordedLaunch(std::uint64_t stream, std::shared_ptr<RecordedLaunch> launch);
  std::shared_ptr<RecordedLaunch> lastRecordedLaunch(std::uint64_t stream) const;

  // Where device printf output of launches enqueued from now on goes; null:
  // the process's stdout.
  void setPrintfSink(std::shared_ptr<PrintfSink> sink);
  std::shared_ptr<PrintfSink> printfSink() const;

 private:
  std::shared_ptr<Stream> makeStream(Stream::Kind kind, unsigned flags, int priority);
  // The legacy, created and per-thread streams (not afterAllWork's).
  std::vector<std::shared_ptr<Stream>> applicationStreams() const;

  const std::uint64_t id_;
  const int device_;
  std::atomic<unsigned> flags_;
  const bool primary_;
  std::atomic<bool> destroyed_{false};
  std::atomic<bool> waitsAbandoned_{false};
  std::atomic<int> sticky_{CUDA_SUCCESS};
  mutable std::mutex mutex_;
  std::set<std::uint64_t> peers_;  // guarded by mutex_
  std::atomic<bool> recordAccesses_{false};
  std::unordered_map<std::uint64_t, std::shared_ptr<RecordedLaunch>> lastRecorded_;  // guarded by mutex_
  std::shared_ptr<PrintfSink> printfSink_;  // guarded by mutex_
  Status asyncError_;  // guarded by mutex_
  std::mutex submitMutex_;
  std::shared_ptr<Stream> legacy_;
  std::vector<std::weak_ptr<Stream>> streams_;  // guarded by mutex_
  std::unordered_map<std::thread::id, std::shared_ptr<Stream>> perThread_;  // guarded by mutex_
  // afterAllWork's stream, made at its first use, and waitForAll's
  // dependencies until they complete; guarded by submitMutex_.
  std::shared_ptr<Stream> joins_;
  std::vector<StreamDependency> waitsForAll_;
};

// A user object (cuUserObjectCreate): its destructor runs on the driver's
// destructor thread once the last reference is released.
struct UserObject {
  std::uint64_t id = 0;
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  std::int64_t refs = 0;  // guarded by the driver's user-object mutex
};

struct Function;

class Module {
 public:
  std::uint64_t id = 0;
  std::uint64_t context = 0;
  int device = 0;
  std::shared_ptr<Program> program;  // null when the image has no code for the device
  std::string noBinary;              // then: why (CUDA_ERROR_NO_BINARY_FOR_GPU at use)
  int ptxArchitecture = 0;           // the PTX's .target sm_XY as XY (CU_FUNC_ATTRIBUTE_PTX_VERSION)
  std::vector<std::uint64_t> allocations;  // module globals, freed at unload
  std::mutex mutex;
  std::map<std::size_t, std::uint64_t> functionHandles;  // function index -> handle
  std::atomic<std::uint64_t> library{0};  // the CUlibrary it was loaded through, if any
  int maxRegisters = 0;                   // CU_JIT_MAX_REGISTERS it was loaded with (0: none)
};

struct Function {
  std::uint64_t id = 0;
  std::weak_ptr<Module> module;
  std::shared_ptr<Program> program;
  std::size_t index = 0;
  std::uint64_t context = 0;
  std::atomic<int> maxDynamicShared{-1};  // cuFuncSetAttribute's; -1: never set
  // cuKernelSetAttribute's for its kernel on its device (-1: never set).
  // "Attributes set using cuFuncSetAttribute() will override the attribute set
  // by this API irrespective of whether the call to cuFuncSetAttribute() is
  // made before or after this API call."
  std::atomic<int> kernelMaxDynamicShared{-1};
  // The opt-in that holds: the function's own, else its kernel's, else -1.
  int dynamicSharedOptIn() const {
    const int own = maxDynamicShared.load();
    return own >= 0 ? own : kernelMaxDynamicShared.load();
  }
  std::string name() const;
};

// A library is context-independent: its image is kept and loaded into each
// context that uses it ("the library's module in the current context").
struct Library {
  std::uint64_t id = 0;
  std::vector<std::byte> image;
  // CU_JIT_MAX_REGISTERS it was loaded with (0: none), for its module in each context.
  int maxRegisters = 0;
  std::mutex mutex;
  std::map<std::uint64_t, std::uint64_t> modules;             // context id -> module id
  std::map<std::string, std::uint64_t, std::less<>> kernels;  // name -> kernel handle
  // Its __managed__ variables: one copy that its module in every context uses
  // (the first module loaded allocates them).
  std::map<std::string, std::uint64_t> managedGlobals;
};

// A CUkernel: a library's function in whatever context is current when it is
// used ("a CUkernel can be passed wherever a CUfunction is expected").
struct Kernel {
  std::uint64_t id = 0;
  std::weak_ptr<Library> library;
  std::string name;
  std::map<int, int> maxDynamicShared;  // set with cuKernelSetAttribute, per device
};

// A resolved stream: its context and the stream itself.
struct StreamRef {
  std::shared_ptr<Context> context;
  std::shared_ptr<Stream> stream;
};

// One endpoint of a copy, classified by the allocation map.
struct CopyEndpoint {
  int device = -1;          // -1: host memory
  bool pinned = false;      // page-locked host memory (vgpu copies async from it)
};

class Driver {
 public:
  static Driver& instance();

  // cuInit: reads the configuration once; later calls return the first result.
  Status init();
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }
  const PlatformConfig& platform() const { return platform_; }
  int deviceCount() const { return static_cast<int>(platform_.devices.size()); }
  Status checkDevice(CUdevice device) const;
  DeviceHeap& heap(int device) { return *heaps_.at(static_cast<std::size_t>(device)); }
  AllocationMap& allocations() { return allocations_; }
  // The stream-ordered allocator's pools (memory_pools.h).
  MemoryPools& pools() { return pools_; }
  CopyModel& copyModel() { return *copyModel_; }
  // CUDA arrays and texture and surface objects (textures.h), by handle.
  HandleTable<ArrayObject>& arrays() { return arrays_; }
  // User objects: made with `initial` references; retained and released by
  // the application and by the graphs that own references (graph.h).
  Result<std::uint64_t> createUserObject(void* ptr, CUhostFn destroy, unsigned initial);
  Status retainUserObject(std::uint64_t id, unsigned count);
  Status releaseUserObject(std::uint64_t id, unsigned count);
  std::shared_ptr<UserObjectRefs> userObjectsOf(const Graph& g);
  HandleTable<TextureObject>& textureObjects() { return textureObjects_; }
  HandleTable<TextureObject>& surfaceObjects() { return surfaceObjects_; }

  // --- contexts -----------------------------------------------------------------
  Result<std::shared_ptr<Context>> createContext(int device, unsigned flags);
  Status destroyContext(CUcontext handle);
  // INVALID_CONTEXT for an unknown handle, CONTEXT_IS_DESTROYED for a destroyed one.
  Result<std::shared_ptr<Context>> context(CUcontext handle) const;
  // The calling thread's current context, usable (not sticky-failed).
  Result<std::shared_ptr<Context>> current();
  // The current context or null (no error), for cuCtxGetCurrent.
  std::shared_ptr<Context> currentOrNull();
  void pushCurrent(std::shared_ptr<Context> context);
  Result<std::shared_ptr<Context>> popCurrent();
  void setCurrent(std::shared_ptr<Context> context);
  Result<std::shared_ptr<Context>> retainPrimary(int device);
  Status releasePrimary(int device);
  Status resetPrimary(int device);
  // The primary context of `device` while it is active, else null.
  CUcontext primaryHandle(int device);
  Status setPrimaryFlags(int device, unsigned flags);
  void primaryState(int device, unsigned* flags, int* active);

  // --- memory -------------------------------------------------------------------
  Result<std::uint64_t> allocateDevice(Context& context, std::size_t bytes);
  // At `address` exactly (a restore's module globals), if it is free.
  Result<std::uint64_t> allocateDeviceAt(Context& context, std::uint64_t address, std::size_t bytes);
  // cuMemAllocManaged: device memory of `context`'s device, which every
  // context may use (CU_MEM_ATTACH_GLOBAL or HOST; vgpu's devices all have
  // concurrent managed access) and the host dereferences; freed as device
  // memory is. Its advice and prefetch locations are managed().
  Result<std::uint64_t> allocateManaged(Context& context, std::size_t bytes, unsigned flags);
  // A module's __managed__ variable (.attribute(.managed)): managed memory as
  // cuMemAllocManaged's, at `at` when not 0 (a restore's placement).
  Result<std::uint64_t> allocateManagedGlobal(Context& context, std::size_t bytes,
                                              std::uint64_t at);
  ManagedAdvice& managed() { return managed_; }
  // `synchronize`: wait for the owning context's work first (cuMemFree does; the
  // stream-ordered free runs inside the stream and must not).
  Status freeDevice(std::uint64_t address, bool synchronize);
  Result<void*> allocateHost(std::size_t bytes, unsigned flags, std::uint64_t context);
  Status freeHost(void* pointer);
  Status registerHost(void* pointer, std::size_t bytes, unsigned flags, std::uint64_t context);
  Status unregisterHost(void* pointer);
  // INVALID_VALUE unless [address, address+bytes) lies in memory a copy may touch.
  // Waits for an enqueued copy when CUDA's semantics make the call synchronous.
  Status finishCopy(const StreamRef& ref, std::uint64_t seq, const CopyEndpoint& d,
                    const CopyEndpoint& s, bool async);
  Result<CopyEndpoint> classify(std::uint64_t address, std::size_t bytes, bool mustBeDevice);
  bool isAccessible(const Context& context, std::uint64_t address, std::size_t bytes) const;
  // Copies on `stream` and, unless `async` (and the host side is pinned), waits.
  Status copy(const StreamRef& stream, std::uint64_t dst, std::uint64_t src, std::size_t bytes,
              bool async, bool dstMustBeDevice, bool srcMustBeDevice);
  // Row-by-row copy (2D/3D): `rows` row starts of `width` bytes each.
  // `described`: the copy as its call gave it (a captured node's parameters).
  Status copyRows(const StreamRef& stream, const CUDA_MEMCPY3D& described,
                  std::vector<std::pair<std::uint64_t, std::uint64_t>> rows, std::size_t width,
                  bool async);
  Status memset(const StreamRef& stream, std::uint64_t dst, std::size_t pitch, std::uint32_t value,
                unsigned elementSize, std::size_t width, std::size_t height, bool async);
  // Stream memory operations (cuStreamWaitValue32 & co., cuStreamBatchMemOp):
  // each op checked, then all of them, in order, as one item of the stream.
  Status streamMemOps(const StreamRef& stream, std::vector<CUstreamBatchMemOpParams> ops,
                      const char* what);

  // VMM
  Result<std::uint64_t> reserveVa(std::size_t size, std::size_t alignment, std::uint64_t fixed);
  Status freeVa(std::uint64_t address, std::size_t size);
  Result<std::uint64_t> createPhysical(std::size_t size, const CUmemAllocationProp& prop);
  Status releasePhysical(std::uint64_t handle);
  // The properties a live handle was created with.
  Result<CUmemAllocationProp> physicalProperties(std::uint64_t handle);
  Status map(std::uint64_t address, std::size_t size, std::size_t offset, std::uint64_t handle);
  Status unmap(std::uint64_t address, std::size_t size);
  Status setAccess(std::uint64_t address, std::size_t size, std::span<const CUmemAccessDesc> descs);
  Result<std::uint64_t> retainPhysical(std::uint64_t address);

  // --- streams and events -----------------------------------------------------------
  // Resolves NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD and created streams.
  // `perThreadDefault`: NULL means the per-thread stream (the _ptsz/_ptds entry points).
  Result<StreamRef> stream(CUstream handle, bool perThreadDefault);
  Result<CUstream> createStream(unsigned flags, int priority);
  Status destroyStream(CUstream handle);
  Result<CUevent> createEvent(unsigned flags);
  Result<std::shared_ptr<Event>> event(CUevent handle) const;
  Status destroyEvent(CUevent handle);
  Status recordEvent(CUevent event, const StreamRef& stream);
  // cuCtxRecordEvent and cuCtxWaitEvent: an event recorded after all work of
  // a context so far, and all work submitted to a context from now on
  // waiting for an event.
  Status recordContextEvent(CUcontext context, CUevent event);
  Status contextWaitEvent(CUcontext context, CUevent event);
  Status waitEvent(const StreamRef& stream, CUevent event);
  Status synchronizeStream(const StreamRef& stream);
  Status synchronizeContext(Context& context);

  // --- graphs and stream capture (graph.h) --------------------------------------------
  // Into a new graph, or `into` after `dependencies` (cuStreamBeginCaptureToGraph).
  Status beginCapture(const StreamRef& stream, CUstreamCaptureMode mode, CUgraph into = nullptr,
                      std::vector<std::uint64_t> dependencies = {});
  Result<CUgraph> endCapture(const StreamRef& stream);
  // A call that a capturing stream cannot take (a synchronization, a
  // synchronous copy): the capture is invalidated and the call refused.
  Status refuseInCapture(const StreamRef& stream, const char* what);
  // "Potentially unsafe API calls" (allocations, frees) on this thread, by
  // its capture interaction mode (cuThreadExchangeStreamCaptureMode).
  Status checkUnsafeCall(const char* what);
  static CUstreamCaptureMode exchangeThreadCaptureMode(CUstreamCaptureMode mode);
  Result<CUgraph> createGraph();
  Result<std::shared_ptr<Graph>> graph(CUgraph handle) const;
  Status destroyGraph(CUgraph handle);
  Result<CUgraph> cloneGraph(CUgraph handle);
  // A node and the graph that holds it.
  Result<std::pair<std::shared_ptr<Graph>, std::shared_ptr<GraphNode>>> graphNode(
      CUgraphNode handle) const;
  // A node made by what `call` submits to a stream of the current context
  // while it captures into `graph` after `dependencies`: the explicit graph
  // API makes its nodes with the checks and work of the stream calls.
  Result<CUgraphNode> addNodeByCapture(CUgraph graph, std::vector<std::uint64_t> dependencies,
                                       const std::function<CUresult(CUstream)>& call);
  Result<CUgraphNode> addEventNode(CUgraph graph, std::vector<std::uint64_t> dependencies,
                                   CUevent event, CUgraphNodeType type);
  // cuGraph*NodeSetParams: a node of `type` made again by `call`, as its
  // graph's node, or only in executable graph `exec` (cuGraphExec*NodeSetParams).
  Status setNodeWork(CUgraphNode node, CUgraphNodeType type,
                     const std::function<CUresult(CUstream)>& call);
  Status setExecNodeWork(CUgraphExec exec, CUgraphNode node, CUgraphNodeType type,
                         const std::function<CUresult(CUstream)>& call);
  // cuGraphEvent*NodeSetEvent, in the graph's node or only in `exec`.
  Status setNodeEvent(CUgraphNode node, CUgraphNodeType type, CUevent event);
  Status setExecNodeEvent(CUgraphExec exec, CUgraphNode node, CUgraphNodeType type, CUevent event);
  Result<std::shared_ptr<GraphExec>> graphExec(CUgraphExec handle) const;
  // cuGraphExecUpdate: `exec` made of `graph`'s nodes if it has its shape.
  Result<CUgraphExecUpdateResult> updateGraphExec(CUgraphExec exec, CUgraph graph);
  Status updateChildGraphNode(CUgraphExec exec, CUgraphNode node, CUgraph child);
  // cuGraphNodeFindInClone.
  Result<CUgraphNode> findInClone(CUgraphNode original, CUgraph clone) const;
  Result<CUgraphNode> addChildGraphNode(CUgraph graph, std::vector<std::uint64_t> dependencies,
                                        CUgraph child);
  Result<CUgraphExec> instantiate(CUgraph graph, unsigned long long flags);
  Status destroyGraphExec(CUgraphExec handle);
  Status launchGraph(CUgraphExec handle, const StreamRef& stream);

  // --- modules and launches -------------------------------------------------------
  void setProgramLoader(std::shared_ptr<ProgramLoader> loader);
  // `maxRegisters`: the CU_JIT_MAX_REGISTERS it is loaded with (0: none).
  Result<CUmodule> loadModule(const void* image, int maxRegisters = 0);
  Result<CUmodule> loadModuleFile(const char* path);
  Status unloadModule(CUmodule handle);
  Result<std::shared_ptr<Module>> module(CUmodule handle) const;
  Result<CUfunction> function(CUmodule module, const char* name);
  // A function, or a kernel resolved in the current context.
  Result<std::shared_ptr<Function>> function(CUfunction handle);
  Status launch(CUfunction function, const LaunchConfig& config, CUstream stream,
                bool perThreadDefault, void** kernelParams, void** extra);
  // `maxRegisters`: as loadModule's, for the library's module in every context.
  Result<CUlibrary> loadLibrary(const void* image, int maxRegisters = 0);
  Result<CUlibrary> loadLibraryFile(const char* path, int maxRegisters = 0);
  Status unloadLibrary(CUlibrary library);
  Result<std::shared_ptr<Library>> library(CUlibrary handle) const;
  // The library's module in `context` (loaded there on first use), or in the
  // current context.
  Result<std::shared_ptr<Module>> libraryModule(Library& library, const std::shared_ptr<Context>& context);
  Result<std::shared_ptr<Module>> libraryModule(CUlibrary handle);
  // cuLibraryGetManaged: the library's managed variable `name` (one for every
  // context, so none need be current).
  Result<GlobalInfo> libraryManaged(CUlibrary handle, const char* name);
  // The library's kernel `name` (NOT_FOUND, or NO_BINARY_FOR_GPU for an image
  // without code for the device).
  Result<CUkernel> kernel(CUlibrary library, const char* name);
  // Every kernel of a library, in the order of its functions.
  Result<std::vector<CUkernel>> kernels(CUlibrary library);
  Result<std::shared_ptr<Kernel>> kernel(CUkernel handle) const;
  // The kernel's function in the current context, else in the context the
  // library was first loaded into (for what does not depend on a context).
  Result<std::shared_ptr<Function>> kernelFunction(CUkernel handle, bool currentOnly);
  // Records a kernel's dynamic shared memory limit for `device`, and applies
  // it to the kernel's functions in that device's contexts.
  Status setKernelMaxDynamicShared(CUkernel handle, int device, int value);
  // The next module loaded into `context` (a module, or a library used there
  // first) places the named globals at these addresses (export table).
  Status placeNextModuleGlobals(CUcontext context, std::map<std::string, std::uint64_t> placement);

  // --- access recorder (export table) ---------------------------------------------------
  // `handle` null: the current context.
  Status setRecordAccesses(CUcontext handle, bool enabled);
  Status setPrintfSink(CUcontext handle, std::shared_ptr<PrintfSink> sink);
  Result<LaunchAccesses> lastLaunchAccesses(CUstream stream);
  // `record`'s absolute ranges split at allocation boundaries, relative to each
  // allocation; bytes outside every allocation are dropped (and logged).
  std::vector<AllocationAccesses> groupByAllocation(const AccessRecord& record) const;

 private:
  Driver() = default;
  void unloadModulesOf(std::uint64_t context);
  // `managed`: cuMemAllocManaged's (Allocation::managed).
  Result<std::uint64_t> allocateDeviceIn(Context& context, std::size_t bytes, std::uint64_t at,
                                         bool managed = false);
  // `shared`: managed variables another module of the same library holds
  // already (Library::managedGlobals), used rather than allocated.
  Result<std::shared_ptr<Module>> loadModuleIn(
      const std::shared_ptr<Context>& context, std::span<const std::byte> image,
      const std::map<std::string, std::uint64_t>& shared = {});
  // Where a library is first loaded when no context is current: a context of
  // device 0 the application never sees.
  Result<std::shared_ptr<Context>> loadingContext();
  // Whatever context the library is loaded in answers what does not depend on
  // one (its kernels' names and signatures): the current one, else the loading one.
  Result<std::shared_ptr<Module>> anyLibraryModule(Library& library);
  Result<std::shared_ptr<Function>> kernelFunctionIn(const Kernel& kernel, const std::shared_ptr<Context>& context);
  void releaseContextResources(Context& context);
  // The node `call` submits to a scratch stream capturing into `target`.
  Result<std::shared_ptr<GraphNode>> captureNode(const std::shared_ptr<Graph>& target,
                                                 std::vector<std::uint64_t> dependencies,
                                                 const std::function<CUresult(CUstream)>& call);

  std::once_flag initOnce_;
  Status initStatus_;
  std::atomic<bool> initialized_{false};
  PlatformConfig platform_;
  std::vector<std::unique_ptr<DeviceHeap>> heaps_;
  std::unique_ptr<CopyModel> copyModel_;
  AllocationMap allocations_;
  MemoryPools pools_{static_cast<std::uint64_t>(HandleKind::kMemPool) << 44};
  ManagedAdvice managed_;
  std::atomic<std::uint64_t> nextBufferId_{1};

  HandleTable<Context> contexts_;
  struct StreamEntry {
    std::uint64_t context = 0;
    std::shared_ptr<Stream> stream;
  };
  HandleTable<StreamEntry> streams_;
  HandleTable<Event> events_;
  HandleTable<Module> modules_;
  HandleTable<Function> functions_;
  HandleTable<Library> libraries_;
  HandleTable<Kernel> kernels_;
  HandleTable<Graph> graphs_;
  HandleTable<GraphExec> graphExecs_;
  HandleTable<ArrayObject> arrays_;
  HandleTable<UserObject> userObjects_;
  std::mutex userObjectMutex_;
  // Destructors of user objects whose last reference went, run in order by
  // one thread of the driver's ("executed by a shared internal thread").
  std::mutex destructorMutex_;
  std::condition_variable destructorReady_;
  std::deque<std::pair<CUhostFn, void*>> destructors_;
  bool destructorThreadStarted_ = false;
  HandleTable<TextureObject> textureObjects_;
  HandleTable<TextureObject> surfaceObjects_;
  std::mutex capturesMutex_;
  std::vector<std::weak_ptr<CaptureSequence>> captures_;  // begun, perhaps ended
  std::mutex placementMutex_;
  std::map<std::uint64_t, std::map<std::string, std::uint64_t>> placements_;  // by context id
  std::mutex loadingContextMutex_;
  std::shared_ptr<Context> loadingContext_;

  struct Primary {
    std::mutex mutex;
    unsigned flags = 0;
    int refs = 0;
    std::shared_ptr<Context> context;
  };
  std::vector<std::unique_ptr<Primary>> primaries_;

  struct Physical {
    int device = 0;
    std::size_t size = 0;
    int fd = -1;
    int mappings = 0;
    int refs = 1;  // cuMemCreate and each cuMemRetainAllocationHandle
    CUmemAllocationProp prop{};
  };
  std::mutex vmmMutex_;
  std::map<std::uint64_t, Physical> physical_;         // handle -> memory
  std::map<std::uint64_t, std::size_t> reservations_;  // base -> size
  std::uint64_t nextPhysical_ = 1;

  std::mutex loaderMutex_;
  std::shared_ptr<ProgramLoader> loader_;
};

}  // namespace phos::vgpu
