// SPDX-License-Identifier: Apache-2.0
// Live migration: the source's Outgoing and the target's listener (migration.h).
#include "migration/migration.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <deque>
#include <atomic>
#include <fstream>
#include <set>
#include <thread>
#include <optional>

#include <fmt/format.h>

#include "phos/common/log.h"
#include "phos/common/subprocess.h"
#include "phos/criu/criu.h"
#include "phos/criu/restore_job.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"

namespace phos::daemon::migration {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// How long either side waits for the other's next frame: the source is quiet
// while CRIU dumps, the target while it checks, writes and restores.
constexpr auto kFrameTimeout = std::chrono::seconds(300);
constexpr size_t kFilePiece = 4u << 20;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// zstd level 1 when it shrinks the bytes (the link is the bottleneck), else
// the bytes as they are.
struct Packed {
  std::vector<std::byte> compressed;
  bool zstd = false;
};
Packed pack(std::span<const std::byte> raw) {
  Packed p;
  p.compressed.resize(ZSTD_compressBound(raw.size()));
  size_t n = ZSTD_compress(p.compressed.data(), p.compressed.size(), raw.data(), raw.size(), 1);
  if (ZSTD_isError(n) || n >= raw.size()) return p;
  p.compressed.resize(n);
  p.zstd = true;
  return p;
}

// The frame's bytes as sent: decompressed when "zstd", exactly `expected` of them.
Result<std::vector<std::byte>> unpack(net::Frame& frame, uint64_t expected) {
  if (!frame.header.value("zstd", false)) {
    if (frame.body.size() != expected) {
      return makeError(Code::kDataLoss, "a frame holds {} bytes where {} were announced", frame.body.size(), expected);
    }
    return std::move(frame.body);
  }
  std::vector<std::byte> raw(expected);
  size_t n = ZSTD_decompress(raw.data(), raw.size(), frame.body.data(), frame.body.size());
  if (ZSTD_isError(n) || n != expected) {
    return makeError(Code::kDataLoss, "a compressed frame does not decompress to its {} bytes", expected);
  }
  return raw;
}

// A relative path inside cpu/ (no "..", not absolute).
bool insideCpuDirectory(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  return !path.empty() && p.is_relative() && !p.empty() && *p.begin() != "..";
}

}  // namespace

// ---------------------------------------------------------------- source ---

Result<std::unique_ptr<Outgoing>> Outgoing::connect(const std::string& target, const net::Key& key) {
  ASSIGN_OR_RETURN(net::Channel channel, net::Channel::connect(target, key, std::chrono::seconds(10)));
  return std::unique_ptr<Outgoing>(new Outgoing(std::move(channel)));
}

Status Outgoing::sendBytes(json header, std::span<const std::byte> raw) {
  if (!compress_) {
    header["zstd"] = false;
    return channel_.send(header, raw);
  }
  Packed p = pack(raw);
  header["zstd"] = p.zstd;
  return channel_.send(header, p.zstd ? std::span<const std::byte>(p.compressed) : raw);
}

Status Outgoing::precopyChunk(uint64_t address, std::span<const std::byte> raw) {
  const uint64_t hash = image::checksum(raw);
  const uint64_t before = channel_.bytesSent();
  RETURN_IF_ERROR(sendBytes({{"kind", "precopy"}, {"address", address}, {"bytes", raw.size()}, {"hash", hash}}, raw)
                      .withContext("sending device memory to the target"));
  precopied_[address] = hash;
  ++precopyChunks_;
  precopyBytes_ += raw.size();
  precopyWireBytes_ += channel_.bytesSent() - before;
  return Status::ok();
}

Result<json> Outgoing::await(const char* what, std::chrono::seconds timeout) {
  auto frame = channel_.receive(timeout);
  if (!frame) return std::move(frame).status().withContext(what);
  const std::string kind = frame->header.value("kind", "");
  if (kind == "failed") {
    return makeError(Code::kFailedPrecondition, "the target failed {}: {}", what,
                     frame->header.value("error", std::string("no reason given")));
  }
  return frame->header;
}

