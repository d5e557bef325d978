// SPDX-License-Identifier: Apache-2.0
// The checkpoint image format: manifest schema, blobs of chunked data, codecs.
#pragma once

// An image is a directory (docs/image-format.md):
//
//   manifest.json   format name and version, the engine's state description,
//                   the table of blobs and their chunks, the cpu/ file list
//   blobs/NNNNNN    one file per blob: its chunks, each compressed on its own
//   cpu/            CRIU's images
//
// A blob is a named byte sequence (a GPU allocation's contents, a pinned host
// buffer, a module's image) cut into chunks of `chunkBytes` (the last one may be
// shorter). Each chunk carries the xxHash3-64 of its raw bytes and its own codec,
// so any chunk can be read on its own (on-demand restore) and damage is named
// down to the chunk.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"

namespace phos::image {

inline constexpr std::string_view kFormatName = "phos-image";
inline constexpr int kFormatVersion = 1;
inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr std::string_view kCpuDir = "cpu";
inline constexpr std::string_view kBlobDir = "blobs";
// Chunks that arrive after the image is published (live migration's post-copy,
// docs/migration.md): kLateFile lists them, {"chunks": [[blob, chunk, xxh3],
// ...]}, and each arrives as kLateDir/BLOB.CHUNK (its raw bytes). A reader asks
// for one by appending "BLOB CHUNK\n" to kLateDir/wanted and waits for it;
// kLateDir/failed (its text: why) means none will come.
inline constexpr std::string_view kLateFile = "late.json";
inline constexpr std::string_view kLateDir = "late";
// The copy engine's chunk: large enough to run at full bandwidth, small enough
// that an on-demand load of one chunk is short.
inline constexpr uint32_t kDefaultChunkBytes = 4u << 20;

enum class Codec : uint8_t { kNone, kZstd, kLz4 };
std::string_view codecName(Codec codec);
// "none", "zstd", "lz4"; anything else is kInvalidArgument naming the choices.
Result<Codec> parseCodec(std::string_view name);

struct ChunkInfo {
  uint64_t fileOffset = 0;   // where the stored bytes start in the blob's file
  uint32_t storedBytes = 0;  // after compression
  Codec codec = Codec::kNone;
  uint64_t checksum = 0;     // XXH3_64bits of the raw bytes

  friend bool operator==(const ChunkInfo&, const ChunkInfo&) = default;
};

struct BlobInfo {
  std::string name;  // unique in the image: "gpu/0/0x7f0000000000"
  std::string kind;  // "gpu-memory", "pinned-host", "module-image", ...
  uint64_t size = 0;
  uint32_t chunkBytes = kDefaultChunkBytes;
  std::string file;  // relative to the image directory
  nlohmann::json attributes = nlohmann::json::object();  // device, address, flags...
  std::vector<ChunkInfo> chunks;

  // Not (size + chunkBytes - 1) / chunkBytes: a manifest's size near 2^64 would wrap to 0.
  uint64_t chunkCount() const { return size / chunkBytes + (size % chunkBytes != 0 ? 1 : 0); }
  // Raw size of chunk `index` (< chunkCount()).
  uint32_t chunkRawBytes(uint64_t index) const;
  uint64_t storedBytes() const;
};

// A file of cpu/ (CRIU's images), recorded so that `phos verify` can check it.
struct CpuFile {
  std::string path;  // relative to cpu/
  uint64_t size = 0;
  uint64_t checksum = 0;
};

struct Manifest {
  int version = kFormatVersion;
  std::string created;  // UTC, ISO 8601
  // What the checkpoint engine records (process, devices, contexts, modules,
  // streams, protocol, timings). The image layer stores it as given.
  nlohmann::json state = nlohmann::json::object();
  std::vector<BlobInfo> blobs;
  std::vector<CpuFile> cpuFiles;
};

nlohmann::json toJson(const Manifest& manifest);
// Checks the structure and every field; the error names the field
// ("blobs[3].chunks[7]: stored size 0").
Result<Manifest> manifestFromJson(const nlohmann::json& json);

// XXH3_64bits, the checksum of chunks and cpu/ files.
uint64_t checksum(std::span<const std::byte> bytes);
std::string checksumHex(uint64_t checksum);

}  // namespace phos::image
