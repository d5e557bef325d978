// SPDX-License-Identifier: Apache-2.0
// The checkpoint/restore engine of a phosd worker (engine.h): stop-the-world.
//
// Checkpoint: the session stops serving (its application's calls wait in the
// ring), every context is drained, and device memory, module images and
// module globals are copied into the image; CRIU then dumps the process, and
// while CRIU holds it frozen the shared-memory files (pinned memory, the ring,
// the host-call queue) are copied too. The manifest's state.gpu.sessions[0]
// describes everything a restore re-creates (docs/checkpoint.md).
//
// Restore, in a fresh worker: contexts from the pool, device memory mapped
// back at its addresses, modules loaded again from their images (globals
// rewritten), streams and events created again; every object re-bound to the
// virtual id the application holds. The shared-memory files are re-created at
// their paths before CRIU maps them.
#include "engine.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "host_calls.h"
#include "migration.h"
#include "module_globals.h"
#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "phos/daemon/checkpoint.h"
#include "on_demand_restore.h"
#include "peer_offload.h"
#include "session.h"
#include "soft_cow.h"
#include "soft_recopy.h"
#include "staging_buffer.h"

namespace phos::daemon {

using json = nlohmann::json;

namespace {

constexpr auto kPauseTimeout = std::chrono::seconds(60);

// The context limits an application can set (cuCtxSetLimit); the others can
// only be queried.
constexpr CUlimit kSettableLimits[] = {
    CU_LIMIT_STACK_SIZE,       CU_LIMIT_PRINTF_FIFO_SIZE,         CU_LIMIT_MALLOC_HEAP_SIZE,
    CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
    CU_LIMIT_MAX_L2_FETCH_GRANULARITY, CU_LIMIT_PERSISTING_L2_CACHE_SIZE};

std::string hex(uint64_t v) { return fmt::format("{:#x}", v); }

// This process's mappings that overlap [from, to), as /proc/self/maps lists
// them: what the driver had put where a module's globals were to go
// (docs/gpu.md: where NVIDIA's driver places modules).
std::string mappingsAround(uint64_t from, uint64_t to) {
  std::ifstream maps("/proc/self/maps");
  std::string line, out;
  int shown = 0;
  while (std::getline(maps, line) && shown < 12) {
    uint64_t start = 0, end = 0;
    const char* dash = std::strchr(line.c_str(), '-');
    if (dash == nullptr) continue;
    std::from_chars(line.data(), dash, start, 16);
    std::from_chars(dash + 1, line.data() + line.size(), end, 16);
    if (end <= from || start >= to) continue;
    out += (shown++ == 0 ? "" : ", ") + line.substr(0, line.find(' ', line.find(' ') + 1));
    if (const size_t path = line.find('/'); path != std::string::npos) out += " " + line.substr(path);
  }
  return out.empty() ? "none" : out;
}

// The driver entry points the engine calls beyond those phosd needs to run:
// a driver without one (older than CUDA 12.4) cannot checkpoint.
Status requireEntryPoints(const DriverTable& d) {
  using cuda_api::EntryPointId;
  static constexpr std::pair<EntryPointId, const char*> kNeeded[] = {
      {EntryPointId::kCuCtxGetFlags, "cuCtxGetFlags"},
      {EntryPointId::kCuCtxGetLimit, "cuCtxGetLimit"},
      {EntryPointId::kCuCtxSetLimit, "cuCtxSetLimit"},
      {EntryPointId::kCuCtxGetCacheConfig, "cuCtxGetCacheConfig"},
      {EntryPointId::kCuCtxSetCacheConfig, "cuCtxSetCacheConfig"},
      {EntryPointId::kCuFuncGetName, "cuFuncGetName"},
      {EntryPointId::kCuFuncGetModule, "cuFuncGetModule"},
      {EntryPointId::kCuKernelGetName, "cuKernelGetName"},
      {EntryPointId::kCuKernelGetLibrary, "cuKernelGetLibrary"},
      {EntryPointId::kCuLibraryGetModule, "cuLibraryGetModule"},
      {EntryPointId::kCuLibraryGetGlobal, "cuLibraryGetGlobal"},
      {EntryPointId::kCuLibraryGetKernel, "cuLibraryGetKernel"},
      {EntryPointId::kCuLibraryLoadData, "cuLibraryLoadData"},
      {EntryPointId::kCuStreamGetFlags, "cuStreamGetFlags"},
      {EntryPointId::kCuStreamGetPriority, "cuStreamGetPriority"},
      {EntryPointId::kCuStreamCreateWithPriority, "cuStreamCreateWithPriority"},
      {EntryPointId::kCuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync"},
      {EntryPointId::kCuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync"},
      {EntryPointId::kCuModuleGetGlobal_v2, "cuModuleGetGlobal"},
      {EntryPointId::kCuModuleGetFunction, "cuModuleGetFunction"},
      {EntryPointId::kCuCtxGetCurrent, "cuCtxGetCurrent"},
  };
  for (const auto& [id, name] : kNeeded) {
    if (!d.has(id)) {
      return makeError(Code::kNotSupported, "the driver {} has no {}, which checkpoints need", d.path(), name);
    }
  }
  return Status::ok();
}

// The codes the CLI tells apart (bad input, exit 2, or a failure, exit 1).
json failure(const Status& s) { return {{"ok", false}, {"error", s.message()}, {"code", wireCode(s.code())}}; }

// Copies between device memory and the image through two page-locked
// buffers: while the driver copies one chunk, the other is checksummed and
// written (or read and decompressed).
class ChunkCopier {
 public:
  ChunkCopier(const DriverTable& driver, size_t chunkBytes) : driver_(driver), chunkBytes_(chunkBytes) {}

  // Needs a context current (the buffers are registered portable).
  Status prepare() {
    for (int k = 0; k < 2; ++k) {
      staging_[k] = std::make_unique<StagingBuffer>(driver_, chunkBytes_);
      RETURN_IF_ERROR(staging_[k]->allocate());
      buffers_[k] = staging_[k]->data();
    }
    return Status::ok();
  }

  // Device -> image: `bytes` at `address` into blob `blob`, chunk by chunk.
  Status save(image::ImageWriter& writer, size_t blob, CUdeviceptr address, uint64_t bytes,
              const std::function<void(uint64_t)>& advanced) {
    const uint64_t chunks = (bytes + chunkBytes_ - 1) / chunkBytes_;
    auto length = [&](uint64_t i) { return std::min<uint64_t>(chunkBytes_, bytes - i * chunkBytes_); };
    auto issue = [&](uint64_t i) {
      return PHOS_DRIVER(driver_, MemcpyDtoHAsync_v2)(buffers_[i % 2], address + i * chunkBytes_, length(i), nullptr);
    };
    if (chunks == 0) return Status::ok();
    RETURN_IF_ERROR(driverStatus(issue(0), fmt::format("copying device memory at {}", hex(address))));
    for (uint64_t i = 0; i < chunks; ++i) {
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(driver_, CtxSynchronize)(), "waiting for a device copy"));
      if (i + 1 < chunks) {
        RETURN_IF_ERROR(driverStatus(issue(i + 1), fmt::format("copying device memory at {}", hex(address))));
      }
      RETURN_IF_ERROR(writer.writeChunk(blob, i, {buffers_[i % 2], length(i)}));
      advanced(length(i));
    }
    return Status::ok();
  }

  // Image -> device.
  Status load(const image::ImageReader& reader, size_t blob, CUdeviceptr address,
              const std::function<void(uint64_t)>& advanced) {
    const image::BlobInfo& info = reader.manifest().blobs[blob];
    if (info.chunkBytes > chunkBytes_) {
      return makeError(Code::kDataLoss, "blob {}: chunks of {} bytes, more than {}", info.name, info.chunkBytes,
                       chunkBytes_);
    }
    const uint64_t chunks = info.chunkCount();
    for (uint64_t i = 0; i < chunks; ++i) {
      std::byte* buf = buffers_[i % 2];
      const uint32_t n = info.chunkRawBytes(i);
      // The buffer is free again once the copy issued two chunks ago is done.
      if (i >= 2) RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(driver_, CtxSynchronize)(), "waiting for a device copy"));
      RETURN_IF_ERROR(reader.readChunk(blob, i, {buf, n}));
      RETURN_IF_ERROR(driverStatus(
          PHOS_DRIVER(driver_, MemcpyHtoDAsync_v2)(address + i * uint64_t{info.chunkBytes}, buf, n, nullptr),
          fmt::format("copying {} back to {}", info.name, hex(address))));
      advanced(n);
    }
    return driverStatus(PHOS_DRIVER(driver_, CtxSynchronize)(), "waiting for a device copy");
  }


 private:
  const DriverTable& driver_;
  size_t chunkBytes_;
  std::unique_ptr<StagingBuffer> staging_[2];
  std::byte* buffers_[2] = {};  // their memory
};

// Reports progress of one phase at most every 50 ms (and at its end).
class PhaseProgress {
 public:
  PhaseProgress(const ProgressFn& fn, std::string phase, uint64_t total)
      : fn_(fn), phase_(std::move(phase)), total_(total) {}
  void advance(uint64_t bytes) {
    done_ += bytes;
    auto now = std::chrono::steady_clock::now();
    if (fn_ && (done_ == total_ || now - last_ > std::chrono::milliseconds(50))) {
      last_ = now;
      fn_({{"phase", phase_}, {"bytes", done_}, {"total", total_}});
    }
  }
  void start() {
    if (fn_) fn_({{"phase", phase_}, {"bytes", 0}, {"total", total_}});
  }

 private:
  const ProgressFn& fn_;
  std::string phase_;
  uint64_t total_;
  uint64_t done_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

// Device memory copied into host memory first, at the copy engine's rate, so
// that the application waits only for that; background threads then checksum,
// compress and write the chunks while it runs on (with --leave-running) or
// while CRIU's images are committed.
class StagedWrite {
 public:
  struct Item {
    size_t blob;
    uint64_t offset;  // in the staging memory
    uint64_t bytes;
    uint64_t firstChunk = 0;  // the blob's chunk its first byte is (its bytes start at that chunk)
  };

