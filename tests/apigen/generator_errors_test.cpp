// SPDX-License-Identifier: Apache-2.0
// The generator's failure paths: bad command lines, missing or foreign headers, typedefs that match nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "directions.h"
#include "header_parser.h"
#include "phos/common/subprocess.h"
#include "status_matchers.h"
#include "version_map.h"

namespace phos::apigen {
namespace {

namespace fs = std::filesystem;
using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "phos-apigen-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = (fs::path(path_) / name).string();
    std::ofstream(p) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ParseOptions optionsFor(const std::string& cudaH, const std::string& typedefsH) {
  ParseOptions o;
  o.cudaHeader = cudaH;
  o.typedefsHeader = typedefsH;
  if (std::string_view(PHOS_CLANG_RESOURCE_DIR).size() != 0) {
    o.clangArgs.push_back(std::string("-resource-dir=") + PHOS_CLANG_RESOURCE_DIR);
  }
  return o;
}

// A two-function Driver API: enough to exercise every stage.
constexpr const char* kMiniCudaH = R"(#pragma once
#define CUDA_VERSION 12000
typedef enum cudaError_enum { CUDA_SUCCESS = 0 } CUresult;
typedef unsigned long long CUdeviceptr;
#define cuMemAlloc cuMemAlloc_v2
CUresult cuInit(unsigned int Flags);
CUresult cuMemAlloc(CUdeviceptr *dptr, unsigned long bytesize);
)";
constexpr const char* kMiniTypedefsH = R"(#pragma once
#include <cuda.h>
typedef CUresult (*PFN_cuInit_v2000)(unsigned int Flags);
typedef CUresult (*PFN_cuMemAlloc_v3020)(CUdeviceptr *dptr, unsigned long bytesize);
)";

TEST(ParseHeaders, MiniatureHeaderPair) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  Result<ApiModel> model =
      parseHeaders(optionsFor(dir.write("cuda.h", kMiniCudaH), dir.write("cudaTypedefs.h", kMiniTypedefsH)));
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ(model->cudaVersion, 12000);
  ASSERT_EQ(model->entryPoints.size(), 2u);
  EXPECT_EQ(model->entryPoints[0].symbol, "cuInit");
  EXPECT_EQ(model->entryPoints[1].symbol, "cuMemAlloc_v2");
  ASSERT_THAT(buildProcAddressMap(*model), IsOk());
  ASSERT_EQ(model->procAddress.size(), 2u);
  EXPECT_EQ(model->procAddress[1].variants.at(0).symbol, "cuMemAlloc_v2");
}

constexpr const char* kMiniProfilerH = R"(#pragma once
#include <cuda.h>
CUresult cuProfilerStart(void);
)";
constexpr const char* kMiniProfilerTypedefsH = R"(#include <cudaProfiler.h>
typedef CUresult (*PFN_cuProfilerStart_v4000)(void);
)";

TEST(ParseHeaders, ProfilerHeaderPairJoinsTheModel) {
  TempDir dir;
  ParseOptions o = optionsFor(dir.write("cuda.h", kMiniCudaH), dir.write("cudaTypedefs.h", kMiniTypedefsH));
  o.profilerHeader = dir.write("cudaProfiler.h", kMiniProfilerH);
  o.profilerTypedefsHeader = dir.write("cudaProfilerTypedefs.h", kMiniProfilerTypedefsH);
  Result<ApiModel> model = parseHeaders(o);
  ASSERT_THAT(model, IsOk());
  ASSERT_EQ(model->entryPoints.size(), 3u);
  EXPECT_EQ(model->entryPoints[2].symbol, "cuProfilerStart");
  ASSERT_THAT(buildProcAddressMap(*model), IsOk());
  ASSERT_EQ(model->procAddress.size(), 3u);
  EXPECT_EQ(model->procAddress[2].publicName, "cuProfilerStart");
}

TEST(ParseHeaders, ProfilerHeaderNeedsItsTypedefs) {
  TempDir dir;
  ParseOptions o = optionsFor(dir.write("cuda.h", kMiniCudaH), dir.write("cudaTypedefs.h", kMiniTypedefsH));
  o.profilerHeader = dir.write("cudaProfiler.h", kMiniProfilerH);
  EXPECT_THAT(parseHeaders(o), StatusIs(Code::kInvalidArgument, HasSubstr("give both or neither")));
  o.profilerTypedefsHeader = dir.path() + "/cudaProfilerTypedefs-missing.h";
  EXPECT_THAT(parseHeaders(o), StatusIs(Code::kNotFound, HasSubstr("cudaProfilerTypedefs-missing.h")));
  // Typedefs that include some other profiler header: the one given is never read.
  o.profilerTypedefsHeader = dir.write("cudaProfilerTypedefs.h", "#include <cuda.h>\n");
  EXPECT_THAT(parseHeaders(o), StatusIs(Code::kInvalidArgument, HasSubstr("does not include")));
}

