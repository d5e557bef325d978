// SPDX-License-Identifier: Apache-2.0
// Malformed PTX: every error names line:column and what was expected; nothing crashes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "phos/ptx/parser.h"
#include "status_matchers.h"

namespace phos::ptx {
namespace {

using ::phos::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::string_view kHeader = ".version 9.0\n.target sm_80\n.address_size 64\n";

// Wraps `body` in a kernel whose first body line is line 6 of the file.
std::string kernel(std::string_view body) {
  return std::string(kHeader) + ".visible .entry k()\n{\n" + std::string(body) + "\n}\n";
}

struct ErrorCase {
  const char* name;
  std::string text;
  const char* position;  // "file:line:column"
  const char* message;   // a part of what follows the position
};

class PtxParseErrors : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(PtxParseErrors, ReportsPositionAndExpectation) {
  const ErrorCase& c = GetParam();
  Result<Module> m = parseModule(c.text, "bad.ptx");
  ASSERT_THAT(m, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(m.status().message(), StartsWith(std::string(c.position) + ": "));
  EXPECT_THAT(m.status().message(), HasSubstr(c.message));
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, PtxParseErrors,
    ::testing::Values(
        // Truncated input at several points.
        ErrorCase{"TruncatedInFunctionBody",
                  std::string(kHeader) + ".visible .entry k()\n{\n\tret;\n", "bad.ptx:7:1",
                  "expected '}' to close the function body, found end of input"},
        ErrorCase{"TruncatedInstruction", kernel("\tadd.s32 %r1, %r2,"), "bad.ptx:7:1",
                  "expected an operand, found '}'"},
        ErrorCase{"TruncatedParameterList",
                  std::string(kHeader) + ".visible .entry k(\n\t.param .u64 p", "bad.ptx:5:15",
                  "expected ')' to close the parameter list, found end of input"},
        ErrorCase{"TruncatedVersion", ".version", "bad.ptx:1:9",
                  "expected a version number, found end of input"},
        ErrorCase{"UnknownVariableAttribute",
                  std::string(kHeader) + ".global .attribute(.unified) .u32 x;\n", "bad.ptx:4:20",
                  "expected a variable attribute (.managed), found '.unified'"},
        ErrorCase{"ManagedOutsideGlobal",
                  std::string(kHeader) + ".const .attribute(.managed) .u32 x;\n", "bad.ptx:4:29",
                  ".attribute(.managed) applies to .global variables only"},
        ErrorCase{"MissingSemicolon", kernel("\tmov.u32 %r1, 1\n\tret;"), "bad.ptx:7:2",
                  "expected ';' after the operands of mov, found 'ret'"},
        ErrorCase{"UnterminatedString", std::string(kHeader) + ".file 1 \"/src/k.cu\n",
                  "bad.ptx:4:9", "unterminated string"},
        ErrorCase{"UnterminatedComment", kernel("\t/* never closed"), "bad.ptx:6:2",
                  "unterminated /* comment"},
        ErrorCase{"UnterminatedBlock",
                  std::string(kHeader) + ".visible .entry k()\n{\n\t{\n\tret;\n}\n", "bad.ptx:9:1",
                  "expected '}' to close the function body"},
        // Unknown opcodes, modifiers and directives.
        ErrorCase{"UnknownOpcode", kernel("\tfrobnicate.u32 %r1, %r2;"), "bad.ptx:6:2",
                  "unknown opcode 'frobnicate'"},
        ErrorCase{"UnknownModifier", kernel("\tadd.q32 %r1, %r2, %r3;"), "bad.ptx:6:5",
                  "unknown modifier '.q32' on add"},
        ErrorCase{"UnknownModuleDirective", std::string(kHeader) + ".bogus 1;\n", "bad.ptx:4:1",
                  "unknown directive '.bogus'"},
        ErrorCase{"UnknownBodyDirective", kernel("\t.bogus 1;"), "bad.ptx:6:2",
                  "unknown directive '.bogus' in a function body"},
        // Bad operands.
        ErrorCase{"BadAddressBase", kernel("\tld.global.u32 %r1, [+4];"), "bad.ptx:6:22",
                  "expected a register, symbol or immediate address, found '+'"},
        ErrorCase{"UnclosedAddress", kernel("\tld.global.u32 %r1, [%rd1+4;"), "bad.ptx:6:28",
                  "expected ']' to close the address, found ';'"},
        ErrorCase{"UnclosedVector", kernel("\tld.global.v2.u32 {%r1, %r2 [%rd1];"), "bad.ptx:6:29",
                  "expected '}' to close the vector, found '['"},
        ErrorCase{"ShortFloatLiteral", kernel("\tmov.f32 %f1, 0f3F80;"), "bad.ptx:6:15",
                  "expected 8 hex digits in float literal"},
        ErrorCase{"MalformedNumber", kernel("\tmov.u32 %r1, 12abc;"), "bad.ptx:6:15",
                  "malformed number"},
        ErrorCase{"IntegerOutOfRange", kernel("\tmov.u64 %rd1, 99999999999999999999999;"),
                  "bad.ptx:6:16", "out of range"},
        ErrorCase{"StrayCharacter", kernel("\tmov.u32 %r1, #1;"), "bad.ptx:6:15",
                  "unexpected character '#'"},
        ErrorCase{"GuardWithoutPredicate", kernel("\t@ 1 bra L1;"), "bad.ptx:6:4",
                  "expected a predicate register after '@', found '1'"},
        ErrorCase{"NegationWithoutPredicate", kernel("\tselp.b32 %r1, 1, 0, !3;"), "bad.ptx:6:23",
                  "expected a predicate after '!', found '3'"},
        // Bad declarations.
        ErrorCase{"AlignmentNotPowerOfTwo", kernel("\t.local .align 3 .b8 buf[4];"), "bad.ptx:6:16",
                  "alignment must be a power of two"},
        ErrorCase{"DeclarationWithoutType", kernel("\t.reg %r<4>;"), "bad.ptx:6:7",
                  "expected a type (.b32, .u64, .f32, ...), found '%r'"},
        ErrorCase{"ZeroRegisterCount", kernel("\t.reg .b32 %r<0>;"), "bad.ptx:6:15",
                  "register count must be > 0"},
        ErrorCase{"NegativeArraySize", kernel("\t.local .b8 buf[-4];"), "bad.ptx:6:18",
                  "array size must be positive"},
        ErrorCase{"EntryWithReturnParameters",
                  std::string(kHeader) + ".entry (.param .b32 r) k()\n{\n}\n", "bad.ptx:4:8",
                  "expected a kernel name (.entry has no return parameters)"},
        ErrorCase{"BadAddressSize", ".version 9.0\n.target sm_80\n.address_size 48\n",
                  "bad.ptx:3:1", "address size must be 32 or 64"},
        ErrorCase{"NegativeSectionOffset",
                  std::string(kHeader) + ".section .debug_info\n{\n.b64 $L__x-4\n}\n",
                  "bad.ptx:6:11", "section data has no negative offsets"},
        ErrorCase{"LocWithJunk", kernel("\t.loc 1 2 3, inlined 1 2 3"), "bad.ptx:6:14",
                  "expected function_name or inlined_at, found 'inlined'"}),
    [](const ::testing::TestParamInfo<ErrorCase>& p) { return std::string(p.param.name); });

TEST(PtxParseLimits, DeeplyNestedBlocksAreRefused) {
  std::string body(200, '{');
  body += std::string(200, '}');
  Result<Module> m = parseModule(kernel(body), "deep.ptx");
  ASSERT_THAT(m, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(m.status().message(), HasSubstr("blocks nested deeper than 64"));
}

TEST(PtxParseLimits, DeeplyNestedInitializersAreRefused) {
  std::string text = std::string(kHeader) + ".global .b32 x[1] = " + std::string(100, '{') +
                     "1" + std::string(100, '}') + ";\n";
  Result<Module> m = parseModule(text, "deep.ptx");
  ASSERT_THAT(m, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(m.status().message(), HasSubstr("operands nested deeper than 16"));
}

TEST(PtxParseLimits, OversizedInputIsRefused) {
  ParseLimits limits;
  limits.maxInputBytes = 16;
  Result<Module> m = parseModule(kHeader, "big.ptx", limits);
  EXPECT_THAT(m, StatusIs(Code::kResourceExhausted));
}

TEST(PtxParseErrorsRobustness, EveryPrefixOfAValidModuleFailsCleanlyOrParses) {
  // Truncation anywhere must give an error (or a valid shorter module), never a crash.
  std::string text = kernel(
      "\t.reg .b32 %r<4>;\n\t.reg .pred %p<2>;\n\tmov.u32 %r1, %tid.x;\n"
      "\tsetp.ge.u32 %p1, %r1, 32;\n\t@%p1 bra $L__BB0_2;\n"
      "\tst.global.v2.u32 [%rd1+-8], {%r1, %r2};\n$L__BB0_2:\n\tret;");
  size_t failures = 0;
  for (size_t n = 0; n < text.size(); ++n) {
    Result<Module> m = parseModule(std::string_view(text).substr(0, n), "prefix.ptx");
    if (!m.isOk()) {
      ++failures;
      EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << n;
      EXPECT_THAT(m.status().message(), StartsWith("prefix.ptx:")) << n;
    }
  }
  EXPECT_GT(failures, text.size() / 2);
}

}  // namespace
}  // namespace phos::ptx
