// SPDX-License-Identifier: Apache-2.0
// The GPU half's hooks around CRIU (criu suite): their order, that the process
// runs during beforeFreeze and is frozen during whileFrozen, and what a failing
// hook leaves behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "phos/criu/checkpoint.h"
#include "status_matchers.h"

namespace phos::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::phos::testing::IsOk;
using ::phos::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kLimit = 4000;  // ~4 s of counting, then the child exits 7

char processState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

// A child that counts in memory shared with the test, once per millisecond,
// and exits with 7 when it reaches kLimit.
class CountingChild {
 public:
  CountingChild() {
    void* p = ::mmap(nullptr, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    // Lock-free atomics work across processes sharing the page.
    counter_ = new (p) std::atomic<uint64_t>(0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setsid();
      for (int fd = 3; fd < 1024; ++fd) ::close(fd);
      for (;;) {
        if (counter_->fetch_add(1) + 1 >= kLimit) ::_exit(7);
        ::usleep(1000);
      }
    }
    while (*counter_ < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~CountingChild() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::munmap(counter_, sizeof(uint64_t));
  }
  pid_t pid() const { return pid_; }
  uint64_t count() const { return *counter_; }
  int reap() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

 private:
  std::atomic<uint64_t>* counter_ = nullptr;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

fs::path freshImagePath(const char* name) {
  fs::path dir =
      fs::path(::testing::TempDir()) / ("phos-hooks-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir;
}

bool partialLeft(const fs::path& image) {
  for (const auto& entry : fs::directory_iterator(image.parent_path())) {
    if (entry.path().filename().string().starts_with("." + image.filename().string() +
                                                     ".partial-")) {
      return true;
    }
  }
  return false;
}

TEST(CheckpointHooks, RunInOrderWithTheProcessFrozenInBetween) {
  CountingChild child;
  fs::path image = freshImagePath("order");
  std::vector<std::string> calls;
  char stateWhileFrozen = '?', stateBeforeFreeze = '?';
  uint64_t before = 0, after = 0, countedBeforeFreeze = 0;
  std::vector<nlohmann::json> progress;
  CheckpointOptions options;
  options.image = image;
  options.leaveRunning = true;
  options.hooks.beforeDump = [&](image::ImageWriter& writer) {
    calls.push_back("beforeDump");
    EXPECT_TRUE(fs::is_directory(writer.stagingDirectory()));
    // A GPU blob, as the engine would write one.
    std::vector<std::byte> bytes(1000, std::byte{0x5a});
    auto blob = writer.addBlob("gpu/0/0x7f0000000000", "gpu-memory", bytes.size(), {{"device", 0}});
    if (!blob) return blob.status();
    return writer.writeBlob(*blob, bytes);
  };
  options.hooks.beforeFreeze = [&](image::ImageWriter& writer) {
    calls.push_back("beforeFreeze");
    stateBeforeFreeze = processState(child.pid());
    countedBeforeFreeze = child.count();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    countedBeforeFreeze = child.count() - countedBeforeFreeze;
    // CRIU waits for this step: what is written here is in the image.
    std::vector<std::byte> bytes(24, std::byte{0x33});
    auto blob = writer.addBlob("gpu/0/0x7f0000100000", "gpu-memory", bytes.size(), {{"device", 0}});
    if (!blob) return blob.status();
    return writer.writeBlob(*blob, bytes);
  };
  options.hooks.whileFrozen = [&](image::ImageWriter&) {
    calls.push_back("whileFrozen");
    stateWhileFrozen = processState(child.pid());
    before = child.count();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    after = child.count();
    return Status::ok();
  };
  options.hooks.afterDump = [&](bool dumped) {
    calls.push_back(dumped ? "afterDump(true)" : "afterDump(false)");
  };
  options.hooks.gpuState = [] {
    return nlohmann::json{{"sessions", {{{"id", 1}, {"allocations", {1, 2}}}}}};
  };
  options.hooks.progress = [&](const nlohmann::json& p) { progress.push_back(p); };

  auto report = checkpointProcess(child.pid(), options);
  ASSERT_THAT(report, IsOk());
  EXPECT_THAT(calls, ElementsAre("beforeDump", "beforeFreeze", "whileFrozen", "afterDump(true)"));
  EXPECT_TRUE(stateBeforeFreeze != 't' && stateBeforeFreeze != 'T')
      << "state during beforeFreeze: " << stateBeforeFreeze;
  EXPECT_GT(countedBeforeFreeze, 0u) << "the child must still run while beforeFreeze runs";
  EXPECT_TRUE(stateWhileFrozen == 't' || stateWhileFrozen == 'T')
      << "state during whileFrozen: " << stateWhileFrozen;
  EXPECT_EQ(before, after) << "the child counted while CRIU held it frozen";
  EXPECT_EQ(report->gpuBytes, 1024u);
  // Left running: it counts again.
  uint64_t resumed = child.count();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GT(child.count(), resumed);

  ASSERT_GE(progress.size(), 2u);
  EXPECT_EQ(progress.front()["phase"], "cpu");
  EXPECT_EQ(progress.front()["bytes"], 0);
  // The last report is the whole of cpu/, as the manifest records it.
  EXPECT_EQ(progress.back()["bytes"].get<uint64_t>(), report->cpuBytes);
  EXPECT_EQ(progress.back()["total"], progress.back()["bytes"]);

  auto reader = image::ImageReader::open(image);
  ASSERT_THAT(reader, IsOk());
  const nlohmann::json& state = (*reader)->manifest().state;
  EXPECT_EQ(state["gpu"]["sessions"][0]["id"], 1);
  ASSERT_EQ(state["cpu"]["stdio"].size(), 3u);
  EXPECT_EQ(state["cpu"]["stdio"][0]["fd"], 0);
  EXPECT_TRUE(state["cpu"].contains("pre_dump"));
  EXPECT_TRUE((*reader)->verify().empty());
  fs::remove_all(image);
}

TEST(CheckpointHooks, RestoreCallsBeforeThenAfterAndReportsTheExitCode) {
  CountingChild child;
  fs::path image = freshImagePath("restore");
  CheckpointOptions options;
  options.image = image;  // not left running: CRIU kills the child
  ASSERT_THAT(checkpointProcess(child.pid(), options), IsOk());
  int status = child.reap();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  std::vector<std::string> calls;
  std::optional<pid_t> restoredPid;
  RestoreOptions restore;
  restore.image = image;
  restore.beforeRestore = [&](const image::ImageReader& reader) {
    calls.push_back("beforeRestore");
    EXPECT_EQ(reader.directory(), image);
    return Status::ok();
  };
  restore.afterRestore = [&](std::optional<pid_t> pid) {
    calls.push_back("afterRestore");
    restoredPid = pid;
  };
  auto report = restoreProcess(restore);
  ASSERT_THAT(report, IsOk());
  EXPECT_THAT(calls, ElementsAre("beforeRestore", "afterRestore"));
  ASSERT_TRUE(restoredPid.has_value());
  EXPECT_EQ(*restoredPid, child.pid());  // CRIU gives the pid back
  // The restored child counted on from where it was, up to kLimit: exit 7.
  ASSERT_TRUE(report->exitCode.has_value());
  EXPECT_EQ(*report->exitCode, 7);
  EXPECT_GT(report->totalSeconds, report->restoreSeconds);
  fs::remove_all(image);
}

TEST(CheckpointHooks, FailingWhileFrozenResumesTheProcessAndWritesNothing) {
  CountingChild child;
  fs::path image = freshImagePath("frozen-fails");
  std::vector<std::string> calls;
  CheckpointOptions options;
  options.image = image;  // without --leave-running: a failure must still keep it alive
  options.hooks.whileFrozen = [&](image::ImageWriter&) {
    calls.push_back("whileFrozen");
    return Status(Code::kResourceExhausted, "no shadow memory left");
  };
  options.hooks.afterDump = [&](bool dumped) {
    calls.push_back(dumped ? "afterDump(true)" : "afterDump(false)");
  };
  auto report = checkpointProcess(child.pid(), options);
  EXPECT_THAT(report, StatusIs(Code::kFailedPrecondition, HasSubstr("no shadow memory left")));
  EXPECT_THAT(calls, ElementsAre("whileFrozen", "afterDump(false)"));
  uint64_t count = child.count();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GT(child.count(), count) << "the child must run on after a failed checkpoint";
  EXPECT_FALSE(fs::exists(image));
  EXPECT_FALSE(partialLeft(image));
}

TEST(CheckpointHooks, FailingBeforeFreezeNeverFreezesTheProcessAndWritesNothing) {
  CountingChild child;
  fs::path image = freshImagePath("freeze-fails");
  std::vector<std::string> calls;
  CheckpointOptions options;
  options.image = image;  // without --leave-running: a failure must still keep it alive
  options.hooks.beforeFreeze = [&](image::ImageWriter&) {
    calls.push_back("beforeFreeze");
    return Status(Code::kUnavailable, "session 3 is still serving a call after 5000 ms");
  };
  options.hooks.whileFrozen = [&](image::ImageWriter&) {
    calls.push_back("whileFrozen");
    return Status::ok();
  };
  options.hooks.afterDump = [&](bool dumped) {
    calls.push_back(dumped ? "afterDump(true)" : "afterDump(false)");
  };
  auto report = checkpointProcess(child.pid(), options);
  EXPECT_THAT(report, StatusIs(Code::kFailedPrecondition,
                               AllOf(HasSubstr("before pid " + std::to_string(child.pid()) + " was frozen failed"),
                                     HasSubstr("still serving a call after 5000 ms"))));
  EXPECT_THAT(calls, ElementsAre("beforeFreeze", "afterDump(false)"));
  uint64_t count = child.count();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GT(child.count(), count) << "the child must run on after a failed checkpoint";
  EXPECT_FALSE(fs::exists(image));
  EXPECT_FALSE(partialLeft(image));
}

// The action script's FIFOs may be the job user's (CRIU dumps as that user):
// a step asked for again, as that user could, fails the dump; the hook never
// runs twice.
TEST(CheckpointHooks, AStepAskedForTwiceFailsTheDumpAndRunsItsHookOnce) {
  CountingChild child;
  fs::path image = freshImagePath("asked-twice");
  int beforeFreezeCalls = 0;
  CheckpointOptions options;
  options.image = image;
  options.leaveRunning = true;
  options.hooks.beforeFreeze = [&](image::ImageWriter&) {
    ++beforeFreezeCalls;
    // This process's channel: /tmp/phos-criu-action.<pid>.XXXXXX/request.
    const std::string stem = "phos-criu-action." + std::to_string(::getpid()) + ".";
    for (const auto& entry : fs::directory_iterator("/tmp")) {
      if (!entry.path().filename().string().starts_with(stem)) continue;
      std::ofstream request(entry.path() / "request");
      request << "pre-dump\n" << std::flush;
    }
    return Status::ok();
  };
  options.hooks.whileFrozen = [&](image::ImageWriter&) { return Status::ok(); };
  auto report = checkpointProcess(child.pid(), options);
  EXPECT_THAT(report, StatusIs(Code::kFailedPrecondition, HasSubstr("CRIU's pre-dump step was asked for twice")));
  EXPECT_EQ(beforeFreezeCalls, 1);
  uint64_t count = child.count();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GT(child.count(), count) << "the child must run on after a failed checkpoint";
  EXPECT_FALSE(fs::exists(image));
  EXPECT_FALSE(partialLeft(image));
}

TEST(CheckpointHooks, FailingBeforeDumpRunsNoCriu) {
  CountingChild child;
  fs::path image = freshImagePath("before-fails");
  std::vector<std::string> calls;
  CheckpointOptions options;
  options.image = image;
  options.hooks.beforeDump = [&](image::ImageWriter&) {
    calls.push_back("beforeDump");
    return Status(Code::kUnavailable, "the GPU did not drain");
  };
  options.hooks.beforeFreeze = [&](image::ImageWriter&) {
    calls.push_back("beforeFreeze");
    return Status::ok();
  };
  options.hooks.whileFrozen = [&](image::ImageWriter&) {
    calls.push_back("whileFrozen");
    return Status::ok();
  };
  options.hooks.afterDump = [&](bool dumped) {
    calls.push_back(dumped ? "afterDump(true)" : "afterDump(false)");
  };
  EXPECT_THAT(checkpointProcess(child.pid(), options),
              StatusIs(Code::kUnavailable, HasSubstr("the GPU did not drain")));
  EXPECT_THAT(calls, ElementsAre("beforeDump", "afterDump(false)"));
  uint64_t count = child.count();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GT(child.count(), count) << "the child must run on";
  EXPECT_FALSE(fs::exists(image));
  EXPECT_FALSE(partialLeft(image));
}

TEST(CheckpointHooks, FailingBeforeRestoreRunsNoCriu) {
  CountingChild child;
  fs::path image = freshImagePath("before-restore-fails");
  CheckpointOptions options;
  options.image = image;
  ASSERT_THAT(checkpointProcess(child.pid(), options), IsOk());
  child.reap();
  bool afterCalled = false;
  RestoreOptions restore;
  restore.image = image;
  restore.beforeRestore = [](const image::ImageReader&) {
    return Status(Code::kFailedPrecondition, "no context in the pool");
  };
  restore.afterRestore = [&](std::optional<pid_t>) { afterCalled = true; };
  EXPECT_THAT(restoreProcess(restore),
              StatusIs(Code::kFailedPrecondition, HasSubstr("no context in the pool")));
  EXPECT_FALSE(afterCalled);
  EXPECT_NE(::kill(child.pid(), 0), 0) << "nothing may be restored";
  fs::remove_all(image);
}

}  // namespace
}  // namespace phos::checkpoint