TEST(ParseHeaders, MissingHeader) {
  TempDir dir;
  std::string typedefs = dir.write("cudaTypedefs.h", kMiniTypedefsH);
  EXPECT_THAT(parseHeaders(optionsFor(dir.path() + "/no-such/cuda.h", typedefs)),
              StatusIs(Code::kNotFound, HasSubstr("no-such/cuda.h")));
  std::string cuda = dir.write("cuda.h", kMiniCudaH);
  EXPECT_THAT(parseHeaders(optionsFor(cuda, dir.path() + "/cudaTypedefs-missing.h")),
              StatusIs(Code::kNotFound, HasSubstr("cudaTypedefs-missing.h")));
  EXPECT_THAT(parseHeaders(optionsFor("", typedefs)), StatusIs(Code::kInvalidArgument, HasSubstr("no CUDA header")));
}

TEST(ParseHeaders, HeaderThatDoesNotCompile) {
  TempDir dir;
  std::string cuda = dir.write("cuda.h", std::string(kMiniCudaH) + "CUresult cuBroken(undeclared_t x);\n");
  EXPECT_THAT(parseHeaders(optionsFor(cuda, dir.write("cudaTypedefs.h", kMiniTypedefsH))),
              StatusIs(Code::kInvalidArgument, HasSubstr("does not compile")));
}

TEST(ParseHeaders, HeaderWithoutCudaVersion) {
  TempDir dir;
  std::string cuda = dir.write("cuda.h", "typedef int CUresult;\nCUresult cuInit(unsigned int Flags);\n");
  std::string typedefs = dir.write("cudaTypedefs.h", "#include <cuda.h>\n");
  EXPECT_THAT(parseHeaders(optionsFor(cuda, typedefs)),
              StatusIs(Code::kInvalidArgument, HasSubstr("defines no CUDA_VERSION")));
}

TEST(ParseHeaders, TypedefsOfAnotherHeader) {
  TempDir dir;
  std::string cuda = dir.write("cuda.h", kMiniCudaH);
  fs::create_directory(fs::path(dir.path()) / "other");
  std::string otherCuda = dir.write("other/cuda.h", kMiniCudaH);
  // Includes ./cuda.h (found first), so the --cuda-h given is never read.
  std::string typedefs = dir.write("other/cudaTypedefs.h", "#include \"cuda.h\"\n");
  EXPECT_THAT(parseHeaders(optionsFor(cuda, typedefs)),
              StatusIs(Code::kInvalidArgument, HasSubstr("does not include")));
  (void)otherCuda;
}

TEST(BuildProcAddressMap, TypedefWithoutASymbol) {
  TempDir dir;
  std::string typedefs = dir.write("cudaTypedefs.h", std::string(kMiniTypedefsH) +
                                                         "typedef CUresult (*PFN_cuMemFree_v3020)(CUdeviceptr dptr);\n");
  Result<ApiModel> model = parseHeaders(optionsFor(dir.write("cuda.h", kMiniCudaH), typedefs));
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(buildProcAddressMap(*model),
              StatusIs(Code::kInvalidArgument, HasSubstr("PFN_cuMemFree_v3020")));
}

TEST(BuildProcAddressMap, TypedefWithAnotherSignature) {
  TempDir dir;
  std::string typedefs = dir.write("cudaTypedefs.h", R"(#include <cuda.h>
typedef CUresult (*PFN_cuInit_v2000)(int Flags);
)");
  Result<ApiModel> model = parseHeaders(optionsFor(dir.write("cuda.h", kMiniCudaH), typedefs));
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(buildProcAddressMap(*model),
              StatusIs(Code::kInvalidArgument, HasSubstr("cuInit")));
}

class DirectionOverrides : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    Result<ApiModel> model =
        parseHeaders(optionsFor(dir_.write("cuda.h", kMiniCudaH), dir_.write("cudaTypedefs.h", kMiniTypedefsH)));
    ASSERT_THAT(model, IsOk());
    model_ = std::move(model).value();
  }
  Status apply(const std::string& json) { return assignDirections(model_, dir_.write("o.json", json)).status(); }

  TempDir dir_;
  ApiModel model_;
};

TEST_F(DirectionOverrides, AppliedToEveryRevision) {
  ASSERT_THAT(apply(R"({"_comment": "x", "cuMemAlloc": {"dptr": {"direction": "inout", "why": "test"}}})"), IsOk());
  EXPECT_EQ(model_.entryPoints[1].params[0].direction, Direction::kInOut);
  EXPECT_EQ(model_.entryPoints[1].params[0].directionWhy, "test");
  // Without the table: inferred again.
  ASSERT_THAT(assignDirections(model_, "").status(), IsOk());
  EXPECT_EQ(model_.entryPoints[1].params[0].direction, Direction::kOut);
}

