// SPDX-License-Identifier: Apache-2.0
// The vgpu driver's state and operations; the cu* layer in vgpu/lib calls these.
#include "driver.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>
#include <type_traits>

#include "cu_status.h"
#include "fatbin.h"
#include "phos/common/log.h"

namespace phos::vgpu {
namespace {

thread_local std::vector<std::shared_ptr<Context>> tContextStack;

std::shared_ptr<spdlog::logger> logger() {
  static auto log = phos::log::get("vgpu");
  return log;
}

template <typename T>
std::uint64_t idOf(T handle) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle));
}

Status validateContextFlags(unsigned flags) {
  unsigned sched = flags & CU_CTX_SCHED_MASK;
  if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0 || sched == 3 || sched > 4) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "context flags 0x{:x} are invalid", flags);
  }
  return Status::ok();
}

// Device memory of a context, handed to a ProgramLoader for module globals.
class ModuleMemory final : public DeviceMemory {
 public:
  ModuleMemory(Driver& driver, std::shared_ptr<Context> context, int cc,
               std::map<std::string, std::uint64_t> placement,
               const std::map<std::string, std::uint64_t>& shared)
      : driver_(driver),
        context_(std::move(context)),
        cc_(cc),
        placement_(std::move(placement)),
        shared_(shared) {}

  // A global the placement names goes where it says (a restore puts a module
  // back where its globals were); the others wherever the heap has room.
  Result<std::uint64_t> allocate(std::string_view name, std::size_t bytes, std::size_t alignment,
                                 bool managed) override {
    if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kPageSize) {
      return makeError(Code::kInvalidArgument, "module global: {} bytes aligned to {}", bytes, alignment);
    }
    std::uint64_t address = 0;
    if (auto it = shared_.find(std::string(name)); managed && it != shared_.end()) {
      // Another module's: neither allocated nor initialised again.
      sharedAddresses_.insert(it->second);
      return it->second;
    }
    auto placed = placement_.find(std::string(name));
    if (managed) {
      ASSIGN_OR_RETURN(
          address, driver_.allocateManagedGlobal(*context_, bytes,
                                                 placed != placement_.end() ? placed->second : 0));
    } else if (placed != placement_.end()) {
      ASSIGN_OR_RETURN(address, driver_.allocateDeviceAt(*context_, placed->second, bytes));
    } else {
      ASSIGN_OR_RETURN(address, driver_.allocateDevice(*context_, bytes));
    }
    allocations.push_back(address);
    return address;
  }
  Status write(std::uint64_t address, std::span<const std::byte> bytes) override {
    if (bytes.empty() || sharedAddresses_.contains(address)) return Status::ok();
    auto a = driver_.allocations().findRange(address, bytes.size());
    if (!a || a->context != context_->id()) {
      return makeError(Code::kOutOfRange, "module global write of {} bytes at 0x{:x} is outside the module's memory",
                       bytes.size(), address);
    }
    std::memcpy(reinterpret_cast<void*>(address), bytes.data(), bytes.size());
    return Status::ok();
  }
  int device() const override { return context_->device(); }
  int computeCapability() const override { return cc_; }

  std::vector<std::uint64_t> allocations;

 private:
  Driver& driver_;
  std::shared_ptr<Context> context_;
  int cc_;
  std::map<std::string, std::uint64_t> placement_;
  const std::map<std::string, std::uint64_t>& shared_;
  std::set<std::uint64_t> sharedAddresses_;
};

class ContextAddressChecker final : public AddressChecker {
 public:
  ContextAddressChecker(const Driver& driver, const Context& context)
      : driver_(driver), context_(context) {}
  bool isAccessible(std::uint64_t address, std::size_t size) const override {
    return driver_.isAccessible(context_, address, size);
  }

 private:
  const Driver& driver_;
  const Context& context_;
};

// The texture and surface objects of one context, for its launches.
class ContextTextures final : public TextureTable {
 public:
  ContextTextures(Driver& driver, std::uint64_t context) : driver_(driver), context_(context) {}
  std::optional<TextureView> texture(std::uint64_t handle) const override {
    return find(driver_.textureObjects(), handle);
  }
  std::optional<TextureView> surface(std::uint64_t handle) const override {
    return find(driver_.surfaceObjects(), handle);
  }

 private:
  std::optional<TextureView> find(const HandleTable<TextureObject>& table,
                                  std::uint64_t handle) const {
    auto object = table.find(handle);
    if (object == nullptr || object->context != context_) return std::nullopt;
    return object->view;
  }
  Driver& driver_;
  std::uint64_t context_;
};

class StdoutPrintfSink final : public PrintfSink {
 public:
  void write(std::string_view text) override {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
};

}  // namespace

std::uint64_t newHandle(HandleKind kind) {
  static std::atomic<std::uint64_t> next{1};
  return (static_cast<std::uint64_t>(kind) << 44) | next.fetch_add(1);
}

HandleKind kindOf(std::uint64_t handle) { return static_cast<HandleKind>(handle >> 44); }

// --- Context ---------------------------------------------------------------------

Context::Context(std::uint64_t id, int device, unsigned flags, bool primary)
    : id_(id), device_(device), flags_(flags), primary_(primary) {
  limits = {
      {CU_LIMIT_STACK_SIZE, 1024},
      {CU_LIMIT_PRINTF_FIFO_SIZE, 1 << 20},
      {CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20},
      {CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 2},
      {CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 2048},
      {CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 64},
      {CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0},
  };
  legacy_ = makeStream(Stream::Kind::kLegacy, 0, 0);
}

Context::~Context() = default;

std::shared_ptr<Stream> Context::makeStream(Stream::Kind kind, unsigned flags, int priority) {
  return std::make_shared<Stream>(newHandle(HandleKind::kStream), kind, flags, priority,
                                  [this](const Status& status) { reportAsyncError(status); });
}

void Context::reportAsyncError(const Status& status) {
  CUresult result = toCuResult(status);
  logger()->error("context 0x{:x}: asynchronous error: {}", id_, status.toString());
  if (isStickyError(result)) {
    int expected = CUDA_SUCCESS;
    sticky_.compare_exchange_strong(expected, result);
    return;
  }
  std::lock_guard lock(mutex_);
  if (asyncError_.isOk()) asyncError_ = status;
}

Status Context::takeAsyncError() {
  RETURN_IF_ERROR(usable());
  std::lock_guard lock(mutex_);
  Status status = std::move(asyncError_);
  asyncError_ = Status::ok();
  return status;
}

Status Context::usable() const {
  CUresult sticky = stickyError();
  if (sticky != CUDA_SUCCESS) {
    return cuErrorf(sticky, "context 0x{:x} hit an unrecoverable error earlier", id_);
  }
  return Status::ok();
}

bool Context::hasPeer(std::uint64_t owner) const {
  std::lock_guard lock(mutex_);
  return peers_.contains(owner);
}

bool Context::addPeer(std::uint64_t owner) {
  std::lock_guard lock(mutex_);
  return peers_.insert(owner).second;
}

bool Context::removePeer(std::uint64_t owner) {
  std::lock_guard lock(mutex_);
  return peers_.erase(owner) > 0;
}

std::shared_ptr<Stream> Context::perThreadStream() {
  std::lock_guard lock(mutex_);
  auto& stream = perThread_[std::this_thread::get_id()];
  if (!stream) stream = makeStream(Stream::Kind::kPerThread, 0, 0);
  return stream;
}

std::shared_ptr<Stream> Context::createStream(unsigned flags, int priority) {
  auto stream = makeStream(Stream::Kind::kCreated, flags, priority);
  std::lock_guard lock(mutex_);
  streams_.push_back(stream);
  return stream;
}

void Context::forgetStream(const std::shared_ptr<Stream>& stream) {
  std::lock_guard lock(mutex_);
  lastRecorded_.erase(stream->id());
  std::erase_if(streams_, [&](const std::weak_ptr<Stream>& w) {
    auto s = w.lock();
    return !s || s == stream;
  });
}

void Context::setLastRecordedLaunch(std::uint64_t stream, std::shared_ptr<RecordedLaunch> launch) {
  std::lock_guard lock(mutex_);
  lastRecorded_[stream] = std::move(launch);
}

void Context::setPrintfSink(std::shared_ptr<PrintfSink> sink) {
  std::lock_guard lock(mutex_);
  printfSink_ = std::move(sink);
}

std::shared_ptr<PrintfSink> Context::printfSink() const {
  std::lock_guard lock(mutex_);
  return printfSink_;
}

std::shared_ptr<RecordedLaunch> Context::lastRecordedLaunch(std::uint64_t stream) const {
  std::lock_guard lock(mutex_);
  auto it = lastRecorded_.find(stream);
  return it == lastRecorded_.end() ? nullptr : it->second;
}

Result<std::uint64_t> Context::submit(const std::shared_ptr<Stream>& stream, Stream::Work work,
                                      std::vector<StreamDependency> extra, const NodeInfo& node) {
  if (auto capture = stream->capture()) {
    RETURN_IF_ERROR(capture->add(*stream, node, std::move(work)));
    return std::uint64_t{0};
  }
  std::lock_guard submitLock(submitMutex_);
  std::vector<StreamDependency> deps = std::move(extra);
  auto depend = [&](const std::shared_ptr<Stream>& other) {
    if (!other || other == stream) return;
    std::uint64_t last = other->lastEnqueued();
    if (last != 0 && !other->isComplete(last)) deps.push_back({other, last});
  };
  if (stream->kind() == Stream::Kind::kLegacy) {
    std::lock_guard lock(mutex_);
    std::vector<std::shared_ptr<Stream>> blocking;
    for (const auto& weak : streams_) {
      if (auto other = weak.lock(); other && other->synchronizesWithLegacy()) {
        blocking.push_back(other);
      }
    }
    for (const auto& [thread, other] : perThread_) blocking.push_back(other);
    // "When any stream in the same context is being captured, and it was not
    // created with cudaStreamNonBlocking, any attempted use of the legacy
    // stream is invalid": the implicit dependency cannot be captured.
    for (const auto& other : blocking) {
      if (auto capture = other->capture()) {
        capture->invalidate();
        return cuError(
            CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            "the legacy stream was used while a stream that synchronizes with it captures");
      }
    }
    for (const auto& other : blocking) depend(other);
  } else if (stream->synchronizesWithLegacy()) {
    depend(legacy_);
  }
  std::erase_if(waitsForAll_,
                [](const StreamDependency& d) { return d.stream->isComplete(d.seq); });
  deps.insert(deps.end(), waitsForAll_.begin(), waitsForAll_.end());
  return stream->enqueue(std::move(work), std::move(deps));
}

std::vector<std::shared_ptr<Stream>> Context::applicationStreams() const {
  std::vector<std::shared_ptr<Stream>> all{legacy_};
  std::lock_guard lock(mutex_);
  for (const auto& weak : streams_) {
    if (auto s = weak.lock()) all.push_back(std::move(s));
  }
  for (const auto& [thread, s] : perThread_) all.push_back(s);
  return all;
}

Result<StreamDependency> Context::afterAllWork(Stream::Work work) {
  const std::vector<std::shared_ptr<Stream>> all = applicationStreams();
  std::lock_guard submitLock(submitMutex_);
  std::vector<StreamDependency> deps;
  for (const auto& s : all) {
    const std::uint64_t last = s->lastEnqueued();
    if (last != 0 && !s->isComplete(last)) deps.push_back({s, last});
  }
  if (!joins_) joins_ = makeStream(Stream::Kind::kCreated, CU_STREAM_NON_BLOCKING, 0);
  const std::uint64_t seq = joins_->enqueue(std::move(work), std::move(deps));
  return StreamDependency{joins_, seq};
}

void Context::waitForAll(StreamDependency dependency) {
  std::lock_guard submitLock(submitMutex_);
  if (!dependency.stream->isComplete(dependency.seq)) waitsForAll_.push_back(std::move(dependency));
}

std::vector<std::shared_ptr<CaptureSequence>> Context::captures() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<CaptureSequence>> out;
  auto add = [&](const std::shared_ptr<Stream>& stream) {
    if (!stream) return;
    auto capture = stream->capture();
    if (capture && std::find(out.begin(), out.end(), capture) == out.end()) {
      out.push_back(std::move(capture));
    }
  };
  for (const auto& weak : streams_) add(weak.lock());
  for (const auto& [thread, stream] : perThread_) add(stream);
  return out;
}

