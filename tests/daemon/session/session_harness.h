// SPDX-License-Identifier: Apache-2.0
// Sessions of phosd served on vgpu inside a test process, and a stand-in
// application they serve: what the daemon's tests of the ring's decoders
// (remoting/ring_decoder_test.cpp) and of the checkpoint protocols
// (protocols_test.cpp) drive. One test file per binary includes it.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "session/context_pool.h"
#include "session/driver_table.h"
#include "phos/common/ipc/call_ring.h"
#include "phos/common/ipc/transfer_lane.h"
#include "ring_requests.h"
#include "session/server_call.h"
#include "session/session.h"

namespace phos::daemon {
namespace {

using cuda_api::EntryPointId;
using fuzz::kAppPtx;
using fuzz::kAppScratch;
using fuzz::kModulePtx;
using fuzz::RequestBuilder;

// cuModuleLoadData of `bytes` of the application's memory at `address`.
wire::cuModuleLoadData_Request moduleLoad(uint64_t address, uint64_t bytes) { return {true, {address, bytes}}; }

// A stand-in application: this test binary executed again, which maps the
// module's PTX and scratch memory at fuzz::kAppBase and waits. A fresh
// executable, not a fork: a forked child would hold copies of the driver's
// mappings, which a real client never has.
constexpr char kApplicationEnv[] = "PHOS_RING_TEST_APPLICATION=1";

[[gnu::constructor]] void runAsStandInApplication() {
  const char* role = std::getenv("PHOS_RING_TEST_APPLICATION");
  if (role == nullptr) return;
  void* p = mmap(reinterpret_cast<void*>(fuzz::kAppBase), fuzz::kAppBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != reinterpret_cast<void*>(fuzz::kAppBase)) _exit(1);
  std::memcpy(p, kModulePtx.data(), kModulePtx.size());
  for (;;) pause();
}

class Application {
 public:
  Application() {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      char* const env[] = {const_cast<char*>(kApplicationEnv), nullptr};
      execle("/proc/self/exe", "ring_decoder_application", static_cast<char*>(nullptr), env);
      _exit(127);
    }
    // Ready once its memory holds the PTX.
    for (int i = 0; i < 500 && pid_ > 0; ++i) {
      auto head = read(kAppPtx, 8);
      if (!head.empty() && std::memcmp(head.data(), kModulePtx.data(), 8) == 0) return;
      usleep(10000);
    }
    stop();
  }
  ~Application() { stop(); }
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }
  std::vector<uint8_t> read(uint64_t address, size_t bytes) const {
    std::vector<uint8_t> out(bytes);
    iovec local{out.data(), bytes};
    iovec remote{reinterpret_cast<void*>(address), bytes};
    if (process_vm_readv(pid_, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(bytes)) out.clear();
    return out;
  }
  bool write(uint64_t address, const std::vector<uint8_t>& bytes) const {
    iovec local{const_cast<uint8_t*>(bytes.data()), bytes.size()};
    iovec remote{reinterpret_cast<void*>(address), bytes.size()};
    return process_vm_writev(pid_, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(bytes.size());
  }

 private:
  pid_t pid_ = -1;
};

// What every session of this process shares, as in phosd: the driver, the
// context pool and the server functions.
struct Daemon {
  DriverTable* driver = nullptr;
  std::unique_ptr<ContextPool> pool;
  ServerTable servers{};
  std::string error;

  Daemon() {
    auto d = DriverTable::load(PHOS_VGPU_DRIVER);
    if (!d.isOk()) {
      error = d.status().message();
      return;
    }
    driver = *d;
    pool = std::make_unique<ContextPool>(*driver, 1);
    generated::installGenerated(servers);
  }
};

Daemon& daemonState() {
  static Daemon* d = new Daemon();  // the driver stays loaded for the process
  return *d;
}

struct Reply {
  CUresult result = CUDA_ERROR_UNKNOWN;
  std::vector<std::byte> bytes;
  // The u64 after the result (and after a presence byte for generated calls).
  uint64_t value(bool presence = false) const {
    ipc::Decoder d(bytes);
    (void)d.value<ipc::ReplyHeader>();
    if (presence) (void)d.u8();
    return d.u64();
  }
};

// A session served by its own thread, and the client end of its ring.
class Client {
 public:
  Client(uint64_t id, pid_t pid, ipc::RingGeometry geometry = {}) {
    Daemon& d = daemonState();
    session_ = std::make_unique<Session>(id, pid, getuid(), *d.driver, *d.pool, d.servers, "/tmp");
    Status s = session_->start(geometry);
    EXPECT_TRUE(s.isOk()) << s.message();
    auto ring = ipc::CallRing::open(session_->ringPath());
    EXPECT_TRUE(ring.isOk()) << ring.status().message();
    if (ring.isOk()) ring_.emplace(std::move(*ring));
  }
  ~Client() {
    ring_.reset();
    session_->stop();
  }

  Reply call(std::span<const std::byte> request) {
    Reply r;
    r.bytes.resize(ring_->payloadCapacity());
    auto n = ring_->call(request, r.bytes);
    EXPECT_TRUE(n.isOk()) << n.status().message();
    if (!n.isOk()) return r;
    r.bytes.resize(*n);
    if (*n >= sizeof(ipc::ReplyHeader)) {
      ipc::ReplyHeader h;
      std::memcpy(&h, r.bytes.data(), sizeof(h));
      r.result = static_cast<CUresult>(h.result);
    }
    return r;
  }
  Reply call(const RequestBuilder& b) { return call(b.span()); }
  // A call whose copy travels through a transfer lane: `meanwhile` is the
  // application's half.
  Reply call(const RequestBuilder& b, const ipc::CallRing::Meanwhile& meanwhile) {
    Reply r;
    r.bytes.resize(ring_->payloadCapacity());
    auto n = ring_->call(b.span(), r.bytes, meanwhile);
    EXPECT_TRUE(n.isOk()) << n.status().message();
    if (!n.isOk()) return r;
    r.bytes.resize(*n);
    ipc::ReplyHeader h;
    std::memcpy(&h, r.bytes.data(), sizeof(h));
    r.result = static_cast<CUresult>(h.result);
    return r;
  }
  ipc::TransferLane lane(uint32_t index) const { return ring_->lane(index); }
  void post(const RequestBuilder& b) { ASSERT_TRUE(ring_->post(b.span()).isOk()); }

  // The objects most tests need.
  void setUpContext() {
    Reply r = call(RequestBuilder(EntryPointId::kCuDevicePrimaryCtxRetain, 0).message(wire::cuDevicePrimaryCtxRetain_Request{true, 0}));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    context = r.value(true);
    r = call(RequestBuilder(EntryPointId::kCuMemAlloc_v2, context).message(wire::cuMemAlloc_v2_Request{true, kBytes}));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    device = r.value(true);
  }
  void loadModule() {
    Reply r = call(RequestBuilder(EntryPointId::kCuModuleLoadData, context).message(moduleLoad(kAppPtx, kModulePtx.size())));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    module = r.value(true);
    r = call(RequestBuilder(EntryPointId::kCuModuleGetFunction, context).u8(1).u64(module).text("fill"));
    ASSERT_EQ(r.result, CUDA_SUCCESS);
    function = r.value(true);
  }
  // A valid call that must still succeed after whatever was sent before.
  void expectStillServing() {
    EXPECT_EQ(call(RequestBuilder(EntryPointId::kCuMemsetD8_v2, context).message(wire::cuMemsetD8_v2_Request{device, 1, kBytes})).result,
              CUDA_SUCCESS);
    Reply v = call(RequestBuilder(EntryPointId::kCuDriverGetVersion, context).u8(1));
    EXPECT_EQ(v.result, CUDA_SUCCESS);
    ipc::Decoder d(v.bytes);
    (void)d.value<ipc::ReplyHeader>();
    EXPECT_EQ(d.u8(), 1);
    EXPECT_GT(d.value<int32_t>(), 0);
  }
  RequestBuilder req(EntryPointId id) const { return RequestBuilder(id, context); }

  static constexpr uint64_t kBytes = 4096;
  uint64_t context = 0;
  uint64_t device = 0;
  uint64_t module = 0;
  uint64_t function = 0;
  Session& session() { return *session_; }

 private:
  std::unique_ptr<Session> session_;
  std::optional<ipc::CallRing> ring_;
};

}  // namespace
}  // namespace phos::daemon
