// SPDX-License-Identifier: Apache-2.0
// The speculation accuracy harness on the vgpu engine: recorder versus speculation,
// twin versus original, and what the twins report.
#include "speculation_accuracy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "launch_table.h"
#include "phos/instrument/access_bounds.h"
#include "phos/instrument/signature.h"
#include "phos/instrument/speculation.h"
#include "phos/instrument/twin.h"
#include "phos/ptx/parser.h"
#include "phos/ptx/printer.h"
#include "phos/vgpu/engine.h"
#include "phos/vgpu/program.h"

namespace phos::bench::speculation {
namespace {

namespace instr = phos::instrument;
namespace vg = phos::vgpu;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kReportCapacity = 64;

// "Device" memory for one loaded module: a single reserved host mapping handed out
// front to back. Allocations are contiguous (rounded to their alignment), which is
// what lets a deliberate out-of-bounds write land in the next allocation instead of
// faulting, as it does on a GPU whose allocator packs small buffers together.
class ArenaMemory final : public vg::DeviceMemory, public vg::AddressChecker {
 public:
  static constexpr size_t kReserve = size_t{1} << 30;

  ArenaMemory() {
    void* p = mmap(nullptr, kReserve, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? 0 : reinterpret_cast<uint64_t>(p);
    next_ = base_;
  }
  ~ArenaMemory() override {
    if (base_ != 0) munmap(reinterpret_cast<void*>(base_), kReserve);
  }
  ArenaMemory(const ArenaMemory&) = delete;
  ArenaMemory& operator=(const ArenaMemory&) = delete;

  Result<uint64_t> allocate(std::string_view, size_t bytes, size_t alignment, bool) override {
    return allocate(bytes, alignment);
  }
  Result<uint64_t> allocate(size_t bytes, size_t alignment) {
    uint64_t align = std::max<uint64_t>(alignment, 1);
    uint64_t at = (next_ + align - 1) / align * align;
    if (base_ == 0 || at + bytes > base_ + kReserve) {
      return makeError(Code::kResourceExhausted, "arena: {} bytes do not fit", bytes);
    }
    std::memset(reinterpret_cast<void*>(at), 0, bytes);
    std::lock_guard lock(mutex_);
    allocations_[at] = bytes;
    next_ = at + bytes;
    return at;
  }
  Status write(uint64_t address, std::span<const std::byte> bytes) override {
    if (!isAccessible(address, bytes.size())) {
      return makeError(Code::kOutOfRange, "arena: write of {} bytes at {:#x} outside allocations",
                       bytes.size(), address);
    }
    std::memcpy(reinterpret_cast<void*>(address), bytes.data(), bytes.size());
    return Status::ok();
  }
  int device() const override { return 0; }
  int computeCapability() const override { return 80; }

  // An access may span allocations that touch (a vector store across the end of
  // one buffer into the next), as it may on a GPU where both are mapped.
  bool isAccessible(uint64_t address, size_t size) const override {
    std::lock_guard lock(mutex_);
    if (address + size < address) return false;
    auto it = allocations_.upper_bound(address);
    if (it == allocations_.begin()) return false;
    --it;
    if (address >= it->first + it->second) return false;
    uint64_t covered = it->first + it->second;
    for (++it; covered < address + size && it != allocations_.end() && it->first == covered; ++it) {
      covered = it->first + it->second;
    }
    return covered >= address + size;
  }

  // Everything allocated after `mark()` is dropped by `release()`: the module's
  // globals stay, the buffers of the previous launch go.
  uint64_t mark() const { return next_; }
  void release(uint64_t mark) {
    std::lock_guard lock(mutex_);
    allocations_.erase(allocations_.lower_bound(mark), allocations_.end());
    next_ = mark;
  }
  std::optional<instr::Buffer> find(uint64_t address) const {
    std::lock_guard lock(mutex_);
    auto it = allocations_.upper_bound(address);
    if (it == allocations_.begin()) return std::nullopt;
    --it;
    if (address >= it->first + it->second) return std::nullopt;
    return instr::Buffer{it->first, it->second};
  }

 private:
  uint64_t base_ = 0;
  uint64_t next_ = 0;
  mutable std::mutex mutex_;
  std::map<uint64_t, uint64_t> allocations_;
};

class DiscardPrintf final : public vg::PrintfSink {
 public:
  void write(std::string_view) override {}
};

// splitmix64: a counter-based generator, so a buffer's contents depend only on
// (kernel, buffer index, element index), never on the library's distributions.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double unit(uint64_t seed, size_t i) {
  return (mix(seed ^ mix(i)) >> 11) * 0x1.0p-53;
}

uint16_t toHalf(float f) {
  // Values here are in [-1, 1]: normal halves or zero; round to nearest even.
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (exp <= 0) return static_cast<uint16_t>(sign);  // flush the tiny ones
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}
uint16_t toBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

size_t elementSize(Fill fill) {
  switch (fill) {
    case Fill::kF64:
    case Fill::kU64:
      return 8;
    case Fill::kF32:
    case Fill::kI32:
    case Fill::kU32:
      return 4;
    case Fill::kF16:
    case Fill::kBF16:
      return 2;
    case Fill::kZero:
    case Fill::kU8:
    case Fill::kText:
      return 1;
  }
  return 1;
}

void fillBuffer(const BufferSpec& spec, uint64_t seed, std::byte* out) {
  auto put = [&](size_t i, auto v) { std::memcpy(out + i * sizeof(v), &v, sizeof(v)); };
  auto between = [&](size_t i) { return spec.lo + (spec.hi - spec.lo) * unit(seed, i); };
  for (size_t i = 0; i < spec.count; ++i) {
    switch (spec.fill) {
      case Fill::kZero:
        put(i, uint8_t{0});
        break;
      case Fill::kF32:
        put(i, static_cast<float>(between(i)));
        break;
      case Fill::kF64:
        put(i, between(i));
        break;
      case Fill::kF16:
        put(i, toHalf(static_cast<float>(between(i))));
        break;
      case Fill::kBF16:
        put(i, toBf16(static_cast<float>(between(i))));
        break;
      case Fill::kI32:
        put(i, static_cast<int32_t>(std::floor(spec.lo + (spec.hi - spec.lo + 1) * unit(seed, i))));
        break;
      case Fill::kU32:
        put(i,
            static_cast<uint32_t>(std::floor(spec.lo + (spec.hi - spec.lo + 1) * unit(seed, i))));
        break;
      case Fill::kU64:
        put(i, mix(seed ^ mix(i)));
        break;
      case Fill::kU8:
        put(i, static_cast<uint8_t>(std::floor(spec.lo + (spec.hi - spec.lo + 1) * unit(seed, i))));
        break;
      case Fill::kText:
        put(i, static_cast<uint8_t>(i < spec.text.size() ? spec.text[i] : 0));
        break;
    }
  }
}

uint64_t hashName(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

std::string_view modeName(instr::TwinMode m) {
  return m == instr::TwinMode::kCheckpoint ? "checkpoint" : "restore";
}

// The original module loaded on its own arena and, beside it in the same arena
// as phosd loads it, the twin module of one mode with its address table filled
// (docs/twins.md); no twin module when none could be built.
struct LoadedModule {
  ArenaMemory memory;
  std::unique_ptr<vg::Program> program;
  std::unique_ptr<vg::Program> twins;
  // Kernels that reach a call through a function pointer (see runLaunch).
  std::set<std::string> callThroughPointers;
  uint64_t mark = 0;
  bool hasTwins = false;
  std::string error;
  instr::TwinStats stats;

  std::optional<size_t> function(std::string_view name) const {
    const auto& fs = program->functions();
    for (size_t i = 0; i < fs.size(); ++i) {
      if (fs[i].name == name) return i;
    }
    return std::nullopt;
  }
  std::optional<size_t> twinFunction(std::string_view name) const {
    const auto& fs = twins->functions();
    for (size_t i = 0; i < fs.size(); ++i) {
      if (fs[i].name == name) return i;
    }
    return std::nullopt;
  }
  const vg::GlobalInfo* global(std::string_view name) const {
    for (const auto& g : program->globals()) {
      if (g.name == name) return &g;
    }
    return nullptr;
  }
};

Result<std::unique_ptr<vg::Program>> loadProgram(LoadedModule& m, const std::string& text, uint32_t workers) {
  ASSIGN_OR_RETURN(std::unique_ptr<vg::Program> program, vg::engine::makeProgramLoader()->load(text, m.memory));
  vg::engine::setWorkerThreads(*program, workers);
  m.mark = m.memory.mark();
  return program;
}

// Whether `body` calls through a register (a function pointer); the names it
// calls directly go to `callees`.
bool callsThroughPointer(const std::vector<ptx::Statement>& body, std::vector<std::string>& callees) {
  bool found = false;
  for (const ptx::Statement& s : body) {
    if (const auto* block = std::get_if<ptx::Block>(&s.value)) {
      found = callsThroughPointer(block->statements, callees) || found;
      continue;
    }
    const auto* inst = std::get_if<ptx::Instruction>(&s.value);
    if (inst == nullptr || inst->opcode != ptx::Opcode::kCall) continue;
    for (const ptx::Operand& o : inst->operands) {
      if (o.kind == ptx::OperandKind::kList) continue;  // the return values
      if (o.kind == ptx::OperandKind::kRegister) found = true;
      if (o.kind == ptx::OperandKind::kSymbol) callees.push_back(o.name);
      break;
    }
  }
  return found;
}

// The kernels of `module` that reach a call through a function pointer.
std::set<std::string> kernelsCallingThroughPointers(const ptx::Module& module) {
  std::map<std::string, const ptx::Function*> defined;
  for (const ptx::ModuleItem& item : module.items) {
    if (const auto* f = std::get_if<ptx::Function>(&item); f && f->hasBody) defined[f->name] = f;
  }
  std::set<std::string> out;
  for (const auto& [name, kernel] : defined) {
    if (!kernel->isEntry) continue;
    std::set<std::string> seen;
    std::vector<std::string> pending = {name};
    while (!pending.empty()) {
      std::string next = std::move(pending.back());
      pending.pop_back();
      auto it = defined.find(next);
      if (it == defined.end() || !seen.insert(next).second) continue;
      if (callsThroughPointer(it->second->body, pending)) {
        out.insert(name);
        break;
      }
    }
  }
  return out;
}

// Loads the twin module beside the original and points its table at the
// original's variables, as phosd does.
Status loadTwins(LoadedModule& m, const ptx::Module& twins, uint32_t workers) {
  ASSIGN_OR_RETURN(m.twins, loadProgram(m, ptx::print(twins), workers));
  if (m.stats.globals.empty()) return Status::ok();
  std::vector<uint64_t> addresses;
  for (const std::string& name : m.stats.globals) {
    const vg::GlobalInfo* g = m.global(name);
    if (g == nullptr) return makeError(Code::kNotFound, "the original module has no variable {}", name);
    addresses.push_back(g->address);
  }
  for (const auto& g : m.twins->globals()) {
    if (g.name == instr::kGlobalTable) {
      return m.memory.write(g.address, std::as_bytes(std::span(addresses)));
    }
  }
  return makeError(Code::kNotFound, "the twin module has no {}", instr::kGlobalTable);
}

// The memory of one prepared launch: its buffers, and the module's globals, as
// regions whose bytes are snapshotted before and compared after.
struct Region {
  std::string name;
  uint64_t address = 0;
  uint64_t size = 0;
  bool compare = true;
};

struct PreparedLaunch {
  std::vector<Region> regions;  // buffers first (by index), then globals
  std::vector<std::vector<std::byte>> initial;
  std::vector<uint64_t> bufferBase;
  std::vector<std::byte> params;    // the original's parameter buffer
  uint64_t ranges = 0, report = 0;  // twin tables
  uint32_t rangeCapacity = 0;

  void restore() const {
    for (size_t i = 0; i < regions.size(); ++i) {
      std::memcpy(reinterpret_cast<void*>(regions[i].address), initial[i].data(), regions[i].size);
    }
  }
  std::vector<std::vector<std::byte>> capture() const {
    std::vector<std::vector<std::byte>> out(regions.size());
    for (size_t i = 0; i < regions.size(); ++i) {
      const auto* p = reinterpret_cast<const std::byte*>(regions[i].address);
      out[i].assign(p, p + regions[i].size);
    }
    return out;
  }
};

void patchPointers(std::byte* base, const std::vector<PointerSlot>& slots,
                   const std::vector<uint64_t>& bufferBase) {
  for (const PointerSlot& s : slots) {
    uint64_t address = bufferBase.at(s.buffer) + static_cast<uint64_t>(s.delta);
    if (s.highOffset == 0) {
      std::memcpy(base + s.offset, &address, 8);
    } else {
      uint32_t low = static_cast<uint32_t>(address), high = static_cast<uint32_t>(address >> 32);
      std::memcpy(base + s.offset, &low, 4);
      std::memcpy(base + s.offset + s.highOffset, &high, 4);
    }
  }
}

Result<PreparedLaunch> prepare(LoadedModule& m, const LaunchSpec& spec, const vg::FunctionInfo& f) {
  m.memory.release(m.mark);
  PreparedLaunch p;
  uint64_t seed = hashName(spec.kernel);
  for (size_t k = 0; k < spec.buffers.size(); ++k) {
    const BufferSpec& b = spec.buffers[k];
    // The allocation has the requested size (what the BufferLookup reports, hence
    // what over-tracing measures); it starts at the next multiple of its alignment.
    uint64_t bytes = std::max<uint64_t>(b.count * elementSize(b.fill), 1);
    ASSIGN_OR_RETURN(uint64_t at, m.memory.allocate(bytes, b.alignment));
    fillBuffer(b, seed ^ mix(k + 1), reinterpret_cast<std::byte*>(at));
    p.bufferBase.push_back(at);
    p.regions.push_back({fmt::format("buffer {}", k), at, bytes, !b.nondeterministic});
  }
  for (size_t k = 0; k < spec.buffers.size(); ++k) {
    patchPointers(reinterpret_cast<std::byte*>(p.bufferBase[k]), spec.buffers[k].pointers,
                  p.bufferBase);
  }
  for (const GlobalInit& g : spec.globals) {
    const vg::GlobalInfo* info = m.global(g.name);
    if (info == nullptr || info->size < g.bytes.size()) {
      return makeError(Code::kNotFound, "module has no global {} of {} bytes", g.name,
                       g.bytes.size());
    }
    auto* at = reinterpret_cast<std::byte*>(info->address);
    std::memcpy(at, g.bytes.data(), g.bytes.size());
    patchPointers(at, g.pointers, p.bufferBase);
  }
  for (const auto& g : m.program->globals()) {
    if (g.size > 0) p.regions.push_back({"global " + g.name, g.address, g.size, true});
  }
  p.initial = p.capture();

  if (spec.args.size() != f.params.size()) {
    return makeError(Code::kInvalidArgument, "{}: the table gives {} arguments, the PTX has {}",
                     f.name, spec.args.size(), f.params.size());
  }
  p.params.assign(f.paramBufferSize, std::byte{0});
  for (size_t i = 0; i < spec.args.size(); ++i) {
    std::vector<std::byte> bytes = spec.args[i].bytes;
    bytes.resize(std::max(bytes.size(), f.params[i].size));
    patchPointers(bytes.data(), spec.args[i].pointers, p.bufferBase);
    std::memcpy(p.params.data() + f.params[i].offset, bytes.data(), f.params[i].size);
  }

  // The twin's tables live after the buffers so no write past a buffer reaches them.
  p.rangeCapacity = static_cast<uint32_t>(spec.buffers.size() + m.program->globals().size() + 1);
  ASSIGN_OR_RETURN(p.ranges, m.memory.allocate(p.rangeCapacity * sizeof(instr::RangeEntry), 256));
  ASSIGN_OR_RETURN(p.report, m.memory.allocate(sizeof(instr::ReportHeader) +
                                                   kReportCapacity * sizeof(instr::ReportEntry),
                                               256));
  return p;
}

// As phosd speculates: buffers from the signature, narrowed by `bounds` (when
// given) to the bytes the launch's accesses can reach.
instr::LaunchAccessSet speculate(const LoadedModule& m, const instr::KernelSignature& sig,
                                 const instr::AccessBounds* bounds, const LaunchSpec& spec,
                                 const PreparedLaunch& p, const HarnessOptions& options, uint64_t* wholeWriteBytes) {
  instr::BufferLookup buffers = [&](uint64_t address) -> std::optional<instr::Buffer> {
    std::optional<instr::Buffer> b = m.memory.find(address);
    if (b && options.widenBuffers != 0) {
      return instr::Buffer{b->base - options.widenBuffers, b->size + 2 * options.widenBuffers};
    }
    return b;
  };
  instr::GlobalLookup globals = [&](std::string_view name) -> std::optional<instr::Buffer> {
    const vg::GlobalInfo* g = m.global(name);
    if (g == nullptr) return std::nullopt;
    return instr::Buffer{g->address, g->size};
  };
  instr::LaunchAccessSet set = instr::speculateLaunch(sig, p.params, buffers, globals);
  for (const auto& b : set.writes) *wholeWriteBytes += b.size;
  if (bounds != nullptr) {
    const instr::LaunchShape shape{{spec.grid.x, spec.grid.y, spec.grid.z}, {spec.block.x, spec.block.y, spec.block.z}};
    bounds->narrow(set, p.params, shape, buffers, globals);
  }
  return set;
}

// Bytes of `ranges` not covered by any of `allowed` (both sorted); the first one
// found goes to `first`.
uint64_t uncovered(const std::vector<vg::ByteRange>& ranges,
                   const std::vector<instr::Buffer>& allowed, std::optional<vg::ByteRange>* first) {
  uint64_t missing = 0;
  for (const vg::ByteRange& r : ranges) {
    uint64_t at = r.begin;
    while (at < r.end) {
      const instr::Buffer* cover = nullptr;
      for (const instr::Buffer& b : allowed) {
        if (at >= b.base && at < b.base + b.size) cover = &b;
      }
      if (cover != nullptr) {
        at = std::min(r.end, cover->base + cover->size);
        continue;
      }
      uint64_t next = r.end;
      for (const instr::Buffer& b : allowed) {
        if (b.base > at && b.base < next) next = b.base;
      }
      if (first != nullptr && !first->has_value()) *first = vg::ByteRange{at, next};
      missing += next - at;
      at = next;
    }
  }
  return missing;
}

Status launchRaw(LoadedModule& m, vg::Program& program, size_t function, const LaunchSpec& spec,
                 std::span<const std::byte> params) {
  vg::LaunchConfig config;
  config.grid = {spec.grid.x, spec.grid.y, spec.grid.z};
  config.block = {spec.block.x, spec.block.y, spec.block.z};
  config.dynamicSharedBytes = spec.dynamicShared;
  DiscardPrintf sink;
  vg::LaunchContext context;
  context.memory = &m.memory;
  context.printf = &sink;
  return program.launch(function, config, params, context);
}

// The twin's parameter buffer: the original's, then the three ABI words.
Result<std::vector<std::byte>> twinParams(const vg::FunctionInfo& original,
                                          const vg::FunctionInfo& twin, const PreparedLaunch& p,
                                          uint32_t rangeCount) {
  size_t n = original.params.size();
  if (twin.params.size() != n + 3) {
    return makeError(Code::kInvalidArgument, "twin {} has {} parameters, expected {} + 3",
                     twin.name, twin.params.size(), n);
  }
  for (size_t i = 0; i < n; ++i) {
    if (twin.params[i].offset != original.params[i].offset ||
        twin.params[i].size != original.params[i].size) {
      return makeError(Code::kInvalidArgument, "twin {} lays out parameter {} differently",
                       twin.name, i);
    }
  }
  std::vector<std::byte> out(twin.paramBufferSize, std::byte{0});
  std::memcpy(out.data(), p.params.data(), std::min(p.params.size(), out.size()));
  auto put = [&](size_t param, auto v) {
    if (twin.params[param].size == sizeof(v))
      std::memcpy(out.data() + twin.params[param].offset, &v, sizeof(v));
  };
  put(n, p.ranges);
  put(n + 1, rangeCount);
  put(n + 2, p.report);
  return out;
}

void resetTwinTables(const PreparedLaunch& p, const std::vector<instr::RangeEntry>& table) {
  std::memcpy(reinterpret_cast<void*>(p.ranges), table.data(),
              table.size() * sizeof(instr::RangeEntry));
  instr::ReportHeader header;
  header.capacity = kReportCapacity;
  std::memset(reinterpret_cast<void*>(p.report), 0,
              sizeof(instr::ReportHeader) + kReportCapacity * sizeof(instr::ReportEntry));
  std::memcpy(reinterpret_cast<void*>(p.report), &header, sizeof(header));
}

std::string firstDifference(const PreparedLaunch& p,
                            const std::vector<std::vector<std::byte>>& want,
                            const std::vector<std::vector<std::byte>>& got) {
  for (size_t i = 0; i < p.regions.size(); ++i) {
    if (!p.regions[i].compare) continue;
    for (size_t b = 0; b < want[i].size(); ++b) {
      if (want[i][b] != got[i][b]) {
        return fmt::format("{} byte {}: original {:#04x}, twin {:#04x}", p.regions[i].name, b,
                           static_cast<unsigned>(want[i][b]), static_cast<unsigned>(got[i][b]));
      }
    }
  }
  return {};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Runs one launch in one loaded module: the original (recorded when `primary`),
// then its twin on the same inputs.
void runLaunch(LoadedModule& m, instr::TwinMode mode, const LaunchSpec& spec,
               const instr::KernelSignature& sig, const instr::AccessBounds* bounds, size_t function, bool primary,
               const HarnessOptions& options, LaunchOutcome& out) {
  TwinRun& twin = mode == instr::TwinMode::kCheckpoint ? out.checkpoint : out.restore;
  const vg::FunctionInfo& f = m.program->functions()[function];
  auto prepared = prepare(m, spec, f);
  if (!prepared.isOk()) {
    (primary ? out.error : twin.error) = prepared.status().message();
    return;
  }
  PreparedLaunch& p = *prepared;
  uint64_t wholeWriteBytes = 0;
  instr::LaunchAccessSet set = speculate(m, sig, bounds, spec, p, options, &wholeWriteBytes);

  vg::engine::setRecordAccesses(*m.program, primary);
  Status st = launchRaw(m, *m.program, function, spec, p.params);
  vg::engine::setRecordAccesses(*m.program, false);
  if (!st.isOk()) {
    (primary ? out.error : twin.error) = "original: " + st.message();
    if (primary && st.message().find("unsupported instruction") != std::string::npos)
      out.unsupported = true;
    return;
  }
  if (primary) {
    out.ran = true;
    out.laneInstructions = vg::engine::lastLaunchStats(*m.program).laneInstructions;
    vg::AccessRecord record = vg::engine::lastLaunchAccesses(*m.program);
    out.incomplete = set.incomplete;
    for (const auto& b : set.writes) out.speculatedWriteBytes += b.size;
    out.wholeWriteBytes = wholeWriteBytes;
    for (const auto& r : record.writes) out.actualWriteBytes += r.end - r.begin;
    std::optional<vg::ByteRange> firstWrite, firstRead;
    out.writeMissed = uncovered(record.writes, set.writes, &firstWrite) > 0;
    std::vector<instr::Buffer> readable = set.reads;
    readable.insert(readable.end(), set.writes.begin(), set.writes.end());
    std::sort(readable.begin(), readable.end(), [](auto& a, auto& b) { return a.base < b.base; });
    out.readMissed = uncovered(record.reads, readable, &firstRead) > 0;
    auto describe = [&](const char* what, const vg::ByteRange& r) {
      std::string where = "no allocation";
      for (size_t k = 0; k < p.regions.size(); ++k) {
        if (r.begin >= p.regions[k].address && r.begin < p.regions[k].address + p.regions[k].size) {
          where = fmt::format("{} +{}", p.regions[k].name, r.begin - p.regions[k].address);
        }
      }
      return fmt::format("{} {} bytes at {}", what, r.end - r.begin, where);
    };
    if (firstWrite)
      out.missDetail = describe("wrote", *firstWrite);
    else if (firstRead)
      out.missDetail = describe("read", *firstRead);
  }
  auto expected = p.capture();

  if (!m.hasTwins) {
    twin.error = m.error;
    return;
  }
  if (m.callThroughPointers.count(f.name) != 0) {
    // The pointer is the program's, into the original module: the twin, in a
    // module of its own, cannot follow it. The generator lists such kernels
    // (kernelsWithUncheckedCalls) and phosd runs them as themselves; so does
    // this harness.
    p.restore();
    st = launchRaw(m, *m.program, function, spec, p.params);
    if (!st.isOk()) {
      twin.error = "original in place of the twin: " + st.message();
      return;
    }
    twin.ran = true;
    twin.staticFallback = true;
    twin.mismatch = firstDifference(p, expected, p.capture());
    twin.outputsIdentical = twin.mismatch.empty();
    return;
  }
  auto twinFunction = m.twinFunction(instr::twinName(f.name));
  if (!twinFunction) {
    twin.error = "no twin entry " + instr::twinName(f.name);
    return;
  }
  std::vector<instr::RangeEntry> table = rangeTable(set);
  if (options.permissiveRanges) table = {instr::RangeEntry{0, ~uint64_t{0}, 3, 0}};
  if (table.size() > p.rangeCapacity) {
    twin.error = "range table overflow";
    return;
  }
  auto tp =
      twinParams(f, m.twins->functions()[*twinFunction], p, static_cast<uint32_t>(table.size()));
  if (!tp.isOk()) {
    twin.error = tp.status().message();
    return;
  }
  p.restore();
  resetTwinTables(p, table);
  st = launchRaw(m, *m.twins, *twinFunction, spec, *tp);
  if (!st.isOk()) {
    twin.error = "twin: " + st.message();
    return;
  }
  twin.ran = true;
  const auto& listed = m.stats.kernelsWithUncheckedCalls;
  twin.staticFallback = std::find(listed.begin(), listed.end(), f.name) != listed.end();
  twin.laneInstructions = vg::engine::lastLaunchStats(*m.twins).laneInstructions;
  std::memcpy(&twin.reported, reinterpret_cast<const void*>(p.report), sizeof(uint32_t));
  twin.mismatch = firstDifference(p, expected, p.capture());
  twin.outputsIdentical = twin.mismatch.empty();

  if (options.measureWallTime) {
    // Batches sized on the original, samples interleaved so that drift of a shared
    // machine hits both alike. The inputs are restored before each batch only: the
    // launches of a batch run on what the previous one left, which changes values,
    // not the work (the corpus kernels' control flow does not depend on them).
    auto batch = [&](vg::Program& program, size_t fn, std::span<const std::byte> params, uint32_t count,
                     Status* s) {
      p.restore();
      resetTwinTables(p, table);
      auto t0 = Clock::now();
      for (uint32_t k = 0; k < count && s->isOk(); ++k) *s = launchRaw(m, program, fn, spec, params);
      return std::chrono::duration<double>(Clock::now() - t0).count() / count;
    };
    Status s1, s2;
    double once = batch(*m.program, function, p.params, 1, &s1);
    uint32_t count = 1;
    while (s1.isOk() && once * count < options.minBatchSeconds && count < 4096) count *= 2;
    std::vector<double> original, instrumented;
    for (uint32_t r = 0; r < options.repetitions && s1.isOk() && s2.isOk(); ++r) {
      original.push_back(batch(*m.program, function, p.params, count, &s1));
      instrumented.push_back(batch(*m.twins, *twinFunction, *tp, count, &s2));
    }
    twin.seconds = median(instrumented);
    twin.baselineSeconds = median(original);
    if (primary) out.seconds = twin.baselineSeconds;
  }
}

}  // namespace

std::vector<ModuleInput> corpusInputs(const std::string& corpusDir,
                                      const std::vector<std::string>& variants) {
  static const char* const kSources[] = {"saxpy",   "matmul",    "reduce", "normalize",  "adam",
                                         "atomics", "half_bf16", "misc",   "warp_tensor"};
  std::vector<ModuleInput> out;
  for (const std::string& v : variants) {
    if (v == "clang" || v == "numba") {
      std::vector<std::string> stems;
      if (v == "clang") stems = {"corpus_clang_kernels_clang"};
      for (const char* k : {"axpy", "block_sum", "math_2d", "histogram"}) {
        for (const char* flavour : {"", "_debug", "_lineinfo"}) {
          if (v == "numba") stems.push_back(fmt::format("corpus_numba_{}{}", k, flavour));
        }
      }
      for (const auto& stem : stems) {
        std::string path = corpusDir + "/" + stem + ".ptx";
        if (std::ifstream(path).good()) out.push_back({path, "corpus " + v, stem});
      }
      continue;
    }
    std::string label = v == "G" ? "corpus -G" : v == "nvrtc" ? "corpus NVRTC" : "corpus " + v;
    for (const char* src : kSources) {
      std::string stem = fmt::format("corpus_{}_{}", src, v);
      std::string path = corpusDir + "/" + stem + ".ptx";
      if (std::ifstream(path).good()) out.push_back({path, label, stem});
    }
  }
  return out;
}

Result<std::vector<LaunchOutcome>> runModule(const ModuleInput& input,
                                             const HarnessOptions& options,
                                             std::vector<std::string>* unknown) {
  std::ifstream in(input.path, std::ios::binary);
  if (!in) return makeError(Code::kNotFound, "cannot read {}", input.path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  ASSIGN_OR_RETURN(ptx::Module module, ptx::parseModule(text, input.path));
  ASSIGN_OR_RETURN(std::vector<instr::KernelSignature> signatures, instr::analyzeModule(module));
  std::map<std::string, const instr::KernelSignature*> byName;
  for (const auto& s : signatures) byName[s.name] = &s;

  // One loaded module per twin mode: each has its own globals, so the two modes
  // never see each other's side effects.
  std::vector<instr::TwinMode> modes = {instr::TwinMode::kCheckpoint, instr::TwinMode::kRestore};
  std::vector<std::unique_ptr<LoadedModule>> loaded;
  for (instr::TwinMode mode : modes) {
    auto m = std::make_unique<LoadedModule>();
    instr::TwinOptions to;
    to.mode = mode;
    // Accuracy is measured on the original module even without twins.
    auto program = loadProgram(*m, text, options.workers);
    RETURN_IF_ERROR_CTX(program.status(), input.path);
    m->program = std::move(program).value();
    m->callThroughPointers = kernelsCallingThroughPointers(module);
    auto twins = instr::buildTwinModule(module, to, &m->stats);
    if (twins.isOk()) {
      Status st = loadTwins(*m, *twins, options.workers);
      if (st.isOk())
        m->hasTwins = true;
      else
        m->error = fmt::format("{} twin module does not load: {}", modeName(mode), st.message());
    } else {
      m->error = fmt::format("{} twins not built: {}", modeName(mode), twins.status().message());
    }
    loaded.push_back(std::move(m));
  }

  std::vector<LaunchOutcome> outcomes;
  for (const auto& s : signatures) {
    std::shared_ptr<const instr::AccessBounds> bounds;
    if (const ptx::Function* f = module.findFunction(s.name); options.narrow && f != nullptr) {
      bounds = instr::AccessBounds::analyze(module, *f, s);
    }
    std::string key = tableKey(s.name);
    auto launches = launchesFor(key);
    if (launches.empty()) {
      if (unknown != nullptr) unknown->push_back(key);
      continue;
    }
    for (const LaunchSpec* spec : launches) {
      LaunchOutcome o;
      o.source = input.source;
      o.variant = input.variant;
      o.kernel = key;
      o.ptxName = s.name;
      o.deliberate = spec->deliberate;
      o.deliberateReadOnly = spec->deliberateReadOnly;
      for (size_t i = 0; i < modes.size(); ++i) {
        LoadedModule& m = *loaded[i];
        auto function = m.function(s.name);
        if (!function) {
          o.error = "entry not in the loaded module";
          break;
        }
        runLaunch(m, modes[i], *spec, s, bounds.get(), *function, i == 0, options, o);
        if (!o.ran) break;
      }
      outcomes.push_back(std::move(o));
    }
  }
  return outcomes;
}

Totals totals(const std::vector<LaunchOutcome>& outcomes) {
  Totals t;
  for (const auto& o : outcomes) {
    if (o.unsupported) {
      ++t.unsupported;
      continue;
    }
    ++t.launches;
    if (!o.ran) {
      ++t.errors;
      continue;
    }
    if (o.failed()) ++t.failed;
    t.undetected += o.undetectedCheckpoint() + o.undetectedRestore();
    t.falseAlarms += o.falseAlarmCheckpoint() + o.falseAlarmRestore();
    for (const TwinRun* r : {&o.checkpoint, &o.restore}) {
      if (!r->ran)
        ++t.twinErrors;
      else if (!r->outputsIdentical)
        ++t.mismatches;
    }
    if (o.deliberate) {
      ++t.deliberate;
      if (!o.failed()) ++t.deliberateNotMissed;
      // Caught: every twin that checks the missed access reported it.
      auto handled = [](const TwinRun& r) { return r.ran && (r.reported > 0 || r.staticFallback); };
      bool caught = handled(o.restore) && (o.deliberateReadOnly || handled(o.checkpoint));
      if (caught) ++t.deliberateCaught;
      if (caught && o.checkpoint.reported == 0 && o.restore.reported == 0) ++t.deliberateByFallback;
    }
  }
  return t;
}

namespace {

std::string ratio(uint64_t num, uint64_t den) {
  return den == 0 ? std::string("-") : fmt::format("{:.2f}", static_cast<double>(num) / den);
}

}  // namespace

std::string formatAccuracyTable(const std::vector<LaunchOutcome>& outcomes) {
  std::vector<std::string> sources;
  for (const auto& o : outcomes) {
    if (std::find(sources.begin(), sources.end(), o.source) == sources.end())
      sources.push_back(o.source);
  }
  std::string s;
  s += fmt::format("{:<18} {:>7} {:>6} {:>8} {:>6} {:>9} {:>10} {:>7} {:>9} {:>7} {:>11}\n",
                   "source", "kernels", "failed", "launches", "failed", "reported", "undetected",
                   "false+", "mismatch", "errors", "overtracing");
  Totals all;
  uint64_t allSpec = 0, allActual = 0, allWhole = 0;
  for (const auto& source : sources) {
    std::vector<LaunchOutcome> rows;
    std::set<std::string> kernels, failedKernels;
    uint64_t spec = 0, actual = 0, whole = 0;
    uint32_t reported = 0;
    for (const auto& o : outcomes) {
      if (o.source != source || o.unsupported) continue;
      rows.push_back(o);
      kernels.insert(o.kernel);
      if (o.ran && o.failed()) failedKernels.insert(o.kernel);
      if (o.ran) {
        spec += o.speculatedWriteBytes;
        actual += o.actualWriteBytes;
        whole += o.wholeWriteBytes;
        if (o.checkpoint.reported > 0 || o.restore.reported > 0) ++reported;
      }
    }
    Totals t = totals(rows);
    s += fmt::format("{:<18} {:>7} {:>6} {:>8} {:>6} {:>9} {:>10} {:>7} {:>9} {:>7} {:>11}\n",
                     source, kernels.size(), failedKernels.size(), t.launches, t.failed, reported,
                     t.undetected, t.falseAlarms, t.mismatches, t.errors + t.twinErrors,
                     ratio(spec, actual));
    all.undetected += t.undetected;
    if (source.rfind("deliberate", 0) != 0) {
      allSpec += spec;
      allActual += actual;
      allWhole += whole;
    }
  }
  Totals t = totals(outcomes);
  s += fmt::format(
      "undetected mis-speculations: {}  (launches {}, failed speculation {}, false alarms {}, "
      "twin output mismatches {}, errors {}); over-tracing {}, {} with whole buffers (all but the deliberate "
      "cases)\n",
      t.undetected, t.launches, t.failed, t.falseAlarms, t.mismatches, t.errors + t.twinErrors,
      ratio(allSpec, allActual), ratio(allWhole, allActual));
  if (t.unsupported > 0) {
    std::set<std::string> names;
    for (const auto& o : outcomes) {
      if (o.unsupported) names.insert(o.kernel);
    }
    s += fmt::format("not run, vgpu lacks an instruction they use: {} launches ({})\n",
                     t.unsupported, fmt::join(names, ", "));
  }
  if (t.deliberate > 0) {
    s += fmt::format(
        "deliberate cases: {} launches, {} caught by every twin that checks them ({} of them "
        "only as kernels the generator lists as unchecked: stop-the-world fallback), {} not "
        "mis-speculated\n",
        t.deliberate, t.deliberateCaught, t.deliberateByFallback, t.deliberateNotMissed);
  }
  bool header = false;
  for (const auto& o : outcomes) {
    if (o.unsupported) continue;
    bool interesting = !o.ran || o.failed() || !o.checkpoint.ran || !o.restore.ran ||
                       !o.checkpoint.outputsIdentical || !o.restore.outputsIdentical ||
                       o.falseAlarmCheckpoint() || o.falseAlarmRestore();
    if (!interesting) continue;
    if (!header) {
      s += "\nlaunches to look at (miss: what speculation missed; ckpt/rstr: violations "
           "reported):\n";
      header = true;
    }
    std::string status;
    if (!o.ran) {
      status = "ERROR " + o.error;
    } else {
      auto twinText = [](const char* name, const TwinRun& r) {
        if (!r.ran) return fmt::format("{}: ERROR {}", name, r.error);
        return fmt::format("{}: {}{}{}", name, r.reported,
                           r.staticFallback ? " (unchecked: fallback)" : "",
                           r.outputsIdentical ? "" : " MISMATCH " + r.mismatch);
      };
      status = fmt::format("{}{}{}; {}; {}", o.failed() ? "miss: " : "no miss", o.missDetail,
                           o.undetectedCheckpoint() || o.undetectedRestore() ? " UNDETECTED" : "",
                           twinText("ckpt", o.checkpoint), twinText("rstr", o.restore));
      if (o.falseAlarmCheckpoint() || o.falseAlarmRestore()) status += " FALSE ALARM";
    }
    s += fmt::format("  {:<22} {:<34} {}\n", o.variant, o.kernel, status);
  }
  return s;
}

std::string formatOverheadTable(const std::vector<LaunchOutcome>& outcomes) {
  std::string s =
      fmt::format("{:<22} {:<34} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}\n", "variant", "kernel",
                  "lane-instr", "overtrace", "lane ckpt", "lane rstr", "wall ckpt", "wall rstr");
  std::vector<double> laneC, laneR, wallC, wallR;
  auto r = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  auto cell = [](double v) { return v > 0 ? fmt::format("{:.3f}", v) : std::string("-"); };
  for (const auto& o : outcomes) {
    if (!o.ran) continue;
    double lc = o.checkpoint.ran ? r(o.checkpoint.laneInstructions, o.laneInstructions) : 0;
    double lr = o.restore.ran ? r(o.restore.laneInstructions, o.laneInstructions) : 0;
    double wc = o.checkpoint.ran ? r(o.checkpoint.seconds, o.checkpoint.baselineSeconds) : 0;
    double wr = o.restore.ran ? r(o.restore.seconds, o.restore.baselineSeconds) : 0;
    if (!o.deliberate) {
      if (lc > 0) laneC.push_back(lc);
      if (lr > 0) laneR.push_back(lr);
      if (wc > 0) wallC.push_back(wc);
      if (wr > 0) wallR.push_back(wr);
    }
    s += fmt::format("{:<22} {:<34} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}\n", o.variant, o.kernel,
                     o.laneInstructions, ratio(o.speculatedWriteBytes, o.actualWriteBytes),
                     cell(lc), cell(lr), cell(wc), cell(wr));
  }
  auto geo = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("-");
    double l = 0;
    for (double x : v) l += std::log(x);
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return fmt::format("{:.3f} (min {:.3f}, max {:.3f})", std::exp(l / v.size()), *lo, *hi);
  };
  s += fmt::format(
      "twin/original, geometric mean over {} launches (deliberate cases excluded):\n"
      "  lane-instructions: checkpoint {}, restore {}\n"
      "  wall time:         checkpoint {}, restore {}\n",
      laneC.size(), geo(laneC), geo(laneR), geo(wallC), geo(wallR));
  return s;
}

nlohmann::json toJson(const std::vector<LaunchOutcome>& outcomes) {
  nlohmann::json launches = nlohmann::json::array();
  auto twin = [](const TwinRun& r) {
    return nlohmann::json{{"ran", r.ran},
                          {"error", r.error},
                          {"reported", r.reported},
                          {"static_fallback", r.staticFallback},
                          {"outputs_identical", r.outputsIdentical},
                          {"mismatch", r.mismatch},
                          {"lane_instructions", r.laneInstructions},
                          {"seconds", r.seconds},
                          {"original_seconds", r.baselineSeconds}};
  };
  for (const auto& o : outcomes) {
    launches.push_back({{"source", o.source},
                        {"variant", o.variant},
                        {"kernel", o.kernel},
                        {"ptx_name", o.ptxName},
                        {"deliberate", o.deliberate},
                        {"ran", o.ran},
                        {"error", o.error},
                        {"write_missed", o.writeMissed},
                        {"read_missed", o.readMissed},
                        {"incomplete", o.incomplete},
                        {"miss", o.missDetail},
                        {"speculated_write_bytes", o.speculatedWriteBytes},
                        {"whole_buffer_write_bytes", o.wholeWriteBytes},
                        {"actual_write_bytes", o.actualWriteBytes},
                        {"lane_instructions", o.laneInstructions},
                        {"undetected", o.undetectedCheckpoint() || o.undetectedRestore()},
                        {"checkpoint", twin(o.checkpoint)},
                        {"restore", twin(o.restore)}});
  }
  Totals t = totals(outcomes);
  return {{"launches", launches},
          {"totals",
           {{"launches", t.launches},
            {"failed", t.failed},
            {"undetected", t.undetected},
            {"false_alarms", t.falseAlarms},
            {"mismatches", t.mismatches},
            {"errors", t.errors + t.twinErrors},
            {"deliberate", t.deliberate},
            {"deliberate_caught", t.deliberateCaught},
            {"deliberate_caught_by_static_fallback", t.deliberateByFallback}}}};
}

}  // namespace phos::bench::speculation
