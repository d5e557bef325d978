// SPDX-License-Identifier: Apache-2.0
// The field types of the generated request and reply messages (apigen's
// wire_messages.h) and their one encoding: put() writes a field, get() reads
// it back, bounds-checked. Nothing here knows an entry point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "phos/common/ipc/wire.h"

namespace phos::ipc {

// A C string, NULL kept apart from "": 4-byte length (kNullString for NULL),
// then the bytes, no terminator. Decoded, it is a view into the message.
struct Text {
  const char* data = nullptr;
  uint32_t size = 0;
  bool null = true;

  static Text of(const char* s) {
    if (s == nullptr) return {};
    return {s, static_cast<uint32_t>(std::strlen(s)), false};
  }
  static Text of(std::string_view s) { return {s.data(), static_cast<uint32_t>(s.size()), false}; }
  std::string_view view() const { return null ? std::string_view() : std::string_view(data, size); }
  std::string str() const { return std::string(view()); }
};

// Bytes: 4-byte length, then the bytes. Decoded, a view into the message
// (unaligned: copy before reading it as anything but bytes).
struct Blob {
  std::span<const std::byte> bytes;

  static Blob of(const void* data, size_t n) {
    return {std::span<const std::byte>(static_cast<const std::byte*>(data), data == nullptr ? 0 : n)};
  }
  size_t size() const { return bytes.size(); }
  // The blob as `count` elements of T, copied (aligned) into `out`; false if
  // its size is not exactly that.
  template <typename T>
  bool copyTo(std::vector<T>* out, size_t count) const {
    static_assert(std::is_trivially_copyable_v<T>);
    if (count > bytes.size() / sizeof(T) || bytes.size() != count * sizeof(T)) return false;
    out->resize(count);
    if (count != 0) std::memcpy(out->data(), bytes.data(), bytes.size());
    return true;
  }
};

// Several blobs: 4-byte count, then each blob.
struct BlobList {
  std::vector<Blob> items;
};

// A pointer to a single value: a presence byte, then the value when present.
template <typename T>
struct Optional {
  bool present = false;
  T value{};

  static Optional of(const T* p) { return p == nullptr ? Optional{} : Optional{true, *p}; }
  const T* get() const { return present ? &value : nullptr; }
};

// A module image left in the application's memory: phosd reads it there
// (process_vm_readv), so only its address and size travel.
struct ImageRef {
  uint64_t address = 0;
  uint64_t bytes = 0;
};

// A launch's kernel parameters: 4-byte count, then one blob per parameter
// (sized by the kernel's signature); or kExtraBuffer and one blob holding
// the CU_LAUNCH_PARAM_BUFFER_POINTER contents.
struct KernelArgs {
  static constexpr uint32_t kExtraBuffer = 0xfffffffeu;
  static constexpr uint32_t kMaxParams = 4096;
  // What the shim encodes.
  uint32_t count = 0;
  const uint32_t* sizes = nullptr;
  void* const* params = nullptr;
  bool useExtra = false;
  const void* buffer = nullptr;
  size_t bufferBytes = 0;
  // What phosd decodes: one view per parameter, or the extra buffer.
  std::vector<std::span<const std::byte>> decoded;
};

// cuLaunchKernelEx's configuration: the geometry, the stream as a handle id,
// and the attributes (any that name a driver object are the server's to refuse).
struct LaunchConfig {
  uint32_t gridDimX = 0, gridDimY = 0, gridDimZ = 0;
  uint32_t blockDimX = 0, blockDimY = 0, blockDimZ = 0;
  uint32_t sharedMemBytes = 0;
  uint64_t stream = 0;
  Blob attributes;  // numAttrs x CUlaunchAttribute
};

// A kernel node's parameters (CUDA_KERNEL_NODE_PARAMS, either revision): the
// function, library kernel and context as handle ids (the driver runs the
// kernel only without a function), the geometry, and the arguments as a launch's.
struct KernelNode {
  bool present = false;  // the application passed the structure
  uint64_t function = 0;
  uint64_t kernel = 0;
  uint64_t context = 0;
  uint32_t gridDimX = 0, gridDimY = 0, gridDimZ = 0;
  uint32_t blockDimX = 0, blockDimY = 0, blockDimZ = 0;
  uint32_t sharedMemBytes = 0;
  KernelArgs args;
};

// A kernel node's parameters as phosd answers cuGraphKernelNodeGetParams
// (a string reply): the handle ids of its function, library kernel and
// context (0 where it has none), the geometry, then each argument as a
// 4-byte size and its bytes.
struct KernelNodeParams {
  uint64_t handles[3] = {};   // function, kernel, context
  uint32_t geometry[7] = {};  // grid x, y, z, block x, y, z, shared memory bytes
  std::vector<std::string> args;

