// SPDX-License-Identifier: Apache-2.0
// Trace CSV reading/writing and the synthetic trace generator.
#include "phos/offload/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <numbers>
#include <random>

namespace phos::offload {
namespace {

template <typename T>
bool parseField(std::string_view s, T& out) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

}  // namespace

Result<Trace> parseTraceCsv(std::string_view text) {
  Trace trace;
  int lineNo = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++lineNo;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos || line.front() == '#') continue;
    if (lineNo == 1 && line.find("snapshot") != std::string_view::npos) continue;
    std::vector<std::string_view> parts;
    for (size_t start = 0;;) {
      const size_t comma = line.find(',', start);
      parts.push_back(line.substr(start, comma == std::string_view::npos ? line.npos : comma - start));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    TraceRow row;
    if (parts.size() != 3 || !parseField(parts[0], row.snapshot) || !parseField(parts[1], row.gpu) ||
        !parseField(parts[2], row.bytes)) {
      return makeError(Code::kInvalidArgument,
                       "trace line {}: expected 'snapshot,gpu,bytes', got '{}'", lineNo, line);
    }
    if (row.snapshot < 0 || row.gpu < 0 || row.bytes < 0) {
      return makeError(Code::kInvalidArgument, "trace line {}: negative value in '{}'", lineNo,
                       line);
    }
    trace.push_back(row);
  }
  return trace;
}

std::string traceToCsv(const Trace& trace) {
  std::string out = "snapshot,gpu,bytes\n";
  for (const TraceRow& r : trace) out += fmt::format("{},{},{}\n", r.snapshot, r.gpu, r.bytes);
  return out;
}

Result<std::vector<Snapshot>> snapshotsOf(const Trace& trace, int gpuCount) {
  std::map<int, std::vector<int64_t>> bySnapshot;
  for (const TraceRow& r : trace) {
    if (r.gpu >= gpuCount) {
      return makeError(Code::kInvalidArgument,
                       "trace snapshot {} names GPU {}, the topology has {} GPUs", r.snapshot,
                       r.gpu, gpuCount);
    }
    auto& sizes = bySnapshot.try_emplace(r.snapshot, gpuCount, -1).first->second;
    if (sizes[r.gpu] >= 0) {
      return makeError(Code::kInvalidArgument, "trace snapshot {} lists GPU {} twice",
                       r.snapshot, r.gpu);
    }
    sizes[r.gpu] = r.bytes;
  }
  std::vector<Snapshot> out;
  for (auto& [id, sizes] : bySnapshot) {
    for (int g = 0; g < gpuCount; ++g) {
      if (sizes[g] < 0) {
        return makeError(Code::kInvalidArgument, "trace snapshot {} has no row for GPU {}", id,
                         g);
      }
    }
    out.push_back({id, std::move(sizes)});
  }
  return out;
}

namespace {

// The generator's randomness, spelled out so that a seed gives the same
// trace with every standard library (std::normal_distribution and friends
// are implementation-defined; std::mt19937_64's output is not).
class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double normal() {  // Box-Muller
    const double u = 1.0 - uniform();  // (0, 1]
    const double v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
  }

 private:
  std::mt19937_64 engine_;
};

// The RTM-like trace: the mean size per snapshot ramps up linearly, then
// wanders (a mean-reverting walk in log space, clamped) around the plateau.
Trace rampTrace(const TraceShape& shape, Random& rng) {
  const double start = static_cast<double>(shape.startMeanBytes);
  const double peak = static_cast<double>(shape.rampPeakBytes);
  const double plateau = static_cast<double>(shape.plateauMeanBytes);
  const int rampEnd = std::max(1, static_cast<int>(shape.rampFraction * shape.snapshots));
  Trace trace;
  double logMean = std::log(peak);
  for (int s = 0; s < shape.snapshots; ++s) {
    double mean = 0;
    if (s < rampEnd) {
      mean = start + (peak - start) * s / rampEnd;
    } else {
      logMean += 0.05 * (std::log(plateau) - logMean) + 0.04 * rng.normal();
      logMean = std::clamp(logMean, std::log(0.7 * plateau), std::log(1.4 * plateau));
      mean = std::exp(logMean);
    }
    for (int g = 0; g < shape.gpus; ++g) {
      // Each GPU's compression ratio r >= 1 is Pareto distributed (a heavy
      // tail: a few GPUs compress far better than the rest), capped at the
      // 26x spread the paper reports; E[1/r] = a/(a+1) keeps the mean.
      const double a = shape.compressionTail;
      const double r = std::min(std::pow(1.0 - rng.uniform(), -1.0 / a), 26.0);
      const double bytes = mean / r * (a + 1) / a;
      trace.push_back({s, g, static_cast<int64_t>(std::max(1.0, bytes))});
    }
  }
  return trace;
}

// The paper's synthetic trace: a histogram of every size of the RTM-like
// trace (scipy's rv_histogram in the paper), from which each GPU of each
// snapshot draws independently: a bin by its weight, then a uniform point
// inside it.
Trace stationaryTrace(const TraceShape& shape, Random& rng) {
  // The histogram comes from a whole RTM-like run (776 snapshots of 8 GPUs)
  // whatever the size of the trace asked for.
  TraceShape rtm = shape;
  rtm.snapshots = 776;
  rtm.gpus = 8;
  const Trace model = rampTrace(rtm, rng);
  constexpr int kBins = 64;
  int64_t lo = model.front().bytes, hi = lo;
  for (const TraceRow& r : model) {
    lo = std::min(lo, r.bytes);
    hi = std::max(hi, r.bytes);
  }
  const double width = static_cast<double>(hi - lo + 1) / kBins;
  std::vector<double> cumulative(kBins, 0.0);
  for (const TraceRow& r : model) {
    const int bin = std::min(kBins - 1, static_cast<int>(static_cast<double>(r.bytes - lo) / width));
    cumulative[bin] += 1;
  }
  for (int b = 1; b < kBins; ++b) cumulative[b] += cumulative[b - 1];
  Trace trace;
  for (int s = 0; s < shape.snapshots; ++s) {
    for (int g = 0; g < shape.gpus; ++g) {
      const double pick = rng.uniform() * cumulative.back();
      const int bin = static_cast<int>(
          std::upper_bound(cumulative.begin(), cumulative.end(), pick) - cumulative.begin());
      const double bytes =
          static_cast<double>(lo) + (std::min(bin, kBins - 1) + rng.uniform()) * width;
      trace.push_back({s, g, static_cast<int64_t>(std::max(1.0, bytes))});
    }
  }
  return trace;
}

}  // namespace

Trace generateTrace(const TraceShape& shape) {
  Random rng(shape.seed);
  return shape.kind == TraceKind::kRamp ? rampTrace(shape, rng) : stationaryTrace(shape, rng);
}

}  // namespace phos::offload
