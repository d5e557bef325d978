// SPDX-License-Identifier: Apache-2.0
// The driver's error log (driver_logs.h).
#include "phos/export_tables/driver_logs.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace phos::driver_logs {
namespace {

struct Message {
  CUlogIterator sequence;
  CUlogLevel level;
  std::string text;  // one line, without its newline
};

struct Callback {
  std::uintptr_t id;
  CUlogsCallback function;
  void* userData;
};

struct Log {
  std::mutex mu;
  std::deque<Message> messages;
  std::size_t bytes = 0;           // of messages, each with its newline
  CUlogIterator next = 0;          // the sequence number of the next message
  std::vector<Callback> callbacks;
  std::uintptr_t nextCallbackId = 1;
  bool fileOpened = false;
  FILE* file = nullptr;            // CUDA_LOG_FILE
};

Log& log() {
  static Log* instance = new Log;  // never destroyed: atexit handlers may still log
  return *instance;
}

// Set while this thread runs a callback: what the callback's own failing
// calls log is kept, but not handed to the callbacks again.
thread_local bool tInCallback = false;

std::string stamp(CUlogLevel level) {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t seconds = system_clock::to_time_t(now);
  std::tm local{};
  localtime_r(&seconds, &local);
  const auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  return fmt::format("[{:02}:{:02}:{:02}.{:03}][{}][CUDA][{}]", local.tm_hour, local.tm_min, local.tm_sec, millis,
                     static_cast<long>(syscall(SYS_gettid)), level == CU_LOG_LEVEL_WARNING ? 'W' : 'E');
}

FILE* logFile(Log& l) {
  if (!l.fileOpened) {
    l.fileOpened = true;
    const char* target = std::getenv("CUDA_LOG_FILE");
    if (target != nullptr && *target != '\0') {
      const std::string t = target;
      l.file = t == "stdout" ? stdout : t == "stderr" ? stderr : std::fopen(target, "a");
    }
  }
  return l.file;
}

// The line a dump starts with when messages it should hold were dropped.
std::string droppedLine(CUlogIterator count) {
  return fmt::format("{} {} older log messages were overwritten or did not fit and are left out",
                     stamp(CU_LOG_LEVEL_WARNING), count);
}

// The messages from `iterator` (all when null), and how many of those asked
// for are gone. Called with the lock held.
std::vector<const Message*> since(const Log& l, const CUlogIterator* iterator, CUlogIterator* dropped) {
  const CUlogIterator oldest = l.messages.empty() ? l.next : l.messages.front().sequence;
  const CUlogIterator from = iterator != nullptr ? *iterator : oldest;
  *dropped = from < oldest ? oldest - from : 0;
  std::vector<const Message*> out;
  for (const Message& m : l.messages) {
    if (m.sequence >= from) out.push_back(&m);
  }
  return out;
}

}  // namespace

void record(CUlogLevel level, std::string_view message) {
  Log& l = log();
  std::string line = stamp(level) + " " + std::string(message);
  std::vector<Callback> callbacks;
  {
    std::lock_guard lock(l.mu);
    l.bytes += line.size() + 1;
    l.messages.push_back({l.next++, level, line});
    while (l.bytes > kBufferBytes && l.messages.size() > 1) {
      l.bytes -= l.messages.front().text.size() + 1;
      l.messages.pop_front();
    }
    if (FILE* f = logFile(l)) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fflush(f);
    }
    if (!tInCallback) callbacks = l.callbacks;
  }
  for (const Callback& c : callbacks) {
    tInCallback = true;
    std::string copy = line;  // the callback gets a char*, not ours to change
    c.function(c.userData, level, copy.data(), copy.size());
    tInCallback = false;
  }
}

void returning(std::string_view entryPoint, CUresult result, std::string_view name, std::string_view why) {
  record(CU_LOG_LEVEL_ERROR, why.empty() ? fmt::format("Returning {} ({}) from {}", static_cast<int>(result), name,
                                                       entryPoint)
                                         : fmt::format("Returning {} ({}) from {}: {}", static_cast<int>(result), name,
                                                       entryPoint, why));
}

