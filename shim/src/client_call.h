// SPDX-License-Identifier: Apache-2.0
// ClientCall: one Driver API call forwarded to phosd, the interface the
// generated and the handwritten shim functions are written against.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <span>

#include "phos/common/ipc/wire.h"
#include "phos/common/status.h"
#include "phos/cuda_api/dispatch.h"

namespace phos::shim {

// The decoded reply of a synchronous call.
class ReplyReader {
 public:
  ReplyReader(CUresult transportError) : result_(transportError), ok_(false), decoder_({}) {}
  ReplyReader(std::span<const std::byte> bytes);

  // False when the call failed before the driver ran (no daemon, malformed
  // reply); result() then says why.
  bool ok() const { return ok_; }
  CUresult result() const { return result_; }
  ipc::Decoder& decoder() { return decoder_; }

  // Outputs, in parameter order: a presence byte, then the value. A failed
  // call leaves the application's outputs as they were: the driver wrote
  // phosd's copies, never the application's memory.
  template <typename T>
  void out(T* p) {
    if (!decoder_.present()) return;
    T v = decoder_.value<T>();
    if (p != nullptr && result_ == CUDA_SUCCESS) *p = v;
  }
  template <typename H>
  void outHandle(H* p) {
    if (!decoder_.present()) return;
    uint64_t id = decoder_.u64();
    if (p != nullptr && result_ == CUDA_SUCCESS) *p = reinterpret_cast<H>(id);
  }
  // The driver's result. A failed call may come back without its outputs
  // (phosd refused it before the driver ran); a successful one without them
  // is malformed: CUDA_ERROR_UNKNOWN.
  CUresult finish() const { return decoder_.ok() || result_ != CUDA_SUCCESS ? result_ : CUDA_ERROR_UNKNOWN; }

 private:
  CUresult result_;
  bool ok_;
  ipc::Decoder decoder_;
};

// The application's pageable side of a copy, which may travel through one of
// the ring's transfer lanes (ipc/transfer_lane.h) instead of being read or
// written by phosd: the source of a copy to the device, the destination of
// one from it, or either of a copy between unified addresses (phosd, which
// knows the device side, says which).
struct LaneCopy {
  const void* src;  // a copy to the device reads it
  void* dst;        // a copy from the device writes it
  size_t bytes;
  static LaneCopy toDevice(const void* src, size_t bytes) { return {src, nullptr, bytes}; }
  static LaneCopy fromDevice(void* dst, size_t bytes) { return {nullptr, dst, bytes}; }
  static LaneCopy either(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    return {reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), reinterpret_cast<void*>(static_cast<uintptr_t>(dst)),
            bytes};
  }
};

class ClientCall {
 public:
  explicit ClientCall(cuda_api::EntryPointId id);
  ClientCall(const ClientCall&) = delete;
  ClientCall& operator=(const ClientCall&) = delete;

  ipc::Encoder& args() { return encoder_; }
  // Sends the call and waits for its reply.
  ReplyReader run();
  // The same for a copy whose host side may travel through a lane: copies of
  // at least kLaneMinBytes do when a lane is free.
  ReplyReader run(const LaneCopy& copy);
  static constexpr size_t kLaneMinBytes = 1u << 20;
  // Sends the call without waiting: CUDA_SUCCESS once it is in the ring.
  CUresult post();

  static uint64_t handleId(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }
  // How many stream captures the session has in progress, as phosd said at
  // the last cuStreamBeginCapture or cuStreamEndCapture: while any lasts,
  // post() waits for the answer (capture_hooks.cpp).
  static void setCapturesActive(uint32_t captures);

 private:
  CUresult ready() const;
  ReplyReader finishRun(Result<size_t> n, std::span<std::byte> reply);
  cuda_api::EntryPointId id_;
  ipc::Encoder encoder_;
};

namespace generated {
// Every remoted and local entry point (remote_client.cpp, generated from
// apigen/remoting.json).
void installGenerated(cuda_api::Dispatch& table);
int generatedCount();
}  // namespace generated

}  // namespace phos::shim