void Context::drain() {
  std::vector<std::shared_ptr<Stream>> all = applicationStreams();
  {
    std::lock_guard submitLock(submitMutex_);
    if (joins_) all.push_back(joins_);
  }
  for (const auto& s : all) s->waitIdle();
}

std::string Function::name() const { return program->functions().at(index).name; }

// --- Driver: devices and contexts -----------------------------------------------------

Driver& Driver::instance() {
  // Never destroyed: stream workers and late cu* calls from atexit handlers must
  // not find it gone.
  static Driver* driver = new Driver();
  return *driver;
}

Status Driver::init() {
  std::call_once(initOnce_, [this] {
    auto config = loadPlatformConfig();
    if (!config.isOk()) {
      initStatus_ = cuError(CUDA_ERROR_INVALID_VALUE, config.status().message());
      logger()->error("cuInit: {}", initStatus_.message());
      return;
    }
    platform_ = std::move(config).value();
    if (platform_.devices.empty()) {
      initStatus_ = cuError(CUDA_ERROR_NO_DEVICE, "PHOS_VGPU_DEVICES=0");
      return;
    }
    for (std::size_t i = 0; i < platform_.devices.size(); ++i) {
      heaps_.push_back(std::make_unique<DeviceHeap>(
          static_cast<int>(i), platform_.vaBase + i * platform_.vaWindow, platform_.vaWindow,
          platform_.devices[i].totalMemory));
      primaries_.push_back(std::make_unique<Primary>());
    }
    copyModel_ = std::make_unique<CopyModel>(platform_);
    logger()->info("vgpu: {} device(s), compute capability {}.{}, bandwidth scale {}",
                   platform_.devices.size(), platform_.devices[0].ccMajor,
                   platform_.devices[0].ccMinor, platform_.bandwidthScale);
    initialized_.store(true, std::memory_order_release);
  });
  return initStatus_;
}

Status Driver::checkDevice(CUdevice device) const {
  if (device < 0 || device >= deviceCount()) {
    return cuErrorf(CUDA_ERROR_INVALID_DEVICE, "device {} does not exist ({} device(s))", device,
                    deviceCount());
  }
  return Status::ok();
}

Result<std::shared_ptr<Context>> Driver::createContext(int device, unsigned flags) {
  RETURN_IF_ERROR(checkDevice(device));
  RETURN_IF_ERROR(validateContextFlags(flags));
  auto context = std::make_shared<Context>(newHandle(HandleKind::kContext), device, flags, false);
  contexts_.add(context->id(), context);
  return context;
}

void Driver::unloadModulesOf(std::uint64_t context) {
  // A library outlives the contexts it was loaded into: its module there is
  // gone, and a later use in another context loads it again.
  modules_.eraseIf([&](const Module& m) { return m.context == context; });
  functions_.eraseIf([&](const Function& f) { return f.context == context; });
}

void Driver::releaseContextResources(Context& context) {
  context.abandonWaits();
  context.drain();
  unloadModulesOf(context.id());
  for (const Allocation& a : allocations_.ownedBy(context.id())) {
    if (a.kind == MemoryKind::kDevice) {
      allocations_.erase(a.base);
      if (a.managed) managed_.remove(a.base);
      if (a.pool != 0) {
        pools_.uncharge(a.pool, a.size);
        pools_.release(a.pool, pooledBytes(a.size));
      }
      (void)heap(a.device).release(a.base, a.size);
    } else if (a.kind == MemoryKind::kHostRegistered) {
      // The application's memory stays its own; only the registration
      // goes, with everything else allocated in the context.
      allocations_.erase(a.base);
    }
  }
  auto streams = streams_.eraseIf([&](const StreamEntry& e) { return e.context == context.id(); });
  events_.eraseIf([&](const Event& e) { return e.context() == context.id(); });
  context.markDestroyed();
  contexts_.erase(context.id());
  // Other contexts forget peer access to this one.
  (void)streams;
}

Status Driver::destroyContext(CUcontext handle) {
  ASSIGN_OR_RETURN(auto context, this->context(handle));
  if (context->primary()) {
    return cuError(CUDA_ERROR_INVALID_CONTEXT,
                   "a primary context is released with cuDevicePrimaryCtxRelease, not destroyed");
  }
  releaseContextResources(*context);
  // "If ctx is current to the calling thread then ctx will also be popped from the
  // current thread's context stack"; other threads get CONTEXT_IS_DESTROYED.
  std::erase(tContextStack, context);
  return Status::ok();
}

Result<std::shared_ptr<Context>> Driver::context(CUcontext handle) const {
  if (handle == nullptr) return cuError(CUDA_ERROR_INVALID_CONTEXT, "context handle is null");
  auto context = contexts_.find(idOf(handle));
  if (!context) {
    return cuErrorf(CUDA_ERROR_INVALID_CONTEXT, "0x{:x} is not a live context", idOf(handle));
  }
  return context;
}

Result<std::shared_ptr<Context>> Driver::current() {
  if (tContextStack.empty()) {
    return cuError(CUDA_ERROR_INVALID_CONTEXT, "no context is current to this thread");
  }
  auto context = tContextStack.back();
  if (context->destroyed()) {
    return cuErrorf(CUDA_ERROR_CONTEXT_IS_DESTROYED, "the current context 0x{:x} was destroyed",
                    context->id());
  }
  RETURN_IF_ERROR(context->usable());
  return context;
}

std::shared_ptr<Context> Driver::currentOrNull() {
  return tContextStack.empty() ? nullptr : tContextStack.back();
}

void Driver::pushCurrent(std::shared_ptr<Context> context) {
  tContextStack.push_back(std::move(context));
}

Result<std::shared_ptr<Context>> Driver::popCurrent() {
  if (tContextStack.empty()) {
    return cuError(CUDA_ERROR_INVALID_CONTEXT, "the context stack of this thread is empty");
  }
  auto context = tContextStack.back();
  tContextStack.pop_back();
  return context;
}

void Driver::setCurrent(std::shared_ptr<Context> context) {
  if (!context) {
    if (!tContextStack.empty()) tContextStack.pop_back();
    return;
  }
  if (tContextStack.empty()) {
    tContextStack.push_back(std::move(context));
  } else {
    tContextStack.back() = std::move(context);
  }
}

Result<std::shared_ptr<Context>> Driver::retainPrimary(int device) {
  RETURN_IF_ERROR(checkDevice(device));
  Primary& p = *primaries_[static_cast<std::size_t>(device)];
  std::lock_guard lock(p.mutex);
  if (!p.context) {
    p.context = std::make_shared<Context>(newHandle(HandleKind::kContext), device, p.flags, true);
    contexts_.add(p.context->id(), p.context);
  }
  ++p.refs;
  return p.context;
}

Status Driver::releasePrimary(int device) {
  RETURN_IF_ERROR(checkDevice(device));
  Primary& p = *primaries_[static_cast<std::size_t>(device)];
  std::lock_guard lock(p.mutex);
  if (p.refs == 0 || !p.context) {
    return cuErrorf(CUDA_ERROR_INVALID_CONTEXT, "the primary context of device {} is not retained", device);
  }
  if (--p.refs == 0) {
    releaseContextResources(*p.context);
    p.context.reset();
  }
  return Status::ok();
}

Status Driver::resetPrimary(int device) {
  RETURN_IF_ERROR(checkDevice(device));
  Primary& p = *primaries_[static_cast<std::size_t>(device)];
  std::lock_guard lock(p.mutex);
  if (p.context) {
    releaseContextResources(*p.context);
    p.context.reset();
  }
  p.refs = 0;
  return Status::ok();
}

Status Driver::setPrimaryFlags(int device, unsigned flags) {
  RETURN_IF_ERROR(checkDevice(device));
  RETURN_IF_ERROR(validateContextFlags(flags));
  Primary& p = *primaries_[static_cast<std::size_t>(device)];
  std::lock_guard lock(p.mutex);
  p.flags = flags;
  if (p.context) p.context->setFlags(flags);
  return Status::ok();
}

CUcontext Driver::primaryHandle(int device) {
  if (!checkDevice(device).isOk()) return nullptr;
  Primary& p = *primaries_[static_cast<std::size_t>(device)];
  std::lock_guard lock(p.mutex);
  return p.context ? p.context->handle() : nullptr;
}

void Driver::primaryState(int device, unsigned* flags, int* active) {
  Primary& p = *primaries_[static_cast<std::size_t>(device)];
  std::lock_guard lock(p.mutex);
  *flags = p.flags;
  *active = p.context ? 1 : 0;
}

// --- Driver: memory -----------------------------------------------------------------

Result<std::uint64_t> Driver::allocateDevice(Context& context, std::size_t bytes) {
  return allocateDeviceIn(context, bytes, 0);
}

Result<std::uint64_t> Driver::allocateDeviceAt(Context& context, std::uint64_t address, std::size_t bytes) {
  if (address == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "no address to allocate at");
  return allocateDeviceIn(context, bytes, address);
}

Result<std::uint64_t> Driver::allocateDeviceIn(Context& context, std::size_t bytes,
                                               std::uint64_t at, bool managed) {
  if (bytes == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "cannot allocate 0 bytes");
  // Large allocations are 2 MiB aligned like a GPU's big pages; small ones share nothing.
  std::size_t alignment = bytes >= kVmmGranularity ? kVmmGranularity : kPageSize;
  ASSIGN_OR_RETURN(std::uint64_t address, at != 0 ? heap(context.device()).allocateAt(at, bytes)
                                                  : heap(context.device()).allocate(bytes, alignment));
  Allocation a;
  a.base = address;
  a.size = bytes;
  a.kind = MemoryKind::kDevice;
  a.device = context.device();
  a.context = context.id();
  a.bufferId = nextBufferId_++;
  a.managed = managed;
  if (Status s = allocations_.insert(a); !s.isOk()) {
    (void)heap(context.device()).release(address, bytes);
    return s;
  }
  return address;
}

Result<std::uint64_t> Driver::allocateManaged(Context& context, std::size_t bytes, unsigned flags) {
  // "flags must be one of CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST".
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "managed allocation flags 0x{:x} are neither ATTACH_GLOBAL nor ATTACH_HOST",
                    flags);
  }
  ASSIGN_OR_RETURN(std::uint64_t address, allocateDeviceIn(context, bytes, 0, true));
  managed_.add(address, bytes);
  return address;
}

Result<std::uint64_t> Driver::allocateManagedGlobal(Context& context, std::size_t bytes,
                                                    std::uint64_t at) {
  ASSIGN_OR_RETURN(std::uint64_t address, allocateDeviceIn(context, bytes, at, true));
  managed_.add(address, bytes);
  return address;
}

Status Driver::freeDevice(std::uint64_t address, bool synchronize) {
  auto a = allocations_.find(address);
  if (!a || a->base != address || a->kind != MemoryKind::kDevice) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not the start of a device allocation", address);
  }
  if (synchronize) {
    if (auto owner = contexts_.find(a->context)) owner->drain();
  }
  if (!allocations_.erase(address)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} was freed concurrently", address);
  }
  if (a->pool != 0) pools_.release(a->pool, pooledBytes(a->size));
  if (a->managed) managed_.remove(a->base);
  return heap(a->device).release(a->base, a->size);
}

Result<void*> Driver::allocateHost(std::size_t bytes, unsigned flags, std::uint64_t context) {
  if (bytes == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "cannot allocate 0 bytes of host memory");
  constexpr unsigned kKnown = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                              CU_MEMHOSTALLOC_WRITECOMBINED;
  if ((flags & ~kKnown) != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "host allocation flags 0x{:x} are invalid", flags);
  }
  std::size_t length = roundUp(bytes, kPageSize);
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY, "cannot map {} bytes of host memory: {}", bytes,
                    std::strerror(errno));
  }
  Allocation a;
  a.base = reinterpret_cast<std::uint64_t>(p);
  a.size = bytes;
  a.kind = MemoryKind::kHostPinned;
  a.hostFlags = flags | CU_MEMHOSTALLOC_DEVICEMAP;  // with UVA all pinned memory is mapped
  a.context = context;
  a.bufferId = nextBufferId_++;
  if (Status s = allocations_.insert(a); !s.isOk()) {
    munmap(p, length);
    return s;
  }
  return p;
}

