// SPDX-License-Identifier: Apache-2.0
// `phos-instrument twin` run as a user would: output, modes, statistics, errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "phos/common/subprocess.h"
#include "phos/ptx/parser.h"
#include "status_matchers.h"

namespace phos::ptx {
namespace {

using ::phos::testing::IsOk;
using ::testing::HasSubstr;

constexpr std::string_view kPtx = R"(.version 7.0
.target sm_80
.address_size 64

.visible .entry fill(
	.param .u64 fill_param_0
)
{
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [fill_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	st.global.u32 	[%rd2], 7;
	ret;
}

.visible .entry copy(
	.param .u64 copy_param_0,
	.param .u64 copy_param_1
)
{
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [copy_param_0];
	ld.param.u64 	%rd2, [copy_param_1];
	ld.u32 	%r1, [%rd2];
	st.u32 	[%rd1], %r1;
	ret;
}
)";

class TwinTool : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tool = std::getenv("PHOS_INSTRUMENT");
    if (!tool || !*tool) GTEST_SKIP() << "PHOS_INSTRUMENT not set";
    tool_ = tool;
    char tmpl[] = "/tmp/phos-twin-tool-XXXXXX.ptx";
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

TEST_F(TwinTool, WritesTheTwinModuleAndStatistics) {
  Result<ProcessOutput> r = runCapture({tool_, "twin", path_, "--stats"});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exitCode, 0) << r->err;
  Result<Module> m = parseModule(r->out, "stdout");
  ASSERT_THAT(m, IsOk());
  EXPECT_NE(m->findFunction("fill__phos_twin"), nullptr);
  EXPECT_NE(m->findFunction("copy__phos_twin"), nullptr);
  nlohmann::json stats = nlohmann::json::parse(r->err);
  EXPECT_EQ(stats["kernels"], 2);
  EXPECT_EQ(stats["checked_stores"], 2);
  EXPECT_EQ(stats["checked_loads"], 0);
  EXPECT_EQ(stats["unchecked_calls"], 0);
}

TEST_F(TwinTool, RestoreModeChecksLoadsAndWritesToAFile) {
  std::string out = path_ + ".twin.ptx";
  std::string statsFile = path_ + ".json";
  Result<ProcessOutput> r =
      runCapture({tool_, "twin", path_, "--mode", "restore", "-o", out, "--stats-file", statsFile});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exitCode, 0) << r->err;
  EXPECT_TRUE(r->out.empty());
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(parseModule(text.str(), out), IsOk());
  std::ifstream js(statsFile);
  nlohmann::json stats = nlohmann::json::parse(js);
  EXPECT_EQ(stats["checked_loads"], 1);
  unlink(out.c_str());
  unlink(statsFile.c_str());
}

TEST_F(TwinTool, ErrorsNameTheProblem) {
  Result<ProcessOutput> mode = runCapture({tool_, "twin", path_, "--mode", "sometimes"});
  ASSERT_THAT(mode, IsOk());
  EXPECT_NE(mode->exitCode, 0);
  EXPECT_THAT(mode->err, HasSubstr("sometimes"));

  // A twin module cannot be twinned again: its names are reserved.
  Result<ProcessOutput> first = runCapture({tool_, "twin", path_});
  ASSERT_THAT(first, IsOk());
  std::string twice = path_ + ".twice.ptx";
  std::ofstream(twice) << first->out;
  Result<ProcessOutput> again = runCapture({tool_, "twin", twice});
  unlink(twice.c_str());
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->exitCode, 1);
  EXPECT_THAT(again->err, HasSubstr("reserved for validator twins"));

  Result<ProcessOutput> none = runCapture({tool_, "twin", "/nonexistent/x.ptx"});
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->exitCode, 1);
  EXPECT_THAT(none->err, HasSubstr("cannot open /nonexistent/x.ptx"));
}

}  // namespace
}  // namespace phos::ptx
