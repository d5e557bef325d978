// SPDX-License-Identifier: Apache-2.0
// Sizing module images from their formats without trusting their pointers.
#include "phos/common/module_image.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace phos::module_image {
namespace {

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Reads [at, at+n) of this process's memory: the bytes that could be read
// (fewer at the end of a mapping, none at a wild pointer).
std::size_t readSelf(const void* at, void* out, std::size_t n) {
  iovec local{out, n};
  iovec remote{const_cast<void*>(at), n};
  const ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  return got < 0 ? 0 : static_cast<std::size_t>(got);
}

Status readExactly(const void* at, void* out, std::size_t n, const char* what) {
  if (readSelf(at, out, n) == n) return Status::ok();
  return makeError(Code::kDataLoss, "{} at {}: {} bytes cannot be read", what, at, n);
}

Result<std::size_t> cubinSize(const void* image) {
  std::byte header[64];
  RETURN_IF_ERROR(readExactly(image, header, sizeof(header), "cubin header"));
  if (header[4] != std::byte{2}) return makeError(Code::kDataLoss, "a 32-bit ELF is not a cubin");
  const auto phoff = load<std::uint64_t>(header + 0x20);
  const auto shoff = load<std::uint64_t>(header + 0x28);
  const auto phentsize = load<std::uint16_t>(header + 0x36), phnum = load<std::uint16_t>(header + 0x38);
  const auto shentsize = load<std::uint16_t>(header + 0x3A), shnum = load<std::uint16_t>(header + 0x3C);
  if (shoff > kMaxImageBytes || phoff > kMaxImageBytes || (shnum != 0 && shentsize < 0x28)) {
    return makeError(Code::kDataLoss, "cubin header tables are out of range");
  }
  std::uint64_t end = std::max<std::uint64_t>(
      {64, shoff + std::uint64_t{shentsize} * shnum, phoff + std::uint64_t{phentsize} * phnum});
  // Section contents may follow the section header table.
  std::vector<std::byte> sections(std::size_t{shentsize} * shnum);
  RETURN_IF_ERROR(readExactly(static_cast<const std::byte*>(image) + shoff, sections.data(), sections.size(),
                              "cubin section headers"));
  for (std::size_t i = 0; i < shnum; ++i) {
    const std::byte* sh = sections.data() + i * shentsize;
    if (load<std::uint32_t>(sh + 4) == 8 /* SHT_NOBITS */) continue;
    const auto offset = load<std::uint64_t>(sh + 0x18), size = load<std::uint64_t>(sh + 0x20);
    if (offset > kMaxImageBytes || size > kMaxImageBytes) return makeError(Code::kDataLoss, "cubin section out of range");
    end = std::max(end, offset + size);
  }
  if (end > kMaxImageBytes) return makeError(Code::kDataLoss, "cubin larger than 1 GiB");
  return static_cast<std::size_t>(end);
}

// PTX: text to its NUL, read a page at a time (a short read: the text runs
// into unmapped memory).
Result<std::size_t> textSize(const void* image) {
  const auto* at = static_cast<const std::byte*>(image);
  constexpr std::size_t kPage = 4096;
  std::byte chunk[kPage];
  std::size_t size = 0;
  while (size < kMaxImageBytes) {
    const auto address = reinterpret_cast<std::uintptr_t>(at + size);
    const std::size_t want = kPage - address % kPage;
    const std::size_t got = readSelf(at + size, chunk, want);
    if (const std::byte* nul = std::find(chunk, chunk + got, std::byte{0}); nul != chunk + got) {
      return size + static_cast<std::size_t>(nul - chunk) + 1;
    }
    size += got;
    if (got < want) return makeError(Code::kDataLoss, "module image at {}: unreadable after {} bytes of text", image, size);
  }
  return makeError(Code::kDataLoss, "module image text is longer than 1 GiB");
}

}  // namespace

Result<Extent> extent(const void* image) {
  if (image == nullptr) return makeError(Code::kInvalidArgument, "the module image is null");
  std::byte head[16] = {};
  const std::size_t got = readSelf(image, head, sizeof(head));
  if (got == 0) return makeError(Code::kInvalidArgument, "the module image at {} cannot be read", image);
  const std::uint32_t magic = got >= 4 ? load<std::uint32_t>(head) : 0;
  if (magic == kFatbinWrapperMagic) {
    // { int magic; int version; const unsigned long long* data; void* filename_or_fatbins; }
    if (got < 16) return makeError(Code::kDataLoss, "the fatbin wrapper is truncated");
    const void* data = load<const void*>(head + 8);
    std::byte inner[4] = {};
    if (data == nullptr || readSelf(data, inner, sizeof(inner)) != sizeof(inner) ||
        load<std::uint32_t>(inner) != kFatbinMagic) {
      return makeError(Code::kDataLoss, "the fatbin wrapper points at {}, which holds no fatbin", data);
    }
    return extent(data);
  }
  if (magic == kFatbinMagic) {
    // { u32 magic; u16 version; u16 headerSize; u64 fatSize; }
    if (got < 16) return makeError(Code::kDataLoss, "the fatbin header is truncated");
    const auto header = load<std::uint16_t>(head + 6);
    const auto body = load<std::uint64_t>(head + 8);
    if (header < 16 || body > kMaxImageBytes) {
      return makeError(Code::kDataLoss, "fatbin header: header size {}, size {}", header, body);
    }
    // The whole container must be mapped: a header claiming more is damaged.
    std::byte last{};
    RETURN_IF_ERROR(readExactly(static_cast<const std::byte*>(image) + header + body - 1, &last, 1, "fatbin end"));
    return Extent{image, header + body};
  }
  if (got >= 4 && std::memcmp(head, "\x7f" "ELF", 4) == 0) {
    ASSIGN_OR_RETURN(std::size_t bytes, cubinSize(image));
    return Extent{image, bytes};
  }
  ASSIGN_OR_RETURN(std::size_t bytes, textSize(image));
  return Extent{image, bytes};
}

Result<std::vector<std::byte>> copy(const Extent& e) {
  std::vector<std::byte> out(e.bytes);
  RETURN_IF_ERROR(readExactly(e.data, out.data(), out.size(), "module image"));
  return out;
}

}  // namespace phos::module_image