Status Outgoing::handOver(const fs::path& imagePath, bool eager, bool& leaveStopped) {
  leaveStopped = false;
  const auto start = handOverAt_ = Clock::now();
  const uint64_t before = channel_.bytesSent();
  ASSIGN_OR_RETURN(auto reader, image::ImageReader::open(imagePath));
  const image::Manifest& manifest = reader->manifest();
  RETURN_IF_ERROR(channel_.send({{"kind", "manifest"}, {"manifest", image::toJson(manifest)}}));
  std::vector<std::byte> raw;
  // Post-copy: device memory the target does not hold yet goes after "go",
  // while the job runs there (a stop-the-world hand-over sends it all before).
  std::vector<std::pair<size_t, uint64_t>> late;
  for (size_t b = 0; b < manifest.blobs.size(); ++b) {
    const image::BlobInfo& blob = manifest.blobs[b];
    // Device memory the precopy sent: its chunks are named by their address.
    std::optional<uint64_t> address;
    if (blob.kind == "gpu-memory" && blob.attributes.contains("address") &&
        blob.attributes["address"].is_number_unsigned()) {
      address = blob.attributes["address"].get<uint64_t>();
    }
    for (uint64_t c = 0; c < blob.chunkCount(); ++c) {
      ++imageChunks_;
      json header = {{"kind", "chunk"}, {"blob", b}, {"chunk", c}};
      if (address) {
        const uint64_t at = *address + c * blob.chunkBytes;
        if (auto held = precopied_.find(at); held != precopied_.end() && held->second == blob.chunks[c].checksum) {
          header["cached"] = at;
          ++cachedChunks_;
          cachedBytes_ += blob.chunkRawBytes(c);
          RETURN_IF_ERROR(channel_.send(header).withContext("sending the image"));
          continue;
        }
        if (!eager) {
          late.emplace_back(b, c);
          continue;
        }
      }
      raw.resize(blob.chunkRawBytes(c));
      RETURN_IF_ERROR(reader->readChunk(b, c, raw));
      header["bytes"] = raw.size();
      RETURN_IF_ERROR(sendBytes(header, raw).withContext("sending the image"));
    }
  }
  for (const image::CpuFile& file : manifest.cpuFiles) {
    // As every file of an image: beneath it, no links (image/safe_open.h).
    ASSIGN_OR_RETURN(image::Fd in, reader->openFile(fmt::format("{}/{}", image::kCpuDir, file.path)));
    uint64_t offset = 0;
    do {
      raw.resize(std::min<uint64_t>(kFilePiece, file.size - offset));
      size_t got = 0;
      while (got < raw.size()) {
        ssize_t n = ::pread(in.get(), raw.data() + got, raw.size() - got, static_cast<off_t>(offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return makeError(Code::kIo, "cannot read {} of the image", file.path);
        got += static_cast<size_t>(n);
      }
      RETURN_IF_ERROR(sendBytes({{"kind", "file"}, {"path", file.path}, {"offset", offset}, {"bytes", raw.size()}}, raw)
                          .withContext("sending the image"));
      offset += raw.size();
    } while (offset < file.size);
  }
  json lateList = json::array();
  for (const auto& [b, c] : late) lateList.push_back({b, c, manifest.blobs[b].chunks[c].checksum});
  RETURN_IF_ERROR(channel_.send({{"kind", "end"}, {"late", lateList}}));
  ASSIGN_OR_RETURN(json ready, await("to take the image", kFrameTimeout));
  if (ready.value("kind", "") != "ready") {
    return makeError(Code::kInternal, "the target answered \"{}\" instead of ready", ready.value("kind", ""));
  }
  imageWireBytes_ = channel_.bytesSent() - before;
  transferSeconds_ = secondsSince(start);
  // From here the target may run the job: never resume it here unless the
  // target says its restore failed.
  goAt_ = Clock::now();
  RETURN_IF_ERROR(channel_.send({{"kind", "go"}, {"eager", eager}}));
  std::optional<json> early;  // the target's outcome, should it come before every late chunk was sent
  Status streamed = sendLate(*reader, late, early);
  if (!streamed.isOk()) {
    // A "failed" answer: the target runs nothing, the job resumes here.
    if (streamed.code() == Code::kFailedPrecondition) return streamed;
    leaveStopped = true;
    return streamed.withContext("lost the target after telling it to take over");
  }
  auto outcome = early ? Result<json>(*early) : await("to restore the job", kFrameTimeout);
  while (outcome.isOk() && outcome->value("kind", "") == "want") {
    outcome = await("to restore the job", kFrameTimeout);  // a chunk sent already
  }
  if (!outcome.isOk() && outcome.status().code() != Code::kFailedPrecondition) {
    leaveStopped = true;
    return std::move(outcome).status().withContext("lost the target after telling it to take over");
  }
  RETURN_IF_ERROR(outcome.status());
  if (outcome->value("kind", "") != "restored") {
    leaveStopped = true;
    return makeError(Code::kInternal, "the target answered \"{}\" instead of restored", outcome->value("kind", ""));
  }
  targetReport_ = outcome->value("report", json::object());
  return Status::ok();
}

// After "go": the late chunks in image order, each one the target asks for
// (a call of the job waits for it) first.
Status Outgoing::sendLate(const image::ImageReader& reader, std::vector<std::pair<size_t, uint64_t>> late,
                          std::optional<json>& outcome) {
  std::vector<std::byte> raw;
  std::set<std::pair<size_t, uint64_t>> sent;
  std::deque<std::pair<size_t, uint64_t>> queue(late.begin(), late.end());
  while (!queue.empty()) {
    while (channel_.readable(std::chrono::milliseconds(0))) {
      ASSIGN_OR_RETURN(json frame, await("to restore the job", kFrameTimeout));
      const std::string kind = frame.value("kind", "");
      if (kind == "want") {
        const std::pair<size_t, uint64_t> wanted{frame.value("blob", size_t{0}), frame.value("chunk", uint64_t{0})};
        if (!sent.count(wanted)) queue.push_front(wanted);
        ++wantedChunks_;
      } else {
        outcome = frame;  // restored (or something unexpected): nothing more is needed
        return Status::ok();
      }
    }
    const auto [b, c] = queue.front();
    queue.pop_front();
    if (!sent.insert({b, c}).second) continue;
    const image::BlobInfo& blob = reader.manifest().blobs[b];
    raw.resize(blob.chunkRawBytes(c));
    RETURN_IF_ERROR(reader.readChunk(b, c, raw));
    RETURN_IF_ERROR(sendBytes({{"kind", "late"}, {"blob", b}, {"chunk", c}, {"bytes", raw.size()}}, raw));
    ++lateChunks_;
    lateBytes_ += raw.size();
  }
  return Status::ok();
}

void Outgoing::relayFailed(Status status) {
  std::lock_guard lock(relayMutex_);
  if (relayStatus_.isOk()) relayStatus_ = std::move(status);
  ::shutdown(relayFd_.get(), SHUT_RDWR);  // CRIU sees the page server gone: its dump fails, the job resumes
}

Result<UniqueFd> Outgoing::openPageRelay() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return makeError(Code::kIo, "socketpair: {}", std::strerror(errno));
  }
  UniqueFd ours(pair[0]), criusEnd(pair[1]);
  RETURN_IF_ERROR(channel_.send({{"kind", "pages-open"}}));
  relayFd_ = std::move(ours);
  const auto start = Clock::now();
  relayUp_ = std::thread([this] {
    std::vector<std::byte> buf(1u << 20);
    for (;;) {
      ssize_t n = ::read(relayFd_.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (Status s = channel_.send({{"kind", "pages-end"}}); !s.isOk()) relayFailed(s);
        return;
      }
      pageBytes_ += static_cast<uint64_t>(n);
      Status s = sendBytes({{"kind", "pages"}, {"bytes", n}}, std::span(buf).first(static_cast<size_t>(n)));
      if (!s.isOk()) return relayFailed(s.withContext("sending CRIU's pages"));
    }
  });
  relayDown_ = std::thread([this, start] {
    for (;;) {
      auto frame = channel_.receive(kFrameTimeout);
      if (!frame) return relayFailed(frame.status().withContext("CRIU's page server on the target"));
      const std::string kind = frame->header.value("kind", "");
      if (kind == "pages-ack") {
        std::span<const std::byte> bytes = frame->body;
        while (!bytes.empty()) {
          ssize_t n = ::write(relayFd_.get(), bytes.data(), bytes.size());
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) return;  // CRIU is gone; its exit status tells
          bytes = bytes.subspan(static_cast<size_t>(n));
        }
      } else if (kind == "pages-done") {
        pageServerSeconds_ = secondsSince(start);
        if (!frame->header.value("ok", false)) {
          relayFailed(makeError(Code::kFailedPrecondition, "CRIU's page server on the target failed: {}",
                                frame->header.value("error", std::string("no reason given"))));
        }
        return;
      } else {
        return relayFailed(makeError(Code::kFailedPrecondition, "the target failed while CRIU dumped: {}",
                                     frame->header.value("error", std::string("no reason given"))));
      }
    }
  });
  return criusEnd;
}