Status Driver::freeHost(void* pointer) {
  auto address = reinterpret_cast<std::uint64_t>(pointer);
  auto a = allocations_.find(address);
  if (!a || a->base != address || a->kind != MemoryKind::kHostPinned) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} was not allocated with cuMemAllocHost/cuMemHostAlloc", pointer);
  }
  // Work queued on streams may still read it.
  for (const auto& context : tContextStack) {
    if (!context->destroyed()) context->drain();
  }
  allocations_.erase(address);
  munmap(pointer, roundUp(a->size, kPageSize));
  return Status::ok();
}

Status Driver::registerHost(void* pointer, std::size_t bytes, unsigned flags, std::uint64_t context) {
  if (pointer == nullptr || bytes == 0) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister needs a pointer and a size");
  }
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if ((flags & ~kKnown) != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "host register flags 0x{:x} are invalid", flags);
  }
  if ((flags & (CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)) != 0) {
    return cuError(CUDA_ERROR_NOT_SUPPORTED, "IOMEMORY and READ_ONLY registrations are not supported");
  }
  Allocation a;
  a.base = reinterpret_cast<std::uint64_t>(pointer);
  a.size = bytes;
  a.kind = MemoryKind::kHostRegistered;
  a.hostFlags = flags | CU_MEMHOSTREGISTER_DEVICEMAP;
  a.context = context;
  a.bufferId = nextBufferId_++;
  if (!allocations_.overlapping(a.base, a.size).empty()) {
    return cuErrorf(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                    "{}+{} overlaps memory vgpu already knows", pointer, bytes);
  }
  return allocations_.insert(a);
}

Status Driver::unregisterHost(void* pointer) {
  auto address = reinterpret_cast<std::uint64_t>(pointer);
  auto a = allocations_.find(address);
  if (!a || a->base != address || a->kind != MemoryKind::kHostRegistered) {
    return cuErrorf(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "{} is not registered", pointer);
  }
  allocations_.erase(address);
  return Status::ok();
}

Result<CopyEndpoint> Driver::classify(std::uint64_t address, std::size_t bytes, bool mustBeDevice) {
  if (address == 0) return cuError(CUDA_ERROR_INVALID_VALUE, "null pointer");
  if (auto a = allocations_.find(address)) {
    if (bytes > a->size || address - a->base > a->size - bytes) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "{} bytes at 0x{:x} run past the end of the allocation 0x{:x}+{}", bytes,
                      address, a->base, a->size);
    }
    switch (a->kind) {
      case MemoryKind::kDevice:
        return CopyEndpoint{a->device, false};
      case MemoryKind::kVmmMapping:
        if (a->accessDevices == 0) {
          return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is mapped but no device has access (cuMemSetAccess)",
                          address);
        }
        return CopyEndpoint{a->device, false};
      case MemoryKind::kHostPinned:
      case MemoryKind::kHostRegistered:
        if (mustBeDevice) {
          return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is host memory, not device memory", address);
        }
        return CopyEndpoint{-1, true};
    }
  }
  // Inside vgpu's windows but not allocated: freed or never-allocated device memory.
  const std::uint64_t windowsEnd = platform_.vaBase + platform_.vaWindow * platform_.devices.size();
  if ((address >= platform_.vaBase && address < windowsEnd) ||
      (address >= 0x300000000000ull && address < 0x400000000000ull)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not allocated device memory", address);
  }
  if (mustBeDevice) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not device memory", address);
  }
  return CopyEndpoint{-1, false};
}

bool Driver::isAccessible(const Context& context, std::uint64_t address, std::size_t bytes) const {
  auto a = allocations_.findRange(address, bytes);
  if (!a) return false;
  switch (a->kind) {
    case MemoryKind::kDevice:
      return a->managed || a->context == context.id() || context.hasPeer(a->context);
    case MemoryKind::kHostPinned:
    case MemoryKind::kHostRegistered:
      return true;
    case MemoryKind::kVmmMapping:
      return ((a->accessDevices >> context.device()) & 1U) != 0;
  }
  return false;
}

namespace {
const NodeInfo kMemcpyNode{CU_GRAPH_NODE_TYPE_MEMCPY, std::nullopt};
const NodeInfo kMemsetNode{CU_GRAPH_NODE_TYPE_MEMSET, std::nullopt};
}  // namespace

Status Driver::copy(const StreamRef& ref, std::uint64_t dst, std::uint64_t src, std::size_t bytes,
                    bool async, bool dstMustBeDevice, bool srcMustBeDevice) {
  if (bytes == 0) return Status::ok();
  ASSIGN_OR_RETURN(CopyEndpoint d, classify(dst, bytes, dstMustBeDevice));
  ASSIGN_OR_RETURN(CopyEndpoint s, classify(src, bytes, srcMustBeDevice));
  if (!async) RETURN_IF_ERROR(refuseInCapture(ref, "a synchronous copy"));
  CopyModel* model = copyModel_.get();
  Stream::Work work = [=] {
    model->transfer(s.device, d.device, bytes, [&] {
      std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    });
    return Status::ok();
  };
  // A captured node reports the copy as one row of a 3D copy, as CUDA does.
  NodeInfo info = kMemcpyNode;
  CUDA_MEMCPY3D described{};
  described.srcMemoryType = s.device >= 0 ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  if (s.device >= 0) {
    described.srcDevice = src;
  } else {
    described.srcHost = reinterpret_cast<const void*>(src);
  }
  described.dstMemoryType = d.device >= 0 ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  if (d.device >= 0) {
    described.dstDevice = dst;
  } else {
    described.dstHost = reinterpret_cast<void*>(dst);
  }
  described.WidthInBytes = bytes;
  described.Height = 1;
  described.Depth = 1;
  info.memcpy = described;
  ASSIGN_OR_RETURN(std::uint64_t seq, ref.context->submit(ref.stream, std::move(work), {}, info));
  return finishCopy(ref, seq, d, s, async);
}

Status Driver::copyRows(const StreamRef& ref, const CUDA_MEMCPY3D& described,
                        std::vector<std::pair<std::uint64_t, std::uint64_t>> rows,
                        std::size_t width, bool async) {
  if (rows.empty() || width == 0) return Status::ok();
  CopyEndpoint d, s;
  // A side of type CU_MEMORYTYPE_DEVICE names device memory, or pinned host
  // memory by its device pointer (the same address): never pageable memory.
  auto deviceSide = [](CUmemorytype type, const CopyEndpoint& e) {
    return type != CU_MEMORYTYPE_DEVICE || e.device >= 0 || e.pinned;
  };
  for (const auto& [dst, src] : rows) {
    ASSIGN_OR_RETURN(d, classify(dst, width, false));
    ASSIGN_OR_RETURN(s, classify(src, width, false));
    if (!deviceSide(described.dstMemoryType, d) || !deviceSide(described.srcMemoryType, s)) {
      return cuErrorf(
          CUDA_ERROR_INVALID_VALUE,
          "a side of memory type CU_MEMORYTYPE_DEVICE is not device memory (0x{:x}, 0x{:x})", dst,
          src);
    }
  }
  if (!async) RETURN_IF_ERROR(refuseInCapture(ref, "a synchronous copy"));
  CopyModel* model = copyModel_.get();
  std::size_t total = width * rows.size();
  Stream::Work work = [=, rows = std::move(rows)] {
    model->transfer(s.device, d.device, total, [&] {
      for (const auto& [dst, src] : rows) {
        std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), width);
      }
    });
    return Status::ok();
  };
  NodeInfo info = kMemcpyNode;
  info.memcpy = described;
  ASSIGN_OR_RETURN(std::uint64_t seq, ref.context->submit(ref.stream, std::move(work), {}, info));
  return finishCopy(ref, seq, d, s, async);
}

// "For transfers from pageable host memory to device memory, a stream sync is
// performed before the copy is initiated" and "for transfers from device memory
// to pageable host memory, the function will return only once the copy has
// completed": vgpu waits for any copy that touches pageable memory.
Status Driver::finishCopy(const StreamRef& ref, std::uint64_t seq, const CopyEndpoint& d,
                          const CopyEndpoint& s, bool async) {
  bool pageable = (d.device < 0 && !d.pinned) || (s.device < 0 && !s.pinned);
  if (!async || pageable) {
    ref.stream->wait(seq);
    return ref.context->usable();
  }
  return Status::ok();
}

Status Driver::memset(const StreamRef& ref, std::uint64_t dst, std::size_t pitch, std::uint32_t value,
                      unsigned elementSize, std::size_t width, std::size_t height, bool async) {
  if (dst % elementSize != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not aligned to {} bytes", dst, elementSize);
  }
  std::size_t rowBytes = width * elementSize;
  if (width == 0 || height == 0) return Status::ok();
  if (height > 1 && pitch < rowBytes) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "pitch {} is smaller than a row of {} bytes", pitch, rowBytes);
  }
  std::size_t span = (height - 1) * pitch + rowBytes;
  ASSIGN_OR_RETURN(CopyEndpoint d, classify(dst, span, true));
  if (!async) RETURN_IF_ERROR(refuseInCapture(ref, "a synchronous memset"));
  CopyModel* model = copyModel_.get();
  Stream::Work work = [=] {
    model->transfer(d.device, d.device, rowBytes * height, [&] {
      for (std::size_t row = 0; row < height; ++row) {
        auto* p = reinterpret_cast<unsigned char*>(dst + row * pitch);
        if (elementSize == 1) {
          std::memset(p, static_cast<int>(value & 0xff), width);
        } else if (elementSize == 2) {
          auto v = static_cast<std::uint16_t>(value);
          for (std::size_t i = 0; i < width; ++i) std::memcpy(p + 2 * i, &v, 2);
        } else {
          for (std::size_t i = 0; i < width; ++i) std::memcpy(p + 4 * i, &value, 4);
        }
      }
    });
    return Status::ok();
  };
  NodeInfo info = kMemsetNode;
  info.memset = CUDA_MEMSET_NODE_PARAMS{dst, pitch, value, elementSize, width, height};
  ASSIGN_OR_RETURN(std::uint64_t seq, ref.context->submit(ref.stream, std::move(work), {}, info));
  if (!async) {
    ref.stream->wait(seq);
    return ref.context->usable();
  }
  return Status::ok();
}

// --- Driver: stream memory operations ---------------------------------------------------

