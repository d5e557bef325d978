// SPDX-License-Identifier: Apache-2.0
// The manifest's JSON form and its validation; checksums.
#include "phos/image/format.h"

#include <charconv>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <xxhash.h>

namespace phos::image {

using nlohmann::json;

std::string_view codecName(Codec codec) {
  switch (codec) {
    case Codec::kNone: return "none";
    case Codec::kZstd: return "zstd";
    case Codec::kLz4: return "lz4";
  }
  return "?";
}

Result<Codec> parseCodec(std::string_view name) {
  if (name == "none") return Codec::kNone;
  if (name == "zstd") return Codec::kZstd;
  if (name == "lz4") return Codec::kLz4;
  return makeError(Code::kInvalidArgument, "unknown compression '{}' (choose none, zstd or lz4)",
                   name);
}

uint32_t BlobInfo::chunkRawBytes(uint64_t index) const {
  uint64_t begin = index * chunkBytes;
  return static_cast<uint32_t>(std::min<uint64_t>(chunkBytes, size - begin));
}

uint64_t BlobInfo::storedBytes() const {
  uint64_t total = 0;
  for (const ChunkInfo& c : chunks) total += c.storedBytes;
  return total;
}

uint64_t checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string checksumHex(uint64_t value) { return fmt::format("{:016x}", value); }

namespace {

Result<uint64_t> parseChecksum(const std::string& text) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (text.size() != 16 || ec != std::errc() || end != text.data() + text.size()) {
    return makeError(Code::kDataLoss, "checksum '{}' is not 16 hex digits", text);
  }
  return value;
}

// Field access that names the path of what is missing or mistyped.
class Fields {
 public:
  Fields(const json& object, std::string path) : object_(object), path_(std::move(path)) {}

  Result<const json*> get(const char* key, json::value_t type) const {
    if (!object_.is_object()) return makeError(Code::kDataLoss, "{}: not an object", path_);
    auto it = object_.find(key);
    if (it == object_.end()) return makeError(Code::kDataLoss, "{}.{}: missing", path_, key);
    bool ok = it->type() == type ||
              (type == json::value_t::number_unsigned && it->is_number_unsigned()) ||
              (type == json::value_t::number_integer && it->is_number_integer());
    if (!ok) {
      return makeError(Code::kDataLoss, "{}.{}: expected {}, found {}", path_, key,
                       json(type).type_name(), it->type_name());
    }
    return &*it;
  }
  Result<std::string> string(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, get(key, json::value_t::string));
    return v->get<std::string>();
  }
  Result<uint64_t> unsignedNumber(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, get(key, json::value_t::number_unsigned));
    return v->get<uint64_t>();
  }
  const std::string& path() const { return path_; }

 private:
  const json& object_;
  std::string path_;
};

Result<BlobInfo> blobFromJson(const json& j, const std::string& path) {
  Fields f(j, path);
  BlobInfo blob;
  ASSIGN_OR_RETURN(blob.name, f.string("name"));
  ASSIGN_OR_RETURN(blob.kind, f.string("kind"));
  ASSIGN_OR_RETURN(blob.size, f.unsignedNumber("size"));
  ASSIGN_OR_RETURN(uint64_t chunkBytes, f.unsignedNumber("chunk_bytes"));
  if (chunkBytes == 0 || chunkBytes > (1u << 30)) {
    return makeError(Code::kDataLoss, "{}.chunk_bytes: {} is not in 1..2^30", path, chunkBytes);
  }
  blob.chunkBytes = static_cast<uint32_t>(chunkBytes);
  ASSIGN_OR_RETURN(blob.file, f.string("file"));
  if (blob.file.empty() || blob.file.front() == '/' || blob.file.find("..") != std::string::npos) {
    return makeError(Code::kDataLoss, "{}.file: '{}' is not a path inside the image", path,
                     blob.file);
  }
  ASSIGN_OR_RETURN(const json* attributes, f.get("attributes", json::value_t::object));
  blob.attributes = *attributes;
  ASSIGN_OR_RETURN(const json* chunks, f.get("chunks", json::value_t::array));
  if (chunks->size() != blob.chunkCount()) {
    return makeError(Code::kDataLoss, "{}.chunks: {} entries for {} bytes in chunks of {}", path,
                     chunks->size(), blob.size, blob.chunkBytes);
  }
  for (size_t i = 0; i < chunks->size(); ++i) {
    const json& c = (*chunks)[i];
    std::string where = fmt::format("{}.chunks[{}]", path, i);
    if (!c.is_array() || c.size() != 4 || !c[0].is_number_unsigned() ||
        !c[1].is_number_unsigned() || !c[2].is_string() || !c[3].is_string()) {
      return makeError(Code::kDataLoss,
                       "{}: expected [file offset, stored bytes, codec, checksum]", where);
    }
    ChunkInfo chunk;
    chunk.fileOffset = c[0].get<uint64_t>();
    uint64_t stored = c[1].get<uint64_t>();
    if (stored == 0 || stored > (2ull << 30)) {
      return makeError(Code::kDataLoss, "{}: stored size {} is out of range", where, stored);
    }
    // The reader checks that the file holds offset + stored bytes: that sum
    // must not wrap, and a pread offset is signed.
    if (chunk.fileOffset > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - stored) {
      return makeError(Code::kDataLoss, "{}: file offset {} is out of range", where, chunk.fileOffset);
    }
    chunk.storedBytes = static_cast<uint32_t>(stored);
    auto codec = parseCodec(c[2].get<std::string>());
    if (!codec) return makeError(Code::kDataLoss, "{}: {}", where, codec.status().message());
    chunk.codec = *codec;
    auto sum = parseChecksum(c[3].get<std::string>());
    if (!sum) return makeError(Code::kDataLoss, "{}: {}", where, sum.status().message());
    chunk.checksum = *sum;
    blob.chunks.push_back(chunk);
  }
  return blob;
}

}  // namespace

