// SPDX-License-Identifier: Apache-2.0
// Lookups over the generated API table.
#include "phos/cuda_api/api_table.h"

#include <algorithm>
#include <cassert>

namespace phos::cuda_api {

const EntryPointInfo& entryPoint(EntryPointId id) {
  auto table = entryPoints();
  auto index = static_cast<std::size_t>(id);
  assert(index < table.size() && table[index].id == id);
  return table[index];
}

const EntryPointInfo* findEntryPoint(std::string_view symbol) {
  auto table = entryPoints();
  auto it = std::lower_bound(table.begin(), table.end(), symbol,
                             [](const EntryPointInfo& e, std::string_view s) { return e.symbol < s; });
  return it != table.end() && it->symbol == symbol ? &*it : nullptr;
}

const ProcAddressName* findProcAddressName(std::string_view publicName) {
  auto names = procAddressNames();
  auto it = std::lower_bound(names.begin(), names.end(), publicName,
                             [](const ProcAddressName& n, std::string_view s) { return n.publicName < s; });
  return it != names.end() && it->publicName == publicName ? &*it : nullptr;
}

}  // namespace phos::cuda_api
