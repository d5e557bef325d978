// SPDX-License-Identifier: Apache-2.0
// The authenticated channel between daemons: the handshake admits only a peer
// with the same key, frames arrive intact, and a changed frame is caught.
#include "phos/net/channel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <future>

#include <gtest/gtest.h>

namespace phos::net {
namespace {

Key keyOf(const std::string& text) {
  Key key;
  for (char c : text) key.bytes.push_back(static_cast<std::byte>(c));
  return key;
}

// A listener on loopback; accept() runs the server half on another thread.
struct Listener {
  Listener() {
    auto listening = listenOn("127.0.0.1:0");
    EXPECT_TRUE(listening.isOk()) << listening.status().message();
    fd = listening->release();
    address = "127.0.0.1:" + std::to_string(boundPort(fd));
  }
  ~Listener() { ::close(fd); }
  std::future<Result<Channel>> accept(const Key& key) {
    return std::async(std::launch::async, [this, key]() -> Result<Channel> {
      int client = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return makeError(Code::kIo, "accept failed");
      return Channel::accept(client, key, std::chrono::seconds(5));
    });
  }
  int fd = -1;
  std::string address;
};

const Key kKey = keyOf("0123456789abcdef-shared-secret");

TEST(Channel, SameKeyConnectsAndFramesArriveIntactBothWays) {
  Listener l;
  auto server = l.accept(kKey);
  auto client = Channel::connect(l.address, kKey, std::chrono::seconds(5));
  ASSERT_TRUE(client.isOk()) << client.status().message();
  auto accepted = server.get();
  ASSERT_TRUE(accepted.isOk()) << accepted.status().message();

  std::vector<std::byte> body(5 << 20);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<std::byte>(i * 131 + 7);
  auto sending = std::async(std::launch::async, [&] { return client->send({{"kind", "chunk"}, {"n", 1}}, body); });
  auto frame = accepted->receive(std::chrono::seconds(5));
  ASSERT_TRUE(sending.get().isOk());
  ASSERT_TRUE(frame.isOk()) << frame.status().message();
  EXPECT_EQ(frame->header["kind"], "chunk");
  EXPECT_EQ(frame->body, body);

  ASSERT_TRUE(accepted->send({{"kind", "ack"}}).isOk());
  auto back = client->receive(std::chrono::seconds(5));
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->header["kind"], "ack");
  EXPECT_TRUE(back->body.empty());
  EXPECT_GT(client->bytesSent(), body.size());
}

TEST(Channel, PeerWithAnotherKeyIsRefusedByTheListener) {
  Listener l;
  auto server = l.accept(kKey);
  auto client = Channel::connect(l.address, keyOf("another-key-of-16-bytes-or-more"), std::chrono::seconds(5));
  ASSERT_FALSE(client.isOk());
  EXPECT_EQ(client.status().code(), Code::kPermissionDenied);
  EXPECT_NE(client.status().message().find("refused"), std::string::npos) << client.status().message();
  auto accepted = server.get();
  ASSERT_FALSE(accepted.isOk());
  EXPECT_EQ(accepted.status().code(), Code::kPermissionDenied);
  EXPECT_NE(accepted.status().message().find("did not prove"), std::string::npos);
}

TEST(Channel, NothingListeningIsUnavailable) {
  int port;
  {
    Listener l;  // a port that was free a moment ago
    port = boundPort(l.fd);
  }
  auto client = Channel::connect("127.0.0.1:" + std::to_string(port), kKey, std::chrono::seconds(2));
  ASSERT_FALSE(client.isOk());
  EXPECT_EQ(client.status().code(), Code::kUnavailable);
  EXPECT_NE(client.status().message().find("cannot connect"), std::string::npos);
}

TEST(Channel, BadAddressesAreNamed) {
  for (const char* bad : {"nohost", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:x"}) {
    auto client = Channel::connect(bad, kKey, std::chrono::seconds(1));
    ASSERT_FALSE(client.isOk()) << bad;
    EXPECT_EQ(client.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(client.status().message().find(bad), std::string::npos) << client.status().message();
  }
}

TEST(Channel, SomethingElseThanPhosIsTurnedAway) {
  Listener l;
  auto server = l.accept(kKey);
  int raw = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(boundPort(l.fd)));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(raw, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const char http[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_GT(::write(raw, http, sizeof http - 1), 0);
  auto accepted = server.get();
  ASSERT_FALSE(accepted.isOk());
  EXPECT_EQ(accepted.status().code(), Code::kInvalidArgument);
  ::close(raw);
}

// A man in the middle that flips one bit of a frame's body: the receiver
// refuses the frame instead of taking the bytes.
TEST(Channel, AChangedFrameFailsItsIntegrityCheck) {
  Listener l;
  int relayListen = listenOn("127.0.0.1:0")->release();
  const std::string relayAddress = "127.0.0.1:" + std::to_string(boundPort(relayListen));
  auto server = l.accept(kKey);
  // The relay copies the handshake as is, then flips the last body byte of the first frame.
  auto relay = std::async(std::launch::async, [&] {
    int in = ::accept(relayListen, nullptr, nullptr);
    int out = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(boundPort(l.fd)));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(out, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    auto pump = [](int from, int to, size_t bytes, bool flipLast) {
      std::vector<char> buf(bytes);
      size_t got = 0;
      while (got < bytes) {
        ssize_t n = ::read(from, buf.data() + got, bytes - got);
        if (n <= 0) return;
        got += static_cast<size_t>(n);
      }
      if (flipLast) buf[bytes - 1 - 32] ^= 1;  // the body's last byte, before the 32-byte tag
      ::write(to, buf.data(), bytes);
    };
    pump(in, out, 8 + 32, false);   // magic, client nonce
    pump(out, in, 32, false);       // server nonce
    pump(in, out, 32, false);       // client proof
    pump(out, in, 33, false);       // accepted, server proof
    pump(in, out, 12 + 2 + 4 + 32, true);  // one frame: lengths, "{}", 4 body bytes, tag
    ::sleep(1);
    ::close(in);
    ::close(out);
  });
  auto client = Channel::connect(relayAddress, kKey, std::chrono::seconds(5));
  ASSERT_TRUE(client.isOk()) << client.status().message();
  auto accepted = server.get();
  ASSERT_TRUE(accepted.isOk()) << accepted.status().message();
  const std::array<std::byte, 4> body{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
  ASSERT_TRUE(client->send(nlohmann::json::object(), body).isOk());
  auto frame = accepted->receive(std::chrono::seconds(5));
  ASSERT_FALSE(frame.isOk());
  EXPECT_EQ(frame.status().code(), Code::kDataLoss);
  EXPECT_NE(frame.status().message().find("integrity"), std::string::npos);
  relay.get();
  ::close(relayListen);
}

TEST(Key, LoadRefusesMissingAndShortFiles) {
  const std::string dir = ::testing::TempDir();
  auto missing = Key::load(dir + "/no-such-key");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  const std::string shortFile = dir + "/short-key";
  std::ofstream(shortFile) << "tooshort\n";
  auto tooShort = Key::load(shortFile);
  ASSERT_FALSE(tooShort.isOk());
  EXPECT_EQ(tooShort.status().code(), Code::kInvalidArgument);
  EXPECT_NE(tooShort.status().message().find("at least 16"), std::string::npos);
  const std::string good = dir + "/good-key";
  std::ofstream(good) << "0123456789abcdef0123\n";
  auto key = Key::load(good);
  ASSERT_TRUE(key.isOk());
  EXPECT_EQ(key->bytes.size(), 20u);  // without the newline
  auto again = Key::fromHex(key->hex());
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->bytes, key->bytes);
  EXPECT_FALSE(Key::fromHex("zz").isOk());
}

}  // namespace
}  // namespace phos::net
