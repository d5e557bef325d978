// SPDX-License-Identifier: Apache-2.0
// Live migration between hosts (docs/migration.md): the source side, which
// streams a session's GPU state to another phosd while the job runs and then
// hands the published image over, and the target side, which rebuilds the
// image and restores the job with concurrent restore.
//
// Over one authenticated channel (phos/net/channel.h), source -> target:
//   {"kind": "precopy", "address", "bytes", "hash", "zstd"} + bytes
//       a 4 MiB chunk of device memory copied during a soft recopy round; the
//       target keeps the newest version of each chunk in memory
//   {"kind": "pages-open"}, {"kind": "pages"} + bytes ..., {"kind": "pages-end"}
//       CRIU's final dump talking to CRIU's page server on the target (its
//       memory pages); the target answers with "pages-ack" + bytes (the page
//       server's replies) and, once it has written them, {"kind": "pages-done", "ok", "error"}
//   {"kind": "manifest", "manifest"}     the published image's manifest
//   {"kind": "chunk", "blob", "chunk", "cached": ADDRESS} or
//   {"kind": "chunk", "blob", "chunk", "zstd"} + bytes
//       each chunk of each blob: "cached" when the target holds the chunk at
//       that device address from the precopy with the image's checksum
//   {"kind": "file", "path", "offset", "zstd"} + bytes   a piece of a cpu/ file
//   {"kind": "end", "late": [[blob, chunk, xxh3], ...]}
//       the target checks every checksum and publishes the image; the late
//       chunks (device memory it does not hold; none for --mode stop) come
//       after "go", and the image's readers wait for them (phos/image/format.h)
//   {"kind": "go", "eager"}   only after "ready": the target restores
//   {"kind": "late", "blob", "chunk", "zstd"} + bytes   after "go", while the job runs there
//   {"kind": "abort", "why"}
// target -> source:
//   {"kind": "ready"} | {"kind": "restored", "report"} | {"kind": "failed", "error"}
//   {"kind": "want", "blob", "chunk"}   a late chunk a call of the job waits for: sent next
// "go" is the point of no return: before it the source resumes its stopped job
// on any failure; after it, a lost connection leaves the job stopped on the
// source (the target may have taken over).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <utility>
#include <vector>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "phos/common/unique_fd.h"
#include "phos/image/reader.h"
#include "phos/net/channel.h"

namespace phos::daemon::migration {

// The source's end, in the worker that serves the session.
class Outgoing {
 public:
  // kUnavailable: the target does not answer; kPermissionDenied: keys differ.
  static Result<std::unique_ptr<Outgoing>> connect(const std::string& target, const net::Key& key);
  ~Outgoing() { (void)closePageRelay(); }

  // zstd on the wire (default), or the bytes as they are (a fast link, or
  // data that does not compress).
  void setCompression(bool zstd) { compress_ = zstd; }
  // A chunk of device memory at `address` copied while the job runs.
  Status precopyChunk(uint64_t address, std::span<const std::byte> raw);

  // CRIU's final dump streams its memory pages to a page server on the target
  // through this channel: the returned socket is CRIU's end
  // (CheckpointOptions::pageServerSocket; the caller closes it once CRIU has
  // exited). closePageRelay() waits until the target's page server has
  // written them all.
  Result<UniqueFd> openPageRelay();
  Status closePageRelay();

  // After the image is published (the job stopped): sends it, and once the
  // target holds it, tells it to restore. On failure `leaveStopped` says
  // whether the target may have taken over (never resume the job then).
  // `eager`: the target loads all device memory before the job runs.
  Status handOver(const std::filesystem::path& image, bool eager, bool& leaveStopped);
  // Tells the target to drop what it received (best effort).
  void abort(const std::string& why);

  // When the hand-over began, when "go" was sent, and the target's restore report.
  std::chrono::steady_clock::time_point handOverAt() const { return handOverAt_; }
  std::chrono::steady_clock::time_point goAt() const { return goAt_; }
  const nlohmann::json& targetReport() const { return targetReport_; }
  // precopy_chunks, precopy_bytes, image_chunks, cached_chunks, wire_bytes...
  nlohmann::json stats() const;

 private:
  explicit Outgoing(net::Channel channel) : channel_(std::move(channel)) {}
  void relayFailed(Status status);
  Status sendBytes(nlohmann::json header, std::span<const std::byte> raw);
  Result<nlohmann::json> await(const char* what, std::chrono::seconds timeout);
  Status sendLate(const image::ImageReader& reader, std::vector<std::pair<size_t, uint64_t>> late,
                  std::optional<nlohmann::json>& outcome);

  net::Channel channel_;
  bool compress_ = true;
  // The page relay: CRIU <-> relayFd_ <-> channel (two threads while CRIU dumps).
  UniqueFd relayFd_;
  std::thread relayUp_, relayDown_;
  Status relayStatus_ = Status::ok();
  std::mutex relayMutex_;
  uint64_t pageBytes_ = 0;
  double pageServerSeconds_ = 0;
  std::map<uint64_t, uint64_t> precopied_;  // device address of a chunk -> checksum of what the target holds
  uint64_t precopyChunks_ = 0, precopyBytes_ = 0, precopyWireBytes_ = 0;
  uint64_t imageChunks_ = 0, cachedChunks_ = 0, cachedBytes_ = 0, imageWireBytes_ = 0;
  uint64_t lateChunks_ = 0, lateBytes_ = 0, wantedChunks_ = 0;
  double transferSeconds_ = 0;
  std::chrono::steady_clock::time_point handOverAt_{}, goAt_{};
  nlohmann::json targetReport_;
};

struct ListenerOptions {
  std::string address;     // "ADDR:PORT"
  net::Key key;
  std::string runtimeDir;  // images arrive in runtimeDir/migrations; phosd's control socket is there
};

// Binds `address` and forks the listener process, which accepts migrations
// (a process per connection) until its parent dies. kUnavailable when the
// address cannot be bound.
Result<pid_t> startListener(const ListenerOptions& options);

}  // namespace phos::daemon::migration
