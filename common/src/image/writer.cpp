// SPDX-License-Identifier: Apache-2.0
// ImageWriter: chunked, checksummed, optionally compressed; published by an atomic rename.
#include "phos/image/writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <system_error>

#include <fmt/chrono.h>
#include <xxhash.h>

#include "codec.h"
#include "phos/common/log.h"
#include "phos/common/unique_fd.h"

namespace phos::image {

namespace fs = std::filesystem;

struct ImageWriter::BlobState {
  BlobInfo info;
  UniqueFd fd;
  std::mutex mutex;  // guards everything below and the file's end
  uint64_t end = 0;
  std::vector<bool> written;
  uint64_t writtenCount = 0;
};

namespace {

Status writeAll(int fd, const void* data, size_t size, uint64_t offset, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError(errno, fmt::format("writing {}", path.string()));
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

Status syncPath(const fs::path& path, bool directory) {
  UniqueFd fd(::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC));
  if (!fd) return errnoError(errno, fmt::format("opening {} to sync it", path.string()));
  if (::fsync(fd.get()) != 0) return errnoError(errno, fmt::format("syncing {}", path.string()));
  return Status::ok();
}

// Gives the directory `fd` and everything in it to `uid`: fchown of
// descriptors and fchownat(AT_SYMLINK_NOFOLLOW), so a link placed in the tree
// changes only the link, and openat(O_NOFOLLOW) to descend.
Status chownTree(int fd, uid_t uid, const fs::path& shownAs) {
  if (::fchown(fd, uid, static_cast<gid_t>(-1)) != 0) {
    return errnoError(errno, fmt::format("giving {} to uid {}", shownAs.string(), uid));
  }
  UniqueFd listFd(::dup(fd));
  if (!listFd) return errnoError(errno, fmt::format("listing {}", shownAs.string()));
  DIR* dir = ::fdopendir(listFd.get());
  if (dir == nullptr) return errnoError(errno, fmt::format("listing {}", shownAs.string()));
  listFd.release();  // the DIR owns it now (closedir)
  Status status;
  while (dirent* entry = ::readdir(dir)) {
    std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    UniqueFd child(::openat(fd, entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (child) {
      status = chownTree(child.get(), uid, shownAs / name);
    } else if (::fchownat(fd, entry->d_name, uid, static_cast<gid_t>(-1), AT_SYMLINK_NOFOLLOW) != 0) {
      status = errnoError(errno, fmt::format("giving {} to uid {}", (shownAs / name).string(), uid));
    }
    if (!status.isOk()) break;
  }
  ::closedir(dir);
  return status;
}

// Size and checksum of a file, streamed.
Result<CpuFile> describeFile(const fs::path& path, std::string relative) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return errnoError(errno, fmt::format("opening {}", path.string()));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(1 << 20);
  CpuFile file{std::move(relative), 0, 0};
  Status status;
  for (;;) {
    ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = errnoError(errno, fmt::format("reading {}", path.string()));
      break;
    }
    if (n == 0) break;
    XXH3_64bits_update(state, buffer.data(), static_cast<size_t>(n));
    file.size += static_cast<uint64_t>(n);
  }
  file.checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!status.isOk()) return status;
  return file;
}

std::string utcNow() {
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(
                         std::chrono::system_clock::now())));
}

}  // namespace

ImageWriter::ImageWriter(fs::path directory, fs::path staging, WriterOptions options)
    : directory_(std::move(directory)), staging_(std::move(staging)), options_(options) {}

ImageWriter::~ImageWriter() {
  if (!done_) abandon();
}

void ImageWriter::abandon() {
  blobs_.clear();  // closes the files
  std::error_code ec;
  fs::remove_all(staging_, ec);
  if (ec) {
    log::get("image")->warn("could not remove the partial image {}: {}", staging_.string(),
                            ec.message());
  }
  done_ = true;
}