namespace {

// Whether the word at `address` meets a wait's condition ("Wait until
// (int32_t)(*addr - value) >= 0", "*addr == value", "(*addr & value) != 0",
// "~(*addr | value) != 0"; the 64-bit forms alike).
template <typename Word>
bool waitMet(Word current, Word value, unsigned condition) {
  using Signed = std::make_signed_t<Word>;
  switch (condition) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return static_cast<Signed>(current - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
      return current == value;
    case CU_STREAM_WAIT_VALUE_AND:
      return (current & value) != 0;
    default:
      return static_cast<Word>(~(current | value)) != 0;  // NOR
  }
}

// How a stream memory wait ended.
enum class WaitEnd { kMet, kContextDestroyed, kMemoryFreed };

// Polls the word until the condition holds: a few spins, then sleeps that
// grow to a millisecond. Ends early when the context is destroyed, or when
// the word's memory is freed or unmapped meanwhile (a GPU's wait would fault).
template <typename Word>
WaitEnd waitFor(const AllocationMap& allocations, std::uint64_t address, Word value,
                unsigned condition, const std::weak_ptr<Context>& context) {
  std::atomic_ref<Word> word(*reinterpret_cast<Word*>(address));
  auto pause = std::chrono::microseconds(0);
  for (;;) {
    Word current{};
    if (!allocations.whileLive(address, sizeof(Word),
                               [&] { current = word.load(std::memory_order_acquire); })) {
      return WaitEnd::kMemoryFreed;
    }
    if (waitMet<Word>(current, value, condition)) return WaitEnd::kMet;
    auto owner = context.lock();
    if (owner == nullptr || owner->waitsAbandoned()) return WaitEnd::kContextDestroyed;
    owner.reset();
    if (pause.count() == 0) {
      std::this_thread::yield();
      pause = std::chrono::microseconds(10);
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
}

// A wait's condition: its flags without CU_STREAM_WAIT_VALUE_FLUSH.
unsigned waitCondition(const CUstreamBatchMemOpParams& op) {
  return op.waitValue.flags & ~static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH);
}

template <typename Word>
void writeWord(std::uint64_t address, Word value, unsigned flags) {
  std::atomic_ref<Word> word(*reinterpret_cast<Word*>(address));
  word.store(value, (flags & CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) != 0
                        ? std::memory_order_relaxed
                        : std::memory_order_release);
}

}  // namespace

Status Driver::streamMemOps(const StreamRef& ref, std::vector<CUstreamBatchMemOpParams> ops,
                            const char* what) {
  // "count: The number of operations in the array. Must be less than 256."
  if (ops.empty() || ops.size() >= 256) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} operations: a batch holds 1 to 255", ops.size());
  }
  for (const CUstreamBatchMemOpParams& op : ops) {
    std::size_t bytes = 0;
    std::uint64_t address = 0;
    switch (op.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      case CU_STREAM_MEM_OP_WAIT_VALUE_64: {
        if (waitCondition(op) > CU_STREAM_WAIT_VALUE_NOR) {
          return cuErrorf(CUDA_ERROR_INVALID_VALUE, "wait flags 0x{:x} are invalid",
                          op.waitValue.flags);
        }
        bytes = op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8;
        address = op.waitValue.address;
        break;
      }
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        if ((op.writeValue.flags &
             ~static_cast<unsigned>(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)) != 0) {
          return cuErrorf(CUDA_ERROR_INVALID_VALUE, "write flags 0x{:x} are invalid",
                          op.writeValue.flags);
        }
        bytes = op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8;
        address = op.writeValue.address;
        break;
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        if (op.flushRemoteWrites.flags != 0) {
          return cuError(CUDA_ERROR_INVALID_VALUE, "a flush's flags must be 0");
        }
        continue;
      case CU_STREAM_MEM_OP_BARRIER:
        if (op.memoryBarrier.flags != CU_STREAM_MEMORY_BARRIER_TYPE_SYS &&
            op.memoryBarrier.flags != CU_STREAM_MEMORY_BARRIER_TYPE_GPU) {
          return cuErrorf(CUDA_ERROR_INVALID_VALUE, "memory barrier type {} is invalid",
                          op.memoryBarrier.flags);
        }
        continue;
      default:
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "stream memory operation {} is invalid",
                        static_cast<int>(op.operation));
    }
    if (address % bytes != 0) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not aligned to {} bytes", address,
                      bytes);
    }
    // Device memory, or host memory registered with the device; "cannot be
    // used with managed memory".
    auto a = allocations_.findRange(address, bytes);
    if (!a || (a->kind == MemoryKind::kDevice && a->managed)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "0x{:x} is not device memory or host memory registered with the device{}",
                      address, a ? " (managed memory cannot be used)" : "");
    }
  }
  RETURN_IF_ERROR(refuseInCapture(ref, what));
  std::weak_ptr<Context> context = ref.context;
  Stream::Work work = [ops = std::move(ops), context, &allocations = allocations_] {
    for (const CUstreamBatchMemOpParams& op : ops) {
      WaitEnd waited = WaitEnd::kMet;
      switch (op.operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
          waited = waitFor<std::uint32_t>(allocations, op.waitValue.address, op.waitValue.value,
                                          waitCondition(op), context);
          break;
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
          waited = waitFor<std::uint64_t>(allocations, op.waitValue.address, op.waitValue.value64,
                                          waitCondition(op), context);
          break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
          writeWord<std::uint32_t>(op.writeValue.address, op.writeValue.value, op.writeValue.flags);
          break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
          writeWord<std::uint64_t>(op.writeValue.address, op.writeValue.value64,
                                   op.writeValue.flags);
          break;
        default:  // flushes and barriers: every write before is visible to what follows
          std::atomic_thread_fence(std::memory_order_seq_cst);
          break;
      }
      if (waited == WaitEnd::kContextDestroyed) {
        return cuError(CUDA_ERROR_CONTEXT_IS_DESTROYED, "the context was destroyed during a wait");
      }
      if (waited == WaitEnd::kMemoryFreed) {
        return cuErrorf(CUDA_ERROR_ILLEGAL_ADDRESS, "the memory at 0x{:x} was freed during a wait",
                        op.waitValue.address);
      }
    }
    return Status::ok();
  };
  return ref.context->submit(ref.stream, std::move(work), {}).status();
}

// --- Driver: VMM ---------------------------------------------------------------------

Result<std::uint64_t> Driver::reserveVa(std::size_t size, std::size_t alignment, std::uint64_t fixed) {
  if (size == 0 || size % kVmmGranularity != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "reservation size {} is not a multiple of {}", size,
                    kVmmGranularity);
  }
  if ((alignment & (alignment - 1)) != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "alignment {} is not a power of two", alignment);
  }
  if (fixed % kVmmGranularity != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "requested address 0x{:x} is not 2 MiB aligned", fixed);
  }
  ASSIGN_OR_RETURN(std::uint64_t base, reserveAddressRange(fixed, size, alignment));
  std::lock_guard lock(vmmMutex_);
  reservations_[base] = size;
  return base;
}

Status Driver::freeVa(std::uint64_t address, std::size_t size) {
  std::lock_guard lock(vmmMutex_);
  auto it = reservations_.find(address);
  if (it == reservations_.end() || it->second != size) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x}+{} is not a reservation", address, size);
  }
  if (!allocations_.overlapping(address, size).empty()) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x}+{} still has mappings (cuMemUnmap first)", address, size);
  }
  reservations_.erase(it);
  return releaseAddressRange(address, size);
}

Result<std::uint64_t> Driver::createPhysical(std::size_t size, const CUmemAllocationProp& prop) {
  const int device = prop.location.id;
  RETURN_IF_ERROR(checkDevice(device));
  if (size == 0 || size % kVmmGranularity != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "size {} is not a multiple of the granularity {}", size,
                    kVmmGranularity);
  }
  RETURN_IF_ERROR(heap(device).charge(size));
  std::string name = fmt::format("phos-vgpu-dev{}", device);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    heap(device).refund(size);
    return cuErrorf(CUDA_ERROR_OUT_OF_MEMORY, "memfd for {} bytes: {}", size, std::strerror(err));
  }
  std::lock_guard lock(vmmMutex_);
  std::uint64_t handle = nextPhysical_++;
  physical_[handle] = Physical{device, size, fd, 0, 1, prop};
  return handle;
}

Result<CUmemAllocationProp> Driver::physicalProperties(std::uint64_t handle) {
  std::lock_guard lock(vmmMutex_);
  auto it = physical_.find(handle);
  if (it == physical_.end() || it->second.refs == 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} is not a live allocation handle", handle);
  }
  return it->second.prop;
}

Status Driver::releasePhysical(std::uint64_t handle) {
  std::lock_guard lock(vmmMutex_);
  auto it = physical_.find(handle);
  if (it == physical_.end() || it->second.refs == 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a live allocation handle", handle);
  }
  if (--it->second.refs == 0 && it->second.mappings == 0) {
    close(it->second.fd);
    heap(it->second.device).refund(it->second.size);
    physical_.erase(it);
  }
  return Status::ok();
}

Result<std::uint64_t> Driver::retainPhysical(std::uint64_t address) {
  auto a = allocations_.find(address);
  if (!a || a->kind != MemoryKind::kVmmMapping) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not mapped with cuMemMap", address);
  }
  std::lock_guard lock(vmmMutex_);
  auto it = physical_.find(a->vmmHandle);
  if (it == physical_.end()) return cuError(CUDA_ERROR_INVALID_VALUE, "allocation handle vanished");
  ++it->second.refs;
  return a->vmmHandle;
}

Status Driver::map(std::uint64_t address, std::size_t size, std::size_t offset, std::uint64_t handle) {
  std::lock_guard lock(vmmMutex_);
  auto it = physical_.find(handle);
  if (it == physical_.end() || it->second.refs == 0) {
    return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a live allocation handle", handle);
  }
  Physical& phys = it->second;
  if (size == 0 || size % kVmmGranularity != 0 || address % kVmmGranularity != 0 ||
      offset % kVmmGranularity != 0 || offset > phys.size || size > phys.size - offset) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "cannot map 0x{:x}+{} at offset {} of a {}-byte allocation",
                    address, size, offset, phys.size);
  }
  auto r = reservations_.upper_bound(address);
  if (r == reservations_.begin() || std::prev(r)->first + std::prev(r)->second < address + size) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x}+{} is not inside a cuMemAddressReserve range", address, size);
  }
  if (!allocations_.overlapping(address, size).empty()) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x}+{} is already mapped", address, size);
  }
  void* p = mmap(reinterpret_cast<void*>(address), size, PROT_NONE, MAP_SHARED | MAP_FIXED, phys.fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) return errnoError(errno, "mmap of a physical allocation");
  Allocation a;
  a.base = address;
  a.size = size;
  a.kind = MemoryKind::kVmmMapping;
  a.device = phys.device;
  a.vmmHandle = handle;
  a.bufferId = nextBufferId_++;
  RETURN_IF_ERROR(allocations_.insert(a));
  ++phys.mappings;
  return Status::ok();
}

Status Driver::unmap(std::uint64_t address, std::size_t size) {
  std::lock_guard lock(vmmMutex_);
  auto mappings = allocations_.overlapping(address, size);
  if (mappings.empty()) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "nothing is mapped at 0x{:x}+{}", address, size);
  for (const Allocation& a : mappings) {
    if (a.kind != MemoryKind::kVmmMapping || a.base < address || a.base + a.size > address + size) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x}+{} does not cover whole cuMemMap mappings", address, size);
    }
  }
  for (const Allocation& a : mappings) {
    // Out of the map before its pages go (AllocationMap::whileLive).
    allocations_.erase(a.base);
    if (Status s = discardRange(a.base, a.size); !s.isOk()) {
      (void)allocations_.insert(a);  // as it was: nothing took its range meanwhile (vmmMutex_)
      return s;
    }
    auto it = physical_.find(a.vmmHandle);
    if (it != physical_.end() && --it->second.mappings == 0 && it->second.refs == 0) {
      close(it->second.fd);
      heap(it->second.device).refund(it->second.size);
      physical_.erase(it);
    }
  }
  return Status::ok();
}

Status Driver::setAccess(std::uint64_t address, std::size_t size, std::span<const CUmemAccessDesc> descs) {
  if (descs.empty()) return cuError(CUDA_ERROR_INVALID_VALUE, "no access descriptors");
  std::uint32_t readWrite = 0, readOnly = 0, none = 0;
  for (const CUmemAccessDesc& d : descs) {
    if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "only device locations can be granted access");
    }
    RETURN_IF_ERROR(checkDevice(d.location.id));
    std::uint32_t bit = 1U << d.location.id;
    switch (d.flags) {
      case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: readWrite |= bit; break;
      case CU_MEM_ACCESS_FLAGS_PROT_READ: readOnly |= bit; break;
      case CU_MEM_ACCESS_FLAGS_PROT_NONE: none |= bit; break;
      default: return cuErrorf(CUDA_ERROR_INVALID_VALUE, "access flags {} are invalid", static_cast<int>(d.flags));
    }
  }
  std::lock_guard lock(vmmMutex_);
  auto mappings = allocations_.overlapping(address, size);
  if (mappings.empty()) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "nothing is mapped at 0x{:x}+{}", address, size);
  for (const Allocation& a : mappings) {
    if (a.kind != MemoryKind::kVmmMapping || a.base < address || a.base + a.size > address + size) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x}+{} does not cover whole cuMemMap mappings", address, size);
    }
  }
  for (Allocation a : mappings) {
    a.accessDevices = ((a.accessDevices & ~none) | readWrite | readOnly);
    a.readOnlyAccess = readWrite == 0 && readOnly != 0;
    int prot = a.accessDevices == 0 ? PROT_NONE : (a.readOnlyAccess ? PROT_READ : PROT_READ | PROT_WRITE);
    if (mprotect(reinterpret_cast<void*>(a.base), a.size, prot) != 0) return errnoError(errno, "mprotect");
    RETURN_IF_ERROR(allocations_.update(a));
  }
  return Status::ok();
}

// --- Driver: streams and events ----------------------------------------------------------