  // Host memory of `bytes`, its pages faulted in now: done before the session
  // pauses, so the application does not wait for it. In slices: MAP_POPULATE
  // holds the process's mmap lock for the whole population (0.37 s for
  // 1.3 GiB here), and this worker's other threads, which serve the
  // application and run vgpu's kernels, could not map memory meanwhile: a
  // checkpoint of a job with 1 GiB of state held it 0.3 s before its pause.
  static Result<std::unique_ptr<StagedWrite>> reserve(const DriverTable& driver, uint64_t bytes) {
    auto staged = std::unique_ptr<StagedWrite>(new StagedWrite(driver));
    staged->bytes_ = std::max<uint64_t>(bytes, 1);
    void* p = mmap(nullptr, staged->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return errnoError(errno, fmt::format("cannot stage {} bytes of device memory", bytes));
    staged->data_ = static_cast<std::byte*>(p);
    constexpr uint64_t kSlice = 8u << 20;
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    for (uint64_t at = 0; at < staged->bytes_; at += kSlice) {
      const uint64_t n = std::min(kSlice, staged->bytes_ - at);
      if (madvise(staged->data_ + at, n, MADV_POPULATE_WRITE) == 0) continue;
      if (errno != EINVAL) {
        return errnoError(errno, fmt::format("cannot fault in {} bytes of host memory to stage device memory", bytes));
      }
      // A kernel before 5.14: one write per page.
      for (uint64_t b = 0; b < n; b += page) static_cast<volatile std::byte*>(staged->data_)[at + b] = std::byte{0};
    }
    return staged;
  }
  uint64_t capacity() const { return bytes_; }
  // Registers the memory with the driver (in the current context), so that
  // copies into it run at the copy engine's rate; unregistered, they still work.
  void registerMemory() {
    if (!registration_.registered()) registration_.add(data_, bytes_);
  }
  ~StagedWrite() {
    join();
    registration_.release();
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

  // The chunks of `items` are to be written into `writer` (once started).
  void plan(image::ImageWriter& writer, std::vector<Item> items) {
    writer_ = &writer;
    items_ = std::move(items);
    for (const Item& item : items_) {
      for (uint64_t at = 0; at < item.bytes; at += image::kDefaultChunkBytes) chunks_.push_back({&item, at});
      total_ += item.bytes;
    }
  }

  // Writes the planned chunks on a thread per core (at most 4); once.
  void start() {
    if (started_ || writer_ == nullptr) return;
    started_ = true;
    const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
    for (unsigned t = 0; t < threads; ++t) {
      workers_.emplace_back([this, &writer = *writer_] {
        for (size_t i = next_++; i < chunks_.size() && !failed_.load(); i = next_++) {
          const auto& [item, at] = chunks_[i];
          const uint64_t n = std::min<uint64_t>(image::kDefaultChunkBytes, item->bytes - at);
          Status st = writer.writeChunk(item->blob, item->firstChunk + at / image::kDefaultChunkBytes,
                                        {data_ + item->offset + at, n});
          if (!st.isOk()) {
            std::lock_guard lock(errorMutex_);
            if (error_.isOk()) error_ = st;
            failed_ = true;
          }
          written_ += n;
        }
      });
    }
  }

  // Stops the writing threads at their next chunk (the checkpoint failed).
  void abandon() {
    failed_ = true;
    join();
  }

  // Waits for the writing threads (started now if they were not); reports
  // {"phase": "write"} progress.
  Status finish(const ProgressFn& progress) {
    start();
    PhaseProgress phase(progress, "write", total_);
    phase.start();
    uint64_t reported = 0;
    while (!workers_.empty() && written_.load() < total_ && !failed_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const uint64_t now = written_.load();
      phase.advance(now - reported);
      reported = now;
    }
    join();
    phase.advance(written_.load() - reported);
    std::lock_guard lock(errorMutex_);
    return error_;
  }

 private:
  explicit StagedWrite(const DriverTable& driver) : driver_(driver) {}
  void join() {
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  const DriverTable& driver_;
  HostRegistration registration_{driver_};
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
  image::ImageWriter* writer_ = nullptr;
  bool started_ = false;
  std::vector<Item> items_;
  std::vector<std::pair<const Item*, uint64_t>> chunks_;
  uint64_t total_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<uint64_t> written_{0};
  std::atomic<bool> failed_{false};
  std::mutex errorMutex_;
  Status error_ = Status::ok();
  std::vector<std::thread> workers_;
};

// Host memory a checkpoint may use to stage device memory: half of what the
// kernel says is available.
uint64_t stagingBudget() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") return kib * 1024 / 2;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// A session file of the image is about to be re-created at its path: one left
// by a session that is gone is removed; while a live session holds the ring
// locked (CallRing::create), the checkpointed session still runs here. An
// empty `ringPath`: the caller holds the session's ring itself.
// The path comes from the manifest, which its writer controls: a file there
// that does not belong to `owner` (the restored session's uid) is another
// user's session file, and is never removed for this one.
Status claimPath(const std::string& path, const std::string& ringPath, pid_t process, uid_t owner) {
  if (path.rfind("/dev/shm/phos-", 0) != 0 || path.find("..") != std::string::npos) {
    return makeError(Code::kDataLoss, "the image names a session file outside /dev/shm/phos-*: {}", path);
  }
  auto inUse = [&](std::string why) {
    return makeError(Code::kFailedPrecondition,
                     "{} is in use ({}): the checkpointed session still runs on this host, or another restore of it "
                     "does",
                     path, why);
  };
  bool held = !ringPath.empty() && ringLocked(ringPath);
  if (held && !processEnded(process)) return inUse(fmt::format("a session holds its ring, and pid {} runs", process));
  // A session whose process just ended is still being freed by its worker for
  // a moment: wait for that.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (held && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    held = ringLocked(ringPath);
  }
  if (held) return inUse("a session holds its ring");
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0) return Status::ok();
  if (st.st_uid != owner && geteuid() == 0) {
    return makeError(Code::kPermissionDenied, "{} belongs to uid {}, not to uid {} whose session is restored", path,
                     st.st_uid, owner);
  }
  if (unlink(path.c_str()) != 0) return errnoError(errno, fmt::format("cannot remove the stale {}", path));
  return Status::ok();
}

// Whether `uid` may create entries in `dir` (its owner with write permission,
// or anyone with write permission for others; group membership is not
// looked up: a group-writable directory of another owner is refused).
Status writableBy(const std::filesystem::path& dir, uid_t uid) {
  struct stat st{};
  const std::filesystem::path where = dir.empty() ? std::filesystem::path(".") : dir;
  if (stat(where.c_str(), &st) != 0) return errnoError(errno, fmt::format("cannot use {}", where.string()));
  const bool owner = st.st_uid == uid && (st.st_mode & S_IWUSR) != 0;
  const bool anyone = (st.st_mode & S_IWOTH) != 0;  // /tmp
  if (owner || anyone) return Status::ok();
  return makeError(Code::kPermissionDenied, "uid {} may not write into {}", uid, where.string());
}

template <typename T>
Result<T> field(const json& object, const char* name, const std::string& where) {
  if (!object.is_object() || !object.contains(name)) {
    return makeError(Code::kDataLoss, "{}: \"{}\" is missing", where, name);
  }
  try {
    return object.at(name).get<T>();
  } catch (const json::exception&) {
    return makeError(Code::kDataLoss, "{}: \"{}\" has the wrong type", where, name);
  }
}

}  // namespace

// Function attributes a program may set (cuFuncSetAttribute,
// cuKernelSetAttribute), by the name an image stores them under. A checkpoint
// reads each back from the driver; a restore sets the ones that differ from a
// freshly loaded function's. (Cache configuration is a preference the driver
// gives no way to read, and does not change what a kernel computes.)
constexpr std::pair<const char*, CUfunction_attribute> kSettableFunctionAttributes[] = {
    {"max_dynamic_shared_size_bytes", CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES},
    {"preferred_shared_memory_carveout", CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT},
    {"required_cluster_width", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH},
    {"required_cluster_height", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT},
    {"required_cluster_depth", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH},
    {"non_portable_cluster_size_allowed", CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED},
    {"cluster_scheduling_policy_preference", CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE},
};

// `read(attribute, &value)` for every settable attribute, as an object of
// the ones the driver answers.
template <typename Read>
json settableAttributes(Read read) {
  json out = json::object();
  for (const auto& [name, attribute] : kSettableFunctionAttributes) {
    int value = 0;
    if (read(attribute, &value) == CUDA_SUCCESS) out[name] = value;
  }
  return out;
}

// Sets again, through `read` and `write`, every saved attribute whose value
// differs from the driver's now; fails naming the first it cannot set.
template <typename Read, typename Write>
Status restoreAttributes(const json& saved, std::string_view what, Read read, Write write) {
  for (const auto& [name, attribute] : kSettableFunctionAttributes) {
    if (!saved.contains(name) || !saved[name].is_number_integer()) continue;
    const int want = saved[name].template get<int>();
    int now = 0;
    if (read(attribute, &now) == CUDA_SUCCESS && now == want) continue;
    if (CUresult r = write(attribute, want); r != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition, "{}: attribute {} cannot be set to {} again (CUresult {})", what,
                       name, want, static_cast<int>(r));
    }
  }
  return Status::ok();
}

class Engine {
 public:
  // ---- checkpoint ----------------------------------------------------------
  static json checkpoint(Session& s, const json& request, const ProgressFn& progress) {
    if (!request.contains("image") || !request["image"].is_string() || request["image"].get<std::string>().empty()) {
      return failure(makeError(Code::kInvalidArgument, "checkpoint needs an \"image\" directory"));
    }
    if (Status usable = requireEntryPoints(s.driver_); !usable.isOk()) return failure(usable);
    checkpoint::CheckpointOptions options;
    options.image = request["image"].get<std::string>();
    // Live migration (migration.h): the image is phosd's own, in its runtime
    // directory, and goes to the target once published.
    std::unique_ptr<migration::Outgoing> outgoing;
    if (request.contains("migrate")) {
      auto connected = connectForMigration(request["migrate"]);
      if (!connected.isOk()) return failure(connected.status());
      outgoing = std::move(*connected);
    }
    // phosd may run as root for users who are not: the image goes only where
    // the asking user could write it.
    if (const uid_t peer = request.value("peer_uid", uid_t{0}); peer != 0 && !outgoing) {
      if (Status allowed = writableBy(options.image.parent_path(), peer); !allowed.isOk()) return failure(allowed);
      // ... and it is theirs: a user restores only image directories it owns.
      if (geteuid() == 0) options.owner = peer;
    }
    options.leaveRunning = request.value("leave_running", false);
    auto codec = image::parseCodec(request.value("compress", std::string("none")));
    if (!codec.isOk()) return failure(codec.status());
    options.codec = *codec;
    const std::string mode = request.contains("mode") && request["mode"].is_string() ? request["mode"].get<std::string>()
                                                                                     : "stop";
    if (mode != "cow" && mode != "stop" && mode != "recopy") {
      return failure(makeError(Code::kInvalidArgument,
                               "checkpoint mode must be \"cow\", \"recopy\" or \"stop\", not \"{}\"", mode));
    }
    // Copy-on-write lets the application run while its GPU state is saved;
    // a process that ends with the dump has nothing to run. Recopy copies
    // while it runs before the dump, so it serves both.
    if (outgoing) {
      if (mode == "cow") {
        return failure(makeError(Code::kInvalidArgument, "a migration copies with \"recopy\" or \"stop\", not \"cow\""));
      }
      options.leaveRunning = false;  // the job ends here once the target runs it
    }
    const bool cow = mode == "cow" && options.leaveRunning;
    bool recopy = mode == "recopy";
    // The protocols' streams outlive any context the job destroys meanwhile
    // (its end, a cuCtxDestroy): declared first, released last.
    ContextPool::Hold contextsKept(s.pool_);
    options.protocol = cow ? "soft-copy-on-write" : recopy ? "soft-recopy" : "stop-the-world";

    json state;
    uint64_t gpuBytes = 0;
    bool paused = false;
    const bool leaveRunning = options.leaveRunning;
    options.hooks.progress = progress;
    using Clock = std::chrono::steady_clock;
    Clock::time_point pausedAt{}, resumedAt{};
    // Where the job's GPU stall goes (the report's "stall"): asking the
    // session to park, the capture inside the pause, CRIU's freeze and dump,
    // and what follows until the session serves again. With the start of our
    // part (after CRIU's pre-dump), the end of the saving after the dump and
    // the request's start, the report's "timeline" places them in time.
    const Clock::time_point startedAt = Clock::now();
    Clock::time_point pauseAskedAt{}, capturedAt{}, dumpedAt{}, beforeDumpAt{}, savedAt{};
    std::unique_ptr<StagedWrite> staged;
    double copySeconds = 0;
    Status written = Status::ok();
    // Soft copy-on-write: the buffers of t1, saved after the dump.
    std::vector<SavedBuffer> deferred;
    const uint64_t cowReserve = request.value("cow_reserve_bytes", uint64_t{0});  // per device; 0: the default
    offload::Scheduler peerOffload = offload::Scheduler::kExact;
    if (request.contains("peer_offload")) {
      auto named = request["peer_offload"].is_string()
                       ? offload::parseScheduler(request["peer_offload"].get<std::string>())
                       : Result<offload::Scheduler>(makeError(Code::kInvalidArgument, "peer_offload must be a string"));
      if (!named.isOk()) return failure(named.status());
      peerOffload = *named;
    }
    LinkBandwidths links;
    image::ImageWriter* imageWriter = nullptr;
    json cowReport;
    // Soft recopy: the host copy of the buffers, kept fresh while the job runs.
    std::shared_ptr<SoftRecopy> recopier;
    json recopyReport;
    const ValidationMode validationBefore = s.validator_.mode();
    options.hooks.beforeDump = [&](image::ImageWriter&) -> Status {
      beforeDumpAt = Clock::now();
      listModuleGlobals(s);
      // The window validates every launch: its twins compiled now, while the
      // application runs, not by its first launches in the window.
      if (cow || recopy) s.prepareTwinModules();
      if (recopy) {
        Status copied = precopy(s, staged, recopier, progress, recopyReport, outgoing.get());
        if (copied.isOk() || copied.code() != Code::kResourceExhausted) return copied;
        // No host memory for a copy of the GPU state: stop-the-world, said in the report.
        log::get("daemon")->warn("session {}: {}; checkpointing stop-the-world", s.id(), copied.message());
        recopyReport = {{"fallback", copied.message()}};
        recopy = false;
        options.protocol = "stop-the-world";
      }
      // Host memory for the device memory's copy, prepared while the
      // application still runs (module globals may need a little more).
      if (const uint64_t expected = s.info().deviceBytes + (1u << 20); !cow && expected <= stagingBudget()) {
        if (auto reserved = StagedWrite::reserve(s.driver_, expected); reserved.isOk()) staged = std::move(*reserved);
      }
      // Several devices: their links, measured (once per worker) while the
      // application still runs.
      if (cow) {
        if (auto devices = sessionDevices(s); devices.size() > 1) {
          links = measureLinks(s.driver_, devices, image::kDefaultChunkBytes);
        }
      }
      return Status::ok();
    };
    // The cut (t1 of copy-on-write, t2 of recopy): CRIU has started and is
    // about to freeze the process; the job's GPU calls wait from here until
    // CRIU is done (or, for copy-on-write, until the copy's window opens).
    options.hooks.beforeFreeze = [&](image::ImageWriter& writer) -> Status {
      pauseAskedAt = Clock::now();
      RETURN_IF_ERROR(s.pause(kPauseTimeout));
      paused = true;
      pausedAt = Clock::now();
      imageWriter = &writer;
      std::lock_guard lock(s.mutex_);
      const char* snapshot = std::getenv("PHOS_TEST_REFERENCE_SNAPSHOT");
      const bool wantSnapshot = snapshot != nullptr && *snapshot != '\0';
      if (recopy) {
        RETURN_IF_ERROR(endRecopyWindow(s, *recopier, validationBefore, recopyReport));
        if (wantSnapshot) RETURN_IF_ERROR(writeReferenceSnapshot(s, allocationList(s), snapshot));
        RETURN_IF_ERROR(captureDevice(s, writer, state, gpuBytes, staged, copySeconds, progress, nullptr,
                                      recopier.get(), &recopyReport));
      } else {
        RETURN_IF_ERROR(captureDevice(s, writer, state, gpuBytes, staged, copySeconds, progress,
                                      cow ? &deferred : nullptr));
        if (cow && wantSnapshot) RETURN_IF_ERROR(writeReferenceSnapshot(s, deferred, snapshot));
      }
      // The staged chunks are written into the image while CRIU dumps when the
      // job ends with the dump; a job left running gets the CPU for CRIU's
      // freeze, and the writes start once it runs again (afterDump).
      if (staged != nullptr && !leaveRunning) staged->start();
      capturedAt = Clock::now();
      return Status::ok();
    };
    options.hooks.whileFrozen = [&](image::ImageWriter& writer) -> Status {
      std::lock_guard lock(s.mutex_);
      return captureShared(s, writer, state, gpuBytes, progress);
    };
    options.hooks.afterDump = [&](bool dumped) {
      dumpedAt = Clock::now();
      if (cow && dumped && paused) {
        written = saveConcurrently(s, *imageWriter, std::move(deferred), cowReserve, peerOffload, links, progress,
                                   cowReport, resumedAt);
        paused = false;
        copySeconds = cowReport.value("copy_seconds", 0.0);
        savedAt = Clock::now();
        return;
      }
      // Without --leave-running the process is gone after a good dump: its
      // calls are never served again (the worker frees the session).
      if (paused && (!dumped || leaveRunning)) {
        s.resume();
        resumedAt = Clock::now();
      }
      paused = paused && dumped && !leaveRunning;
      // The staged device memory reaches the image (the application may run
      // meanwhile); commit follows.
      if (staged != nullptr) {
        if (dumped) {
          written = staged->finish(progress);
        } else {
          staged->abandon();
        }
        staged.reset();
      }
      savedAt = Clock::now();
    };
    options.hooks.beforeCommit = [&] { return written; };
    // CRIU's end of the page relay (migration): our copy closes once CRIU has
    // exited, so that the relay sees the end of its pages.
    int criuPages = -1;
    bool leftStopped = false;  // the hand-over lost the target after "go"
    auto closeCriuPages = [&criuPages] {
      if (criuPages >= 0) ::close(criuPages);
      criuPages = -1;
    };
    if (outgoing) {
      auto relay = outgoing->openPageRelay();
      if (!relay.isOk()) return failure(relay.status());
      criuPages = options.pageServerSocket = *relay;
      // A stop-the-world migration restores eagerly on the target, as a copy
      // of an image would; after a recopy the job runs while memory loads.
      options.hooks.handOver = [&](const std::filesystem::path& image, bool& leaveStopped) -> Status {
        closeCriuPages();
        RETURN_IF_ERROR(outgoing->closePageRelay());
        Status handed = outgoing->handOver(image, /*eager=*/!recopy, leaveStopped);
        leftStopped = leaveStopped;
        return handed;
      };
    }
    options.hooks.gpuState = [&] { return json{{"sessions", json::array({state})}}; };

    auto report = checkpoint::checkpointProcess(s.pid(), options);
    closeCriuPages();
    if (paused && !report.isOk()) s.resume();  // a failure after the dump
    if (recopy && s.hasAccessGate() && s.pause(kPauseTimeout).isOk()) {
      // A failure before t2: the window closes without a copy.
      {
        std::lock_guard lock(s.mutex_);
        s.setAccessGate({});
        s.validator_.setMode(validationBefore);
        s.transfers_.track(false);
      }
      s.resume();
    }
    // (cowReport is null when the checkpoint failed before its copy began.)
    if (!report.isOk() && cow && cowReport.is_object() && cowReport.value("misspeculations", 0) > 0) {
      // A launch wrote outside its speculated buffers while the copy ran:
      // the image may hold bytes of after t1. As the paper does: discard it,
      // and checkpoint again stop-the-world.
      log::get("daemon")->warn("session {}: {}; checkpointing again stop-the-world", s.id(), written.message());
      json again = request;
      again["mode"] = "stop";
      json answer = checkpoint(s, again, progress);
      if (answer.value("ok", false)) {
        answer["report"]["fallback"] = written.message();
        answer["report"]["copy_on_write"] = cowReport;
        answer["report"]["requested_protocol"] = "soft-copy-on-write";
      }
      return answer;
    }
    if (outgoing) {
      // The image was only the vehicle (its memory pages went to the target's
      // page server); one left behind by a hand-over that lost the target
      // shows what was sent.
      (void)outgoing->closePageRelay();
      std::error_code ec;
      if (!leftStopped) std::filesystem::remove_all(options.image, ec);
      if (!report.isOk()) {
        outgoing->abort(report.status().message());
        return failure(report.status());
      }
    }
    if (!report.isOk()) return failure(report.status());
    // How long the application's GPU calls waited: from the pause to the
    // resume (--leave-running), or to the end of the dump that ended it.
    const double stall = pausedAt == Clock::time_point{}
                             ? 0.0
                             : std::chrono::duration<double>((resumedAt != Clock::time_point{} ? resumedAt : Clock::now()) -
                                                             pausedAt)
                                   .count();
    auto seconds = [](Clock::time_point from, Clock::time_point to) {
      if (from == Clock::time_point{} || to == Clock::time_point{}) return 0.0;
      return std::chrono::duration<double>(to - from).count();
    };
    // The parts of the stall, in order; with the job ended by the dump,
    // "after_dump" is not a stall (nothing of it is served again).
    json stallParts = {{"quiesce_seconds", seconds(pauseAskedAt, pausedAt)},
                       {"capture_seconds", seconds(pausedAt, capturedAt)},
                       {"criu_seconds", seconds(capturedAt, dumpedAt)},
                       {"after_dump_seconds", seconds(dumpedAt, resumedAt)}};
    // Seconds from the request's start to each boundary it reached, in order
    // (docs/checkpoint.md, "Where the time goes").
    json timeline = json::object();
    const std::pair<const char*, Clock::time_point> boundaries[] = {
        {"before_dump", beforeDumpAt}, {"pause_asked", pauseAskedAt}, {"paused", pausedAt}, {"captured", capturedAt},
        {"dumped", dumpedAt},          {"resumed", resumedAt},        {"saved", savedAt},   {"finished", Clock::now()}};
    for (const auto& [name, at] : boundaries) {
      if (at != Clock::time_point{}) timeline[name] = seconds(startedAt, at);
    }
    return {{"ok", true},
            {"report",
             {{"pid", report->pid},
              {"stall", stallParts},
              {"timeline", timeline},
              {"image", report->image.string()},
              {"cpu_bytes", report->cpuBytes},
              {"cpu_files", report->cpuFiles},
              {"gpu_bytes", gpuBytes},
              {"freeze_seconds", report->freezeSeconds},
              {"total_seconds", report->totalSeconds},
              {"left_running", leaveRunning},
              {"gpu_stall_seconds", stall},
              {"gpu_copy_seconds", copySeconds},
              {"protocol", options.protocol},
              {"copy_on_write", cowReport.is_null() ? json::object() : cowReport},
              {"recopy", recopyReport.is_null() ? json::object() : recopyReport},
              {"migration", outgoing ? migrationReport(*outgoing, pausedAt) : json::object()},
              {"session", s.id()}}}};
  }

