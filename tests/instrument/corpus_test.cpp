// SPDX-License-Identifier: Apache-2.0
// Round-trips one corpus PTX file (parse, print, parse, compare) and re-assembles the
// printed text with ptxas. The file and ptxas come from the environment (meson.build).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "phos/common/subprocess.h"
#include "phos/ptx/params.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "phos/ptx/resolve.h"
#include "status_matchers.h"

namespace phos::ptx {
namespace {

using ::phos::testing::IsOk;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class CorpusFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = env("PHOS_PTX_FILE");
    if (path_.empty()) GTEST_SKIP() << "PHOS_PTX_FILE not set";
    text_ = readFile(path_);
    ASSERT_FALSE(text_.empty()) << "cannot read " << path_;
  }
  std::string path_;
  std::string text_;
};

TEST_F(CorpusFile, RoundTripsToAnEqualAst) {
  Result<Module> first = parseModule(text_, path_);
  ASSERT_THAT(first, IsOk());
  std::string printed = print(*first);
  Result<Module> second = parseModule(printed, path_ + " (printed)");
  ASSERT_THAT(second, IsOk()) << printed.substr(0, 2000);
  EXPECT_TRUE(*first == *second) << "AST changed after print + parse";
  // Printing is a fixed point after one round.
  EXPECT_EQ(print(*second), printed);
}

TEST_F(CorpusFile, HasKernelsWithALayout) {
  Result<Module> mod = parseModule(text_, path_);
  ASSERT_THAT(mod, IsOk());
  Result<std::vector<ParamLayout>> layouts = computeParamLayouts(*mod);
  ASSERT_THAT(layouts, IsOk());
  EXPECT_FALSE(layouts->empty());
  for (const ParamLayout& l : *layouts) {
    uint32_t end = 0;
    for (const ParamInfo& p : l.params) {
      EXPECT_EQ(p.offset % p.alignment, 0u) << l.kernel << " " << p.name;
      EXPECT_GE(p.offset, end) << l.kernel << " " << p.name;
      end = p.offset + p.size;
    }
    EXPECT_EQ(l.totalSize, end);
  }
}

TEST_F(CorpusFile, EveryFunctionResolvesAndEveryInitializerEncodes) {
  Result<Module> mod = parseModule(text_, path_);
  ASSERT_THAT(mod, IsOk());
  size_t branches = 0;
  for (const ModuleItem& item : mod->items) {
    if (const auto* f = std::get_if<Function>(&item); f && f->hasBody) {
      Result<ResolvedFunction> r = ResolvedFunction::build(*f, &*mod);
      ASSERT_THAT(r, IsOk());
      for (const FlatInstruction& fi : r->instructions()) {
        if (fi.inst->opcode != Opcode::kBra) continue;
        ++branches;
        EXPECT_GE(fi.target, 0) << f->name << " line " << fi.inst->line;
      }
    } else if (const auto* v = std::get_if<VarDecl>(&item); v && v->linkage != Linkage::kExtern) {
      Result<std::vector<uint8_t>> bytes = encodeInitializer(
          *v, [](std::string_view) { return Result<uint64_t>(uint64_t{0x10000}); });
      ASSERT_THAT(bytes, IsOk()) << v->name;
      if (v->byteSize() > 0) {
        EXPECT_EQ(bytes->size(), v->byteSize()) << v->name;
      }
    }
  }
  RecordProperty("branches", static_cast<int>(branches));
}

TEST_F(CorpusFile, PrintedPtxAssembles) {
  std::string ptxas = env("PHOS_PTXAS");
  if (ptxas.empty()) GTEST_SKIP() << "ptxas not found";
  Result<Module> mod = parseModule(text_, path_);
  ASSERT_THAT(mod, IsOk());
  std::string printed = print(*mod);
  char tmpl[] = "/tmp/phos-ptx-XXXXXX.ptx";
  int fd = mkstemps(tmpl, 4);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, printed.data(), printed.size()), static_cast<ssize_t>(printed.size()));
  close(fd);
  std::stringstream archs(env("PHOS_PTXAS_ARCHS"));
  std::string arch;
  while (std::getline(archs, arch, ',')) {
    Result<ProcessOutput> r =
        runCapture({ptxas, "-arch=" + arch, tmpl, "-o", "/dev/null"});
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->exitCode, 0) << "ptxas -arch=" << arch << " rejected the printed "
                              << path_ << ":\n" << r->err;
  }
  unlink(tmpl);
}

}  // namespace
}  // namespace phos::ptx
