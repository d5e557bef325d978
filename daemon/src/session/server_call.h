// SPDX-License-Identifier: Apache-2.0
// ServerCall: one remoted call being served in a session, the interface the
// generated and the handwritten server functions are written against.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "phos/common/ipc/transfer_lane.h"
#include "phos/common/ipc/wire.h"
#include "phos/common/ipc/wire_codec.h"
#include "phos/cuda_api/dispatch.h"
#include "phos/cuda_api/handle_types.h"
#include "session/driver_table.h"

namespace phos::daemon {

class Session;
class ServerCall;

using ServerFn = void (*)(ServerCall&);
using ServerTable = std::array<ServerFn, cuda_api::kEntryPointCount>;

// A handle argument as a server hook receives it: the virtual id the
// application holds and the driver object it stands for (null for id 0).
template <typename T>
struct Handle {
  uint64_t id = 0;
  T real{};
};

// A value whose size depends on what is asked (a pointer attribute): at most
// 64 bytes, sized by the server hook.
struct AttributeValue {
  alignas(16) std::array<std::byte, 64> bytes{};
  size_t size = 0;
  bool wanted = true;  // the application asked for it (a null slot in a batch is not)
  ipc::Blob blob(CUresult result) const { return ipc::Blob::of(bytes.data(), result == CUDA_SUCCESS ? size : 0); }
};

class ServerCall {
 public:
  ServerCall(Session& session, const ipc::CallHeader& header, std::span<const std::byte> args,
             bool expectsReply, std::span<std::byte> replyBuffer);

  Session& session() { return session_; }
  const ipc::CallHeader& header() const { return header_; }
  cuda_api::EntryPointId entry() const { return static_cast<cuda_api::EntryPointId>(header_.entry); }
  bool expectsReply() const { return expectsReply_; }
  // The transfer lane that carries the application's side of this copy
  // (ipc::kCallThroughLane), if the call names one the session has.
  std::optional<ipc::TransferLane> lane() const;
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
  // A function: a CUfunction id, or a CUkernel id ("a CUkernel can be passed
  // wherever a CUfunction is expected"), resolved in the current context.
  bool resolveFunction(uint64_t id, CUfunction* out);
  // True for a _ptds/_ptsz entry point (its default stream is per thread).
  bool perThreadEntry() const;
  // A device address the session may name: inside one of its allocations or
  // pinned host ranges, or 0. Otherwise CUDA_ERROR_INVALID_VALUE.
  bool checkDevicePointer(CUdeviceptr p);
  // [p, p+bytes) inside one allocation or pinned range of the session.
  bool checkDeviceRange(CUdeviceptr p, size_t bytes);

  // Stream capture (docs/remoting.md): what phosd serves with more than the
  // one driver call on the stream (a copy of pageable memory through its
  // staging, a stream-ordered allocation from the session's heap, a host
  // function through its queue) cannot be captured. On a capturing stream
  // this invalidates the capture and gives the answer CUDA gives an
  // operation a capture does not support; std::nullopt when `stream` is not
  // capturing.
  std::optional<CUresult> refuseInCapture(CUstream stream);
  // Whether work enqueued on `stream` now is captured rather than run.
  bool capturing(CUstream stream);
  // A potentially unsafe call (an allocation or a free that phosd serves
  // itself) while CUDA prohibits them in the calling application thread:
  // its own strict captures invalidated, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
  std::optional<CUresult> refuseUnsafeInCapture();

  template <typename Fn>
  Fn driver(cuda_api::EntryPointId id) const {
    return driver_.get<Fn>(id);
  }
  const DriverTable& driverTable() const { return driver_; }

  // An out array of `count` elements the server fills for a generated call
  // (never a null pointer, so the driver sees one where the application
  // passed one): sized if it fits in half a reply (a ring slot); otherwise
  // answers CUDA_ERROR_INVALID_VALUE and returns false.
  template <typename T, typename N>
  bool sizeOutArray(std::vector<T>* items, N count) {
    const uint64_t n = count > 0 ? static_cast<uint64_t>(count) : 0;
    if (n > replyBuffer_.size() / 2 / sizeof(T)) {
      fail(CUDA_ERROR_INVALID_VALUE);
      return false;
    }
    items->resize(std::max<uint64_t>(n, 1));
    return true;
  }

