// SPDX-License-Identifier: Apache-2.0
// LaunchValidator: a session's speculation of each launch's read/write buffers and,
// while validation is on, the twin launches that check it (docs/speculation.md).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "phos/common/status.h"
#include "phos/instrument/access_bounds.h"
#include "phos/instrument/signature.h"
#include "phos/instrument/speculation.h"
#include "phos/instrument/twin.h"
#include "session/driver_jit_options.h"
#include "session/driver_table.h"

namespace phos::daemon {

// What one API call will read and write of the session's GPU state (device
// allocations, module globals, pinned host ranges), known before the call runs
// (docs/checkpoint.md): exact byte ranges for the APIs whose specification says
// them (copies, sets), for kernels the buffers speculated from the arguments,
// narrowed to the bytes the launch can reach (access_bounds.h): may-write, not
// must-write.
// Application memory that is not pinned is CPU state and not listed.
struct CallAccess {
  std::vector<instrument::Buffer> reads;   // [base, base + size)
  std::vector<instrument::Buffer> writes;  // may also be read
  bool kernel = false;      // speculated from a launch's arguments
  bool incomplete = false;  // the kernel reaches memory speculation cannot name
  bool unchecked = false;   // a launch that runs without a twin: nothing checks its writes
  bool everything = false;  // may end any of it (a module unloaded, a context destroyed)
  bool ends = false;        // ends what it writes (a free): its bytes matter no more
  // Every byte of `writes` is written (a copy or set of one range). A 2D or
  // 3D copy or set names the span from its first row to its last, gaps
  // included, and a kernel its whole buffers: what they do not write keeps
  // the bytes it had, so a protocol may not take the span as overwritten.
  bool overwrites = false;

  // Whether the call may write beyond `writes`: a protocol must assume it
  // writes every buffer.
  bool mayWriteAnything() const { return everything || (kernel && (incomplete || unchecked)); }
};

// Called on a session's serving thread before each call that touches GPU
// state, with what it touches; it may block the call (a copy-on-write
// protocol copies the buffers first). Installed by the checkpoint and restore
// protocols for their windows.
using AccessGate = std::function<void(const CallAccess&)>;

// What phosd made of one module image: the signature of each kernel and,
// when the image is PTX the passes could instrument, its twin module
// (docs/twins.md). The program gets its own image, unchanged; the twin module
// is loaded beside it, in each context a twin runs in, when the first twin of
// it is needed.
struct PreparedModule {
  std::string twinText;  // NUL-terminated PTX of the twin module; empty: no twins
  std::map<std::string, instrument::KernelSignature, std::less<>> signatures;
  // Of each kernel with a signature: what narrows its speculated buffers to
  // the bytes its accesses reach (none when PHOS_SPECULATION_BOUNDS=0).
  std::map<std::string, std::shared_ptr<const instrument::AccessBounds>, std::less<>> bounds;
  instrument::TwinStats stats;
  std::string note;  // why there are no twins or signatures, for the log
};

// Declarations from the application's sources (`phosd --signatures`), applied
// to every module prepared after this call; set once, before workers fork.
void setSignatureDatabase(std::shared_ptr<const instrument::SignatureDatabase> database);

// Parses, analyses and instruments `image` (cached by content: a module loaded
// again, or re-loaded at restore, is prepared once per process). Never fails: an
// image it cannot handle gets no twins and no signatures, and says why.
std::shared_ptr<const PreparedModule> prepareModule(std::span<const char> image);

// cuModuleLoadDataEx / cuLibraryLoadData of `image` (NUL-terminated), the
// program's own image, with the program's JIT options (none when `jit` is
// null), and its preparation (signatures, twin module text) in `prepared`.
// The twin module is loaded later, by LaunchValidator.
CUresult loadModule(const DriverTable& driver, const std::vector<char>& image, CUmodule* module,
                    std::shared_ptr<const PreparedModule>* prepared,
                    DriverJitOptions* jit = nullptr);
CUresult loadLibrary(const DriverTable& driver, const std::vector<char>& image, CUlibrary* library,
                     std::shared_ptr<const PreparedModule>* prepared,
                     DriverJitOptions* jit = nullptr);

// Whether launches run as twins, and what happens to what they report.
enum class ValidationMode : uint8_t {
  kOff,              // originals run; speculation is still computed on demand
  kValidate,         // every launch with a twin runs the twin against its speculated sets
  kValidateRestore,  // the same with the restore twins, which check loads too
};

// A reported access outside the speculated sets.
struct Violation {
  std::string kernel;
  uint64_t address = 0;
  uint32_t instruction = 0;
  uint32_t function = 0;
  uint32_t size = 0;
  instrument::ViolationKind kind = instrument::ViolationKind::kStore;
};

struct ValidationCounters {
  uint64_t launches = 0;          // launches served while validating
  uint64_t twinLaunches = 0;      // of which ran as twins
  uint64_t unvalidated = 0;       // of which had no twin (no PTX, or the passes refused)
  uint64_t incomplete = 0;        // launches whose signature says it reaches unnamed memory
  uint64_t violations = 0;        // reported accesses (also those past a report's capacity)
  uint64_t misspeculatedKernels = 0;  // collections in which a kernel reported at least one access
};

class LaunchValidator {
 public:
  explicit LaunchValidator(const DriverTable& driver) : driver_(driver) {}
  ~LaunchValidator();
  LaunchValidator(const LaunchValidator&) = delete;
  LaunchValidator& operator=(const LaunchValidator&) = delete;

