// SPDX-License-Identifier: Apache-2.0
// `phos-instrument scan` run as a user would: kernel names as nvcc's PTX spells them,
// pointer constness, struct layouts, templates, options and error paths.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/common/subprocess.h"
#include "status_matchers.h"

namespace phos {
namespace {

namespace fs = std::filesystem;
using ::phos::testing::IsOk;
using ::testing::HasSubstr;
using ::testing::IsSubsetOf;

// Every shape of parameter the scanner handles; compiled by nvcc as well when
// PHOS_NVCC is set, to compare the names.
constexpr std::string_view kKernels = R"cuda(
#include <cuda_fp16.h>

struct Inner {
  int tag;
  const double* data;
};
struct Base {
  int* counts;
};
struct Params : Base {  // counts at 0
  const float* in;      // 8
  int n;                // 16
  float* out;           // 24
  Inner inner;          // 32: tag 32, data 40
  float* slots[2];      // 48, 56
  char c;               // 64
  __half* h;            // 72
  void (*callback)(int);  // 80: a code address, not a buffer
};

extern "C" __global__ void plain(int n, const float* x, float* y, const int* const* table) {
  if (threadIdx.x < n) y[threadIdx.x] = x[threadIdx.x] + **table;
}

extern "C" __global__ void by_value(Params p, Inner q, float4 v) {
  p.out[0] = p.in[0] + q.tag + v.x;
  undeclared_function_in_a_body(p);  // body errors must not cost the signature
}

namespace ops {
__global__ void scale(float* p, float s, const __half* h, const float4* v) { p[0] *= s; }
__global__ void scale(double* p, double s) { p[0] *= s; }
}  // namespace ops

template <typename T, int N>
__global__ void fill(T* out, T value, int n) {
  if (threadIdx.x < n) out[threadIdx.x * N] = value;
}
template __global__ void fill<double, 2>(double*, double, int);

template <typename T>
__global__ void copy(const T* in, T* out) { out[0] = in[0]; }

void launch(int* d, const float4* a, float4* b) {
  fill<int, 1><<<1, 32>>>(d, 7, 32);
  copy<float4><<<1, 1>>>(a, b);
}
)cuda";

struct Kernel {
  std::string name;
  nlohmann::json params;
};

class Scan : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tool = std::getenv("PHOS_INSTRUMENT");
    if (tool == nullptr || *tool == '\0') GTEST_SKIP() << "PHOS_INSTRUMENT not set";
    tool_ = tool;
    char tmpl[] = "/tmp/phos-scan-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::string write(const std::string& name, std::string_view text) {
    fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path.string();
  }

  Result<ProcessOutput> scan(std::vector<std::string> args) {
    args.insert(args.begin(), {tool_, "scan"});
    return runCapture(args);
  }

  // Runs the scan and returns the database's kernels by name.
  std::map<std::string, nlohmann::json> scanOk(std::vector<std::string> args) {
    Result<ProcessOutput> r = scan(std::move(args));
    EXPECT_THAT(r, IsOk());
    if (!r.isOk()) return {};
    EXPECT_EQ(r->exitCode, 0) << r->err;
    lastErr_ = r->err;
    nlohmann::json db = nlohmann::json::parse(r->out, nullptr, false);
    EXPECT_FALSE(db.is_discarded()) << r->out;
    EXPECT_EQ(db.value("version", 0), 1);
    std::map<std::string, nlohmann::json> kernels;
    for (const nlohmann::json& k : db["kernels"]) kernels[k["name"]] = k["params"];
    return kernels;
  }

  static std::set<std::string> names(const std::map<std::string, nlohmann::json>& kernels) {
    std::set<std::string> out;
    for (const auto& [name, params] : kernels) out.insert(name);
    return out;
  }

  // offset -> {type, const} of one parameter's pointers.
  static std::map<int, std::pair<std::string, bool>> pointers(const nlohmann::json& param) {
    std::map<int, std::pair<std::string, bool>> out;
    for (const nlohmann::json& p : param["pointers"]) {
      out[p["offset"].get<int>()] = {p["type"].get<std::string>(), p["const"].get<bool>()};
    }
    return out;
  }

  static std::set<std::string> ptxEntries(const std::string& ptx) {
    std::set<std::string> out;
    std::regex entry(R"(\.entry\s+([A-Za-z0-9_$]+))");
    for (auto it = std::sregex_iterator(ptx.begin(), ptx.end(), entry); it != std::sregex_iterator();
         ++it) {
      out.insert((*it)[1]);
    }
    return out;
  }

  std::string tool_;
  fs::path dir_;
  std::string lastErr_;
};

