// SPDX-License-Identifier: Apache-2.0
// Parse and print throughput of the PTX front end over the corpus, in MB/s.
//
// Usage: ptx_throughput PATH... [--output FILE.json] [--min-seconds S]
//   PATH is a .ptx file or a directory whose corpus_*.ptx files are used.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Input {
  std::string name;
  std::string text;
};

std::string readFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `pass` over the corpus until at least `minSeconds` have passed (and at least
// three rounds); returns the best round's seconds, which is the least disturbed by
// other processes on a shared machine.
template <typename Pass>
double bestRound(double minSeconds, Pass&& pass) {
  double best = 1e300;
  double total = 0;
  for (int round = 0; round < 3 || total < minSeconds; ++round) {
    auto t0 = Clock::now();
    pass();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> paths;
  std::string output;
  double minSeconds = 2.0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--output" && i + 1 < argc) {
      output = argv[++i];
    } else if (a == "--min-seconds" && i + 1 < argc) {
      minSeconds = std::atof(argv[++i]);
    } else {
      paths.emplace_back(a);
    }
  }
  std::vector<Input> inputs;
  for (const fs::path& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(p)) {
        std::string n = e.path().filename().string();
        if (n.rfind("corpus_", 0) == 0 && e.path().extension() == ".ptx") files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) inputs.push_back({f.filename().string(), readFile(f)});
    } else if (fs::is_regular_file(p, ec)) {
      inputs.push_back({p.filename().string(), readFile(p)});
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "ptx_throughput: no PTX found (build the corpus: ninja -C BUILD)\n");
    return 1;
  }
  size_t bytes = 0;
  size_t lines = 0;
  std::vector<phos::ptx::Module> modules;
  for (const Input& in : inputs) {
    bytes += in.text.size();
    lines += static_cast<size_t>(std::count(in.text.begin(), in.text.end(), '\n'));
    auto m = phos::ptx::parseModule(in.text, in.name);
    if (!m.isOk()) {
      std::fprintf(stderr, "ptx_throughput: %s\n", m.status().toString().c_str());
      return 1;
    }
    modules.push_back(std::move(*m));
  }

  size_t sink = 0;
  double parseS = bestRound(minSeconds, [&] {
    for (const Input& in : inputs) sink += phos::ptx::parseModule(in.text, in.name)->items.size();
  });
  size_t printedBytes = 0;
  double printS = bestRound(minSeconds, [&] {
    printedBytes = 0;
    for (const auto& m : modules) printedBytes += phos::ptx::print(m).size();
  });
  double roundTripS = bestRound(minSeconds, [&] {
    for (const Input& in : inputs) sink += phos::ptx::print(*phos::ptx::parseModule(in.text, in.name)).size();
  });

  double mb = static_cast<double>(bytes) / 1e6;
  nlohmann::json doc = {
      {"benchmark", "ptx_throughput"},
      {"files", inputs.size()},
      {"bytes", bytes},
      {"lines", lines},
      {"printed_bytes", printedBytes},
      {"parse_mb_per_s", mb / parseS},
      {"print_mb_per_s", static_cast<double>(printedBytes) / 1e6 / printS},
      {"parse_print_mb_per_s", mb / roundTripS},
      {"parse_seconds", parseS},
      {"print_seconds", printS},
      {"parse_print_seconds", roundTripS},
  };
  std::printf("PTX corpus: %zu files, %zu lines, %.2f MB\n", inputs.size(), lines, mb);
  std::printf("parse:         %8.1f MB/s\n", mb / parseS);
  std::printf("print:         %8.1f MB/s (of printed text)\n",
              static_cast<double>(printedBytes) / 1e6 / printS);
  std::printf("parse + print: %8.1f MB/s\n", mb / roundTripS);
  if (sink == 0) std::printf("(empty corpus)\n");
  if (!output.empty()) {
    fs::create_directories(fs::path(output).parent_path());
    std::ofstream out(output);
    out << doc.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "ptx_throughput: cannot write %s\n", output.c_str());
      return 1;
    }
  }
  return 0;
}