Result<std::unique_ptr<ImageWriter>> ImageWriter::create(const fs::path& directory,
                                                         WriterOptions options) {
  if (options.chunkBytes == 0 || options.chunkBytes > (1u << 30)) {
    return makeError(Code::kInvalidArgument, "chunk size {} is not in 1..1 GiB",
                     options.chunkBytes);
  }
  fs::path target = fs::absolute(directory).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "dir/" -> "dir"
  std::error_code ec;
  if (fs::exists(fs::symlink_status(target, ec))) {
    return makeError(Code::kAlreadyExists, "{} already exists; choose a new image directory",
                     target.string());
  }
  fs::create_directories(target.parent_path(), ec);
  if (ec) {
    return makeError(Code::kIo, "cannot create {}: {}", target.parent_path().string(),
                     ec.message());
  }
  std::string prefix = fmt::format(".{}.partial-", target.filename().string());
  fs::path staging = target.parent_path() / fmt::format("{}{}", prefix, ::getpid());
  fs::remove_all(staging, ec);  // left over by a crashed writer with our pid
  // Staging directories of writers that died (a killed phos checkpoint): no
  // one will finish them. A live pid's is left alone (it may be writing).
  for (auto it = fs::directory_iterator(target.parent_path(), ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    char* end = nullptr;
    long owner = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (owner <= 0 || *end != '\0') continue;
    if (::kill(static_cast<pid_t>(owner), 0) == 0 || errno != ESRCH) continue;  // alive
    std::error_code removeError;
    fs::remove_all(it->path(), removeError);
    log::get("image")->info("removed {}, left by writer pid {} which is gone", it->path().string(),
                            owner);
  }
  ec.clear();
  // 0700 from the start: nobody else may read or change an image while it is
  // written (CRIU may run as the job's user: docs/security.md), nor read the
  // process's memory in it afterwards.
  for (const fs::path& dir : {staging, staging / kBlobDir, staging / kCpuDir}) {
    if (!fs::create_directory(dir, ec) || ec || ::chmod(dir.c_str(), 0700) != 0) {
      fs::remove_all(staging, ec);
      return makeError(Code::kIo, "cannot create {}: {}", dir.string(),
                       ec ? ec.message() : "exists");
    }
  }
  return std::unique_ptr<ImageWriter>(new ImageWriter(target, staging, options));
}

Result<size_t> ImageWriter::addBlob(std::string name, std::string kind, uint64_t size,
                                    nlohmann::json attributes) {
  std::lock_guard lock(mutex_);
  if (done_) return makeError(Code::kFailedPrecondition, "the image was already committed");
  if (names_.count(name) != 0) return makeError(Code::kAlreadyExists, "blob '{}' was already added", name);
  if (!attributes.is_object()) {
    return makeError(Code::kInvalidArgument, "attributes of blob '{}' must be an object", name);
  }
  auto blob = std::make_unique<BlobState>();
  blob->info.name = std::move(name);
  blob->info.kind = std::move(kind);
  blob->info.size = size;
  blob->info.chunkBytes = options_.chunkBytes;
  blob->info.file = fmt::format("{}/{:06}", kBlobDir, blobs_.size());
  blob->info.attributes = std::move(attributes);
  blob->info.chunks.resize(blob->info.chunkCount());
  blob->written.resize(blob->info.chunkCount());
  // The file is created by the first chunk written (or the commit): adding
  // blobs is cheap, since a checkpoint adds one per allocation inside the
  // job's pause and writes them after it.
  names_.insert(blob->info.name);
  blobs_.push_back(std::move(blob));
  return blobs_.size() - 1;
}

Status ImageWriter::openBlobFile(BlobState& blob) {
  if (blob.fd) return Status::ok();
  fs::path path = staging_ / blob.info.file;
  blob.fd.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!blob.fd) return errnoError(errno, fmt::format("creating {}", path.string()));
  return Status::ok();
}

Status ImageWriter::writeChunk(size_t blobIndex, uint64_t chunk, std::span<const std::byte> raw) {
  BlobState* blob = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (done_) return makeError(Code::kFailedPrecondition, "the image was already committed");
    if (blobIndex >= blobs_.size()) {
      return makeError(Code::kOutOfRange, "no blob {} (the image has {})", blobIndex,
                       blobs_.size());
    }
    blob = blobs_[blobIndex].get();
  }
  const BlobInfo& info = blob->info;
  if (chunk >= info.chunkCount()) {
    return makeError(Code::kOutOfRange, "blob '{}' has {} chunks, not {}", info.name,
                     info.chunkCount(), chunk + 1);
  }
  if (raw.size() != info.chunkRawBytes(chunk)) {
    return makeError(Code::kInvalidArgument, "chunk {} of blob '{}' is {} bytes, not {}", chunk,
                     info.name, info.chunkRawBytes(chunk), raw.size());
  }
  // The expensive part runs outside the lock: many copy threads compress at once.
  std::vector<std::byte> compressed;
  ASSIGN_OR_RETURN(Codec codec,
                   detail::compress(options_.codec, options_.zstdLevel, raw, compressed));
  std::span<const std::byte> stored = codec == Codec::kNone ? raw : std::span(compressed);
  ChunkInfo record{0, static_cast<uint32_t>(stored.size()), codec, checksum(raw)};

  std::lock_guard lock(blob->mutex);
  if (blob->written[chunk]) {
    return makeError(Code::kAlreadyExists, "chunk {} of blob '{}' was already written", chunk,
                     info.name);
  }
  record.fileOffset = blob->end;
  RETURN_IF_ERROR(openBlobFile(*blob));
  RETURN_IF_ERROR(writeAll(blob->fd.get(), stored.data(), stored.size(), record.fileOffset,
                           staging_ / info.file));
  blob->end += stored.size();
  blob->info.chunks[chunk] = record;
  blob->written[chunk] = true;
  ++blob->writtenCount;
  return Status::ok();
}

