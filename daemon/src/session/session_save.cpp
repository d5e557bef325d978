// SPDX-License-Identifier: Apache-2.0
// A session at a checkpoint: what the engine (engine.cpp) asks of it. What a
// checkpoint writes of its objects (Session::describe), domain by domain: the
// description a restore makes each object again from (session_rebuild.cpp),
// the device memory to copy into the image, and the files it shares with its
// process (describeShared); the windows of the concurrent protocols.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "session/module_globals.h"
#include "session/host_calls.h"
#include "phos/common/log.h"
#include "phos/image/writer.h"
#include "session/session.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

class Session::Describer {
 public:
  Describer(Session& s, image::ImageWriter& writer, json& state, std::vector<DeviceBuffer>& copies)
      : s_(s),
        d_(s.driver_),
        scope_{s.driver_, s.handles_, s.contexts_, s.currentContext_},
        writer_(writer),
        state_(state),
        copies_(copies) {}

  Status run() {
    state_ = {{"session", s_.id_},      {"pid", s_.pid_},
              {"uid", s_.uid_},         {"driver", d_.path()},
              {"worker_pid", getpid()}, {"handles_last_serial", s_.handles_.lastSerial()}};
    RETURN_IF_ERROR(contexts());
    // The stream-ordered allocator's pools (memory_pools.h).
    s_.memoryPools_.save(s_, state_);
    // What is copied: allocations, then module globals (modules()).
    RETURN_IF_ERROR(s_.memory_.save(writer_, state_, copies_));
    RETURN_IF_ERROR(modules());
    libraryModules();
    functions();
    kernels();
    RETURN_IF_ERROR(s_.streamsAndEvents_.save(scope_, state_));
    unsaved();
    // A checkpoint that cannot save an object the program holds fails, naming
    // it, rather than publish an image whose restore would run wrong.
    if (!lost_.empty()) {
      std::string named;
      for (const json& l : lost_) {
        if (!named.empty()) named += "; ";
        named += fmt::format("{} ({})", l["what"].get<std::string>(), hex(l["id"].get<uint64_t>()));
      }
      return makeError(Code::kFailedPrecondition,
                       "the checkpoint cannot save {} object{} the program holds: {}", lost_.size(),
                       lost_.size() == 1 ? "" : "s", named);
    }
    // An error of a posted call not reported yet: the next synchronizing call
    // of the restored process reports it, as it would have.
    state_["deferred_error"] = static_cast<int>(s_.deferred_);
    // `phos run --validate`: the restored session validates as well.
    state_["validate"] = s_.validator_.mode() == ValidationMode::kValidate;
    return Status::ok();
  }

 private:
  // Every context, drained: nothing may write device memory while it is
  // copied. Its flags, limits and cache preference; the primary contexts'
  // references.
  Status contexts() {
    RETURN_IF_ERROR(s_.drainContexts());
    RETURN_IF_ERROR(s_.contexts_.save(d_, state_));
    s_.currentReal_ = nullptr;  // changed above; the next call makes its own current
    return Status::ok();
  }

