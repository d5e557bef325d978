// SPDX-License-Identifier: Apache-2.0
// The CUDA Driver API surface as data: every exported entry point of cuda.h, generated from the header.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "phos/cuda_api/entry_points.h"  // generated: enum class EntryPointId

namespace phos::cuda_api {

// See apigen's model.h: what a parameter is, and which way its data moves
// (inferred from const-ness and pointer-ness, corrected by
// apigen/param_directions.json).
enum class ParamKind : std::uint8_t { kValue, kHandle, kCallback, kAddress, kPointer };
enum class ParamDirection : std::uint8_t { kIn, kOut, kInOut };

struct ParamInfo {
  std::string_view name;
  std::string_view type;           // as written in cuda.h: "CUdeviceptr *"
  std::string_view canonicalType;  // typedefs resolved: "unsigned long long *"
  bool isPointer;
  bool pointeeConst;  // const pointee: the callee only reads through it
  bool isStream;      // a CUstream
  ParamKind kind;
  ParamDirection direction;
};

// Which configuration of cuda.h declares the symbol (see apigen's model.h).
enum class EntryPointOrigin : std::uint8_t { kDefault, kPerThread, kLegacy };

struct EntryPointInfo {
  EntryPointId id;
  std::string_view symbol;      // exported name: "cuMemAlloc_v2"
  std::string_view publicName;  // name without ABI revision or stream suffix: "cuMemAlloc"
  std::string_view returnType;
  std::span<const ParamInfo> params;
  EntryPointOrigin origin;
  bool deprecated;
  int streamParam;  // index of the first CUstream parameter, -1 if none

  bool hasStream() const { return streamParam >= 0; }
};

// One ABI of a public name as cuGetProcAddress hands it out.
struct ProcAddressVariant {
  int version;  // CUDA version (1000 * major + 10 * minor) that introduced this ABI
  bool perThread;
  EntryPointId entry;
};

struct ProcAddressName {
  std::string_view publicName;
  std::span<const ProcAddressVariant> variants;  // by version; legacy before per-thread
};

// All entry points, sorted by symbol; entryPoints()[id] has that id.
std::span<const EntryPointInfo> entryPoints();
const EntryPointInfo& entryPoint(EntryPointId id);
// nullptr when cuda.h declares no such exported symbol.
const EntryPointInfo* findEntryPoint(std::string_view symbol);

// Every public name cudaTypedefs.h versions, sorted by name.
std::span<const ProcAddressName> procAddressNames();
const ProcAddressName* findProcAddressName(std::string_view publicName);

// CUDA_VERSION of the header the table was generated from.
int headerCudaVersion();

}  // namespace phos::cuda_api
