// SPDX-License-Identifier: Apache-2.0
// The context pool.
#include "session/context_pool.h"

#include <chrono>
#include <utility>

#include "phos/common/log.h"

namespace phos::daemon {

ContextPool::ContextPool(const DriverTable& driver, int perDevice) : driver_(driver), perDevice_(perDevice) {
  int count = 0;
  if (PHOS_DRIVER(driver_, DeviceGetCount)(&count) != CUDA_SUCCESS) count = 0;
  free_.resize(static_cast<size_t>(count));
  for (int d = 0; d < count; ++d) {
    for (int i = 0; i < perDevice_; ++i) {
      auto ctx = create(d, 0);
      if (!ctx.isOk()) {
        log::get("daemon")->warn("context pool: {}", ctx.status().message());
        break;
      }
      free_[static_cast<size_t>(d)].push_back(*ctx);
    }
  }
  refiller_ = std::thread([this] { refill(); });
}

ContextPool::~ContextPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  refiller_.join();
  for (auto& device : free_) {
    for (CUcontext c : device) PHOS_DRIVER(driver_, CtxDestroy_v2)(c);
  }
}

Result<CUcontext> ContextPool::create(int device, unsigned flags) {
  CUdevice dev = 0;
  if (CUresult r = PHOS_DRIVER(driver_, DeviceGet)(&dev, device); r != CUDA_SUCCESS) {
    return makeError(Code::kInvalidArgument, "no device {} (CUresult {})", device, static_cast<int>(r));
  }
  CUcontext ctx = nullptr;
  if (CUresult r = PHOS_DRIVER(driver_, CtxCreate_v2)(&ctx, flags, dev); r != CUDA_SUCCESS) {
    return makeError(Code::kResourceExhausted, "cuCtxCreate on device {} failed (CUresult {})", device,
                     static_cast<int>(r));
  }
  // cuCtxCreate made it current on this thread; a pooled context is current nowhere.
  CUcontext popped = nullptr;
  PHOS_DRIVER(driver_, CtxPopCurrent_v2)(&popped);
  return ctx;
}

Result<CUcontext> ContextPool::take(int device, unsigned flags) {
  {
    std::lock_guard lock(mutex_);
    if (device < 0 || static_cast<size_t>(device) >= free_.size()) {
      return makeError(Code::kInvalidArgument, "no device {}", device);
    }
    auto& pool = free_[static_cast<size_t>(device)];
    taken_ = true;
    // Pooled contexts have the default flags; a context with other flags is
    // created on demand (cuCtxSetFlags cannot change every flag afterwards).
    if (flags == 0 && !pool.empty()) {
      CUcontext c = pool.back();
      pool.pop_back();
      return c;
    }
    ++misses_;
  }
  return create(device, flags);
}

void ContextPool::retire(CUcontext context, int device) {
  {
    std::lock_guard lock(mutex_);
    retired_.emplace_back(context, device);
  }
  wake_.notify_all();
}

void ContextPool::hold(int delta) {
  {
    std::lock_guard lock(mutex_);
    holds_ += delta;
  }
  wake_.notify_all();
}

void ContextPool::refill() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] {
      if (stop_ || (!retired_.empty() && holds_ == 0)) return true;
      // Contexts the constructor could not create, until a session takes one.
      for (const auto& pool : free_) {
        if (!taken_ && static_cast<int>(pool.size()) < perDevice_) return true;
      }
      return false;
    });
    if (stop_) return;
    std::vector<std::pair<CUcontext, int>> retired;
    if (holds_ == 0) retired = std::exchange(retired_, {});
    lock.unlock();
    for (auto [ctx, device] : retired) PHOS_DRIVER(driver_, CtxDestroy_v2)(ctx);
    lock.lock();
    for (size_t d = 0; d < free_.size(); ++d) {
      while (!stop_ && !taken_ && static_cast<int>(free_[d].size()) < perDevice_) {
        lock.unlock();
        auto ctx = create(static_cast<int>(d), 0);
        if (!ctx.isOk()) {
          // Out of memory or a broken device: try again later, not in a loop.
          log::get("daemon")->warn("context pool refill: {}", ctx.status().message());
          std::this_thread::sleep_for(std::chrono::seconds(1));
          lock.lock();
          break;
        }
        lock.lock();
        free_[d].push_back(*ctx);
      }
    }
  }
}

std::vector<ContextPool::Stats> ContextPool::stats() const {
  std::lock_guard lock(mutex_);
  std::vector<Stats> out;
  for (size_t d = 0; d < free_.size(); ++d) {
    out.push_back({static_cast<int>(d), static_cast<int>(free_[d].size()), perDevice_});
  }
  return out;
}

uint64_t ContextPool::misses() const {
  std::lock_guard lock(mutex_);
  return misses_;
}

}  // namespace phos::daemon
