// SPDX-License-Identifier: Apache-2.0
// The validator-twin passes and the state they hand to each other; twin.cpp runs
// them in the order declared here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <variant>
#include <vector>

#include "phos/common/status.h"
#include "phos/instrument/check_function.h"
#include "phos/instrument/twin.h"
#include "phos/ptx/ast.h"

namespace phos::instrument::passes {

// Names the passes add. Every one starts with "__phos" so that clone_twins can
// refuse modules that already use the prefix instead of producing clashes.
inline constexpr std::string_view kReservedPrefix = "__phos";
inline constexpr std::string_view kRangesParam = "__phos_ranges";
inline constexpr std::string_view kRangeCountParam = "__phos_range_count";
inline constexpr std::string_view kReportParam = "__phos_report";
// Registers holding the three values inside every twin.
inline constexpr std::string_view kRangesReg = "%__phos_ranges";
inline constexpr std::string_view kRangeCountReg = "%__phos_range_count";
inline constexpr std::string_view kReportReg = "%__phos_report";
// Scratch registers for the effective address and (wmma) size of the access
// being checked.
inline constexpr std::string_view kAddressReg = "%__phos_addr";
inline constexpr std::string_view kSizeReg = "%__phos_size";
// The generated range-check function (one per module, not visible outside it).
inline constexpr std::string_view kCheckFunction = kCheckFunctionName;
// Registers holding the address of an original module variable, loaded from the
// twin module's address table (kGlobalTable in twin.h) by share_globals.
inline constexpr std::string_view kGlobalAddressReg = "%__phos_global";

// Bits of the `flags` argument of the check function.
inline constexpr uint32_t kFlagKindMask = kCheckFlagKindMask;
inline constexpr uint32_t kFlagNeedShift = kCheckFlagNeedShift;
inline constexpr uint32_t kFlagGlobalSpace = kCheckFlagGlobalSpace;
inline constexpr uint32_t kFlagGeneric = kCheckFlagGeneric;

// How one instruction touches global memory, as far as the twin is concerned.
struct Access {
  enum class Class : uint8_t {
    kNone,       // nothing to check (other spaces, or a load in checkpoint mode)
    kChecked,    // check_accesses instruments it
    kUnchecked,  // reaches global memory in a way the check cannot describe
  };
  Class cls = Class::kNone;
  ViolationKind kind = ViolationKind::kStore;
  size_t addressOperand = 0;  // the [address] operand
  bool generic = false;       // generic addressing: may not be global at all
  uint32_t size = 0;          // bytes, when sizeOperand < 0
  int sizeOperand = -1;       // operand holding the size (cp.async.bulk)
  // wmma.load/store: a matrix of `major` lines of `minor` elements, `stride`
  // elements apart (operand strideOperand); the check covers the lines' hull,
  // ((major - 1) * stride + minor) * elementBytes.
  int strideOperand = -1;
  uint32_t major = 0;
  uint32_t minor = 0;
  uint32_t elementBytes = 0;
};

// Defined in check_accesses.cpp.
Access classifyAccess(const ptx::Instruction& inst, TwinMode mode);

// Defined in carry_validator_args.cpp. The callee operand of a call (nullptr if
// malformed), and whether a bodiless callee is known not to touch application
// memory (vprintf reads only its argument buffer; __assertfail traps).
const ptx::Operand* callTarget(const ptx::Instruction& call);
bool isKnownSafeExternal(std::string_view name);

// One twin being built.
struct TwinFunction {
  const ptx::Function* original = nullptr;
  uint32_t functionIndex = 0;  // ReportEntry::function of the original
  ptx::Function twin;
  // Calls in this twin that stay unchecked (function pointers, bodiless callees).
  uint32_t uncheckedCalls = 0;
  // Accesses to global memory this generator cannot check (wmma, multimem, ...).
  uint32_t uncheckedAccesses = 0;
  // Names of the original functions this twin calls (for propagating the above).
  std::vector<std::string> callees;
};

struct TwinContext {
  const ptx::Module* original = nullptr;
  TwinOptions options;
  std::string_view suffix = kTwinSuffix;  // of the twins' names
  TwinStats stats;
  // In source order of the originals.
  std::vector<TwinFunction> twins;
  // Original names of the .funcs that have a twin.
  std::unordered_set<std::string> twinned;
  // Set by check_accesses when some twin calls the check function.
  bool usesCheckFunction = false;
  // The result, assembled by place_twins.
  ptx::Module output;
};

// 1. Chooses the functions that get a twin (every .entry, and every .func that
//    transitively reaches a checked access or a call that cannot be followed),
//    copies them under the twin name and appends the three validator parameters.
namespace clone_twins {
Status run(TwinContext& context);
}

// 2. Before every checked access of every twin, computes its address and calls the
//    check function (under the access's own guard predicate).
namespace check_accesses {
Status run(TwinContext& context);
}

// 3. Makes calls between twins pass the validator values on, and counts the calls
//    that cannot be followed.
namespace carry_validator_args {
Status run(TwinContext& context);
}

// 4. Declares the validator registers in every twin and loads the parameters
//    into them.
namespace load_validator_args {
Status run(TwinContext& context);
}

// 5. Builds the twin module, which is loaded beside the original: the original's
//    module-scope .shared/.local declarations and .file directives, the original
//    functions the twins reach (calls, function addresses), the check function,
//    prototypes of the twin .funcs and the twins. No .global or .const variable of
//    the original is copied: share_globals makes the twins use the original's.
namespace place_twins {
Status run(TwinContext& context);
}

// 6. Makes every reference of the twin module to a .global or .const variable of
//    the original go through the address table kGlobalTable (twin.h), which the
//    loader fills with the addresses of the original module's variables, and
//    lists the variables in TwinStats::globals.
namespace share_globals {
Status run(TwinContext& context);
}

// Shared helpers.
// Calls `visit(instruction)` on every instruction of `body`, nested blocks
// flattened in source order: the order of ResolvedFunction::instructions().
template <typename Statements, typename Visit>
void forEachInstruction(Statements& body, Visit&& visit) {
  for (auto& statement : body) {
    if (auto* inst = std::get_if<ptx::Instruction>(&statement.value)) {
      visit(*inst);
    } else if (auto* block = std::get_if<ptx::Block>(&statement.value)) {
      forEachInstruction(block->statements, visit);
    }
  }
}

inline ptx::VarDecl makeDecl(ptx::StateSpace space, std::string_view name, ptx::Type type) {
  ptx::VarDecl d;
  d.space = space;
  d.type = type;
  d.name = std::string(name);
  return d;
}

inline bool hasReservedPrefix(std::string_view name) {
  if (!name.empty() && (name[0] == '%' || name[0] == '$')) name.remove_prefix(1);
  return name.starts_with(kReservedPrefix);
}

}  // namespace phos::instrument::passes