  // The source's end of a migration: {"to": "HOST:PORT", "key": HEX}.
  static Result<std::unique_ptr<migration::Outgoing>> connectForMigration(const json& m) {
    if (!m.is_object() || !m.contains("to") || !m["to"].is_string() || !m.contains("key") || !m["key"].is_string()) {
      return makeError(Code::kInvalidArgument, "a migration needs \"to\" and \"key\"");
    }
    ASSIGN_OR_RETURN(net::Key key, net::Key::fromHex(m["key"].get<std::string>()));
    ASSIGN_OR_RETURN(auto outgoing, migration::Outgoing::connect(m["to"].get<std::string>(), key));
    outgoing->setCompression(m.value("compress", true));
    return outgoing;
  }

  // Downtime (docs/migration.md): from the final quiesce here to the first
  // call the target executed for the job.
  static json migrationReport(const migration::Outgoing& outgoing, std::chrono::steady_clock::time_point pausedAt) {
    json report = outgoing.stats();
    const json& target = outgoing.targetReport();
    report["target_report"] = target;
    if (pausedAt != std::chrono::steady_clock::time_point{}) {
      // The stopped job's image is written here (CRIU's dump and the device
      // memory) before the hand-over begins.
      report["dump_seconds"] = std::chrono::duration<double>(outgoing.handOverAt() - pausedAt).count();
    }
    if (pausedAt != std::chrono::steady_clock::time_point{} && target.contains("running_seconds")) {
      // Up to the first call the target served: the call the job was waiting
      // in at the quiesce may itself wait there for memory still arriving.
      const json load = target.value("concurrent_load", json::object());
      report["downtime_seconds"] = std::chrono::duration<double>(outgoing.goAt() - pausedAt).count() +
                                   target.value("running_seconds", 0.0) + load.value("first_call_seconds", 0.0);
    }
    return report;
  }

