// SPDX-License-Identifier: Apache-2.0
// The generator's model of the Driver API surface: what parsing cuda.h yields and every emitter reads.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace phos::apigen {

// How a parameter's value relates to memory, from its type alone.
enum class ParamKind {
  kValue,     // not a pointer: passed by value (integers, enums, structs, CUdeviceptr)
  kHandle,    // a pointer to an incomplete struct: an opaque driver object (CUstream, CUcontext)
  kCallback,  // a pointer to a function: called by the driver, never dereferenced as data
  kAddress,   // a non-const void *: an address the driver takes as a value or a buffer
  kPointer,   // any other pointer: the callee reads or writes what it points to
};

// Which way the data behind a parameter moves across the call, the input of
// the call serializers. Values, handles and callbacks are always kIn.
enum class Direction { kIn, kOut, kInOut };

struct Param {
  std::string name;           // as declared; "p<i>" when the header leaves it unnamed
  std::string type;           // as written in the header, typedef names kept ("CUdeviceptr *")
  std::string canonicalType;  // typedefs resolved ("unsigned long long *")
  bool isPointer = false;
  bool pointeeConst = false;  // a const pointee is read-only for the callee
  bool isStream = false;      // the parameter is a CUstream
  ParamKind kind = ParamKind::kValue;
  Direction direction = Direction::kIn;
  std::string directionWhy;   // empty when inferred; the override's reason otherwise
};

// Which preprocessor configuration of cuda.h declares a symbol. The shim must
// export all of them: old binaries link the legacy names, per-thread-stream
// builds link the _ptds/_ptsz names.
enum class Origin {
  kDefault,    // visible to an ordinary `#include <cuda.h>`
  kPerThread,  // a _ptds/_ptsz variant
  kLegacy,     // an older ABI revision, declared only under __CUDA_API_VERSION_INTERNAL
};

struct EntryPoint {
  std::string symbol;       // the exported name: "cuMemAlloc_v2", "cuLaunchKernel_ptsz"
  std::string publicName;   // the name a program writes: "cuMemAlloc", "cuLaunchKernel"
  std::string returnType;       // as written ("CUresult")
  std::string returnCanonical;  // typedefs resolved ("enum cudaError_enum")
  std::vector<Param> params;
  Origin origin = Origin::kDefault;
  bool deprecated = false;
  int streamParam = -1;  // index of the first CUstream parameter, -1 if none

  // "CUresult (CUdeviceptr *, size_t)" with canonical types: identifies the ABI.
  std::string canonicalSignature() const;
};

// One PFN_<name>_v<version>[_ptds|_ptsz] typedef of cudaTypedefs.h.
struct PfnTypedef {
  std::string typedefName;
  std::string publicName;
  int version = 0;
  bool perThread = false;
  std::string canonicalSignature;  // same format as EntryPoint::canonicalSignature
};

struct ProcAddressVariant {
  int version = 0;        // the CUDA version (1000*major + 10*minor) the ABI appeared in
  bool perThread = false;
  std::string symbol;     // an EntryPoint::symbol
  std::string typedefName;
};

struct ProcAddressName {
  std::string publicName;
  std::vector<ProcAddressVariant> variants;  // by version, then legacy before per-thread
};

// What cuda.h's `#define cuX ...` makes a call to cuX link against.
struct Rename {
  std::string defaultSymbol;    // cuMemcpyHtoD -> cuMemcpyHtoD_v2
  std::string perThreadSymbol;  // with CUDA_API_PER_THREAD_DEFAULT_STREAM: cuMemcpyHtoD_v2_ptds; empty if none
};

struct ApiModel {
  std::string cudaHeader;      // paths as given on the command line
  std::string typedefsHeader;
  std::string profilerHeader;  // empty when the profiler header was not read
  int cudaVersion = 0;         // CUDA_VERSION of the parsed header
  std::vector<EntryPoint> entryPoints;  // sorted by symbol
  std::vector<PfnTypedef> typedefs;
  // cuda.h's renames: "cuMemAlloc" -> "cuMemAlloc_v2", "cuGraphInstantiate" ->
  // "cuGraphInstantiateWithFlags"; per-thread targets keep their suffix.
  std::map<std::string, Rename> renames;
  std::vector<ProcAddressName> procAddress;  // sorted by public name
  std::vector<std::string> unversionedSymbols;  // entry points no typedef reaches

  const EntryPoint* find(const std::string& symbol) const;
};

}  // namespace phos::apigen
