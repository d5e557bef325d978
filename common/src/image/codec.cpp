// SPDX-License-Identifier: Apache-2.0
// Chunk compression with zstd and lz4; damaged input is an error, never a crash.
#include "codec.h"

#include <cstring>
#include <limits>

#include <lz4.h>
#include <zstd.h>

namespace phos::image::detail {

Result<Codec> compress(Codec codec, int zstdLevel, std::span<const std::byte> raw,
                       std::vector<std::byte>& out) {
  size_t stored = 0;
  switch (codec) {
    case Codec::kNone:
      break;
    case Codec::kZstd: {
      out.resize(ZSTD_compressBound(raw.size()));
      stored = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), zstdLevel);
      if (ZSTD_isError(stored)) {
        return makeError(Code::kInternal, "zstd: {}", ZSTD_getErrorName(stored));
      }
      break;
    }
    case Codec::kLz4: {
      if (raw.size() > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) {
        return makeError(Code::kInvalidArgument, "lz4: chunk of {} bytes is too large", raw.size());
      }
      int bound = LZ4_compressBound(static_cast<int>(raw.size()));
      out.resize(static_cast<size_t>(bound));
      int n = LZ4_compress_default(reinterpret_cast<const char*>(raw.data()),
                                   reinterpret_cast<char*>(out.data()),
                                   static_cast<int>(raw.size()), bound);
      if (n <= 0) return makeError(Code::kInternal, "lz4: compression failed");
      stored = static_cast<size_t>(n);
      break;
    }
  }
  if (codec == Codec::kNone || stored >= raw.size()) {
    out.clear();
    return Codec::kNone;
  }
  out.resize(stored);
  return codec;
}

Status decompress(Codec codec, std::span<const std::byte> stored, std::span<std::byte> out) {
  switch (codec) {
    case Codec::kNone:
      if (stored.size() != out.size()) {
        return makeError(Code::kDataLoss, "stored {} bytes, expected {}", stored.size(),
                         out.size());
      }
      if (!out.empty()) std::memcpy(out.data(), stored.data(), out.size());
      return Status::ok();
    case Codec::kZstd: {
      size_t n = ZSTD_decompress(out.data(), out.size(), stored.data(), stored.size());
      if (ZSTD_isError(n)) {
        return makeError(Code::kDataLoss, "zstd: {}", ZSTD_getErrorName(n));
      }
      if (n != out.size()) {
        // Not how many it decoded: that number comes from the stored bytes.
        return makeError(Code::kDataLoss, "zstd: does not decode to the expected {} bytes", out.size());
      }
      return Status::ok();
    }
    case Codec::kLz4: {
      constexpr size_t kMax = static_cast<size_t>(std::numeric_limits<int>::max());
      if (stored.size() > kMax || out.size() > kMax) {
        return makeError(Code::kDataLoss, "lz4: chunk too large");
      }
      int n = LZ4_decompress_safe(reinterpret_cast<const char*>(stored.data()),
                                  reinterpret_cast<char*>(out.data()),
                                  static_cast<int>(stored.size()), static_cast<int>(out.size()));
      if (n < 0) return makeError(Code::kDataLoss, "lz4: stored bytes do not decode");
      if (static_cast<size_t>(n) != out.size()) {
        return makeError(Code::kDataLoss, "lz4: does not decode to the expected {} bytes", out.size());
      }
      return Status::ok();
    }
  }
  return makeError(Code::kDataLoss, "unknown codec {}", static_cast<int>(codec));
}

}  // namespace phos::image::detail
