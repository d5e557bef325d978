// SPDX-License-Identifier: Apache-2.0
// Kernel parameter layout (ordinal, offset, size, alignment) as the driver reports it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "phos/common/status.h"
#include "phos/ptx/ast.h"

namespace phos::ptx {

// One parameter as cuFuncGetParamInfo describes it: byte offset in the launch
// parameter buffer and size; alignment is what placed it there.
struct ParamInfo {
  uint32_t ordinal = 0;
  std::string name;
  uint32_t offset = 0;
  uint32_t size = 0;
  uint32_t alignment = 0;
  Type type = Type::kNone;   // element type as declared (.b8 for byte arrays)
  bool isPtr = false;        // declared with .ptr (clang emits it)
  // An 8-byte integer scalar or a .ptr: what speculation must match against
  // allocations (struct arguments are scanned word by word by their consumers).
  bool mayBePointer = false;
  friend bool operator==(const ParamInfo&, const ParamInfo&) = default;
};

struct ParamLayout {
  std::string kernel;
  std::vector<ParamInfo> params;
  uint32_t totalSize = 0;  // end of the last parameter (not rounded up)
};

// Layout of an .entry's parameters: each placed at the next multiple of its
// alignment (.align N if given, else the natural alignment of its element type).
// Fails with kInvalidArgument for an unsized or zero-sized parameter.
Result<ParamLayout> computeParamLayout(const Function& kernel);

// Layouts of every .entry in the module, in source order.
Result<std::vector<ParamLayout>> computeParamLayouts(const Module& module);

}  // namespace phos::ptx