  std::string pack() const {
    std::string out(reinterpret_cast<const char*>(handles), sizeof(handles));
    out.append(reinterpret_cast<const char*>(geometry), sizeof(geometry));
    for (const std::string& a : args) {
      const auto size = static_cast<uint32_t>(a.size());
      out.append(reinterpret_cast<const char*>(&size), sizeof(size));
      out.append(a);
    }
    return out;
  }
  // pack()'s bytes back; false if they are not that.
  bool unpack(std::string_view in) {
    if (in.size() < sizeof(handles) + sizeof(geometry)) return false;
    std::memcpy(handles, in.data(), sizeof(handles));
    std::memcpy(geometry, in.data() + sizeof(handles), sizeof(geometry));
    in.remove_prefix(sizeof(handles) + sizeof(geometry));
    args.clear();
    while (!in.empty()) {
      uint32_t size = 0;
      if (in.size() < sizeof(size)) return false;
      std::memcpy(&size, in.data(), sizeof(size));
      in.remove_prefix(sizeof(size));
      if (size > in.size()) return false;
      args.emplace_back(in.substr(0, size));
      in.remove_prefix(size);
    }
    return true;
  }
};

// ---- put: one field into a message ------------------------------------------
template <typename T>
  requires std::is_trivially_copyable_v<T>
void put(Encoder& e, const T& v) {
  e.value(v);
}
inline void put(Encoder& e, bool v) { e.u8(v ? 1 : 0); }
inline void put(Encoder& e, const Text& t) {
  if (t.null) {
    e.u32(kNullString);
    return;
  }
  e.u32(t.size);
  e.bytes(t.data, t.size);
}
inline void put(Encoder& e, const Blob& b) { e.blob(b.bytes.data(), b.bytes.size()); }
inline void put(Encoder& e, const BlobList& l) {
  e.u32(static_cast<uint32_t>(l.items.size()));
  for (const Blob& b : l.items) put(e, b);
}
template <typename T>
void put(Encoder& e, const Optional<T>& o) {
  put(e, o.present);
  if (o.present) put(e, o.value);
}
inline void put(Encoder& e, const ImageRef& r) {
  e.u64(r.address);
  e.u64(r.bytes);
}
inline void put(Encoder& e, const KernelArgs& k) {
  if (k.useExtra) {
    e.u32(KernelArgs::kExtraBuffer);
    e.blob(k.buffer, k.bufferBytes);
    return;
  }
  e.u32(k.count);
  for (uint32_t i = 0; i < k.count; ++i) e.blob(k.params[i], k.sizes[i]);
}
inline void put(Encoder& e, const LaunchConfig& c) {
  for (uint32_t v : {c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ, c.sharedMemBytes}) {
    e.u32(v);
  }
  e.u64(c.stream);
  put(e, c.attributes);
}
inline void put(Encoder& e, const KernelNode& k) {
  e.u8(k.present ? 1 : 0);
  if (!k.present) return;
  e.u64(k.function);
  e.u64(k.kernel);
  e.u64(k.context);
  for (uint32_t v : {k.gridDimX, k.gridDimY, k.gridDimZ, k.blockDimX, k.blockDimY, k.blockDimZ,
                     k.sharedMemBytes}) {
    e.u32(v);
  }
  put(e, k.args);
}

// ---- get: one field out of a message (a failed read fails the decoder) -------
template <typename T>
  requires std::is_trivially_copyable_v<T>
void get(Decoder& d, T& v) {
  v = d.value<T>();
}
inline void get(Decoder& d, bool& v) { v = d.present(); }
inline void get(Decoder& d, Text& t) {
  bool null = false;
  auto bytes = d.blob(&null);
  t.null = null || !d.ok();
  t.data = reinterpret_cast<const char*>(bytes.data());
  t.size = static_cast<uint32_t>(bytes.size());
}
inline void get(Decoder& d, Blob& b) { b.bytes = d.blob(); }
inline void get(Decoder& d, BlobList& l) {
  const uint32_t n = d.u32();
  // Each blob takes 4 bytes at least: a count beyond that is malformed.
  if (n > d.remaining() / sizeof(uint32_t)) {
    d.fail();
    return;
  }
  l.items.resize(n);
  for (Blob& b : l.items) get(d, b);
}
template <typename T>
void get(Decoder& d, Optional<T>& o) {
  get(d, o.present);
  if (o.present) get(d, o.value);
}
inline void get(Decoder& d, ImageRef& r) {
  r.address = d.u64();
  r.bytes = d.u64();
}
inline void get(Decoder& d, KernelArgs& k) {
  const uint32_t n = d.u32();
  k.decoded.clear();
  if (n == KernelArgs::kExtraBuffer) {
    k.useExtra = true;
    k.decoded.push_back(d.blob());
    return;
  }
  if (n > KernelArgs::kMaxParams || n > d.remaining() / sizeof(uint32_t)) {
    d.fail();
    return;
  }
  k.useExtra = false;
  k.count = n;
  k.decoded.reserve(n);
  for (uint32_t i = 0; i < n && d.ok(); ++i) k.decoded.push_back(d.blob());
}
inline void get(Decoder& d, LaunchConfig& c) {
  for (uint32_t* v : {&c.gridDimX, &c.gridDimY, &c.gridDimZ, &c.blockDimX, &c.blockDimY, &c.blockDimZ,
                      &c.sharedMemBytes}) {
    *v = d.u32();
  }
  c.stream = d.u64();
  get(d, c.attributes);
}
inline void get(Decoder& d, KernelNode& k) {
  k.present = d.present();
  if (!k.present) return;
  k.function = d.u64();
  k.kernel = d.u64();
  k.context = d.u64();
  for (uint32_t* v : {&k.gridDimX, &k.gridDimY, &k.gridDimZ, &k.blockDimX, &k.blockDimY,
                      &k.blockDimZ, &k.sharedMemBytes}) {
    *v = d.u32();
  }
  get(d, k.args);
}

}  // namespace phos::ipc
