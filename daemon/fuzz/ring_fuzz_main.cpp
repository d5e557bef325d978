// SPDX-License-Identifier: Apache-2.0
// The ring fuzzer's target without libFuzzer: runs every input named on the
// command line (files, or every file of a directory) through
// LLVMFuzzerTestOneInput once, built with the project's compiler. Each test
// run replays the seeds this way (ring_fuzz_regression, scripts/fuzz-ring
// --replay); the target aborts on the first defect it finds.
//
//   ring_fuzz_replay FILE|DIR ...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    const fs::path path = argv[i];
    if (fs::is_directory(path, ec)) {
      for (const auto& entry : fs::directory_iterator(path, ec)) {
        if (entry.is_regular_file()) inputs.push_back(entry.path());
      }
    } else if (fs::is_regular_file(path, ec)) {
      inputs.push_back(path);
    } else {
      std::fprintf(stderr, "ring_fuzz_replay: %s is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  // No input is a broken run (an empty seed directory), not a pass.
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: ring_fuzz_replay FILE|DIR ... (no input found)\n");
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());
  size_t skipped = 0;
  for (const fs::path& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "ring_fuzz_replay: cannot read %s\n", input.c_str());
      return 2;
    }
    // -1: an input the target declines (a grid too large for vgpu's interpreter).
    if (LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) != 0)
      ++skipped;
  }
  std::printf("ring_fuzz_replay: %zu inputs served, %zu declined\n", inputs.size() - skipped,
              skipped);
  return 0;
}
