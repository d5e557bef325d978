// SPDX-License-Identifier: Apache-2.0
// The TCP channel between two phosd daemons (live migration, docs/migration.md):
// both ends prove that they hold the same secret key, and every frame carries
// an HMAC-SHA256 tag, so a peer without the key is refused and a frame changed,
// dropped, replayed or reordered on the way is detected.
//
// Handshake (fixed-size, before any frame; C the connecting side, S the listener):
//   C -> S  "PHOSMIG1" nonceC[32]
//   S -> C  nonceS[32]
//   C -> S  HMAC(key, "client" nonceC nonceS)
//   S -> C  1 HMAC(key, "server" nonceC nonceS)   or 0 and close (wrong key)
// Then frames, each direction numbered from 0, with the session key
// HMAC(key, "session" nonceC nonceS):
//   u32 header bytes, u64 body bytes, header (a JSON object), body,
//   HMAC(session key, direction seq u32 u64 header body)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/common/unique_fd.h"
#include "phos/common/status.h"

namespace phos::net {

// A shared secret, read from a key file (at least 16 bytes; a trailing
// newline is not part of it). Create one with `head -c 32 /dev/urandom > F`.
struct Key {
  std::vector<std::byte> bytes;
  // kNotFound: no such file; kInvalidArgument: too short; kPermissionDenied.
  static Result<Key> load(const std::filesystem::path& file);
  static Result<Key> fromHex(const std::string& hex);
  std::string hex() const;
};

struct Frame {
  nlohmann::json header;
  std::vector<std::byte> body;
};

// Frames larger than this are refused (a header is JSON; a body is at most
// one image chunk or one piece of a file).
inline constexpr uint64_t kMaxFrameHeader = 64u << 20;
inline constexpr uint64_t kMaxFrameBody = 64u << 20;

class Channel {
 public:
  // Connects to "HOST:PORT" (an IPv4 address or a name) and runs the
  // handshake. kUnavailable: nothing answers; kPermissionDenied: the peer
  // refused our key, or could not prove it holds it.
  static Result<Channel> connect(const std::string& address, const Key& key, std::chrono::milliseconds timeout);
  // The listener's side of the handshake on an accepted socket (taken over).
  static Result<Channel> accept(int fd, const Key& key, std::chrono::milliseconds timeout);


  Status send(const nlohmann::json& header, std::span<const std::byte> body = {});
  // Waits up to `timeout` for the next frame. kUnavailable: the peer closed
  // the connection or the timeout passed; kDataLoss: a frame failed its tag.
  Result<Frame> receive(std::chrono::milliseconds timeout);
  // Whether a frame (or the end of the connection) is there to receive
  // within `timeout`.
  bool readable(std::chrono::milliseconds timeout) const;
  // Bytes sent and received so far, frames and handshake included.
  uint64_t bytesSent() const { return sent_; }
  uint64_t bytesReceived() const { return received_; }
  // "ADDRESS:PORT" of the other end.
  const std::string& peer() const { return peer_; }
  int fd() const { return fd_.get(); }

 private:
  Channel(int fd, std::vector<std::byte> sessionKey, bool client, std::string peer);
  Status writeAll(std::span<const std::byte> bytes);
  Status readAll(std::span<std::byte> bytes, std::chrono::steady_clock::time_point deadline);

  UniqueFd fd_;
  std::vector<std::byte> sessionKey_;
  bool client_ = false;
  uint64_t sendSeq_ = 0;
  uint64_t receiveSeq_ = 0;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
  std::string peer_;
};

// A listening TCP socket on "ADDRESS:PORT" (port 0: any; see boundPort).
Result<UniqueFd> listenOn(const std::string& address);
// The port a listening socket got.
int boundPort(int fd);

}  // namespace phos::net
