// SPDX-License-Identifier: Apache-2.0
// Validator-twin generator tests: golden files (input PTX, then the expected twin
// module with its statistics as a comment) and properties of the twin ABI.
// PHOS_UPDATE_GOLDEN=1 rewrites the expected halves.
#include "phos/instrument/twin.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "phos/common/subprocess.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "phos/ptx/resolve.h"
#include "status_matchers.h"

namespace phos::instrument {
namespace {

using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::HasSubstr;

constexpr std::string_view kMarker = "// ==== expected output ====\n";
constexpr std::string_view kRestoreMode = "// mode: restore\n";

std::vector<std::filesystem::path> goldenFiles() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(PHOS_TWIN_GOLDEN_DIR)) {
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

std::string statsLine(const TwinStats& s) {
  std::string kernels;
  for (const std::string& k : s.kernelsWithUncheckedCalls) kernels += " " + k;
  std::string globals;
  if (!s.globals.empty()) {
    globals = " globals:";
    for (const std::string& g : s.globals) globals += " " + g;
  }
  return "// stats: kernels=" + std::to_string(s.kernels) +
         " functions=" + std::to_string(s.functions) +
         " checked_stores=" + std::to_string(s.checkedStores) +
         " checked_loads=" + std::to_string(s.checkedLoads) +
         " unchecked_calls=" + std::to_string(s.uncheckedCalls) +
         " unchecked_accesses=" + std::to_string(s.uncheckedAccesses) +
         " kernels_with_unchecked_calls:" + kernels + globals + "\n";
}

struct Golden {
  std::string input;
  std::string expected;
  TwinOptions options;
};

Golden readGolden(const std::filesystem::path& path) {
  std::string text = readFile(path);
  size_t cut = text.find(kMarker);
  EXPECT_NE(cut, std::string::npos) << "no expected-output marker in " << path;
  if (cut == std::string::npos) cut = text.size();
  Golden g;
  g.input = text.substr(0, cut);
  g.expected = cut < text.size() ? text.substr(cut + kMarker.size()) : "";
  if (g.input.starts_with(kRestoreMode)) g.options.mode = TwinMode::kRestore;
  return g;
}

// The twin module of a golden input: its printed text behind the statistics line.
std::string render(const Golden& g, const std::string& name) {
  Result<ptx::Module> m = ptx::parseModule(g.input, name);
  EXPECT_THAT(m, IsOk());
  if (!m.isOk()) return "";
  TwinStats stats;
  Result<ptx::Module> twin = buildTwinModule(*m, g.options, &stats);
  EXPECT_THAT(twin, IsOk());
  if (!twin.isOk()) return "";
  return statsLine(stats) + ptx::print(*twin);
}

TEST(TwinGolden, DirectoryHasCases) {
  EXPECT_GE(goldenFiles().size(), 10u);
}

TEST(TwinGolden, ProducesExpectedText) {
  bool update = std::getenv("PHOS_UPDATE_GOLDEN") != nullptr;
  for (const auto& path : goldenFiles()) {
    SCOPED_TRACE(path.string());
    Golden g = readGolden(path);
    std::string actual = render(g, path.filename().string());
    if (update) {
      std::ofstream(path, std::ios::binary) << g.input << kMarker << actual;
      continue;
    }
    EXPECT_EQ(actual, g.expected);
    // The expected module reads back as the same text.
    Result<ptx::Module> again = ptx::parseModule(g.expected, "expected");
    ASSERT_THAT(again, IsOk());
    EXPECT_TRUE(g.expected.starts_with("// stats: "));
    EXPECT_EQ(ptx::print(*again), g.expected.substr(g.expected.find('\n') + 1));
  }
}

TEST(TwinGolden, ExpectedTextAssembles) {
  const char* ptxas = std::getenv("PHOS_PTXAS");
  if (!ptxas || !*ptxas) GTEST_SKIP() << "ptxas not found";
  for (const auto& path : goldenFiles()) {
    SCOPED_TRACE(path.string());
    Golden g = readGolden(path);
    char tmpl[] = "/tmp/phos-twin-golden-XXXXXX.ptx";
    int fd = mkstemps(tmpl, 4);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, g.expected.data(), g.expected.size()),
              static_cast<ssize_t>(g.expected.size()));
    close(fd);
    // -c: the -rdc cases call functions defined in other modules.
    Result<ProcessOutput> r = runCapture({ptxas, "-c", "-arch=sm_80", tmpl, "-o", "/dev/null"});
    unlink(tmpl);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->exitCode, 0) << r->err;
  }
}

