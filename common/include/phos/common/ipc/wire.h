// SPDX-License-Identifier: Apache-2.0
// The byte encoding of remoted Driver API calls: what libphos.so writes into a
// ring slot and what phosd reads back, and the same for replies.
//
// A message is a header followed by the call's parameters in declaration
// order, each encoded by its kind (see apigen's parameter kinds):
//   value            its bytes, sizeof(T)
//   handle           8 bytes: the virtual id the application holds
//   in pointer       1 presence byte, then sizeof(T) bytes when present
//   string           4-byte length (kNullString for NULL), then the bytes
//   out pointer      1 presence byte (the reply carries the value)
//   blob             4-byte length, then the bytes (arrays, parameter buffers)
// Nothing is aligned. The decoder never trusts a length: every read is
// bounds-checked and a short or malformed message makes it fail, never read
// past the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace phos::ipc {

inline constexpr uint32_t kNullString = 0xffffffffu;

// Every request starts with this.
struct CallHeader {
  uint32_t entry = 0;        // phos::cuda_api::EntryPointId
  uint32_t flags = 0;        // CallFlags
  uint64_t context = 0;      // the calling thread's current virtual context (0: none)
  uint64_t thread = 0;       // the calling thread's id (per-thread default streams)
};
static_assert(sizeof(CallHeader) == 24 && std::is_trivially_copyable_v<CallHeader>);

enum CallFlags : uint32_t {
  kCallExpectsReply = 1u << 0,
  // The copy's application-side bytes travel through a transfer lane of the
  // ring (transfer_lane.h), the one named by callLane(), not through
  // process_vm_readv/writev.
  kCallThroughLane = 1u << 1,
};

// The lane of a kCallThroughLane call: bits 8 to 15 of its flags.
inline constexpr uint32_t laneFlags(uint32_t lane) { return kCallThroughLane | (lane & 0xffu) << 8; }
inline constexpr uint32_t callLane(uint32_t flags) { return flags >> 8 & 0xffu; }

// Every reply starts with this.
struct ReplyHeader {
  int32_t result = 0;        // CUresult
  uint32_t flags = 0;        // ReplyFlags
};
static_assert(sizeof(ReplyHeader) == 8);

enum ReplyFlags : uint32_t {
  // Kernel printf output is waiting for the application (set on the replies
  // of synchronizing calls): fetch it with kTakeOutputEntry.
  kReplyOutputPending = 1u << 0,
};

// Not a Driver API entry point: asks phosd for the session's pending kernel
// output. No arguments; the reply carries two blobs of text, for stdout
// (printf) and for stderr (failed assertions), as much as fits, and
// kReplyOutputPending while more is left.
inline constexpr uint32_t kTakeOutputEntry = 0xffff0001u;

// Appends to a caller-provided buffer (a ring slot); remembers overflow
// instead of writing past the end, so a call that does not fit fails cleanly.
class Encoder {
 public:
  explicit Encoder(std::span<std::byte> buffer) : buffer_(buffer) {}

  void bytes(const void* data, size_t n) {
    if (n > buffer_.size() - size_) {
      overflow_ = true;
      return;
    }
    if (n != 0) std::memcpy(buffer_.data() + size_, data, n);
    size_ += n;
  }
  template <typename T>
  void value(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&v, sizeof(T));
  }
  void u8(uint8_t v) { value(v); }
  void u32(uint32_t v) { value(v); }
  void u64(uint64_t v) { value(v); }
  // A pointer to a single T the callee reads.
  template <typename T>
  void inPointer(const T* p) {
    u8(p != nullptr);
    if (p != nullptr) value(*p);
  }
  void outPointer(const void* p) { u8(p != nullptr); }
  void string(const char* s) {
    if (s == nullptr) {
      u32(kNullString);
      return;
    }
    size_t n = std::strlen(s);
    u32(static_cast<uint32_t>(n));
    bytes(s, n);
  }
  void blob(const void* data, size_t n) {
    u32(static_cast<uint32_t>(n));
    if (n > 0xfffffffeu) overflow_ = true;
    bytes(data, n);
  }
  // Reserves n bytes to be filled later (returns nullptr on overflow).
  std::byte* reserve(size_t n) {
    if (n > buffer_.size() - size_) {
      overflow_ = true;
      return nullptr;
    }
    std::byte* p = buffer_.data() + size_;
    size_ += n;
    return p;
  }

  bool overflow() const { return overflow_; }
  size_t size() const { return size_; }
  std::span<const std::byte> written() const { return buffer_.first(size_); }

 private:
  std::span<std::byte> buffer_;
  size_t size_ = 0;
  bool overflow_ = false;
};

// Reads what an Encoder wrote. After the first failed read every later read
// fails too and returns zeros; check ok() once at the end.
class Decoder {
 public:
  explicit Decoder(std::span<const std::byte> buffer) : buffer_(buffer) {}

  bool bytes(void* out, size_t n) {
    if (failed_ || n > buffer_.size() - offset_) {
      failed_ = true;
      if (n != 0 && out != nullptr) std::memset(out, 0, n);
      return false;
    }
    if (n != 0) std::memcpy(out, buffer_.data() + offset_, n);
    offset_ += n;
    return true;
  }
  template <typename T>
  T value() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    bytes(&v, sizeof(T));
    return v;
  }
  uint8_t u8() { return value<uint8_t>(); }
  uint32_t u32() { return value<uint32_t>(); }
  uint64_t u64() { return value<uint64_t>(); }
  // A presence byte: anything but 0 or 1 is malformed.
  bool present() {
    uint8_t b = u8();
    if (b > 1) failed_ = true;
    return b == 1;
  }
  // A view of the next n bytes inside the message (empty on failure).
  std::span<const std::byte> view(size_t n) {
    if (failed_ || n > buffer_.size() - offset_) {
      failed_ = true;
      return {};
    }
    auto s = buffer_.subspan(offset_, n);
    offset_ += n;
    return s;
  }
  // A length-prefixed blob; `null` is set for kNullString.
  std::span<const std::byte> blob(bool* null = nullptr) {
    uint32_t n = u32();
    if (null != nullptr) *null = (n == kNullString && !failed_);
    if (n == kNullString) return {};
    return view(n);
  }

  void fail() { failed_ = true; }
  bool ok() const { return !failed_; }
  bool atEnd() const { return offset_ == buffer_.size(); }
  size_t remaining() const { return buffer_.size() - offset_; }

 private:
  std::span<const std::byte> buffer_;
  size_t offset_ = 0;
  bool failed_ = false;
};

}  // namespace phos::ipc
