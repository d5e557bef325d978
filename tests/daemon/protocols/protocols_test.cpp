// SPDX-License-Identifier: Apache-2.0
// The checkpoint protocols (checkpoint_protocols.h) driven by hand through a
// checkpoint's moments, as CRIU's action script calls them, on a session
// served on vgpu in this process: what each saves of the job's memory while
// the job writes it, and that a checkpoint that fails at any moment leaves
// the session serving with no window open; and what a concurrent restore
// (on_demand_restore.h) loads while the job's calls write the memory. No
// CRIU: these are the GPU half.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "protocols/checkpoint_protocols.h"
#include "protocols/on_demand_restore.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "session_harness.h"

namespace phos::daemon {
namespace {

using json = nlohmann::json;

class Protocols : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { app_ = new Application(); }
  static void TearDownTestSuite() {
    delete app_;
    app_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(daemonState().error.empty()) << daemonState().error;
    ASSERT_GT(app_->pid(), 0) << "cannot start the stand-in application";
    client_ = std::make_unique<Client>(++nextId_, app_->pid());
    ASSERT_NO_FATAL_FAILURE(client_->setUpContext());
    ASSERT_NO_FATAL_FAILURE(fill(0xa5));
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("phos-protocols-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    image_ = dir_ / "image";
    auto writer = image::ImageWriter::create(image_);
    ASSERT_TRUE(writer.isOk()) << writer.status().message();
    writer_ = std::move(*writer);
  }
  void TearDown() override {
    writer_.reset();
    client_.reset();
    std::filesystem::remove_all(dir_);
  }

  // The job writes `value` over its whole allocation.
  void fill(uint8_t value) {
    Client& c = *client_;
    ASSERT_EQ(c.call(c.req(EntryPointId::kCuMemsetD8_v2)
                         .message(wire::cuMemsetD8_v2_Request{c.device, value, Client::kBytes}))
                  .result,
              CUDA_SUCCESS);
  }
  // The allocation's bytes as the job reads them now.
  std::vector<uint8_t> deviceBytes() {
    Client& c = *client_;
    EXPECT_EQ(c.call(c.req(EntryPointId::kCuMemcpyDtoH_v2)
                         .u64(kAppScratch)
                         .u64(c.device)
                         .u64(Client::kBytes))
                  .result,
              CUDA_SUCCESS);
    return app_->read(kAppScratch, Client::kBytes);
  }
  std::unique_ptr<CheckpointProtocol> protocol(const std::string& mode) {
    return CheckpointProtocol::make(mode, client_->session(), ProtocolOptions{.leaveRunning = true},
                                    progress_, times_);
  }
  // The moments of a checkpoint whose CRIU dump succeeds, then the image
  // committed; what it holds of the allocation.
  std::vector<uint8_t> checkpoint(CheckpointProtocol& p,
                                  const std::function<void()>& beforeCut = {}) {
    EXPECT_TRUE(p.beforeDump().isOk());
    if (beforeCut) beforeCut();
    Status cut = p.beforeFreeze(*writer_);
    EXPECT_TRUE(cut.isOk()) << cut.message();
    EXPECT_TRUE(p.whileFrozen(*writer_).isOk());
    cutDone_ = true;
    p.afterDump(true);
    Status written = p.beforeCommit();
    EXPECT_TRUE(written.isOk()) << written.message();
    p.finish(true);
    writer_->setState({{"gpu", {{"sessions", json::array({p.state()})}}}});
    Status committed = writer_->commit();
    EXPECT_TRUE(committed.isOk()) << committed.message();
    return imageBytes(p.state());
  }
  std::vector<uint8_t> imageBytes(const json& state) {
    auto reader = image::ImageReader::open(image_);
    EXPECT_TRUE(reader.isOk()) << reader.status().message();
    if (!reader.isOk()) return {};
    const json& allocations = state.at("allocations");
    EXPECT_EQ(allocations.size(), 1u) << state.dump();
    if (allocations.size() != 1) return {};
    auto blob = (*reader)->findBlob(allocations[0].at("blob").get<std::string>());
    EXPECT_TRUE(blob.has_value());
    if (!blob) return {};
    std::vector<uint8_t> bytes(Client::kBytes);
    Status read = (*reader)->read(*blob, 0, std::as_writable_bytes(std::span(bytes)));
    EXPECT_TRUE(read.isOk()) << read.message();
    return bytes;
  }
  // After a checkpoint, failed or not: the session serves the job's calls,
  // behind no protocol's gate.
  void expectServingWithoutWindow() {
    EXPECT_FALSE(client_->session().hasAccessGate());
    ASSERT_NO_FATAL_FAILURE(fill(0x42));
    EXPECT_EQ(deviceBytes(), std::vector<uint8_t>(Client::kBytes, 0x42));
  }

  static Application* app_;
  static uint64_t nextId_;
  std::unique_ptr<Client> client_;
  std::filesystem::path dir_, image_;
  std::unique_ptr<image::ImageWriter> writer_;
  CheckpointTimes times_;
  std::atomic<bool> cutDone_{false};
  ProgressFn progress_;
};
Application* Protocols::app_ = nullptr;
uint64_t Protocols::nextId_ = 500;

const std::vector<uint8_t> kAtTheCut(Client::kBytes, 0xa5);

TEST_F(Protocols, StopTheWorldSavesTheMemoryOfTheCut) {
  auto p = protocol("stop");
  EXPECT_STREQ(p->name(), "stop-the-world");
  EXPECT_EQ(checkpoint(*p), kAtTheCut);
  EXPECT_EQ(p->gpuBytes(), Client::kBytes);
  expectServingWithoutWindow();
}

TEST_F(Protocols, CopyOnWriteSavesTheMemoryOfTheCutWhileTheJobOverwritesIt) {
  // The job writes its whole allocation as soon as it runs again, before
  // the protocol's copy has begun: the gate must save the bytes of the cut
  // first.
  bool wrote = false;
  progress_ = [&](const json& progress) {
    if (wrote || !cutDone_ || progress.value("phase", "") != "gpu-memory") return;
    wrote = true;
    fill(0x3c);
  };
  auto p = protocol("cow");
  EXPECT_STREQ(p->name(), "soft-copy-on-write");
  EXPECT_EQ(checkpoint(*p), kAtTheCut);
  EXPECT_TRUE(wrote);
  EXPECT_EQ(deviceBytes(), std::vector<uint8_t>(Client::kBytes, 0x3c));
  EXPECT_GT(p->copyOnWriteReport().value("shadowed_chunks", 0), 0) << p->copyOnWriteReport().dump();
  EXPECT_EQ(p->copyOnWriteReport().value("misspeculations", -1), 0);
  EXPECT_FALSE(p->retryStopTheWorld().has_value());
  expectServingWithoutWindow();
}

TEST_F(Protocols, CopyOnWriteWithoutLeaveRunningIsStopTheWorld) {
  auto p =
      CheckpointProtocol::make("cow", client_->session(), ProtocolOptions{}, progress_, times_);
  EXPECT_STREQ(p->name(), "stop-the-world");
}

TEST_F(Protocols, RecopySavesTheMemoryOfItsSecondCut) {
  // Copied while the job runs (beforeDump); the job then writes it again:
  // the image holds what the job had at the cut, the second write.
  auto p = protocol("recopy");
  EXPECT_STREQ(p->name(), "soft-recopy");
  EXPECT_FALSE(p->restoresEagerly());
  EXPECT_EQ(checkpoint(*p,
                       [&] {
                         EXPECT_TRUE(client_->session().hasAccessGate());
                         fill(0x77);
                       }),
            std::vector<uint8_t>(Client::kBytes, 0x77));
  EXPECT_EQ(p->recopyReport().value("misspeculations", -1), 0) << p->recopyReport().dump();
  expectServingWithoutWindow();
}

TEST_F(Protocols, AFailedDumpLeavesTheSessionServing) {
  for (const char* mode : {"stop", "cow", "recopy"}) {
    SCOPED_TRACE(mode);
    auto writer = image::ImageWriter::create(
        dir_ / mode);  // dropped without a commit, as CRIU's failure does
    ASSERT_TRUE(writer.isOk()) << writer.status().message();
    auto p = protocol(mode);
    ASSERT_TRUE(p->beforeDump().isOk());
    Status cut = p->beforeFreeze(**writer);
    ASSERT_TRUE(cut.isOk()) << cut.message();
    p->afterDump(false);
    p->finish(false);
    expectServingWithoutWindow();
  }
}

TEST_F(Protocols, ARecopyThatFailsBeforeItsCutClosesItsWindow) {
  auto p = protocol("recopy");
  ASSERT_TRUE(p->beforeDump().isOk());
  EXPECT_TRUE(client_->session().hasAccessGate());
  p->finish(false);  // CRIU gave up before freezing: no beforeFreeze
  expectServingWithoutWindow();
}

// A concurrent restore of the image of a stop-the-world checkpoint (the
// allocation holds 0xa5 there) into device memory that holds 0x00, as a
// target's fresh mapping does. `write` is the job's first call, made while
// nothing is loaded; the load runs once the call waits for it (or has
// returned). What the job then reads, and the restore's statistics.
struct Restored {
  std::vector<uint8_t> bytes;
  OnDemandStats stats;
};

class ConcurrentRestore : public Protocols {
 protected:
  Restored restoreWhile(const std::function<void()>& write) {
    auto stop = protocol("stop");
    EXPECT_EQ(checkpoint(*stop), kAtTheCut);
    fill(0x00);
    auto reader = image::ImageReader::open(image_);
    EXPECT_TRUE(reader.isOk()) << reader.status().message();
    if (!reader.isOk()) return {};
    Session& s = client_->session();
    std::vector<DeviceBuffer> buffers = s.allocationList();
    EXPECT_EQ(buffers.size(), 1u);
    auto blob = (*reader)->findBlob(stop->state().at("allocations")[0].at("blob").get<std::string>());
    EXPECT_TRUE(blob.has_value());
    if (buffers.size() != 1 || !blob) return {};
    buffers[0].blob = *blob;
    OnDemandRestore loading(s.driver(), std::shared_ptr<const image::ImageReader>(std::move(*reader)),
                            buffers);
    EXPECT_TRUE(loading.prepare().isOk());
    const ValidationMode before = s.validator().mode();
    EXPECT_TRUE(s.pause(std::chrono::seconds(5)).isOk());
    {
      auto lock = s.lockCalls();
      s.openWindow(loading.gate(), ValidationMode::kValidateRestore);
    }
    s.resume();
    std::atomic<bool> returned{false};
    std::thread job([&] {
      write();
      returned = true;
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!returned && loading.stats().waitedCalls == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    Status loaded = loading.run([](uint64_t) {}, [] { return false; });
    EXPECT_TRUE(loaded.isOk()) << loaded.message();
    job.join();
    EXPECT_TRUE(s.pause(std::chrono::seconds(5)).isOk());
    {
      auto lock = s.lockCalls();
      EXPECT_TRUE(s.closeWindow(before).empty());
    }
    s.resume();
    return {deviceBytes(), loading.stats()};
  }
};

// Found by the differential tester after live migrations (seeds 61581 and
// 62454 of docs/checkpoint.md): the job allocated a buffer and memset rows of
// it with cuMemsetD2D32 while the target still loaded the memory. A 2D set
// names the span from its first row to the end of its last, which covered a
// whole chunk not loaded yet: the chunk was taken as overwritten and never
// loaded, and the gaps between the rows kept the fresh mapping's zeros.
TEST_F(ConcurrentRestore, LoadsTheChunkOfA2DSetThatLeavesGapsBetweenItsRows) {
  // Rows of 196 bytes every 300: the last one ends at 4096, the allocation's end.
  constexpr uint64_t kPitch = 300, kWidth = 196, kHeight = 14;
  static_assert(kPitch * (kHeight - 1) + kWidth == Client::kBytes);
  Client& c = *client_;
  const Restored r = restoreWhile([&] {
    EXPECT_EQ(c.call(c.req(EntryPointId::kCuMemsetD2D8_v2)
                         .message(wire::cuMemsetD2D8_v2_Request{c.device, kPitch, 0x11, kWidth, kHeight}))
                  .result,
              CUDA_SUCCESS);
  });
  std::vector<uint8_t> expected = kAtTheCut;
  for (uint64_t row = 0; row < kHeight; ++row) {
    std::fill_n(expected.begin() + static_cast<std::ptrdiff_t>(row * kPitch), kWidth, 0x11);
  }
  EXPECT_EQ(r.bytes, expected);
  EXPECT_EQ(r.stats.skippedChunks, 0u);
  EXPECT_EQ(r.stats.waitedCalls, 1u);
}

// A set of the whole allocation leaves nothing of the image: its chunk is
// not loaded at all, and the call does not wait.
TEST_F(ConcurrentRestore, SkipsTheChunkThatASetOverwritesWhole) {
  Client& c = *client_;
  const Restored r = restoreWhile([&] {
    EXPECT_EQ(c.call(c.req(EntryPointId::kCuMemsetD8_v2)
                         .message(wire::cuMemsetD8_v2_Request{c.device, 0x22, Client::kBytes}))
                  .result,
              CUDA_SUCCESS);
  });
  EXPECT_EQ(r.bytes, std::vector<uint8_t>(Client::kBytes, 0x22));
  EXPECT_EQ(r.stats.skippedChunks, 1u);
  EXPECT_EQ(r.stats.waitedCalls, 0u);
}

// Rows with no gap between them (the pitch is the width) overwrite their span.
TEST_F(ConcurrentRestore, SkipsTheChunkThatA2DSetWithoutGapsOverwrites) {
  Client& c = *client_;
  const Restored r = restoreWhile([&] {
    EXPECT_EQ(c.call(c.req(EntryPointId::kCuMemsetD2D8_v2)
                         .message(wire::cuMemsetD2D8_v2_Request{c.device, 256, 0x33, 256, Client::kBytes / 256}))
                  .result,
              CUDA_SUCCESS);
  });
  EXPECT_EQ(r.bytes, std::vector<uint8_t>(Client::kBytes, 0x33));
  EXPECT_EQ(r.stats.skippedChunks, 1u);
}

}  // namespace
}  // namespace phos::daemon
