// SPDX-License-Identifier: Apache-2.0
// Builds the validator twins of one corpus PTX file in each requested mode
// (checkpoint, restore, or phosd: both sets in one module, as phosd loads it), checks
// the printed module reads back the same, and assembles it with ptxas. The file,
// modes, ptxas and architectures come from the environment (meson.build).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "phos/common/subprocess.h"
#include "phos/instrument/twin.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "status_matchers.h"

namespace phos::instrument {
namespace {

using ::phos::testing::IsOk;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

TEST(TwinCorpus, TwinsReadBackAndAssemble) {
  std::string path = env("PHOS_PTX_FILE");
  if (path.empty()) GTEST_SKIP() << "PHOS_PTX_FILE not set";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  ASSERT_FALSE(text.str().empty()) << "cannot read " << path;
  Result<ptx::Module> mod = ptx::parseModule(text.str(), path);
  ASSERT_THAT(mod, IsOk());

  std::vector<std::string> modes = split(env("PHOS_TWIN_MODES"));
  if (modes.empty()) modes = {"checkpoint"};
  for (const std::string& mode : modes) {
    SCOPED_TRACE(mode);
    TwinOptions options;
    options.mode = mode == "restore" ? TwinMode::kRestore : TwinMode::kCheckpoint;
    options.restoreTwinsToo = mode == "phosd";
    TwinStats stats;
    Result<ptx::Module> twin = buildTwinModule(*mod, options, &stats);
    ASSERT_THAT(twin, IsOk());
    size_t entries = 0;
    for (const ptx::ModuleItem& item : mod->items) {
      if (const auto* f = std::get_if<ptx::Function>(&item); f && f->isEntry) {
        ++entries;
        EXPECT_NE(twin->findFunction(twinName(f->name)), nullptr) << f->name;
        if (options.restoreTwinsToo) {
          EXPECT_NE(twin->findFunction(twinName(f->name, kRestoreTwinSuffix)), nullptr) << f->name;
        }
      }
    }
    EXPECT_EQ(stats.kernels, options.restoreTwinsToo ? 2 * entries : entries);
    RecordProperty(mode + "_checked_stores", static_cast<int>(stats.checkedStores));
    RecordProperty(mode + "_checked_loads", static_cast<int>(stats.checkedLoads));

    std::string printed = ptx::print(*twin);
    Result<ptx::Module> again = ptx::parseModule(printed, path + " (twin)");
    ASSERT_THAT(again, IsOk());
    EXPECT_TRUE(*again == *twin) << "twin module changed after print + parse";

    std::string ptxas = env("PHOS_PTXAS");
    if (ptxas.empty()) continue;
    char tmpl[] = "/tmp/phos-twin-XXXXXX.ptx";
    int fd = mkstemps(tmpl, 4);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, printed.data(), printed.size()), static_cast<ssize_t>(printed.size()));
    close(fd);
    for (const std::string& arch : split(env("PHOS_PTXAS_ARCHS"))) {
      Result<ProcessOutput> r = runCapture({ptxas, "-c", "-arch=" + arch, tmpl, "-o", "/dev/null"});
      ASSERT_THAT(r, IsOk());
      EXPECT_EQ(r->exitCode, 0) << "ptxas -arch=" << arch << " rejected the " << mode << " twin of "
                                << path << ":\n"
                                << r->err;
    }
    unlink(tmpl);
  }
}

}  // namespace
}  // namespace phos::instrument