Status Outgoing::closePageRelay() {
  if (relayUp_.joinable()) relayUp_.join();
  if (relayDown_.joinable()) relayDown_.join();
  relayFd_.reset();
  std::lock_guard lock(relayMutex_);
  return relayStatus_;
}

void Outgoing::abort(const std::string& why) { (void)channel_.send({{"kind", "abort"}, {"why", why}}); }

json Outgoing::stats() const {
  return {{"target", channel_.peer()},
          {"precopy_chunks", precopyChunks_},
          {"precopy_bytes", precopyBytes_},
          {"precopy_wire_bytes", precopyWireBytes_},
          {"image_chunks", imageChunks_},
          {"cached_chunks", cachedChunks_},
          {"cached_bytes", cachedBytes_},
          {"page_server_bytes", pageBytes_},
          {"page_server_seconds", pageServerSeconds_},
          {"late_chunks", lateChunks_},
          {"late_bytes", lateBytes_},
          {"wanted_chunks", wantedChunks_},
          {"image_wire_bytes", imageWireBytes_},
          {"transfer_seconds", transferSeconds_}};
}

// ---------------------------------------------------------------- target ---

namespace {

// One incoming migration, in a process of its own.
class Incoming {
 public:
  Incoming(net::Channel channel, const ListenerOptions& options) : channel_(std::move(channel)), options_(options) {}
  ~Incoming() { stopPageServer(); }

