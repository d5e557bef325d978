// SPDX-License-Identifier: Apache-2.0
// The module variables a checkpoint saves, by name (daemon/src/session/module_globals.h).
#include "session/module_globals.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace phos::daemon {
namespace {

std::vector<char> image(const std::string& text) {
  return {text.begin(), text.end()};
}

// What nvcc emits for a kernel that asserts and keeps a counter.
TEST(ModuleGlobals, AKernelsVariablesAndItsStringLiterals) {
  auto names = moduleGlobalNames(image(R"(.version 8.0
.target sm_80
.address_size 64
.extern .global .align 4 .u32 elsewhere;
.global .align 1 .b8 __unnamed_1[3] = {98, 117, 0};
.global .align 1 .b8 $str[2] = {118, 0};
.global .align 1 .b8 $str$1[2] = {102, 0};
.visible .global .align 4 .u32 counter;
.const .align 4 .f32 scale = 0f3F800000;
)"));
  ASSERT_TRUE(names.isOk()) << names.status().message();
  EXPECT_EQ(*names,
            (std::vector<std::string>{"__unnamed_1", "$str", "$str$1", "counter", "scale"}));
  for (const std::string& n : *names) {
    EXPECT_EQ(isStringLiteral(n), n != "counter" && n != "scale") << n;
  }
}

TEST(ModuleGlobals, OnlyNvccsOwnLiteralNamesAreLiterals) {
  for (const char* n : {"$str", "$str$0", "$str$12", "__unnamed_1", "__unnamed_22"}) {
    EXPECT_TRUE(isStringLiteral(n)) << n;
  }
  for (const char* n : {"", "str", "$str$", "$str$x", "$strings", "__unnamed_", "__unnamed_x1",
                        "__unnamed_1a", "my__unnamed_1", "_ZN3foo7counterE"}) {
    EXPECT_FALSE(isStringLiteral(n)) << n;
  }
}

}  // namespace
}  // namespace phos::daemon