Status ImageWriter::writeBlob(size_t blobIndex, std::span<const std::byte> raw) {
  uint64_t size = 0;
  uint32_t chunkBytes = 0;
  {
    std::lock_guard lock(mutex_);
    if (blobIndex >= blobs_.size()) {
      return makeError(Code::kOutOfRange, "no blob {} (the image has {})", blobIndex,
                       blobs_.size());
    }
    size = blobs_[blobIndex]->info.size;
    chunkBytes = blobs_[blobIndex]->info.chunkBytes;
  }
  if (raw.size() != size) {
    return makeError(Code::kInvalidArgument, "blob {} is {} bytes, not {}", blobIndex, size,
                     raw.size());
  }
  for (uint64_t offset = 0, chunk = 0; offset < size; offset += chunkBytes, ++chunk) {
    RETURN_IF_ERROR(writeChunk(blobIndex, chunk,
                               raw.subspan(offset, std::min<uint64_t>(chunkBytes, size - offset))));
  }
  return Status::ok();
}

void ImageWriter::setState(nlohmann::json state) {
  std::lock_guard lock(mutex_);
  state_ = std::move(state);
}

Status ImageWriter::commit() {
  std::lock_guard lock(mutex_);
  if (done_) return makeError(Code::kFailedPrecondition, "the image was already committed");
  Status status = [&]() -> Status {
    Manifest manifest;
    manifest.created = utcNow();
    manifest.state = state_;
    for (auto& blob : blobs_) {
      std::lock_guard blobLock(blob->mutex);
      if (blob->writtenCount != blob->info.chunkCount()) {
        return makeError(Code::kFailedPrecondition, "blob '{}': {} of {} chunks were written",
                         blob->info.name, blob->writtenCount, blob->info.chunkCount());
      }
      RETURN_IF_ERROR(openBlobFile(*blob));
      if (::fsync(blob->fd.get()) != 0) {
        return errnoError(errno, fmt::format("syncing {}", (staging_ / blob->info.file).string()));
      }
      manifest.blobs.push_back(blob->info);
    }
    // CRIU's images: recorded so that verify can check them, then synced.
    std::error_code ec;
    fs::path cpu = staging_ / kCpuDir;
    std::vector<fs::path> directories{staging_, staging_ / kBlobDir, cpu};
    for (auto it = fs::recursive_directory_iterator(cpu, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      if (it->is_directory()) {
        directories.push_back(it->path());
      } else if (it->is_regular_file()) {
        ASSIGN_OR_RETURN(CpuFile file,
                         describeFile(it->path(), fs::relative(it->path(), cpu).string()));
        RETURN_IF_ERROR(syncPath(it->path(), false));
        manifest.cpuFiles.push_back(std::move(file));
      }
    }
    if (ec) return makeError(Code::kIo, "listing {}: {}", cpu.string(), ec.message());
    std::sort(manifest.cpuFiles.begin(), manifest.cpuFiles.end(),
              [](const CpuFile& a, const CpuFile& b) { return a.path < b.path; });

    std::string text = toJson(manifest).dump(1);
    fs::path manifestPath = staging_ / kManifestFile;
    {
      UniqueFd fd(::open(manifestPath.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (!fd) return errnoError(errno, fmt::format("creating {}", manifestPath.string()));
      RETURN_IF_ERROR(writeAll(fd.get(), text.data(), text.size(), 0, manifestPath));
      if (::fsync(fd.get()) != 0) return errnoError(errno, fmt::format("syncing {}", manifestPath.string()));
    }
    for (const fs::path& dir : directories) RETURN_IF_ERROR(syncPath(dir, true));

    // Root's writer gives the whole tree to its owner, root by default: files
    // that CRIU wrote as the job's user become root's too.
    if (options_.owner || ::geteuid() == 0) {
      UniqueFd top(::open(staging_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!top) return errnoError(errno, fmt::format("opening {}", staging_.string()));
      RETURN_IF_ERROR(chownTree(top.get(), options_.owner.value_or(::geteuid()), staging_));
    }
    // RENAME_NOREPLACE: an image that appeared meanwhile is never replaced.
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, directory_.c_str(),
                    RENAME_NOREPLACE) != 0) {
      return errnoError(errno, fmt::format("renaming {} to {}", staging_.string(),
                                           directory_.string()));
    }
    return syncPath(directory_.parent_path(), true);
  }();
  if (!status.isOk()) {
    abandon();
    return status;
  }
  blobs_.clear();
  done_ = true;
  return Status::ok();
}

}  // namespace phos::image
