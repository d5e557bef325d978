// SPDX-License-Identifier: Apache-2.0
// The module-scope variables (__device__, __constant__) of a module image of
// any kind, which a checkpoint saves and a restore puts back.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"

namespace phos::daemon {

// PTX text: its .global and .const variables defined there (not .extern).
// A fatbin: those of its PTX, else of its cubin's symbol table. A cubin: its
// symbol table's data objects. kDataLoss when the image cannot be read.
Result<std::vector<std::string>> moduleGlobalNames(const std::vector<char>& image);

// The names nvcc gives the string literals a kernel uses (assert's messages
// and function names, printf's formats): `$str`, `$str$N`, `__unnamed_N`.
// C++ forbids writing a literal, so a module loaded again holds their bytes,
// and NVIDIA's driver may not find them by name at all (ptxas keeps them
// local, or drops them): a checkpoint saves those it can find and skips the
// others.
bool isStringLiteral(std::string_view name);

}  // namespace phos::daemon