Result<StreamRef> Driver::stream(CUstream handle, bool perThreadDefault) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    ASSIGN_OR_RETURN(auto context, current());
    bool perThread = handle == CU_STREAM_PER_THREAD || (handle == nullptr && perThreadDefault);
    return StreamRef{context, perThread ? context->perThreadStream() : context->legacyStreamPtr()};
  }
  auto entry = streams_.find(idOf(handle));
  if (!entry) return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a live stream", idOf(handle));
  auto context = contexts_.find(entry->context);
  if (!context) return cuError(CUDA_ERROR_INVALID_CONTEXT, "the stream's context was destroyed");
  RETURN_IF_ERROR(context->usable());
  return StreamRef{context, entry->stream};
}

Result<CUstream> Driver::createStream(unsigned flags, int priority) {
  if (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "stream flags 0x{:x} are invalid", flags);
  }
  ASSIGN_OR_RETURN(auto context, current());
  // "priorities outside [greatestPriority, leastPriority] are clamped".
  priority = std::clamp(priority, -5, 0);
  auto stream = context->createStream(flags, priority);
  streams_.add(stream->id(), std::make_shared<StreamEntry>(StreamEntry{context->id(), stream}));
  return reinterpret_cast<CUstream>(stream->id());
}

Status Driver::destroyStream(CUstream handle) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    return cuError(CUDA_ERROR_INVALID_HANDLE, "default streams cannot be destroyed");
  }
  auto entry = streams_.erase(idOf(handle));
  if (!entry) return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a live stream", idOf(handle));
  if (auto context = contexts_.find(entry->context)) context->forgetStream(entry->stream);
  // The Stream object (and its worker) goes away once its queued work has run.
  return Status::ok();
}

Result<CUevent> Driver::createEvent(unsigned flags) {
  constexpr unsigned kKnown = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if ((flags & ~kKnown) != 0 ||
      ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "event flags 0x{:x} are invalid", flags);
  }
  ASSIGN_OR_RETURN(auto context, current());
  std::uint64_t id = newHandle(HandleKind::kEvent);
  events_.add(id, std::make_shared<Event>(id, context->id(), flags));
  return reinterpret_cast<CUevent>(id);
}

Result<std::shared_ptr<Event>> Driver::event(CUevent handle) const {
  auto e = handle == nullptr ? nullptr : events_.find(idOf(handle));
  if (!e) return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a live event", idOf(handle));
  return e;
}

Status Driver::destroyEvent(CUevent handle) {
  if (handle == nullptr || !events_.erase(idOf(handle))) {
    return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a live event", idOf(handle));
  }
  return Status::ok();
}

Status Driver::recordEvent(CUevent handle, const StreamRef& ref) {
  ASSIGN_OR_RETURN(auto e, event(handle));
  if (e->context() != ref.context->id()) {
    return cuError(CUDA_ERROR_INVALID_HANDLE, "event and stream belong to different contexts");
  }
  if (auto capture = ref.stream->capture()) {
    // Recorded in a capture, the event stands for the stream's last nodes.
    if (capture->invalidated()) {
      return cuError(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                     "the stream's capture was invalidated by an earlier call");
    }
    e->setCapturedRecord({capture, capture->frontier(*ref.stream)});
    return Status::ok();
  }
  auto record = std::make_shared<EventRecord>();
  record->stream = ref.stream;
  bool timing = (e->flags() & CU_EVENT_DISABLE_TIMING) == 0;
  std::weak_ptr<EventRecord> weak = record;
  ASSIGN_OR_RETURN(record->seq, ref.context->submit(ref.stream, [weak, timing] {
    if (auto r = weak.lock()) {
      if (timing) r->time = std::chrono::steady_clock::now();
      r->completed.store(true, std::memory_order_release);
    }
    return Status::ok();
  }));
  e->setRecord(std::move(record));
  return Status::ok();
}

namespace {
// "The API will return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED if the
// specified context hCtx has a stream in the capture mode. In such a case,
// the call will invalidate all the conflicting captures."
Status refuseContextCaptures(const Context& context, const char* what) {
  auto captures = context.captures();
  if (captures.empty()) return Status::ok();
  for (const auto& c : captures) c->invalidate();
  return cuErrorf(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "{}: a stream of the context is capturing",
                  what);
}
}  // namespace

Status Driver::recordContextEvent(CUcontext contextHandle, CUevent handle) {
  ASSIGN_OR_RETURN(auto ctx, context(contextHandle));
  ASSIGN_OR_RETURN(auto e, event(handle));
  // "hEvent and hCtx must be from the same CUDA context, otherwise
  // CUDA_ERROR_INVALID_HANDLE will be returned."
  if (e->context() != ctx->id()) {
    return cuError(CUDA_ERROR_INVALID_HANDLE, "the event belongs to another context");
  }
  RETURN_IF_ERROR(refuseContextCaptures(*ctx, "cuCtxRecordEvent"));
  auto record = std::make_shared<EventRecord>();
  const bool timing = (e->flags() & CU_EVENT_DISABLE_TIMING) == 0;
  std::weak_ptr<EventRecord> weak = record;
  ASSIGN_OR_RETURN(StreamDependency at, ctx->afterAllWork([weak, timing] {
    if (auto r = weak.lock()) {
      if (timing) r->time = std::chrono::steady_clock::now();
      r->completed.store(true, std::memory_order_release);
    }
    return Status::ok();
  }));
  record->stream = at.stream;
  record->seq = at.seq;
  e->setRecord(std::move(record));
  return Status::ok();
}

Status Driver::contextWaitEvent(CUcontext contextHandle, CUevent handle) {
  ASSIGN_OR_RETURN(auto ctx, context(contextHandle));
  ASSIGN_OR_RETURN(auto e, event(handle));
  // "... if the specified event hEvent is part of an ongoing capture sequence
  // or if the specified context hCtx has a stream in the capture mode."
  if (auto captured = e->capturedRecord()) {
    if (auto source = captured->capture.lock(); source && source->active()) {
      source->invalidate();
      return cuError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "cuCtxWaitEvent: the event was recorded in an ongoing capture");
    }
  }
  RETURN_IF_ERROR(refuseContextCaptures(*ctx, "cuCtxWaitEvent"));
  // The event may be of another context or device.
  if (auto record = e->record()) ctx->waitForAll({record->stream, record->seq});
  return Status::ok();
}

Status Driver::waitEvent(const StreamRef& ref, CUevent handle) {
  ASSIGN_OR_RETURN(auto e, event(handle));
  auto capture = ref.stream->capture();
  if (auto captured = e->capturedRecord()) {
    auto source = captured->capture.lock();
    if (source && source->active()) {
      if (capture && capture != source) {
        capture->invalidate();
        return cuError(CUDA_ERROR_STREAM_CAPTURE_MERGE,
                       "the event was recorded in another capture sequence");
      }
      // A stream that waits for an event of a capture joins it.
      if (!capture) ref.stream->setCapture(source);
      source->join(ref.stream, captured->nodes);
      return Status::ok();
    }
  }
  auto record = e->record();
  if (capture) {
    if (!record) return Status::ok();
    // "Only implicit in-stream ordering dependencies are allowed to cross the boundary."
    capture->invalidate();
    return cuError(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                   "a capturing stream cannot wait for an event recorded outside its capture");
  }
  if (!record) return Status::ok();  // never recorded: nothing to wait for
  return ref.context->submit(ref.stream, nullptr, {{record->stream, record->seq}}).status();
}

Status Driver::synchronizeStream(const StreamRef& ref) {
  RETURN_IF_ERROR(refuseInCapture(ref, "cuStreamSynchronize"));
  ref.stream->waitIdle();
  return ref.context->takeAsyncError();
}

Status Driver::synchronizeContext(Context& context) {
  // "It is also invalid to ... synchronize a broader handle which encompasses
  // an active stream capture, such as a device or context handle."
  auto captures = context.captures();
  if (!captures.empty()) {
    for (const auto& c : captures) c->invalidate();
    return cuError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a stream of the context is capturing");
  }
  context.drain();
  return context.takeAsyncError();
}

// --- Driver: graphs and stream capture ------------------------------------------------

namespace {
// cuThreadExchangeStreamCaptureMode's: the thread's interaction with captures.
thread_local CUstreamCaptureMode threadCaptureMode = CU_STREAM_CAPTURE_MODE_GLOBAL;
}  // namespace

Status Driver::beginCapture(const StreamRef& ref, CUstreamCaptureMode mode, CUgraph into,
                            std::vector<std::uint64_t> dependencies) {
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "capture mode {} is not a CUstreamCaptureMode",
                    static_cast<int>(mode));
  }
  // "Capture may not be initiated if stream is CU_STREAM_LEGACY."
  if (ref.stream->kind() == Stream::Kind::kLegacy) {
    return cuError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "the legacy stream cannot be captured");
  }
  if (ref.stream->capture()) {
    return cuError(CUDA_ERROR_ILLEGAL_STATE, "the stream is capturing already");
  }
  // A graph of the capture's own, or the application's (cuStreamBeginCaptureToGraph).
  std::shared_ptr<Graph> graph;
  if (into != nullptr) {
    ASSIGN_OR_RETURN(graph, this->graph(into));
    for (std::uint64_t d : dependencies) {
      if (!graph->node(d)) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "dependency 0x{:x} is not a node of the graph",
                        d);
      }
    }
  } else {
    graph = std::make_shared<Graph>(newHandle(HandleKind::kGraph));
    graphs_.add(graph->id(), graph);
  }
  auto capture = std::make_shared<CaptureSequence>(newHandle(HandleKind::kGraph), mode, graph,
                                                   ref.stream, into == nullptr);
  capture->join(ref.stream, dependencies);
  ref.stream->setCapture(capture);
  std::lock_guard lock(capturesMutex_);
  std::erase_if(captures_, [](const auto& weak) {
    auto c = weak.lock();
    return !c || !c->active();
  });
  captures_.push_back(capture);
  return Status::ok();
}

Result<CUgraph> Driver::endCapture(const StreamRef& ref) {
  auto capture = ref.stream->capture();
  if (!capture) return cuError(CUDA_ERROR_ILLEGAL_STATE, "the stream is not capturing");
  if (capture->origin() != ref.stream.get()) {
    capture->invalidate();
    return cuError(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "the capture began on another stream");
  }
  if (capture->mode() != CU_STREAM_CAPTURE_MODE_RELAXED &&
      capture->thread() != std::this_thread::get_id()) {
    return cuError(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "the capture began in another thread");
  }
  auto graph = capture->end();
  if (!graph.isOk()) {
    // The application's graph stays, with what was captured into it.
    if (capture->ownsGraph()) graphs_.erase(capture->graph()->id());
    return graph.status();
  }
  return reinterpret_cast<CUgraph>((*graph)->id());
}

Status Driver::refuseInCapture(const StreamRef& ref, const char* what) {
  if (auto capture = ref.stream->capture()) {
    capture->invalidate();
    return cuErrorf(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                    "{} is not allowed on a capturing stream", what);
  }
  return Status::ok();
}