// ---------------------------------------------------------------- properties

Result<ptx::Module> parseGoldenInput(const std::string& file) {
  Golden g = readGolden(std::filesystem::path(PHOS_TWIN_GOLDEN_DIR) / file);
  return ptx::parseModule(g.input, file);
}

std::vector<const ptx::Function*> functions(const ptx::Module& m) {
  std::vector<const ptx::Function*> out;
  for (const ptx::ModuleItem& item : m.items) {
    if (const auto* f = std::get_if<ptx::Function>(&item)) out.push_back(f);
  }
  return out;
}

// The calls to the check function in `f`, in order.
std::vector<const ptx::Instruction*> checkCalls(const ptx::Function& f) {
  std::vector<const ptx::Instruction*> out;
  auto walk = [&](auto& self, const std::vector<ptx::Statement>& body) -> void {
    for (const ptx::Statement& s : body) {
      if (const auto* i = std::get_if<ptx::Instruction>(&s.value)) {
        if (i->opcode == ptx::Opcode::kCall && i->operands[0].name == "__phos_check") {
          out.push_back(i);
        }
      } else if (const auto* b = std::get_if<ptx::Block>(&s.value)) {
        self(self, b->statements);
      }
    }
  };
  walk(walk, f.body);
  return out;
}

// Every name an operand of `body` refers to (call targets, variables, function
// addresses).
void namesUsed(const std::vector<ptx::Statement>& body, std::vector<std::string>& out) {
  auto add = [&](auto& self, const ptx::Operand& o) -> void {
    if (o.kind == ptx::OperandKind::kSymbol || (o.kind == ptx::OperandKind::kAddress && o.addressIsSymbol)) {
      out.push_back(o.name);
    }
    for (const ptx::Operand& e : o.elements) self(self, e);
  };
  for (const ptx::Statement& s : body) {
    if (const auto* i = std::get_if<ptx::Instruction>(&s.value)) {
      for (const ptx::Operand& o : i->operands) add(add, o);
    } else if (const auto* b = std::get_if<ptx::Block>(&s.value)) {
      namesUsed(b->statements, out);
    }
  }
}

// The twin module is loaded on its own, beside the original: it defines or
// declares every function it calls, holds no entry of the original and no
// .global or .const variable but the address table, and names none of the
// original's: those are reached through the table, one slot per variable.
TEST(Twin, TheTwinModuleStandsBesideTheOriginal) {
  for (const auto& path : goldenFiles()) {
    SCOPED_TRACE(path.string());
    Golden g = readGolden(path);
    Result<ptx::Module> m = ptx::parseModule(g.input, path.filename().string());
    ASSERT_THAT(m, IsOk());
    TwinStats stats;
    Result<ptx::Module> twin = buildTwinModule(*m, g.options, &stats);
    ASSERT_THAT(twin, IsOk());
    std::vector<std::string> used;
    for (const ptx::ModuleItem& item : twin->items) {
      if (const auto* f = std::get_if<ptx::Function>(&item)) {
        if (f->isEntry) {
          EXPECT_TRUE(isTwinName(f->name)) << f->name;
        }
        namesUsed(f->body, used);
      } else if (const auto* v = std::get_if<ptx::VarDecl>(&item)) {
        if (v->space == ptx::StateSpace::kGlobal || v->space == ptx::StateSpace::kConst) {
          EXPECT_EQ(v->name, kGlobalTable);
          ASSERT_EQ(v->dims.size(), 1u);
          EXPECT_EQ(v->dims[0], stats.globals.size());
        }
      }
    }
    for (const std::string& name : used) {
      const ptx::VarDecl* original = m->findVariable(name);
      if (original != nullptr && (original->space == ptx::StateSpace::kGlobal ||
                                  original->space == ptx::StateSpace::kConst)) {
        ADD_FAILURE() << "the twin module names the original's variable " << name;
      }
      if (m->findFunction(name) != nullptr) {
        EXPECT_NE(twin->findFunction(name), nullptr) << "calls " << name << " without declaring it";
      }
    }
    for (const std::string& name : stats.globals) {
      const ptx::VarDecl* original = m->findVariable(name);
      ASSERT_NE(original, nullptr) << name;
      EXPECT_TRUE(original->space == ptx::StateSpace::kGlobal || original->space == ptx::StateSpace::kConst);
    }
    EXPECT_EQ(twin->findVariable(kGlobalTable) != nullptr, !stats.globals.empty());
  }
}

