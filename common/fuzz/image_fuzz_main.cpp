// SPDX-License-Identifier: Apache-2.0
// The image reader fuzzer without libFuzzer: makes seed inputs from real
// images (ImageWriter, every codec, late chunks, hostile variants), runs them
// and every regression input named on the command line through the same
// target, and with --write-seeds DIR leaves the seeds there for libFuzzer.
//
//   image_fuzz_main [--write-seeds DIR] [FILE|DIR ...]
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "image_fuzz.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"

namespace fs = std::filesystem;
using namespace phos::image;
using namespace phos::image::fuzz;

namespace {

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// An image as one fuzz input: the flags byte, then kFiles joined by kSeparator.
std::string serialize(const fs::path& image, uint8_t flags) {
  std::string out(1, static_cast<char>(flags));
  for (size_t i = 0; i < kFiles.size(); ++i) {
    if (i > 0) out += kSeparator;
    std::error_code ec;
    if (fs::is_regular_file(image / kFiles[i], ec)) out += slurp(image / kFiles[i]);
  }
  return out;
}

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i / 16 + seed) * (seed % 2 ? 131 : 1));
  return v;
}

fs::path writeImage(const fs::path& dir, Codec codec) {
  auto writer = ImageWriter::create(dir, {.codec = codec, .chunkBytes = 1024});
  if (!writer.isOk()) {
    std::fprintf(stderr, "seed image: %s\n", writer.status().message().c_str());
    std::exit(1);
  }
  auto a = (*writer)->addBlob("gpu/0/0x1000", "gpu-memory", 2500, {{"device", 0}});
  auto b = (*writer)->addBlob("session/ring", "ring", 700);
  if (!a.isOk() || !b.isOk() || !(*writer)->writeBlob(*a, pattern(2500, 1)).isOk() ||
      !(*writer)->writeBlob(*b, pattern(700, 2)).isOk()) {
    std::exit(1);
  }
  std::ofstream((*writer)->cpuDirectory() / "pages-1.img") << "pages of the process";
  (*writer)->setState({{"gpu", {{"sessions", {{{"pid", 1}, {"uid", 1000}}}}}}});
  if (!(*writer)->commit().isOk()) std::exit(1);
  return dir;
}

std::vector<std::string> makeSeeds() {
  char name[] = "/tmp/phos-image-seeds.XXXXXX";
  if (::mkdtemp(name) == nullptr) std::exit(1);
  const fs::path work = name;
  std::vector<std::string> seeds;
  for (Codec codec : {Codec::kNone, Codec::kZstd, Codec::kLz4}) {
    fs::path image = writeImage(work / std::string(codecName(codec)), codec);
    seeds.push_back(serialize(image, 0));
    if (codec == Codec::kNone) {
      for (uint8_t flags : {kBlobIsLink, kBlobIsFifo, kLateDirIsLink, kCpuFileIsLink}) {
        seeds.push_back(serialize(image, flags));
      }
    }
  }
  // Late chunks: chunk 1 of blob 0 arrived, chunk 0 did not (and late/failed says why).
  fs::path late = writeImage(work / "late", Codec::kNone);
  auto reader = ImageReader::open(late);
  if (!reader.isOk()) std::exit(1);
  const BlobInfo& blob = (*reader)->manifest().blobs[0];
  std::ofstream(late / "late.json") << fmt::format(R"({{"chunks": [[0, 0, {}], [0, 1, {}]]}})",
                                                   blob.chunks[0].checksum, blob.chunks[1].checksum);
  fs::create_directories(late / "late");
  std::vector<std::byte> chunk(1024);
  if (!(*reader)->readChunk(0, 1, chunk).isOk()) std::exit(1);
  std::ofstream(late / "late" / "0.1", std::ios::binary).write(reinterpret_cast<const char*>(chunk.data()), 1024);
  seeds.push_back(serialize(late, 0));
  std::ofstream(late / "late" / "failed") << "the source went away";
  seeds.push_back(serialize(late, 0));
  // Not JSON, and JSON of the wrong shape.
  seeds.push_back(std::string(1, '\0') + "{\"format\": \"phos-image\", \"version\": 1");
  seeds.push_back(std::string(1, '\0') + R"({"format": "phos-image", "version": 1, "created": "", "state": {},
      "blobs": [{"name": "b", "kind": "k", "size": 18446744073709551615, "chunk_bytes": 2, "file": "blobs/000000",
                 "attributes": {}, "chunks": []}], "cpu_files": []})");
  fs::remove_all(work);
  return seeds;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> seeds = makeSeeds();
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--write-seeds" && i + 1 < argc) {
      fs::path dir = argv[++i];
      fs::create_directories(dir);
      for (size_t s = 0; s < seeds.size(); ++s) {
        std::ofstream(dir / fmt::format("seed-{:02}", s), std::ios::binary) << seeds[s];
      }
      continue;
    }
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::directory_iterator(arg)) {
        if (e.is_regular_file()) inputs.push_back(e.path());
      }
    } else {
      inputs.push_back(arg);
    }
  }
  for (const std::string& seed : seeds) runOne(reinterpret_cast<const uint8_t*>(seed.data()), seed.size());
  for (const fs::path& input : inputs) {
    std::string bytes = slurp(input);
    runOne(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%zu seeds and %zu regression inputs read without a crash\n", seeds.size(), inputs.size());
  return 0;
}
