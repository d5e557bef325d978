// SPDX-License-Identifier: Apache-2.0
// The phos-instrument command line: print and params on a real file, and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "phos/common/subprocess.h"
#include "phos/ptx/parser.h"
#include "status_matchers.h"

namespace phos::ptx {
namespace {

using ::phos::testing::IsOk;
using ::testing::HasSubstr;

constexpr std::string_view kPtx = R"(.version 9.0
.target sm_80
.address_size 64

.visible .entry struct_args(
	.param .align 8 .b8 struct_args_param_0[32],
	.param .align 4 .b8 struct_args_param_1[8],
	.param .u64 struct_args_param_2
)
{
	ret;
}

.visible .entry scalars(
	.param .u8 scalars_param_0,
	.param .f64 scalars_param_1
)
{
	ret;
}
)";

class Tool : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tool = std::getenv("PHOS_INSTRUMENT");
    if (!tool || !*tool) GTEST_SKIP() << "PHOS_INSTRUMENT not set";
    tool_ = tool;
    char tmpl[] = "/tmp/phos-tool-XXXXXX.ptx";
    int fd = mkstemps(tmpl, 4);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, kPtx.data(), kPtx.size()), static_cast<ssize_t>(kPtx.size()));
    close(fd);
    path_ = tmpl;
  }
  void TearDown() override {
    if (!path_.empty()) unlink(path_.c_str());
  }
  std::string tool_;
  std::string path_;
};

TEST_F(Tool, PrintWritesPtxThatParsesToTheSameModule) {
  Result<ProcessOutput> r = runCapture({tool_, "print", path_});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exitCode, 0) << r->err;
  Result<Module> printed = parseModule(r->out, "stdout");
  Result<Module> original = parseModule(kPtx, "original");
  ASSERT_THAT(printed, IsOk());
  ASSERT_THAT(original, IsOk());
  EXPECT_TRUE(*printed == *original);
}

TEST_F(Tool, ParamsReportsEachKernelsLayoutAsJson) {
  Result<ProcessOutput> r = runCapture({tool_, "params", path_});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exitCode, 0) << r->err;
  nlohmann::json j = nlohmann::json::parse(r->out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["kernel"], "struct_args");
  EXPECT_EQ(j[0]["size"], 48);
  ASSERT_EQ(j[0]["params"].size(), 3u);
  EXPECT_EQ(j[0]["params"][1]["offset"], 32);
  EXPECT_EQ(j[0]["params"][1]["size"], 8);
  EXPECT_EQ(j[0]["params"][1]["alignment"], 4);
  EXPECT_EQ(j[0]["params"][2]["offset"], 40);
  EXPECT_EQ(j[0]["params"][2]["may_be_pointer"], true);
  EXPECT_EQ(j[1]["params"][1]["offset"], 8);

  Result<ProcessOutput> one = runCapture({tool_, "params", path_, "--kernel", "scalars"});
  ASSERT_THAT(one, IsOk());
  ASSERT_EQ(one->exitCode, 0) << one->err;
  EXPECT_EQ(nlohmann::json::parse(one->out).size(), 1u);
}

TEST_F(Tool, ErrorsNameTheProblemAndExitNonZero) {
  Result<ProcessOutput> missing = runCapture({tool_, "params", path_, "--kernel", "nope"});
  ASSERT_THAT(missing, IsOk());
  EXPECT_EQ(missing->exitCode, 1);
  EXPECT_THAT(missing->err, HasSubstr("no kernel named 'nope'"));

  std::string bad = path_ + ".bad.ptx";
  std::ofstream(bad) << ".version 9.0\n.target sm_80\n.address_size 64\n.entry k()\n{\n\tnop;\n}\n";
  Result<ProcessOutput> r = runCapture({tool_, "print", bad});
  unlink(bad.c_str());
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 1);
  EXPECT_THAT(r->err, HasSubstr(":6:2: unknown opcode 'nop'"));

  Result<ProcessOutput> none = runCapture({tool_, "print", "/nonexistent/x.ptx"});
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->exitCode, 1);
  EXPECT_THAT(none->err, HasSubstr("cannot open /nonexistent/x.ptx"));
}

}  // namespace
}  // namespace phos::ptx
