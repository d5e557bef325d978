// SPDX-License-Identifier: Apache-2.0
// libphos.so exports exactly the Driver API entry points of apigen's table, plus libc's dlopen and
// open family and the SDK's entry, and nothing of its own insides.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "elf_symbols.h"
#include "phos/cuda_api/api_table.h"
#include "status_matchers.h"

namespace phos::shim {
namespace {

using ::phos::testing::IsOk;

// Beyond the Driver API: the libc functions the shim interposes
// (dlopen("libcuda.so.1") answers with libphos.so itself; the open family
// keeps NVIDIA's device files from the application, src/device_files.cpp),
// and the entry the application SDK looks up (sdk/include/phos/sdk.h).
const std::set<std::string> kBeyondDriverApi = {
    "dlopen",   "open",     "open64",     "openat",
    "openat64", "__open_2", "__open64_2", "phos_sdk_checkpoint"};

std::set<std::string> exported() {
  Result<std::set<std::string>> symbols = phos::testing::definedDynamicSymbols(PHOS_LIBPHOS_SO);
  EXPECT_THAT(symbols, IsOk());
  return symbols.isOk() ? *symbols : std::set<std::string>{};
}

// The names between "global:" and "local:" of a linker version script.
std::set<std::string> versionScriptGlobals(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::set<std::string> names;
  bool inGlobal = false;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      if (word == "global:") {
        inGlobal = true;
      } else if (word == "local:") {
        inGlobal = false;
      } else if (inGlobal && word.size() > 1 && word.back() == ';') {
        names.insert(word.substr(0, word.size() - 1));
      }
    }
  }
  return names;
}

TEST(LibphosExports, AreTheEntryPointTablePlusDlopen) {
  std::set<std::string> expected = kBeyondDriverApi;
  for (const cuda_api::EntryPointInfo& e : cuda_api::entryPoints()) expected.emplace(e.symbol);
  std::set<std::string> actual = exported();
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(actual.size(), cuda_api::kEntryPointCount + kBeyondDriverApi.size());
}

TEST(LibphosExports, AreApigensVersionScriptPlusDlopen) {
  std::set<std::string> expected = versionScriptGlobals(PHOS_CUDA_API_MAP);
  ASSERT_GT(expected.size(), 500u) << PHOS_CUDA_API_MAP << " parsed to too few names";
  expected.insert(kBeyondDriverApi.begin(), kBeyondDriverApi.end());
  EXPECT_EQ(exported(), expected);
}

}  // namespace
}  // namespace phos::shim
