// SPDX-License-Identifier: Apache-2.0
// The engine's table of what it does with each PTX opcode (opcode_coverage.h)
// against what it does: every opcode it does not execute faults naming
// itself when run, or is refused at load naming its line; every opcode it
// executes is run by a test that checks it against the ISA's semantics or a
// reference (ptx_semantics_test.cpp, the kernels of kernels_test.cpp and
// twin_equivalence_test.cpp). The table of docs/vgpu-engine.md is rendered
// from it: run with PHOS_UPDATE_DOCS=1 to write it after a change.
#include "opcode_coverage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "engine_harness.h"
#include "status_matchers.h"

namespace phos::vgpu::engine::testing {
namespace {

namespace fs = std::filesystem;
using ::phos::testing::IsOk;
using ::testing::HasSubstr;

// One instruction of every opcode the engine does not execute, as the ISA
// spells it.
const std::map<std::string, std::string>& samples() {
  static const std::map<std::string, std::string> kSamples = {
      {"alloca", "alloca.u64 %rd3, 16;"},
      {"brx", "ts: .branchtargets L0, L1;\n  brx.idx %r1, ts;\nL0:\nL1:"},
      {"getctarank", "getctarank.u32 %r1, %rd2;"},
      {"mapa", "mapa.u64 %rd3, %rd2, 0;"},
      {"multimem", "multimem.ld_reduce.relaxed.sys.global.add.u32 %r1, [%rd2];"},
      {"setmaxnreg", "setmaxnreg.inc.sync.aligned.u32 240;"},
      {"stackrestore", "stackrestore.u64 %rd3;"},
      {"stacksave", "stacksave.u64 %rd3;"},
      {"sured", "sured.b.add.1d.u32.trap [%rd2, {%r0}], %r1;"},
      {"tensormap", "tensormap.replace.tile.global_address.global.b1024.b64 [%rd2], %rd3;"},
      {"vabsdiff", "vabsdiff.u32.u32.u32 %r1, %r2, %r3;"},
      {"vabsdiff2", "vabsdiff2.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vabsdiff4", "vabsdiff4.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vadd", "vadd.u32.u32.u32 %r1, %r2, %r3;"},
      {"vadd2", "vadd2.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vadd4", "vadd4.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vavrg2", "vavrg2.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vavrg4", "vavrg4.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vmad", "vmad.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vmax", "vmax.u32.u32.u32 %r1, %r2, %r3;"},
      {"vmax2", "vmax2.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vmax4", "vmax4.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vmin", "vmin.u32.u32.u32 %r1, %r2, %r3;"},
      {"vmin2", "vmin2.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vmin4", "vmin4.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vset", "vset.u32.u32.eq %r1, %r2, %r3;"},
      {"vset2", "vset2.u32.u32.eq %r1, %r2, %r3, %r4;"},
      {"vset4", "vset4.u32.u32.eq %r1, %r2, %r3, %r4;"},
      {"vshl", "vshl.u32.u32.u32.clamp %r1, %r2, %r3;"},
      {"vshr", "vshr.u32.u32.u32.clamp %r1, %r2, %r3;"},
      {"vsub", "vsub.u32.u32.u32 %r1, %r2, %r3;"},
      {"vsub2", "vsub2.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"vsub4", "vsub4.u32.u32.u32 %r1, %r2, %r3, %r4;"},
      {"wgmma", "wgmma.fence.sync.aligned;"},
  };
  return kSamples;
}

TEST(OpcodeCoverage, EveryOpcodeOnceInTheOrderOfTheParsersTable) {
  const auto table = opcodeCoverage();
  ASSERT_EQ(table.size(), static_cast<size_t>(ptx::Opcode::kCount) - 1);
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(table[i].opcode), i + 1) << ptx::name(table[i].opcode);
    if (table[i].coverage != Coverage::kExecuted) {
      EXPECT_FALSE(table[i].note.empty())
          << ptx::name(table[i].opcode) << ": say which forms, or why not";
    }
  }
}

TEST(OpcodeCoverage, WhatTheEngineDoesNotExecuteFaultsOrIsRefusedNamingIt) {
  int checked = 0;
  for (const OpcodeCoverage& entry : opcodeCoverage()) {
    if (entry.coverage != Coverage::kFaultsWhenRun && entry.coverage != Coverage::kRefusedAtLoad)
      continue;
    const std::string name(ptx::name(entry.opcode));
    auto sample = samples().find(name);
    ASSERT_NE(sample, samples().end()) << "no sample instruction of " << name;
    Module m;
    Status loaded = m.load(kernel(sample->second, "", "sm_90"));
    if (entry.coverage == Coverage::kRefusedAtLoad) {
      ASSERT_FALSE(loaded.isOk()) << name << " loads";
      EXPECT_THAT(loaded.message(), ::testing::ContainsRegex("(:1[67]:|line 1[67])"))
          << name;  // names its line
    } else {
      ASSERT_THAT(loaded, IsOk()) << name;
      uint32_t* in = m.memory().alloc<uint32_t>(64);
      uint32_t* out = m.memory().alloc<uint32_t>(64);
      Status ran = m.launch("k", {1}, {1}, Params().add(out).add(in));
      EXPECT_THAT(ran.message(), HasSubstr("CUDA_ERROR_ILLEGAL_INSTRUCTION")) << name;
      EXPECT_THAT(ran.message(),
                  HasSubstr("unsupported instruction " + name + ": " + std::string(entry.note)))
          << name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(samples().size()))
      << "a sample of an opcode the table says is executed";
}

// The tests that run PTX and check what it computes, and the opcodes each
// uses: ptx_semantics_test.cpp's inline kernels, and the PTX that nvcc made
// of kernels/*.cu for kernels_test.cpp and twin_equivalence_test.cpp.
std::map<std::string, std::set<std::string>> testsByOpcode() {
  const std::regex instruction(R"(^\s*(?:\{\s*)?(?:@!?%\w+\s+)?([a-z][a-z0-9_]*)(?:[.\s]|$))");
  std::map<std::string, std::set<std::string>> found;
  auto scan = [&](const fs::path& file, const std::string& test) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      std::stringstream statements(line);
      std::string statement;
      while (std::getline(statements, statement, ';')) {
        std::smatch m;
        if (std::regex_search(statement, m, instruction)) found[m[1]].insert(test);
      }
    }
  };
  scan(fs::path(PHOS_SOURCE_ROOT) / "tests/vgpu/engine/ptx_semantics_test.cpp",
       "ptx_semantics_test.cpp");
  for (const auto& entry : fs::directory_iterator(PHOS_ENGINE_PTX_DIR)) {
    const std::string file = entry.path().filename().string();
    if (entry.path().extension() != ".ptx" || file.starts_with("corpus_"))
      continue;  // corpus: loaded only
    std::string source = entry.path().stem().string();
    if (source.ends_with("_sm90")) source.resize(source.size() - 5);
    scan(entry.path(), "kernels/" + source + ".cu");
  }
  return found;
}

