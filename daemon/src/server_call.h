// SPDX-License-Identifier: Apache-2.0
// ServerCall: one remoted call being served in a session, the interface the
// generated and the handwritten server functions are written against.
#pragma once

#include <cuda.h>

#include <array>
#include <span>
#include <string>

#include "driver_table.h"
#include "handle_types.h"
#include "phos/common/ipc/wire.h"
#include "phos/cuda_api/dispatch.h"

namespace phos::daemon {

class Session;
class ServerCall;

using ServerFn = void (*)(ServerCall&);
using ServerTable = std::array<ServerFn, cuda_api::kEntryPointCount>;

class ServerCall {
 public:
  ServerCall(Session& session, const ipc::CallHeader& header, std::span<const std::byte> args,
             bool expectsReply, std::span<std::byte> replyBuffer);

  Session& session() { return session_; }
  const ipc::CallHeader& header() const { return header_; }
  cuda_api::EntryPointId entry() const { return static_cast<cuda_api::EntryPointId>(header_.entry); }
  bool expectsReply() const { return expectsReply_; }
  ipc::Decoder& args() { return args_; }

  // True when every argument was read and nothing is left over. Otherwise
  // answers CUDA_ERROR_INVALID_VALUE (a malformed message) and returns false.
  bool argumentsComplete();

  // Translates a virtual handle (0 is NULL). An unknown id is answered with
  // CUDA_ERROR_INVALID_CONTEXT (contexts) or CUDA_ERROR_INVALID_HANDLE, and
  // the driver is never called with it.
  template <typename T>
  bool resolve(HandleType type, uint64_t id, T* out) {
    void* real = nullptr;
    if (!resolveRaw(type, id, &real)) return false;
    *out = static_cast<T>(real);
    return true;
  }
  bool resolveRaw(HandleType type, uint64_t id, void** out);
  // Streams: 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are not ids. The
  // per-thread default stream of the calling application thread is a stream
  // of the session's own (phosd serves many application threads from one).
  bool resolveStream(uint64_t id, bool perThreadVariant, CUstream* out);
  // A device address the session may name: inside one of its allocations or
  // pinned host ranges, or 0. Otherwise CUDA_ERROR_INVALID_VALUE.
  bool checkDevicePointer(CUdeviceptr p);
  // [p, p+bytes) inside one allocation or pinned range of the session.
  bool checkDeviceRange(CUdeviceptr p, size_t bytes);

  template <typename Fn>
  Fn driver(cuda_api::EntryPointId id) const {
    return driver_.get<Fn>(id);
  }
  const DriverTable& driverTable() const { return driver_; }

  // Starts the reply with `result`; the returned encoder takes the outputs.
  ipc::Encoder& reply(CUresult result);
  uint64_t exportHandle(HandleType type, CUresult result, void* real);
  // Sends the reply (or, for a posted call, keeps a failure for the next
  // synchronizing call, where CUDA reports asynchronous errors).
  void send();
  // reply(result) + send().
  void fail(CUresult result);
  bool answered() const { return sent_; }
  std::span<const std::byte> replyBytes() const { return replyEncoder_.written(); }

  static std::string text(std::span<const std::byte> bytes) {
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

 private:
  Session& session_;
  const DriverTable& driver_;
  ipc::CallHeader header_;
  ipc::Decoder args_;
  bool expectsReply_;
  std::span<std::byte> replyBuffer_;
  ipc::Encoder replyEncoder_;
  CUresult result_ = CUDA_SUCCESS;
  bool sent_ = false;
};

namespace generated {
void installGenerated(ServerTable& table);
int generatedCount();
}  // namespace generated

// The handwritten server functions (custom_calls.cpp) over the generated ones.
void installCustom(ServerTable& table);

}  // namespace phos::daemon