  // For tests of the concurrent protocols only (PHOS_TEST_REFERENCE_SNAPSHOT
  // in phosd's environment): the bytes of every buffer at the quiesce point,
  // read from the device while the session is paused, one file per buffer
  // named by its address (0x...). A copy-on-write image must hold exactly these.
  static Status writeReferenceSnapshot(Session& s, const std::vector<SavedBuffer>& buffers, const std::string& dir) {
    std::vector<std::byte> bytes;
    for (const SavedBuffer& b : buffers) {
      bytes.resize(b.bytes);
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(s.driver_, CtxSetCurrent)(b.context), "making a context current"));
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(s.driver_, MemcpyDtoH_v2)(bytes.data(), b.address, b.bytes),
                               "reading the reference snapshot"));
      std::ofstream out(std::filesystem::path(dir) / hex(b.address), std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      if (!out) return makeError(Code::kIo, "cannot write the reference snapshot into {}", dir);
    }
    PHOS_DRIVER(s.driver_, CtxSetCurrent)(nullptr);
    return Status::ok();
  }

  // The session's device allocations (not module globals). Its mutex is held.
  static std::vector<SavedBuffer> allocationList(Session& s) {
    std::vector<SavedBuffer> buffers;
    for (const auto& [address, a] : s.allocations_) {
      if (a.module != nullptr) continue;
      auto ctx = s.contexts_.find(a.context);
      if (ctx == s.contexts_.end() || ctx->second.real == nullptr) continue;
      buffers.push_back({0, address, a.bytes, ctx->second.real, ctx->second.device});
    }
    return buffers;
  }

  // The end of a protocol's window (the session paused, its mutex held): its
  // contexts drain (a context's sticky error is the application's to see),
  // and what its twins reported since the window opened. With validation off
  // after the window (`after`), the twins' report buffers are freed.
  static std::vector<Violation> closeWindow(Session& s, ValidationMode after) {
    for (const auto& [vid, ctx] : s.contexts_) {
      if (ctx.real == nullptr) continue;
      PHOS_DRIVER(s.driver_, CtxSetCurrent)(ctx.real);
      PHOS_DRIVER(s.driver_, CtxSynchronize)();
    }
    s.currentReal_ = nullptr;
    std::vector<Violation> found = s.validator_.collect();
    if (after == ValidationMode::kOff) s.validator_.releaseReports();
    return found;
  }

  // Waits for everything the session's contexts run. Its mutex is held.
  static Status drainContexts(Session& s) {
    for (const auto& [vid, ctx] : s.contexts_) {
      if (ctx.real == nullptr) continue;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(s.driver_, CtxSetCurrent)(ctx.real), "making a context current"));
      if (CUresult r = PHOS_DRIVER(s.driver_, CtxSynchronize)(); r != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition,
                         "context {} of the session failed (CUresult {}): its memory cannot be trusted", hex(vid),
                         static_cast<int>(r));
      }
    }
    s.currentReal_ = nullptr;
    return Status::ok();
  }

  // Soft recopy before t2, while the job runs: the dirty-tracking gate goes in
  // and its launches run as twins; the first round copies every allocation
  // into host memory, and each further round the chunks written since, while
  // that set shrinks (at most kRecopyRounds). kResourceExhausted: no host
  // memory for the copy (nothing was changed).
  static constexpr int kRecopyRounds = 8;
  static Status precopy(Session& s, std::unique_ptr<StagedWrite>& staged, std::shared_ptr<SoftRecopy>& recopier,
                        const ProgressFn& progress, json& report, migration::Outgoing* outgoing) {
    const DriverTable& d = s.driver_;
    std::vector<SavedBuffer> buffers;
    uint64_t total = 0;
    {
      std::lock_guard lock(s.mutex_);
      buffers = allocationList(s);
    }
    for (const SavedBuffer& b : buffers) total += b.bytes;
    // Room for buffers allocated before t2 and module globals as well.
    const uint64_t reserve = total + total / 4 + (64u << 20);
    if (reserve > stagingBudget()) {
      return makeError(Code::kResourceExhausted,
                       "soft recopy keeps a copy of the GPU memory in host memory: {} bytes needed, {} available",
                       reserve, stagingBudget());
    }
    ASSIGN_OR_RETURN(staged, StagedWrite::reserve(d, reserve));
    if (!buffers.empty()) {
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(buffers.front().context), "making a context current"));
      staged->registerMemory();
      PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
    }
    recopier = std::make_shared<SoftRecopy>(d, buffers, staged->data(), staged->capacity(), image::kDefaultChunkBytes);
    RETURN_IF_ERROR(recopier->prepare());
    PhaseProgress phase(progress, "gpu-precopy", total);
    phase.start();
    uint64_t previous = UINT64_MAX;
    for (int round = 0; round < kRecopyRounds; ++round) {
      const uint64_t dirty = recopier->dirtyChunks();
      if (round > 0 && (dirty == 0 || dirty >= previous)) break;
      previous = dirty;
      // A write that passed the gate before its chunk is taken must have run
      // before the chunk is copied: the session's work drains first.
      RETURN_IF_ERROR(s.pause(kPauseTimeout));
      std::vector<uint64_t> taken;
      Status drained;
      {
        std::lock_guard lock(s.mutex_);
        drained = drainContexts(s);
        if (drained.isOk() && round == 0) {
          s.setAccessGate([recopier, gate = recopier->gate()](const CallAccess& access) { gate(access); });
          s.validator_.setMode(ValidationMode::kValidate);
          recopier->giveWayTo(&s.transfers_);
          s.transfers_.track(true);
          // The job ran between the list above and the gate: what it freed
          // meanwhile passed no gate of ours, and its chunks may be unmapped
          // now (or another allocation's, of another size): they are not
          // copied. An allocation made meanwhile is one made in the window.
          const std::vector<SavedBuffer> now = allocationList(s);
          const AccessGate ended = recopier->gate();
          for (const SavedBuffer& b : buffers) {
            if (std::none_of(now.begin(), now.end(),
                             [&](const SavedBuffer& n) { return n.address == b.address && n.bytes == b.bytes; })) {
              ended({.writes = {{b.address, b.bytes}}, .ends = true});
            }
          }
        }
        if (drained.isOk()) taken = recopier->takeDirty();
      }
      s.resume();
      RETURN_IF_ERROR(drained);
      RETURN_IF_ERROR(recopier->copy(taken, [&](uint64_t n) { phase.advance(n); }));
      // A migration streams each round to the target while the job runs.
      if (outgoing == nullptr) continue;
      for (uint64_t index : taken) {
        const SoftRecopy::Chunk c = recopier->chunk(index);
        if (c.gone) continue;
        RETURN_IF_ERROR(outgoing->precopyChunk(c.address, {staged->data() + c.offset, c.bytes}));
      }
    }
    const SoftRecopyStats stats = recopier->stats();
    report = {{"rounds", stats.roundChunks.size()}, {"round_chunks", stats.roundChunks},
              {"precopy_seconds", stats.precopySeconds}, {"yielded_seconds", stats.yieldedSeconds}};
    return Status::ok();
  }

  // t2 (the session paused, its mutex held): its work drains, the twins'
  // reports are read and the gate goes. A write outside the speculated
  // buffers may have left a chunk clean that is not: then every chunk is
  // copied again.
  static Status endRecopyWindow(Session& s, SoftRecopy& recopier, ValidationMode before, json& report) {
    RETURN_IF_ERROR(drainContexts(s));
    const std::vector<Violation> found = s.validator_.collect();
    if (before == ValidationMode::kOff) s.validator_.releaseReports();
    s.setAccessGate({});
    s.validator_.setMode(before);
    s.transfers_.track(false);
    if (!found.empty()) {
      log::get("daemon")->warn("session {}: {} access(es) outside the speculated buffers while copying (first: kernel "
                               "{} at {}); every chunk is copied again",
                               s.id(), found.size(), found.front().kernel, hex(found.front().address));
      recopier.markAllDirty();
    }
    const SoftRecopyStats stats = recopier.stats();
    report["misspeculations"] = found.size();
    report["anything_calls"] = stats.anythingCalls;
    report["dirty_chunks_at_quiesce"] = recopier.dirtyChunks();
    return Status::ok();
  }

  // One context of the session per device it uses, by device.
  static std::vector<std::pair<int, CUcontext>> sessionDevices(Session& s) {
    std::lock_guard lock(s.mutex_);
    std::map<int, CUcontext> found;
    for (const auto& [vid, ctx] : s.contexts_) {
      if (ctx.real != nullptr) found.try_emplace(ctx.device, ctx.real);
    }
    return {found.begin(), found.end()};
  }

  // Every device of the session with its buffers to save and its shadow
  // reserve: `reserve` bytes, or half of the device's free memory (at least
  // one chunk where there is room for one). The session is paused.
  static std::vector<DeviceSpace> shadowSpaces(Session& s, const std::vector<SavedBuffer>& buffers, uint64_t reserve) {
    std::vector<DeviceSpace> spaces;
    for (const auto& [device, context] : sessionDevices(s)) {
      DeviceSpace space{device, context, 0, reserve};
      for (const SavedBuffer& b : buffers) {
        if (b.device == device) space.checkpointBytes += b.bytes;
      }
      if (reserve == 0) {
        size_t free = 0, total = 0;
        if (PHOS_DRIVER(s.driver_, CtxSetCurrent)(context) == CUDA_SUCCESS) {
          PHOS_DRIVER(s.driver_, MemGetInfo_v2)(&free, &total);
        }
        space.reserveBytes = std::max<uint64_t>(free / 2, std::min<uint64_t>(image::kDefaultChunkBytes, free));
      }
      spaces.push_back(space);
    }
    PHOS_DRIVER(s.driver_, CtxSetCurrent)(nullptr);
    return spaces;
  }

  // Soft copy-on-write after the dump: the session serves again with the
  // copy-on-write gate and its launches run as validator twins while every
  // buffer of t1 is saved; then the twins' reports are read. A launch that
  // wrote outside its speculated buffers fails it (report["misspeculations"]):
  // the image cannot be trusted. With several devices, shadows that do not fit
  // in a device's reserve go to peers as `peerOffload` plans over `links`.
  static Status saveConcurrently(Session& s, image::ImageWriter& writer, std::vector<SavedBuffer> buffers,
                                 uint64_t reserve, offload::Scheduler peerOffload, const LinkBandwidths& links,
                                 const ProgressFn& progress, json& report,
                                 std::chrono::steady_clock::time_point& resumedAt) {
    uint64_t total = 0;
    for (const SavedBuffer& b : buffers) total += b.bytes;
    const std::vector<DeviceSpace> spaces = shadowSpaces(s, buffers, reserve);
    PeerShadowPlan plan;
    if (spaces.size() > 1) {
      auto planned = planPeerShadows(spaces, links, peerOffload, image::kDefaultChunkBytes);
      if (planned.isOk()) {
        plan = std::move(*planned);
      } else {
        // Without a plan the checkpoint is still right: no peer shadows.
        log::get("daemon")->warn("session {}: no peer offload: {}", s.id(), planned.status().message());
        plan.report = {{"error", planned.status().message()}};
      }
    }
    auto protocol = std::make_shared<SoftCopyOnWrite>(s.driver_, writer, std::move(buffers), spaces, plan.quota,
                                                      image::kDefaultChunkBytes);
    const ValidationMode before = s.validator_.mode();
    Status status = protocol->prepare();
    if (status.isOk()) {
      // The gate keeps the protocol alive: should the window fail to close
      // below, it stays installed (every chunk is saved, so it passes all).
      s.setAccessGate([protocol, gate = protocol->gate()](const CallAccess& access) { gate(access); });
      s.setMemoryRelief([protocol](int device) { protocol->giveBack(device); });
      s.validator_.setMode(ValidationMode::kValidate);
      protocol->giveWayTo(&s.transfers_);
      s.transfers_.track(true);
    }
    s.resume();  // the application runs from here on
    resumedAt = std::chrono::steady_clock::now();
    if (status.isOk()) {
      PhaseProgress phase(progress, "gpu-memory", total);
      phase.start();
      status = protocol->run([&](uint64_t n) { phase.advance(n); });
    }
    // The window ends: the twins' reports of everything launched in it.
    std::vector<Violation> found;
    if (Status paused = s.pause(kPauseTimeout); paused.isOk()) {
      {
        std::lock_guard lock(s.mutex_);
        found = closeWindow(s, before);
        s.setAccessGate({});
        s.setMemoryRelief({});
        s.validator_.setMode(before);
        s.transfers_.track(false);
      }
      s.resume();
    } else if (status.isOk()) {
      log::get("daemon")->warn("session {}: copy-on-write window not closed: {}", s.id(), paused.message());
      status = makeError(Code::kFailedPrecondition, "the window could not be closed to read the validator's reports: {}",
                         paused.message());
    }
    const SoftCowStats stats = protocol->stats();
    uint64_t reserveBytes = 0;
    for (const DeviceSpace& space : spaces) reserveBytes += space.reserveBytes;
    report = {{"shadowed_chunks", stats.shadowedChunks}, {"shadowed_bytes", stats.shadowedBytes},
              {"reserve_bytes", reserveBytes},              {"peak_reserve_bytes", stats.peakReserveBytes},
              {"peer_shadowed_chunks", stats.peerShadowedChunks},
              {"peer_shadowed_bytes", stats.peerShadowedBytes},
              {"waited_calls", stats.waitedCalls},          {"waited_seconds", stats.waitedSeconds},
              {"given_back", stats.givenBack},              {"anything_calls", stats.anythingCalls},
              {"copy_seconds", stats.copySeconds},
              {"yielded_seconds", stats.yieldedSeconds},    {"misspeculations", found.size()}};
    if (!plan.report.is_null()) report["peer_offload"] = plan.report;
    if (status.isOk() && !found.empty()) {
      return makeError(Code::kFailedPrecondition, "{} access(es) outside the speculated buffers while copying (first: kernel {} "
                       "at {})", found.size(), found.front().kernel, hex(found.front().address));
    }
    return status;
  }

  // Lists the variables of every module that has no list yet
  // (ModuleRecord::globalNames), while the application runs: parsing a
  // large module's PTX took most of CuPy's pause (docs/checkpoint.md). The
  // images are copied under the session's mutex and parsed without it; a
  // module that cannot be read is left for captureDevice to refuse.
  static void listModuleGlobals(Session& s) {
    std::vector<std::pair<uint64_t, std::vector<char>>> unlisted;
    {
      std::lock_guard lock(s.mutex_);
      for (const auto& [id, rec] : s.moduleRecords_) {
        if (rec.globalNames == nullptr) unlisted.emplace_back(id, rec.image);
      }
    }
    for (auto& [id, image] : unlisted) {
      auto names = moduleGlobalNames(image);
      if (!names.isOk()) continue;
      auto listed = std::make_shared<const std::vector<std::string>>(std::move(*names));
      std::lock_guard lock(s.mutex_);
      // The same module still: ids are never reused.
      if (auto rec = s.moduleRecords_.find(id); rec != s.moduleRecords_.end()) rec->second.globalNames = listed;
    }
  }

  // Device memory, modules, globals and the description of every object.
  // The session is paused and its mutex held.
  // With `deferred`, nothing is copied: the buffers to save go there.
  // With `recopier`, chunks it holds clean in `staged` are not copied again;
  // `recopyReport` gets what was copied and what was reused.
  static Status captureDevice(Session& s, image::ImageWriter& writer, json& state, uint64_t& gpuBytes,
                              std::unique_ptr<StagedWrite>& staged, double& copySeconds,
                              const ProgressFn& progress, std::vector<SavedBuffer>* deferred,
                              const SoftRecopy* recopier = nullptr, json* recopyReport = nullptr) {
    const DriverTable& d = s.driver_;
    state = {{"session", s.id_},   {"pid", s.pid_},     {"uid", s.uid_},
             {"driver", d.path()}, {"worker_pid", getpid()}, {"handles_last_serial", s.handles_.lastSerial()}};
    // Drain every context: nothing may write device memory while it is copied.
    json contexts = json::array();
    for (const auto& [vid, ctx] : s.contexts_) {
      if (ctx.real == nullptr) continue;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(ctx.real), "making a context current"));
      CUresult r = PHOS_DRIVER(d, CtxSynchronize)();
      if (r != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition,
                         "context {} of the session failed (CUresult {}): its memory cannot be trusted", hex(vid),
                         static_cast<int>(r));
      }
      unsigned flags = 0;
      PHOS_DRIVER(d, CtxGetFlags)(&flags);
      // Limits and cache preference the application may have set.
      json limits = json::object();
      for (CUlimit limit : kSettableLimits) {
        size_t value = 0;
        if (PHOS_DRIVER(d, CtxGetLimit)(&value, limit) == CUDA_SUCCESS) limits[std::to_string(limit)] = value;
      }
      CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;
      PHOS_DRIVER(d, CtxGetCacheConfig)(&cache);
      contexts.push_back({{"id", vid}, {"device", ctx.device}, {"primary", ctx.primary}, {"flags", flags},
                          {"limits", limits}, {"cache_config", static_cast<int>(cache)}});
    }
    s.currentReal_ = nullptr;  // changed above; the next call makes its own current
    state["contexts"] = contexts;
    json primaries = json::array();
    for (const auto& [device, p] : s.primaries_) {
      primaries.push_back({{"device", device}, {"id", p.id}, {"refs", p.refs}, {"flags", p.flags}});
    }
    state["primaries"] = primaries;
    state["destroyed_contexts"] = s.destroyedContexts_;
    json heaps = json::array();
    for (const auto& [device, heap] : s.heaps_) heaps.push_back({{"device", device}, {"base", heap->base()}});
    state["heaps"] = heaps;
    // The stream-ordered allocator: frees in flight finish first, so the
    // image holds what the application still holds; then its pools.
    s.memoryPools_.reap(s, true);
    json pools = json::array();
    for (const auto& [id, p] : s.memoryPools_.pools()) {
      pools.push_back({{"id", id}, {"device", p->device}, {"default", p->isDefault}, {"destroyed", p->destroyed},
                       {"max_size", p->maxSize}, {"release_threshold", p->releaseThreshold},
                       {"reuse_follow_event_dependencies", p->followEventDependencies},
                       {"reuse_allow_opportunistic", p->allowOpportunistic},
                       {"reuse_allow_internal_dependencies", p->allowInternalDependencies},
                       {"used_high", p->usedHigh}, {"reserved_high", p->reservedHigh}});
    }
    state["memory_pools"] = pools;
    json currentPools = json::array();
    for (const auto& [device, pool] : s.memoryPools_.currentPools()) {
      currentPools.push_back({{"device", device}, {"pool", pool}});
    }
    state["current_memory_pools"] = currentPools;

    auto contextOnDevice = [&](int device) -> CUcontext {
      for (const auto& [vid, ctx] : s.contexts_) {
        if (ctx.real != nullptr && ctx.device == device) return ctx.real;
      }
      return nullptr;
    };

    // What is copied: allocations, then module globals.
    struct Copy {
      size_t blob;
      CUdeviceptr address;
      uint64_t bytes;
      int device;
    };
    std::vector<Copy> copies;
    json allocations = json::array();
    for (const auto& [address, a] : s.allocations_) {
      if (a.module != nullptr) continue;
      std::string name = fmt::format("gpu/{}/{}", a.device, hex(address));
      ASSIGN_OR_RETURN(size_t blob, writer.addBlob(name, "gpu-memory", a.bytes,
                                                   {{"device", a.device}, {"address", address}, {"context", a.context}}));
      copies.push_back({blob, address, a.bytes, a.device});
      allocations.push_back({{"address", address}, {"bytes", a.bytes}, {"device", a.device}, {"context", a.context},
                             {"pool", a.pool}, {"blob", name}, {"order", a.order}});
    }
    state["allocations"] = allocations;

    // Modules and libraries, in creation order, with their images and globals.
    json modules = json::array();
    std::vector<std::pair<uint64_t, const ModuleRecord*>> records;
    for (const auto& [id, rec] : s.moduleRecords_) records.emplace_back(id, &rec);
    std::sort(records.begin(), records.end(),
              [](const auto& a, const auto& b) { return HandleTable::serialOf(a.first) < HandleTable::serialOf(b.first); });
    for (const auto& [id, rec] : records) {
      const HandleType type = rec->library ? HandleType::kCUlib_st : HandleType::kCUmod_st;
      void* real = s.handles_.resolve(type, id);
      if (real == nullptr) continue;
      std::string name = fmt::format("module/{}", hex(id));
      ASSIGN_OR_RETURN(size_t imageBlob, writer.addBlob(name, "module-image", rec->image.size(),
                                                        {{"module", id}, {"library", rec->library}}));
      RETURN_IF_ERROR(writer.writeBlob(imageBlob, std::as_bytes(std::span(rec->image))));
      int device = 0;
      if (auto ctx = s.contexts_.find(rec->context); ctx != s.contexts_.end()) device = ctx->second.device;
      json globals = json::array();
      json entry = {{"id", id},
                    {"library", rec->library},
                    {"context", rec->context},
                    {"image", name},
                    {"order", rec->order}};
      // Every global of every kind of image (PTX, fatbin, cubin), in every
      // context that has its own copy: a module's, or, for a library
      // (context-independent), each context of the session's.
      std::shared_ptr<const std::vector<std::string>> names = rec->globalNames;
      if (names == nullptr) {  // loaded since listModuleGlobals ran
        auto listed = moduleGlobalNames(rec->image);
        if (!listed.isOk()) {
          return makeError(Code::kNotSupported,
                           "the globals of module {} cannot be listed, so they cannot be saved: {}", hex(id),
                           listed.status().message());
        }
        names = std::make_shared<const std::vector<std::string>>(std::move(*listed));
      }
      std::vector<uint64_t> holders;
      if (rec->library) {
        for (const auto& [cid, ctx] : s.contexts_) holders.push_back(cid);
      } else {
        holders.push_back(rec->context);
      }
      for (uint64_t holder : holders) {
        auto ctx = s.contexts_.find(holder);
        if (ctx == s.contexts_.end()) continue;
        PHOS_DRIVER(d, CtxSetCurrent)(ctx->second.real);
        for (const std::string& g : *names) {
          CUdeviceptr address = 0;
          size_t bytes = 0;
          CUresult r = rec->library
                           ? PHOS_DRIVER(d, LibraryGetGlobal)(&address, &bytes, static_cast<CUlibrary>(real), g.c_str())
                           : PHOS_DRIVER(d, ModuleGetGlobal_v2)(&address, &bytes, static_cast<CUmodule>(real), g.c_str());
          if (r == CUDA_ERROR_NO_BINARY_FOR_GPU) break;  // no code for this device: nothing runs, nothing to save
          if (r != CUDA_SUCCESS) {
            return makeError(Code::kNotSupported, "global {} of module {} cannot be read (CUresult {})", g, hex(id),
                             static_cast<int>(r));
          }
          if (bytes == 0) continue;
          const Allocation* taken = s.findAllocation(address);
          std::string blobName = fmt::format("global/{}/{}/{}", hex(id), hex(holder), g);
          ASSIGN_OR_RETURN(size_t blob, writer.addBlob(blobName, "module-global", bytes,
                                                       {{"module", id}, {"name", g}, {"address", address}}));
          copies.push_back({blob, address, bytes, ctx->second.device});
          globals.push_back({{"name", g},
                             {"context", holder},
                             {"address", address},
                             {"bytes", bytes},
                             {"blob", blobName},
                             {"taken", taken != nullptr && taken->address == address}});
        }
      }
      entry["globals_enumerated"] = true;
      entry["globals"] = globals;
      entry["device"] = device;
      modules.push_back(entry);
    }
    state["modules"] = modules;

    // Functions, kernels, library modules, streams and events: how to make
    // each again, by the id the application holds.
    json functions = json::array(), kernels = json::array(), libraryModules = json::array();
    json lost = json::array();
    auto libraryOfModule = [&](CUmodule m) -> uint64_t {
      for (const auto& [id, rec] : records) {
        if (!rec->library) continue;
        auto* lib = static_cast<CUlibrary>(s.handles_.resolve(HandleType::kCUlib_st, id));
        CUmodule lm = nullptr;
        if (lib != nullptr && PHOS_DRIVER(d, LibraryGetModule)(&lm, lib) == CUDA_SUCCESS && lm == m) return id;
      }
      return 0;
    };
    for (uint64_t id : s.handles_.ids(HandleType::kCUmod_st)) {
      if (s.moduleRecords_.count(id) != 0) continue;
      auto* m = static_cast<CUmodule>(s.handles_.resolve(HandleType::kCUmod_st, id));
      if (auto ctx = s.contexts_.find(s.contextOf(id)); ctx != s.contexts_.end()) {
        PHOS_DRIVER(d, CtxSetCurrent)(ctx->second.real);
      }
      if (uint64_t lib = libraryOfModule(m); lib != 0) {
        libraryModules.push_back({{"id", id}, {"library", lib}, {"context", s.contextOf(id)}});
      } else {
        lost.push_back({{"id", id}, {"what", "a module phosd did not load itself"}});
      }
    }
    for (uint64_t id : s.handles_.ids(HandleType::kCUfunc_st)) {
      auto* f = static_cast<CUfunction>(s.handles_.resolve(HandleType::kCUfunc_st, id));
      const char* fname = nullptr;
      CUmodule m = nullptr;
      if (PHOS_DRIVER(d, FuncGetName)(&fname, f) != CUDA_SUCCESS || PHOS_DRIVER(d, FuncGetModule)(&m, f) != CUDA_SUCCESS) {
        lost.push_back({{"id", id}, {"what", "a function the driver cannot name"}});
        continue;
      }
      json entry = {{"id", id}, {"name", fname}, {"context", s.contextOf(id)}};
      if (uint64_t mid = s.handles_.idOf(m); mid != 0 && HandleTable::typeOf(mid) == HandleType::kCUmod_st) {
        entry["module"] = mid;
      } else if (uint64_t lib = libraryOfModule(m); lib != 0) {
        entry["library"] = lib;  // cuKernelGetFunction: the library's module in this context
      } else {
        lost.push_back({{"id", id}, {"what", fmt::format("function {} of a module phosd did not load", fname)}});
        continue;
      }
      json attributes = settableAttributes(
          [&](CUfunction_attribute a, int* v) { return PHOS_DRIVER(d, FuncGetAttribute)(v, a, f); });
      if (!attributes.empty()) entry["attributes"] = attributes;
      functions.push_back(entry);
    }
    for (uint64_t id : s.handles_.ids(HandleType::kCUkern_st)) {
      auto* k = static_cast<CUkernel>(s.handles_.resolve(HandleType::kCUkern_st, id));
      const char* kname = nullptr;
      CUlibrary lib = nullptr;
      if (PHOS_DRIVER(d, KernelGetName)(&kname, k) != CUDA_SUCCESS ||
          PHOS_DRIVER(d, KernelGetLibrary)(&lib, k) != CUDA_SUCCESS) {
        lost.push_back({{"id", id}, {"what", "a kernel the driver cannot name"}});
        continue;
      }
      // Per device: cuKernelSetAttribute applies to the kernel's functions in
      // every context of one device.
      json perDevice = json::object();
      for (int dev = 0; dev < s.pool_.deviceCount(); ++dev) {
        json attributes = settableAttributes(
            [&](CUfunction_attribute a, int* v) { return PHOS_DRIVER(d, KernelGetAttribute)(v, a, k, dev); });
        if (!attributes.empty()) perDevice[std::to_string(dev)] = attributes;
      }
      // The kernel's function in a context where the program set attributes
      // of its own (cuFuncSetAttribute on the kernel's handle): those that
      // differ from the kernel's on that device. They override the kernel's,
      // whenever the program set them (cuKernelSetAttribute's documentation).
      json ownFunctions = json::array();
      if (auto used = s.kernelFunctions_.find(id); used != s.kernelFunctions_.end()) {
        for (uint64_t context : used->second) {
          auto ctx = s.contexts_.find(context);
          CUfunction f = nullptr;
          if (ctx == s.contexts_.end() || PHOS_DRIVER(d, CtxSetCurrent)(ctx->second.real) != CUDA_SUCCESS ||
              PHOS_DRIVER(d, KernelGetFunction)(&f, k) != CUDA_SUCCESS) {
            continue;
          }
          const json kernelLevel = perDevice.value(std::to_string(ctx->second.device), json::object());
          const json now = settableAttributes(
              [&](CUfunction_attribute a, int* v) { return PHOS_DRIVER(d, FuncGetAttribute)(v, a, f); });
          json own = json::object();
          for (const auto& [name, value] : now.items()) {
            if (kernelLevel.value(name, json()) != value) own[name] = value;
          }
          if (!own.empty()) ownFunctions.push_back({{"context", context}, {"attributes", own}});
        }
      }
      json entry = {{"id", id}, {"library", s.handles_.idOf(lib)}, {"name", kname}, {"attributes", perDevice}};
      if (!ownFunctions.empty()) entry["functions"] = ownFunctions;
      kernels.push_back(entry);
    }
    json streams = json::array();
    for (uint64_t id : s.handles_.ids(HandleType::kCUstream_st)) {
      auto* st = static_cast<CUstream>(s.handles_.resolve(HandleType::kCUstream_st, id));
      unsigned flags = 0;
      int priority = 0;
      PHOS_DRIVER(d, StreamGetFlags)(st, &flags);
      PHOS_DRIVER(d, StreamGetPriority)(st, &priority);
      streams.push_back({{"id", id}, {"context", s.contextOf(id)}, {"flags", flags}, {"priority", priority}});
    }
    // Events: flags, and for one recorded (all work has drained: it has
    // completed) when, as milliseconds before a mark recorded now in its
    // context, so that a restore can answer cuEventElapsedTime between it and
    // any other event (docs/checkpoint.md).
    json events = json::array();
    std::map<uint64_t, CUevent> marks;  // by context
    auto markOf = [&](uint64_t context) -> CUevent {
      auto it = marks.find(context);
      if (it != marks.end()) return it->second;
      CUevent mark = nullptr;
      auto ctx = s.contexts_.find(context);
      if (ctx == s.contexts_.end() || ctx->second.real == nullptr ||
          PHOS_DRIVER(d, CtxSetCurrent)(ctx->second.real) != CUDA_SUCCESS ||
          PHOS_DRIVER(d, EventCreate)(&mark, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
        return marks[context] = nullptr;
      }
      if (PHOS_DRIVER(d, EventRecord)(mark, nullptr) != CUDA_SUCCESS ||
          PHOS_DRIVER(d, EventSynchronize)(mark) != CUDA_SUCCESS) {
        PHOS_DRIVER(d, EventDestroy_v2)(mark);
        mark = nullptr;
      }
      return marks[context] = mark;
    };
    for (uint64_t id : s.handles_.ids(HandleType::kCUevent_st)) {
      const EventState* e = s.findEvent(id);
      const uint64_t context = s.contextOf(id);
      json entry = {{"id", id}, {"context", context}, {"flags", e != nullptr ? e->flags : 0u},
                    {"recorded", e != nullptr && e->recorded}};
      if (e != nullptr && e->recorded && (e->flags & CU_EVENT_DISABLE_TIMING) == 0) {
        CUevent mark = markOf(context);
        float before = 0;
        if (mark == nullptr) {
          return makeError(Code::kInternal, "cannot time event {} against its context", hex(id));
        }
        if (e->restoredMs) {
          // Restored and not recorded since: its saved time, moved to this mark.
          CUevent restoreMark = s.restoreMark(context);
          if (restoreMark == nullptr ||
              PHOS_DRIVER(d, EventElapsedTime_v2)(&before, restoreMark, mark) != CUDA_SUCCESS) {
            return makeError(Code::kInternal, "cannot time event {} (restored) against its context", hex(id));
          }
          entry["time_ms"] = *e->restoredMs - before;
        } else {
          auto* real = static_cast<CUevent>(s.handles_.resolve(HandleType::kCUevent_st, id));
          CUresult r = PHOS_DRIVER(d, EventElapsedTime_v2)(&before, real, mark);
          if (r == CUDA_SUCCESS) {
            entry["time_ms"] = -static_cast<double>(before);
          } else {
            // The driver gives it no time (its record failed, say): neither
            // will the restore, which answers as the driver does for an event
            // never recorded.
            log::get("daemon")->info("session {}: event {} has no time (CUresult {})", s.id_, hex(id),
                                      static_cast<int>(r));
          }
        }
      }
      events.push_back(entry);
    }
    for (const auto& [context, mark] : marks) {
      if (mark != nullptr) PHOS_DRIVER(d, EventDestroy_v2)(mark);
    }
    // And for a program with few timed events, the driver's own interval
    // between each pair, which the restore answers exactly.
    constexpr size_t kMaxTimedPairs = 64;
    std::vector<json*> timed;
    for (json& e : events) {
      if (e.contains("time_ms")) timed.push_back(&e);
    }
    if (timed.size() <= kMaxTimedPairs) {
      for (size_t i = 0; i < timed.size(); ++i) {
        const uint64_t a = (*timed[i])["id"].get<uint64_t>();
        const EventState* ea = s.findEvent(a);
        json intervals = json::object();
        for (size_t j = i + 1; j < timed.size(); ++j) {
          const uint64_t b = (*timed[j])["id"].get<uint64_t>();
          const EventState* eb = s.findEvent(b);
          float ms = 0;
          if (ea->restoredMs && eb->restoredMs) {
            auto saved = ea->restoredIntervals.find(b);
            if (saved == ea->restoredIntervals.end()) continue;  // the times' difference answers
            ms = saved->second;
          } else if (!ea->restoredMs && !eb->restoredMs) {
            auto* ra = static_cast<CUevent>(s.handles_.resolve(HandleType::kCUevent_st, a));
            auto* rb = static_cast<CUevent>(s.handles_.resolve(HandleType::kCUevent_st, b));
            if (PHOS_DRIVER(d, EventElapsedTime_v2)(&ms, ra, rb) != CUDA_SUCCESS) continue;
          } else {
            continue;
          }
          intervals[std::to_string(b)] = ms;
        }
        if (!intervals.empty()) (*timed[i])["intervals"] = intervals;
      }
    }
    // Objects of a kind the engine does not save (a kind remoted later and
    // not taught to the engine): restored, the program would hold handles
    // that name nothing.
    static const std::set<HandleType> kSaved = {
        HandleType::kCUctx_st,  HandleType::kCUevent_st, HandleType::kCUfunc_st,          HandleType::kCUkern_st,
        HandleType::kCUlib_st,  HandleType::kCUmod_st,   HandleType::kCUmemPoolHandle_st, HandleType::kCUstream_st};
    for (HandleType type : s.handles_.liveTypes()) {
      if (kSaved.count(type) != 0) continue;
      for (uint64_t id : s.handles_.ids(type)) {
        lost.push_back({{"id", id},
                        {"what", fmt::format("an object of handle type {}, which the engine does not save",
                                             static_cast<int>(type))}});
      }
    }
    // A checkpoint that cannot save an object the program holds fails, naming
    // it, rather than publish an image whose restore would run wrong.
    if (!lost.empty()) {
      std::string named;
      for (const json& l : lost) {
        if (!named.empty()) named += "; ";
        named += fmt::format("{} ({})", l["what"].get<std::string>(), hex(l["id"].get<uint64_t>()));
      }
      return makeError(Code::kFailedPrecondition, "the checkpoint cannot save {} object{} the program holds: {}",
                       lost.size(), lost.size() == 1 ? "" : "s", named);
    }
    state["library_modules"] = libraryModules;
    state["functions"] = functions;
    state["kernels"] = kernels;
    state["streams"] = streams;
    state["events"] = events;
    // An error of a posted call not reported yet: the next synchronizing call
    // of the restored process reports it, as it would have.
    state["deferred_error"] = static_cast<int>(s.deferred_);
    // `phos run --validate`: the restored session validates as well.
    state["validate"] = s.validator_.mode() == ValidationMode::kValidate;

    // The copies: into host memory when it has room (the application then
    // waits for the copy engine only), else chunk by chunk into the image.
    uint64_t total = 0;
    for (const Copy& c : copies) total += c.bytes;
    if (deferred != nullptr) {
      for (const Copy& c : copies) {
        CUcontext ctx = contextOnDevice(c.device);
        if (ctx == nullptr) return makeError(Code::kInternal, "device {} memory without a context of the session", c.device);
        deferred->push_back({c.blob, c.address, c.bytes, ctx, c.device});
      }
      PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
      gpuBytes += total;
      return Status::ok();
    }
    PhaseProgress phase(progress, "gpu-memory", total);
    phase.start();
    std::map<int, std::vector<const Copy*>> byDevice;
    for (const Copy& c : copies) byDevice[c.device].push_back(&c);
    const size_t chunk = image::kDefaultChunkBytes;
    if (recopier != nullptr) {
      // The copy at t2 goes into the same memory: the chunks without a slot
      // after the slots.
      uint64_t unslotted = 0;
      for (const Copy& c : copies) {
        for (uint64_t at = 0; at < c.bytes; at += chunk) {
          const uint64_t n = std::min<uint64_t>(chunk, c.bytes - at);
          if (!recopier->slot(c.address + at, n)) unslotted += n;
        }
      }
      if (staged == nullptr || staged->capacity() < recopier->slotBytes() + unslotted) recopier = nullptr;
    }
    const bool stage = recopier != nullptr || total <= stagingBudget();
    if (stage && !byDevice.empty()) {
      // Reserved before the pause for what the session had then; more was
      // allocated since: reserve again (now, while the application waits).
      if (recopier == nullptr && (staged == nullptr || staged->capacity() < total)) {
        staged.reset();
        ASSIGN_OR_RETURN(staged, StagedWrite::reserve(d, total));
      }
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(contextOnDevice(byDevice.begin()->first)),
                               "making a context current"));
      staged->registerMemory();
    } else {
      staged.reset();
    }
    const auto copyStart = std::chrono::steady_clock::now();
    std::vector<StagedWrite::Item> items;
    uint64_t offset = recopier != nullptr ? recopier->slotBytes() : 0, advanced = 0;
    uint64_t reused = 0, recopied = 0;
    for (const auto& [device, list] : byDevice) {
      CUcontext ctx = contextOnDevice(device);
      if (ctx == nullptr) return makeError(Code::kInternal, "device {} memory without a context of the session", device);
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(ctx), "making a context current"));
      if (stage && recopier != nullptr) {
        // Soft recopy: clean chunks are in their slots already.
        for (const Copy* c : list) {
          for (uint64_t at = 0; at < c->bytes; at += chunk) {
            const uint64_t n = std::min<uint64_t>(chunk, c->bytes - at);
            if (auto clean = recopier->cleanSlot(c->address + at, n)) {
              items.push_back({c->blob, *clean, n, at / chunk});
              reused += n;
              continue;
            }
            uint64_t to = offset;
            if (auto slot = recopier->slot(c->address + at, n)) {
              to = *slot;
            } else {
              offset += n;
            }
            RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, MemcpyDtoHAsync_v2)(staged->data() + to, c->address + at, n, nullptr),
                                     fmt::format("copying device memory at {}", hex(c->address + at))));
            items.push_back({c->blob, to, n, at / chunk});
            recopied += n;
          }
        }
        RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSynchronize)(), "waiting for the device copies"));
        uint64_t bytes = 0;
        for (const Copy* c : list) bytes += c->bytes;
        phase.advance(bytes);
        continue;
      }
      if (stage) {
        for (const Copy* c : list) {
          RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, MemcpyDtoHAsync_v2)(staged->data() + offset, c->address, c->bytes, nullptr),
                                   fmt::format("copying device memory at {}", hex(c->address))));
          items.push_back({c->blob, offset, c->bytes});
          offset += c->bytes;
        }
        RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSynchronize)(), "waiting for the device copies"));
        phase.advance(offset - advanced);
        advanced = offset;
        continue;
      }
      ChunkCopier copier(d, image::kDefaultChunkBytes);
      RETURN_IF_ERROR(copier.prepare());
      for (const Copy* c : list) {
        RETURN_IF_ERROR(copier.save(writer, c->blob, c->address, c->bytes, [&](uint64_t n) { phase.advance(n); }));
      }
    }
    copySeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - copyStart).count();
    if (recopyReport != nullptr) {
      (*recopyReport)["reused_bytes"] = reused;
      (*recopyReport)["recopied_bytes"] = recopier != nullptr ? recopied : total;
    }
    PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
    if (staged != nullptr) staged->plan(writer, std::move(items));
    gpuBytes += total;
    return Status::ok();
  }

  // Pinned memory, the ring and the host-call queue: the application's CPU
  // writes them, so they are copied while CRIU holds it frozen.
  static Status captureShared(Session& s, image::ImageWriter& writer, json& state, uint64_t& gpuBytes,
                              const ProgressFn& progress) {
    if (auto lane = s.busyLane()) {
      return makeError(Code::kFailedPrecondition,
                       "a thread of pid {} is inside a copy through transfer lane {} of its ring, which phosd gave up "
                       "on (the thread was stopped in it?): the image could not give the thread the lane's bytes "
                       "back; checkpoint again once the copy has returned",
                       s.pid_, *lane);
    }
    uint64_t total = 0;
    for (const auto& [address, r] : s.pinned_) total += r.bytes;
    PhaseProgress phase(progress, "pinned", total);
    phase.start();
    json pinned = json::array();
    for (const auto& [address, r] : s.pinned_) {
      std::string name = fmt::format("pinned/{}", hex(address));
      ASSIGN_OR_RETURN(size_t blob, writer.addBlob(name, "pinned-host", r.bytes, {{"address", address}}));
      RETURN_IF_ERROR(writer.writeBlob(blob, {reinterpret_cast<const std::byte*>(address), r.bytes}));
      phase.advance(r.bytes);
      pinned.push_back({{"address", address}, {"bytes", r.bytes}, {"mapped", r.mapped}, {"flags", r.flags},
                        {"path", r.path}, {"context", r.context}, {"blob", name}});
    }
    state["pinned"] = pinned;
    gpuBytes += total;
    if (s.ring_.has_value()) {
      auto snap = s.ring_->snapshot();
      ASSIGN_OR_RETURN(size_t blob, writer.addBlob("session/ring", "call-ring", snap.bytes.size()));
      RETURN_IF_ERROR(writer.writeBlob(blob, snap.bytes));
      state["ring"] = {{"path", s.ringPath_}, {"blob", "session/ring"}, {"read_position", snap.readPosition},
                       {"slot_count", s.ring_->geometry().slotCount}, {"slot_bytes", s.ring_->geometry().slotBytes},
                       {"lane_count", s.ring_->geometry().laneCount},
                       {"lane_slot_bytes", s.ring_->geometry().laneSlotBytes}};
    }
    std::lock_guard lock(s.hostCallsMutex_);
    if (s.hostCalls_ != nullptr) {
      auto bytes = s.hostCalls_->bytes();
      ASSIGN_OR_RETURN(size_t blob, writer.addBlob("session/hostcalls", "host-call-queue", bytes.size()));
      RETURN_IF_ERROR(writer.writeBlob(blob, bytes));
      state["host_calls"] = {{"path", s.hostCalls_->path()}, {"blob", "session/hostcalls"}};
    }
    return Status::ok();
  }

  // ---- restore -------------------------------------------------------------
  static Result<RestoredSession> restore(uint64_t id, const DriverTable& d, ContextPool& pool,
                                         const ServerTable& servers, const std::string& runtimeDir,
                                         const json& request, uid_t requester, const ProgressFn& progress) {
    if (!request.contains("image") || !request["image"].is_string()) {
      return makeError(Code::kInvalidArgument, "restore needs an \"image\" directory");
    }
    RETURN_IF_ERROR(requireEntryPoints(d));
    const std::string dir = request["image"].get<std::string>();
    if (request.contains("eager") && !request["eager"].is_boolean()) {
      return makeError(Code::kInvalidArgument, "restore: \"eager\" must be true or false");
    }
    const bool eager = request.value("eager", false);
    // The directory's owner and mode (fstat of it, opened without following
    // a link) say who may restore it; every file is opened beneath it.
    ASSIGN_OR_RETURN(std::shared_ptr<const image::ImageReader> reader,
                     image::ImageReader::open(dir, image::Requester{requester}));
    const json& all = reader->manifest().state;
    if (!all.contains("gpu") || !all["gpu"].contains("sessions") || !all["gpu"]["sessions"].is_array() ||
        all["gpu"]["sessions"].empty()) {
      return makeError(Code::kInvalidArgument, "{} holds no GPU session (a CPU-only image needs no phosd)", dir);
    }
    if (all["gpu"]["sessions"].size() != 1) {
      return makeError(Code::kNotSupported, "{} holds {} GPU sessions; a worker restores one", dir,
                       all["gpu"]["sessions"].size());
    }
    const json& st = all["gpu"]["sessions"][0];
    const std::string where = "state.gpu.sessions[0]";
    ASSIGN_OR_RETURN(pid_t pid, field<pid_t>(st, "pid", where));
    ASSIGN_OR_RETURN(uid_t recorded, field<uid_t>(st, "uid", where));
    // The manifest's uid is what its writer claims, not a credential: for a
    // user it must be that user (a session of another uid would give it
    // that uid's ring and files); root restores another user's job as that
    // user, as CRIU restores the process with its own credentials.
    if (requester != 0 && recorded != requester) {
      return makeError(Code::kPermissionDenied,
                       "{}: its manifest names uid {} ({}.uid), but uid {} asks to restore it: a user restores only "
                       "its own sessions",
                       dir, recorded, where, requester);
    }
    const uid_t uid = requester != 0 ? requester : recorded;
    RestoredSession restored;
    restored.session = std::make_unique<Session>(id, pid, uid, d, pool, servers, runtimeDir);
    Session& s = *restored.session;
    std::vector<PendingBuffer> pending;
    Status done = rebuild(s, *reader, st, progress, eager ? nullptr : &pending);
    if (!done.isOk()) return done.withContext(fmt::format("restoring {}", dir));
    // Twins run from the job's first launch on when it validates or loads its
    // memory concurrently: compiled now, before it runs again, not when its
    // first launches ask for them (docs/twins.md).
    if (s.validator_.mode() != ValidationMode::kOff || !pending.empty()) s.validator_.loadTwinModules();
    restored.validation = s.validator_.mode();
    if (pending.empty()) return restored;
    // Concurrent restore: the gate holds back every call that touches memory
    // not loaded yet, and launches run as restore twins, which check loads
    // too, until loadConcurrently() has loaded everything.
    auto loading = std::make_shared<OnDemandRestore>(d, reader, std::move(pending));
    loading->keepContexts(pool);
    if (Status prepared = loading->prepare(); !prepared.isOk()) {
      return prepared.withContext(fmt::format("restoring {}", dir));
    }
    s.setAccessGate([loading, gate = loading->gate()](const CallAccess& access) { gate(access); });
    s.validator_.setMode(ValidationMode::kValidateRestore);
    loading->giveWayTo(&s.transfers_);
    s.transfers_.track(true);
    restored.loading = std::move(loading);
    return restored;
  }

  static Status loadConcurrently(Session& s, OnDemandRestore& loading, ValidationMode validation,
                                 const std::function<bool()>& cancelled, json& report) {
    Status status = loading.run([](uint64_t) {}, cancelled);
    // The window ends: the twins' reports of everything launched in it.
    std::vector<Violation> found;
    if (status.isOk()) {
      if (Status paused = s.pause(kPauseTimeout); paused.isOk()) {
        {
          std::lock_guard lock(s.mutex_);
          found = closeWindow(s, validation);
          s.setAccessGate({});
          s.validator_.setMode(validation);
          s.transfers_.track(false);
        }
        s.resume();
      } else {
        status = makeError(Code::kFailedPrecondition,
                           "the window could not be closed to read the validator's reports: {}", paused.message());
      }
    }
    const OnDemandStats stats = loading.stats();
    report = {{"chunks", stats.chunks},           {"demanded_chunks", stats.demandedChunks},
              {"skipped_chunks", stats.skippedChunks}, {"waited_calls", stats.waitedCalls},
              {"waited_seconds", stats.waitedSeconds}, {"anything_calls", stats.anythingCalls},
              {"load_seconds", stats.loadSeconds},     {"yielded_seconds", stats.yieldedSeconds},
              {"misspeculations", found.size()}};
    if (status.isOk() && !found.empty()) {
      const Violation& v = found.front();
      return makeError(Code::kFailedPrecondition,
                       "{} access(es) outside the speculated buffers while loading (first: a {} by kernel {} at {})",
                       found.size(), v.kind == instrument::ViolationKind::kLoad ? "load" : "store", v.kernel,
                       hex(v.address));
    }
    return status;
  }

  static Result<size_t> blobOf(const image::ImageReader& reader, const json& entry, const std::string& where) {
    ASSIGN_OR_RETURN(std::string name, field<std::string>(entry, "blob", where));
    auto blob = reader.findBlob(name);
    if (!blob) return makeError(Code::kDataLoss, "{}: blob {} is not in the image", where, name);
    return *blob;
  }

  // With `deferred`, allocations are mapped and listed there, not loaded.
  static Status rebuild(Session& s, const image::ImageReader& reader, const json& st, const ProgressFn& progress,
                        std::vector<PendingBuffer>* deferred) {
    const DriverTable& d = s.driver_;
    std::lock_guard lock(s.mutex_);
    // The session's files first: if it still runs here, nothing is done.
    if (!st.contains("ring")) return makeError(Code::kDataLoss, "the session's call ring is not in the image");
    ASSIGN_OR_RETURN(const std::string ringPath, field<std::string>(st["ring"], "path", "ring"));
    RETURN_IF_ERROR(claimPath(ringPath, ringPath, s.pid_, s.uid_));
    // The ring is created and locked at once: another restore of this session
    // (a copy of the image) now finds it held and claims none of its files.
    // Its contents, the application's pending calls, come last.
    const json& ring = st["ring"];
    ASSIGN_OR_RETURN(size_t ringBlob, blobOf(reader, ring, "ring"));
    // Images of rings without transfer lanes name none.
    ipc::RingGeometry geometry{ring.value("slot_count", 0u), ring.value("slot_bytes", 0u), ring.value("lane_count", 0u),
                               ring.value("lane_slot_bytes", 0u)};
    ASSIGN_OR_RETURN(auto created, ipc::CallRing::create(ringPath, geometry, &s.ringLock_));
    s.ringPath_ = ringPath;  // from here on stop() removes it
    ASSIGN_OR_RETURN(uint64_t lastSerial, field<uint64_t>(st, "handles_last_serial", "session"));
    s.handles_.setLastSerial(lastSerial);
    s.deferred_ = static_cast<CUresult>(st.value("deferred_error", 0));
    if (st.value("validate", false)) s.validator_.setMode(ValidationMode::kValidate);

    // Contexts, from the pool.
    for (const json& c : st.value("contexts", json::array())) {
      ASSIGN_OR_RETURN(uint64_t vid, field<uint64_t>(c, "id", "context"));
      ASSIGN_OR_RETURN(int device, field<int>(c, "device", "context"));
      if (device < 0 || device >= s.pool_.deviceCount()) {
        return makeError(Code::kFailedPrecondition, "the image's context {} is on device {}; this host has {}",
                         hex(vid), device, s.pool_.deviceCount());
      }
      ASSIGN_OR_RETURN(CUcontext real, s.pool_.take(device, c.value("flags", 0u)));
      s.contexts_[vid] = {real, device, c.value("primary", false)};
      s.handles_.bind(HandleType::kCUctx_st, vid, real);
      s.captureOutput(real);
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(real), "making a context current"));
      const json limits = c.value("limits", json::object());
      for (const auto& [limit, value] : limits.items()) {
        const CUlimit which = static_cast<CUlimit>(std::stoi(limit));
        size_t now = 0;
        // Set only what differs from the fresh context's value: some limits
        // cannot be set once the context ran work, and most were never changed.
        if (PHOS_DRIVER(d, CtxGetLimit)(&now, which) == CUDA_SUCCESS && now != value.get<size_t>()) {
          RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, CtxSetLimit)(which, value.get<size_t>()),
                                   fmt::format("setting limit {} of context {} again", limit, hex(vid))));
          log::get("daemon")->debug("restore: limit {} of context {} set to {} (the fresh context had {})", limit,
                                    hex(vid), value.get<size_t>(), now);
        }
      }
      if (c.contains("cache_config")) {
        PHOS_DRIVER(d, CtxSetCacheConfig)(static_cast<CUfunc_cache>(c.value("cache_config", 0)));
      }
    }
    for (const json& p : st.value("primaries", json::array())) {
      PrimaryContext& pc = s.primaries_[p.value("device", 0)];
      pc.id = p.value("id", uint64_t{0});
      pc.refs = p.value("refs", 0u);
      pc.flags = p.value("flags", 0u);
    }
    for (const json& c : st.value("destroyed_contexts", json::array())) s.destroyedContexts_.insert(c.get<uint64_t>());
    auto contextReal = [&](uint64_t vid) -> Result<CUcontext> {
      auto it = s.contexts_.find(vid);
      if (it == s.contexts_.end()) return makeError(Code::kDataLoss, "the image names context {}, which it does not hold", hex(vid));
      return it->second.real;
    };
    auto makeCurrent = [&](uint64_t vid) -> Status {
      ASSIGN_OR_RETURN(CUcontext real, contextReal(vid));
      return driverStatus(PHOS_DRIVER(d, CtxSetCurrent)(real), "making a context current");
    };

    uint64_t total = 0;
    for (const auto& b : reader.manifest().blobs) {
      if ((b.kind == "gpu-memory" && deferred == nullptr) || b.kind == "module-global") total += b.size;
    }
    PhaseProgress phase(progress, "gpu-memory", total);
    phase.start();
    auto advance = [&](uint64_t n) { phase.advance(n); };

    // Device memory, at its addresses, in the ranges it was in.
    std::map<int, CUdeviceptr> heapBases;
    for (const json& h : st.value("heaps", json::array())) {
      ASSIGN_OR_RETURN(int device, field<int>(h, "device", "heap"));
      ASSIGN_OR_RETURN(heapBases[device], field<uint64_t>(h, "base", "heap"));
    }
    // NVIDIA's driver chooses where a module's variables go from what the
    // process did before it loaded the module. The session reserved its
    // ranges before its first module (Session::reserveHeap) and made the
    // driver allocations of its own (the copiers' staging) later: so here, the
    // ranges first, then the allocations and modules in the job's order, then
    // every copy.
    for (const auto& [device, base] : heapBases) {
      auto in = std::find_if(s.contexts_.begin(), s.contexts_.end(),
                             [&](const auto& c) { return c.second.device == device; });
      if (in == s.contexts_.end()) continue;  // no context on it now: reserved with its first allocation
      RETURN_IF_ERROR(makeCurrent(in->first));
      auto& heap = s.heaps_[device];
      heap = std::make_unique<DeviceHeap>(d, device, base, true);
      if (CUresult r = heap->reserve(); r != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition, "cannot reserve the range of device {} at {} again (CUresult {})",
                         device, hex(base), static_cast<int>(r));
      }
    }
    struct EagerCopy {
      uint64_t context;
      int device;
      size_t blob;
      CUdeviceptr address;
    };
    std::vector<EagerCopy> eagerCopies;  // after the modules
    std::map<int, std::unique_ptr<ChunkCopier>> copiers;
    auto copierFor = [&](int device) -> Result<ChunkCopier*> {
      auto& c = copiers[device];
      if (c == nullptr) {
        c = std::make_unique<ChunkCopier>(d, image::kDefaultChunkBytes);
        RETURN_IF_ERROR(c->prepare());
      }
      return c.get();
    };
    // Memory pools, under the handles the application holds, before the
    // allocations made from them.
    for (const json& p : st.value("memory_pools", json::array())) {
      MemoryPool pool;
      ASSIGN_OR_RETURN(pool.id, field<uint64_t>(p, "id", "memory pool"));
      ASSIGN_OR_RETURN(pool.device, field<int>(p, "device", "memory pool"));
      pool.isDefault = p.value("default", false);
      pool.destroyed = p.value("destroyed", false);
      pool.maxSize = p.value("max_size", size_t{0});
      pool.releaseThreshold = p.value("release_threshold", uint64_t{0});
      pool.followEventDependencies = p.value("reuse_follow_event_dependencies", 1);
      pool.allowOpportunistic = p.value("reuse_allow_opportunistic", 1);
      pool.allowInternalDependencies = p.value("reuse_allow_internal_dependencies", 1);
      pool.usedHigh = p.value("used_high", uint64_t{0});
      pool.reservedHigh = p.value("reserved_high", uint64_t{0});
      if (HandleTable::typeOf(pool.id) != HandleType::kCUmemPoolHandle_st) {
        return makeError(Code::kDataLoss, "memory pool {} has the handle of another type", hex(pool.id));
      }
      s.memoryPools_.restore(s, pool);
    }
    for (const json& c : st.value("current_memory_pools", json::array())) {
      ASSIGN_OR_RETURN(int device, field<int>(c, "device", "current memory pool"));
      ASSIGN_OR_RETURN(uint64_t pool, field<uint64_t>(c, "pool", "current memory pool"));
      if (s.memoryPools_.find(pool) == nullptr) {
        return makeError(Code::kDataLoss, "the current memory pool {} of device {} is not in the image", hex(pool),
                         device);
      }
      s.memoryPools_.restoreCurrent(device, pool);
    }
    // Allocations and modules come back in the order the job made them
    // (Session::nextOrder_): the allocations made before a module are mapped
    // before it is loaded. Images without the order: allocations first.
    const json allocationList = st.value("allocations", json::array());
    std::vector<const json*> byOrder;
    for (const json& a : allocationList) byOrder.push_back(&a);
    std::stable_sort(byOrder.begin(), byOrder.end(), [](const json* x, const json* y) {
      return x->value("order", uint64_t{0}) < y->value("order", uint64_t{0});
    });
    size_t nextAllocation = 0;
    uint64_t lastOrder = 0;
    auto mapAllocationsBefore = [&](uint64_t limit) -> Status {
      for (; nextAllocation < byOrder.size() && byOrder[nextAllocation]->value("order", uint64_t{0}) < limit;
           ++nextAllocation) {
        const json& a = *byOrder[nextAllocation];
        const uint64_t order = a.value("order", uint64_t{0});
        lastOrder = std::max(lastOrder, order);
        ASSIGN_OR_RETURN(CUdeviceptr address, field<uint64_t>(a, "address", "allocation"));
        ASSIGN_OR_RETURN(uint64_t bytes, field<uint64_t>(a, "bytes", "allocation"));
        ASSIGN_OR_RETURN(int device, field<int>(a, "device", "allocation"));
        ASSIGN_OR_RETURN(uint64_t context, field<uint64_t>(a, "context", "allocation"));
        ASSIGN_OR_RETURN(size_t blob, blobOf(reader, a, "allocation"));
        RETURN_IF_ERROR(makeCurrent(context));
        auto& heap = s.heaps_[device];
        if (heap == nullptr) {
          auto base = heapBases.find(device);
          if (base == heapBases.end()) {
            return makeError(Code::kDataLoss, "allocation {} is on device {}, whose range the image does not name",
                             hex(address), device);
          }
          heap = std::make_unique<DeviceHeap>(d, device, base->second, true);
        }
        CUresult r = heap->allocateAt(address, bytes);
        if (r != CUDA_SUCCESS) {
          return makeError(Code::kFailedPrecondition, "cannot map {} bytes of device {} at {} again (CUresult {})",
                           bytes, device, hex(address), static_cast<int>(r));
        }
        const uint64_t poolId = a.value("pool", uint64_t{0});
        s.allocations_[address] = {address, bytes, context, nullptr, device, poolId, order};
        if (poolId != 0) {
          MemoryPool* pool = s.memoryPools_.find(poolId);
          if (pool == nullptr) {
            return makeError(Code::kDataLoss, "allocation {} is of memory pool {}, which the image does not have",
                             hex(address), hex(poolId));
          }
          pool->used += bytes;
          pool->reserved += heap->mappedBytes(address);
        }
        if (reader.manifest().blobs[blob].size != bytes) {
          return makeError(Code::kDataLoss, "allocation {} is {} bytes, its blob {}", hex(address), bytes,
                           reader.manifest().blobs[blob].size);
        }
        if (deferred != nullptr) {
          ASSIGN_OR_RETURN(CUcontext real, contextReal(context));
          deferred->push_back({blob, address, bytes, real});
          continue;
        }
        eagerCopies.push_back({context, device, blob, address});
      }
      return Status::ok();
    };

    // Modules and libraries, loaded again in creation order; their globals.
    for (const json& m : st.value("modules", json::array())) {
      const uint64_t order = m.value("order", std::numeric_limits<uint64_t>::max());
      RETURN_IF_ERROR(mapAllocationsBefore(order));
      if (order != std::numeric_limits<uint64_t>::max()) lastOrder = std::max(lastOrder, order);
      ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(m, "id", "module"));
      const bool library = m.value("library", false);
      const uint64_t context = m.value("context", uint64_t{0});
      auto imageBlob = reader.findBlob(m.value("image", std::string()));
      if (!imageBlob) return makeError(Code::kDataLoss, "the image of module {} is missing", hex(mid));
      ModuleRecord rec{library, std::vector<char>(reader.manifest().blobs[*imageBlob].size), context,
                       order == std::numeric_limits<uint64_t>::max() ? 0 : order};
      RETURN_IF_ERROR(reader.read(*imageBlob, 0, std::as_writable_bytes(std::span(rec.image))));
      if (rec.image.empty() || rec.image.back() != '\0') rec.image.push_back('\0');
      // Each context's copy of the globals goes back where the application
      // knew it: vgpu places them as asked; another driver places them itself,
      // and the check below refuses the restore if one moved.
      std::map<uint64_t, std::map<std::string, uint64_t>> placements;  // holder context -> name -> address
      auto holderOf = [&](const json& g) {
        if (g.contains("context")) return g.value("context", uint64_t{0});
        return library && !s.contexts_.empty() ? s.contexts_.begin()->first : context;  // images before contexts were saved
      };
      for (const json& g : m.value("globals", json::array())) {
        placements[holderOf(g)][g.value("name", std::string())] = g.value("address", uint64_t{0});
      }
      auto place = [&](uint64_t holder) -> Status {
        const vgpu::ExportTable* vgpu = d.vgpu();
        auto it = placements.find(holder);
        if (vgpu == nullptr || vgpu->size < sizeof(vgpu::ExportTable) || it == placements.end()) return Status::ok();
        ASSIGN_OR_RETURN(CUcontext in, contextReal(holder));
        return driverStatus(vgpu->placeNextModuleGlobals(in, it->second),
                            fmt::format("placing the globals of module {}", hex(mid)));
      };
      const uint64_t firstHolder = library ? (placements.empty() ? 0 : placements.begin()->first) : context;
      if (firstHolder != 0) {
        RETURN_IF_ERROR(makeCurrent(firstHolder));
        RETURN_IF_ERROR(place(firstHolder));
      }
      void* real = nullptr;
      CUresult r;
      // As when the application loaded it: its own image; its validator twins
      // are loaded beside it when a twin of it first runs.
      std::shared_ptr<const PreparedModule> prepared;
      if (library) {
        CUlibrary lib = nullptr;
        r = loadLibrary(d, rec.image, &lib, &prepared);
        if (r == CUDA_SUCCESS) s.validator_.noteLibrary(lib, prepared);
        real = lib;
        // The library's module in each other context that held globals.
        for (const auto& [holder, names] : placements) {
          if (r != CUDA_SUCCESS || holder == firstHolder) continue;
          RETURN_IF_ERROR(makeCurrent(holder));
          RETURN_IF_ERROR(place(holder));
          CUmodule inHolder = nullptr;
          r = PHOS_DRIVER(d, LibraryGetModule)(&inHolder, lib);
        }
      } else {
        CUmodule mod = nullptr;
        r = loadModule(d, rec.image, &mod, &prepared);
        if (r == CUDA_SUCCESS) s.validator_.noteModule(mod, prepared);
        real = mod;
      }
      if (r != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition, "the driver refused module {} again (CUresult {})", hex(mid),
                         static_cast<int>(r));
      }
      s.handles_.bind(library ? HandleType::kCUlib_st : HandleType::kCUmod_st, mid, real);
      if (!library) s.contextOfHandle_[mid] = context;
      s.moduleRecords_[mid] = std::move(rec);
      s.noteModule(+1);
      const int device = m.value("device", 0);
      for (const json& g : m.value("globals", json::array())) {
        // A library's globals are per context: each on its context's device.
        int globalDevice = device;
        if (auto held = s.contexts_.find(g.value("context", context)); held != s.contexts_.end()) {
          globalDevice = held->second.device;
        }
        ASSIGN_OR_RETURN(std::string name, field<std::string>(g, "name", "global"));
        ASSIGN_OR_RETURN(CUdeviceptr was, field<uint64_t>(g, "address", "global"));
        ASSIGN_OR_RETURN(size_t blob, blobOf(reader, g, "global"));
        CUdeviceptr address = 0;
        size_t bytes = 0;
        const uint64_t holder = holderOf(g);
        if (library) {
          ASSIGN_OR_RETURN(CUcontext in, contextReal(holder));
          PHOS_DRIVER(d, CtxSetCurrent)(in);
          r = PHOS_DRIVER(d, LibraryGetGlobal)(&address, &bytes, static_cast<CUlibrary>(real), name.c_str());
        } else {
          r = PHOS_DRIVER(d, ModuleGetGlobal_v2)(&address, &bytes, static_cast<CUmodule>(real), name.c_str());
        }
        if (r != CUDA_SUCCESS || bytes != reader.manifest().blobs[blob].size) {
          return makeError(Code::kFailedPrecondition, "global {} of module {} is not what it was", name, hex(mid));
        }
        if (address != was) {
          // The application, or device memory a kernel wrote, may hold the
          // old address: nothing can make them agree. What holds that address
          // now, when the driver says (docs/gpu.md: where NVIDIA's driver
          // places modules).
          CUdeviceptr base = 0;
          size_t size = 0;
          std::string holds;
          if (PHOS_DRIVER(d, MemGetAddressRange_v2)(&base, &size, was) == CUDA_SUCCESS) {
            holds = fmt::format("; {} is in a driver allocation of {} bytes at {} now", hex(was), size, hex(base));
          }
          const uint64_t low = std::min<uint64_t>(was, address), high = std::max<uint64_t>(was, address);
          return makeError(Code::kFailedPrecondition,
                           "global {} of module {} was at {} and the driver placed it at {} now{}{}; this process "
                           "maps there: {}",
                           name, hex(mid), hex(was), hex(address),
                           g.value("taken", false) ? "; the application holds the old address" : "", holds,
                           mappingsAround(low - std::min<uint64_t>(low, 4u << 20), high + (4u << 20)));
        }
        if (g.value("taken", false)) {
          s.allocations_[address] = {address, bytes, holder, real, globalDevice};
        }
        eagerCopies.push_back({holder, globalDevice, blob, address});
      }
    }
    RETURN_IF_ERROR(mapAllocationsBefore(std::numeric_limits<uint64_t>::max()));
    s.nextOrder_ = lastOrder + 1;
    for (const EagerCopy& e : eagerCopies) {
      if (e.context != 0) RETURN_IF_ERROR(makeCurrent(e.context));
      ASSIGN_OR_RETURN(ChunkCopier * copier, copierFor(e.device));
      RETURN_IF_ERROR(copier->load(reader, e.blob, e.address, advance));
    }
    for (const json& m : st.value("library_modules", json::array())) {
      ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(m, "id", "library module"));
      ASSIGN_OR_RETURN(uint64_t lid, field<uint64_t>(m, "library", "library module"));
      const uint64_t context = m.value("context", uint64_t{0});
      if (context != 0) RETURN_IF_ERROR(makeCurrent(context));
      CUmodule mod = nullptr;
      auto* lib = static_cast<CUlibrary>(s.handles_.resolve(HandleType::kCUlib_st, lid));
      if (lib == nullptr || PHOS_DRIVER(d, LibraryGetModule)(&mod, lib) != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition, "module {} of library {} cannot be made again", hex(mid), hex(lid));
      }
      s.handles_.bind(HandleType::kCUmod_st, mid, mod);
      if (context != 0) s.contextOfHandle_[mid] = context;
    }
    // Kernels before functions: a function's saved attributes are set only
    // where they differ from what it inherits from its kernel.
    for (const json& k : st.value("kernels", json::array())) {
      ASSIGN_OR_RETURN(uint64_t kid, field<uint64_t>(k, "id", "kernel"));
      ASSIGN_OR_RETURN(uint64_t lid, field<uint64_t>(k, "library", "kernel"));
      ASSIGN_OR_RETURN(std::string name, field<std::string>(k, "name", "kernel"));
      auto* lib = static_cast<CUlibrary>(s.handles_.resolve(HandleType::kCUlib_st, lid));
      CUkernel kernel = nullptr;
      if (lib == nullptr || PHOS_DRIVER(d, LibraryGetKernel)(&kernel, lib, name.c_str()) != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition, "kernel {} ({}) cannot be found again", name, hex(kid));
      }
      const json perDevice = k.value("attributes", json::object());
      for (const auto& [device, attributes] : perDevice.items()) {
        const int dev = std::atoi(device.c_str());
        if (dev < 0 || dev >= s.pool_.deviceCount()) {
          return makeError(Code::kFailedPrecondition, "kernel {} ({}) has attributes for device {}, this host has {}",
                           name, hex(kid), device, s.pool_.deviceCount());
        }
        RETURN_IF_ERROR(restoreAttributes(
            attributes, fmt::format("kernel {} ({}) on device {}", name, hex(kid), dev),
            [&](CUfunction_attribute a, int* v) { return PHOS_DRIVER(d, KernelGetAttribute)(v, a, kernel, dev); },
            [&](CUfunction_attribute a, int v) { return PHOS_DRIVER(d, KernelSetAttribute)(a, v, kernel, dev); }));
      }
      for (const json& own : k.value("functions", json::array())) {
        ASSIGN_OR_RETURN(uint64_t context, field<uint64_t>(own, "context", "kernel function"));
        RETURN_IF_ERROR(makeCurrent(context));
        CUfunction fn = nullptr;
        RETURN_IF_ERROR(
            driverStatus(PHOS_DRIVER(d, KernelGetFunction)(&fn, kernel),
                         fmt::format("kernel {} ({}) as a function of context {}", name, hex(kid), hex(context))));
        RETURN_IF_ERROR(restoreAttributes(
            own.value("attributes", json::object()),
            fmt::format("kernel {} ({}) in context {}", name, hex(kid), hex(context)),
            [&](CUfunction_attribute a, int* v) { return PHOS_DRIVER(d, FuncGetAttribute)(v, a, fn); },
            [&](CUfunction_attribute a, int v) { return PHOS_DRIVER(d, FuncSetAttribute)(fn, a, v); }));
        s.kernelFunctions_[kid].insert(context);
      }
      s.handles_.bind(HandleType::kCUkern_st, kid, kernel);
    }
    for (const json& f : st.value("functions", json::array())) {
      ASSIGN_OR_RETURN(uint64_t fid, field<uint64_t>(f, "id", "function"));
      ASSIGN_OR_RETURN(std::string name, field<std::string>(f, "name", "function"));
      const uint64_t context = f.value("context", uint64_t{0});
      if (context != 0) RETURN_IF_ERROR(makeCurrent(context));
      CUmodule mod = nullptr;
      if (f.contains("library")) {
        auto* lib = static_cast<CUlibrary>(s.handles_.resolve(HandleType::kCUlib_st, f.value("library", uint64_t{0})));
        if (lib != nullptr && PHOS_DRIVER(d, LibraryGetModule)(&mod, lib) != CUDA_SUCCESS) mod = nullptr;
      } else {
        ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(f, "module", "function"));
        mod = static_cast<CUmodule>(s.handles_.resolve(HandleType::kCUmod_st, mid));
      }
      CUfunction fn = nullptr;
      if (mod == nullptr || PHOS_DRIVER(d, ModuleGetFunction)(&fn, mod, name.c_str()) != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition, "function {} ({}) cannot be found again", name, hex(fid));
      }
      RETURN_IF_ERROR(restoreAttributes(
          f.value("attributes", json::object()), fmt::format("function {} ({})", name, hex(fid)),
          [&](CUfunction_attribute a, int* v) { return PHOS_DRIVER(d, FuncGetAttribute)(v, a, fn); },
          [&](CUfunction_attribute a, int v) { return PHOS_DRIVER(d, FuncSetAttribute)(fn, a, v); }));
      s.handles_.bind(HandleType::kCUfunc_st, fid, fn);
      if (context != 0) s.contextOfHandle_[fid] = context;
    }
    for (const json& x : st.value("streams", json::array())) {
      ASSIGN_OR_RETURN(uint64_t sid, field<uint64_t>(x, "id", "stream"));
      const uint64_t context = x.value("context", uint64_t{0});
      RETURN_IF_ERROR(makeCurrent(context));
      CUstream stream = nullptr;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, StreamCreateWithPriority)(&stream, x.value("flags", 0u), x.value("priority", 0)),
                               fmt::format("creating stream {} again", hex(sid))));
      s.handles_.bind(HandleType::kCUstream_st, sid, stream);
      s.contextOfHandle_[sid] = context;
    }
    for (const json& x : st.value("events", json::array())) {
      ASSIGN_OR_RETURN(uint64_t eid, field<uint64_t>(x, "id", "event"));
      const uint64_t context = x.value("context", uint64_t{0});
      const unsigned flags = x.value("flags", 0u);
      RETURN_IF_ERROR(makeCurrent(context));
      CUevent event = nullptr;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, EventCreate)(&event, flags), fmt::format("creating event {} again", hex(eid))));
      s.handles_.bind(HandleType::kCUevent_st, eid, event);
      s.contextOfHandle_[eid] = context;
      EventState& state = s.event(eid);
      state.flags = flags;
      state.recorded = x.value("recorded", false);
      if (x.contains("time_ms")) state.restoredMs = x["time_ms"].get<double>();
      const json intervals = x.value("intervals", json::object());
      for (const auto& [other, ms] : intervals.items()) {
        state.restoredIntervals[std::stoull(other)] = ms.get<float>();
      }
    }
    // Intervals are saved once per pair: the other direction is the negation.
    for (auto& [eid, state] : s.events_) {
      for (const auto& [other, ms] : state.restoredIntervals) {
        auto peer = s.events_.find(other);
        if (peer != s.events_.end()) peer->second.restoredIntervals.try_emplace(eid, -ms);
      }
    }
    // The origin of restored events' times in each context: a mark recorded
    // now (kept until the context goes).
    for (const auto& [vid, ctx] : s.contexts_) {
      if (ctx.real == nullptr) continue;
      RETURN_IF_ERROR(makeCurrent(vid));
      CUevent mark = nullptr;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, EventCreate)(&mark, CU_EVENT_DEFAULT), "creating a restore mark"));
      s.restoreMarks_[vid] = mark;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, EventRecord)(mark, nullptr), "recording a restore mark"));
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, EventSynchronize)(mark), "recording a restore mark"));
    }

    // Pinned memory: the same file path, mapped at the same address.
    for (const json& p : st.value("pinned", json::array())) {
      PinnedRange r;
      ASSIGN_OR_RETURN(r.address, field<uint64_t>(p, "address", "pinned"));
      ASSIGN_OR_RETURN(r.bytes, field<uint64_t>(p, "bytes", "pinned"));
      ASSIGN_OR_RETURN(r.mapped, field<uint64_t>(p, "mapped", "pinned"));
      ASSIGN_OR_RETURN(r.path, field<std::string>(p, "path", "pinned"));
      r.flags = p.value("flags", 0u);
      r.context = p.value("context", uint64_t{0});
      ASSIGN_OR_RETURN(size_t blob, blobOf(reader, p, "pinned"));
      RETURN_IF_ERROR(claimPath(r.path, "", s.pid_, s.uid_));  // the ring is ours
      RETURN_IF_ERROR(mapShared(r.path, r.address, r.mapped, s.uid_));
      s.pinned_[r.address] = r;  // from here on stop() unmaps and removes it
      RETURN_IF_ERROR(reader.read(blob, 0, {reinterpret_cast<std::byte*>(r.address), r.bytes}));
      RETURN_IF_ERROR(makeCurrent(r.context));
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, MemHostRegister_v2)(reinterpret_cast<void*>(r.address), r.mapped,
                                                                   CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
                               fmt::format("registering pinned memory at {} again", hex(r.address))));
    }
    PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
    s.currentReal_ = nullptr;

    if (st.contains("host_calls")) {
      const json& h = st["host_calls"];
      ASSIGN_OR_RETURN(std::string path, field<std::string>(h, "path", "host_calls"));
      ASSIGN_OR_RETURN(size_t blob, blobOf(reader, h, "host_calls"));
      RETURN_IF_ERROR(claimPath(path, "", s.pid_, s.uid_));  // the ring is ours
      ASSIGN_OR_RETURN(auto channel, HostCallChannel::create(path, s.uid_, s.pid_));
      std::vector<std::byte> bytes(reader.manifest().blobs[blob].size);
      RETURN_IF_ERROR(reader.read(blob, 0, bytes));
      RETURN_IF_ERROR(channel->restoreBytes(bytes));
      std::lock_guard hostLock(s.hostCallsMutex_);
      s.hostCalls_ = std::move(channel);
    }

    // The ring's contents last: the application's pending calls are in it.
    const std::string& path = ringPath;
    ipc::CallRing::Snapshot snap;
    snap.bytes.resize(reader.manifest().blobs[ringBlob].size);
    RETURN_IF_ERROR(reader.read(ringBlob, 0, snap.bytes));
    snap.readPosition = ring.value("read_position", uint64_t{0});
    RETURN_IF_ERROR(created.restoreSnapshot(snap));
    if (chown(path.c_str(), s.uid_, static_cast<gid_t>(-1)) != 0 && geteuid() == 0) {
      return errnoError(errno, fmt::format("cannot give {} to uid {}", path, s.uid_));
    }
    chmod(path.c_str(), 0600);
    s.ring_.emplace(std::move(created));
    return Status::ok();
  }

  // Creates `path` (owned by `uid`, 0600) of `bytes` and maps it shared at
  // exactly `address` in this process.
  static Status mapShared(const std::string& path, uintptr_t address, size_t bytes, uid_t uid) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errnoError(errno, fmt::format("cannot create {}", path));
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || (fchown(fd, uid, static_cast<gid_t>(-1)) != 0 && geteuid() == 0)) {
      int e = errno;
      close(fd);
      unlink(path.c_str());
      return errnoError(e, fmt::format("cannot prepare {}", path));
    }
    void* p = mmap(reinterpret_cast<void*>(address), bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    close(fd);
    if (p == MAP_FAILED || p != reinterpret_cast<void*>(address)) {
      int e = p == MAP_FAILED ? errno : EEXIST;
      if (p != MAP_FAILED) munmap(p, bytes);
      unlink(path.c_str());
      return errnoError(e, fmt::format("cannot map {} at {:#x}", path, address));
    }
    return Status::ok();
  }
};

json checkpointSession(Session& session, const json& request, const ProgressFn& progress) {
  return Engine::checkpoint(session, request, progress);
}

Result<RestoredSession> restoreSession(uint64_t id, const DriverTable& driver, ContextPool& pool,
                                       const ServerTable& servers, const std::string& runtimeDir,
                                       const json& request, uid_t requester, const ProgressFn& progress) {
  return Engine::restore(id, driver, pool, servers, runtimeDir, request, requester, progress);
}

Status loadConcurrently(Session& session, OnDemandRestore& loading, ValidationMode validation,
                        const std::function<bool()>& cancelled, json& report) {
  return Engine::loadConcurrently(session, loading, validation, cancelled, report);
}

}  // namespace phos::daemon
