// SPDX-License-Identifier: Apache-2.0
// Immediate post-dominators on hand-built control-flow graphs.
#include "postdom.h"

#include <gtest/gtest.h>

namespace phos::vgpu::engine::detail {
namespace {


TEST(PostDominators, Diamond) {
  // 0 -> {1, 2}; 1 -> 3; 2 -> 3; 3 -> exit(4)
  auto ipdom = immediatePostDominators({{1, 2}, {3}, {3}, {4}});
  EXPECT_EQ(ipdom, (std::vector<uint32_t>{3, 3, 3, 4}));
}

TEST(PostDominators, LoopWithBreak) {
  // 0 -> 1; 1 -> {2, 4}; 2 -> {3, 4} (break); 3 -> 1 (back edge); 4 -> exit(5)
  auto ipdom = immediatePostDominators({{1}, {2, 4}, {3, 4}, {1}, {5}});
  EXPECT_EQ(ipdom, (std::vector<uint32_t>{1, 4, 4, 1, 5}));
}

TEST(PostDominators, EarlyReturnReconvergesAtExit) {
  // 0 -> {1, 2}; 1 -> exit(3) (return); 2 -> exit
  auto ipdom = immediatePostDominators({{1, 2}, {3}, {3}});
  EXPECT_EQ(ipdom, (std::vector<uint32_t>{3, 3, 3}));
}

TEST(PostDominators, InfiniteLoopGetsExit) {
  // 0 -> {1, 2}; 1 -> 1 (never exits); 2 -> exit(3)
  auto ipdom = immediatePostDominators({{1, 2}, {1}, {3}});
  EXPECT_EQ(ipdom[0], 2u);  // only the path through 2 reaches the exit
  EXPECT_EQ(ipdom[1], 3u);
  EXPECT_EQ(ipdom[2], 3u);
}

TEST(PostDominators, NestedIf) {
  // 0 -> {1, 4}; 1 -> {2, 3}; 2 -> 3; 3 -> 4; 4 -> exit(5)
  auto ipdom = immediatePostDominators({{1, 4}, {2, 3}, {3}, {4}, {5}});
  EXPECT_EQ(ipdom, (std::vector<uint32_t>{4, 3, 3, 4, 5}));
}

}  // namespace
}  // namespace phos::vgpu::engine::detail
