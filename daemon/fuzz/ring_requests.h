// SPDX-License-Identifier: Apache-2.0
// Requests for the ring fuzzer and its seed maker: a builder for the wire
// encoding, the fixed application memory the fuzzer provides, and the tokens a
// seed writes where a value only known at run time belongs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "phos/common/ipc/wire.h"
#include "phos/cuda_api/entry_points.h"
#include "phos/cuda_api/wire_messages.h"

namespace phos::daemon::fuzz {

// The fuzzer's stand-in application maps this memory at a fixed address, so
// that a seed written once can name it: the module's PTX text (read-only),
// then scratch memory the daemon may copy from and to. Below phosd's pinned
// window (0x5000'0000'0000..) and above vgpu's device windows; not at
// 0x6000'0000'0000, where AddressSanitizer's heap lives.
inline constexpr uint64_t kAppBase = 0x480000000000ull;
inline constexpr uint64_t kAppPtx = kAppBase;
inline constexpr uint64_t kAppScratch = kAppBase + 0x10000;
inline constexpr uint64_t kAppScratchBytes = 0x10000;
inline constexpr uint64_t kAppBytes = 0x20000;

// fill(p, n): p[i] = i for every thread i < n. `counter` is a module global.
inline constexpr std::string_view kModulePtx = R"(.version 7.0
.target sm_80
.address_size 64
.visible .global .align 4 .u32 counter;
.visible .entry fill(.param .u64 p, .param .u32 n)
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<5>;
  mov.u32 %r1, %tid.x;
  ld.param.u32 %r2, [n];
  setp.ge.u32 %p1, %r1, %r2;
  @%p1 bra done;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd4, %rd2, %rd3;
  st.global.u32 [%rd4], %r1;
done:
  ret;
}
)";

// An 8-byte little-endian value kTokenBase + t anywhere in a fuzz input is
// replaced by what the fuzzer's prologue created (handle ids and device
// pointers differ between drivers and runs; a seed names them by token).
inline constexpr uint64_t kTokenBase = 0xf022'7a6b'0000'0000ull;
enum Token : uint64_t {
  kContext = 1,       // the session's primary context of device 0
  kDevicePointer,     // a 64 KiB allocation of the session
  kModule,            // the module loaded from kModulePtx
  kFunction,          // its `fill`
  kStream,            // a stream of the session
  kPinned,            // 4 KiB of the session's pinned host memory
  kEvent,             // an event of the session
  kVictimPointer,     // device memory of another session
  kVictimContext,     // another session's context id
  kTokenCount,
};
inline constexpr uint64_t token(Token t) { return kTokenBase + t; }
inline constexpr uint64_t kDeviceBytes = 0x10000;
inline constexpr uint64_t kVictimBytes = 0x1000;
inline constexpr uint8_t kVictimFill = 0x5a;

// Writes one request: the header, then arguments in wire.h's encoding.
class RequestBuilder {
 public:
  RequestBuilder(cuda_api::EntryPointId entry, uint64_t context, bool expectsReply = true) {
    ipc::CallHeader h;
    h.entry = static_cast<uint32_t>(entry);
    h.flags = expectsReply ? uint32_t{ipc::kCallExpectsReply} : uint32_t{0};
    h.context = context;
    h.thread = 1;
    raw(&h, sizeof(h));
  }
  // Adds CallFlags to the header's (a lane: ipc::laneFlags).
  RequestBuilder& flags(uint32_t f) {
    ipc::CallHeader h;
    std::memcpy(&h, bytes_.data(), sizeof(h));
    h.flags |= f;
    std::memcpy(bytes_.data(), &h, sizeof(h));
    return *this;
  }
  RequestBuilder& u8(uint8_t v) { return raw(&v, sizeof(v)); }
  RequestBuilder& u32(uint32_t v) { return raw(&v, sizeof(v)); }
  RequestBuilder& i32(int32_t v) { return raw(&v, sizeof(v)); }
  RequestBuilder& u64(uint64_t v) { return raw(&v, sizeof(v)); }
  RequestBuilder& blob(const void* data, size_t n) {
    u32(static_cast<uint32_t>(n));
    return raw(data, n);
  }
  RequestBuilder& text(std::string_view s) { return blob(s.data(), s.size()); }
  // A whole request message of the generated wire (phos/cuda_api/wire_messages.h).
  template <typename Message>
  RequestBuilder& message(const Message& m) {
    std::vector<std::byte> buffer(kMaxMessage);
    ipc::Encoder e(buffer);
    put(e, m);
    return raw(buffer.data(), e.size());
  }
  RequestBuilder& raw(const void* data, size_t n) {
    const size_t at = bytes_.size();
    bytes_.resize(at + n);
    if (n != 0) std::memcpy(bytes_.data() + at, data, n);
    return *this;
  }
  const std::vector<std::byte>& bytes() const { return bytes_; }
  std::span<const std::byte> span() const { return bytes_; }

 private:
  static constexpr size_t kMaxMessage = 64 * 1024;
  std::vector<std::byte> bytes_;
};

}  // namespace phos::daemon::fuzz