  Status modules() {
    json modules = json::array();
    for (const auto& [id, rec] : s_.moduleRecords_) records_.emplace_back(id, &rec);
    std::sort(records_.begin(), records_.end(), [](const auto& a, const auto& b) {
      return HandleTable::serialOf(a.first) < HandleTable::serialOf(b.first);
    });
    for (const auto& [id, rec] : records_) {
      const HandleType type = rec->library ? HandleType::kCUlib_st : HandleType::kCUmod_st;
      void* real = s_.handles_.resolve(type, id);
      if (real == nullptr) continue;
      std::string name = fmt::format("module/{}", hex(id));
      ASSIGN_OR_RETURN(size_t imageBlob,
                       writer_.addBlob(name, "module-image", rec->image.size(),
                                       {{"module", id}, {"library", rec->library}}));
      RETURN_IF_ERROR(writer_.writeBlob(imageBlob, std::as_bytes(std::span(rec->image))));
      const int device = s_.contexts_.deviceOf(rec->context, 0);
      json globals = json::array();
      json entry = {{"id", id},
                    {"library", rec->library},
                    {"context", rec->context},
                    {"image", name},
                    {"order", rec->order}};
      // Every global of every kind of image (PTX, fatbin, cubin), in every
      // context that has its own copy: a module's, or, for a library
      // (context-independent), each context of the session's_.
      std::shared_ptr<const std::vector<std::string>> names = rec->globalNames;
      if (names == nullptr) {  // loaded since listModuleGlobals ran
        auto listed = moduleGlobalNames(rec->image);
        if (!listed.isOk()) {
          return makeError(Code::kNotSupported,
                           "the globals of module {} cannot be listed, so they cannot be saved: {}",
                           hex(id), listed.status().message());
        }
        names = std::make_shared<const std::vector<std::string>>(std::move(*listed));
      }
      std::vector<uint64_t> holders;
      if (rec->library) {
        for (const auto& [cid, ctx] : s_.contexts_) holders.push_back(cid);
      } else {
        holders.push_back(rec->context);
      }
      for (uint64_t holder : holders) {
        const SessionContext* ctx = s_.contexts_.find(holder);
        if (ctx == nullptr) continue;
        PHOS_DRIVER(d_, CtxSetCurrent)(ctx->real);
        for (const std::string& g : *names) {
          CUdeviceptr address = 0;
          size_t bytes = 0;
          CUresult r = rec->library ? PHOS_DRIVER(d_, LibraryGetGlobal)(
                                          &address, &bytes, static_cast<CUlibrary>(real), g.c_str())
                                    : PHOS_DRIVER(d_, ModuleGetGlobal_v2)(
                                          &address, &bytes, static_cast<CUmodule>(real), g.c_str());
          if (r == CUDA_ERROR_NO_BINARY_FOR_GPU)
            break;  // no code for this device: nothing runs, nothing to save
          if (r != CUDA_SUCCESS) {
            return makeError(Code::kNotSupported,
                             "global {} of module {} cannot be read (CUresult {})", g, hex(id),
                             static_cast<int>(r));
          }
          if (bytes == 0) continue;
          const Allocation* taken = s_.memory_.find(address);
          std::string blobName = fmt::format("global/{}/{}/{}", hex(id), hex(holder), g);
          ASSIGN_OR_RETURN(size_t blob,
                           writer_.addBlob(blobName, "module-global", bytes,
                                           {{"module", id}, {"name", g}, {"address", address}}));
          copies_.push_back({blob, address, bytes, nullptr, ctx->device});
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
    state_["modules"] = modules;
    return Status::ok();
  }

  // Functions, kernels, library modules, streams and events: how to make
  // each again, by the id the application holds.

  // The library whose module in some context `m` is; 0 for none.
  uint64_t libraryOfModule(CUmodule m) {
    for (const auto& [id, rec] : records_) {
      if (!rec->library) continue;
      auto* lib = static_cast<CUlibrary>(s_.handles_.resolve(HandleType::kCUlib_st, id));
      CUmodule lm = nullptr;
      if (lib != nullptr && PHOS_DRIVER(d_, LibraryGetModule)(&lm, lib) == CUDA_SUCCESS && lm == m)
        return id;
    }
    return 0;
  }

  void libraryModules() {
    json libraryModules = json::array();
    for (uint64_t id : s_.handles_.ids(HandleType::kCUmod_st)) {
      if (s_.moduleRecords_.count(id) != 0) continue;
      auto* m = static_cast<CUmodule>(s_.handles_.resolve(HandleType::kCUmod_st, id));
      if (const SessionContext* ctx = s_.contexts_.find(s_.contextOf(id)); ctx != nullptr) {
        PHOS_DRIVER(d_, CtxSetCurrent)(ctx->real);
      }
      if (uint64_t lib = libraryOfModule(m); lib != 0) {
        libraryModules.push_back({{"id", id}, {"library", lib}, {"context", s_.contextOf(id)}});
      } else {
        lost_.push_back({{"id", id}, {"what", "a module phosd did not load itself"}});
      }
    }
    state_["library_modules"] = libraryModules;
  }

  void functions() {
    json functions = json::array();
    for (uint64_t id : s_.handles_.ids(HandleType::kCUfunc_st)) {
      auto* f = static_cast<CUfunction>(s_.handles_.resolve(HandleType::kCUfunc_st, id));
      const char* fname = nullptr;
      CUmodule m = nullptr;
      if (PHOS_DRIVER(d_, FuncGetName)(&fname, f) != CUDA_SUCCESS ||
          PHOS_DRIVER(d_, FuncGetModule)(&m, f) != CUDA_SUCCESS) {
        lost_.push_back({{"id", id}, {"what", "a function the driver cannot name"}});
        continue;
      }
      json entry = {{"id", id}, {"name", fname}, {"context", s_.contextOf(id)}};
      if (uint64_t mid = s_.handles_.idOf(m);
          mid != 0 && HandleTable::typeOf(mid) == HandleType::kCUmod_st) {
        entry["module"] = mid;
      } else if (uint64_t lib = libraryOfModule(m); lib != 0) {
        entry["library"] = lib;  // cuKernelGetFunction: the library's module in this context
      } else {
        lost_.push_back(
            {{"id", id},
             {"what", fmt::format("function {} of a module phosd did not load", fname)}});
        continue;
      }
      json attributes = settableAttributes([&](CUfunction_attribute a, int* v) {
        return PHOS_DRIVER(d_, FuncGetAttribute)(v, a, f);
      });
      if (!attributes.empty()) entry["attributes"] = attributes;
      functions.push_back(entry);
    }
    state_["functions"] = functions;
  }

  void kernels() {
    json kernels = json::array();
    for (uint64_t id : s_.handles_.ids(HandleType::kCUkern_st)) {
      auto* k = static_cast<CUkernel>(s_.handles_.resolve(HandleType::kCUkern_st, id));
      const char* kname = nullptr;
      CUlibrary lib = nullptr;
      if (PHOS_DRIVER(d_, KernelGetName)(&kname, k) != CUDA_SUCCESS ||
          PHOS_DRIVER(d_, KernelGetLibrary)(&lib, k) != CUDA_SUCCESS) {
        lost_.push_back({{"id", id}, {"what", "a kernel the driver cannot name"}});
        continue;
      }
      // Per device: cuKernelSetAttribute applies to the kernel's functions in
      // every context of one device.
      json perDevice = json::object();
      for (int dev = 0; dev < s_.pool_.deviceCount(); ++dev) {
        json attributes = settableAttributes([&](CUfunction_attribute a, int* v) {
          return PHOS_DRIVER(d_, KernelGetAttribute)(v, a, k, dev);
        });
        if (!attributes.empty()) perDevice[std::to_string(dev)] = attributes;
      }
      // The kernel's function in a context where the program set attributes
      // of its own (cuFuncSetAttribute on the kernel's handle): those that
      // differ from the kernel's on that device. They override the kernel's,
      // whenever the program set them (cuKernelSetAttribute's documentation).
      json ownFunctions = json::array();
      if (auto used = s_.kernelFunctions_.find(id); used != s_.kernelFunctions_.end()) {
        for (uint64_t context : used->second) {
          const SessionContext* ctx = s_.contexts_.find(context);
          CUfunction f = nullptr;
          if (ctx == nullptr || PHOS_DRIVER(d_, CtxSetCurrent)(ctx->real) != CUDA_SUCCESS ||
              PHOS_DRIVER(d_, KernelGetFunction)(&f, k) != CUDA_SUCCESS) {
            continue;
          }
          const json kernelLevel =
              perDevice.value(std::to_string(ctx->device), json::object());
          const json now = settableAttributes([&](CUfunction_attribute a, int* v) {
            return PHOS_DRIVER(d_, FuncGetAttribute)(v, a, f);
          });
          json own = json::object();
          for (const auto& [name, value] : now.items()) {
            if (kernelLevel.value(name, json()) != value) own[name] = value;
          }
          if (!own.empty()) ownFunctions.push_back({{"context", context}, {"attributes", own}});
        }
      }
      json entry = {{"id", id},
                    {"library", s_.handles_.idOf(lib)},
                    {"name", kname},
                    {"attributes", perDevice}};
      if (!ownFunctions.empty()) entry["functions"] = ownFunctions;
      kernels.push_back(entry);
    }
    state_["kernels"] = kernels;
  }

  // Objects of a kind the engine does not save (a kind remoted later and
  // not taught to the engine): restored, the program would hold handles
  // that name nothing.
  void unsaved() {
    static const std::set<HandleType> kSaved = {
        HandleType::kCUctx_st,           HandleType::kCUevent_st, HandleType::kCUfunc_st,
        HandleType::kCUkern_st,          HandleType::kCUlib_st,   HandleType::kCUmod_st,
        HandleType::kCUmemPoolHandle_st, HandleType::kCUstream_st};
    for (HandleType type : s_.handles_.liveTypes()) {
      if (kSaved.count(type) != 0) continue;
      for (uint64_t id : s_.handles_.ids(type)) {
        lost_.push_back(
            {{"id", id},
             {"what", fmt::format("an object of handle type {}, which the engine does not save",
                                  static_cast<int>(type))}});
      }
    }
  }

  Session& s_;
  const DriverTable& d_;
  SessionScope scope_;
  image::ImageWriter& writer_;
  json& state_;
  std::vector<DeviceBuffer>& copies_;
  std::vector<std::pair<uint64_t, const ModuleRecord*>>
      records_;                // modules and libraries, in creation order
  json lost_ = json::array();  // what cannot be saved (refused at the end)
};

Status Session::describe(image::ImageWriter& writer, json& state,
                         std::vector<DeviceBuffer>& copies) {
  return Describer(*this, writer, state, copies).run();
}


Status Session::drainContexts() {
  Status drained = contexts_.drain(driver_);
  currentReal_ = nullptr;  // the next call makes its own current
  return drained;
}

std::vector<DeviceBuffer> Session::allocationList() const { return memory_.buffers(contexts_); }

std::map<int, CUcontext> Session::contextsByDevice() const { return contexts_.byDevice(); }

void Session::openWindow(AccessGate gate, ValidationMode twins) {
  setAccessGate(std::move(gate));
  validator_.setMode(twins);
  transfers_.track(true);
}

std::vector<Violation> Session::closeWindow(ValidationMode after) {
  (void)drainContexts();  // a context's sticky error is the application's to see
  std::vector<Violation> found = validator_.collect();
  if (after == ValidationMode::kOff) validator_.releaseReports();
  setAccessGate({});
  setMemoryRelief({});
  validator_.setMode(after);
  transfers_.track(false);
  return found;
}

// Parsing a large module's PTX took most of CuPy's pause
// (docs/checkpoint.md): the images are copied under the mutex and parsed
// without it; a module that cannot be read is left for describe() to refuse.
void Session::listModuleGlobals() {
  std::vector<std::pair<uint64_t, std::vector<char>>> unlisted;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [id, rec] : moduleRecords_) {
      if (rec.globalNames == nullptr) unlisted.emplace_back(id, rec.image);
    }
  }
  for (auto& [id, image] : unlisted) {
    auto names = moduleGlobalNames(image);
    if (!names.isOk()) continue;
    auto listed = std::make_shared<const std::vector<std::string>>(std::move(*names));
    std::lock_guard lock(mutex_);
    // The same module still: ids are never reused.
    if (auto rec = moduleRecords_.find(id); rec != moduleRecords_.end()) rec->second.globalNames = listed;
  }
}

Status Session::describeShared(image::ImageWriter& writer, json& state, uint64_t& bytes,
                               const ProgressFn& progress) {
  if (auto lane = busyLane()) {
    return makeError(Code::kFailedPrecondition,
                     "a thread of pid {} is inside a copy through transfer lane {} of its ring, which phosd "
                     "gave up on (the thread was stopped in it?): the image could not give the thread the "
                     "lane's bytes back; checkpoint again once the copy has returned",
                     pid_, *lane);
  }
  const uint64_t total = pinned_.bytes();
  PhaseProgress phase(progress, "pinned", total);
  phase.start();
  ASSIGN_OR_RETURN(state["pinned"], pinned_.save(writer, phase));
  bytes += total;
  if (ring_.has_value()) {
    auto snap = ring_->snapshot();
    const ipc::RingGeometry& geometry = ring_->geometry();
    ASSIGN_OR_RETURN(size_t blob, writer.addBlob("session/ring", "call-ring", snap.bytes.size()));
    RETURN_IF_ERROR(writer.writeBlob(blob, snap.bytes));
    state["ring"] = {{"path", ringPath_},
                     {"blob", "session/ring"},
                     {"read_position", snap.readPosition},
                     {"slot_count", geometry.slotCount},
                     {"slot_bytes", geometry.slotBytes},
                     {"lane_count", geometry.laneCount},
                     {"lane_slot_bytes", geometry.laneSlotBytes}};
  }
  std::lock_guard lock(hostCallsMutex_);
  if (hostCalls_ != nullptr) {
    auto queue = hostCalls_->bytes();
    ASSIGN_OR_RETURN(size_t blob, writer.addBlob("session/hostcalls", "host-call-queue", queue.size()));
    RETURN_IF_ERROR(writer.writeBlob(blob, queue));
    state["host_calls"] = {{"path", hostCalls_->path()}, {"blob", "session/hostcalls"}};
  }
  return Status::ok();
}

}  // namespace phos::daemon