  // Module life cycle (the driver's handles). A library's kernels are found by
  // name among the libraries' prepared modules. Forgetting a module or library
  // unloads the twin modules loaded beside it.
  void noteModule(CUmodule module, std::shared_ptr<const PreparedModule> prepared);
  void noteLibrary(CUlibrary library, std::shared_ptr<const PreparedModule> prepared);
  void forgetModule(CUmodule module);
  void forgetLibrary(CUlibrary library);

  void setMode(ValidationMode mode) { mode_ = mode; }

  // Loads the twin module beside every noted module now, each in the context it
  // was loaded in (a library's beside its module in the context current when
  // it was noted; in other contexts at its first twin launch there), so that
  // the first launches of a window do not wait for the twins' compilation. A
  // restore calls it before the job runs again; otherwise a twin launch
  // loads what it needs.
  void loadTwinModules();

  // The same in three steps, so that a checkpoint loads the twin modules
  // before its window while the application runs on
  // (Session::prepareTwinModules): what is to be loaded (under the
  // session's lock), each loaded (driver calls only: no lock), each kept
  // (under the lock; unloaded if the program's module went meanwhile or a
  // launch loaded its twins first).
  struct TwinLoad {
    CUmodule module = nullptr;  // the program's module the twins go beside
    const void* owner = nullptr;
    CUcontext context = nullptr;
    std::shared_ptr<const PreparedModule> prepared;
    std::string what;  // one of its kernels, for the log
    std::string image;  // compiled by the JIT helper (jit_helper.h); empty: the driver compiles the PTX
    CUmodule twins = nullptr;
    bool loaded = false;
  };
  std::vector<TwinLoad> twinLoadsPending();
  void loadTwins(TwinLoad& load) const;
  void keepTwins(const TwinLoad& load);
  ValidationMode mode() const { return mode_; }

  // The signature of `function` (nullptr: none known). A context must be current.
  const instrument::KernelSignature* signatureOf(CUfunction function);
  // Whether `function` has a twin that launchTwin() runs in this mode. A
  // context must be current.
  bool hasTwin(CUfunction function) { return twinFor(stateOf(function)) != nullptr; }

  // The speculated sets of launching `function` with `params` (kernelParams
  // pointers, or the packed `extra` buffer when `packed` is not empty), matched
  // against `buffers`. A kernel without signature gets the opaque speculation.
  // With the launch's `shape`, the buffers are narrowed to the bytes the
  // kernel's accesses can reach (access_bounds.h); without, they stay whole.
  instrument::LaunchAccessSet speculate(CUfunction function, void** kernelParams,
                                        std::span<const std::byte> packed,
                                        const instrument::BufferLookup& buffers,
                                        const instrument::LaunchShape* shape = nullptr);

  // Launches the twin of `function` instead of it, checking against `sets`.
  // Returns CUDA_ERROR_NOT_FOUND when the function has no twin (the caller
  // launches the original). `launch` gets the twin and its parameters.
  using LaunchFn = std::function<CUresult(CUfunction twin, void** params, void** extra)>;
  CUresult launchTwin(CUfunction function, void** kernelParams, std::span<const std::byte> packed,
                      CUstream stream, const instrument::LaunchAccessSet& sets, const LaunchFn& launch);

