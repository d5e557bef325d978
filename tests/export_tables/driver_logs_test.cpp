// SPDX-License-Identifier: Apache-2.0
// The driver's error log (export_tables/driver_logs.h): what a failed call
// leaves in it, callbacks, iterators, a full buffer, CUDA_LOG_FILE; and
// vgpu's cuLogs* entry points over it.
#include <cuda.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "phos/export_tables/driver_logs.h"

namespace phos::driver_logs {
namespace {

std::string dumpAll(CUlogIterator* iterator = nullptr) {
  std::vector<char> buffer(2 * kBufferBytes);
  std::size_t size = buffer.size();
  EXPECT_EQ(dumpToMemory(iterator, buffer.data(), &size, 0), CUDA_SUCCESS);
  EXPECT_EQ(buffer[size], '\0');
  return std::string(buffer.data(), size);
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class DriverLogs : public ::testing::Test {
 protected:
  void SetUp() override { resetForTesting(); }
  void TearDown() override { resetForTesting(); }

  // What a driver logs for a call made with no context current.
  static void failOnce() {
    returning("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
              "no context is current to this thread");
  }
};

TEST_F(DriverLogs, AFailedCallSaysWhatWhyAndWhich) {
  EXPECT_EQ(dumpAll(), "");
  failOnce();
  const auto got = lines(dumpAll());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].starts_with("[")) << got[0];
  EXPECT_NE(got[0].find("][CUDA][E] Returning 201 (CUDA_ERROR_INVALID_CONTEXT) from cuCtxGetDevice: "),
            std::string::npos)
      << got[0];
}

TEST_F(DriverLogs, TheIteratorAdvancesPastWhatWasDumped) {
  failOnce();
  CUlogIterator it = 0;
  ASSERT_EQ(current(&it, 0), CUDA_SUCCESS);
  EXPECT_EQ(dumpAll(&it), "");
  failOnce();
  failOnce();
  EXPECT_EQ(lines(dumpAll(&it)).size(), 2u);
  EXPECT_EQ(dumpAll(&it), "");             // nothing new since
  EXPECT_EQ(lines(dumpAll()).size(), 3u);  // a null iterator dumps all
}

TEST_F(DriverLogs, CallbacksGetEachMessageUntilUnregistered) {
  struct Seen {
    std::vector<std::string> messages;
    std::vector<CUlogLevel> levels;
  } seen;
  auto callback = [](void* data, CUlogLevel level, char* message, std::size_t length) {
    auto* s = static_cast<Seen*>(data);
    s->messages.emplace_back(message, length);
    s->levels.push_back(level);
  };
  CUlogsCallbackHandle handle = nullptr;
  ASSERT_EQ(registerCallback(callback, &seen, &handle), CUDA_SUCCESS);
  ASSERT_NE(handle, nullptr);
  failOnce();
  ASSERT_EQ(seen.messages.size(), 1u);
  EXPECT_NE(seen.messages[0].find("Returning 201 (CUDA_ERROR_INVALID_CONTEXT) from cuCtxGetDevice"),
            std::string::npos);
  EXPECT_EQ(seen.levels[0], CU_LOG_LEVEL_ERROR);
  ASSERT_EQ(unregisterCallback(handle), CUDA_SUCCESS);
  failOnce();
  EXPECT_EQ(seen.messages.size(), 1u);
  EXPECT_EQ(unregisterCallback(handle), CUDA_ERROR_INVALID_VALUE);  // already gone
  EXPECT_EQ(registerCallback(nullptr, nullptr, &handle), CUDA_ERROR_INVALID_VALUE);
  // The handle is optional.
  EXPECT_EQ(registerCallback(callback, &seen, nullptr), CUDA_SUCCESS);
}

TEST_F(DriverLogs, BadArgumentsAreRefused) {
  char buffer[64];
  std::size_t size = sizeof(buffer);
  CUlogIterator it = 0;
  EXPECT_EQ(dumpToMemory(nullptr, nullptr, &size, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(dumpToMemory(nullptr, buffer, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(dumpToMemory(nullptr, buffer, &size, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(current(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(current(&it, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(dumpToFile(nullptr, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(dumpToFile(nullptr, "/nonexistent-directory/log.txt", 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(DriverLogs, ABufferTooSmallForAnyMessageGetsNothing) {
  failOnce();
  char buffer[16];
  std::size_t size = sizeof(buffer);
  EXPECT_EQ(dumpToMemory(nullptr, buffer, &size, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(size, 0u);
}

TEST_F(DriverLogs, ABufferThatHoldsSomeGetsTheNewestAndSaysSo) {
  for (int i = 0; i < 10; ++i) failOnce();
  const auto all = lines(dumpAll());
  ASSERT_EQ(all.size(), 10u);
  // Room for about three messages: a head line says the rest are left out,
  // and the last line is the most recent message.
  std::vector<char> buffer(3 * (all[0].size() + 1) + 40);
  std::size_t size = buffer.size();
  ASSERT_EQ(dumpToMemory(nullptr, buffer.data(), &size, 0), CUDA_SUCCESS);
  const auto got = lines(std::string(buffer.data(), size));
  ASSERT_GE(got.size(), 2u);
  EXPECT_NE(got.front().find("older log messages were overwritten or did not fit"), std::string::npos) << got.front();
  EXPECT_EQ(got.back().substr(got.back().find(']')), all.back().substr(all.back().find(']')));
  EXPECT_LE(size, buffer.size() - 1);
}

TEST_F(DriverLogs, TheBufferKeepsTheNewestMessagesAndADumpSaysWhatWasLost) {
  CUlogIterator first = 0;
  ASSERT_EQ(current(&first, 0), CUDA_SUCCESS);
  const std::string filler(200, 'x');
  for (int i = 0; i < 400; ++i) record(CU_LOG_LEVEL_WARNING, filler + std::to_string(i));
  const auto got = lines(dumpAll(&first));
  ASSERT_GE(got.size(), 2u);
  EXPECT_NE(got.front().find("older log messages were overwritten"), std::string::npos) << got.front();
  EXPECT_TRUE(got.back().ends_with(filler + "399")) << got.back();
  EXPECT_NE(got.back().find("[CUDA][W]"), std::string::npos);
  std::size_t bytes = 0;
  for (std::size_t i = 1; i < got.size(); ++i) bytes += got[i].size() + 1;
  EXPECT_LE(bytes, kBufferBytes);
}

TEST_F(DriverLogs, DumpToFileAppendsAndAdvances) {
  const auto path = std::filesystem::temp_directory_path() / ("phos-driver-logs-" + std::to_string(getpid()));
  std::filesystem::remove(path);
  CUlogIterator it = 0;
  ASSERT_EQ(current(&it, 0), CUDA_SUCCESS);
  failOnce();
  ASSERT_EQ(dumpToFile(nullptr, path.c_str(), 0), CUDA_SUCCESS);
  failOnce();
  ASSERT_EQ(dumpToFile(&it, path.c_str(), 0), CUDA_SUCCESS);  // both messages since `it`
  ASSERT_EQ(dumpToFile(&it, path.c_str(), 0), CUDA_SUCCESS);  // nothing new
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(lines(text.str()).size(), 3u);
  std::filesystem::remove(path);
}

TEST_F(DriverLogs, CudaLogFileGetsEachMessageAsItHappens) {
  const auto path = std::filesystem::temp_directory_path() / ("phos-cuda-log-file-" + std::to_string(getpid()));
  std::filesystem::remove(path);
  setenv("CUDA_LOG_FILE", path.c_str(), 1);
  resetForTesting();
  failOnce();
  {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find("Returning 201 (CUDA_ERROR_INVALID_CONTEXT) from cuCtxGetDevice"), std::string::npos)
        << text.str();
  }
  unsetenv("CUDA_LOG_FILE");
  resetForTesting();
  std::filesystem::remove(path);
}

// vgpu's own log (its copy of the library): a call that fails there is in it.
TEST(VgpuDriverLogs, AFailedCallIsLoggedWithItsReason) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  CUlogIterator it = 0;
  ASSERT_EQ(cuLogsCurrent(&it, 0), CUDA_SUCCESS);
  std::vector<std::string> seen;
  auto callback = [](void* data, CUlogLevel, char* message, std::size_t length) {
    static_cast<std::vector<std::string>*>(data)->emplace_back(message, length);
  };
  CUlogsCallbackHandle handle = nullptr;
  ASSERT_EQ(cuLogsRegisterCallback(callback, &seen, &handle), CUDA_SUCCESS);
  CUdevice device;
  ASSERT_EQ(cuCtxGetDevice(&device), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(cuLogsUnregisterCallback(handle), CUDA_SUCCESS);
  std::vector<char> buffer(kBufferBytes);
  std::size_t size = buffer.size();
  ASSERT_EQ(cuLogsDumpToMemory(&it, buffer.data(), &size, 0), CUDA_SUCCESS);
  const auto got = lines(std::string(buffer.data(), size));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NE(got[0].find("[CUDA][E] Returning 201 (CUDA_ERROR_INVALID_CONTEXT) from cuCtxGetDevice: "),
            std::string::npos)
      << got[0];
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], got[0]);
  EXPECT_EQ(cuLogsDumpToMemory(nullptr, nullptr, &size, 0), CUDA_ERROR_INVALID_VALUE);
}

}  // namespace
}  // namespace phos::driver_logs
