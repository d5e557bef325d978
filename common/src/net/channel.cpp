// SPDX-License-Identifier: Apache-2.0
// The authenticated channel between daemons (phos/net/channel.h).
#include "phos/common/unique_fd.h"
#include "phos/net/channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include <fmt/format.h>

namespace phos::net {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kNonceBytes = 32;
constexpr size_t kTagBytes = 32;
constexpr size_t kMinKeyBytes = 16;
constexpr std::string_view kMagic = "PHOSMIG1";

std::span<const std::byte> asBytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

// HMAC-SHA256 over several pieces.
class Hmac {
 public:
  explicit Hmac(std::span<const std::byte> key) {
    std::unique_ptr<EVP_MAC, decltype(&EVP_MAC_free)> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr), EVP_MAC_free);
    ctx_ = mac ? EVP_MAC_CTX_new(mac.get()) : nullptr;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
    ok_ = ctx_ != nullptr &&
          EVP_MAC_init(ctx_, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) == 1;
  }
  ~Hmac() { EVP_MAC_CTX_free(ctx_); }
  Hmac(const Hmac&) = delete;
  Hmac& operator=(const Hmac&) = delete;

  Hmac& add(std::span<const std::byte> bytes) {
    ok_ = ok_ && EVP_MAC_update(ctx_, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) == 1;
    return *this;
  }
  template <typename T>
  Hmac& addValue(T value) {
    return add(std::as_bytes(std::span(&value, 1)));
  }
  Result<std::array<std::byte, kTagBytes>> tag() {
    std::array<std::byte, kTagBytes> out{};
    size_t length = 0;
    if (!ok_ || EVP_MAC_final(ctx_, reinterpret_cast<unsigned char*>(out.data()), &length, out.size()) != 1 ||
        length != kTagBytes) {
      return makeError(Code::kInternal, "HMAC-SHA256 failed in OpenSSL");
    }
    return out;
  }

 private:
  EVP_MAC_CTX* ctx_ = nullptr;
  bool ok_ = false;
};

Result<std::array<std::byte, kTagBytes>> proof(const Key& key, std::string_view role, std::span<const std::byte> a,
                                               std::span<const std::byte> b) {
  return Hmac(key.bytes).add(asBytes(role)).add(a).add(b).tag();
}

bool equalTags(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string errnoText() { return std::strerror(errno); }

std::string peerName(int fd) {
  sockaddr_in addr{};
  socklen_t length = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return "?";
  char text[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof text);
  return fmt::format("{}:{}", text, ntohs(addr.sin_port));
}

Result<sockaddr_in> resolve(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return makeError(Code::kInvalidArgument, "\"{}\" is not HOST:PORT", address);
  }
  const std::string host = address.substr(0, colon);
  const std::string portText = address.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(portText.c_str(), &end, 10);
  if (*end != '\0' || port < 0 || port > 65535) {
    return makeError(Code::kInvalidArgument, "\"{}\": the port must be a number 0..65535", address);
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || found == nullptr) {
    return makeError(Code::kUnavailable, "cannot resolve \"{}\": {}", host, ::gai_strerror(rc));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

Result<Key> Key::load(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) return makeError(Code::kNotFound, "key file {} does not exist", file.string());
    return makeError(Code::kPermissionDenied, "cannot read key file {}: {}", file.string(), errnoText());
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.size() < kMinKeyBytes) {
    return makeError(Code::kInvalidArgument,
                     "key file {} holds {} bytes; a key needs at least {} (e.g. head -c 32 /dev/urandom > {})",
                     file.string(), text.size(), kMinKeyBytes, file.string());
  }
  Key key;
  for (char c : text) key.bytes.push_back(static_cast<std::byte>(c));
  return key;
}

Result<Key> Key::fromHex(const std::string& hex) {
  if (hex.size() % 2 != 0 || hex.size() < 2 * kMinKeyBytes) {
    return makeError(Code::kInvalidArgument, "a key in hex needs an even number of digits, at least {}",
                     2 * kMinKeyBytes);
  }
  Key key;
  for (size_t i = 0; i < hex.size(); i += 2) {
    unsigned value = 0;
    if (std::sscanf(hex.c_str() + i, "%2x", &value) != 1 || !std::isxdigit(hex[i]) || !std::isxdigit(hex[i + 1])) {
      return makeError(Code::kInvalidArgument, "the key's hex has a non-hex digit at {}", i);
    }
    key.bytes.push_back(static_cast<std::byte>(value));
  }
  return key;
}

std::string Key::hex() const {
  std::string out;
  for (std::byte b : bytes) out += fmt::format("{:02x}", static_cast<unsigned>(b));
  return out;
}

