// SPDX-License-Identifier: Apache-2.0
// Fatbin parsing and decompression (zstd, LZ4) for module loading.
#include "fatbin.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include <cuda.h>
#include <fmt/format.h>
#include <lz4.h>
#include <zstd.h>

#include "cu_status.h"
#include "phos/common/module_image.h"

namespace phos::vgpu {
namespace {

template <typename T>
T load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

constexpr std::size_t kContainerHeader = 16;
constexpr std::size_t kMinEntryHeader = 0x40;
// A sanity bound: no real fatbin container handed to cuModuleLoadData is near 4 GiB.
constexpr std::uint64_t kMaxContainer = std::uint64_t{4} << 30;

}  // namespace

Result<std::vector<std::byte>> copyModuleImage(const void* image) {
  auto extent = module_image::extent(image);
  if (!extent.isOk()) {
    return cuError(extent.status().code() == Code::kInvalidArgument ? CUDA_ERROR_INVALID_VALUE
                                                                    : CUDA_ERROR_INVALID_IMAGE,
                   extent.status().message());
  }
  auto bytes = module_image::copy(*extent);
  if (!bytes.isOk()) return cuError(CUDA_ERROR_INVALID_IMAGE, bytes.status().message());
  return bytes;
}

Result<ModuleCode> moduleCode(std::span<const std::byte> image, int computeCapability) {
  if (image.size() >= 4 && load<std::uint32_t>(image.data()) == kFatbinMagic) {
    ASSIGN_OR_RETURN(std::vector<FatbinEntry> entries, parseFatbin(image.data()));
    const FatbinEntry* best = nullptr;
    std::string held;
    for (const FatbinEntry& e : entries) {
      held += fmt::format("{}{} sm_{}", held.empty() ? "" : ", ", e.kind == FatbinEntry::Kind::kPtx ? "PTX" : "SASS",
                          e.arch);
      if (e.kind != FatbinEntry::Kind::kPtx || e.arch > computeCapability) continue;
      if (best == nullptr || e.arch > best->arch) best = &e;
    }
    if (best == nullptr) {
      return ModuleCode{{}, fmt::format("the fatbin holds {} and no PTX for compute capability {}.{} or older",
                                        held.empty() ? "nothing" : held, computeCapability / 10,
                                        computeCapability % 10)};
    }
    ASSIGN_OR_RETURN(std::string ptx, entryContents(*best));
    if (auto nul = ptx.find('\0'); nul != std::string::npos) ptx.resize(nul);
    return ModuleCode{std::move(ptx), {}};
  }
  if (image.size() >= 4 && std::memcmp(image.data(), "\x7f" "ELF", 4) == 0) {
    return ModuleCode{{}, "the image is a cubin (machine code); vgpu runs PTX only"};
  }
  std::string_view text(reinterpret_cast<const char*>(image.data()), image.size());
  if (auto nul = text.find('\0'); nul != std::string_view::npos) text = text.substr(0, nul);
  if (text.find(".version") == std::string_view::npos) {
    return cuError(CUDA_ERROR_INVALID_IMAGE, "image is neither a fatbin, a cubin nor PTX text");
  }
  return ModuleCode{std::string(text), {}};
}

Result<std::vector<FatbinEntry>> parseFatbin(const std::byte* data) {
  if (load<std::uint32_t>(data) != kFatbinMagic) {
    return cuError(CUDA_ERROR_INVALID_IMAGE, "not a fatbin (bad magic)");
  }
  auto headerSize = load<std::uint16_t>(data + 6);
  auto size = load<std::uint64_t>(data + 8);
  if (headerSize < kContainerHeader || size > kMaxContainer) {
    return cuErrorf(CUDA_ERROR_INVALID_IMAGE, "fatbin header: header size {}, size {}", headerSize, size);
  }
  std::vector<FatbinEntry> entries;
  std::uint64_t offset = headerSize;
  const std::uint64_t end = headerSize + size;
  while (offset + kMinEntryHeader <= end) {
    const std::byte* e = data + offset;
    auto entryHeaderSize = load<std::uint32_t>(e + 0x04);
    auto payloadSize = load<std::uint64_t>(e + 0x08);
    if (entryHeaderSize < kMinEntryHeader || payloadSize > end - offset - entryHeaderSize) {
      return cuErrorf(CUDA_ERROR_INVALID_IMAGE,
                      "fatbin entry at offset {}: header {} bytes, payload {} bytes, container ends at {}",
                      offset, entryHeaderSize, payloadSize, end);
    }
    FatbinEntry entry;
    switch (load<std::uint16_t>(e)) {
      case 1: entry.kind = FatbinEntry::Kind::kPtx; break;
      case 2: entry.kind = FatbinEntry::Kind::kElf; break;
      default: entry.kind = FatbinEntry::Kind::kOther; break;
    }
    entry.arch = static_cast<int>(load<std::uint32_t>(e + 0x1c));
    entry.flags = load<std::uint64_t>(e + 0x28);
    auto compressedSize = load<std::uint32_t>(e + 0x10);
    std::size_t stored = payloadSize;
    if ((entry.compressedLz4() || entry.compressedZstd()) && compressedSize != 0 &&
        compressedSize <= payloadSize) {
      stored = compressedSize;
    }
    entry.payload = std::span<const std::byte>(e + entryHeaderSize, stored);
    entry.uncompressedSize = load<std::uint64_t>(e + 0x38);
    entries.push_back(entry);
    offset += entryHeaderSize + payloadSize;
  }
  return entries;
}

Result<std::string> entryContents(const FatbinEntry& entry) {
  std::string out;
  if (entry.compressedZstd()) {
    unsigned long long frame = ZSTD_getFrameContentSize(entry.payload.data(), entry.payload.size());
    std::size_t capacity = entry.uncompressedSize;
    if (frame != ZSTD_CONTENTSIZE_ERROR && frame != ZSTD_CONTENTSIZE_UNKNOWN) {
      capacity = std::max<std::size_t>(capacity, frame);
    }
    out.resize(capacity);
    std::size_t n = ZSTD_decompress(out.data(), out.size(), entry.payload.data(), entry.payload.size());
    if (ZSTD_isError(n)) {
      return cuErrorf(CUDA_ERROR_INVALID_IMAGE, "fatbin sm_{} entry: zstd: {}", entry.arch,
                      ZSTD_getErrorName(n));
    }
    out.resize(n);
  } else if (entry.compressedLz4()) {
    if (entry.uncompressedSize == 0 || entry.uncompressedSize > (std::size_t{1} << 31)) {
      return cuErrorf(CUDA_ERROR_INVALID_IMAGE, "fatbin sm_{} entry: LZ4 without a valid size ({})",
                      entry.arch, entry.uncompressedSize);
    }
    out.resize(entry.uncompressedSize);
    int n = LZ4_decompress_safe(reinterpret_cast<const char*>(entry.payload.data()), out.data(),
                                static_cast<int>(entry.payload.size()), static_cast<int>(out.size()));
    if (n < 0) {
      return cuErrorf(CUDA_ERROR_INVALID_IMAGE, "fatbin sm_{} entry: LZ4 data is damaged", entry.arch);
    }
    out.resize(static_cast<std::size_t>(n));
  } else {
    out.assign(reinterpret_cast<const char*>(entry.payload.data()), entry.payload.size());
  }
  return out;
}

Result<std::string> extractPtx(const void* image, int computeCapability) {
  if (image == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "image is null");
  const auto* bytes = static_cast<const std::byte*>(image);
  if (strnlen(static_cast<const char*>(image), 4) < 4) {
    return cuError(CUDA_ERROR_INVALID_IMAGE, "image is too short to be a module");
  }
  std::uint32_t magic = load<std::uint32_t>(bytes);
  if (magic == kFatbinWrapperMagic) {
    // __fatBinC_Wrapper_t: int magic, int version, const unsigned long long* data, ...
    const void* inner = load<const void*>(bytes + 8);
    if (inner == nullptr) return cuError(CUDA_ERROR_INVALID_IMAGE, "fatbin wrapper without data");
    return extractPtx(inner, computeCapability);
  }
  if (magic == kFatbinMagic) {
    ASSIGN_OR_RETURN(std::vector<FatbinEntry> entries, parseFatbin(bytes));
    const FatbinEntry* best = nullptr;
    for (const FatbinEntry& e : entries) {
      if (e.kind != FatbinEntry::Kind::kPtx || e.arch > computeCapability) continue;
      if (best == nullptr || e.arch > best->arch) best = &e;
    }
    if (best == nullptr) {
      return cuErrorf(CUDA_ERROR_NO_BINARY_FOR_GPU,
                      "fatbin has {} entries and no PTX for compute capability <= {}",
                      entries.size(), computeCapability);
    }
    ASSIGN_OR_RETURN(std::string ptx, entryContents(*best));
    if (auto nul = ptx.find('\0'); nul != std::string::npos) ptx.resize(nul);
    return ptx;
  }
  if (std::memcmp(bytes, "\x7f" "ELF", 4) == 0) {
    return cuError(CUDA_ERROR_NO_BINARY_FOR_GPU,
                   "image is a cubin (machine code); vgpu runs PTX only");
  }
  std::string_view text(static_cast<const char*>(image));
  if (text.find(".version") == std::string_view::npos) {
    return cuError(CUDA_ERROR_INVALID_IMAGE, "image is neither a fatbin, a cubin nor PTX text");
  }
  return std::string(text);
}

}  // namespace phos::vgpu
