// SPDX-License-Identifier: Apache-2.0
// ImageReader: random access to a committed image, and its verification.
#pragma once

#include <cstdint>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "phos/image/format.h"
#include "phos/image/safe_open.h"

namespace phos::image {

// One thing wrong with an image, as `phos verify` reports it.
struct Problem {
  std::string where;  // "manifest.json", "blob gpu/0/0x7f00 chunk 3", "cpu/pages-1.img"
  std::string what;
};

// Reads are thread-safe; each one checks the chunk's checksum.
class ImageReader {
 public:
  // Parses and checks the manifest and that every blob file is present and
  // long enough. kNotFound if `directory` or its manifest is missing,
  // kDataLoss if either is damaged, kNotSupported for a newer format version.
  //
  // The image is untrusted input (docs/security.md): the directory is opened
  // without following a link and checked against `requester`
  // (checkImageOwner: kPermissionDenied for an unprivileged requester that
  // does not own it), and every file of it is opened through openBeneath
  // (no links, regular files only, readable by the requester). Late chunks
  // are phosd's own (migration): refused for an unprivileged requester.
  static Result<std::unique_ptr<ImageReader>> open(const std::filesystem::path& directory,
                                                   const Requester& requester = {});

  const std::filesystem::path& directory() const { return directory_; }
  // The image directory as opened (O_NOFOLLOW): every file is opened beneath it.
  int directoryFd() const { return directoryFd_.get(); }
  // A file of the image ("cpu/pages-1.img"), opened by openBeneath for this
  // reader's requester.
  Result<Fd> openFile(std::string_view relative) const;
  const Manifest& manifest() const { return manifest_; }
  std::filesystem::path cpuDirectory() const { return directory_ / kCpuDir; }

  std::optional<size_t> findBlob(std::string_view name) const;
  // Decompresses chunk `chunk` of blob `blob` into `out` (exactly its raw size).
  // kDataLoss names the blob and chunk when the stored bytes are damaged.
  // A late chunk (format.h) is waited for, up to lateTimeout, asked for first.
  Status readChunk(size_t blob, uint64_t chunk, std::span<std::byte> out) const;
  // Chunks still to arrive after publication (0 for an ordinary image).
  size_t lateChunks() const { return late_.size(); }
  std::chrono::milliseconds lateTimeout{std::chrono::minutes(2)};
  // Any byte range of a blob.
  Status read(size_t blob, uint64_t offset, std::span<std::byte> out) const;

  // Reads every chunk and every cpu/ file and reports all that is wrong
  // (empty: the image is intact).
  std::vector<Problem> verify() const;
  // The two halves of verify(): restore checks cpu/ up front and GPU chunks as
  // it loads them.
  std::vector<Problem> verifyBlobs() const;
  std::vector<Problem> verifyCpuFiles() const;

 private:
  ImageReader(std::filesystem::path directory, Fd directoryFd, Requester requester, Manifest manifest)
      : directory_(std::move(directory)),
        directoryFd_(std::move(directoryFd)),
        requester_(requester),
        manifest_(std::move(manifest)) {}
  Status readExactly(std::string_view relative, uint64_t offset, std::span<std::byte> out) const;
  Status readLate(size_t blob, uint64_t chunk, uint64_t checksum, std::span<std::byte> out) const;

  std::filesystem::path directory_;
  Fd directoryFd_;
  Requester requester_;
  Manifest manifest_;
  std::map<std::pair<size_t, uint64_t>, uint64_t> late_;  // (blob, chunk) -> checksum of its bytes
  mutable std::mutex lateMutex_;
  mutable std::set<std::pair<size_t, uint64_t>> asked_;
};

}  // namespace phos::image
