// SPDX-License-Identifier: Apache-2.0
// Reads cuda.h and cudaTypedefs.h with libclang into the generator's ApiModel.
#pragma once

#include <string>
#include <vector>

#include "model.h"
#include "phos/common/status.h"

namespace phos::apigen {

struct ParseOptions {
  std::string cudaHeader;      // .../include/cuda.h
  std::string typedefsHeader;  // .../include/cudaTypedefs.h
  std::vector<std::string> clangArgs;  // extra arguments, e.g. -resource-dir=...
};

// Fills entryPoints, typedefs, renames and cudaVersion; procAddress is left to
// buildProcAddressMap().
Result<ApiModel> parseHeaders(const ParseOptions& options);

}  // namespace phos::apigen