TEST(Twin, SharedGlobalsGoThroughTheTableAndConstReadsBecomeGlobalReads) {
  Result<ptx::Module> m = parseGoldenInput("twin_shared_globals.golden");
  ASSERT_THAT(m, IsOk());
  TwinStats stats;
  Result<ptx::Module> twin = buildTwinModule(*m, {TwinMode::kCheckpoint, true}, &stats);
  ASSERT_THAT(twin, IsOk());
  std::vector<std::string> globals = stats.globals;
  std::sort(globals.begin(), globals.end());
  EXPECT_EQ(globals, (std::vector<std::string>{"$str", "c_n", "c_scale", "g_buffer", "g_count"}));
  // Per CTA: each twin block has its own, as the original's has.
  EXPECT_NE(twin->findVariable("s_tile"), nullptr);
  // Called by the twin of use_buffer, needs no twin of its own: copied.
  EXPECT_NE(twin->findFunction("_Z6scaledfi"), nullptr);
  EXPECT_EQ(twin->findFunction("use_buffer"), nullptr);
  std::string printed = ptx::print(*twin);
  EXPECT_EQ(printed.find("ld.const.f32"), std::string::npos) << "a .const read left in the twin module";
  EXPECT_EQ(printed.find("ld.const.u32"), std::string::npos) << "a .const read left in the twin module";
}

TEST(Twin, AppendsTheThreeValidatorParameters) {
  Result<ptx::Module> m = parseGoldenInput("twin_call_chain.golden");
  ASSERT_THAT(m, IsOk());
  Result<ptx::Module> twin = buildTwinModule(*m, {});
  ASSERT_THAT(twin, IsOk());
  for (const char* name : {"chain", "scale", "store_at"}) {
    SCOPED_TRACE(name);
    const ptx::Function* original = m->findFunction(name);
    const ptx::Function* t = twin->findFunction(twinName(name));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->isEntry, original->isEntry);
    EXPECT_EQ(t->returnParams, original->returnParams);
    ASSERT_EQ(t->params.size(), original->params.size() + 3);
    const auto& p = t->params;
    size_t n = original->params.size();
    EXPECT_EQ(p[n].name, "__phos_ranges");
    EXPECT_EQ(p[n].type, ptx::Type::kU64);
    EXPECT_EQ(p[n + 1].name, "__phos_range_count");
    EXPECT_EQ(p[n + 1].type, ptx::Type::kU32);
    EXPECT_EQ(p[n + 2].name, "__phos_report");
    EXPECT_EQ(p[n + 2].type, ptx::Type::kU64);
  }
  // square neither stores nor calls anything that does.
  EXPECT_EQ(twin->findFunction(twinName("square")), nullptr);
}

