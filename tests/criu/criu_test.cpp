// SPDX-License-Identifier: Apache-2.0
// CRIU discovery: version parsing (unit) and the real install (criu suite).
#include "phos/criu/criu.h"

#include <cstdlib>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace phos::criu {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CriuVersion, ParsesVersionLine) {
  auto v = parseVersion("/x/criu", "Version: 4.1.1\nGitID: v4.1.1\n");
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->major, 4);
  EXPECT_EQ(v->minor, 1);
  EXPECT_EQ(v->version, "4.1.1");
}

TEST(CriuVersion, RejectsGarbage) {
  EXPECT_THAT(parseVersion("c", "hello"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(parseVersion("c", "Version: four\n"),
              StatusIs(Code::kInvalidArgument, HasSubstr("unparsable version 'four'")));
}

TEST(CriuLocate, EnvironmentComesFirst) {
  setenv("PHOS_CRIU", "/some/where/criu", 1);
  auto paths = candidatePaths();
  unsetenv("PHOS_CRIU");
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), "/some/where/criu");
}

TEST(CriuLocate, SkipsTooOldCriu) {
  // A fake criu 3.17 first in line must be passed over with a reason.
  std::string fake = ::testing::TempDir() + "fake-criu-3";
  {
    std::ofstream f(fake);
    f << "#!/bin/sh\necho 'Version: 3.17.1'\n";
  }
  ASSERT_EQ(chmod(fake.c_str(), 0755), 0);
  setenv("PHOS_CRIU", fake.c_str(), 1);
  setenv("PATH", "/nonexistent", 1);  // only candidates with a path remain
  auto found = locate();
  unsetenv("PHOS_CRIU");
  if (found) {
    EXPECT_NE(found->path, fake);
  } else {
    EXPECT_THAT(found.status().message(), HasSubstr("version 3.17.1 is older than 4.0"));
  }
  std::remove(fake.c_str());
}

// criu suite: the project's CRIU must be installed (scripts/setup) and work here.
TEST(CriuInstalled, CheckLooksGood) {
  auto criu = locate();
  ASSERT_THAT(criu, IsOk());
  EXPECT_GE(criu->major, kMinimumMajor);
  EXPECT_THAT(check(*criu), IsOk());
}

}  // namespace
}  // namespace phos::criu
