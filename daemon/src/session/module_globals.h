// SPDX-License-Identifier: Apache-2.0
// The module-scope variables (__device__, __constant__) of a module image of
// any kind, which a checkpoint saves and a restore puts back.
#pragma once

#include <string>
#include <vector>

#include "phos/common/status.h"

namespace phos::daemon {

// PTX text: its .global and .const variables defined there (not .extern).
// A fatbin: those of its PTX, else of its cubin's symbol table. A cubin: its
// symbol table's data objects. kDataLoss when the image cannot be read.
Result<std::vector<std::string>> moduleGlobalNames(const std::vector<char>& image);

}  // namespace phos::daemon
