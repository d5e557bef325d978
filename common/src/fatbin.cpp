// SPDX-License-Identifier: Apache-2.0
// Fatbin containers (zstd and LZ4 entries) and cubin symbol tables.
#include "phos/common/fatbin.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include <lz4.h>
#include <zstd.h>

namespace phos::fatbin {
namespace {

template <typename T>
T load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

constexpr std::size_t kContainerHeader = 16;
constexpr std::size_t kMinEntryHeader = 0x40;
// A sanity bound: no real entry is near 2 GiB uncompressed.
constexpr std::size_t kMaxEntry = std::size_t{1} << 31;

}  // namespace

bool isFatbin(std::span<const std::byte> image) {
  return image.size() >= kContainerHeader && load<std::uint32_t>(image.data()) == kMagic;
}

bool isCubin(std::span<const std::byte> image) {
  return image.size() >= 4 && std::memcmp(image.data(), "\x7f" "ELF", 4) == 0;
}

Result<std::vector<Entry>> parse(std::span<const std::byte> image) {
  if (!isFatbin(image)) return makeError(Code::kDataLoss, "not a fatbin (bad magic or truncated header)");
  const auto headerSize = load<std::uint16_t>(image.data() + 6);
  const auto size = load<std::uint64_t>(image.data() + 8);
  if (headerSize < kContainerHeader || size > image.size() || headerSize > image.size() - size) {
    return makeError(Code::kDataLoss, "fatbin header: header size {}, size {}, {} bytes present", headerSize, size,
                     image.size());
  }
  std::vector<Entry> entries;
  std::uint64_t offset = headerSize;
  const std::uint64_t end = headerSize + size;
  while (offset + kMinEntryHeader <= end) {
    const std::byte* e = image.data() + offset;
    const auto entryHeaderSize = load<std::uint32_t>(e + 0x04);
    const auto payloadSize = load<std::uint64_t>(e + 0x08);
    if (entryHeaderSize < kMinEntryHeader || entryHeaderSize > end - offset ||
        payloadSize > end - offset - entryHeaderSize) {
      return makeError(Code::kDataLoss,
                       "fatbin entry at offset {}: header {} bytes, payload {} bytes, container ends at {}", offset,
                       entryHeaderSize, payloadSize, end);
    }
    Entry entry;
    switch (load<std::uint16_t>(e)) {
      case 1: entry.kind = Entry::Kind::kPtx; break;
      case 2: entry.kind = Entry::Kind::kElf; break;
      default: entry.kind = Entry::Kind::kOther; break;
    }
    entry.arch = static_cast<int>(load<std::uint32_t>(e + 0x1c));
    entry.flags = load<std::uint64_t>(e + 0x28);
    const auto compressedSize = load<std::uint32_t>(e + 0x10);
    std::size_t stored = payloadSize;
    if ((entry.compressedLz4() || entry.compressedZstd()) && compressedSize != 0 && compressedSize <= payloadSize) {
      stored = compressedSize;
    }
    entry.payload = std::span<const std::byte>(e + entryHeaderSize, stored);
    entry.uncompressedSize = load<std::uint64_t>(e + 0x38);
    entries.push_back(entry);
    offset += entryHeaderSize + payloadSize;
  }
  return entries;
}

Result<std::string> contents(const Entry& entry) {
  std::string out;
  if (entry.compressedZstd()) {
    const unsigned long long frame = ZSTD_getFrameContentSize(entry.payload.data(), entry.payload.size());
    std::size_t capacity = entry.uncompressedSize;
    if (frame != ZSTD_CONTENTSIZE_ERROR && frame != ZSTD_CONTENTSIZE_UNKNOWN) {
      capacity = std::max<std::size_t>(capacity, frame);
    }
    if (capacity > kMaxEntry) return makeError(Code::kDataLoss, "fatbin sm_{} entry claims {} bytes", entry.arch, capacity);
    out.resize(capacity);
    const std::size_t n = ZSTD_decompress(out.data(), out.size(), entry.payload.data(), entry.payload.size());
    if (ZSTD_isError(n)) {
      return makeError(Code::kDataLoss, "fatbin sm_{} entry: zstd: {}", entry.arch, ZSTD_getErrorName(n));
    }
    out.resize(n);
  } else if (entry.compressedLz4()) {
    if (entry.uncompressedSize == 0 || entry.uncompressedSize > kMaxEntry) {
      return makeError(Code::kDataLoss, "fatbin sm_{} entry: LZ4 without a valid size ({})", entry.arch,
                       entry.uncompressedSize);
    }
    out.resize(entry.uncompressedSize);
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(entry.payload.data()), out.data(),
                                      static_cast<int>(entry.payload.size()), static_cast<int>(out.size()));
    if (n < 0) return makeError(Code::kDataLoss, "fatbin sm_{} entry: LZ4 data is damaged", entry.arch);
    out.resize(static_cast<std::size_t>(n));
  } else {
    out.assign(reinterpret_cast<const char*>(entry.payload.data()), entry.payload.size());
  }
  return out;
}

