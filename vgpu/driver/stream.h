// SPDX-License-Identifier: Apache-2.0
// Streams (ordered work queues run by a worker thread) and the events recorded into them.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "phos/common/status.h"

namespace phos::vgpu {

class Stream;
class CaptureSequence;

// "Run after item `seq` of `stream` has completed."
struct StreamDependency {
  std::shared_ptr<Stream> stream;
  std::uint64_t seq = 0;
};

// One stream: items run in order on the stream's own worker thread, each after
// its dependencies on other streams are complete. Sequence numbers start at 1;
// item n is complete once completed() >= n.
class Stream {
 public:
  enum class Kind { kLegacy, kPerThread, kCreated };
  using Work = std::function<Status()>;
  using ErrorHandler = std::function<void(const Status&)>;

  Stream(std::uint64_t id, Kind kind, unsigned flags, int priority, ErrorHandler onError);
  ~Stream();  // drains the queue, then joins the worker
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  std::uint64_t enqueue(Work work, std::vector<StreamDependency> dependencies);
  void wait(std::uint64_t seq) const;
  bool isComplete(std::uint64_t seq) const;
  std::uint64_t lastEnqueued() const;
  void waitIdle() const { wait(lastEnqueued()); }

  std::uint64_t id() const { return id_; }
  Kind kind() const { return kind_; }
  unsigned flags() const { return flags_; }
  int priority() const { return priority_.load(); }
  void setPriority(int priority) { priority_.store(priority); }
  // The stream attributes it keeps (cuStreamSetAttribute; the entry point
  // checks ids and values): a zero value for an id never set, except those
  // with another default (the synchronization policy, the domain map).
  // Priority is the stream's own (priority()).
  CUstreamAttrValue attribute(CUstreamAttrID id) const;
  void setAttribute(CUstreamAttrID id, const CUstreamAttrValue& value);
  // Whether this stream takes part in the legacy default stream's implicit
  // synchronization (everything but CU_STREAM_NON_BLOCKING streams).
  bool synchronizesWithLegacy() const;
  // The capture sequence the stream is part of (graph.h), null when it runs
  // the work it is given.
  std::shared_ptr<CaptureSequence> capture() const;
  void setCapture(std::shared_ptr<CaptureSequence> capture);

 private:
  struct Item {
    std::uint64_t seq;
    Work work;
    std::vector<StreamDependency> dependencies;
  };
  void run();

  const std::uint64_t id_;
  const Kind kind_;
  const unsigned flags_;
  std::atomic<int> priority_;
  // By attribute id (CUlaunchAttributeID's stream ids are all below 17).
  static constexpr std::size_t kAttributeIds = 17;
  mutable std::mutex attributesMutex_;
  std::array<CUstreamAttrValue, kAttributeIds> attributes_;
  const ErrorHandler onError_;
  mutable std::mutex captureMutex_;
  std::shared_ptr<CaptureSequence> capture_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::deque<Item> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

// The state of one cuEventRecord: where it was recorded and when it completed.
struct EventRecord {
  std::shared_ptr<Stream> stream;
  std::uint64_t seq = 0;
  std::atomic<bool> completed{false};
  std::chrono::steady_clock::time_point time;
};

class Event {
 public:
  Event(std::uint64_t id, std::uint64_t context, unsigned flags)
      : id_(id), context_(context), flags_(flags) {}
  std::uint64_t id() const { return id_; }
  std::uint64_t context() const { return context_; }
  unsigned flags() const { return flags_; }
  std::shared_ptr<EventRecord> record() const;
  // A record outside capture replaces a record in capture, and the other way round.
  void setRecord(std::shared_ptr<EventRecord> record);
  // Recorded in a capture: the nodes it stands for there (graph.h).
  struct CapturedRecord {
    std::weak_ptr<CaptureSequence> capture;
    std::vector<std::uint64_t> nodes;
  };
  std::optional<CapturedRecord> capturedRecord() const;
  void setCapturedRecord(CapturedRecord record);

 private:
  const std::uint64_t id_;
  const std::uint64_t context_;
  const unsigned flags_;
  mutable std::mutex mutex_;
  std::shared_ptr<EventRecord> record_;
  std::optional<CapturedRecord> captured_;
};

}  // namespace phos::vgpu
