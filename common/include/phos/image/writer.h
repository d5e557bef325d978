// SPDX-License-Identifier: Apache-2.0
// ImageWriter: builds an image under a staging name and publishes it atomically.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "phos/image/format.h"

namespace phos::image {

struct WriterOptions {
  Codec codec = Codec::kNone;
  int zstdLevel = 1;  // fast: checkpointing is bandwidth-bound
  uint32_t chunkBytes = kDefaultChunkBytes;
  // Whom the published image belongs to. A root phosd writes images for
  // users; a user may restore only image directories it owns
  // (docs/security.md), so commit() gives the whole tree to this uid (through
  // descriptors, never following a link) before publishing it.
  std::optional<uid_t> owner;
};

// The image is written into a sibling directory ".NAME.partial-PID" and renamed
// to NAME by commit() only after every file and directory is synced, so a crash
// never leaves something at NAME that looks like an image. Dropping a writer
// without commit() deletes the staging directory.
//
// writeChunk() may be called from many threads at once, in any chunk order
// (concurrent checkpoints copy buffers out of order, by priority).
class ImageWriter {
 public:
  // kAlreadyExists if `directory` exists; kIo if its parent cannot be created.
  static Result<std::unique_ptr<ImageWriter>> create(const std::filesystem::path& directory,
                                                     WriterOptions options = {});
  ~ImageWriter();
  ImageWriter(const ImageWriter&) = delete;
  ImageWriter& operator=(const ImageWriter&) = delete;

  const std::filesystem::path& stagingDirectory() const { return staging_; }
  // Where CRIU writes its images (created).
  std::filesystem::path cpuDirectory() const { return staging_ / kCpuDir; }

  // Declares a blob of `size` bytes; returns its index. Names must be unique.
  Result<size_t> addBlob(std::string name, std::string kind, uint64_t size,
                         nlohmann::json attributes = nlohmann::json::object());
  // Stores chunk `chunk` of blob `blob`; `raw` must be exactly its size. Writing
  // a chunk twice is kAlreadyExists. Thread-safe.
  Status writeChunk(size_t blob, uint64_t chunk, std::span<const std::byte> raw);
  // Convenience: all chunks of a blob from one contiguous buffer of its size.
  Status writeBlob(size_t blob, std::span<const std::byte> raw);

  void setState(nlohmann::json state);

  // Checks that every chunk of every blob was written, records and checksums
  // cpu/, writes the manifest, syncs everything and renames the staging
  // directory to the final name. After a failure the writer is abandoned.
  Status commit();

 private:
  struct BlobState;
  ImageWriter(std::filesystem::path directory, std::filesystem::path staging,
              WriterOptions options);
  void abandon();
  // Creates the blob's file if it has none yet (its mutex held).
  Status openBlobFile(BlobState& blob);

  std::filesystem::path directory_;
  std::filesystem::path staging_;
  WriterOptions options_;
  std::mutex mutex_;  // guards blobs_ (the vector) and state_
  std::vector<std::unique_ptr<BlobState>> blobs_;
  std::unordered_set<std::string> names_;  // of blobs_, for addBlob's check
  nlohmann::json state_ = nlohmann::json::object();
  bool done_ = false;
};

}  // namespace phos::image