TEST_F(Scan, ExternCKernelKeepsItsNameAndPointeeConstness) {
  auto kernels = scanOk({write("k.cu", kKernels)});
  ASSERT_TRUE(kernels.count("plain")) << lastErr_;
  const nlohmann::json& params = kernels["plain"];
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0]["type"], "int");
  EXPECT_TRUE(params[0]["pointers"].empty());
  EXPECT_EQ(params[1]["type"], "const float *");
  EXPECT_EQ(pointers(params[1]), (std::map<int, std::pair<std::string, bool>>{
                                     {0, {"const float *", true}}}));
  EXPECT_EQ(pointers(params[2]), (std::map<int, std::pair<std::string, bool>>{
                                     {0, {"float *", false}}}));
  // The kernel may not write the table of pointers, only (maybe) through them.
  EXPECT_EQ(pointers(params[3]), (std::map<int, std::pair<std::string, bool>>{
                                     {0, {"const int *const *", true}}}));
  EXPECT_THAT(lastErr_, HasSubstr("error(s) while parsing"));  // the body of by_value
}

TEST_F(Scan, StructByValueRecordsEachPointerMemberAtItsOffset) {
  auto kernels = scanOk({write("k.cu", kKernels)});
  ASSERT_TRUE(kernels.count("by_value")) << lastErr_;
  const nlohmann::json& params = kernels["by_value"];
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[0]["type"], "Params");
  EXPECT_EQ(pointers(params[0]), (std::map<int, std::pair<std::string, bool>>{
                                     {0, {"int *", false}},
                                     {8, {"const float *", true}},
                                     {24, {"float *", false}},
                                     {40, {"const double *", true}},
                                     {48, {"float *", false}},
                                     {56, {"float *", false}},
                                     {72, {"__half *", false}},
                                 }));
  EXPECT_EQ(pointers(params[1]), (std::map<int, std::pair<std::string, bool>>{
                                     {8, {"const double *", true}}}));
  EXPECT_EQ(params[2]["type"], "float4");
  EXPECT_TRUE(params[2]["pointers"].empty());
}

TEST_F(Scan, CppKernelsAreNamedByTheirItaniumMangling) {
  auto kernels = scanOk({write("k.cu", kKernels)});
  EXPECT_TRUE(kernels.count("_ZN3ops5scaleEPffPK6__halfPK6float4")) << lastErr_;
  EXPECT_TRUE(kernels.count("_ZN3ops5scaleEPdd")) << lastErr_;
}

TEST_F(Scan, EveryTemplateInstantiationIsAKernel) {
  auto kernels = scanOk({write("k.cu", kKernels)});
  // Explicit instantiation, and the implicit ones the host launches create.
  ASSERT_TRUE(kernels.count("_Z4fillIdLi2EEvPT_S0_i")) << lastErr_;
  ASSERT_TRUE(kernels.count("_Z4fillIiLi1EEvPT_S0_i")) << lastErr_;
  ASSERT_TRUE(kernels.count("_Z4copyI6float4EvPKT_PS1_")) << lastErr_;
  EXPECT_EQ(kernels["_Z4fillIdLi2EEvPT_S0_i"][0]["type"], "double *");
  EXPECT_EQ(pointers(kernels["_Z4copyI6float4EvPKT_PS1_"][0]),
            (std::map<int, std::pair<std::string, bool>>{{0, {"const float4 *", true}}}));
  int fills = 0;
  for (const std::string& name : names(kernels)) fills += name.rfind("_Z4fill", 0) == 0;
  EXPECT_EQ(fills, 2);  // the two instantiations; the template itself is no kernel
}

