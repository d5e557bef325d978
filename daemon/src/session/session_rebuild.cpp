// SPDX-License-Identifier: Apache-2.0
// A session made again from an image (Session::rebuildFrom), domain by
// domain, in the order the objects depend on each other: the ring, contexts,
// device ranges and pools, allocations and modules in the order the job made
// them, the globals' and allocations' bytes, library modules, kernels,
// functions, streams, events, pinned memory, the host-call queue, and the
// ring's pending calls last. The description comes from
// Session::describe (session_save.cpp); the image is untrusted input, and
// anything it names wrongly is refused, naming what.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "protocols/device_copy.h"
#include "session/host_calls.h"
#include "session/session_files.h"
#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "session/session.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

namespace {

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
    if (const size_t path = line.find('/'); path != std::string::npos)
      out += " " + line.substr(path);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

class Session::Rebuilder {
 public:
  Rebuilder(Session& s, const image::ImageReader& reader, const json& state,
            const ProgressFn& progress, std::vector<DeviceBuffer>* deferred)
      : s_(s),
        d_(s.driver_),
        scope_{s.driver_, s.handles_, s.contexts_, s.currentContext_},
        reader_(reader),
        st_(state),
        progress_(progress),
        deferred_(deferred) {}

  Status run() {
    std::lock_guard lock(s_.mutex_);
    RETURN_IF_ERROR(claimRing());
    RETURN_IF_ERROR(contexts());
    uint64_t total = 0;
    for (const auto& b : reader_.manifest().blobs) {
      if ((b.kind == "gpu-memory" && deferred_ == nullptr) || b.kind == "module-global")
        total += b.size;
    }
    phase_.emplace(progress_, "gpu-memory", total);
    phase_->start();
    // Device memory, at its addresses, in the ranges it was in.
    memory_.emplace(s_.memory_, scope_, reader_, st_);
    RETURN_IF_ERROR(memory_->reserveRanges());
    // Memory pools, under the handles the application holds, before the
    // allocations made from them.
    RETURN_IF_ERROR(s_.memoryPools_.rebuild(s_, st_));
    // Allocations and modules come back in the order the job made them
    // (DeviceMemory::takeOrder): the allocations made before a module are
    // mapped before it is loaded. Modules and libraries, loaded again in
    // creation order; their globals.
    for (const json& m : st_.value("modules", json::array())) RETURN_IF_ERROR(module(m));
    RETURN_IF_ERROR(mapAllocationsBefore(std::numeric_limits<uint64_t>::max()));
    memory_->finish();
    for (const EagerCopy& e : eagerCopies_) {
      if (e.context != 0) RETURN_IF_ERROR(makeCurrent(e.context));
      ASSIGN_OR_RETURN(ChunkCopier * copier, copierFor(e.device));
      RETURN_IF_ERROR(
          copier->load(reader_, e.blob, e.address, [this](uint64_t n) { phase_->advance(n); }));
    }
    RETURN_IF_ERROR(libraryModules());
    RETURN_IF_ERROR(kernels());
    RETURN_IF_ERROR(functions());
    RETURN_IF_ERROR(s_.streamsAndEvents_.rebuild(scope_, st_));
    RETURN_IF_ERROR(pinned());
    RETURN_IF_ERROR(hostCalls());
    // The ring's contents last: the application's pending calls are in it.
    const std::string& path = ringPath_;
    ipc::CallRing::Snapshot snap;
    snap.bytes.resize(reader_.manifest().blobs[ringBlob_].size);
    RETURN_IF_ERROR(reader_.read(ringBlob_, 0, snap.bytes));
    snap.readPosition = st_["ring"].value("read_position", uint64_t{0});
    RETURN_IF_ERROR(created_->restoreSnapshot(snap));
    if (chown(path.c_str(), s_.uid_, static_cast<gid_t>(-1)) != 0 && geteuid() == 0) {
      return errnoError(errno, fmt::format("cannot give {} to uid {}", path, s_.uid_));
    }
    chmod(path.c_str(), 0600);
    s_.ring_.emplace(std::move(*created_));
    return Status::ok();
  }

