// SPDX-License-Identifier: Apache-2.0
// Image write/read throughput per codec and thread count, against a plain file write in the same run.
//
// usage: image_bench [--mib N] [--dir DIR] [--output FILE.json]
//
// The baseline writes the same bytes to one file with write() and fsync(): what
// a checkpoint would cost with no chunking, checksums or compression. Ratios to
// it are what to compare across machines; absolute MB/s depend on the disk.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "phos/image/reader.h"
#include "phos/image/writer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using phos::image::Codec;

namespace {

double seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Model-weight-like contents: float32 values of a narrow distribution, whose
// exponents and high mantissa bits repeat (what compresses in real checkpoints),
// followed by the same amount of incompressible noise (optimizer state after
// many steps looks like this).
std::vector<std::byte> makeContents(size_t bytes) {
  std::vector<std::byte> data(bytes);
  std::mt19937 rng(1234);
  std::normal_distribution<float> weights(0.0f, 0.02f);
  size_t half = bytes / 2 / sizeof(float) * sizeof(float);
  for (size_t i = 0; i < half; i += sizeof(float)) {
    float w = weights(rng);
    uint32_t bits;
    std::memcpy(&bits, &w, sizeof bits);
    bits &= 0xFFFF0000u;  // bf16-representable weights, as mixed-precision training keeps them
    std::memcpy(data.data() + i, &bits, sizeof bits);
  }
  for (size_t i = half; i < bytes; ++i) data[i] = static_cast<std::byte>(rng());
  return data;
}

double baselineWrite(const fs::path& dir, const std::vector<std::byte>& data) {
  fs::path path = dir / "baseline.bin";
  auto start = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path.string());
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n <= 0) throw std::runtime_error("write failed");
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  double s = seconds(start);
  fs::remove(path);
  return s;
}

struct Run {
  std::string codec;
  int threads;
  double writeSeconds;
  double readSeconds;
  uint64_t storedBytes;
};

Run imageRun(const fs::path& dir, const std::vector<std::byte>& data, Codec codec, int threads) {
  fs::path image = dir / fmt::format("image-{}-{}", phos::image::codecName(codec), threads);
  fs::remove_all(image);
  auto start = Clock::now();
  auto writer = phos::image::ImageWriter::create(image, {.codec = codec});
  if (!writer) throw std::runtime_error(writer.status().toString());
  auto blob = (*writer)->addBlob("gpu/0/0x0", "gpu-memory", data.size());
  if (!blob) throw std::runtime_error(blob.status().toString());
  uint64_t chunkBytes = phos::image::kDefaultChunkBytes;
  uint64_t chunks = (data.size() + chunkBytes - 1) / chunkBytes;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (uint64_t c = static_cast<uint64_t>(t); c < chunks; c += static_cast<uint64_t>(threads)) {
        uint64_t begin = c * chunkBytes;
        auto s = (*writer)->writeChunk(
            *blob, c, std::span(data).subspan(begin, std::min(chunkBytes, data.size() - begin)));
        if (!s.isOk()) std::fprintf(stderr, "%s\n", s.toString().c_str());
      }
    });
  }
  for (auto& w : workers) w.join();
  auto committed = (*writer)->commit();
  if (!committed.isOk()) throw std::runtime_error(committed.toString());
  double writeSeconds = seconds(start);

  start = Clock::now();
  auto reader = phos::image::ImageReader::open(image);
  if (!reader) throw std::runtime_error(reader.status().toString());
  std::vector<std::byte> back(data.size());
  auto read = (*reader)->read(0, 0, back);
  if (!read.isOk()) throw std::runtime_error(read.toString());
  double readSeconds = seconds(start);
  if (back != data) throw std::runtime_error("read back differs from what was written");
  uint64_t stored = (*reader)->manifest().blobs[0].storedBytes();
  fs::remove_all(image);
  return {std::string(phos::image::codecName(codec)), threads, writeSeconds, readSeconds, stored};
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 256;
  fs::path dir = fs::temp_directory_path();
  std::string output;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--mib" && i + 1 < argc) {
      mib = std::stoul(argv[++i]);
    } else if (arg == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (arg == "--output" && i + 1 < argc) {
      output = argv[++i];
    } else {
      std::fprintf(stderr, "usage: image_bench [--mib N] [--dir DIR] [--output FILE.json]\n");
      return 2;
    }
  }
  try {
    std::vector<std::byte> data = makeContents(mib << 20);
    fs::path work = dir / fmt::format("phos-image-bench-{}", ::getpid());
    fs::create_directories(work);
    double mb = static_cast<double>(data.size()) / 1e6;
    // Baseline measured before and after the image runs; the better one is used.
    double baseline = baselineWrite(work, data);
    std::vector<Run> runs;
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (Codec codec : {Codec::kNone, Codec::kLz4, Codec::kZstd}) {
      for (int threads : {1, cores}) {
        runs.push_back(imageRun(work, data, codec, threads));
        if (cores == 1) break;
      }
    }
    baseline = std::min(baseline, baselineWrite(work, data));
    fs::remove_all(work);

    fmt::print("image bench: {} MiB (half bf16-like weights, half noise), chunks of {} MiB, {}\n",
               mib, phos::image::kDefaultChunkBytes >> 20, dir.string());
    fmt::print("baseline write+fsync: {:.0f} MB/s\n", mb / baseline);
    fmt::print("{:<6} {:>7} {:>11} {:>11} {:>10} {:>9}\n", "codec", "threads", "write MB/s",
               "read MB/s", "stored %", "vs base");
    nlohmann::json json = {{"bytes", data.size()},
                           {"baseline_write_mb_s", mb / baseline},
                           {"runs", nlohmann::json::array()}};
    for (const Run& r : runs) {
      double stored = 100.0 * static_cast<double>(r.storedBytes) / static_cast<double>(data.size());
      fmt::print("{:<6} {:>7} {:>11.0f} {:>11.0f} {:>9.1f}% {:>8.2f}x\n", r.codec, r.threads,
                 mb / r.writeSeconds, mb / r.readSeconds, stored, baseline / r.writeSeconds);
      json["runs"].push_back({{"codec", r.codec},
                              {"threads", r.threads},
                              {"write_mb_s", mb / r.writeSeconds},
                              {"read_mb_s", mb / r.readSeconds},
                              {"stored_percent", stored},
                              {"write_speed_vs_baseline", baseline / r.writeSeconds}});
    }
    if (!output.empty()) {
      fs::create_directories(fs::path(output).parent_path());
      std::ofstream(output) << json.dump(2) << "\n";
      fmt::print("wrote {}\n", output);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "image_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
