// SPDX-License-Identifier: Apache-2.0
// Speculated read and write sets of a launch: each pointer word of the parameter
// buffer matched against the allocations, at whole-allocation granularity.
#include <algorithm>
#include <cstring>

#include "internal/declaration.h"
#include "phos/instrument/speculation.h"

namespace phos::instrument {
namespace {

void sortUnique(std::vector<Buffer>& v) {
  std::sort(v.begin(), v.end(), [](const Buffer& a, const Buffer& b) {
    return a.base != b.base ? a.base < b.base : a.size < b.size;
  });
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

void add(LaunchAccessSet& set, const Buffer& b, Access a) {
  if (reads(a)) set.reads.push_back(b);
  if (writes(a)) set.writes.push_back(b);
}

std::optional<uint64_t> wordAt(std::span<const std::byte> params, uint32_t offset) {
  if (uint64_t{offset} + 8 > params.size()) return std::nullopt;
  uint64_t v = 0;
  std::memcpy(&v, params.data() + offset, 8);  // the GPU and the host are little-endian
  return v;
}

}  // namespace

LaunchAccessSet speculateLaunch(const KernelSignature& signature,
                                std::span<const std::byte> params, const BufferLookup& buffers,
                                const GlobalLookup& globals) {
  LaunchAccessSet set;
  for (const ParamSignature& p : signature.params) {
    for (const PointerWord& w : p.words) {
      // Recomputed rather than trusted: a signature built by hand or loaded from
      // elsewhere may carry an `access` that ignores its own `escapes`.
      Access a = w.access | detail::effectiveAccess(w.observed, w.escapes, w.declaredConst);
      if (a == Access::kNone) continue;
      std::optional<uint64_t> value = wordAt(params, w.offset);
      if (!value || !buffers) continue;
      if (std::optional<Buffer> b = buffers(*value)) add(set, *b, a);
    }
  }
  if (globals) {
    for (const GlobalUse& g : signature.globals) {
      if (g.access == Access::kNone) continue;
      if (std::optional<Buffer> b = globals(g.name)) add(set, *b, g.access);
    }
  }
  set.incomplete = signature.indirect != Access::kNone;
  sortUnique(set.reads);
  sortUnique(set.writes);
  return set;
}

LaunchAccessSet speculateOpaqueLaunch(std::span<const std::byte> params,
                                      const BufferLookup& buffers) {
  LaunchAccessSet set;
  set.incomplete = true;
  if (buffers) {
    for (uint32_t off = 0; uint64_t{off} + 8 <= params.size(); off += 8) {
      std::optional<uint64_t> value = wordAt(params, off);
      if (!value) break;
      if (std::optional<Buffer> b = buffers(*value)) add(set, *b, Access::kReadWrite);
    }
  }
  sortUnique(set.reads);
  sortUnique(set.writes);
  return set;
}

}  // namespace phos::instrument