 private:
  Status claimRing() {
    // The session's files first: if it still runs here, nothing is done.
    if (!st_.contains("ring"))
      return makeError(Code::kDataLoss, "the session's call ring is not in the image");
    ASSIGN_OR_RETURN(ringPath_, field<std::string>(st_["ring"], "path", "ring"));
    RETURN_IF_ERROR(claimSessionPath(ringPath_, ringPath_, s_.pid_, s_.uid_));
    // The ring is created and locked at once: another restore of this session
    // (a copy of the image) now finds it held and claims none of its files.
    // Its contents, the application's pending calls, come last.
    const json& ring = st_["ring"];
    ASSIGN_OR_RETURN(ringBlob_, blobOf(reader_, ring, "ring"));
    // Images of rings without transfer lanes name none.
    ipc::RingGeometry geometry{ring.value("slot_count", 0u), ring.value("slot_bytes", 0u),
                               ring.value("lane_count", 0u), ring.value("lane_slot_bytes", 0u)};
    ASSIGN_OR_RETURN(ipc::CallRing created,
                     ipc::CallRing::create(ringPath_, geometry, &s_.ringLock_));
    created_.emplace(std::move(created));
    s_.ringPath_ = ringPath_;  // from here on stop() removes it
    ASSIGN_OR_RETURN(uint64_t lastSerial, field<uint64_t>(st_, "handles_last_serial", "session"));
    s_.handles_.setLastSerial(lastSerial);
    s_.deferred_ = static_cast<CUresult>(st_.value("deferred_error", 0));
    if (st_.value("validate", false)) s_.validator_.setMode(ValidationMode::kValidate);
    return Status::ok();
  }

  // Contexts, from the pool.
  Status contexts() {
    return s_.contexts_.rebuild(d_, s_.pool_, s_.handles_, st_,
                                [this](CUcontext real) { s_.captureOutput(real); });
  }

  Status makeCurrent(uint64_t vid) { return s_.contexts_.makeCurrent(d_, vid); }

  Result<ChunkCopier*> copierFor(int device) {
    auto& c = copiers_[device];
    if (c == nullptr) {
      c = std::make_unique<ChunkCopier>(d_, image::kDefaultChunkBytes);
      RETURN_IF_ERROR(c->prepare());
    }
    return c.get();
  }

  // The allocations of the image before `limit` in the job's order, mapped
  // at their addresses (their bytes are copied after the modules, or, for a
  // concurrent restore, listed in `deferred_`), counted in their pools.
  Status mapAllocationsBefore(uint64_t limit) {
    return memory_->mapBefore(limit, [this](const Allocation& a, size_t blob) -> Status {
      if (a.pool != 0) {
        MemoryPool* pool = s_.memoryPools_.find(a.pool);
        if (pool == nullptr) {
          return makeError(Code::kDataLoss, "allocation {} is of memory pool {}, which the image does not have",
                           hex(a.address), hex(a.pool));
        }
        pool->used += a.bytes;
        pool->reserved += s_.memory_.mappedBytes(a.device, a.address);
      }
      if (deferred_ != nullptr) {
        ASSIGN_OR_RETURN(CUcontext real, s_.contexts_.real(a.context));
        deferred_->push_back({blob, a.address, a.bytes, real});
      } else {
        eagerCopies_.push_back({a.context, a.device, blob, a.address});
      }
      return Status::ok();
    });
  }

  // The context whose copy of a global `g` is (images before contexts were
  // saved name none).
  uint64_t holderOf(const json& g, bool library, uint64_t context) const {
    if (g.contains("context")) return g.value("context", uint64_t{0});
    return library && s_.contexts_.size() != 0 ? s_.contexts_.begin()->first : context;
  }

