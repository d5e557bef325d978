// SPDX-License-Identifier: Apache-2.0
// The phos-instrument command line: print and params on a real file, and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

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


// --- signatures ---------------------------------------------------------------

constexpr std::string_view kSaxpy = R"(.version 9.0
.target sm_80
.address_size 64

.visible .entry _Z5saxpyifPKfPf(
	.param .u32 _Z5saxpyifPKfPf_param_0,
	.param .f32 _Z5saxpyifPKfPf_param_1,
	.param .u64 _Z5saxpyifPKfPf_param_2,
	.param .u64 _Z5saxpyifPKfPf_param_3
)
{
	.reg .f32 	%f<3>;
	.reg .b64 	%rd<3>;
	ld.param.u64 	%rd1, [_Z5saxpyifPKfPf_param_2];
	ld.param.u64 	%rd2, [_Z5saxpyifPKfPf_param_3];
	ld.global.f32 	%f1, [%rd1];
	st.global.f32 	[%rd2], %f1;
	ret;
}
)";

class SignaturesTool : public Tool {
 protected:
  std::string write(std::string_view suffix, std::string_view text) {
    std::string p = path_ + std::string(suffix);
    std::ofstream(p) << text;
    extra_.push_back(p);
    return p;
  }
  void TearDown() override {
    for (const std::string& p : extra_) unlink(p.c_str());
    Tool::TearDown();
  }
  std::vector<std::string> extra_;
};

TEST_F(SignaturesTool, PrintsEachKernelsWordsAsJson) {
  std::string ptx = write(".saxpy.ptx", kSaxpy);
  Result<ProcessOutput> r = runCapture({tool_, "signatures", ptx});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exitCode, 0) << r->err;
  nlohmann::json j = nlohmann::json::parse(r->out);
  ASSERT_EQ(j["kernels"].size(), 1u);
  const nlohmann::json& k = j["kernels"][0];
  EXPECT_EQ(k["name"], "_Z5saxpyifPKfPf");
  EXPECT_EQ(k["demangled"], "saxpy(int, float, float const*, float*)");
  EXPECT_EQ(k["param_bytes"], 24);
  EXPECT_EQ(k["indirect"], "none");
  EXPECT_EQ(k["sources"], nlohmann::json::array({"ptx", "mangled_name"}));
  ASSERT_EQ(k["params"].size(), 4u);
  EXPECT_TRUE(k["params"][0]["words"].empty());
  const nlohmann::json& x = k["params"][2]["words"][0];
  EXPECT_EQ(x["offset"], 8);
  EXPECT_EQ(x["access"], "read");
  EXPECT_EQ(x["declared_const"], true);
  EXPECT_EQ(x["declared_type"], "float const*");
  EXPECT_EQ(k["params"][3]["words"][0]["access"], "write");

  // The struct kernel of the fixture: four words and one, none used.
  Result<ProcessOutput> s = runCapture({tool_, "signatures", path_});
  ASSERT_THAT(s, IsOk());
  ASSERT_EQ(s->exitCode, 0) << s->err;
  nlohmann::json js = nlohmann::json::parse(s->out);
  ASSERT_EQ(js["kernels"].size(), 2u);
  EXPECT_EQ(js["kernels"][0]["params"][0]["words"].size(), 4u);
  EXPECT_EQ(js["kernels"][0]["params"][0]["words"][1]["access"], "none");
  EXPECT_EQ(js["kernels"][0]["sources"], nlohmann::json::array({"ptx"}));
}

TEST_F(SignaturesTool, AppliesADatabase) {
  std::string db = write(".db.json", R"({"version": 1, "kernels": [
    {"name": "struct_args", "params": [
      {"ordinal": 0, "type": "Buffers", "pointers": [{"offset": 0, "type": "const float *", "const": true},
                                                     {"offset": 8, "type": "float *"}]},
      {"ordinal": 1, "type": "Small"},
      {"ordinal": 2, "type": "const char *", "pointers": [{"offset": 0, "type": "const char *"}]}]}]})");
  Result<ProcessOutput> r = runCapture({tool_, "signatures", path_, "--database", db});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exitCode, 0) << r->err;
  nlohmann::json j = nlohmann::json::parse(r->out);
  const nlohmann::json& k = j["kernels"][0];
  EXPECT_EQ(k["sources"], nlohmann::json::array({"ptx", "source_scan"}));
  EXPECT_EQ(k["params"][0]["words"][0]["declared_type"], "const float *");
  EXPECT_EQ(k["params"][0]["words"][0]["declared_const"], true);
  EXPECT_EQ(k["params"][0]["words"][1]["declared_const"], false);
  EXPECT_EQ(k["params"][2]["words"][0]["declared_const"], true);
  EXPECT_EQ(j["kernels"][1]["sources"], nlohmann::json::array({"ptx"}));
}

TEST_F(SignaturesTool, ErrorsNameTheProblemAndExitNonZero) {
  Result<ProcessOutput> none = runCapture({tool_, "signatures", "/nonexistent/x.ptx"});
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->exitCode, 1);
  EXPECT_THAT(none->err, HasSubstr("cannot open /nonexistent/x.ptx"));

  std::string bad = write(".bad.ptx", ".version 9.0\n.target sm_80\n.address_size 64\n"
                                      ".entry k()\n{\n\tbra $L_missing;\n}\n");
  Result<ProcessOutput> r = runCapture({tool_, "signatures", bad});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 1);
  EXPECT_THAT(r->err, HasSubstr("$L_missing"));

  std::string garbage = write(".garbage.ptx", ".version 9.0\n.target sm_80\n.address_size 64\n"
                                              ".entry k()\n{\n\tnop;\n}\n");
  Result<ProcessOutput> g = runCapture({tool_, "signatures", garbage});
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->exitCode, 1);
  EXPECT_THAT(g->err, HasSubstr(":6:2: unknown opcode 'nop'"));

  std::string db = write(".db.json", "{\"version\": 1,\n\"kernels\": [\n{\"name\": }]}");
  Result<ProcessOutput> d = runCapture({tool_, "signatures", path_, "--database", db});
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->exitCode, 1);
  EXPECT_THAT(d->err, HasSubstr(db + ": line 3: not valid JSON"));

  Result<ProcessOutput> nodb =
      runCapture({tool_, "signatures", path_, "--database", "/nonexistent/db.json"});
  ASSERT_THAT(nodb, IsOk());
  EXPECT_EQ(nodb->exitCode, 1);
  EXPECT_THAT(nodb->err, HasSubstr("cannot open signature database /nonexistent/db.json"));

  // A declaration with another parameter count than the PTX.
  std::string misfit = write(".misfit.json",
                             R"({"version": 1, "kernels": [{"name": "scalars", "params": [{"ordinal": 0}]}]})");
  Result<ProcessOutput> m = runCapture({tool_, "signatures", path_, "--database", misfit});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->exitCode, 1);
  EXPECT_THAT(m->err, HasSubstr("kernel scalars: declared with 1 parameters, the PTX has 2"));
  EXPECT_THAT(m->err, HasSubstr(misfit));
}

}  // namespace
}  // namespace phos::ptx
