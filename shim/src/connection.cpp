// SPDX-License-Identifier: Apache-2.0
// Attaching to phosd, and the shim's view of its session.
#include "connection.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "phos/common/ipc/control.h"
#include "phos/common/log.h"

namespace phos::shim {

Connection& Connection::instance() {
  // Never destroyed: application threads may still call in during exit.
  static Connection* c = new Connection();
  return *c;
}

CUresult Connection::connect() {
  std::lock_guard lock(connectMutex_);
  if (ring_.has_value()) return CUDA_SUCCESS;
  auto log = log::get("shim");
  socketPath_ = ipc::controlSocketPath(ipc::runtimeDir());
  nlohmann::json request{{"op", "attach"}, {"pid", getpid()}};
  // PHOS_VALIDATE=1 (phos run --validate): every launch runs as its validator
  // twin, for users checking that speculation holds for their program.
  if (const char* v = std::getenv("PHOS_VALIDATE"); v != nullptr && std::string_view(v) == "1") {
    request["validate"] = true;
  }
  // phosd hands the session to a spare worker, and waits up to 30 s for one
  // when none is ready: wait a little longer than that.
  auto answer = ipc::controlRequest(socketPath_, request.dump(), std::chrono::seconds(40));
  if (!answer.isOk()) {
    log->error("cuInit: {} (start one with `phos daemon`, or run the program with `phos run`)",
               answer.status().message());
    return CUDA_ERROR_NO_DEVICE;
  }
  auto reply = nlohmann::json::parse(*answer, nullptr, false);
  if (reply.is_discarded() || !reply.is_object() || !reply.value("ok", false) || !reply.contains("ring") ||
      !reply["ring"].is_string()) {
    log->error("cuInit: phosd at {} refused the session: {}", socketPath_, *answer);
    return CUDA_ERROR_NO_DEVICE;
  }
  auto ring = ipc::CallRing::open(reply["ring"].get<std::string>());
  if (!ring.isOk()) {
    log->error("cuInit: cannot map the session's ring: {}", ring.status().message());
    return CUDA_ERROR_NO_DEVICE;
  }
  session_ = reply.value("session", uint64_t{0});
  ring_.emplace(std::move(*ring));
  log->info("attached to phosd at {} (session {})", socketPath_, session_);
  return CUDA_SUCCESS;
}

void Connection::addContext(uint64_t id, int device) {
  std::unique_lock lock(mutex_);
  contexts_[id] = device;
}

void Connection::removeContext(uint64_t id) {
  std::unique_lock lock(mutex_);
  contexts_.erase(id);
}

std::optional<int> Connection::contextDevice(uint64_t id) const {
  std::shared_lock lock(mutex_);
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return std::nullopt;
  return it->second;
}

bool Connection::knownContext(uint64_t id) const {
  std::shared_lock lock(mutex_);
  return contexts_.contains(id);
}

void Connection::addPinned(const Pinned& p) {
  std::unique_lock lock(mutex_);
  pinned_[p.address] = p;
}

std::optional<Connection::Pinned> Connection::removePinned(uintptr_t address) {
  std::unique_lock lock(mutex_);
  auto it = pinned_.find(address);
  if (it == pinned_.end()) return std::nullopt;
  Pinned p = it->second;
  pinned_.erase(it);
  return p;
}

std::vector<Connection::Pinned> Connection::removePinnedWithin(uintptr_t address, size_t bytes) {
  std::unique_lock lock(mutex_);
  std::vector<Pinned> gone;
  auto it = pinned_.lower_bound(address);
  if (it != pinned_.begin() &&
      std::prev(it)->second.address + std::prev(it)->second.mapped > address)
    --it;
  while (it != pinned_.end() && it->first < address + bytes) {
    gone.push_back(it->second);
    it = pinned_.erase(it);
  }
  return gone;
}

std::vector<Connection::Pinned> Connection::removeRegisteredIn(uint64_t context) {
  std::unique_lock lock(mutex_);
  std::vector<Pinned> gone;
  for (auto it = pinned_.begin(); it != pinned_.end();) {
    if (context != 0 && it->second.registeredIn == context) {
      gone.push_back(it->second);
      it = pinned_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

bool Connection::overlapsPinned(uintptr_t address, size_t bytes) const {
  std::shared_lock lock(mutex_);
  auto it = pinned_.lower_bound(address);
  if (it != pinned_.end() && it->first < address + bytes) return true;
  return it != pinned_.begin() &&
         std::prev(it)->second.address + std::prev(it)->second.mapped > address;
}

bool Connection::isPinned(uintptr_t p, size_t bytes) const {
  std::shared_lock lock(mutex_);
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return false;
  --it;
  const Pinned& r = it->second;
  return p - r.address < r.bytes && bytes <= r.bytes - (p - r.address);
}

void Connection::primaryRetained(int device, uint64_t context) {
  std::unique_lock lock(mutex_);
  PrimaryRef& p = primaries_[device];
  p.context = context;
  ++p.refs;
  p.state.reset();
}

uint64_t Connection::primaryReleased(int device) {
  std::unique_lock lock(mutex_);
  PrimaryRef& p = primaries_[device];
  p.state.reset();
  if (p.refs == 0 || --p.refs != 0) return 0;
  return p.context;
}

uint64_t Connection::primaryReset(int device) {
  std::unique_lock lock(mutex_);
  PrimaryRef& p = primaries_[device];
  p.state.reset();
  const uint64_t gone = p.refs != 0 ? p.context : 0;
  p.refs = 0;
  return gone;
}

std::optional<Connection::PrimaryState> Connection::primaryState(int device) const {
  std::shared_lock lock(mutex_);
  auto it = primaries_.find(device);
  if (it == primaries_.end()) return std::nullopt;
  return it->second.state;
}

void Connection::setPrimaryState(int device, PrimaryState state) {
  std::unique_lock lock(mutex_);
  primaries_[device].state = state;
}

void Connection::forgetPrimaryState(int device) {
  std::unique_lock lock(mutex_);
  primaries_[device].state.reset();
}

std::optional<std::vector<uint32_t>> Connection::paramSizes(uint64_t function) const {
  std::shared_lock lock(mutex_);
  auto it = paramSizes_.find(function);
  if (it == paramSizes_.end()) return std::nullopt;
  return it->second;
}

void Connection::setParamSizes(uint64_t function, std::vector<uint32_t> sizes) {
  std::unique_lock lock(mutex_);
  paramSizes_[function] = std::move(sizes);
}

std::optional<Connection::LaneClaim> Connection::claimLane() {
  if (!ring_.has_value()) return std::nullopt;
  const uint32_t lanes = ring_->geometry().laneCount;
  uint32_t inUse = lanesInUse_.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < lanes; ++i) {
    const uint32_t bit = 1u << i;
    if ((inUse & bit) != 0) continue;
    if ((lanesInUse_.fetch_or(bit, std::memory_order_acquire) & bit) == 0) return LaneClaim(lanesInUse_, i, ring_->lane(i));
    inUse = lanesInUse_.load(std::memory_order_relaxed);
  }
  return std::nullopt;
}

const char* Connection::intern(std::string_view value) {
  std::unique_lock lock(mutex_);
  auto it = strings_.find(value);
  if (it == strings_.end()) it = strings_.emplace(value).first;
  return it->c_str();
}

void Connection::forgetAfterFork() {
  // The child holds copies of the parent's mappings; only drop our records
  // (the mutexes may have been held by another thread at fork time).
  new (&connectMutex_) std::mutex();
  new (&mutex_) std::shared_mutex();
  ring_.reset();
  session_ = 0;
  lanesInUse_.store(0);
  contexts_.clear();
  primaries_.clear();
  paramSizes_.clear();
}

std::vector<uint64_t>& contextStack() {
  thread_local std::vector<uint64_t> stack;
  return stack;
}

uint64_t threadId() {
  thread_local uint64_t tid = static_cast<uint64_t>(syscall(SYS_gettid));
  return tid;
}

}  // namespace phos::shim
