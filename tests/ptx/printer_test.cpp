// SPDX-License-Identifier: Apache-2.0
// Printer tests: golden files (input PTX and expected printed PTX in one file) and
// single-node printing. PHOS_UPDATE_GOLDEN=1 rewrites the expected halves.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "phos/common/subprocess.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "status_matchers.h"

namespace phos::ptx {
namespace {

using ::phos::testing::IsOk;

// Separates the input from the expected output in a golden file. It is a PTX
// comment, so the input half is an ordinary PTX file.
constexpr std::string_view kMarker = "// ==== expected output ====\n";

std::vector<std::filesystem::path> goldenFiles() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(PHOS_GOLDEN_DIR)) {
    if (e.path().extension() == ".golden") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string readFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(PtxPrinterGolden, DirectoryHasCases) { EXPECT_GE(goldenFiles().size(), 4u); }

TEST(PtxPrinterGolden, PrintsExpectedText) {
  bool update = std::getenv("PHOS_UPDATE_GOLDEN") != nullptr;
  for (const auto& path : goldenFiles()) {
    SCOPED_TRACE(path.string());
    std::string text = readFile(path);
    size_t cut = text.find(kMarker);
    ASSERT_NE(cut, std::string::npos) << "no expected-output marker";
    std::string input = text.substr(0, cut);
    std::string expected = text.substr(cut + kMarker.size());
    Result<Module> m = parseModule(input, path.filename().string());
    ASSERT_THAT(m, IsOk());
    std::string printed = print(*m);
    if (update) {
      std::ofstream(path, std::ios::binary) << input << kMarker << printed;
      continue;
    }
    EXPECT_EQ(printed, expected);
    // The expected text is itself a fixed point of parse + print.
    Result<Module> again = parseModule(expected, "expected");
    ASSERT_THAT(again, IsOk());
    EXPECT_TRUE(*again == *m);
    EXPECT_EQ(print(*again), expected);
  }
}

TEST(PtxPrinterGolden, ExpectedTextAssembles) {
  const char* ptxas = std::getenv("PHOS_PTXAS");
  if (!ptxas || !*ptxas) GTEST_SKIP() << "ptxas not found";
  for (const auto& path : goldenFiles()) {
    SCOPED_TRACE(path.string());
    std::string text = readFile(path);
    size_t cut = text.find(kMarker);
    ASSERT_NE(cut, std::string::npos);
    std::string expected = text.substr(cut + kMarker.size());
    Result<Module> m = parseModule(expected, "expected");
    ASSERT_THAT(m, IsOk());
    ASSERT_FALSE(m->target.empty());
    char tmpl[] = "/tmp/phos-golden-XXXXXX.ptx";
    int fd = mkstemps(tmpl, 4);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, expected.data(), expected.size()),
              static_cast<ssize_t>(expected.size()));
    close(fd);
    Result<ProcessOutput> r = runCapture({ptxas, "-arch=" + m->target[0], tmpl, "-o", "/dev/null"});
    unlink(tmpl);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->exitCode, 0) << r->err;
  }
}

TEST(PtxPrinter, Operands) {
  EXPECT_EQ(print(Operand::reg("%tid", 'x')), "%tid.x");
  EXPECT_EQ(print(Operand::imm(-3)), "-3");
  EXPECT_EQ(print(Operand::f32(0x3F800000)), "0f3F800000");
  EXPECT_EQ(print(Operand::f64(0x3FF0000000000000)), "0d3FF0000000000000");
  EXPECT_EQ(print(Operand::addrReg("%rd1", -256)), "[%rd1+-256]");
  EXPECT_EQ(print(Operand::addrSymbol("param0")), "[param0]");
  EXPECT_EQ(print(Operand::addrReg("", 64)), "[64]");
  EXPECT_EQ(print(Operand::vector({Operand::reg("%r1"), Operand::sink()})), "{%r1, _}");
  EXPECT_EQ(print(Operand::list({Operand::symbol("retval0")})), "(retval0)");
  Operand g = Operand::symbol("g_table", 4);
  g.generic = true;
  EXPECT_EQ(print(g), "generic(g_table)+4");
}

TEST(PtxPrinter, Declarations) {
  VarDecl regs;
  regs.space = StateSpace::kReg;
  regs.type = Type::kB32;
  regs.name = "%r";
  regs.rangeCount = 12;
  EXPECT_EQ(print(regs), ".reg .b32 \t%r<12>");

  VarDecl param;
  param.space = StateSpace::kParam;
  param.align = 8;
  param.type = Type::kB8;
  param.name = "k_param_0";
  param.dims = {24};
  EXPECT_EQ(print(param), ".param .align 8 .b8 \tk_param_0[24]");

  VarDecl dyn;
  dyn.linkage = Linkage::kExtern;
  dyn.space = StateSpace::kShared;
  dyn.align = 16;
  dyn.type = Type::kB8;
  dyn.name = "smem";
  dyn.dims = {0};
  EXPECT_EQ(print(dyn), ".extern .shared .align 16 .b8 \tsmem[]");

  VarDecl ptr;
  ptr.space = StateSpace::kParam;
  ptr.type = Type::kU64;
  ptr.isPtr = true;
  ptr.ptrSpace = StateSpace::kGlobal;
  ptr.ptrAlign = 4;
  ptr.name = "p";
  EXPECT_EQ(print(ptr), ".param .u64 .ptr .global .align 4 \tp");
}

TEST(PtxPrinter, NonHexFloatLiteralsPrintExactly) {
  // Decimal literals are kept as the double they denote, printed in hex form.
  Result<std::vector<Statement>> s = parseStatements("mov.f64 %fd1, 1.5;");
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(print(std::get<Instruction>((*s)[0].value)), "mov.f64 \t%fd1, 0d3FF8000000000000;");
}

}  // namespace
}  // namespace phos::ptx
