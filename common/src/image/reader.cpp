// SPDX-License-Identifier: Apache-2.0
// ImageReader: manifest checks at open, checksummed random access, full verification.
#include "phos/image/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <xxhash.h>

#include "codec.h"

namespace phos::image {

namespace fs = std::filesystem;

namespace {

// pread of exactly out.size() bytes; a short file is data loss.
Status readExactly(const fs::path& path, uint64_t offset, std::span<std::byte> out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return makeError(Code::kDataLoss, "{} is missing", path.string());
    return errnoError(err, fmt::format("opening {}", path.string()));
  }
  size_t done = 0;
  Status status;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done,
                        static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = errnoError(errno, fmt::format("reading {}", path.string()));
      break;
    }
    if (n == 0) {
      status = makeError(Code::kDataLoss, "{} ends at byte {}, before {}", path.string(),
                         offset + done, offset + out.size());
      break;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return status;
}

}  // namespace

Result<std::unique_ptr<ImageReader>> ImageReader::open(const fs::path& directory) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    // An interrupted checkpoint leaves its staging directory next to the
    // name it would have published (ImageWriter): say so, it is no image.
    fs::path target = fs::absolute(directory, ec).lexically_normal();
    if (!target.has_filename()) target = target.parent_path();
    std::string prefix = fmt::format(".{}.partial-", target.filename().string());
    for (auto it = fs::directory_iterator(target.parent_path(), ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      if (it->path().filename().string().starts_with(prefix)) {
        return makeError(Code::kNotFound,
                         "{}: no such image directory ({} is what an interrupted checkpoint "
                         "left: it is not an image)",
                         directory.string(), it->path().filename().string());
      }
    }
    return makeError(Code::kNotFound, "{}: no such image directory", directory.string());
  }
  fs::path manifestPath = directory / kManifestFile;
  std::ifstream in(manifestPath);
  if (!in) {
    return makeError(Code::kNotFound, "{}: not a PhOS image ({} is missing)", directory.string(),
                     kManifestFile);
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return makeError(Code::kDataLoss, "{}: not valid JSON (damaged or truncated)",
                     manifestPath.string());
  }
  // A manifest.json of something else (another tool's directory).
  if (!json.is_object() || !json.contains("format") || json["format"] != kFormatName) {
    std::string what = json.is_object() && json.contains("format")
                           ? fmt::format("its format is {}", json["format"].dump())
                           : std::string("it has no \"format\" field");
    return makeError(Code::kNotFound, "{}: not a PhOS image ({} is not a PhOS manifest: {})",
                     directory.string(), kManifestFile, what);
  }
  auto manifest = manifestFromJson(json);
  if (!manifest) return std::move(manifest).status().withContext(manifestPath.string());

  // Cheap structural checks: every blob file exists and holds its chunks.
  for (const BlobInfo& blob : manifest->blobs) {
    fs::path path = directory / blob.file;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      return makeError(Code::kDataLoss, "blob '{}': {} is missing", blob.name, path.string());
    }
    uint64_t need = 0;
    for (const ChunkInfo& c : blob.chunks) need = std::max(need, c.fileOffset + c.storedBytes);
    if (static_cast<uint64_t>(st.st_size) < need) {
      return makeError(Code::kDataLoss, "blob '{}': {} has {} bytes, its chunks need {}",
                       blob.name, path.string(), st.st_size, need);
    }
  }
  auto reader = std::unique_ptr<ImageReader>(new ImageReader(directory, std::move(manifest).value()));
  if (std::ifstream late(directory / kLateFile); late) {
    auto list = nlohmann::json::parse(late, nullptr, false);
    if (!list.is_object() || !list.contains("chunks") || !list["chunks"].is_array()) {
      return makeError(Code::kDataLoss, "{}: damaged", (directory / kLateFile).string());
    }
    for (const auto& entry : list["chunks"]) {
      if (!entry.is_array() || entry.size() != 3 || !entry[0].is_number_unsigned() || !entry[1].is_number_unsigned() ||
          !entry[2].is_number_unsigned() || entry[0].get<size_t>() >= reader->manifest_.blobs.size()) {
        return makeError(Code::kDataLoss, "{}: an entry is not [blob, chunk, checksum]: {}",
                         (directory / kLateFile).string(), entry.dump());
      }
      reader->late_[{entry[0].get<size_t>(), entry[1].get<uint64_t>()}] = entry[2].get<uint64_t>();
    }
  }
  return reader;
}

