// SPDX-License-Identifier: Apache-2.0
// Immediate post-dominators of a control-flow graph: where divergent warps reconverge.
#pragma once

#include <cstdint>
#include <vector>

namespace phos::vgpu::engine::detail {

// `successors[b]` lists the blocks control may pass to from block b; the value
// `successors.size()` stands for the virtual exit node every return leads to.
// Returns, for every block, its immediate post-dominator (the exit node when
// nothing nearer post-dominates it, including blocks that cannot reach the exit).
std::vector<uint32_t> immediatePostDominators(
    const std::vector<std::vector<uint32_t>>& successors);

}  // namespace phos::vgpu::engine::detail
