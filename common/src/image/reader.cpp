// SPDX-License-Identifier: Apache-2.0
// ImageReader: manifest checks at open, checksummed random access, full verification.
#include "phos/image/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

// The largest manifest.json or late.json read: a manifest of 1 TiB of device
// memory in 4 MiB chunks is about 16 MiB; a hostile one is not read whole.
constexpr uint64_t kMaxJsonBytes = 256ull << 20;

Status readAll(int fd, std::string_view shownAs, uint64_t offset, std::span<std::byte> out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errnoError(errno, fmt::format("reading {}", shownAs));
    if (n == 0) {
      return makeError(Code::kDataLoss, "{} ends at byte {}, before {}", shownAs, offset + done,
                       offset + out.size());
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

// A JSON file of the image, read whole (bounded); nullopt when it does not exist.
Result<std::optional<std::string>> readText(int directory, std::string_view relative, const Requester& requester) {
  auto fd = openBeneath(directory, relative, requester);
  if (!fd.isOk()) {
    if (fd.status().code() == Code::kNotFound) return std::optional<std::string>();
    return fd.status();
  }
  ASSIGN_OR_RETURN(uint64_t size, fileSize(fd->get(), relative));
  if (size > kMaxJsonBytes) {
    return makeError(Code::kDataLoss, "{} is larger than {} MiB: not a manifest this PhOS wrote", relative,
                     kMaxJsonBytes >> 20);
  }
  std::string text(size, '\0');
  RETURN_IF_ERROR(readAll(fd->get(), relative, 0, std::as_writable_bytes(std::span(text))));
  return std::optional<std::string>(std::move(text));
}

}  // namespace

Result<Fd> ImageReader::openFile(std::string_view relative) const {
  return openBeneath(directoryFd_.get(), relative, requester_);
}

// pread of exactly out.size() bytes; a short file is data loss.
Status ImageReader::readExactly(std::string_view relative, uint64_t offset, std::span<std::byte> out) const {
  auto fd = openFile(relative);
  if (!fd.isOk()) {
    if (fd.status().code() == Code::kNotFound) return makeError(Code::kDataLoss, "{} is missing", relative);
    return fd.status();
  }
  return readAll(fd->get(), relative, offset, out);
}

Result<std::unique_ptr<ImageReader>> ImageReader::open(const fs::path& directory, const Requester& requester) {
  auto opened = openImageDirectory(directory);
  if (!opened.isOk() && opened.status().code() == Code::kNotFound) {
    // An interrupted checkpoint leaves its staging directory next to the
    // name it would have published (ImageWriter): say so, it is no image.
    std::error_code ec;
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
    return opened.status();
  }
  if (!opened.isOk()) return opened.status();
  Fd dir = std::move(opened).value();
  // Who may use it is decided by the directory's owner and mode, never by
  // what the manifest says (its uid is checked against the requester later,
  // by the restore that uses it).
  RETURN_IF_ERROR(checkImageOwner(dir.get(), directory.string(), requester));

  const fs::path manifestPath = directory / kManifestFile;
  auto manifestText = readText(dir.get(), kManifestFile, requester);
  if (!manifestText.isOk()) return std::move(manifestText).status().withContext(directory.string());
  if (!manifestText->has_value()) {
    return makeError(Code::kNotFound, "{}: not a PhOS image ({} is missing)", directory.string(),
                     kManifestFile);
  }
  nlohmann::json json = nlohmann::json::parse(**manifestText, nullptr, /*allow_exceptions=*/false);
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

  // Cheap structural checks: every blob file is a regular file beneath the
  // image (openBeneath: a link is refused here, before any byte is read) and
  // holds its chunks.
  for (const BlobInfo& blob : manifest->blobs) {
    auto fd = openBeneath(dir.get(), blob.file, requester);
    if (!fd.isOk()) {
      if (fd.status().code() == Code::kNotFound) {
        return makeError(Code::kDataLoss, "blob '{}': {} is missing", blob.name, (directory / blob.file).string());
      }
      return std::move(fd).status().withContext(fmt::format("blob '{}'", blob.name));
    }
    ASSIGN_OR_RETURN(uint64_t size, fileSize(fd->get(), blob.file));
    uint64_t need = 0;
    for (const ChunkInfo& c : blob.chunks) need = std::max(need, c.fileOffset + c.storedBytes);
    if (size < need) {
      return makeError(Code::kDataLoss, "blob '{}': {} has {} bytes, its chunks need {}",
                       blob.name, (directory / blob.file).string(), size, need);
    }
  }
  auto lateText = readText(dir.get(), kLateFile, requester);
  if (!lateText.isOk()) return std::move(lateText).status().withContext(directory.string());
  auto reader = std::unique_ptr<ImageReader>(
      new ImageReader(directory, std::move(dir), requester, std::move(manifest).value()));
  if (lateText->has_value()) {
    if (!requester.privileged()) {
      // Late chunks are the target side of phosd's own migrations, which
      // root restores: a user's image has no business making a worker wait
      // for (and ask for, by writing late/wanted) files.
      return makeError(Code::kPermissionDenied, "{}: {} (late chunks of a migration) is restored only by root",
                       directory.string(), kLateFile);
    }
    auto list = nlohmann::json::parse(**lateText, nullptr, false);
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

// A late chunk: asked for once, then its file is waited for (every
// millisecond). Every file of late/ is opened beneath the image as the
// others are; only root gets here (open refuses late.json otherwise).
Status ImageReader::readLate(size_t blob, uint64_t chunk, uint64_t expected, std::span<std::byte> out) const {
  const std::string file = fmt::format("{}/{}.{}", kLateDir, blob, chunk);
  const std::string where = fmt::format("blob '{}' chunk {} (late)", manifest_.blobs[blob].name, chunk);
  const auto deadline = std::chrono::steady_clock::now() + lateTimeout;
  for (;;) {
    auto arrived = openFile(file);
    if (arrived.isOk()) {
      RETURN_IF_ERROR_CTX(readAll(arrived->get(), file, 0, out), where);
      break;
    }
    if (arrived.status().code() != Code::kNotFound) return std::move(arrived).status().withContext(where);
    {
      std::lock_guard lock(lateMutex_);
      if (asked_.insert({blob, chunk}).second) {
        // Best effort, as before: a sender that never reads it still sends
        // everything in order.
        auto wanted = openBeneath(directoryFd_.get(), fmt::format("{}/wanted", kLateDir), requester_,
                                  O_WRONLY | O_APPEND | O_CREAT);
        if (wanted.isOk()) {
          std::string line = fmt::format("{} {}\n", blob, chunk);
          [[maybe_unused]] ssize_t n = ::write(wanted->get(), line.data(), line.size());
        }
      }
    }
    if (auto failed = openFile(fmt::format("{}/failed", kLateDir)); failed.isOk()) {
      // The sender's own words (migration.cpp writes them), bounded.
      std::string why(4096, '\0');
      ssize_t n = ::read(failed->get(), why.data(), why.size());
      why.resize(n > 0 ? static_cast<size_t>(n) : 0);
      return makeError(Code::kUnavailable, "{}: it will not arrive: {}", where, why);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return makeError(Code::kUnavailable, "{}: did not arrive within {} s", where,
                       std::chrono::duration_cast<std::chrono::seconds>(lateTimeout).count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (checksum(out) != expected) {
    return makeError(Code::kDataLoss, "{}: does not match its checksum in late.json", where);
  }
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
  RETURN_IF_ERROR_CTX(readExactly(blob.file, info.fileOffset, target), where);
  if (info.codec != Codec::kNone) {
    RETURN_IF_ERROR_CTX(detail::decompress(info.codec, stored, out), where);
  }
  // Neither checksum is printed: the computed one is derived from the
  // file's bytes (an oracle on whatever the file is), and the expected one
  // tells nothing the manifest does not.
  if (checksum(out) != info.checksum) {
    return makeError(Code::kDataLoss, "{}: does not match its checksum in the manifest", where);
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

// Each file read in slices into one small buffer and hashed as it comes
// (XXH3's streaming hash is the one-shot checksum of format.h): a process's
// memory may be gigabytes, which a buffer of its size would fault in first.
std::vector<Problem> ImageReader::verifyCpuFiles() const {
  constexpr size_t kSlice = 4u << 20;
  std::vector<Problem> problems;
  std::vector<std::byte> buffer;
  XXH3_state_t* state = XXH3_createState();
  for (const CpuFile& file : manifest_.cpuFiles) {
    const std::string where = fmt::format("{}/{}", kCpuDir, file.path);
    auto fd = openFile(where);
    if (!fd.isOk()) {
      problems.push_back({where, fd.status().code() == Code::kNotFound ? "missing" : fd.status().message()});
      continue;
    }
    auto size = fileSize(fd->get(), where);
    if (!size.isOk()) {
      problems.push_back({where, size.status().message()});
      continue;
    }
    if (*size != file.size) {
      problems.push_back({where, fmt::format("{} bytes, {} recorded", *size, file.size)});
      continue;
    }
    XXH3_64bits_reset(state);
    Status s = Status::ok();
    for (uint64_t offset = 0; offset < *size && s.isOk(); offset += kSlice) {
      buffer.resize(static_cast<size_t>(std::min<uint64_t>(kSlice, *size - offset)));
      s = readAll(fd->get(), where, offset, buffer);
      if (s.isOk()) XXH3_64bits_update(state, buffer.data(), buffer.size());
    }
    if (!s.isOk()) {
      problems.push_back({where, s.message()});
    } else if (XXH3_64bits_digest(state) != file.checksum) {
      problems.push_back({where, "does not match its checksum in the manifest"});
    }
  }
  XXH3_freeState(state);
  return problems;
}

}  // namespace phos::image