// A late chunk: asked for once, then its file is waited for (every millisecond).
Status ImageReader::readLate(size_t blob, uint64_t chunk, uint64_t expected, std::span<std::byte> out) const {
  const fs::path dir = directory_ / kLateDir;
  const fs::path file = dir / fmt::format("{}.{}", blob, chunk);
  const std::string where = fmt::format("blob '{}' chunk {} (late)", manifest_.blobs[blob].name, chunk);
  const auto deadline = std::chrono::steady_clock::now() + lateTimeout;
  std::error_code ec;
  while (!fs::exists(file, ec)) {
    {
      std::lock_guard lock(lateMutex_);
      if (asked_.insert({blob, chunk}).second) {
        std::ofstream wanted(dir / "wanted", std::ios::app);
        wanted << blob << ' ' << chunk << '\n';
      }
    }
    if (std::ifstream failed(dir / "failed"); failed) {
      std::string why((std::istreambuf_iterator<char>(failed)), std::istreambuf_iterator<char>());
      return makeError(Code::kUnavailable, "{}: it will not arrive: {}", where, why);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return makeError(Code::kUnavailable, "{}: did not arrive within {} s", where,
                       std::chrono::duration_cast<std::chrono::seconds>(lateTimeout).count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  RETURN_IF_ERROR_CTX(readExactly(file, 0, out), where);
  if (checksum(out) != expected) return makeError(Code::kDataLoss, "{}: checksum does not match", where);
  return Status::ok();
}

std::optional<size_t> ImageReader::findBlob(std::string_view name) const {
  for (size_t i = 0; i < manifest_.blobs.size(); ++i) {
    if (manifest_.blobs[i].name == name) return i;
  }
  return std::nullopt;
}

Status ImageReader::readChunk(size_t blobIndex, uint64_t chunk, std::span<std::byte> out) const {
  if (blobIndex >= manifest_.blobs.size()) {
    return makeError(Code::kOutOfRange, "no blob {} (the image has {})", blobIndex,
                     manifest_.blobs.size());
  }
  const BlobInfo& blob = manifest_.blobs[blobIndex];
  if (chunk >= blob.chunkCount()) {
    return makeError(Code::kOutOfRange, "blob '{}' has {} chunks, not {}", blob.name,
                     blob.chunkCount(), chunk + 1);
  }
  if (out.size() != blob.chunkRawBytes(chunk)) {
    return makeError(Code::kInvalidArgument, "chunk {} of blob '{}' is {} bytes, not {}", chunk,
                     blob.name, blob.chunkRawBytes(chunk), out.size());
  }
  if (auto late = late_.find({blobIndex, chunk}); late != late_.end()) {
    return readLate(blobIndex, chunk, late->second, out);
  }
  const ChunkInfo& info = blob.chunks[chunk];
  std::string where = fmt::format("blob '{}' chunk {}", blob.name, chunk);
  std::vector<std::byte> stored;
  std::span<std::byte> target = out;
  if (info.codec != Codec::kNone) {
    stored.resize(info.storedBytes);
    target = stored;
  } else if (info.storedBytes != out.size()) {
    return makeError(Code::kDataLoss, "{}: stored {} bytes uncompressed, expected {}", where,
                     info.storedBytes, out.size());
  }
  RETURN_IF_ERROR_CTX(readExactly(directory_ / blob.file, info.fileOffset, target), where);
  if (info.codec != Codec::kNone) {
    RETURN_IF_ERROR_CTX(detail::decompress(info.codec, stored, out), where);
  }
  uint64_t sum = checksum(out);
  if (sum != info.checksum) {
    return makeError(Code::kDataLoss, "{}: checksum {} does not match the recorded {}", where,
                     checksumHex(sum), checksumHex(info.checksum));
  }
  return Status::ok();
}

Status ImageReader::read(size_t blobIndex, uint64_t offset, std::span<std::byte> out) const {
  if (blobIndex >= manifest_.blobs.size()) {
    return makeError(Code::kOutOfRange, "no blob {} (the image has {})", blobIndex,
                     manifest_.blobs.size());
  }
  const BlobInfo& blob = manifest_.blobs[blobIndex];
  if (offset > blob.size || out.size() > blob.size - offset) {
    return makeError(Code::kOutOfRange, "bytes [{}, {}) are outside blob '{}' of {} bytes",
                     offset, offset + out.size(), blob.name, blob.size);
  }
  std::vector<std::byte> chunkBuffer;
  size_t done = 0;
  while (done < out.size()) {
    uint64_t position = offset + done;
    uint64_t chunk = position / blob.chunkBytes;
    uint64_t within = position % blob.chunkBytes;
    uint32_t rawBytes = blob.chunkRawBytes(chunk);
    size_t take = std::min<uint64_t>(rawBytes - within, out.size() - done);
    if (within == 0 && take == rawBytes) {
      RETURN_IF_ERROR(readChunk(blobIndex, chunk, out.subspan(done, take)));
    } else {
      chunkBuffer.resize(rawBytes);
      RETURN_IF_ERROR(readChunk(blobIndex, chunk, chunkBuffer));
      std::memcpy(out.data() + done, chunkBuffer.data() + within, take);
    }
    done += take;
  }
  return Status::ok();
}

std::vector<Problem> ImageReader::verify() const {
  std::vector<Problem> problems = verifyBlobs();
  std::vector<Problem> cpu = verifyCpuFiles();
  problems.insert(problems.end(), cpu.begin(), cpu.end());
  return problems;
}

std::vector<Problem> ImageReader::verifyBlobs() const {
  std::vector<Problem> problems;
  std::vector<std::byte> buffer;
  for (size_t b = 0; b < manifest_.blobs.size(); ++b) {
    const BlobInfo& blob = manifest_.blobs[b];
    for (uint64_t c = 0; c < blob.chunkCount(); ++c) {
      buffer.resize(blob.chunkRawBytes(c));
      Status s = readChunk(b, c, buffer);
      if (!s.isOk()) {
        problems.push_back({fmt::format("blob '{}' chunk {}", blob.name, c), s.message()});
      }
    }
  }
  return problems;
}

std::vector<Problem> ImageReader::verifyCpuFiles() const {
  std::vector<Problem> problems;
  std::vector<std::byte> buffer;
  for (const CpuFile& file : manifest_.cpuFiles) {
    fs::path path = cpuDirectory() / file.path;
    std::string where = fmt::format("{}/{}", kCpuDir, file.path);
    std::error_code ec;
    uint64_t size = fs::file_size(path, ec);
    if (ec) {
      problems.push_back({where, "missing"});
      continue;
    }
    if (size != file.size) {
      problems.push_back({where, fmt::format("{} bytes, {} recorded", size, file.size)});
      continue;
    }
    buffer.resize(size);
    Status s = readExactly(path, 0, buffer);
    if (!s.isOk()) {
      problems.push_back({where, s.message()});
    } else if (checksum(buffer) != file.checksum) {
      problems.push_back({where, fmt::format("checksum {} does not match the recorded {}",
                                             checksumHex(checksum(buffer)),
                                             checksumHex(file.checksum))});
    }
  }
  return problems;
}

}  // namespace phos::image