TEST_F(Scan, NamesEqualTheEntriesNvccWrites) {
  const char* nvcc = std::getenv("PHOS_NVCC");
  if (nvcc == nullptr || *nvcc == '\0') GTEST_SKIP() << "PHOS_NVCC not set";
  std::string source = write("k.cu", kKernels);
  // The same file with a body nvcc accepts.
  std::string nvccSource = kKernels.data();
  nvccSource.replace(nvccSource.find("undeclared_function_in_a_body(p);"),
                     std::string("undeclared_function_in_a_body(p);").size(), "");
  std::string nvccFile = write("nvcc/k.cu", nvccSource);
  std::string ptx = (dir_ / "k.ptx").string();
  Result<ProcessOutput> compiled =
      runCapture({nvcc, "-ptx", "-arch=sm_80", nvccFile, "-o", ptx});
  ASSERT_THAT(compiled, IsOk());
  ASSERT_EQ(compiled->exitCode, 0) << compiled->err;
  std::ifstream in(ptx);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(names(scanOk({source})), ptxEntries(text.str()));

  const char* root = std::getenv("PHOS_SOURCE_ROOT");
  ASSERT_NE(root, nullptr);
  std::string mlp = std::string(root) + "/examples/mlp/mlp_kernels.cu";
  std::string mlpPtx = (dir_ / "mlp.ptx").string();
  compiled = runCapture({nvcc, "-ptx", "-arch=sm_80", mlp, "-o", mlpPtx});
  ASSERT_THAT(compiled, IsOk());
  ASSERT_EQ(compiled->exitCode, 0) << compiled->err;
  std::ifstream mlpIn(mlpPtx);
  std::stringstream mlpText;
  mlpText << mlpIn.rdbuf();
  EXPECT_EQ(names(scanOk({mlp})), ptxEntries(mlpText.str()));
}

// The corpus PTX the build compiled with nvcc -O3 -arch=sm_80: every .entry has a
// scanned kernel of the same name. cluster_sum is sm_90-only (#if __CUDA_ARCH__), and
// the host-side scan sees it.
TEST_F(Scan, CorpusNamesEqualTheBuildsPtx) {
  const char* corpus = std::getenv("PHOS_CORPUS_DIR");
  const char* ptxDir = std::getenv("PHOS_CORPUS_PTX_DIR");
  if (corpus == nullptr || ptxDir == nullptr || *ptxDir == '\0') {
    GTEST_SKIP() << "PHOS_CORPUS_DIR/PHOS_CORPUS_PTX_DIR not set (no nvcc)";
  }
  for (const char* source : {"saxpy", "matmul", "reduce", "normalize", "adam", "atomics",
                             "half_bf16", "misc", "warp_tensor"}) {
    SCOPED_TRACE(source);
    std::ifstream in(std::string(ptxDir) + "/corpus_" + source + "_O3.ptx");
    ASSERT_TRUE(in) << "missing PTX for " << source;
    std::stringstream text;
    text << in.rdbuf();
    std::set<std::string> ptx = ptxEntries(text.str());
    std::set<std::string> scanned =
        names(scanOk({std::string(corpus) + "/" + source + ".cu"}));
    EXPECT_THAT(ptx, IsSubsetOf(scanned));
    for (const std::string& name : scanned) {
      if (!ptx.count(name)) {
        EXPECT_EQ(name, "cluster_sum");
      }
    }
  }
}

TEST_F(Scan, CorpusStructArgsLayout) {
  const char* corpus = std::getenv("PHOS_CORPUS_DIR");
  if (corpus == nullptr) GTEST_SKIP() << "PHOS_CORPUS_DIR not set";
  auto kernels = scanOk({std::string(corpus) + "/misc.cu"});
  ASSERT_TRUE(kernels.count("struct_args"));
  const nlohmann::json& params = kernels["struct_args"];
  EXPECT_EQ(pointers(params[0]), (std::map<int, std::pair<std::string, bool>>{
                                     {0, {"const float *", true}}, {8, {"float *", false}}}));
  EXPECT_TRUE(params[1]["pointers"].empty());
  EXPECT_EQ(pointers(params[2]), (std::map<int, std::pair<std::string, bool>>{
                                     {0, {"const char *", true}}}));
}

TEST_F(Scan, DefinesAndIncludeDirectoriesReachClang) {
  write("inc/params.h", "struct Pair { float* a; const float* b; };\n");
  std::string source = write("d.cu",
                             "#include \"params.h\"\n"
                             "#ifdef WITH_EXTRA\n"
                             "extern \"C\" __global__ void extra(Pair p) {}\n"
                             "#endif\n"
                             "extern \"C\" __global__ void base(int* p) {}\n");
  auto plain = scanOk({source});
  EXPECT_EQ(names(plain), (std::set<std::string>{"base"}));
  auto withExtra = scanOk({source, "-D", "WITH_EXTRA", "-I", (dir_ / "inc").string()});
  ASSERT_TRUE(withExtra.count("extra")) << lastErr_;
  EXPECT_EQ(pointers(withExtra["extra"][0]),
            (std::map<int, std::pair<std::string, bool>>{{0, {"float *", false}},
                                                         {8, {"const float *", true}}}));
}

