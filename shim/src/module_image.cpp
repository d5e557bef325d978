// SPDX-License-Identifier: Apache-2.0
// Recognizing module images by their headers.
#include "module_image.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace phos::shim {
namespace {

constexpr uint32_t kFatbinMagic = 0xBA55ED50u;         // fatBinaryHeader
constexpr uint32_t kFatbinWrapperMagic = 0x466243B1u;  // __fatBinC_Wrapper_t
constexpr size_t kMaxImage = 1ull << 30;

template <typename T>
T load(const void* p, size_t offset) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + offset, sizeof(T));
  return v;
}

size_t elfSize(const void* p) {
  const auto* b = static_cast<const unsigned char*>(p);
  if (b[4] != 2) return 0;  // ELFCLASS64 only: cubins are 64-bit
  uint64_t phoff = load<uint64_t>(p, 0x20);
  uint64_t shoff = load<uint64_t>(p, 0x28);
  uint16_t phentsize = load<uint16_t>(p, 0x36), phnum = load<uint16_t>(p, 0x38);
  uint16_t shentsize = load<uint16_t>(p, 0x3A), shnum = load<uint16_t>(p, 0x3C);
  uint64_t end = std::max<uint64_t>(64, shoff + uint64_t{shentsize} * shnum);
  end = std::max<uint64_t>(end, phoff + uint64_t{phentsize} * phnum);
  if (end > kMaxImage) return 0;
  // Section contents may follow the section header table.
  for (uint16_t i = 0; i < shnum && shentsize >= 0x28; ++i) {
    size_t sh = shoff + size_t{i} * shentsize;
    uint32_t type = load<uint32_t>(p, sh + 4);
    uint64_t offset = load<uint64_t>(p, sh + 0x18), size = load<uint64_t>(p, sh + 0x20);
    if (type != 8 /* SHT_NOBITS */ && offset + size > end && offset + size <= kMaxImage) end = offset + size;
  }
  return end;
}

}  // namespace

ModuleImage moduleImage(const void* image) {
  if (image == nullptr) return {};
  uint32_t magic = load<uint32_t>(image, 0);
  if (magic == kFatbinWrapperMagic) {
    // { int magic; int version; const unsigned long long* data; void* filename_or_fatbins; }
    const void* data = load<const void*>(image, 8);
    // Not recognizable (bytes 0), but not a null image either: the caller
    // answers CUDA_ERROR_INVALID_IMAGE, as the driver does.
    if (data == nullptr || load<uint32_t>(data, 0) != kFatbinMagic) return {image, 0};
    image = data;
    magic = kFatbinMagic;
  }
  if (magic == kFatbinMagic) {
    // { u32 magic; u16 version; u16 headerSize; u64 fatSize; }
    uint16_t header = load<uint16_t>(image, 6);
    uint64_t body = load<uint64_t>(image, 8);
    if (body > kMaxImage) return {image, 0};
    return {image, header + body};
  }
  if (std::memcmp(image, "\x7f" "ELF", 4) == 0) return {image, elfSize(image)};
  // PTX: NUL-terminated text.
  return {image, std::strlen(static_cast<const char*>(image)) + 1};
}

}  // namespace phos::shim