CUresult registerCallback(CUlogsCallback callback, void* userData, CUlogsCallbackHandle* handleOut) {
  if (callback == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Log& l = log();
  std::lock_guard lock(l.mu);
  const std::uintptr_t id = l.nextCallbackId++;
  l.callbacks.push_back({id, callback, userData});
  if (handleOut != nullptr) *handleOut = reinterpret_cast<CUlogsCallbackHandle>(id);
  return CUDA_SUCCESS;
}

CUresult unregisterCallback(CUlogsCallbackHandle handle) {
  Log& l = log();
  std::lock_guard lock(l.mu);
  const auto id = reinterpret_cast<std::uintptr_t>(handle);
  for (auto it = l.callbacks.begin(); it != l.callbacks.end(); ++it) {
    if (it->id == id) {
      l.callbacks.erase(it);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult current(CUlogIterator* iteratorOut, unsigned int flags) {
  if (iteratorOut == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Log& l = log();
  std::lock_guard lock(l.mu);
  *iteratorOut = l.next;
  return CUDA_SUCCESS;
}

CUresult dumpToFile(CUlogIterator* iterator, const char* path, unsigned int flags) {
  if (path == nullptr || *path == '\0' || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Log& l = log();
  std::lock_guard lock(l.mu);
  FILE* f = std::fopen(path, "a");
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUlogIterator dropped = 0;
  const auto messages = since(l, iterator, &dropped);
  if (dropped != 0) std::fprintf(f, "%s\n", droppedLine(dropped).c_str());
  for (const Message* m : messages) std::fprintf(f, "%s\n", m->text.c_str());
  const bool written = std::fclose(f) == 0;
  if (iterator != nullptr) *iterator = l.next;
  return written ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult dumpToMemory(CUlogIterator* iterator, char* buffer, std::size_t* size, unsigned int flags) {
  if (buffer == nullptr || size == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Log& l = log();
  std::lock_guard lock(l.mu);
  CUlogIterator dropped = 0;
  const auto messages = since(l, iterator, &dropped);
  if (messages.empty()) {
    if (*size > 0) buffer[0] = '\0';
    *size = 0;
    if (iterator != nullptr) *iterator = l.next;
    return CUDA_SUCCESS;
  }
  // The newest messages that fit with the terminator; the last one written is
  // always the most recent, and a line at the head says what was left out.
  const std::size_t room = *size > 0 ? *size - 1 : 0;
  std::size_t used = 0, first = messages.size();
  while (first > 0 && used + messages[first - 1]->text.size() + 1 <= room) {
    used += messages[first - 1]->text.size() + 1;
    --first;
  }
  if (first == messages.size()) {
    *size = 0;
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::string out;
  const CUlogIterator leftOut = dropped + static_cast<CUlogIterator>(first);
  if (leftOut != 0) {
    // The head line takes the room of the oldest messages kept, if it must.
    std::string head = droppedLine(leftOut) + "\n";
    while (used + head.size() > room && first + 1 < messages.size()) {
      used -= messages[first]->text.size() + 1;
      ++first;
      head = droppedLine(dropped + static_cast<CUlogIterator>(first)) + "\n";
    }
    if (used + head.size() <= room) out = head;
  }
  for (std::size_t i = first; i < messages.size(); ++i) out += messages[i]->text + "\n";
  out.copy(buffer, out.size());
  buffer[out.size()] = '\0';
  *size = out.size();
  if (iterator != nullptr) *iterator = l.next;
  return CUDA_SUCCESS;
}

void resetForTesting() {
  Log& l = log();
  std::lock_guard lock(l.mu);
  l.messages.clear();
  l.bytes = 0;
  l.callbacks.clear();
  if (l.file != nullptr && l.file != stdout && l.file != stderr) std::fclose(l.file);
  l.file = nullptr;
  l.fileOpened = false;  // CUDA_LOG_FILE is read again
}

}  // namespace phos::driver_logs