  Status module(const json& m) {
    const uint64_t order = m.value("order", std::numeric_limits<uint64_t>::max());
    RETURN_IF_ERROR(mapAllocationsBefore(order));
    if (order != std::numeric_limits<uint64_t>::max()) memory_->noteOrder(order);
    ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(m, "id", "module"));
    const bool library = m.value("library", false);
    const uint64_t context = m.value("context", uint64_t{0});
    auto imageBlob = reader_.findBlob(m.value("image", std::string()));
    if (!imageBlob)
      return makeError(Code::kDataLoss, "the image of module {} is missing", hex(mid));
    ModuleRecord rec{library, std::vector<char>(reader_.manifest().blobs[*imageBlob].size), context,
                     order == std::numeric_limits<uint64_t>::max() ? 0 : order};
    RETURN_IF_ERROR(reader_.read(*imageBlob, 0, std::as_writable_bytes(std::span(rec.image))));
    if (rec.image.empty() || rec.image.back() != '\0') rec.image.push_back('\0');
    // Each context's copy of the globals goes back where the application
    // knew it: vgpu places them as asked; another driver places them itself,
    // and the check below refuses the restore if one moved.
    std::map<uint64_t, std::map<std::string, uint64_t>>
        placements;  // holder context -> name -> address
    for (const json& g : m.value("globals", json::array())) {
      placements[holderOf(g, library, context)][g.value("name", std::string())] =
          g.value("address", uint64_t{0});
    }
    auto place = [&](uint64_t holder) -> Status {
      const vgpu::ExportTable* vgpu = d_.vgpu();
      auto it = placements.find(holder);
      if (vgpu == nullptr || vgpu->size < sizeof(vgpu::ExportTable) || it == placements.end())
        return Status::ok();
      ASSIGN_OR_RETURN(CUcontext in, s_.contexts_.real(holder));
      return driverStatus(vgpu->placeNextModuleGlobals(in, it->second),
                          fmt::format("placing the globals of module {}", hex(mid)));
    };
    const uint64_t firstHolder =
        library ? (placements.empty() ? 0 : placements.begin()->first) : context;
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
      r = loadLibrary(d_, rec.image, &lib, &prepared);
      if (r == CUDA_SUCCESS) s_.validator_.noteLibrary(lib, prepared);
      real = lib;
      // The library's module in each other context that held globals.
      for (const auto& [holder, names] : placements) {
        if (r != CUDA_SUCCESS || holder == firstHolder) continue;
        RETURN_IF_ERROR(makeCurrent(holder));
        RETURN_IF_ERROR(place(holder));
        CUmodule inHolder = nullptr;
        r = PHOS_DRIVER(d_, LibraryGetModule)(&inHolder, lib);
      }
    } else {
      CUmodule mod = nullptr;
      r = loadModule(d_, rec.image, &mod, &prepared);
      if (r == CUDA_SUCCESS) s_.validator_.noteModule(mod, prepared);
      real = mod;
    }
    if (r != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition,
                       "the driver refused module {} again (CUresult {})", hex(mid),
                       static_cast<int>(r));
    }
    s_.handles_.bind(library ? HandleType::kCUlib_st : HandleType::kCUmod_st, mid, real);
    if (!library) s_.contexts_.noteObject(mid, context);
    s_.moduleRecords_[mid] = std::move(rec);
    s_.noteModule(+1);
    return moduleGlobals(m, mid, library, real, context);
  }

  // Where each global of module `mid` is now, which must be where it was.
  Status moduleGlobals(const json& m, uint64_t mid, bool library, void* real, uint64_t context) {
    const int device = m.value("device", 0);
    for (const json& g : m.value("globals", json::array())) {
      // A library's globals are per context: each on its context's device.
      const int globalDevice = s_.contexts_.deviceOf(g.value("context", context), device);
      ASSIGN_OR_RETURN(std::string name, field<std::string>(g, "name", "global"));
      ASSIGN_OR_RETURN(CUdeviceptr was, field<uint64_t>(g, "address", "global"));
      ASSIGN_OR_RETURN(size_t blob, blobOf(reader_, g, "global"));
      CUdeviceptr address = 0;
      size_t bytes = 0;
      CUresult r = CUDA_SUCCESS;
      const uint64_t holder = holderOf(g, library, context);
      if (library) {
        ASSIGN_OR_RETURN(CUcontext in, s_.contexts_.real(holder));
        PHOS_DRIVER(d_, CtxSetCurrent)(in);
        r = PHOS_DRIVER(d_, LibraryGetGlobal)(&address, &bytes, static_cast<CUlibrary>(real),
                                              name.c_str());
      } else {
        r = PHOS_DRIVER(d_, ModuleGetGlobal_v2)(&address, &bytes, static_cast<CUmodule>(real),
                                                name.c_str());
      }
      if (r != CUDA_SUCCESS || bytes != reader_.manifest().blobs[blob].size) {
        return makeError(Code::kFailedPrecondition, "global {} of module {} is not what it was",
                         name, hex(mid));
      }
      if (address != was) {
        // The application, or device memory a kernel wrote, may hold the
        // old address: nothing can make them agree. What holds that address
        // now, when the driver says (docs/gpu.md: where NVIDIA's driver
        // places modules).
        CUdeviceptr base = 0;
        size_t size = 0;
        std::string holds;
        if (PHOS_DRIVER(d_, MemGetAddressRange_v2)(&base, &size, was) == CUDA_SUCCESS) {
          holds = fmt::format("; {} is in a driver allocation of {} bytes at {} now", hex(was),
                              size, hex(base));
        }
        const uint64_t low = std::min<uint64_t>(was, address),
                       high = std::max<uint64_t>(was, address);
        return makeError(
            Code::kFailedPrecondition,
            "global {} of module {} was at {} and the driver placed it at {} now{}{}; this process "
            "maps there: {}",
            name, hex(mid), hex(was), hex(address),
            g.value("taken", false) ? "; the application holds the old address" : "", holds,
            mappingsAround(low - std::min<uint64_t>(low, 4u << 20), high + (4u << 20)));
      }
      if (g.value("taken", false)) {
        s_.memory_.add({address, bytes, holder, real, globalDevice});
      }
      eagerCopies_.push_back({holder, globalDevice, blob, address});
    }
    return Status::ok();
  }

  Status libraryModules() {
    for (const json& m : st_.value("library_modules", json::array())) {
      ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(m, "id", "library module"));
      ASSIGN_OR_RETURN(uint64_t lid, field<uint64_t>(m, "library", "library module"));
      const uint64_t context = m.value("context", uint64_t{0});
      if (context != 0) RETURN_IF_ERROR(makeCurrent(context));
      CUmodule mod = nullptr;
      auto* lib = static_cast<CUlibrary>(s_.handles_.resolve(HandleType::kCUlib_st, lid));
      if (lib == nullptr || PHOS_DRIVER(d_, LibraryGetModule)(&mod, lib) != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition, "module {} of library {} cannot be made again",
                         hex(mid), hex(lid));
      }
      s_.handles_.bind(HandleType::kCUmod_st, mid, mod);
      if (context != 0) s_.contexts_.noteObject(mid, context);
    }
    return Status::ok();
  }

  Status kernels() {
    // Kernels before functions: a function's saved attributes are set only
    // where they differ from what it inherits from its kernel.
    for (const json& k : st_.value("kernels", json::array())) {
      ASSIGN_OR_RETURN(uint64_t kid, field<uint64_t>(k, "id", "kernel"));
      ASSIGN_OR_RETURN(uint64_t lid, field<uint64_t>(k, "library", "kernel"));
      ASSIGN_OR_RETURN(std::string name, field<std::string>(k, "name", "kernel"));
      auto* lib = static_cast<CUlibrary>(s_.handles_.resolve(HandleType::kCUlib_st, lid));
      CUkernel kernel = nullptr;
      if (lib == nullptr ||
          PHOS_DRIVER(d_, LibraryGetKernel)(&kernel, lib, name.c_str()) != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition, "kernel {} ({}) cannot be found again", name,
                         hex(kid));
      }
      const json perDevice = k.value("attributes", json::object());
      for (const auto& [device, attributes] : perDevice.items()) {
        const int dev = std::atoi(device.c_str());
        if (dev < 0 || dev >= s_.pool_.deviceCount()) {
          return makeError(Code::kFailedPrecondition,
                           "kernel {} ({}) has attributes for device {}, this host has {}", name,
                           hex(kid), device, s_.pool_.deviceCount());
        }
        RETURN_IF_ERROR(restoreAttributes(
            attributes, fmt::format("kernel {} ({}) on device {}", name, hex(kid), dev),
            [&](CUfunction_attribute a, int* v) {
              return PHOS_DRIVER(d_, KernelGetAttribute)(v, a, kernel, dev);
            },
            [&](CUfunction_attribute a, int v) {
              return PHOS_DRIVER(d_, KernelSetAttribute)(a, v, kernel, dev);
            }));
      }
      for (const json& own : k.value("functions", json::array())) {
        ASSIGN_OR_RETURN(uint64_t context, field<uint64_t>(own, "context", "kernel function"));
        RETURN_IF_ERROR(makeCurrent(context));
        CUfunction fn = nullptr;
        RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d_, KernelGetFunction)(&fn, kernel),
                                     fmt::format("kernel {} ({}) as a function of context {}", name,
                                                 hex(kid), hex(context))));
        RETURN_IF_ERROR(restoreAttributes(
            own.value("attributes", json::object()),
            fmt::format("kernel {} ({}) in context {}", name, hex(kid), hex(context)),
            [&](CUfunction_attribute a, int* v) {
              return PHOS_DRIVER(d_, FuncGetAttribute)(v, a, fn);
            },
            [&](CUfunction_attribute a, int v) {
              return PHOS_DRIVER(d_, FuncSetAttribute)(fn, a, v);
            }));
        s_.kernelFunctions_[kid].insert(context);
      }
      s_.handles_.bind(HandleType::kCUkern_st, kid, kernel);
    }
    return Status::ok();
  }

  Status functions() {
    for (const json& f : st_.value("functions", json::array())) {
      ASSIGN_OR_RETURN(uint64_t fid, field<uint64_t>(f, "id", "function"));
      ASSIGN_OR_RETURN(std::string name, field<std::string>(f, "name", "function"));
      const uint64_t context = f.value("context", uint64_t{0});
      if (context != 0) RETURN_IF_ERROR(makeCurrent(context));
      CUmodule mod = nullptr;
      if (f.contains("library")) {
        auto* lib = static_cast<CUlibrary>(
            s_.handles_.resolve(HandleType::kCUlib_st, f.value("library", uint64_t{0})));
        if (lib != nullptr && PHOS_DRIVER(d_, LibraryGetModule)(&mod, lib) != CUDA_SUCCESS)
          mod = nullptr;
      } else {
        ASSIGN_OR_RETURN(uint64_t mid, field<uint64_t>(f, "module", "function"));
        mod = static_cast<CUmodule>(s_.handles_.resolve(HandleType::kCUmod_st, mid));
      }
      CUfunction fn = nullptr;
      if (mod == nullptr ||
          PHOS_DRIVER(d_, ModuleGetFunction)(&fn, mod, name.c_str()) != CUDA_SUCCESS) {
        return makeError(Code::kFailedPrecondition, "function {} ({}) cannot be found again", name,
                         hex(fid));
      }
      RETURN_IF_ERROR(restoreAttributes(
          f.value("attributes", json::object()), fmt::format("function {} ({})", name, hex(fid)),
          [&](CUfunction_attribute a, int* v) {
            return PHOS_DRIVER(d_, FuncGetAttribute)(v, a, fn);
          },
          [&](CUfunction_attribute a, int v) {
            return PHOS_DRIVER(d_, FuncSetAttribute)(fn, a, v);
          }));
      s_.handles_.bind(HandleType::kCUfunc_st, fid, fn);
      if (context != 0) s_.contexts_.noteObject(fid, context);
    }
    return Status::ok();
  }

  Status pinned() {
    // Pinned memory: the same file path, mapped at the same address, and
    // registered with the driver again in its context.
    auto registerAgain = [&](const PinnedRange& r) -> Status {
      RETURN_IF_ERROR(makeCurrent(r.context));
      return driverStatus(PHOS_DRIVER(d_, MemHostRegister_v2)(reinterpret_cast<void*>(r.address), r.mapped,
                                                              CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
                          fmt::format("registering pinned memory at {} again", hex(r.address)));
    };
    RETURN_IF_ERROR(s_.pinned_.rebuild(reader_, st_.value("pinned", json::array()), s_.pid_, registerAgain));
    PHOS_DRIVER(d_, CtxSetCurrent)(nullptr);
    s_.currentReal_ = nullptr;
    return Status::ok();
  }

  Status hostCalls() {
    if (st_.contains("host_calls")) {
      const json& h = st_["host_calls"];
      ASSIGN_OR_RETURN(std::string path, field<std::string>(h, "path", "host_calls"));
      ASSIGN_OR_RETURN(size_t blob, blobOf(reader_, h, "host_calls"));
      RETURN_IF_ERROR(claimSessionPath(path, "", s_.pid_, s_.uid_));  // the ring is ours
      ASSIGN_OR_RETURN(auto channel, HostCallChannel::create(path, s_.uid_, s_.pid_));
      std::vector<std::byte> bytes(reader_.manifest().blobs[blob].size);
      RETURN_IF_ERROR(reader_.read(blob, 0, bytes));
      RETURN_IF_ERROR(channel->restoreBytes(bytes));
      std::lock_guard hostLock(s_.hostCallsMutex_);
      s_.hostCalls_ = std::move(channel);
    }
    return Status::ok();
  }

  struct EagerCopy {
    uint64_t context;
    int device;
    size_t blob;
    CUdeviceptr address;
  };

  Session& s_;
  const DriverTable& d_;
  SessionScope scope_;
  const image::ImageReader& reader_;
  const json& st_;
  const ProgressFn& progress_;
  std::vector<DeviceBuffer>* deferred_;  // null: the bytes are copied here
  std::optional<PhaseProgress> phase_;
  std::string ringPath_;
  size_t ringBlob_ = 0;
  std::optional<ipc::CallRing> created_;  // the ring, locked; its contents come last
  std::optional<DeviceMemory::Restore> memory_;  // from the ranges on
  std::vector<EagerCopy> eagerCopies_;  // after the modules
  std::map<int, std::unique_ptr<ChunkCopier>> copiers_;
};

Status Session::rebuildFrom(const image::ImageReader& reader, const json& state,
                            const ProgressFn& progress, std::vector<DeviceBuffer>* deferred) {
  return Rebuilder(*this, reader, state, progress, deferred).run();
}

}  // namespace phos::daemon