TEST(OpcodeCoverage, WhatTheEngineExecutesIsCheckedByATest) {
  const auto found = testsByOpcode();
  ASSERT_FALSE(found.empty());
  for (const OpcodeCoverage& entry : opcodeCoverage()) {
    if (entry.coverage != Coverage::kExecuted && entry.coverage != Coverage::kSomeForms) continue;
    EXPECT_TRUE(found.contains(std::string(ptx::name(entry.opcode))))
        << ptx::name(entry.opcode) << " is executed, and no test runs it";
  }
}

// The table as docs/vgpu-engine.md shows it.
std::string render() {
  const auto found = testsByOpcode();
  std::map<Coverage, int> counts;
  std::string rows;
  for (const OpcodeCoverage& entry : opcodeCoverage()) {
    ++counts[entry.coverage];
    const std::string name(ptx::name(entry.opcode));
    std::string checkedBy = "opcode_coverage_test.cpp";
    if (entry.coverage == Coverage::kExecuted || entry.coverage == Coverage::kSomeForms) {
      checkedBy.clear();
      auto tests = found.find(name);
      int shown = 0;
      // The focused test first, then at most two kernels.
      if (tests != found.end() && tests->second.contains("ptx_semantics_test.cpp")) {
        checkedBy = "ptx_semantics_test.cpp";
        ++shown;
      }
      for (const std::string& t : tests != found.end() ? tests->second : std::set<std::string>{}) {
        if (t == "ptx_semantics_test.cpp" || shown == 2) continue;
        checkedBy += (checkedBy.empty() ? "" : ", ") + t;
        ++shown;
      }
    }
    rows += "| `" + name + "` | " + std::string(coverageName(entry.coverage)) + " | " +
            std::string(entry.note) + " | " + checkedBy + " |\n";
  }
  std::string out =
      "<!-- opcode-coverage: rendered by tests/vgpu/engine/opcode_coverage_test.cpp from "
      "vgpu/engine/src/opcode_coverage.cpp; PHOS_UPDATE_DOCS=1 writes it -->\n";
  out += std::to_string(opcodeCoverage().size()) +
         " opcodes: " + std::to_string(counts[Coverage::kExecuted]) + " executed, " +
         std::to_string(counts[Coverage::kSomeForms]) + " executed in some forms, " +
         std::to_string(counts[Coverage::kFaultsWhenRun]) + " fault when run, " +
         std::to_string(counts[Coverage::kRefusedAtLoad]) + " refused at load.\n\n";
  out += "| opcode | vgpu | forms, or why not | checked by |\n|---|---|---|---|\n" + rows;
  out += "<!-- opcode-coverage end -->\n";
  return out;
}

TEST(OpcodeCoverage, TheDocumentsTableIsTheEngines) {
  const fs::path doc = fs::path(PHOS_SOURCE_ROOT) / "docs/vgpu-engine.md";
  std::ifstream in(doc);
  ASSERT_TRUE(in) << doc;
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  const std::string begin = "<!-- opcode-coverage:", end = "<!-- opcode-coverage end -->\n";
  const size_t from = all.find(begin), to = all.find(end);
  ASSERT_NE(from, std::string::npos) << doc << " has no opcode table";
  ASSERT_NE(to, std::string::npos) << doc << " has no end to its opcode table";
  const std::string now = render();
  if (std::getenv("PHOS_UPDATE_DOCS") != nullptr) {
    std::ofstream(doc) << all.substr(0, from) + now + all.substr(to + end.size());
    return;
  }
  EXPECT_EQ(all.substr(from, to + end.size() - from), now)
      << "docs/vgpu-engine.md's opcode table is not the engine's: run this test with "
         "PHOS_UPDATE_DOCS=1";
}

}  // namespace
}  // namespace phos::vgpu::engine::testing
