// SPDX-License-Identifier: Apache-2.0
// Speculated read and write sets of one kernel launch: every pointer-capable word
// of the launch's parameter buffer matched against the allocations that exist.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "phos/instrument/signature.h"

namespace phos::instrument {

// One allocation (a cuMemAlloc block, a module global, pinned host memory).
struct Buffer {
  uint64_t base = 0;
  uint64_t size = 0;
  friend bool operator==(const Buffer&, const Buffer&) = default;
};

// What a launch may read and write: whole allocations as speculateLaunch
// names them, or the parts of them AccessBounds::narrow leaves
// (access_bounds.h); sorted by base, no duplicates. A range in `writes` may
// also be read.
struct LaunchAccessSet {
  std::vector<Buffer> reads;
  std::vector<Buffer> writes;
  // The signature says the kernel also reaches memory speculation cannot name
  // (KernelSignature::indirect != kNone): the sets are a guess the validator must
  // confirm; a protocol that cannot validate treats the launch as touching all.
  bool incomplete = false;
  friend bool operator==(const LaunchAccessSet&, const LaunchAccessSet&) = default;
};

// Finds the allocation that contains `address` (nullopt: none does).
using BufferLookup = std::function<std::optional<Buffer>(uint64_t address)>;
// The address and size of a module variable of the launched kernel's module.
using GlobalLookup = std::function<std::optional<Buffer>(std::string_view name)>;

// Reads each PointerWord of `signature` from `params` (the launch's packed
// parameter buffer, signature.paramBytes long; shorter is an error the caller has
// already refused), and puts the allocation it points into in `reads` and/or
// `writes` by the word's access (kReadWrite for an escaped word that is not
// declared const). A word that points into no allocation adds nothing. Named
// globals go in by their GlobalUse access.
LaunchAccessSet speculateLaunch(const KernelSignature& signature,
                                std::span<const std::byte> params, const BufferLookup& buffers,
                                const GlobalLookup& globals = {});

// Opaque kernel with no signature (no PTX): every 8-byte-aligned word of the
// parameter buffer that points into an allocation is read and written; `incomplete`.
LaunchAccessSet speculateOpaqueLaunch(std::span<const std::byte> params,
                                      const BufferLookup& buffers);

}  // namespace phos::instrument
