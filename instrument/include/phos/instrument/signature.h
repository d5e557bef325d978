// SPDX-License-Identifier: Apache-2.0
// Kernel signatures: what speculation knows of each kernel parameter (which 8-byte
// words may hold a pointer, and whether memory reached through it is read or
// written), from the PTX, the demangled C++ name and the application's sources.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "phos/common/status.h"
#include "phos/ptx/ast.h"

namespace phos::instrument {

// How memory reached through a pointer is accessed. A bit set: kReadWrite is both.
enum class Access : uint8_t { kNone = 0, kRead = 1, kWrite = 2, kReadWrite = 3 };
inline Access operator|(Access a, Access b) {
  return static_cast<Access>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}
inline bool reads(Access a) { return (static_cast<uint8_t>(a) & 1) != 0; }
inline bool writes(Access a) { return (static_cast<uint8_t>(a) & 2) != 0; }
std::string_view name(Access a);  // "none", "read", "write", "readwrite"

// Where a fact of a signature came from (a bit set).
enum SignatureSource : uint8_t {
  kFromPtx = 1,          // use analysis of the PTX (use_analysis.cpp)
  kFromMangledName = 2,  // the demangled C++ name: const pointees are read-only
  kFromSourceScan = 4,   // `phos-instrument scan` of the application's .cu sources
};

// One 8-byte word of the parameter buffer that may hold a pointer: a .u64/.b64/.s64
// or .ptr parameter, or an 8-byte-aligned word inside a struct (.b8 array) parameter.
struct PointerWord {
  uint32_t offset = 0;  // byte offset in the launch parameter buffer
  // How the kernel accesses global/generic memory at addresses derived from this
  // word (through any arithmetic, through device-function calls). kNone: the word
  // never forms an address (a size, a seed) or is never used.
  Access access = Access::kNone;
  // What the PTX analysis saw directly, before widening for `escapes`: what a
  // declared type may narrow `access` back to (a store seen here is never dropped).
  Access observed = Access::kNone;
  // The analysis lost track of the value (stored to memory, passed to a function
  // without a body, converted in a way it does not follow): `access` is then
  // kReadWrite unless a declared type narrows it.
  bool escapes = false;
  // From the C++ type (demangled name or source scan): a pointer to const, so the
  // kernel only reads through it. Narrows `access` to kRead when the PTX analysis
  // escaped; never overrides a store the PTX analysis saw.
  bool declaredConst = false;
  std::string declaredType;  // "const float*", "float2*", "Params::out" ... when known
  friend bool operator==(const PointerWord&, const PointerWord&) = default;
};

struct ParamSignature {
  uint32_t ordinal = 0;
  std::string name;  // the PTX name (_Z5saxpyifPKfPf_param_2)
  uint32_t offset = 0;
  uint32_t size = 0;
  std::vector<PointerWord> words;  // in offset order; empty for 4-byte scalars
  friend bool operator==(const ParamSignature&, const ParamSignature&) = default;
};

// A module variable (.global/.const) the kernel names directly, and how.
struct GlobalUse {
  std::string name;
  Access access = Access::kNone;
  friend bool operator==(const GlobalUse&, const GlobalUse&) = default;
};

struct KernelSignature {
  std::string name;       // as in the PTX (mangled for C++ kernels)
  std::string demangled;  // "saxpy(int, float, float const*, float*)"; "" for extern "C"
  uint32_t paramBytes = 0;
  std::vector<ParamSignature> params;
  std::vector<GlobalUse> globals;  // sorted by name
  // The kernel accesses global/generic memory at addresses that do not derive from
  // any parameter word or named global (a pointer loaded from memory, an integer
  // turned into an address): speculation cannot name that buffer; only the
  // validator can catch it.
  Access indirect = Access::kNone;
  uint8_t sources = 0;  // SignatureSource bits that contributed
  friend bool operator==(const KernelSignature&, const KernelSignature&) = default;
};

// The PTX use analysis of every .entry of `module`, with what the mangled names
// say merged in. Fails only on a malformed module (kInvalidArgument naming it).
Result<std::vector<KernelSignature>> analyzeModule(const ptx::Module& module);

// "saxpy(int, float, float const*, float*)" for an Itanium-mangled name; nullopt
// for a name that is not one (extern "C" kernels).
std::optional<std::string> demangle(std::string_view mangled);

// Facts of a kernel from outside the PTX (a source scan), by parameter ordinal.
struct DeclaredParam {
  uint32_t ordinal = 0;
  std::string type;  // "const float *", "Params"
  // Byte offset (within the parameter) -> declared type of each pointer member,
  // for pointers and structs holding pointers; a plain pointer has one entry at 0.
  std::map<uint32_t, std::string> pointers;
  std::map<uint32_t, bool> pointeeConst;  // same keys: pointer to const
  friend bool operator==(const DeclaredParam&, const DeclaredParam&) = default;
};
struct DeclaredKernel {
  std::string name;  // the name in the PTX (mangled, or plain for extern "C")
  std::vector<DeclaredParam> params;
  friend bool operator==(const DeclaredKernel&, const DeclaredKernel&) = default;
};

// Applies declared facts to an analysed signature (sets declaredConst/declaredType
// and narrows escaped words; adds kFromSourceScan). kInvalidArgument when the
// declaration does not fit the PTX (another parameter count).
Status applyDeclaration(KernelSignature& signature, const DeclaredKernel& declared);

// The signature database: what `phos-instrument scan` writes and phosd loads
// (PHOS_SIGNATURES, `phosd --signatures FILE`). JSON, documented in
// docs/speculation.md: {"version": 1, "kernels": [{"name": ..., "params": [...]}]}.
class SignatureDatabase {
 public:
  static Result<SignatureDatabase> load(const std::string& path);  // names path and line on errors
  static Result<SignatureDatabase> parse(std::string_view json);
  std::string toJson() const;

  void add(DeclaredKernel kernel);  // replaces one of the same name
  const DeclaredKernel* find(std::string_view name) const;
  size_t size() const { return kernels_.size(); }

 private:
  std::map<std::string, DeclaredKernel, std::less<>> kernels_;
};

// The JSON `phos-instrument signatures` prints for one kernel (docs/speculation.md).
nlohmann::json toJson(const KernelSignature& signature);

}  // namespace phos::instrument
