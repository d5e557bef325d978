// SPDX-License-Identifier: Apache-2.0
// Reads the dynamic symbol table of an ELF shared object, as `nm -D --defined-only` would list it.
#pragma once

#include <set>
#include <string>

#include "phos/common/status.h"

namespace phos::testing {

// Names of the symbols a 64-bit ELF file defines in .dynsym with global or
// weak binding and default or protected visibility: what the dynamic linker
// resolves against. Versioned names are returned without their version.
Result<std::set<std::string>> definedDynamicSymbols(const std::string& path);

}  // namespace phos::testing
