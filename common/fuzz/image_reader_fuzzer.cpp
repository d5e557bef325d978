// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for ImageReader: an image is untrusted input
// (docs/security.md), so everything it reads from one (manifest.json, its
// chunk tables, late.json, late/ files, blob and cpu files, links and FIFOs
// where files should be) is fed from fuzz bytes.
//
// An input is a flags byte and then files separated by kSeparator, in the
// order of kFiles (missing ones are absent, an empty one is an empty file).
// The flags replace some files by what a hostile user would put there: a
// link to a file outside the image, a FIFO, a linked directory.
//
// Built twice (tests/image/meson.build): with clang's libFuzzer, and with the
// normal compiler and image_fuzz_main.cpp, which runs the seeds it makes and
// the regression inputs in tests/image/fuzz-regressions on every `meson test`.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "image_fuzz.h"
#include "phos/image/reader.h"

namespace phos::image::fuzz {

namespace fs = std::filesystem;

namespace {

// One scratch directory per process, emptied for each input. Never
// destroyed (the atexit handler below still needs it after statics go).
const fs::path& scratch() {
  static const fs::path* dir = [] {
    char name[] = "/tmp/phos-image-fuzz.XXXXXX";
    if (::mkdtemp(name) == nullptr) ::abort();
    std::ofstream(fs::path(name) / "outside") << "outside the image";
    // Gone when the process exits normally (libFuzzer's time limit, the
    // regression runner); a crash leaves it for the post-mortem.
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch(), ec);
    });
    return new fs::path(name);
  }();
  return *dir;
}

void materialize(const fs::path& image, uint8_t flags, const std::vector<std::string_view>& parts) {
  std::error_code ec;
  fs::remove_all(image, ec);
  fs::create_directories(image / "blobs");
  fs::create_directories(image / "cpu");
  if ((flags & kLateDirIsLink) != 0) {
    fs::create_directories(scratch() / "late-elsewhere");
    fs::create_directory_symlink(scratch() / "late-elsewhere", image / "late");
  } else {
    fs::create_directories(image / "late");
  }
  for (size_t i = 0; i < parts.size() && i < kFiles.size(); ++i) {
    std::ofstream(image / kFiles[i], std::ios::binary).write(parts[i].data(), static_cast<std::streamsize>(parts[i].size()));
  }
  if ((flags & kBlobIsLink) != 0) {
    fs::remove(image / "blobs/000000", ec);
    fs::create_symlink(scratch() / "outside", image / "blobs/000000", ec);
  }
  if ((flags & kBlobIsFifo) != 0) {
    fs::remove(image / "blobs/000001", ec);
    ::mkfifo((image / "blobs/000001").c_str(), 0644);
  }
  if ((flags & kCpuFileIsLink) != 0) {
    fs::remove(image / "cpu/pages-1.img", ec);
    fs::create_symlink(scratch() / "outside", image / "cpu/pages-1.img", ec);
  }
}

}  // namespace

void runOne(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t flags = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::string_view> parts;
  while (parts.size() < kFiles.size()) {
    size_t at = rest.find(kSeparator);
    parts.push_back(rest.substr(0, at));
    if (at == std::string_view::npos) break;
    rest.remove_prefix(at + kSeparator.size());
  }
  const fs::path image = scratch() / "img";
  materialize(image, flags, parts);

  auto reader = ImageReader::open(image, Requester{});
  if (!reader.isOk()) return;
  (*reader)->lateTimeout = std::chrono::milliseconds(0);  // a late chunk that is missing is not waited for
  const Manifest& m = (*reader)->manifest();
  // Every chunk that is small enough to be a fuzz input's (a manifest may
  // claim chunks of 1 GiB: allocating them is not what is tested here).
  std::vector<std::byte> buffer;
  size_t budget = 256;
  for (size_t b = 0; b < m.blobs.size(); ++b) {
    const BlobInfo& blob = m.blobs[b];
    for (uint64_t c = 0; c < blob.chunkCount() && budget > 0; ++c, --budget) {
      const uint32_t raw = blob.chunkRawBytes(c);
      if (raw > kMaxChunk) continue;
      buffer.resize(raw);
      (void)(*reader)->readChunk(b, c, buffer);
    }
    // A range across the first chunk boundary, as on-demand restore reads.
    if (blob.size > 2 && blob.chunkBytes <= kMaxChunk && blob.size / 2 <= kMaxChunk) {
      buffer.resize(blob.size / 2);
      (void)(*reader)->read(b, 1, buffer);
    }
  }
  (void)(*reader)->verifyCpuFiles();
  (void)(*reader)->findBlob("gpu/0/0x1000");
}

}  // namespace phos::image::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  phos::image::fuzz::runOne(data, size);
  return 0;
}