  void serve() {
    auto log = log::get("daemon");
    Status s = receive();
    if (!s.isOk()) {
      log->warn("migration from {}: {}", channel_.peer(), s.message());
      (void)channel_.send({{"kind", "failed"}, {"error", s.message()}});
      discard();
      // The source may still be sending (the image's chunks): hanging up
      // with its bytes unread would reset the connection, and it would learn
      // only that, not why. Its frames are read and dropped until it hangs
      // up, having read "failed", or goes quiet.
      while (channel_.receive(std::chrono::seconds(30)).isOk()) {
      }
    }
  }

 private:
  Status receive() {
    for (;;) {
      ASSIGN_OR_RETURN(net::Frame frame, channel_.receive(kFrameTimeout));
      const std::string kind = frame.header.value("kind", "");
      if (kind == "precopy") {
        RETURN_IF_ERROR(onPrecopy(frame));
      } else if (kind == "pages-open") {
        RETURN_IF_ERROR(onPagesOpen());
      } else if (kind == "pages") {
        RETURN_IF_ERROR(onPages(frame));
      } else if (kind == "pages-end") {
        RETURN_IF_ERROR(onPagesEnd());
      } else if (kind == "manifest") {
        RETURN_IF_ERROR(onManifest(frame));
      } else if (kind == "chunk") {
        RETURN_IF_ERROR(onChunk(frame));
      } else if (kind == "file") {
        RETURN_IF_ERROR(onFile(frame));
      } else if (kind == "end") {
        RETURN_IF_ERROR(onEnd(frame.header.value("late", json::array())));
      } else if (kind == "go") {
        return onGo(frame.header.value("eager", false));
      } else if (kind == "abort") {
        log::get("daemon")->info("migration from {} aborted by the source: {}", channel_.peer(),
                                 frame.header.value("why", std::string()));
        discard();
        return Status::ok();
      } else {
        return makeError(Code::kInvalidArgument, "unknown frame \"{}\"", kind);
      }
    }
  }

  Status onPrecopy(net::Frame& frame) {
    const uint64_t address = frame.header.value("address", uint64_t{0});
    const uint64_t bytes = frame.header.value("bytes", uint64_t{0});
    if (bytes == 0 || bytes > image::kDefaultChunkBytes) {
      return makeError(Code::kInvalidArgument, "a precopied chunk of {} bytes", bytes);
    }
    ASSIGN_OR_RETURN(auto raw, unpack(frame, bytes));
    if (image::checksum(raw) != frame.header.value("hash", uint64_t{0})) {
      return makeError(Code::kDataLoss, "the precopied chunk at {:#x} does not match its checksum", address);
    }
    cache_[address] = std::move(raw);
    return Status::ok();
  }

