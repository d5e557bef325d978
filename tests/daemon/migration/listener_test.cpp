// SPDX-License-Identifier: Apache-2.0
// The target end of a migration (daemon/src/migration/) against a hostile or
// broken source: its listener runs as in phosd, and this test speaks the
// protocol of migration.h itself over an authenticated channel. Every frame
// that is out of order, malformed, or names something outside what it
// received is answered with "failed" naming the problem, and what arrived is
// discarded; a peer without the key is refused. No CRIU, no GPU: nothing
// here gets as far as a restore.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "migration/migration.h"
#include "phos/image/format.h"
#include "phos/image/writer.h"
#include "phos/net/channel.h"

namespace phos::daemon::migration {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

class MigrationTarget : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("phos-migration-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "migrations");
    key_.bytes.assign(32, std::byte{0x5a});
    // A port of its own: another run of this test may hold the last one.
    for (int attempt = 0; attempt < 20 && listener_ <= 0; ++attempt) {
      address_ = "127.0.0.1:" + std::to_string(20000 + (getpid() * 7 + attempt * 131) % 30000);
      auto pid = startListener({address_, key_, dir_.string()});
      if (pid.isOk()) listener_ = *pid;
    }
    ASSERT_GT(listener_, 0) << "no port to listen on";
  }
  void TearDown() override {
    if (listener_ > 0) {
      kill(listener_, SIGKILL);
      waitpid(listener_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  Result<net::Channel> connect() { return net::Channel::connect(address_, key_, 10s); }

  using Frames = std::vector<std::pair<json, std::vector<std::byte>>>;
  // What the target answers to `frames`, sent in order: its first frame.
  json answerTo(const Frames& frames) {
    auto channel = connect();
    EXPECT_TRUE(channel.isOk()) << channel.status().message();
    if (!channel.isOk()) return json();
    for (const auto& [header, body] : frames) {
      if (!channel->send(header, body).isOk()) break;  // the target may have hung up already
    }
    auto answer = channel->receive(30s);
    EXPECT_TRUE(answer.isOk()) << answer.status().message();
    return answer.isOk() ? answer->header : json();
  }
  json answerTo(const json& header) { return answerTo(Frames{{header, {}}}); }

  // The manifest of an image of no blobs, as a source sends it.
  json manifest() {
    const fs::path image = dir_ / "source-image";
    auto writer = image::ImageWriter::create(image);
    EXPECT_TRUE(writer.isOk());
    (*writer)->setState({{"process", {{"pid", 4242}}}});
    EXPECT_TRUE((*writer)->commit().isOk());
    std::ifstream in(image / std::string(image::kManifestFile));
    return json::parse(in);
  }

  static void expectFailure(const json& answer, const std::string& named) {
    EXPECT_EQ(answer.value("kind", ""), "failed") << answer.dump();
    EXPECT_NE(answer.value("error", "").find(named), std::string::npos) << answer.dump();
  }

  // Nothing of a refused migration stays in the runtime directory.
  void expectNothingLeft() {
    for (int i = 0; i < 100; ++i) {
      bool left = false;
      for (const auto& entry : fs::directory_iterator(dir_ / "migrations")) {
        left |= entry.path().filename().string().find("in-") != std::string::npos;
      }
      if (!left) return;
      usleep(20000);
    }
    ADD_FAILURE() << "an incoming image stayed in " << (dir_ / "migrations");
  }

  fs::path dir_;
  net::Key key_;
  std::string address_;
  pid_t listener_ = -1;
};

TEST_F(MigrationTarget, AnUnknownFrameIsRefusedNamingIt) {
  expectFailure(answerTo(json{{"kind", "teleport"}}), "unknown frame \"teleport\"");
}

TEST_F(MigrationTarget, APrecopiedChunkOfNoBytesOrOfTheWrongChecksumIsRefused) {
  expectFailure(answerTo(json{{"kind", "precopy"}, {"address", 4096}, {"bytes", 0}}),
                "a precopied chunk of 0 bytes");
  std::vector<std::byte> raw(4096, std::byte{1});
  expectFailure(answerTo(Frames{{{{"kind", "precopy"},
                                  {"address", 4096},
                                  {"bytes", 4096},
                                  {"hash", 12345},
                                  {"zstd", false}},
                                 raw}}),
                "does not match its checksum");
}

TEST_F(MigrationTarget, FramesBeforeTheManifestAreRefused) {
  expectFailure(answerTo(json{{"kind", "chunk"}, {"blob", 0}, {"chunk", 0}}),
                "a chunk before the manifest");
  expectFailure(answerTo(json{{"kind", "file"}, {"path", "cpu/core-1.img"}}),
                "a file before the manifest");
  expectFailure(answerTo(json{{"kind", "end"}, {"late", json::array()}}),
                "end before the manifest");
  expectFailure(answerTo(json{{"kind", "pages"}, {"bytes", 1}}), "pages without a page server");
}

TEST_F(MigrationTarget, WhatNamesOutsideTheManifestOrOutsideCpuIsRefusedAndDiscarded) {
  const json m = manifest();
  expectFailure(
      answerTo(
          Frames{{{{"kind", "manifest"}, {"manifest", m}}, {}},
                 {{{"kind", "file"}, {"path", "cpu/../../escape"}, {"offset", 0}, {"zstd", false}},
                  std::vector<std::byte>(8)}}),
      "leaves cpu/");
  expectNothingLeft();
  EXPECT_FALSE(fs::exists(dir_ / "migrations" / "escape"));
  expectFailure(answerTo(Frames{{{{"kind", "manifest"}, {"manifest", m}}, {}},
                                {{{"kind", "chunk"}, {"blob", 3}, {"chunk", 0}, {"zstd", false}},
                                 std::vector<std::byte>(8)}}),
                "chunk 0 of blob 3 is not in the manifest");
  expectFailure(answerTo(Frames{{{{"kind", "manifest"}, {"manifest", m}}, {}},
                                {{{"kind", "manifest"}, {"manifest", m}}, {}}}),
                "a second manifest");
  expectFailure(answerTo(Frames{{{{"kind", "manifest"}, {"manifest", m}}, {}},
                                {{{"kind", "end"}, {"late", 7}}, {}}}),
                "\"late\" is not a list");
  expectNothingLeft();
}

TEST_F(MigrationTarget, APeerWithoutTheKeyIsRefusedAtTheHandshake) {
  net::Key wrong;
  wrong.bytes.assign(32, std::byte{0x33});
  auto channel = net::Channel::connect(address_, wrong, 10s);
  ASSERT_FALSE(channel.isOk());
  EXPECT_EQ(channel.status().code(), Code::kPermissionDenied) << channel.status().message();
  EXPECT_NE(channel.status().message().find("does not hold the same key"), std::string::npos)
      << channel.status().message();
}

}  // namespace
}  // namespace phos::daemon::migration
