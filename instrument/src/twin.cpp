// SPDX-License-Identifier: Apache-2.0
// buildTwinModule: runs the validator-twin passes (passes/) in order.
#include "phos/instrument/twin.h"

#include <algorithm>
#include <map>

#include "passes/passes.h"

namespace phos::instrument {
namespace {

// Passes 1 to 4: the twins of one mode, not placed yet.
Status buildTwins(passes::TwinContext& context) {
  RETURN_IF_ERROR_CTX(passes::clone_twins::run(context), "clone_twins");
  RETURN_IF_ERROR_CTX(passes::check_accesses::run(context), "check_accesses");
  RETURN_IF_ERROR_CTX(passes::carry_validator_args::run(context), "carry_validator_args");
  RETURN_IF_ERROR_CTX(passes::load_validator_args::run(context), "load_validator_args");
  return Status::ok();
}

// Adds the twins of `other` (another mode, another suffix) to `context`.
void merge(passes::TwinContext& context, passes::TwinContext& other) {
  for (passes::TwinFunction& t : other.twins) context.twins.push_back(std::move(t));
  context.usesCheckFunction = context.usesCheckFunction || other.usesCheckFunction;
  TwinStats& s = context.stats;
  const TwinStats& o = other.stats;
  s.kernels += o.kernels;
  s.functions += o.functions;
  s.checkedStores += o.checkedStores;
  s.checkedLoads += o.checkedLoads;
  s.uncheckedCalls += o.uncheckedCalls;
  s.uncheckedAccesses += o.uncheckedAccesses;
  for (const std::string& k : o.kernelsWithUncheckedCalls) {
    if (std::find(s.kernelsWithUncheckedCalls.begin(), s.kernelsWithUncheckedCalls.end(), k) ==
        s.kernelsWithUncheckedCalls.end()) {
      s.kernelsWithUncheckedCalls.push_back(k);
    }
  }
}

}  // namespace

Result<ptx::Module> buildTwinModule(const ptx::Module& module, const TwinOptions& options,
                                    TwinStats* stats) {
  if (module.addressSize != 64) {
    return makeError(Code::kInvalidArgument,
                     "validator twins need .address_size 64, the "
                     "module has {}",
                     module.addressSize);
  }
  passes::TwinContext context;
  context.original = &module;
  context.options = options;
  RETURN_IF_ERROR(buildTwins(context));
  if (options.restoreTwinsToo && options.mode != TwinMode::kRestore) {
    passes::TwinContext restore;
    restore.original = &module;
    restore.options = {TwinMode::kRestore};
    restore.suffix = kRestoreTwinSuffix;
    RETURN_IF_ERROR_CTX(buildTwins(restore), "restore twins");
    merge(context, restore);
  }
  RETURN_IF_ERROR_CTX(passes::place_twins::run(context), "place_twins");
  RETURN_IF_ERROR_CTX(passes::share_globals::run(context), "share_globals");
  if (stats) *stats = std::move(context.stats);
  return std::move(context.output);
}

std::vector<RangeEntry> rangeTable(const LaunchAccessSet& sets) {
  // Each boundary: how the count of covering reads and writes changes there.
  std::map<uint64_t, std::pair<int64_t, int64_t>> edges;
  for (const Buffer& b : sets.reads) {
    if (b.size == 0) continue;
    ++edges[b.base].first;
    --edges[b.base + b.size].first;
  }
  for (const Buffer& b : sets.writes) {
    if (b.size == 0) continue;
    ++edges[b.base].second;
    --edges[b.base + b.size].second;
  }
  std::vector<RangeEntry> table;
  int64_t readers = 0, writers = 0;
  uint64_t from = 0;
  for (const auto& [at, change] : edges) {
    const uint32_t bits = writers > 0 ? 3u : readers > 0 ? 1u : 0u;
    if (bits != 0 && from < at) {
      if (!table.empty() && table.back().end == from && table.back().access == bits) {
        table.back().end = at;
      } else {
        table.push_back({from, at, bits, 0});
      }
    }
    readers += change.first;
    writers += change.second;
    from = at;
  }
  return table;
}

}  // namespace phos::instrument