TEST(Twin, RestoreTwinsTooAddsASecondSetThatChecksLoads) {
  Result<ptx::Module> m = parseGoldenInput("twin_call_chain.golden");
  ASSERT_THAT(m, IsOk());
  TwinStats checkpointOnly, both;
  ASSERT_THAT(buildTwinModule(*m, {}, &checkpointOnly), IsOk());
  Result<ptx::Module> twin = buildTwinModule(*m, {TwinMode::kCheckpoint, true}, &both);
  ASSERT_THAT(twin, IsOk());
  TwinStats restoreOnly;
  ASSERT_THAT(buildTwinModule(*m, {TwinMode::kRestore}, &restoreOnly), IsOk());
  for (const char* name : {"chain", "scale", "store_at"}) {
    SCOPED_TRACE(name);
    const ptx::Function* c = twin->findFunction(twinName(name));
    const ptx::Function* r = twin->findFunction(twinName(name, kRestoreTwinSuffix));
    ASSERT_NE(c, nullptr);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->params, c->params);
    EXPECT_TRUE(isTwinName(r->name));
  }
  // Each set calls its own .func twins.
  const ptx::Function* chain = twin->findFunction(twinName("chain", kRestoreTwinSuffix));
  bool callsRestoreTwin = false;
  auto walk = [&](auto& self, const std::vector<ptx::Statement>& body) -> void {
    for (const ptx::Statement& s : body) {
      if (const auto* i = std::get_if<ptx::Instruction>(&s.value); i && i->opcode == ptx::Opcode::kCall) {
        for (const ptx::Operand& o : i->operands) {
          EXPECT_FALSE(o.name.ends_with(kTwinSuffix)) << "a restore twin calls a checkpoint twin: " << o.name;
          callsRestoreTwin = callsRestoreTwin || o.name.ends_with(kRestoreTwinSuffix);
        }
      } else if (const auto* b = std::get_if<ptx::Block>(&s.value)) {
        self(self, b->statements);
      }
    }
  };
  walk(walk, chain->body);
  EXPECT_TRUE(callsRestoreTwin);
  EXPECT_EQ(both.kernels, checkpointOnly.kernels + restoreOnly.kernels);
  EXPECT_EQ(both.checkedLoads, restoreOnly.checkedLoads);
  EXPECT_EQ(both.checkedStores, checkpointOnly.checkedStores + restoreOnly.checkedStores);
  // One check function serves both sets.
  int checks = 0;
  for (const ptx::ModuleItem& item : twin->items) {
    if (const auto* f = std::get_if<ptx::Function>(&item); f && f->name == "__phos_check") ++checks;
  }
  EXPECT_EQ(checks, 1);
  // A module that already has twins of either set is refused.
  ptx::Module again = *twin;
  EXPECT_FALSE(buildTwinModule(again, {}).isOk());
}

TEST(Twin, ReportsTheOriginalInstructionAndFunctionIndex) {
  Result<ptx::Module> m = parseGoldenInput("twin_call_chain.golden");
  ASSERT_THAT(m, IsOk());
  TwinStats stats;
  Result<ptx::Module> twin = buildTwinModule(*m, {}, &stats);
  ASSERT_THAT(twin, IsOk());
  std::vector<const ptx::Function*> fs = functions(*m);
  for (uint32_t fi = 0; fi < fs.size(); ++fi) {
    if (!fs[fi]->hasBody) continue;
    const ptx::Function* t = twin->findFunction(twinName(fs[fi]->name));
    if (!t) continue;
    Result<ptx::ResolvedFunction> r = ptx::ResolvedFunction::build(*fs[fi], &*m);
    ASSERT_THAT(r, IsOk());
    for (const ptx::Instruction* call : checkCalls(*t)) {
      const auto& args = call->operands[1].elements;
      ASSERT_EQ(args.size(), 8u);
      EXPECT_EQ(args[4].value, fi) << fs[fi]->name;
      size_t index = static_cast<size_t>(args[3].value);
      ASSERT_LT(index, r->instructions().size());
      EXPECT_EQ(r->instructions()[index].inst->opcode, ptx::Opcode::kSt) << fs[fi]->name;
    }
  }
  EXPECT_EQ(stats.kernels, 1u);
  EXPECT_EQ(stats.functions, 2u);
  EXPECT_EQ(stats.checkedStores, 2u);
}

