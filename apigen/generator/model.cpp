// SPDX-License-Identifier: Apache-2.0
// Small queries over the generator's model.
#include "model.h"

#include <algorithm>

namespace phos::apigen {

std::string EntryPoint::canonicalSignature() const {
  std::string sig = returnCanonical + " (";
  for (size_t i = 0; i < params.size(); ++i) {
    if (i != 0) sig += ", ";
    sig += params[i].canonicalType;
  }
  return sig + ")";
}

const EntryPoint* ApiModel::find(const std::string& symbol) const {
  auto it = std::lower_bound(entryPoints.begin(), entryPoints.end(), symbol,
                             [](const EntryPoint& e, const std::string& s) { return e.symbol < s; });
  return it != entryPoints.end() && it->symbol == symbol ? &*it : nullptr;
}

}  // namespace phos::apigen
