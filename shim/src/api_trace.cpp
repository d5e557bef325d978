// SPDX-License-Identifier: Apache-2.0
// Counting the application's Driver API calls (api_trace.h).
#include "api_trace.h"

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "phos/export_tables/driver_logs.h"

namespace phos::shim::trace {
namespace detail {
constinit std::atomic<uint64_t> gCalls[cuda_api::kEntryPointCount]{};
constinit thread_local int tInternal = 0;
}  // namespace detail

namespace {

constinit std::atomic<uint8_t> gServed[cuda_api::kEntryPointCount]{};
constinit std::atomic<const char*> gReasons[cuda_api::kEntryPointCount]{};

const char* howText(Served how) {
  switch (how) {
    case Served::kRemoted: return "remoted";
    case Served::kLocal: return "answered in the shim";
    case Served::kExcluded: return "NOT SUPPORTED";
  }
  return "?";
}

void writeSummary() {
  const char* target = std::getenv("PHOS_TRACE_API");
  if (target == nullptr || *target == '\0') return;
  std::vector<std::pair<uint64_t, size_t>> called;
  for (size_t i = 0; i < cuda_api::kEntryPointCount; ++i) {
    if (uint64_t n = detail::gCalls[i].load(std::memory_order_relaxed); n != 0) called.emplace_back(n, i);
  }
  // A job's helper processes (shell wrappers, compilers) that never reach
  // the driver add nothing.
  if (called.empty()) return;
  FILE* out = std::string(target) == "-" ? stderr : std::fopen(target, "a");
  if (out == nullptr) {
    std::fprintf(stderr, "phos: cannot write the API trace to %s: %s\n", target, std::strerror(errno));
    return;
  }
  std::sort(called.begin(), called.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::fprintf(out, "phos: CUDA Driver API calls of pid %d: %zu entry points\n", static_cast<int>(getpid()),
               called.size());
  for (const auto& [calls, i] : called) {
    const auto how = static_cast<Served>(gServed[i].load(std::memory_order_relaxed));
    const char* reason = gReasons[i].load(std::memory_order_relaxed);
    std::fprintf(out, "%12llu  %-44s %s%s%s\n", static_cast<unsigned long long>(calls),
                 std::string(cuda_api::entryPoint(static_cast<cuda_api::EntryPointId>(i)).symbol).c_str(),
                 howText(how), reason != nullptr ? ": " : "", reason != nullptr ? reason : "");
  }
  if (out != stderr) std::fclose(out);
}

}  // namespace

void detail::firstCall(cuda_api::EntryPointId id, Served how) {
  gServed[static_cast<size_t>(id)].store(static_cast<uint8_t>(how), std::memory_order_relaxed);
  if (how != Served::kExcluded) {
    log::get("shim")->debug("first call of {} ({})", cuda_api::entryPoint(id).symbol, howText(how));
  }
}

int excluded(cuda_api::EntryPointId id, const char* reason) {
  gReasons[static_cast<size_t>(id)].store(reason, std::memory_order_relaxed);
  driver_logs::returning(cuda_api::entryPoint(id).symbol, CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                         std::string("not supported by PhOS: ") + reason);
  if (detail::gCalls[static_cast<size_t>(id)].fetch_add(1, std::memory_order_relaxed) == 0) {
    gServed[static_cast<size_t>(id)].store(static_cast<uint8_t>(Served::kExcluded), std::memory_order_relaxed);
    // On stderr as well as the log (which is silent unless configured): a
    // program that fails on CUDA_ERROR_NOT_SUPPORTED must say why.
    const std::string symbol(cuda_api::entryPoint(id).symbol);
    std::fprintf(stderr, "phos: %s is not supported by PhOS (%s): the call returns CUDA_ERROR_NOT_SUPPORTED\n",
                 symbol.c_str(), reason);
    log::get("shim")->warn("{} is not supported by PhOS ({}): returning CUDA_ERROR_NOT_SUPPORTED", symbol, reason);
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

void writeSummaryAtExit() {
  const char* target = std::getenv("PHOS_TRACE_API");
  if (target != nullptr && *target != '\0') std::atexit(writeSummary);
}

}  // namespace phos::shim::trace
