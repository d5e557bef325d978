// SPDX-License-Identifier: Apache-2.0
// phos-vgpu-fatbin: lists and extracts the entries of the fatbins a file embeds.
//
// A host executable or shared library built by nvcc (CuPy's extension modules,
// for instance) carries its device code as fatbin containers in `.nv_fatbin`;
// a `.fatbin` file is one container. The tool finds every container in the file
// by its magic, parses it with phos/common/fatbin.h (zstd and LZ4 entries
// included) and prints one line per entry; `--extract DIR` writes each PTX
// entry, decompressed, to DIR/<file>.<container>.<entry>.sm_<arch>.ptx. This is
// how PTX is taken out of libraries for vgpu's test corpus (docs/ptx.md).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "phos/common/fatbin.h"

namespace {

namespace fs = std::filesystem;

const char* kindName(phos::fatbin::Entry::Kind kind) {
  switch (kind) {
    case phos::fatbin::Entry::Kind::kPtx: return "PTX";
    case phos::fatbin::Entry::Kind::kElf: return "SASS";
    case phos::fatbin::Entry::Kind::kOther: break;
  }
  return "other";
}

const char* compression(const phos::fatbin::Entry& e) {
  if (e.compressedZstd()) return "zstd";
  if (e.compressedLz4()) return "lz4";
  return "stored";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Lists (and extracts the PTX of) the fatbin containers embedded in a file", "phos-vgpu-fatbin"};
  std::string input;
  std::string extractDir;
  app.add_option("file", input, "an executable, shared library or .fatbin file")->required();
  app.add_option("--extract", extractDir, "write every PTX entry to this directory");
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(input, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "phos-vgpu-fatbin: cannot open '%s'\n", input.c_str());
    return 2;
  }
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::span<const std::byte> data(reinterpret_cast<const std::byte*>(raw.data()), raw.size());
  if (!extractDir.empty()) fs::create_directories(extractDir);

  int containers = 0;
  int failures = 0;
  const std::string stem = fs::path(input).filename().string();
  std::size_t offset = 0;
  while (offset + 16 <= data.size()) {
    std::uint32_t magic = 0;
    std::memcpy(&magic, data.data() + offset, sizeof magic);
    // Containers are 8-byte aligned inside .nv_fatbin.
    if (magic != phos::fatbin::kMagic) {
      offset += 8;
      continue;
    }
    auto entries = phos::fatbin::parse(data.subspan(offset));
    if (!entries.isOk()) {
      std::fprintf(stderr, "offset 0x%zx: %s\n", offset, entries.status().message().c_str());
      ++failures;
      offset += 8;
      continue;
    }
    std::uint16_t headerSize = 0;
    std::uint64_t size = 0;
    std::memcpy(&headerSize, data.data() + offset + 6, sizeof headerSize);
    std::memcpy(&size, data.data() + offset + 8, sizeof size);
    std::printf("container %d at 0x%zx: %zu entries, %llu bytes\n", containers, offset, entries->size(),
                static_cast<unsigned long long>(size));
    for (std::size_t i = 0; i < entries->size(); ++i) {
      const phos::fatbin::Entry& e = (*entries)[i];
      std::printf("  %zu: %s sm_%d, %s, %zu bytes stored\n", i, kindName(e.kind), e.arch, compression(e),
                  e.payload.size());
      if (extractDir.empty() || e.kind != phos::fatbin::Entry::Kind::kPtx) continue;
      auto text = phos::fatbin::contents(e);
      if (!text.isOk()) {
        std::fprintf(stderr, "container %d entry %zu: %s\n", containers, i, text.status().message().c_str());
        ++failures;
        continue;
      }
      std::string ptx = std::move(text).value();
      if (auto nul = ptx.find('\0'); nul != std::string::npos) ptx.resize(nul);
      fs::path out = fs::path(extractDir) / (stem + "." + std::to_string(containers) + "." + std::to_string(i) +
                                             ".sm_" + std::to_string(e.arch) + ".ptx");
      std::ofstream(out, std::ios::binary) << ptx;
    }
    ++containers;
    offset += headerSize + size;
    offset = (offset + 7) & ~std::size_t{7};
  }
  if (containers == 0) std::printf("no fatbin container in %s\n", input.c_str());
  return failures == 0 ? 0 : 1;
}
