// SPDX-License-Identifier: Apache-2.0
// Choosing the PTX vgpu runs from a module image.
#include "fatbin.h"

#include <string_view>

#include <cuda.h>
#include <fmt/format.h>

#include "cu_status.h"
#include "phos/common/fatbin.h"
#include "phos/common/module_image.h"

namespace phos::vgpu {
namespace {

Status imageError(const Status& s) {
  return cuError(s.code() == Code::kInvalidArgument ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_IMAGE,
                 s.message());
}

// The newest PTX entry a device of `computeCapability` can JIT, with what the
// fatbin holds for the message when there is none.
Result<const fatbin::Entry*> bestPtx(const std::vector<fatbin::Entry>& entries, int computeCapability,
                                     std::string* held) {
  const fatbin::Entry* best = nullptr;
  for (const fatbin::Entry& e : entries) {
    *held += fmt::format("{}{} sm_{}", held->empty() ? "" : ", ",
                         e.kind == fatbin::Entry::Kind::kPtx ? "PTX" : "SASS", e.arch);
    if (e.kind != fatbin::Entry::Kind::kPtx || e.arch > computeCapability) continue;
    if (best == nullptr || e.arch > best->arch) best = &e;
  }
  return best;
}

Result<std::string> entryPtx(const fatbin::Entry& entry) {
  auto text = fatbin::contents(entry);
  if (!text.isOk()) return imageError(text.status());
  std::string ptx = std::move(text).value();
  if (auto nul = ptx.find('\0'); nul != std::string::npos) ptx.resize(nul);
  return ptx;
}

Result<std::string> ptxText(std::span<const std::byte> image) {
  std::string_view text(reinterpret_cast<const char*>(image.data()), image.size());
  if (auto nul = text.find('\0'); nul != std::string_view::npos) text = text.substr(0, nul);
  if (text.find(".version") == std::string_view::npos) {
    return cuError(CUDA_ERROR_INVALID_IMAGE, "image is neither a fatbin, a cubin nor PTX text");
  }
  return std::string(text);
}

}  // namespace

Result<std::vector<std::byte>> copyModuleImage(const void* image) {
  auto extent = module_image::extent(image);
  if (!extent.isOk()) return imageError(extent.status());
  auto bytes = module_image::copy(*extent);
  if (!bytes.isOk()) return imageError(bytes.status());
  return bytes;
}

Result<ModuleCode> moduleCode(std::span<const std::byte> image, int computeCapability) {
  if (fatbin::isFatbin(image)) {
    auto entries = fatbin::parse(image);
    if (!entries.isOk()) return imageError(entries.status());
    std::string held;
    ASSIGN_OR_RETURN(const fatbin::Entry* best, bestPtx(*entries, computeCapability, &held));
    if (best == nullptr) {
      return ModuleCode{{}, fmt::format("the fatbin holds {} and no PTX for compute capability {}.{} or older",
                                        held.empty() ? "nothing" : held, computeCapability / 10,
                                        computeCapability % 10)};
    }
    ASSIGN_OR_RETURN(std::string ptx, entryPtx(*best));
    return ModuleCode{std::move(ptx), {}};
  }
  if (fatbin::isCubin(image)) return ModuleCode{{}, "the image is a cubin (machine code); vgpu runs PTX only"};
  ASSIGN_OR_RETURN(std::string ptx, ptxText(image));
  return ModuleCode{std::move(ptx), {}};
}

int ptxArchitecture(std::string_view ptx) {
  for (std::size_t at = ptx.find(".target"); at != std::string_view::npos; at = ptx.find(".target", at + 1)) {
    // A directive at the start of a line, not `.target` inside a comment's text.
    std::size_t line = ptx.rfind('\n', at);
    std::string_view before = ptx.substr(line == std::string_view::npos ? 0 : line + 1,
                                         at - (line == std::string_view::npos ? 0 : line + 1));
    if (before.find_first_not_of(" \t") != std::string_view::npos) continue;
    std::size_t sm = ptx.find_first_not_of(" \t", at + 7);
    if (sm == std::string_view::npos || ptx.compare(sm, 3, "sm_") != 0) return 0;
    int arch = 0;
    for (std::size_t i = sm + 3; i < ptx.size() && ptx[i] >= '0' && ptx[i] <= '9'; ++i) {
      arch = arch * 10 + (ptx[i] - '0');
    }
    return arch;
  }
  return 0;
}

Result<std::string> extractPtx(const void* image, int computeCapability) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, copyModuleImage(image));
  ASSIGN_OR_RETURN(ModuleCode code, moduleCode(bytes, computeCapability));
  if (!code.noBinary.empty()) return cuError(CUDA_ERROR_NO_BINARY_FOR_GPU, code.noBinary);
  return std::move(code.ptx);
}

}  // namespace phos::vgpu
