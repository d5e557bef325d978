// SPDX-License-Identifier: Apache-2.0
// The stream worker loop and event bookkeeping.
#include "stream.h"

#include <cuda.h>

namespace phos::vgpu {

Stream::Stream(std::uint64_t id, Kind kind, unsigned flags, int priority, ErrorHandler onError)
    : id_(id), kind_(kind), flags_(flags), priority_(priority), onError_(std::move(onError)) {
  attributes_.fill(CUstreamAttrValue{});
  // A new stream's defaults: the automatic synchronization policy, and
  // kernels of the default domain in domain 0, of the remote domain in
  // another ("By default, kernels are launched in domain 0. Kernel launched
  // with CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE will have a different domain ID").
  // Not checked against NVIDIA's driver yet (no GPU in these sessions).
  attributes_[CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY].syncPolicy = CU_SYNC_POLICY_AUTO;
  attributes_[CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP].memSyncDomainMap = {0, 1};
  worker_ = std::thread([this] { run(); });
}

CUstreamAttrValue Stream::attribute(CUstreamAttrID id) const {
  std::lock_guard lock(attributesMutex_);
  return static_cast<std::size_t>(id) < kAttributeIds ? attributes_[id] : CUstreamAttrValue{};
}

void Stream::setAttribute(CUstreamAttrID id, const CUstreamAttrValue& value) {
  std::lock_guard lock(attributesMutex_);
  if (static_cast<std::size_t>(id) < kAttributeIds) attributes_[id] = value;
}

Stream::~Stream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) {
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();  // the last reference was dropped by our own work item
    } else {
      worker_.join();
    }
  }
}

bool Stream::synchronizesWithLegacy() const {
  return kind_ != Kind::kCreated || (flags_ & CU_STREAM_NON_BLOCKING) == 0;
}

std::uint64_t Stream::enqueue(Work work, std::vector<StreamDependency> dependencies) {
  std::uint64_t seq;
  {
    std::lock_guard lock(mutex_);
    seq = ++enqueued_;
    queue_.push_back(Item{seq, std::move(work), std::move(dependencies)});
  }
  changed_.notify_all();
  return seq;
}

void Stream::wait(std::uint64_t seq) const {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return completed_ >= seq; });
}

bool Stream::isComplete(std::uint64_t seq) const {
  std::lock_guard lock(mutex_);
  return completed_ >= seq;
}

std::uint64_t Stream::lastEnqueued() const {
  std::lock_guard lock(mutex_);
  return enqueued_;
}

void Stream::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything enqueued has run
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    const std::uint64_t seq = item.seq;
    for (const StreamDependency& dep : item.dependencies) {
      if (dep.stream) dep.stream->wait(dep.seq);
    }
    Status status = item.work ? item.work() : Status::ok();
    if (!status.isOk() && onError_) onError_(status);
    // Drop captured state (which may own streams) before reporting completion.
    item = Item{};
    {
      std::lock_guard lock(mutex_);
      completed_ = std::max(completed_, seq);
    }
    changed_.notify_all();
  }
}

std::shared_ptr<EventRecord> Event::record() const {
  std::lock_guard lock(mutex_);
  return record_;
}

void Event::setRecord(std::shared_ptr<EventRecord> record) {
  std::lock_guard lock(mutex_);
  record_ = std::move(record);
  captured_.reset();
}

std::optional<Event::CapturedRecord> Event::capturedRecord() const {
  std::lock_guard lock(mutex_);
  return captured_;
}

void Event::setCapturedRecord(CapturedRecord record) {
  std::lock_guard lock(mutex_);
  captured_ = std::move(record);
}

std::shared_ptr<CaptureSequence> Stream::capture() const {
  std::lock_guard lock(captureMutex_);
  return capture_;
}

void Stream::setCapture(std::shared_ptr<CaptureSequence> capture) {
  std::lock_guard lock(captureMutex_);
  capture_ = std::move(capture);
}

}  // namespace phos::vgpu