Status Driver::checkUnsafeCall(const char* what) {
  const CUstreamCaptureMode mine = threadCaptureMode;
  if (mine == CU_STREAM_CAPTURE_MODE_RELAXED) return Status::ok();
  const auto self = std::this_thread::get_id();
  std::lock_guard lock(capturesMutex_);
  for (const auto& weak : captures_) {
    auto c = weak.lock();
    if (!c || !c->active() || c->mode() == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
    // Thread-local: only this thread's own captures; global: any thread's
    // global captures as well.
    const bool ownCapture = c->thread() == self;
    const bool othersGlobal =
        mine == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode() == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (ownCapture || othersGlobal) {
      if (ownCapture) c->invalidate();
      return cuErrorf(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                      "{} is not allowed while a stream captures (capture mode {}; "
                      "cuThreadExchangeStreamCaptureMode "
                      "with CU_STREAM_CAPTURE_MODE_RELAXED allows it)",
                      what, c->mode() == CU_STREAM_CAPTURE_MODE_GLOBAL ? "global" : "thread-local");
    }
  }
  return Status::ok();
}

CUstreamCaptureMode Driver::exchangeThreadCaptureMode(CUstreamCaptureMode mode) {
  return std::exchange(threadCaptureMode, mode);
}

Result<CUgraph> Driver::createGraph() {
  const std::uint64_t id = newHandle(HandleKind::kGraph);
  graphs_.add(id, std::make_shared<Graph>(id));
  return reinterpret_cast<CUgraph>(id);
}

Result<std::shared_ptr<Graph>> Driver::graph(CUgraph handle) const {
  const std::uint64_t id = idOf(handle);
  auto g = handle == nullptr ? nullptr : graphs_.find(id);
  // A child graph node's graph: "changes to the graph will be reflected in the node".
  std::shared_ptr<Graph> child;
  if (!g && handle != nullptr) {
    (void)graphs_.findIf([&](const Graph& top) { return (child = top.embedded(id)) != nullptr; });
  }
  if (child) return child;
  if (!g) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a live graph", id);
  return g;
}

// --- Driver: user objects ------------------------------------------------------------------

Result<std::uint64_t> Driver::createUserObject(void* ptr, CUhostFn destroy, unsigned initial) {
  auto object = std::make_shared<UserObject>();
  object->id = newHandle(HandleKind::kUserObject);
  object->ptr = ptr;
  object->destroy = destroy;
  object->refs = initial;
  userObjects_.add(object->id, object);
  return object->id;
}

Status Driver::retainUserObject(std::uint64_t id, unsigned count) {
  std::lock_guard lock(userObjectMutex_);
  auto object = userObjects_.find(id);
  if (!object) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a live user object", id);
  object->refs += count;
  return Status::ok();
}

Status Driver::releaseUserObject(std::uint64_t id, unsigned count) {
  std::shared_ptr<UserObject> gone;
  {
    std::lock_guard lock(userObjectMutex_);
    auto object = userObjects_.find(id);
    if (!object) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a live user object", id);
    if (object->refs < static_cast<std::int64_t>(count)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "user object 0x{:x} has {} references, not {}", id,
                      object->refs, count);
    }
    object->refs -= count;
    if (object->refs > 0) return Status::ok();
    gone = userObjects_.erase(id);
  }
  std::lock_guard lock(destructorMutex_);
  destructors_.emplace_back(gone->destroy, gone->ptr);
  if (!destructorThreadStarted_) {
    destructorThreadStarted_ = true;
    // The driver is never destroyed: neither is this thread.
    std::thread([this] {
      for (;;) {
        std::unique_lock wait(destructorMutex_);
        destructorReady_.wait(wait, [this] { return !destructors_.empty(); });
        auto [destroy, ptr] = destructors_.front();
        destructors_.pop_front();
        wait.unlock();
        destroy(ptr);
      }
    }).detach();
  }
  destructorReady_.notify_one();
  return Status::ok();
}

void retainUserObjectReferences(std::uint64_t object, unsigned count) {
  (void)Driver::instance().retainUserObject(object, count);
}

void releaseUserObjectReferences(std::uint64_t object, unsigned count) {
  (void)Driver::instance().releaseUserObject(object, count);
}

Status Driver::destroyGraph(CUgraph handle) {
  if (handle == nullptr || !graphs_.erase(idOf(handle))) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a live graph", idOf(handle));
  }
  return Status::ok();
}

Result<CUgraph> Driver::cloneGraph(CUgraph handle) {
  ASSIGN_OR_RETURN(auto original, graph(handle));
  auto copy = original->clone(newHandle(HandleKind::kGraph));
  graphs_.add(copy->id(), copy);
  return reinterpret_cast<CUgraph>(copy->id());
}

Result<std::pair<std::shared_ptr<Graph>, std::shared_ptr<GraphNode>>> Driver::graphNode(
    CUgraphNode handle) const {
  const std::uint64_t id = idOf(handle);
  auto g = handle == nullptr
               ? nullptr
               : graphs_.findIf([&](const Graph& graph) { return graph.node(id) != nullptr; });
  // Or a node of a child graph node's graph.
  std::shared_ptr<Graph> child;
  if (!g && handle != nullptr) {
    (void)graphs_.findIf([&](const Graph& top) { return (child = top.holderOf(id)) != nullptr; });
  }
  if (child) g = child;
  if (!g) return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a node of a live graph", id);
  return std::pair{g, g->node(id)};
}

Result<std::shared_ptr<GraphNode>> Driver::captureNode(
    const std::shared_ptr<Graph>& target, std::vector<std::uint64_t> dependencies,
    const std::function<CUresult(CUstream)>& call) {
  for (std::uint64_t d : dependencies) {
    if (!target->node(d)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "dependency 0x{:x} is not a node of the graph", d);
    }
  }
  // A stream of the current context, capturing into the graph after the
  // dependencies; the call must submit exactly one piece of work to it.
  ASSIGN_OR_RETURN(CUstream scratch, createStream(CU_STREAM_NON_BLOCKING, 0));
  ASSIGN_OR_RETURN(StreamRef ref, stream(scratch, false));
  auto capture = std::make_shared<CaptureSequence>(
      newHandle(HandleKind::kGraph), CU_STREAM_CAPTURE_MODE_RELAXED, target, ref.stream);
  capture->join(ref.stream, dependencies);
  ref.stream->setCapture(capture);
  const std::size_t before = target->nodes().size();
  const CUresult result = call(scratch);
  (void)capture->end();
  (void)destroyStream(scratch);
  if (result != CUDA_SUCCESS) {
    return cuErrorf(result, "the node's parameters were refused (CUresult {})",
                    static_cast<int>(result));
  }
  auto nodes = target->nodes();
  if (nodes.size() != before + 1) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the parameters describe no work");
  }
  return nodes.back();
}

Result<CUgraphNode> Driver::addNodeByCapture(CUgraph handle,
                                             std::vector<std::uint64_t> dependencies,
                                             const std::function<CUresult(CUstream)>& call) {
  ASSIGN_OR_RETURN(auto target, graph(handle));
  ASSIGN_OR_RETURN(auto node, captureNode(target, std::move(dependencies), call));
  return reinterpret_cast<CUgraphNode>(node->id);
}

Result<CUgraphNode> Driver::addEventNode(CUgraph handle, std::vector<std::uint64_t> dependencies,
                                         CUevent event, CUgraphNodeType type) {
  ASSIGN_OR_RETURN(auto target, graph(handle));
  if (event == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "event is null");
  ASSIGN_OR_RETURN(auto e, this->event(event));
  (void)e;
  ASSIGN_OR_RETURN(auto node, target->add(NodeInfo{type, std::nullopt, event}, nullptr,
                                          std::move(dependencies)));
  return reinterpret_cast<CUgraphNode>(node->id);
}

Result<std::shared_ptr<GraphExec>> Driver::graphExec(CUgraphExec handle) const {
  auto exec = handle == nullptr ? nullptr : graphExecs_.find(idOf(handle));
  if (!exec) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a live executable graph",
                    idOf(handle));
  }
  return exec;
}

Status Driver::setNodeWork(CUgraphNode handle, CUgraphNodeType type,
                           const std::function<CUresult(CUstream)>& call) {
  ASSIGN_OR_RETURN(auto found, graphNode(handle));
  GraphNode& node = *found.second;
  if (node.info.type != type) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the node is of another type");
  }
  // The new work, made as the node's was, in a graph of its own.
  auto scratch = std::make_shared<Graph>(newHandle(HandleKind::kGraph));
  ASSIGN_OR_RETURN(auto made, captureNode(scratch, {}, call));
  if (made->info.type != type) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the parameters are of another node type");
  }
  // New parameters keep the node's attributes (cuGraphKernelNodeSetAttribute's).
  if (node.info.kernel && made->info.kernel) {
    made->info.kernel->attributes = node.info.kernel->attributes;
  }
  node.info = made->info;
  node.work = made->work;
  return Status::ok();
}

Status Driver::setExecNodeWork(CUgraphExec handle, CUgraphNode node, CUgraphNodeType type,
                               const std::function<CUresult(CUstream)>& call) {
  ASSIGN_OR_RETURN(auto exec, graphExec(handle));
  auto scratch = std::make_shared<Graph>(newHandle(HandleKind::kGraph));
  ASSIGN_OR_RETURN(auto made, captureNode(scratch, {}, call));
  if (made->info.type != type) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the parameters are of another node type");
  }
  return exec->replaceWork(idOf(node), type, made->work);
}

Status Driver::setNodeEvent(CUgraphNode handle, CUgraphNodeType type, CUevent event) {
  ASSIGN_OR_RETURN(auto found, graphNode(handle));
  if (found.second->info.type != type) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the node is of another type");
  }
  ASSIGN_OR_RETURN(auto e, this->event(event));
  (void)e;
  found.second->info.event = event;
  return Status::ok();
}

Status Driver::setExecNodeEvent(CUgraphExec handle, CUgraphNode node, CUgraphNodeType type,
                                CUevent event) {
  ASSIGN_OR_RETURN(auto exec, graphExec(handle));
  ASSIGN_OR_RETURN(auto e, this->event(event));
  (void)e;
  return exec->replaceEvent(idOf(node), type, event);
}

Result<CUgraphExecUpdateResult> Driver::updateGraphExec(CUgraphExec handle, CUgraph graphHandle) {
  ASSIGN_OR_RETURN(auto exec, graphExec(handle));
  ASSIGN_OR_RETURN(auto g, graph(graphHandle));
  ASSIGN_OR_RETURN(auto steps, g->executionOrder());
  ASSIGN_OR_RETURN(CUgraphExecUpdateResult result, exec->update(steps));
  // "The references in the new source graph are cloned and replace the
  // references in the target graph" (launches still running keep the old).
  if (result == CU_GRAPH_EXEC_UPDATE_SUCCESS) exec->setUserObjects(userObjectsOf(*g));
  return result;
}

Status Driver::updateChildGraphNode(CUgraphExec handle, CUgraphNode nodeHandle,
                                    CUgraph childHandle) {
  ASSIGN_OR_RETURN(auto exec, graphExec(handle));
  ASSIGN_OR_RETURN(auto found, graphNode(nodeHandle));
  if (!found.second->child) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a child graph node");
  }
  ASSIGN_OR_RETURN(auto g, graph(childHandle));
  ASSIGN_OR_RETURN(auto steps, g->executionOrder());
  return exec->updateChild(found.second->id, steps);
}

Result<CUgraphNode> Driver::findInClone(CUgraphNode original, CUgraph clone) const {
  ASSIGN_OR_RETURN(auto g, graph(clone));
  for (const auto& n : g->nodes()) {
    if (original != nullptr && n->clonedFrom == idOf(original)) {
      return reinterpret_cast<CUgraphNode>(n->id);
    }
  }
  return cuError(CUDA_ERROR_INVALID_VALUE, "the node has no copy in the clone");
}

Result<CUgraphNode> Driver::addChildGraphNode(CUgraph handle,
                                              std::vector<std::uint64_t> dependencies,
                                              CUgraph child) {
  ASSIGN_OR_RETURN(auto target, graph(handle));
  ASSIGN_OR_RETURN(auto inner, graph(child));
  if (inner == target) return cuError(CUDA_ERROR_INVALID_VALUE, "a graph cannot be its own child");
  // "The node executes an embedded child graph. The child graph is cloned in this call."
  NodeInfo info{CU_GRAPH_NODE_TYPE_GRAPH, std::nullopt};
  ASSIGN_OR_RETURN(auto node, target->add(std::move(info), nullptr, std::move(dependencies),
                                          inner->clone(newHandle(HandleKind::kGraph))));
  return reinterpret_cast<CUgraphNode>(node->id);
}

Result<CUgraphExec> Driver::instantiate(CUgraph handle, unsigned long long flags) {
  ASSIGN_OR_RETURN(auto g, graph(handle));
  ASSIGN_OR_RETURN(auto steps, g->executionOrder());
  const std::uint64_t id = newHandle(HandleKind::kGraphExec);
  auto exec = std::make_shared<GraphExec>(id, std::move(steps), flags);
  exec->setUserObjects(userObjectsOf(*g));
  graphExecs_.add(id, std::move(exec));
  return reinterpret_cast<CUgraphExec>(id);
}

Status Driver::destroyGraphExec(CUgraphExec handle) {
  if (handle == nullptr || !graphExecs_.erase(idOf(handle))) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a live executable graph",
                    idOf(handle));
  }
  return Status::ok();
}