Result<std::vector<std::string>> cubinGlobals(std::span<const std::byte> elf) {
  if (!isCubin(elf) || elf.size() < 64 || elf[4] != std::byte{2}) {
    return makeError(Code::kDataLoss, "not a 64-bit ELF cubin");
  }
  const auto shoff = load<std::uint64_t>(elf.data() + 0x28);
  const auto shentsize = load<std::uint16_t>(elf.data() + 0x3A), shnum = load<std::uint16_t>(elf.data() + 0x3C);
  const auto shstrndx = load<std::uint16_t>(elf.data() + 0x3E);
  if (shnum == 0) return std::vector<std::string>{};
  if (shentsize < 0x40 || shoff > elf.size() || std::uint64_t{shentsize} * shnum > elf.size() - shoff ||
      shstrndx >= shnum) {
    return makeError(Code::kDataLoss, "cubin section headers out of range");
  }
  struct Section {
    std::uint32_t name, type, link;
    std::uint64_t offset, size, entsize;
  };
  std::vector<Section> sections(shnum);
  for (std::size_t i = 0; i < shnum; ++i) {
    const std::byte* sh = elf.data() + shoff + i * shentsize;
    sections[i] = {load<std::uint32_t>(sh), load<std::uint32_t>(sh + 4), load<std::uint32_t>(sh + 0x28),
                   load<std::uint64_t>(sh + 0x18), load<std::uint64_t>(sh + 0x20), load<std::uint64_t>(sh + 0x38)};
  }
  auto bytesOf = [&](const Section& s) -> Result<std::span<const std::byte>> {
    if (s.type == 8 /* SHT_NOBITS */) return std::span<const std::byte>{};
    if (s.offset > elf.size() || s.size > elf.size() - s.offset) {
      return makeError(Code::kDataLoss, "cubin section at {} of {} bytes is out of range", s.offset, s.size);
    }
    return elf.subspan(s.offset, s.size);
  };
  auto stringAt = [](std::span<const std::byte> table, std::uint32_t at) -> std::string_view {
    if (at >= table.size()) return {};
    const char* p = reinterpret_cast<const char*>(table.data()) + at;
    return std::string_view(p, strnlen(p, table.size() - at));
  };
  ASSIGN_OR_RETURN(auto sectionNames, bytesOf(sections[shstrndx]));
  std::vector<std::string> globals;
  for (const Section& symtab : sections) {
    if (symtab.type != 2 /* SHT_SYMTAB */ || symtab.link >= shnum) continue;
    ASSIGN_OR_RETURN(auto symbols, bytesOf(symtab));
    ASSIGN_OR_RETURN(auto names, bytesOf(sections[symtab.link]));
    constexpr std::size_t kSymbol = 24;  // Elf64_Sym
    for (std::size_t at = 0; at + kSymbol <= symbols.size(); at += kSymbol) {
      const std::byte* sym = symbols.data() + at;
      const auto info = static_cast<std::uint8_t>(sym[4]);
      const auto shndx = load<std::uint16_t>(sym + 6);
      if ((info & 0xf) != 1 /* STT_OBJECT */ || shndx == 0 || shndx >= shnum) continue;
      const std::string_view section = stringAt(sectionNames, sections[shndx].name);
      if (!section.starts_with(".nv.global") && !section.starts_with(".nv.constant")) continue;
      const std::string_view name = stringAt(names, load<std::uint32_t>(sym));
      if (!name.empty()) globals.emplace_back(name);
    }
  }
  return globals;
}

}  // namespace phos::fatbin
