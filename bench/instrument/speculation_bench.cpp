// SPDX-License-Identifier: Apache-2.0
// `scripts/bench speculation`: speculation accuracy (Table 3 of the paper) and the
// overhead of validator twins over the originals, on the vgpu engine.
//
// Usage: speculation_bench --corpus-dir DIR [--examples PTX] [--deliberate PTX]...
//          [--variants O3,G,lineinfo,nvrtc,clang,numba] [--repetitions N] [--output FILE.json]
//   DIR holds tests/instrument's generated corpus_<source>_<variant>.ptx files.
//   Exits 1 when a mis-speculation went unreported or a twin's output differs.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "launch_table.h"
#include "speculation_accuracy.h"

namespace {

namespace sp = phos::bench::speculation;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string stem(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  return name.substr(0, name.rfind(".ptx"));
}

}  // namespace

int main(int argc, char** argv) {
  std::string corpusDir, examples, output;
  std::vector<std::string> deliberate;
  std::vector<std::string> variants = {"O3", "G", "lineinfo", "nvrtc", "clang", "numba"};
  sp::HarnessOptions options;
  options.measureWallTime = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--corpus-dir")
      corpusDir = next();
    else if (a == "--examples")
      examples = next();
    else if (a == "--deliberate")
      deliberate.push_back(next());
    else if (a == "--variants")
      variants = split(next());
    else if (a == "--repetitions")
      options.repetitions = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--output")
      output = next();
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }

  std::vector<sp::ModuleInput> inputs = sp::corpusInputs(corpusDir, variants);
  if (!examples.empty()) inputs.push_back({examples, "examples", stem(examples)});
  for (const auto& d : deliberate) {
    inputs.push_back(
        {d, d.find("_G.ptx") != std::string::npos ? "deliberate -G" : "deliberate O3", stem(d)});
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no PTX found (is --corpus-dir the build's tests/instrument?)\n");
    return 2;
  }

  std::vector<sp::LaunchOutcome> outcomes;
  std::vector<std::string> problems;
  for (const auto& in : inputs) {
    std::vector<std::string> unknown;
    auto r = sp::runModule(in, options, &unknown);
    if (!r.isOk()) {
      problems.push_back(fmt::format("{}: {}", in.variant, r.status().message()));
      continue;
    }
    outcomes.insert(outcomes.end(), r->begin(), r->end());
    for (const auto& k : unknown)
      problems.push_back(fmt::format("{}: no launch for {}", in.variant, k));
    std::fprintf(stderr, "%-28s %zu launches\n", in.variant.c_str(), r->size());
  }

  std::string accuracy = sp::formatAccuracyTable(outcomes);
  std::string overhead = sp::formatOverheadTable(outcomes);
  std::printf(
      "== Speculation accuracy (recorder vs speculated sets; twins on the same inputs)\n%s\n",
      accuracy.c_str());
  std::printf(
      "== Twin overhead (twin / original on vgpu; wall: median of %u interleaved runs)\n%s\n",
      options.repetitions, overhead.c_str());
  for (const auto& s : sp::skippedKernels())
    std::printf("skipped %s: %s\n", s.kernel.c_str(), s.reason.c_str());
  for (const auto& p : problems) std::printf("note: %s\n", p.c_str());

  sp::Totals t = sp::totals(outcomes);
  if (!output.empty()) {
    nlohmann::json j = sp::toJson(outcomes);
    j["notes"] = problems;
    std::ofstream(output) << j.dump(2) << "\n";
    std::printf("wrote %s\n", output.c_str());
  }
  bool ok = t.undetected == 0 && t.mismatches == 0 &&
            t.deliberateCaught + t.deliberateNotMissed == t.deliberate;
  std::printf(
      "summary: %u launches, %u mis-speculated, %u undetected, %u false alarms, %u twin "
      "mismatches, "
      "%u errors: %s\n",
      t.launches, t.failed, t.undetected, t.falseAlarms, t.mismatches, t.errors + t.twinErrors,
      ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