TEST_F(Scan, CompileCommandsSupplyIncludePathsAndMacros) {
  write("inc/params.h", "struct Pair { float* a; const float* b; };\n");
  std::string source = write("src/p.cu",
                             "#include \"params.h\"\n"
                             "#if PAIR_KERNEL\n"
                             "extern \"C\" __global__ void pair(Pair p) {}\n"
                             "#endif\n");
  // An nvcc command as CMake writes it; the nvcc-only flags are dropped.
  nlohmann::json db = nlohmann::json::array(
      {{{"directory", dir_.string()},
        {"file", source},
        {"command", "/usr/local/cuda/bin/nvcc -forward-unknown-to-host-compiler -I" +
                        (dir_ / "inc").string() +
                        " -DPAIR_KERNEL=1 --generate-code=arch=compute_80,code=[sm_80] "
                        "-Xcompiler=-fPIC -std=c++17 -x cu -c " + source + " -o p.o"}}});
  write("build/compile_commands.json", db.dump());
  auto kernels = scanOk({source, "-p", (dir_ / "build").string()});
  ASSERT_TRUE(kernels.count("pair")) << lastErr_;
  EXPECT_EQ(pointers(kernels["pair"][0]).size(), 2u);
}

TEST_F(Scan, UnknownParameterTypeSkipsTheKernelWithAWarning) {
  std::string source = write("u.cu",
                             "extern \"C\" __global__ void good(float* p) {}\n"
                             "extern \"C\" __global__ void bad(NoSuchType* p) {}\n");
  auto kernels = scanOk({source});
  EXPECT_EQ(names(kernels), (std::set<std::string>{"good"}));
  EXPECT_THAT(lastErr_, HasSubstr("skipped kernel 'bad'"));
}

TEST_F(Scan, MergeAddsToAnExistingDatabase) {
  std::string out = (dir_ / "db.json").string();
  std::string a = write("a.cu", "extern \"C\" __global__ void ka(float* p) {}\n");
  std::string b = write("b.cu", "extern \"C\" __global__ void kb(const int* p) {}\n");
  Result<ProcessOutput> r = scan({a, "-o", out});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exitCode, 0) << r->err;
  r = scan({b, "-o", out, "--merge"});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exitCode, 0) << r->err;
  std::ifstream in(out);
  nlohmann::json db = nlohmann::json::parse(in);
  std::set<std::string> merged;
  for (const nlohmann::json& k : db["kernels"]) merged.insert(k["name"]);
  EXPECT_EQ(merged, (std::set<std::string>{"ka", "kb"}));
  // Without --merge the file is replaced.
  r = scan({b, "-o", out});
  ASSERT_EQ(r->exitCode, 0) << r->err;
  std::ifstream again(out);
  EXPECT_EQ(nlohmann::json::parse(again)["kernels"].size(), 1u);
}

TEST_F(Scan, MissingSourceIsAnError) {
  Result<ProcessOutput> r = scan({(dir_ / "nope.cu").string()});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 1);
  EXPECT_THAT(r->err, HasSubstr("no such source file"));
  EXPECT_THAT(r->err, HasSubstr("nope.cu"));
}

TEST_F(Scan, NoKernelsIsAnErrorUnlessAllowed) {
  std::string source = write("host.cu", "int add(int a, int b) { return a + b; }\n");
  std::string out = (dir_ / "empty.json").string();
  Result<ProcessOutput> r = scan({source, "-o", out});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 1);
  EXPECT_THAT(r->err, HasSubstr("no __global__ functions"));
  EXPECT_FALSE(fs::exists(out));

  r = scan({source, "-o", out, "--allow-empty"});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 0) << r->err;
  std::ifstream in(out);
  nlohmann::json db = nlohmann::json::parse(in);
  EXPECT_TRUE(db["kernels"].empty());
}

TEST_F(Scan, UnwritableOutputIsAnError) {
  std::string source = write("k.cu", "extern \"C\" __global__ void k(float* p) {}\n");
  Result<ProcessOutput> r = scan({source, "-o", (dir_ / "no" / "such" / "db.json").string()});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 1);
  EXPECT_THAT(r->err, HasSubstr("cannot write"));
}

TEST_F(Scan, UnreadableCompileCommandsIsAnError) {
  std::string source = write("k.cu", "extern \"C\" __global__ void k(float* p) {}\n");
  Result<ProcessOutput> r = scan({source, "-p", (dir_ / "nobuild").string()});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exitCode, 1);
  EXPECT_THAT(r->err, HasSubstr("compile_commands.json"));
}

}  // namespace
}  // namespace phos