TEST(Twin, CheckpointModeLeavesLoadsAlone) {
  Result<ptx::Module> m = parseGoldenInput("twin_restore_load.golden");
  ASSERT_THAT(m, IsOk());
  TwinStats checkpoint, restore;
  ASSERT_THAT(buildTwinModule(*m, {TwinMode::kCheckpoint}, &checkpoint), IsOk());
  ASSERT_THAT(buildTwinModule(*m, {TwinMode::kRestore}, &restore), IsOk());
  EXPECT_EQ(checkpoint.checkedLoads, 0u);
  EXPECT_EQ(checkpoint.checkedStores, 2u);
  EXPECT_EQ(restore.checkedLoads, 3u);
  EXPECT_EQ(restore.checkedStores, 2u);
}

TEST(Twin, KernelWithoutAccessesStillGetsATwinButNoCheckFunction) {
  Result<ptx::Module> m = ptx::parseModule(R"(
.version 7.0
.target sm_80
.address_size 64
.visible .entry idle(.param .u64 idle_param_0)
{
	ret;
}
)");
  ASSERT_THAT(m, IsOk());
  Result<ptx::Module> twin = buildTwinModule(*m, {});
  ASSERT_THAT(twin, IsOk());
  EXPECT_NE(twin->findFunction("idle__phos_twin"), nullptr);
  EXPECT_EQ(twin->findFunction("__phos_check"), nullptr);
}

TEST(Twin, RefusesAModuleThatAlreadyHasTwins) {
  Result<ptx::Module> m = parseGoldenInput("twin_store.golden");
  ASSERT_THAT(m, IsOk());
  Result<ptx::Module> twin = buildTwinModule(*m, {});
  ASSERT_THAT(twin, IsOk());
  EXPECT_THAT(buildTwinModule(*twin, {}), StatusIs(Code::kInvalidArgument, HasSubstr("reserved")));
}

TEST(Twin, RefusesUserNamesWithTheReservedPrefix) {
  Result<ptx::Module> m = ptx::parseModule(R"(
.version 7.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 k_param_0)
{
	.reg .b64 %__phos_addr;
	ld.param.u64 %__phos_addr, [k_param_0];
	st.global.u32 [%__phos_addr], 1;
	ret;
}
)");
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(buildTwinModule(*m, {}), StatusIs(Code::kInvalidArgument, HasSubstr("%__phos_addr")));
}

TEST(Twin, RefusesThirtyTwoBitAddressing) {
  Result<ptx::Module> m = ptx::parseModule(R"(
.version 7.0
.target sm_80
.address_size 32
.visible .entry k()
{
	ret;
}
)");
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(buildTwinModule(*m, {}), StatusIs(Code::kInvalidArgument, HasSubstr("address_size")));
}

TEST(Twin, CountsUncheckableGlobalAccesses) {
  Result<ptx::Module> m = ptx::parseModule(R"(
.version 7.0
.target sm_80
.address_size 64
.visible .entry mm(.param .u64 mm_param_0)
{
	.reg .f64 %fd<3>;
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [mm_param_0];
	wmma.store.d.sync.aligned.row.m8n8k4.global.f64 [%rd1], {%fd1, %fd2}, 8;
	ret;
}
)");
  ASSERT_THAT(m, IsOk());
  TwinStats stats;
  ASSERT_THAT(buildTwinModule(*m, {}, &stats), IsOk());
  EXPECT_EQ(stats.uncheckedAccesses, 1u);
  EXPECT_EQ(stats.kernelsWithUncheckedCalls, std::vector<std::string>{"mm"});
}

}  // namespace
}  // namespace phos::instrument