Status Driver::launchGraph(CUgraphExec handle, const StreamRef& ref) {
  auto exec = handle == nullptr ? nullptr : graphExecs_.find(idOf(handle));
  if (!exec) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a live executable graph",
                    idOf(handle));
  }
  // Behind the previous launch of the same graph, wherever it was launched;
  // then each node's work in an order its dependencies allow, and its events
  // recorded or waited for on the stream. In a capture, the graph's work
  // becomes nodes of the capturing graph, in that order.
  if (auto last = exec->lastLaunch(); last.stream && last.stream != ref.stream) {
    RETURN_IF_ERROR(ref.context->submit(ref.stream, nullptr, {last}).status());
  }
  for (const ExecStep& step : exec->steps()) {
    if (!step.enabled) continue;  // "functionally equivalent to empty nodes"
    if (step.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) {
      RETURN_IF_ERROR(recordEvent(step.event, ref));
    } else if (step.type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) {
      RETURN_IF_ERROR(waitEvent(ref, step.event));
    } else {
      RETURN_IF_ERROR(ref.context->submit(ref.stream, step.work).status());
    }
  }
  if (!ref.stream->capture()) {
    // The launch holds the executable graph's user objects until it has run.
    if (auto refs = exec->userObjects(); !refs->empty()) {
      RETURN_IF_ERROR(ref.context->submit(ref.stream, [refs] { return Status::ok(); }).status());
    }
    exec->setLastLaunch({ref.stream, ref.stream->lastEnqueued()});
  }
  return Status::ok();
}

// New references to every user object `g` and its child graphs own, for an
// executable graph made of it.
std::shared_ptr<UserObjectRefs> Driver::userObjectsOf(const Graph& g) {
  auto refs = std::make_shared<UserObjectRefs>();
  for (const auto& [object, count] : g.allUserObjects()) {
    if (retainUserObject(object, count).isOk()) refs->add(object, count);
  }
  return refs;
}

// --- Driver: modules and launches ----------------------------------------------------------

void Driver::setProgramLoader(std::shared_ptr<ProgramLoader> loader) {
  std::lock_guard lock(loaderMutex_);
  loader_ = std::move(loader);
}

Result<CUmodule> Driver::loadModule(const void* image, int maxRegisters) {
  if (image == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "module image is null");
  ASSIGN_OR_RETURN(auto context, current());
  ASSIGN_OR_RETURN(auto bytes, copyModuleImage(image));
  ASSIGN_OR_RETURN(auto module, loadModuleIn(context, bytes));
  module->maxRegisters = maxRegisters;
  return reinterpret_cast<CUmodule>(module->id);
}

Result<std::shared_ptr<Module>> Driver::loadModuleIn(
    const std::shared_ptr<Context>& context, std::span<const std::byte> image,
    const std::map<std::string, std::uint64_t>& shared) {
  const DeviceProfile& profile = platform_.devices[static_cast<std::size_t>(context->device())];
  int cc = profile.ccMajor * 10 + profile.ccMinor;
  ASSIGN_OR_RETURN(ModuleCode code, moduleCode(image, cc));
  auto module = std::make_shared<Module>();
  module->id = newHandle(HandleKind::kModule);
  module->context = context->id();
  module->device = context->device();
  if (!code.noBinary.empty()) {
    logger()->debug("module 0x{:x}: no code for this device: {}", module->id, code.noBinary);
    module->noBinary = std::move(code.noBinary);
    modules_.add(module->id, module);
    return module;
  }
  const std::string& ptx = code.ptx;
  module->ptxArchitecture = ptxArchitecture(ptx);
  std::shared_ptr<ProgramLoader> loader;
  {
    std::lock_guard lock(loaderMutex_);
    loader = loader_;
  }
  if (!loader) {
    logger()->warn("module load: no PTX engine is registered with vgpu; returning CUDA_ERROR_NOT_SUPPORTED");
    return cuError(CUDA_ERROR_NOT_SUPPORTED, "no PTX engine is registered with vgpu");
  }
  std::map<std::string, std::uint64_t> placement;
  {
    std::lock_guard lock(placementMutex_);
    if (auto it = placements_.find(context->id()); it != placements_.end()) {
      placement = std::move(it->second);
      placements_.erase(it);
    }
  }
  ModuleMemory memory(*this, context, cc, std::move(placement), shared);
  auto program = loader->load(ptx, memory);
  if (!program.isOk()) {
    for (std::uint64_t a : memory.allocations) (void)freeDevice(a, false);
    Status s = program.status();
    switch (s.code()) {
      case Code::kInvalidArgument: return cuError(CUDA_ERROR_INVALID_PTX, s.message());
      case Code::kNotSupported: return cuError(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, s.message());
      case Code::kResourceExhausted: return cuError(CUDA_ERROR_OUT_OF_MEMORY, s.message());
      default: return s;
    }
  }
  module->program = std::shared_ptr<Program>(std::move(program).value());
  module->allocations = std::move(memory.allocations);
  modules_.add(module->id, module);
  return module;
}

Result<CUmodule> Driver::loadModuleFile(const char* path) {
  if (path == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "file name is null");
  std::ifstream in(path, std::ios::binary);
  if (!in) return cuErrorf(CUDA_ERROR_FILE_NOT_FOUND, "cannot open '{}'", path);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  data.push_back('\0');  // PTX files are text without a terminator
  return loadModule(data.data());
}

Result<std::shared_ptr<Module>> Driver::module(CUmodule handle) const {
  auto m = handle == nullptr ? nullptr : modules_.find(idOf(handle));
  if (!m) return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a loaded module", idOf(handle));
  return m;
}

Status Driver::unloadModule(CUmodule handle) {
  ASSIGN_OR_RETURN(auto m, module(handle));
  if (auto context = contexts_.find(m->context)) context->drain();
  modules_.erase(m->id);
  functions_.eraseIf([&](const Function& f) { return f.module.lock() == m || f.module.expired(); });
  for (std::uint64_t a : m->allocations) (void)freeDevice(a, false);
  return Status::ok();
}

Result<CUfunction> Driver::function(CUmodule moduleHandle, const char* name) {
  ASSIGN_OR_RETURN(auto m, module(moduleHandle));
  if (name == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "function name is null");
  if (!m->program) return cuErrorf(CUDA_ERROR_NO_BINARY_FOR_GPU, "function '{}': {}", name, m->noBinary);
  const auto& functions = m->program->functions();
  for (std::size_t i = 0; i < functions.size(); ++i) {
    if (functions[i].name != name) continue;
    std::lock_guard lock(m->mutex);
    auto& handle = m->functionHandles[i];
    if (handle == 0) {
      auto f = std::make_shared<Function>();
      f->id = newHandle(HandleKind::kFunction);
      f->module = m;
      f->program = m->program;
      f->index = i;
      f->context = m->context;
      functions_.add(f->id, f);
      handle = f->id;
    }
    return reinterpret_cast<CUfunction>(handle);
  }
  return cuErrorf(CUDA_ERROR_NOT_FOUND, "module has no kernel named '{}'", name);
}

Result<std::shared_ptr<Function>> Driver::function(CUfunction handle) {
  if (handle != nullptr && kindOf(idOf(handle)) == HandleKind::kKernel) {
    return kernelFunction(reinterpret_cast<CUkernel>(handle), true);
  }
  auto f = handle == nullptr ? nullptr : functions_.find(idOf(handle));
  if (!f) return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a live function", idOf(handle));
  return f;
}

Status Driver::launch(CUfunction handle, const LaunchConfig& config, CUstream streamHandle,
                      bool perThreadDefault, void** kernelParams, void** extra) {
  ASSIGN_OR_RETURN(auto f, function(handle));
  const FunctionInfo& info = f->program->functions().at(f->index);
  const Dim3& g = config.grid;
  const Dim3& b = config.block;
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "grid ({},{},{}) is outside (2^31-1, 65535, 65535)", g.x, g.y, g.z);
  }
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "block ({},{},{}) is outside (1024, 1024, 64)", b.x, b.y, b.z);
  }
  const auto& cluster = info.requiredCluster;
  if (std::uint64_t{cluster[0]} * cluster[1] * cluster[2] > 1) {
    return cuErrorf(CUDA_ERROR_NOT_SUPPORTED,
                    "{} is compiled for thread block clusters of ({},{},{}) CTAs (.reqnctapercluster), which vgpu "
                    "does not run",
                    info.name, cluster[0], cluster[1], cluster[2]);
  }
  std::uint64_t threads = std::uint64_t{b.x} * b.y * b.z;
  if (threads > static_cast<std::uint64_t>(std::min(1024, info.maxThreadsPerBlock))) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} threads per block exceed the limit of {}", threads,
                    std::min(1024, info.maxThreadsPerBlock));
  }
  int optIn = f->dynamicSharedOptIn();
  std::size_t dynamicLimit = optIn >= 0 ? static_cast<std::size_t>(optIn)
                                        : (48 * 1024 > info.staticSharedBytes ? 48 * 1024 - info.staticSharedBytes : 0);
  if (config.dynamicSharedBytes > dynamicLimit) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "{} bytes of dynamic shared memory exceed the limit of {}",
                    config.dynamicSharedBytes, dynamicLimit);
  }
  ASSIGN_OR_RETURN(StreamRef ref, stream(streamHandle, perThreadDefault));
  if (ref.context->id() != f->context) {
    return cuError(CUDA_ERROR_INVALID_HANDLE, "the function belongs to another context than the stream");
  }
  std::vector<std::byte> params(info.paramBufferSize);
  if (kernelParams != nullptr && extra != nullptr) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "both kernelParams and extra are given");
  }
  if (kernelParams != nullptr) {
    for (std::size_t i = 0; i < info.params.size(); ++i) {
      const ParamInfo& p = info.params[i];
      if (kernelParams[i] == nullptr) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "kernelParams[{}] is null", i);
      }
      if (p.offset + p.size > params.size()) {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "parameter {} lies outside the parameter buffer", i);
      }
      std::memcpy(params.data() + p.offset, kernelParams[i], p.size);
    }
  } else if (extra != nullptr) {
    const void* buffer = nullptr;
    const std::size_t* size = nullptr;
    for (std::size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        buffer = extra[i + 1];
      } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
        size = static_cast<const std::size_t*>(extra[i + 1]);
      } else {
        return cuErrorf(CUDA_ERROR_INVALID_VALUE, "unknown extra launch option {}", extra[i]);
      }
    }
    if (buffer == nullptr || size == nullptr) {
      return cuError(CUDA_ERROR_INVALID_VALUE,
                     "extra needs CU_LAUNCH_PARAM_BUFFER_POINTER and CU_LAUNCH_PARAM_BUFFER_SIZE");
    }
    if (*size < params.size()) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "parameter buffer of {} bytes, kernel '{}' needs {}",
                      *size, info.name, params.size());
    }
    std::memcpy(params.data(), buffer, params.size());
  } else if (!info.params.empty()) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "kernel '{}' takes {} parameters and none were given",
                    info.name, info.params.size());
  }
  auto program = f->program;
  std::size_t index = f->index;
  Context* context = ref.context.get();
  Driver* driver = this;
  // Whether to record is decided at enqueue time, so switching the recorder does
  // not race with launches already queued.
  std::shared_ptr<RecordedLaunch> recorded;
  // A captured launch runs at each launch of its graph: not one recorded launch.
  const bool capturing = ref.stream->capture() != nullptr;
  if (context->recordsAccesses() && !capturing) {
    recorded = std::make_shared<RecordedLaunch>();
    recorded->accesses.function = handle;
  }
  // Published before the work is submitted, so it is findable by the time it runs.
  // (Two threads launching on one stream at once: "last" is the last to publish.)
  if (recorded) context->setLastRecordedLaunch(ref.stream->id(), recorded);
  // The sink is chosen at enqueue time too, like the recorder.
  std::shared_ptr<PrintfSink> printfSink = context->printfSink();
  NodeInfo node{CU_GRAPH_NODE_TYPE_KERNEL, std::nullopt};
  if (capturing) {
    KernelNodeInfo kernel;
    kernel.function = handle;
    kernel.grid = {g.x, g.y, g.z};
    kernel.block = {b.x, b.y, b.z};
    kernel.sharedMemBytes = static_cast<unsigned>(config.dynamicSharedBytes);
    kernel.params = params;
    for (const ParamInfo& p : info.params) kernel.offsets.push_back(p.offset);
    if (config.cooperative) {
      CUlaunchAttributeValue cooperative{};
      cooperative.cooperative = 1;
      kernel.attributes[CU_LAUNCH_ATTRIBUTE_COOPERATIVE] = cooperative;
    }
    node.kernel = std::move(kernel);
  }
  Stream::Work work = [=, params = std::move(params)] {
    ContextAddressChecker checker(*driver, *context);
    StdoutPrintfSink stdoutSink;
    AccessRecord accesses;
    PrintfSink* sink = printfSink ? printfSink.get() : &stdoutSink;
    ContextTextures textures(*driver, context->id());
    LaunchContext launchContext{&checker, sink, context->device(), recorded ? &accesses : nullptr,
                                &textures};
    Status status = program->launch(index, config, params, launchContext);
    if (recorded) {
      // Grouped now, while every allocation the kernel touched is still live.
      recorded->recorded = accesses.recorded;
      if (accesses.recorded) recorded->accesses.allocations = driver->groupByAllocation(accesses);
      recorded->done.store(true, std::memory_order_release);
    }
    return status;
  };
  return ref.context->submit(ref.stream, std::move(work), {}, node).status();
}

