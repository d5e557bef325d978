// SPDX-License-Identifier: Apache-2.0
#include "session/pinned_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "session/session_files.h"
#include "session/session_image.h"

namespace phos::daemon {
namespace {

constexpr uintptr_t kWindow = 0x500000000000ull;
constexpr uintptr_t kSlice = 16ull << 30;  // 16 GiB per session
constexpr uint64_t kSlices = 1024;

size_t pageRound(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

void unmap(const PinnedRange& r) {
  munmap(reinterpret_cast<void*>(r.address), r.mapped);
  unlink(r.path.c_str());
}

}  // namespace

uintptr_t PinnedMemory::slice() const {
  if (!ranges_.empty()) {
    const uintptr_t first = ranges_.begin()->first;
    if (first >= kWindow) return first - (first - kWindow) % kSlice;
  }
  return kWindow + (session_ % kSlices) * kSlice;
}

Result<PinnedRange> PinnedMemory::create(const std::string& ringPath, size_t bytes, unsigned flags,
                                         bool managed, uint64_t context) {
  PinnedRange r;
  r.bytes = bytes;
  r.mapped = pageRound(bytes == 0 ? 1 : bytes);
  r.flags = flags;
  r.managed = managed;
  r.context = context;
  do {
    r.path = fmt::format("{}-pinned-{}", ringPath, ++serial_);
  } while (std::any_of(ranges_.begin(), ranges_.end(), [&](const auto& e) { return e.second.path == r.path; }));
  // The first gap that holds it, inside the slice (a restored session keeps
  // the slice its ranges were in): a program that allocates and frees in a
  // loop reuses its addresses.
  const uintptr_t base = slice();
  uintptr_t at = base;
  for (const auto& [address, range] : ranges_) {
    if (address - at >= r.mapped) break;
    at = address + range.mapped;
  }
  if (r.mapped > kSlice || at - base > kSlice - r.mapped) {
    return makeError(Code::kResourceExhausted,
                     "pinned and managed memory of session {} would exceed {} bytes", session_,
                     kSlice);
  }
  RETURN_IF_ERROR(mapSessionFile(r.path, r.mapped, uid_, at).status());
  r.address = at;
  ranges_[r.address] = r;
  return r;
}

const PinnedRange* PinnedMemory::find(uintptr_t p) const {
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return nullptr;
  --it;
  const PinnedRange& r = it->second;
  return p - r.address < r.bytes ? &r : nullptr;
}

bool PinnedMemory::remove(uintptr_t address) {
  auto it = ranges_.find(address);
  if (it == ranges_.end()) return false;
  unmap(it->second);
  ranges_.erase(it);
  return true;
}

void PinnedMemory::clear() {
  for (const auto& [address, r] : ranges_) unmap(r);
  ranges_.clear();
}

uint64_t PinnedMemory::bytes() const {
  uint64_t total = 0;
  for (const auto& [address, r] : ranges_) total += r.bytes;
  return total;
}

Result<nlohmann::json> PinnedMemory::save(image::ImageWriter& writer, PhaseProgress& phase) const {
  nlohmann::json saved = nlohmann::json::array();
  for (const auto& [address, r] : ranges_) {
    std::string name = fmt::format("pinned/{}", hex(address));
    ASSIGN_OR_RETURN(size_t blob, writer.addBlob(name, "pinned-host", r.bytes, {{"address", address}}));
    RETURN_IF_ERROR(writer.writeBlob(blob, {reinterpret_cast<const std::byte*>(address), r.bytes}));
    phase.advance(r.bytes);
    saved.push_back({{"address", address},
                     {"bytes", r.bytes},
                     {"mapped", r.mapped},
                     {"flags", r.flags},
                     {"managed", r.managed},
                     {"path", r.path},
                     {"context", r.context},
                     {"blob", name}});
  }
  return saved;
}

Status PinnedMemory::rebuild(const image::ImageReader& reader, const nlohmann::json& saved, pid_t pid,
                             const std::function<Status(const PinnedRange&)>& mapped) {
  // The same file path, mapped at the same address.
  for (const nlohmann::json& p : saved) {
    PinnedRange r;
    ASSIGN_OR_RETURN(r.address, field<uint64_t>(p, "address", "pinned"));
    ASSIGN_OR_RETURN(r.bytes, field<uint64_t>(p, "bytes", "pinned"));
    ASSIGN_OR_RETURN(r.mapped, field<uint64_t>(p, "mapped", "pinned"));
    ASSIGN_OR_RETURN(r.path, field<std::string>(p, "path", "pinned"));
    r.flags = p.value("flags", 0u);
    r.managed = p.value("managed", false);
    r.context = p.value("context", uint64_t{0});
    ASSIGN_OR_RETURN(size_t blob, blobOf(reader, p, "pinned"));
    RETURN_IF_ERROR(claimSessionPath(r.path, "", pid, uid_));  // the ring is the caller's
    RETURN_IF_ERROR(mapSessionFile(r.path, r.mapped, uid_, r.address).status());
    ranges_[r.address] = r;  // from here on clear() unmaps and removes it
    RETURN_IF_ERROR(reader.read(blob, 0, {reinterpret_cast<std::byte*>(r.address), r.bytes}));
    RETURN_IF_ERROR(mapped(r));
  }
  return Status::ok();
}

}  // namespace phos::daemon