  // An array of `count` handle ids (the blob holds exactly that many), each
  // translated as resolve() does; on failure the call is answered.
  template <typename T, typename N>
  bool resolveAll(HandleType type, const ipc::Blob& ids, N count, std::vector<T>* out) {
    std::vector<uint64_t> id;
    if (!ids.copyTo(&id, count > 0 ? static_cast<size_t>(count) : 0)) {
      fail(CUDA_ERROR_INVALID_VALUE);
      return false;
    }
    out->resize(id.size());
    for (size_t i = 0; i < id.size(); ++i) {
      if (!resolve(type, id[i], &(*out)[i])) return false;
    }
    return true;
  }
  // An out array whose count the driver updates (cuGraphGetNodes): sized to
  // the count the application passed, which is lowered to what half a reply
  // carries (the driver then fills that many and says how many there are).
  template <typename T>
  bool sizeOutList(std::vector<T>* items, ipc::Optional<size_t>* count) {
    const size_t most = replyBuffer_.size() / 2 / sizeof(uint64_t);
    if (count->present) count->value = std::min(count->value, most);
    items->resize(std::max<size_t>(count->present ? count->value : 0, 1));
    return true;
  }
  // A filled out list of driver objects as handle ids (NULL entries as 0).
  template <typename T>
  ipc::Blob exportList(HandleType type, const std::vector<T>& items, CUresult result) {
    std::vector<uint64_t>& ids = exported_.emplace_back();
    if (result == CUDA_SUCCESS) {
      for (T item : items) ids.push_back(item == nullptr ? 0 : exportHandle(type, result, item));
    }
    return ipc::Blob::of(ids.data(), ids.size() * sizeof(uint64_t));
  }

  // Starts the reply with `result`; the returned encoder takes the outputs.
  ipc::Encoder& reply(CUresult result);
  uint64_t exportHandle(HandleType type, CUresult result, void* real);
  // Sends the reply (or, for a posted call, keeps a failure for the next
  // synchronizing call, where CUDA reports asynchronous errors).
  void send();
  // reply(result) + send().
  void fail(CUresult result);
  bool answered() const { return sent_; }
  // Leaves the call unanswered for now, its caller waiting: the session
  // serves it again once `ready` says it will not block (a synchronization
  // behind a stream memory wait: session/stream_waits.h).
  void defer(std::function<bool()> ready) {
    ready_ = std::move(ready);
    sent_ = true;
  }
  const std::function<bool()>& deferredUntil() const { return ready_; }
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
  std::function<bool()> ready_;                 // defer()'s
  std::deque<std::vector<uint64_t>> exported_;  // exportList()'s ids, alive until the reply is sent
};

// ---- reply helpers of the generated server functions -------------------------
// The first min(capacity, filled) elements of an out array, on success.
template <typename T>
ipc::Blob outArray(const std::vector<T>& items, size_t capacity, CUresult result) {
  const size_t n = result == CUDA_SUCCESS ? std::min(items.size(), capacity) : 0;
  return ipc::Blob::of(items.data(), n * sizeof(T));
}
// The NUL-terminated contents of a string buffer, on success.
inline ipc::Text outString(const char* buffer, bool present, CUresult result) {
  if (!present || result != CUDA_SUCCESS) return {};
  return ipc::Text::of(std::string_view(buffer, strnlen(buffer, 4096)));
}
// One blob per value of a batch: empty for values not asked for or on failure.
inline ipc::BlobList valueList(std::span<const AttributeValue> values, CUresult result) {
  ipc::BlobList list;
  list.items.reserve(values.size());
  for (const AttributeValue& v : values) list.items.push_back(v.blob(v.wanted ? result : CUDA_ERROR_INVALID_VALUE));
  return list;
}
// The values a batch asks for: one flag byte per value, `count` of them.
inline bool wantedValues(const ipc::Blob& flags, size_t count, std::vector<AttributeValue>* values) {
  if (flags.size() != count) return false;
  values->assign(count, AttributeValue{});
  for (size_t i = 0; i < count; ++i) (*values)[i].wanted = flags.bytes[i] != std::byte{0};
  return true;
}

namespace generated {
// Every remoted entry point (remote_server.cpp, generated from apigen/remoting.json).
void installGenerated(ServerTable& table);
int generatedCount();
}  // namespace generated

}  // namespace phos::daemon