// --- Driver: access recorder ---------------------------------------------------------------

Status Driver::setRecordAccesses(CUcontext handle, bool enabled) {
  std::shared_ptr<Context> context;
  if (handle == nullptr) {
    ASSIGN_OR_RETURN(context, current());
  } else {
    ASSIGN_OR_RETURN(context, this->context(handle));
  }
  context->setRecordAccesses(enabled);
  return Status::ok();
}

Status Driver::setPrintfSink(CUcontext handle, std::shared_ptr<PrintfSink> sink) {
  std::shared_ptr<Context> context;
  if (handle == nullptr) {
    ASSIGN_OR_RETURN(context, current());
  } else {
    ASSIGN_OR_RETURN(context, this->context(handle));
  }
  context->setPrintfSink(std::move(sink));
  return Status::ok();
}

Result<LaunchAccesses> Driver::lastLaunchAccesses(CUstream handle) {
  ASSIGN_OR_RETURN(StreamRef ref, stream(handle, false));
  auto launch = ref.context->lastRecordedLaunch(ref.stream->id());
  if (!launch) return cuError(CUDA_ERROR_NOT_FOUND, "no recorded launch was enqueued on the stream");
  if (!launch->done.load(std::memory_order_acquire)) {
    return cuError(CUDA_ERROR_NOT_READY, "the last recorded launch of the stream has not run yet");
  }
  if (!launch->recorded) {
    return cuError(CUDA_ERROR_NOT_SUPPORTED, "the engine that ran the launch does not record accesses");
  }
  return launch->accesses;
}

std::vector<AllocationAccesses> Driver::groupByAllocation(const AccessRecord& record) const {
  std::map<std::uint64_t, AllocationAccesses> byBase;
  auto add = [&](const std::vector<ByteRange>& ranges, bool write) {
    for (const ByteRange& r : ranges) {
      std::uint64_t covered = 0;
      for (const Allocation& a : allocations_.overlapping(r.begin, r.end - r.begin)) {
        std::uint64_t begin = std::max(r.begin, a.base);
        std::uint64_t end = std::min<std::uint64_t>(r.end, a.base + a.size);
        AllocationAccesses& group = byBase[a.base];
        group.base = a.base;
        group.size = a.size;
        // The engine's ranges are sorted and coalesced, so clipped pieces stay so.
        (write ? group.writes : group.reads).push_back({begin - a.base, end - a.base});
        covered += end - begin;
      }
      if (covered != r.end - r.begin) {
        logger()->warn("access recorder: {} of the bytes [0x{:x}, 0x{:x}) lie outside every allocation",
                       r.end - r.begin - covered, r.begin, r.end);
      }
    }
  };
  add(record.reads, false);
  add(record.writes, true);
  std::vector<AllocationAccesses> out;
  out.reserve(byBase.size());
  for (auto& [base, group] : byBase) out.push_back(std::move(group));
  return out;
}

Result<CUlibrary> Driver::loadLibrary(const void* image, int maxRegisters) {
  ASSIGN_OR_RETURN(auto bytes, copyModuleImage(image));
  auto lib = std::make_shared<Library>();
  lib->id = newHandle(HandleKind::kLibrary);
  lib->image = std::move(bytes);
  lib->maxRegisters = maxRegisters;
  // Loaded once now, so that a malformed image is refused here; other
  // contexts load it on first use.
  std::shared_ptr<Context> context = currentOrNull();
  if (!context) {
    ASSIGN_OR_RETURN(context, loadingContext());
  }
  ASSIGN_OR_RETURN(auto module, libraryModule(*lib, context));
  (void)module;
  libraries_.add(lib->id, lib);
  return reinterpret_cast<CUlibrary>(lib->id);
}

Result<CUlibrary> Driver::loadLibraryFile(const char* path, int maxRegisters) {
  if (path == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "file name is null");
  std::ifstream in(path, std::ios::binary);
  if (!in) return cuErrorf(CUDA_ERROR_FILE_NOT_FOUND, "cannot open '{}'", path);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  data.push_back('\0');  // PTX files are text without a terminator
  return loadLibrary(data.data(), maxRegisters);
}

Result<std::shared_ptr<Library>> Driver::library(CUlibrary handle) const {
  auto l = handle == nullptr ? nullptr : libraries_.find(idOf(handle));
  if (!l) return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a loaded library", idOf(handle));
  return l;
}

Status Driver::unloadLibrary(CUlibrary handle) {
  ASSIGN_OR_RETURN(auto lib, library(handle));
  libraries_.erase(lib->id);
  std::lock_guard lock(lib->mutex);
  for (const auto& [context, module] : lib->modules) {
    if (modules_.find(module)) (void)unloadModule(reinterpret_cast<CUmodule>(module));
  }
  for (const auto& [name, kernel] : lib->kernels) kernels_.erase(kernel);
  lib->modules.clear();
  return Status::ok();
}

Status Driver::placeNextModuleGlobals(CUcontext handle, std::map<std::string, std::uint64_t> placement) {
  ASSIGN_OR_RETURN(auto context, this->context(handle));
  std::lock_guard lock(placementMutex_);
  placements_[context->id()] = std::move(placement);
  return Status::ok();
}

Result<std::shared_ptr<Context>> Driver::loadingContext() {
  std::lock_guard lock(loadingContextMutex_);
  if (!loadingContext_ || loadingContext_->destroyed()) {
    loadingContext_ = std::make_shared<Context>(newHandle(HandleKind::kContext), 0, 0, false);
    contexts_.add(loadingContext_->id(), loadingContext_);
  }
  return loadingContext_;
}

Result<std::shared_ptr<Module>> Driver::libraryModule(Library& lib, const std::shared_ptr<Context>& context) {
  std::lock_guard lock(lib.mutex);
  if (auto it = lib.modules.find(context->id()); it != lib.modules.end()) {
    if (auto m = modules_.find(it->second)) return m;
  }
  ASSIGN_OR_RETURN(auto module, loadModuleIn(context, lib.image, lib.managedGlobals));
  if (module->program) {
    for (const GlobalInfo& g : module->program->globals()) {
      if (g.managed) lib.managedGlobals.emplace(g.name, g.address);
    }
  }
  module->library = lib.id;
  module->maxRegisters = lib.maxRegisters;
  lib.modules[context->id()] = module->id;
  return module;
}

Result<std::shared_ptr<Module>> Driver::libraryModule(CUlibrary handle) {
  ASSIGN_OR_RETURN(auto lib, library(handle));
  ASSIGN_OR_RETURN(auto context, current());
  return libraryModule(*lib, context);
}

Result<GlobalInfo> Driver::libraryManaged(CUlibrary handle, const char* name) {
  if (name == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "name is null");
  ASSIGN_OR_RETURN(auto lib, library(handle));
  ASSIGN_OR_RETURN(auto module, anyLibraryModule(*lib));
  if (!module->program)
    return cuErrorf(CUDA_ERROR_NO_BINARY_FOR_GPU, "managed variable '{}': {}", name,
                    module->noBinary);
  for (const GlobalInfo& g : module->program->globals()) {
    if (g.name == name && g.managed) return g;
  }
  return cuErrorf(CUDA_ERROR_NOT_FOUND, "library has no managed variable named '{}'", name);
}

Result<std::shared_ptr<Module>> Driver::anyLibraryModule(Library& lib) {
  std::shared_ptr<Context> context = currentOrNull();
  if (!context) {
    ASSIGN_OR_RETURN(context, loadingContext());
  }
  return libraryModule(lib, context);
}

Result<CUkernel> Driver::kernel(CUlibrary handle, const char* name) {
  if (name == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "kernel name is null");
  ASSIGN_OR_RETURN(auto lib, library(handle));
  ASSIGN_OR_RETURN(auto module, anyLibraryModule(*lib));
  if (!module->program) return cuErrorf(CUDA_ERROR_NO_BINARY_FOR_GPU, "kernel '{}': {}", name, module->noBinary);
  const auto& functions = module->program->functions();
  if (std::none_of(functions.begin(), functions.end(), [&](const FunctionInfo& f) { return f.name == name; })) {
    return cuErrorf(CUDA_ERROR_NOT_FOUND, "library has no kernel named '{}'", name);
  }
  std::lock_guard lock(lib->mutex);
  auto& id = lib->kernels[name];
  if (id == 0) {
    auto k = std::make_shared<Kernel>();
    k->id = newHandle(HandleKind::kKernel);
    k->library = lib;
    k->name = name;
    kernels_.add(k->id, k);
    id = k->id;
  }
  return reinterpret_cast<CUkernel>(id);
}

Result<std::vector<CUkernel>> Driver::kernels(CUlibrary handle) {
  ASSIGN_OR_RETURN(auto lib, library(handle));
  ASSIGN_OR_RETURN(auto module, anyLibraryModule(*lib));
  std::vector<CUkernel> out;
  if (!module->program) return out;  // nothing of it can run here: no kernels to list
  for (const FunctionInfo& f : module->program->functions()) {
    ASSIGN_OR_RETURN(CUkernel k, kernel(handle, f.name.c_str()));
    out.push_back(k);
  }
  return out;
}

Result<std::shared_ptr<Kernel>> Driver::kernel(CUkernel handle) const {
  auto k = handle == nullptr ? nullptr : kernels_.find(idOf(handle));
  if (!k) return cuErrorf(CUDA_ERROR_INVALID_HANDLE, "0x{:x} is not a kernel of a loaded library", idOf(handle));
  return k;
}

Result<std::shared_ptr<Function>> Driver::kernelFunctionIn(const Kernel& k, const std::shared_ptr<Context>& context) {
  auto lib = k.library.lock();
  if (!lib || !libraries_.find(lib->id)) return cuError(CUDA_ERROR_INVALID_HANDLE, "the kernel's library was unloaded");
  ASSIGN_OR_RETURN(auto module, libraryModule(*lib, context));
  ASSIGN_OR_RETURN(CUfunction f, function(reinterpret_cast<CUmodule>(module->id), k.name.c_str()));
  ASSIGN_OR_RETURN(auto fn, function(f));
  if (auto it = k.maxDynamicShared.find(context->device()); it != k.maxDynamicShared.end()) {
    fn->kernelMaxDynamicShared = it->second;
  }
  return fn;
}

Result<std::shared_ptr<Function>> Driver::kernelFunction(CUkernel handle, bool currentOnly) {
  ASSIGN_OR_RETURN(auto k, kernel(handle));
  std::shared_ptr<Context> context;
  if (currentOnly) {
    ASSIGN_OR_RETURN(context, current());
  } else {
    context = currentOrNull();
    if (!context) {
      ASSIGN_OR_RETURN(context, loadingContext());
    }
  }
  return kernelFunctionIn(*k, context);
}

Status Driver::setKernelMaxDynamicShared(CUkernel handle, int device, int value) {
  ASSIGN_OR_RETURN(auto k, kernel(handle));
  k->maxDynamicShared[device] = value;
  auto lib = k->library.lock();
  if (!lib) return Status::ok();
  std::vector<std::uint64_t> modules;
  {
    std::lock_guard lock(lib->mutex);
    for (const auto& [context, module] : lib->modules) modules.push_back(module);
  }
  for (std::uint64_t id : modules) {
    auto m = modules_.find(id);
    if (!m || m->device != device || !m->program) continue;
    auto f = function(reinterpret_cast<CUmodule>(id), k->name.c_str());
    if (f.isOk()) {
      if (auto fn = functions_.find(idOf(*f))) fn->kernelMaxDynamicShared = value;
    }
  }
  return Status::ok();
}

}  // namespace phos::vgpu