Result<UniqueFd> listenOn(const std::string& address) {
  ASSIGN_OR_RETURN(sockaddr_in addr, resolve(address));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return makeError(Code::kIo, "socket: {}", errnoText());
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd.get(), 16) != 0) {
    return makeError(Code::kUnavailable, "cannot listen on {}: {}", address, errnoText());
  }
  return fd;
}

int boundPort(int fd) {
  sockaddr_in addr{};
  socklen_t length = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return -1;
  return ntohs(addr.sin_port);
}

Channel::Channel(int fd, std::vector<std::byte> sessionKey, bool client, std::string peer)
    : fd_(fd), sessionKey_(std::move(sessionKey)), client_(client), peer_(std::move(peer)) {}

Status Channel::writeAll(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return makeError(Code::kUnavailable, "sending to {}: {}", peer_, errnoText());
    bytes = bytes.subspan(static_cast<size_t>(n));
    sent_ += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

Status Channel::readAll(std::span<std::byte> bytes, Clock::time_point deadline) {
  while (!bytes.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return makeError(Code::kUnavailable, "{} sent nothing in time", peer_);
    pollfd p{fd_.get(), POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return makeError(Code::kIo, "poll: {}", errnoText());
    if (ready == 0) continue;
    ssize_t n = ::recv(fd_.get(), bytes.data(), bytes.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return makeError(Code::kUnavailable, "receiving from {}: {}", peer_, errnoText());
    if (n == 0) return makeError(Code::kUnavailable, "{} closed the connection", peer_);
    bytes = bytes.subspan(static_cast<size_t>(n));
    received_ += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

Result<Channel> Channel::connect(const std::string& address, const Key& key, std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(sockaddr_in addr, resolve(address));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return makeError(Code::kIo, "socket: {}", errnoText());
  Channel channel(fd, {}, true, address);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno != EINPROGRESS) return makeError(Code::kUnavailable, "cannot connect to {}: {}", address, errnoText());
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) {
      return makeError(Code::kUnavailable, "cannot connect to {}: no answer within {} ms", address, timeout.count());
    }
    int error = 0;
    socklen_t length = sizeof error;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) return makeError(Code::kUnavailable, "cannot connect to {}: {}", address, std::strerror(error));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const auto deadline = Clock::now() + timeout;

  std::array<std::byte, kNonceBytes> mine{}, theirs{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(mine.data()), mine.size()) != 1) {
    return makeError(Code::kInternal, "no random bytes from OpenSSL");
  }
  RETURN_IF_ERROR(channel.writeAll(asBytes(kMagic)));
  RETURN_IF_ERROR(channel.writeAll(mine));
  RETURN_IF_ERROR(channel.readAll(theirs, deadline).withContext("the migration handshake"));
  ASSIGN_OR_RETURN(auto clientProof, proof(key, "client", mine, theirs));
  RETURN_IF_ERROR(channel.writeAll(clientProof));
  std::array<std::byte, 1 + kTagBytes> answer{};
  RETURN_IF_ERROR(channel.readAll(std::span(answer).first(1), deadline).withContext("the migration handshake"));
  if (answer[0] != std::byte{1}) {
    return makeError(Code::kPermissionDenied, "{} refused this daemon's key: it does not hold the same key", address);
  }
  RETURN_IF_ERROR(channel.readAll(std::span(answer).subspan(1), deadline).withContext("the migration handshake"));
  ASSIGN_OR_RETURN(auto serverProof, proof(key, "server", mine, theirs));
  if (!equalTags(std::span(answer).subspan(1), serverProof)) {
    return makeError(Code::kPermissionDenied, "{} could not prove that it holds the key", address);
  }
  ASSIGN_OR_RETURN(auto sessionKey, proof(key, "session", mine, theirs));
  channel.sessionKey_.assign(sessionKey.begin(), sessionKey.end());
  return channel;
}

Result<Channel> Channel::accept(int fd, const Key& key, std::chrono::milliseconds timeout) {
  Channel channel(fd, {}, false, peerName(fd));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const auto deadline = Clock::now() + timeout;
  std::array<std::byte, kMagic.size()> magic{};
  std::array<std::byte, kNonceBytes> theirs{}, mine{};
  std::array<std::byte, kTagBytes> clientProof{};
  RETURN_IF_ERROR(channel.readAll(magic, deadline));
  if (!std::equal(magic.begin(), magic.end(), asBytes(kMagic).begin())) {
    return makeError(Code::kInvalidArgument, "{} does not speak the migration protocol", channel.peer_);
  }
  RETURN_IF_ERROR(channel.readAll(theirs, deadline));
  if (RAND_bytes(reinterpret_cast<unsigned char*>(mine.data()), mine.size()) != 1) {
    return makeError(Code::kInternal, "no random bytes from OpenSSL");
  }
  RETURN_IF_ERROR(channel.writeAll(mine));
  RETURN_IF_ERROR(channel.readAll(clientProof, deadline));
  ASSIGN_OR_RETURN(auto expected, proof(key, "client", theirs, mine));
  if (!equalTags(clientProof, expected)) {
    (void)channel.writeAll(std::array<std::byte, 1>{std::byte{0}});
    return makeError(Code::kPermissionDenied, "{} did not prove that it holds the key: refused", channel.peer_);
  }
  ASSIGN_OR_RETURN(auto serverProof, proof(key, "server", theirs, mine));
  RETURN_IF_ERROR(channel.writeAll(std::array<std::byte, 1>{std::byte{1}}));
  RETURN_IF_ERROR(channel.writeAll(serverProof));
  ASSIGN_OR_RETURN(auto sessionKey, proof(key, "session", theirs, mine));
  channel.sessionKey_.assign(sessionKey.begin(), sessionKey.end());
  return channel;
}

Status Channel::send(const nlohmann::json& header, std::span<const std::byte> body) {
  const std::string text = header.dump();
  const uint32_t headerBytes = static_cast<uint32_t>(text.size());
  const uint64_t bodyBytes = body.size();
  const uint8_t direction = client_ ? 0 : 1;
  ASSIGN_OR_RETURN(auto tag, Hmac(sessionKey_)
                                 .addValue(direction)
                                 .addValue(sendSeq_)
                                 .addValue(headerBytes)
                                 .addValue(bodyBytes)
                                 .add(asBytes(text))
                                 .add(body)
                                 .tag());
  std::array<std::byte, sizeof headerBytes + sizeof bodyBytes> lengths{};
  std::memcpy(lengths.data(), &headerBytes, sizeof headerBytes);
  std::memcpy(lengths.data() + sizeof headerBytes, &bodyBytes, sizeof bodyBytes);
  RETURN_IF_ERROR(writeAll(lengths));
  RETURN_IF_ERROR(writeAll(asBytes(text)));
  RETURN_IF_ERROR(writeAll(body));
  RETURN_IF_ERROR(writeAll(tag));
  ++sendSeq_;
  return Status::ok();
}

bool Channel::readable(std::chrono::milliseconds timeout) const {
  pollfd p{fd_.get(), POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) > 0;
}

Result<Frame> Channel::receive(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  uint32_t headerBytes = 0;
  uint64_t bodyBytes = 0;
  std::array<std::byte, sizeof headerBytes + sizeof bodyBytes> lengths{};
  RETURN_IF_ERROR(readAll(lengths, deadline));
  std::memcpy(&headerBytes, lengths.data(), sizeof headerBytes);
  std::memcpy(&bodyBytes, lengths.data() + sizeof headerBytes, sizeof bodyBytes);
  if (headerBytes > kMaxFrameHeader || bodyBytes > kMaxFrameBody) {
    return makeError(Code::kDataLoss, "a frame from {} claims {} + {} bytes: damaged or not from PhOS", peer_,
                     headerBytes, bodyBytes);
  }
  std::string text(headerBytes, '\0');
  Frame frame;
  frame.body.resize(bodyBytes);
  std::array<std::byte, kTagBytes> tag{};
  RETURN_IF_ERROR(readAll(std::as_writable_bytes(std::span(text.data(), text.size())), deadline));
  RETURN_IF_ERROR(readAll(frame.body, deadline));
  RETURN_IF_ERROR(readAll(tag, deadline));
  const uint8_t direction = client_ ? 1 : 0;
  ASSIGN_OR_RETURN(auto expected, Hmac(sessionKey_)
                                      .addValue(direction)
                                      .addValue(receiveSeq_)
                                      .addValue(headerBytes)
                                      .addValue(bodyBytes)
                                      .add(asBytes(text))
                                      .add(frame.body)
                                      .tag());
  if (!equalTags(tag, expected)) {
    return makeError(Code::kDataLoss, "frame {} from {} failed its integrity check (HMAC-SHA256)", receiveSeq_, peer_);
  }
  ++receiveSeq_;
  frame.header = nlohmann::json::parse(text, nullptr, false);
  if (!frame.header.is_object()) {
    return makeError(Code::kDataLoss, "frame {} from {} has a header that is not a JSON object", receiveSeq_ - 1, peer_);
  }
  return frame;
}

}  // namespace phos::net
