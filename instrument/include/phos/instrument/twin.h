// SPDX-License-Identifier: Apache-2.0
// Validator twins: a copy of each kernel that checks the address of every global
// store, atomic and reduction (and, for restore, every load) against a table of
// allowed ranges and reports violations, computing exactly what the original does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"
#include "phos/instrument/speculation.h"
#include "phos/ptx/ast.h"

namespace phos::instrument {

// What the twin checks.
enum class TwinMode : uint8_t {
  kCheckpoint,  // stores, atomics and reductions (writes)
  kRestore,     // also every load (reads)
};

// The twin ABI, shared by the generator (passes/), phosd and the tests.
//
// buildTwinModule returns a *twin module*, loaded beside the original module
// (which the program keeps running as it is): a twin of entry K is the entry
// `K + kTwinSuffix` in it, with K's parameters followed by three more:
//   .param .u64 __phos_ranges        device address of RangeEntry[count]
//   .param .u32 __phos_range_count
//   .param .u64 __phos_report        device address of a ReportHeader + entries
// Device functions that (transitively) access memory get a twin copy
// (`F + kTwinSuffix`) taking the same three values as extra trailing parameters;
// the twin entry calls those copies.
inline constexpr std::string_view kTwinSuffix = "__phos_twin";
// The restore-mode twins TwinOptions::restoreTwinsToo adds next to the
// checkpoint twins: `K + kRestoreTwinSuffix`, with the same parameters.
inline constexpr std::string_view kRestoreTwinSuffix = "__phos_rtwin";

// The twin module holds no .global or .const variable of the original: twins
// must read and write the original module's (a __device__ pointer one kernel
// sets and another uses), so every reference to one goes through this table,
//   .const .align 8 .u64 __phos_globals[N];
// whose slot i the loader sets, after loading both modules, to the device
// address cuModuleGetGlobal gives for TwinStats::globals[i] in the original
// module (in the same context). Absent when the twins use no such variable.
inline constexpr std::string_view kGlobalTable = "__phos_globals";

// One allowed range, [begin, end), with what may be done in it. Entries are sorted
// by begin and do not overlap.
struct RangeEntry {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint32_t access = 0;  // bit 0: loads allowed, bit 1: stores allowed (Access)
  uint32_t reserved = 0;
};
static_assert(sizeof(RangeEntry) == 24);

// The range table of a launch's speculated sets: reads may be loaded, writes
// loaded and stored. The sets' ranges may overlap (a buffer read whole and
// written in part, access_bounds.h): each stretch gets the union of the
// access bits of the ranges covering it, adjacent stretches with the same
// bits are one entry.
std::vector<RangeEntry> rangeTable(const LaunchAccessSet& sets);

// The report buffer: a header, then `capacity` entries. A violating access does
// atom.global.add.u32 on `count` and writes its entry if the old count is below
// `capacity`; `count` keeps counting past it (so overflow is visible).
struct ReportHeader {
  uint32_t count = 0;
  uint32_t capacity = 0;  // set by the host before the launch
};
static_assert(sizeof(ReportHeader) == 8);

enum class ViolationKind : uint32_t { kLoad = 1, kStore = 2, kAtomic = 3 };

struct ReportEntry {
  uint64_t address = 0;      // first byte of the access
  uint32_t instruction = 0;  // index of the access among the original function's
                             // instructions (ResolvedFunction order), see below
  uint32_t kind = 0;         // ViolationKind
  uint32_t function = 0;     // index of the function in the module (0-based, in
                             // source order): the entry itself or a .func it calls.
                             // Every ptx::Function item counts, declarations too.
  uint32_t size = 0;         // bytes accessed
};
static_assert(sizeof(ReportEntry) == 24);

struct TwinOptions {
  TwinMode mode = TwinMode::kCheckpoint;
  // Also add a restore-mode twin of every kernel (kRestoreTwinSuffix), so
  // that one module serves checkpoint windows and restore windows (phosd).
  bool restoreTwinsToo = false;
};

// What the generator did, for logs, tests and the benchmark (with
// restoreTwinsToo: the counts of both sets of twins, the kernels of both lists).
struct TwinStats {
  uint32_t kernels = 0;         // twin entries added
  uint32_t functions = 0;       // .func twins added
  uint32_t checkedStores = 0;   // st/atom/red sites instrumented
  uint32_t checkedLoads = 0;    // ld sites instrumented (restore mode)
  // Accesses that cannot be checked: calls through a function pointer or to a
  // .func without a body (extern, -rdc), whose stores stay unchecked; the kernel
  // names are listed so phosd can fall back to stop-the-world for them.
  uint32_t uncheckedCalls = 0;
  // Global accesses the range check cannot describe (wmma.store, multimem, surface
  // and tensor-map writes, ...); their kernels are listed below as well.
  uint32_t uncheckedAccesses = 0;
  std::vector<std::string> kernelsWithUncheckedCalls;
  // The original module's variables the twin module uses, in the order of the
  // slots of kGlobalTable.
  std::vector<std::string> globals;
};

// Returns the twin module of `module`: a twin of every .entry, the .func twins
// and original .funcs they call, and the check function, built by the passes in
// instrument/src/passes/ in order, to be loaded beside `module` with its
// kGlobalTable filled (docs/twins.md). Fails with kInvalidArgument on a module
// the passes cannot handle (naming function and line).
Result<ptx::Module> buildTwinModule(const ptx::Module& module, const TwinOptions& options,
                                    TwinStats* stats = nullptr);

// The twin name of a kernel or device function.
inline std::string twinName(std::string_view original, std::string_view suffix = kTwinSuffix) {
  return std::string(original) + std::string(suffix);
}

// Whether `name` is the name of a twin (of either set): hidden from the
// application's enumerations, refused as an input name.
inline bool isTwinName(std::string_view name) {
  return name.ends_with(kTwinSuffix) || name.ends_with(kRestoreTwinSuffix);
}

}  // namespace phos::instrument