  // CRIU's page server, fed by the source's dump through the channel; what
  // it answers goes back the same way. Its images join cpu/ at "end".
  Status onPagesOpen() {
    if (pageServer_.joinable()) return makeError(Code::kInvalidArgument, "a second page server");
    ASSIGN_OR_RETURN(auto criuBinary, criu::locate());
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    pagesDir_ = fs::path(options_.runtimeDir) / "migrations" /
                fmt::format("pages-{}", std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
    std::error_code ec;
    fs::create_directories(pagesDir_, ec);
    if (ec) return makeError(Code::kIo, "cannot create {}: {}", pagesDir_.string(), ec.message());
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
      return makeError(Code::kIo, "socketpair: {}", std::strerror(errno));
    }
    pagesFd_.reset(pair[0]);
    pageServer_ = std::thread([this, path = criuBinary.path, theirs = UniqueFd(pair[1])]() mutable {
      pageServerResult_.emplace(runCapture({path, "page-server", "-D", pagesDir_.string(), "--ps-socket", "20", "-o",
                                            "page-server.log"},
                                           CaptureOptions{.passFds = {{theirs.get(), 20}}}));
      theirs.reset();  // the replies' reader sees the end
    });
    pageReplies_ = std::thread([this] {
      std::vector<std::byte> buf(64u << 10);
      for (;;) {
        ssize_t n = ::read(pagesFd_.get(), buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        if (!channel_.send({{"kind", "pages-ack"}}, std::span(buf).first(static_cast<size_t>(n))).isOk()) return;
      }
    });
    return Status::ok();
  }

  Status onPages(net::Frame& frame) {
    if (!pagesFd_) return makeError(Code::kInvalidArgument, "pages without a page server");
    ASSIGN_OR_RETURN(auto raw, unpack(frame, frame.header.value("bytes", uint64_t{0})));
    std::span<const std::byte> bytes = raw;
    while (!bytes.empty()) {
      ssize_t n = ::write(pagesFd_.get(), bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the page server is gone: its exit status says why
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
    return Status::ok();
  }

  Status onPagesEnd() {
    if (!pagesFd_) return makeError(Code::kInvalidArgument, "pages-end without a page server");
    ::shutdown(pagesFd_.get(), SHUT_WR);
    pageServer_.join();
    pageReplies_.join();
    pagesFd_.reset();
    std::string error;
    if (!pageServerResult_->isOk()) {
      error = pageServerResult_->status().message();
    } else if ((*pageServerResult_)->exitCode != 0) {
      std::ifstream log(pagesDir_ / "page-server.log");
      std::string line, errors;
      while (std::getline(log, line)) {
        if (line.find("Error") != std::string::npos) errors += "\n  " + line;
      }
      error = fmt::format("criu page-server exited {}{}", (*pageServerResult_)->exitCode, errors);
    }
    return channel_.send({{"kind", "pages-done"}, {"ok", error.empty()}, {"error", error}});
  }

  Status onManifest(const net::Frame& frame) {
    if (writer_) return makeError(Code::kInvalidArgument, "a second manifest");
    ASSIGN_OR_RETURN(manifest_, image::manifestFromJson(frame.header.value("manifest", json())));
    const json& state = manifest_.state;
    const pid_t pid = state.contains("process") ? state["process"].value("pid", 0) : 0;
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    directory_ = fs::path(options_.runtimeDir) / "migrations" /
                 fmt::format("in-{}-{}", pid, std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
    ASSIGN_OR_RETURN(writer_, image::ImageWriter::create(directory_));
    for (const image::BlobInfo& blob : manifest_.blobs) {
      if (blob.chunkBytes != image::kDefaultChunkBytes) {
        return makeError(Code::kNotSupported, "blob {} has chunks of {} bytes", blob.name, blob.chunkBytes);
      }
      RETURN_IF_ERROR(writer_->addBlob(blob.name, blob.kind, blob.size, blob.attributes).status());
    }
    log::get("daemon")->info("migration from {}: pid {}, {} blob(s), {} precopied chunk(s) held", channel_.peer(), pid,
                             manifest_.blobs.size(), cache_.size());
    return Status::ok();
  }

  Status onChunk(net::Frame& frame) {
    if (!writer_) return makeError(Code::kInvalidArgument, "a chunk before the manifest");
    const size_t b = frame.header.value("blob", size_t{0});
    const uint64_t c = frame.header.value("chunk", uint64_t{0});
    if (b >= manifest_.blobs.size() || c >= manifest_.blobs[b].chunkCount()) {
      return makeError(Code::kInvalidArgument, "chunk {} of blob {} is not in the manifest", c, b);
    }
    const image::BlobInfo& blob = manifest_.blobs[b];
    const uint64_t bytes = blob.chunkRawBytes(c);
    std::vector<std::byte> raw;
    if (frame.header.contains("cached")) {
      auto held = cache_.find(frame.header.value("cached", uint64_t{0}));
      if (held == cache_.end() || held->second.size() != bytes) {
        return makeError(Code::kDataLoss, "blob {} chunk {}: the precopied chunk it names is not here", blob.name, c);
      }
      raw = std::move(held->second);
      cache_.erase(held);
    } else {
      ASSIGN_OR_RETURN(raw, unpack(frame, bytes));
    }
    if (image::checksum(raw) != blob.chunks[c].checksum) {
      return makeError(Code::kDataLoss, "blob {} chunk {} arrived damaged (checksum)", blob.name, c);
    }
    return writer_->writeChunk(b, c, raw);
  }

  Status onFile(net::Frame& frame) {
    if (!writer_) return makeError(Code::kInvalidArgument, "a file before the manifest");
    const std::string path = frame.header.value("path", "");
    if (!insideCpuDirectory(path)) return makeError(Code::kInvalidArgument, "file path \"{}\" leaves cpu/", path);
    ASSIGN_OR_RETURN(auto raw, unpack(frame, frame.header.value("bytes", uint64_t{0})));
    const fs::path target = writer_->cpuDirectory() / path;
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    std::fstream out(target, std::ios::binary | std::ios::in | std::ios::out);
    if (!out) out.open(target, std::ios::binary | std::ios::out | std::ios::trunc);
    out.seekp(static_cast<std::streamoff>(frame.header.value("offset", uint64_t{0})));
    out.write(reinterpret_cast<const char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
    if (!out.flush()) return makeError(Code::kIo, "cannot write {} (disk full?)", target.string());
    return Status::ok();
  }

  // Every cpu/ file as the source recorded it, then the image is published.
  // Late chunks (post-copy) get a placeholder in their blob and are listed in
  // late.json: the image's readers wait for them (phos/image/format.h).
  Status onEnd(const json& late) {
    if (!writer_) return makeError(Code::kInvalidArgument, "end before the manifest");
    if (!late.is_array()) return makeError(Code::kInvalidArgument, "\"late\" is not a list");
    std::vector<std::byte> placeholder;
    for (const json& entry : late) {
      if (!entry.is_array() || entry.size() != 3) return makeError(Code::kInvalidArgument, "a late entry {}", entry.dump());
      const size_t b = entry[0].get<size_t>();
      const uint64_t c = entry[1].get<uint64_t>();
      if (b >= manifest_.blobs.size() || c >= manifest_.blobs[b].chunkCount() ||
          entry[2].get<uint64_t>() != manifest_.blobs[b].chunks[c].checksum) {
        return makeError(Code::kInvalidArgument, "late chunk {} is not the manifest's", entry.dump());
      }
      placeholder.assign(manifest_.blobs[b].chunkRawBytes(c), std::byte{0});
      RETURN_IF_ERROR(writer_->writeChunk(b, c, placeholder));
      late_.insert({b, c});
    }
    if (!late.empty()) {
      std::error_code ec;
      fs::create_directories(writer_->stagingDirectory() / image::kLateDir, ec);
      std::ofstream list(writer_->stagingDirectory() / image::kLateFile);
      list << json{{"chunks", late}}.dump();
      if (!list.flush()) return makeError(Code::kIo, "cannot write {}", image::kLateFile);
    }
    for (const image::CpuFile& file : manifest_.cpuFiles) {
      std::ifstream in(writer_->cpuDirectory() / file.path, std::ios::binary);
      std::vector<std::byte> bytes(file.size);
      if (!in || !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())) ||
          image::checksum(bytes) != file.checksum) {
        return makeError(Code::kDataLoss, "cpu/{} did not arrive intact", file.path);
      }
    }
    if (!pagesDir_.empty()) {
      // The page server's images (pagemap, pages, its log) complete cpu/.
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(pagesDir_, ec)) {
        fs::rename(entry.path(), writer_->cpuDirectory() / entry.path().filename(), ec);
        if (ec) return makeError(Code::kIo, "cannot move {} into the image: {}", entry.path().string(), ec.message());
      }
      fs::remove(pagesDir_, ec);
      pagesDir_.clear();
    }
    writer_->setState(manifest_.state);
    RETURN_IF_ERROR(writer_->commit().withContext("publishing the migrated image"));
    cache_.clear();
    return channel_.send({{"kind", "ready"}});
  }

  // The job's standard descriptors: the files they were, when this host has
  // them (a shared file system), else a log in the runtime directory.
  std::string stdioPath(int fd) const {
    const json& cpu = manifest_.state.value("cpu", json::object());
    for (const json& entry : cpu.value("stdio", json::array())) {
      if (!entry.is_object() || entry.value("fd", -1) != fd || entry.value("kind", "") != "file") continue;
      const std::string path = entry.value("target", "");
      struct stat st {};
      if (!path.empty() && path[0] == '/' && ::stat(path.c_str(), &st) == 0 &&
          (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode))) {
        return path;
      }
    }
    if (fd == 0) return "/dev/null";
    return (directory_.parent_path() / (directory_.filename().string() + ".out")).string();
  }

  Status onGo(bool eager) {
    if (!published()) return makeError(Code::kInvalidArgument, "go before the image was complete");
    checkpoint::JobRestoreOptions restore;
    restore.image = directory_;
    restore.runtimeDir = options_.runtimeDir;
    restore.detach = true;
    restore.eager = eager;
    for (int fd = 0; fd < 3; ++fd) restore.stdio[fd] = stdioPath(fd);
    // The restore runs while the late chunks arrive; a chunk the job waits
    // for is asked of the source first.
    std::optional<Result<checkpoint::JobRestoreReport>> result;
    std::atomic<bool> done{false};
    std::thread restoring([&] {
      result.emplace(checkpoint::restoreJob(restore));
      done = true;
    });
    Status streaming = receiveLate(done);
    restoring.join();
    std::error_code ec;
    if (!result->isOk() || !(*result)->clean()) {
      fs::remove_all(directory_, ec);
      if (!result->isOk()) return result->status();
      const checkpoint::JobRestoreReport& failed = **result;
      return makeError(Code::kFailedPrecondition, "pid {}: {}", failed.process.pid, failed.problem());
    }
    if (!streaming.isOk()) {
      log::get("daemon")->warn("migration from {}: {} (the job has every chunk it needs)", channel_.peer(),
                               streaming.message());
    }
    json report = (*result)->toJson(directory_, /*detached=*/true);
    log::get("daemon")->info("migration from {}: pid {} runs here", channel_.peer(), report.value("pid", 0));
    fs::remove_all(directory_, ec);  // everything is loaded: the job no longer reads it
    return channel_.send({{"kind", "restored"}, {"report", report}});
  }

  // Late chunks into late/ until the restore is done; what the job's calls
  // wait for (late/wanted) is asked for. If the source goes away, late/failed
  // tells the readers: the job's loads fail and the restore ends it.
  Status receiveLate(const std::atomic<bool>& done) {
    const fs::path dir = directory_ / image::kLateDir;
    size_t wantedRead = 0;
    Status status = Status::ok();
    while (!done) {
      if (status.isOk() && !late_.empty()) {
        if (std::ifstream wanted(dir / "wanted"); wanted) {
          wanted.seekg(static_cast<std::streamoff>(wantedRead));
          size_t b = 0;
          uint64_t c = 0;
          std::string line;
          while (std::getline(wanted, line)) {
            if (wanted.eof()) break;  // a line still being written
            wantedRead += line.size() + 1;
            if (std::sscanf(line.c_str(), "%zu %lu", &b, &c) == 2 && late_.count({b, c})) {
              status = channel_.send({{"kind", "want"}, {"blob", b}, {"chunk", c}});
            }
          }
        }
      }
      if (!status.isOk() || !channel_.readable(std::chrono::milliseconds(2))) {
        if (!status.isOk()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      auto frame = channel_.receive(kFrameTimeout);
      if (frame.isOk() && frame->header.value("kind", "") == "late") frame = storeLate(std::move(*frame), dir);
      if (!frame.isOk()) {
        status = frame.status();
        std::ofstream(dir / "failed") << status.message();
      }
    }
    return status;
  }

  Result<net::Frame> storeLate(net::Frame frame, const fs::path& dir) {
    const size_t b = frame.header.value("blob", size_t{0});
    const uint64_t c = frame.header.value("chunk", uint64_t{0});
    if (!late_.count({b, c})) return makeError(Code::kInvalidArgument, "chunk {} of blob {} is not late", c, b);
    ASSIGN_OR_RETURN(auto raw, unpack(frame, manifest_.blobs[b].chunkRawBytes(c)));
    if (image::checksum(raw) != manifest_.blobs[b].chunks[c].checksum) {
      return makeError(Code::kDataLoss, "late chunk {} of blob {} arrived damaged (checksum)", c, b);
    }
    const fs::path file = dir / fmt::format("{}.{}", b, c);
    {
      std::ofstream out(file.string() + ".part", std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
      if (!out.flush()) return makeError(Code::kIo, "cannot write {} (disk full?)", file.string());
    }
    std::error_code ec;
    fs::rename(file.string() + ".part", file, ec);
    if (ec) return makeError(Code::kIo, "cannot publish {}: {}", file.string(), ec.message());
    return frame;
  }

  bool published() const {
    std::error_code ec;
    return writer_ && fs::exists(directory_ / image::kManifestFile, ec);
  }

  void stopPageServer() {
    if (pagesFd_) ::shutdown(pagesFd_.get(), SHUT_RDWR);
    if (pageServer_.joinable()) pageServer_.join();
    if (pageReplies_.joinable()) pageReplies_.join();
    pagesFd_.reset();
  }

  void discard() {
    std::error_code ec;
    stopPageServer();
    if (!pagesDir_.empty()) fs::remove_all(pagesDir_, ec);
    const bool wasPublished = published();
    writer_.reset();  // an unpublished image's staging directory goes with it
    if (wasPublished) fs::remove_all(directory_, ec);
  }

  net::Channel channel_;
  const ListenerOptions& options_;
  std::map<uint64_t, std::vector<std::byte>> cache_;  // precopied chunks by device address
  std::set<std::pair<size_t, uint64_t>> late_;          // (blob, chunk) that come after "go"
  // CRIU's page server: where it writes, its socket, its process and our reader of its replies.
  fs::path pagesDir_;
  UniqueFd pagesFd_;
  std::thread pageServer_, pageReplies_;
  std::optional<Result<ProcessOutput>> pageServerResult_;
  image::Manifest manifest_;
  fs::path directory_;
  std::unique_ptr<image::ImageWriter> writer_;
};

[[noreturn]] void listen(UniqueFd listening, const ListenerOptions& options, pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);
  ::signal(SIGCHLD, SIG_IGN);  // connections' processes are reaped by the kernel
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  auto log = log::get("daemon");
  for (;;) {
    UniqueFd client(::accept4(listening.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!client) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      log->error("migration listener: accept: {}", std::strerror(errno));
      ::_exit(1);
    }
    pid_t child = ::fork();
    if (child == 0) {
      listening.reset();
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::signal(SIGCHLD, SIG_DFL);  // runCapture waits for CRIU
      auto channel = net::Channel::accept(client.release(), options.key, std::chrono::seconds(10));
      if (!channel) {
        log->warn("refused a migration: {}", channel.status().message());
        ::_exit(1);
      }
      log->info("migration from {}: connected (it holds the key)", channel->peer());
      Incoming(std::move(*channel), options).serve();
      ::_exit(0);
    }
  }
}

}  // namespace

Result<pid_t> startListener(const ListenerOptions& options) {
  ASSIGN_OR_RETURN(UniqueFd fd, net::listenOn(options.address));
  // What incoming migrations of an earlier daemon left (one killed midway):
  // no migration runs yet. Outgoing images (out-*) stay: a job may be stopped
  // waiting on one.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(options.runtimeDir) / "migrations", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("in-") || name.starts_with(".in-") || name.starts_with("pages-")) {
      fs::remove_all(entry.path(), ec);
    }
  }
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return makeError(Code::kIo, "fork: {}", std::strerror(errno));
  if (pid == 0) listen(std::move(fd), options, parent);
  fd.reset();
  log::get("daemon")->info("accepting migrations on {} (listener pid {})", options.address, pid);
  return pid;
}

}  // namespace phos::daemon::migration