  // Counts a launch served while validating (with or without twin).
  void noteLaunch(bool twin, bool incomplete);

  // Reads (and clears) the report buffers of every twin launched so far. The
  // session's work must be finished (the caller synchronized its contexts).
  std::vector<Violation> collect();
  // Frees the report buffers (after collect()): outside a protocol's window
  // they would hold device memory the application may need. The next twin
  // launch allocates its kernel's again.
  void releaseReports();
  const ValidationCounters& counters() const { return counters_; }
  // {"mode", counters..., "violations": [...]} for `phos validate`.
  nlohmann::json report(const std::vector<Violation>& recent) const;

  // Frees the report buffers of the kernels of `context` (about to be
  // destroyed) and unloads its twin modules or, with null, those of every
  // context.
  void release(CUcontext context);

  // The twin modules loaded so far (tests, logs).
  size_t twinModuleCount() const;

 private:
  // A kernel as phosd knows it: its twin (resolved on first use) and the
  // report buffer its twin launches write, one per kernel so that a report
  // names its kernel.
  struct KernelState {
    bool resolved = false;
    bool twinResolved = false;  // the twins were looked for (resolveTwin)
    std::string name;
    std::shared_ptr<const PreparedModule> prepared;  // keeps the signature alive
    const void* owner = nullptr;  // the CUmodule or CUlibrary it came from
    CUmodule module = nullptr;    // the program's module holding it (a library's, in its context)
    const instrument::KernelSignature* signature = nullptr;
    const instrument::AccessBounds* bounds = nullptr;
    CUfunction twin = nullptr;         // null: none
    CUfunction restoreTwin = nullptr;  // the one that checks loads too; same parameters
    CUcontext context = nullptr;
    std::vector<size_t> twinOffsets;  // the twin's parameters (the three extra last)
    size_t twinParamBytes = 0;
    CUdeviceptr report = 0;
  };
  // A twin module loaded beside one of the program's modules.
  struct TwinModule {
    CUmodule module = nullptr;  // null: refused by the driver, or its table could not be filled
    const void* owner = nullptr;  // as KernelState::owner
    CUcontext context = nullptr;
  };

  KernelState& stateOf(CUfunction function);
  // Finds the twins of `k` (loading its twin module when needed).
  void resolveTwin(KernelState& k);
  // The twin module beside `k.module`, loaded and its address table filled on
  // first use; null when there is none.
  CUmodule twinModuleFor(const KernelState& k);
  CUmodule twinModuleFor(CUmodule module, const void* owner, const PreparedModule& prepared, std::string_view what);
  CUmodule compileTwins(CUmodule module, const PreparedModule& prepared, std::string_view what,
                        const std::string* image = nullptr) const;
  Status fillGlobalTable(CUmodule twins, CUmodule original, const std::vector<std::string>& globals) const;
  // The library among those noted whose module in the current context is
  // `module`; by kernel name alone when the driver cannot tell.
  std::pair<CUlibrary, std::shared_ptr<const PreparedModule>> libraryOf(CUmodule module, const std::string& kernel);
  template <typename Which>
  void unloadTwinModules(Which which);
  CUfunction twinFor(KernelState& k) {
    resolveTwin(k);
    return mode_ == ValidationMode::kValidateRestore ? k.restoreTwin : k.twin;
  }
  void dropKernelsOf(const void* owner);

  const DriverTable& driver_;
  ValidationMode mode_ = ValidationMode::kOff;
  std::map<CUmodule, std::shared_ptr<const PreparedModule>> modules_;
  // Current when the module or library was noted.
  std::map<CUmodule, CUcontext> moduleContexts_;
  std::map<CUlibrary, CUcontext> libraryContexts_;
  std::map<CUlibrary, std::shared_ptr<const PreparedModule>> libraries_;
  std::map<CUfunction, KernelState> kernels_;
  // Keyed by the program's module the twins run beside.
  std::map<CUmodule, TwinModule> twinModules_;
  ValidationCounters counters_;
};

}  // namespace phos::daemon
