// SPDX-License-Identifier: Apache-2.0
#include "session/pinned_memory.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "session/session_files.h"
#include "session/session_image.h"

namespace phos::daemon {
namespace {

// 0x500000000000..0x540000000000: below where programs are loaded and their
// heaps lie (from 0x555555554000, 1 TiB of randomisation above it), whose
// pages the program may register.
constexpr uintptr_t kWindow = 0x500000000000ull;
constexpr uintptr_t kSlice = 16ull << 30;  // 16 GiB per session
constexpr uint64_t kSlices = 256;
constexpr uintptr_t kWindowEnd = kWindow + kSlices * kSlice;
// Where phosd and vgpu hand out addresses, from the sessions' VMM windows
// (application_vmm.h) to the end of the pinned memory's, above the heaps'
// (device_heap.h): no registered range may lie there, or it would take
// another session's addresses.
constexpr uintptr_t kHandedOutBegin = 0x100000000000ull;
constexpr uintptr_t kHandedOutEnd = kWindowEnd;

size_t pageSize() {
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

size_t pageRound(size_t n) {
  const size_t page = pageSize();
  return (n + page - 1) / page * page;
}

bool inWindow(uintptr_t address) {
  return address >= kWindow && address < kWindowEnd;
}

// Why the pages of a registration at `address` (page-aligned, `mapped`
// bytes) cannot be, or empty.
std::string registrationRefusal(uintptr_t address, size_t mapped) {
  if (mapped == 0 || address > UINTPTR_MAX - mapped) return "the range wraps around";
  if (address < kHandedOutEnd && address + mapped > kHandedOutBegin) {
    return fmt::format("{:#x}+{} lies in the addresses phosd hands out ({:#x}..{:#x})", address,
                       mapped, kHandedOutBegin, kHandedOutEnd);
  }
  return "";
}

void unmap(const PinnedRange& r) {
  munmap(reinterpret_cast<void*>(r.address), r.mapped);
  unlink(r.path.c_str());
}

}  // namespace

uintptr_t PinnedMemory::slice() const {
  for (const auto& [address, range] : ranges_) {
    if (inWindow(address)) return address - (address - kWindow) % kSlice;
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
  for (auto it = ranges_.lower_bound(base); it != ranges_.end() && inWindow(it->first); ++it) {
    const auto& [address, range] = *it;
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

Result<PinnedRange> PinnedMemory::createRegistered(const std::string& ringPath, uintptr_t p,
                                                   size_t bytes, unsigned flags, uint64_t context) {
  PinnedRange r;
  r.registered = p;
  r.address = p - p % pageSize();
  if (bytes == 0 || p > UINTPTR_MAX - bytes) {
    return makeError(Code::kInvalidArgument, "{:#x}+{} wraps around", p, bytes);
  }
  r.registeredBytes = bytes;
  r.mapped = pageRound(p + bytes - r.address);
  r.bytes = r.mapped;
  r.flags = flags;
  r.context = context;
  if (std::string why = registrationRefusal(r.address, r.mapped); !why.empty()) {
    return makeError(Code::kNotSupported, "cannot register {:#x}+{}: {}", p, bytes, why);
  }
  // The driver pins what it registers, so no more than the host's memory can
  // be; phosd's files would hold it (and a checkpoint would save it).
  uint64_t registered = 0;
  for (const auto& [address, range] : ranges_) {
    registered += range.registered != 0 ? range.mapped : 0;
  }
  const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * pageSize();
  if (r.mapped > physical || registered > physical - r.mapped) {
    return makeError(Code::kResourceExhausted,
                     "cannot register {:#x}+{}: the session's registered memory would exceed the "
                     "host's {} bytes",
                     p, bytes, physical);
  }
  // Pages are registered once: an overlap with any range of the session is
  // the driver's CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.
  auto next = ranges_.lower_bound(r.address);
  const bool overlapsNext = next != ranges_.end() && next->first < r.address + r.mapped;
  const bool overlapsPrevious = next != ranges_.begin() &&
                                std::prev(next)->first + std::prev(next)->second.mapped > r.address;
  if (overlapsNext || overlapsPrevious) {
    return makeError(Code::kAlreadyExists,
                     "cannot register {:#x}+{}: its pages hold pinned or registered memory already",
                     p, bytes);
  }
  do {
    r.path = fmt::format("{}-registered-{}", ringPath, ++serial_);
  } while (std::any_of(ranges_.begin(), ranges_.end(),
                       [&](const auto& e) { return e.second.path == r.path; }));
  auto mapped = mapSessionFile(r.path, r.mapped, uid_, r.address);
  if (!mapped.isOk()) {
    return makeError(Code::kNotSupported, "cannot register {:#x}+{}: phosd has memory there ({})",
                     p, bytes, mapped.status().message());
  }
  ranges_[r.address] = r;
  return r;
}

const PinnedRange* PinnedMemory::findRegistered(uintptr_t p) const {
  const PinnedRange* r = find(p);
  return r != nullptr && r->registered == p ? r : nullptr;
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
                     {"registered", r.registered},
                     {"registered_bytes", r.registeredBytes},
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
    r.registered = p.value("registered", uint64_t{0});
    r.registeredBytes = p.value("registered_bytes", uint64_t{0});
    // An untrusted image: allocated ranges lie in the window, registered
    // ones are the pages of their registration, outside every window.
    if (r.mapped == 0 || r.mapped != pageRound(r.bytes) || r.address % pageSize() != 0) {
      return makeError(Code::kInvalidArgument,
                       "pinned range {}: {} bytes in {} mapped are not its pages", hex(r.address),
                       r.bytes, r.mapped);
    }
    if (r.registered == 0 && (!inWindow(r.address) || r.mapped > kWindowEnd - r.address)) {
      return makeError(Code::kInvalidArgument, "pinned range {} lies outside the pinned window",
                       hex(r.address));
    }
    if (r.registered != 0) {
      // The registration starts in the first page and ends in the last.
      const uintptr_t end = r.registered + r.registeredBytes;
      if (r.bytes != r.mapped || r.registered < r.address ||
          r.registered - r.address >= pageSize() || r.registeredBytes == 0 || end < r.registered ||
          end > r.address + r.mapped || end <= r.address + r.mapped - pageSize()) {
        return makeError(Code::kInvalidArgument, "registered range {} is not the pages of {}+{}",
                         hex(r.address), hex(r.registered), r.registeredBytes);
      }
      if (std::string why = registrationRefusal(r.address, r.mapped); !why.empty()) {
        return makeError(Code::kInvalidArgument, "registered range {}: {}", hex(r.address), why);
      }
    }
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