TEST_F(DirectionOverrides, Rejected) {
  EXPECT_THAT(apply(R"({"cuMemFree": {"dptr": {"direction": "in", "why": "x"}}})"),
              StatusIs(Code::kNotFound, HasSubstr("no entry point named cuMemFree")));
  EXPECT_THAT(apply(R"({"cuMemAlloc": {"ptr": {"direction": "in", "why": "x"}}})"),
              StatusIs(Code::kNotFound, HasSubstr("parameter 'ptr'")));
  EXPECT_THAT(apply(R"({"cuMemAlloc": {"dptr": {"direction": "sideways", "why": "x"}}})"),
              StatusIs(Code::kInvalidArgument, HasSubstr("'sideways'")));
  EXPECT_THAT(apply(R"({"cuMemAlloc": {"dptr": {"direction": "in"}}})"),
              StatusIs(Code::kInvalidArgument, HasSubstr("needs")));
  EXPECT_THAT(apply(R"({"cuMemAlloc": {"bytesize": {"direction": "out", "why": "x"}}})"),
              StatusIs(Code::kInvalidArgument, HasSubstr("is a value")));
  EXPECT_THAT(apply("{not json"), StatusIs(Code::kInvalidArgument, HasSubstr("not a JSON object")));
  EXPECT_THAT(assignDirections(model_, dir_.path() + "/missing.json").status(), StatusIs(Code::kNotFound));
}

// The command line, through the built executable.
Result<ProcessOutput> apigen(std::vector<std::string> args) {
  args.insert(args.begin(), PHOS_APIGEN_EXE);
  return runCapture(args);
}

TEST(CommandLine, UnknownOption) {
  Result<ProcessOutput> r = apigen({"--cuda-h", PHOS_CUDA_H, "--frobnicate", "x"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 2);
  EXPECT_THAT(r->err, HasSubstr("unknown option '--frobnicate'"));
  EXPECT_THAT(r->err, HasSubstr("usage: phos-apigen"));
  EXPECT_EQ(r->out, "");
}

TEST(CommandLine, OptionWithoutValueAndMissingInputs) {
  Result<ProcessOutput> r = apigen({"--cuda-h"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 2);
  EXPECT_THAT(r->err, HasSubstr("--cuda-h needs a value"));

  r = apigen({"--stats"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 2);
  EXPECT_THAT(r->err, HasSubstr("--cuda-h and --typedefs-h are required"));

  r = apigen({"--cuda-h", PHOS_CUDA_H, "--typedefs-h", PHOS_CUDA_TYPEDEFS_H});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 2);
  EXPECT_THAT(r->err, HasSubstr("nothing to do"));
}

TEST(CommandLine, MissingHeader) {
  TempDir dir;
  std::string json = dir.path() + "/out.json";
  Result<ProcessOutput> r =
      apigen({"--cuda-h", dir.path() + "/cuda.h", "--typedefs-h", PHOS_CUDA_TYPEDEFS_H, "--json", json});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 1);
  EXPECT_THAT(r->err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(r->err, HasSubstr(dir.path() + "/cuda.h"));
  EXPECT_FALSE(fs::exists(json)) << "no output is written when parsing fails";
}

TEST(CommandLine, UnwritableOutput) {
  TempDir dir;
  Result<ProcessOutput> r = apigen({"--cuda-h", dir.write("cuda.h", kMiniCudaH), "--typedefs-h",
                                    dir.write("cudaTypedefs.h", kMiniTypedefsH), "--clang-arg",
                                    std::string("-resource-dir=") + PHOS_CLANG_RESOURCE_DIR, "--json",
                                    dir.path() + "/no-such-dir/out.json"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 1);
  EXPECT_THAT(r->err, HasSubstr("cannot create " + dir.path() + "/no-such-dir/out.json"));
}

TEST(CommandLine, HelpAndStats) {
  Result<ProcessOutput> r = apigen({"--help"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 0);
  EXPECT_THAT(r->out, HasSubstr("--trampolines-cpp"));

  TempDir dir;
  r = apigen({"--cuda-h", dir.write("cuda.h", kMiniCudaH), "--typedefs-h",
              dir.write("cudaTypedefs.h", kMiniTypedefsH), "--clang-arg",
              std::string("-resource-dir=") + PHOS_CLANG_RESOURCE_DIR, "--stats"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 0) << r->err;
  EXPECT_THAT(r->out, HasSubstr("CUDA_VERSION 12000: 2 entry points, 2 PFN typedefs"));
}

}  // namespace
}  // namespace phos::apigen