json toJson(const Manifest& m) {
  json blobs = json::array();
  for (const BlobInfo& b : m.blobs) {
    json chunks = json::array();
    for (const ChunkInfo& c : b.chunks) {
      chunks.push_back({c.fileOffset, c.storedBytes, codecName(c.codec), checksumHex(c.checksum)});
    }
    blobs.push_back({{"name", b.name},
                     {"kind", b.kind},
                     {"size", b.size},
                     {"chunk_bytes", b.chunkBytes},
                     {"file", b.file},
                     {"attributes", b.attributes},
                     {"chunks", std::move(chunks)}});
  }
  json cpu = json::array();
  for (const CpuFile& f : m.cpuFiles) {
    cpu.push_back({{"path", f.path}, {"size", f.size}, {"checksum", checksumHex(f.checksum)}});
  }
  return {{"format", kFormatName}, {"version", m.version}, {"created", m.created},
          {"state", m.state},      {"blobs", std::move(blobs)}, {"cpu_files", std::move(cpu)}};
}

Result<Manifest> manifestFromJson(const json& j) {
  Fields f(j, "manifest");
  ASSIGN_OR_RETURN(std::string format, f.string("format"));
  if (format != kFormatName) {
    return makeError(Code::kDataLoss, "manifest.format: '{}' is not '{}'", format, kFormatName);
  }
  ASSIGN_OR_RETURN(uint64_t version, f.unsignedNumber("version"));
  if (version == 0) return makeError(Code::kDataLoss, "manifest.version: 0");
  if (version > static_cast<uint64_t>(kFormatVersion)) {
    return makeError(Code::kNotSupported,
                     "image format version {} is newer than this PhOS reads (up to {})", version,
                     kFormatVersion);
  }
  Manifest m;
  m.version = static_cast<int>(version);
  ASSIGN_OR_RETURN(m.created, f.string("created"));
  ASSIGN_OR_RETURN(const json* state, f.get("state", json::value_t::object));
  m.state = *state;
  ASSIGN_OR_RETURN(const json* blobs, f.get("blobs", json::value_t::array));
  std::set<std::string> names;
  for (size_t i = 0; i < blobs->size(); ++i) {
    ASSIGN_OR_RETURN(BlobInfo blob, blobFromJson((*blobs)[i], fmt::format("blobs[{}]", i)));
    if (!names.insert(blob.name).second) {
      return makeError(Code::kDataLoss, "blobs[{}].name: '{}' appears twice", i, blob.name);
    }
    m.blobs.push_back(std::move(blob));
  }
  ASSIGN_OR_RETURN(const json* cpu, f.get("cpu_files", json::value_t::array));
  for (size_t i = 0; i < cpu->size(); ++i) {
    Fields cf((*cpu)[i], fmt::format("cpu_files[{}]", i));
    CpuFile file;
    ASSIGN_OR_RETURN(file.path, cf.string("path"));
    if (file.path.empty() || file.path.front() == '/' ||
        file.path.find("..") != std::string::npos) {
      return makeError(Code::kDataLoss, "cpu_files[{}].path: '{}' is not inside cpu/", i,
                       file.path);
    }
    ASSIGN_OR_RETURN(file.size, cf.unsignedNumber("size"));
    ASSIGN_OR_RETURN(std::string sum, cf.string("checksum"));
    auto parsed = parseChecksum(sum);
    if (!parsed) {
      return makeError(Code::kDataLoss, "cpu_files[{}].checksum: {}", i,
                       parsed.status().message());
    }
    file.checksum = *parsed;
    m.cpuFiles.push_back(std::move(file));
  }
  return m;
}

}  // namespace phos::image
