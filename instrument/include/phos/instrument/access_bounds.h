// SPDX-License-Identifier: Apache-2.0
// Access bounds: which bytes of its buffers a launch may really touch, below the
// buffer (docs/speculation.md, "Below the buffer").
//
// Speculation names whole buffers: a step that writes 1 MiB of a 1 GiB buffer
// counts as writing all of it. Most kernels address memory as a pointer
// parameter plus an offset made of the thread and block indices, the launch
// dimensions and scalar parameters (`y[i * n + j]`, `cache[pos * dim + t]`).
// The analysis keeps, for the registers each address uses, the definitions that
// reach it and the branch conditions that bound them on the way (a loop's
// `i < n`); at a launch, where every parameter and dimension is known, it
// evaluates each access's address as an interval. An access whose address is a
// parameter word plus a bounded offset narrows that word's buffer to the bytes
// it can reach; anything else (an address loaded from memory, an index no
// branch bounds, a call) leaves the buffer whole, or every buffer.
//
// Soundness does not rest on this analysis alone: the narrowed ranges are the
// range table the twins check each access against, so an access outside them is
// reported as a mis-speculation like any other and the protocol falls back.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "phos/instrument/signature.h"
#include "phos/instrument/speculation.h"
#include "phos/ptx/ast.h"

namespace phos::instrument {

// The launch configuration the addresses may depend on.
struct LaunchShape {
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
};

class AccessBounds {
 public:
  // Analyses `kernel` (an .entry of `module`) against its signature. Never
  // fails: a kernel it cannot follow narrows nothing (`why()` says why).
  static std::shared_ptr<const AccessBounds> analyze(const ptx::Module& module, const ptx::Function& kernel,
                                                     const KernelSignature& signature);
  ~AccessBounds();

  // Narrows `set`, speculated for a launch of the kernel with `params` and
  // `shape`, to the bytes of each buffer its accesses can reach. A buffer is
  // narrowed only when every access that may reach it is bounded; module
  // variables (`globals`) stay whole.
  void narrow(LaunchAccessSet& set, std::span<const std::byte> params, const LaunchShape& shape,
              const BufferLookup& buffers, const GlobalLookup& globals = {}) const;

  // Whether any access can be bounded at all, and if not, why.
  bool useful() const;
  std::string why() const;

  struct Program;  // the analysed kernel (access_bounds.cpp)

 private:
  explicit AccessBounds(std::unique_ptr<Program> program);
  std::unique_ptr<Program> program_;
};

}  // namespace phos::instrument
