// SPDX-License-Identifier: Apache-2.0
// Reads cuda.h, cudaProfiler.h and their PFN typedef headers with libclang into the generator's ApiModel.
#pragma once

#include <string>
#include <vector>

#include "model.h"
#include "phos/common/status.h"

namespace phos::apigen {

struct ParseOptions {
  std::string cudaHeader;      // .../include/cuda.h
  std::string typedefsHeader;  // .../include/cudaTypedefs.h
  // The profiler control entry points (cuProfilerStart/Stop/Initialize) are
  // exported by libcuda but declared in a header of their own; both or neither.
  std::string profilerHeader;          // .../include/cudaProfiler.h
  std::string profilerTypedefsHeader;  // .../include/cudaProfilerTypedefs.h
  std::vector<std::string> clangArgs;  // extra arguments, e.g. -resource-dir=...
};

// Fills entryPoints, typedefs, renames and cudaVersion; procAddress is left to
// buildProcAddressMap().
Result<ApiModel> parseHeaders(const ParseOptions& options);

}  // namespace phos::apigen
