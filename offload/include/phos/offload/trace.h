// SPDX-License-Identifier: Apache-2.0
// Checkpoint-size traces (rows: snapshot, gpu, bytes): CSV form and the paper-style synthetic generator.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"

namespace phos::offload {

struct TraceRow {
  int snapshot = 0;
  int gpu = 0;
  int64_t bytes = 0;
  friend bool operator==(const TraceRow&, const TraceRow&) = default;
};
using Trace = std::vector<TraceRow>;

// "snapshot,gpu,bytes" lines; a header line with those words, blank lines
// and lines starting with '#' are skipped.
Result<Trace> parseTraceCsv(std::string_view text);
std::string traceToCsv(const Trace& trace);

// The snapshots of a trace in increasing order, each the checkpoint bytes of
// GPUs 0..gpuCount-1. A snapshot missing a GPU, or naming one twice or one
// beyond gpuCount, is an error.
struct Snapshot {
  int id = 0;
  std::vector<int64_t> checkpointBytes;
};
Result<std::vector<Snapshot>> snapshotsOf(const Trace& trace, int gpuCount);

// Synthetic traces after Section V.B of the paper (docs/offload.md).
// kRamp imitates the RTM trace: the mean size per snapshot grows linearly
// over the first 400/776 of the run, then wanders around a plateau; within a
// snapshot, sizes spread with a heavy (log-normal) right tail, at most 27x
// between smallest and largest. The defaults put the 50th, 75th and 98th
// percentiles of the per-snapshot mean near 80, 128 and 160 MiB, the paper's
// three free-space settings. kStationary is the paper's "synthetic" trace:
// every size drawn independently from the histogram of all the sizes of the
// kRamp trace, so each snapshot spans the whole range.
enum class TraceKind { kRamp, kStationary };
struct TraceShape {
  TraceKind kind = TraceKind::kStationary;
  int snapshots = 776;
  int gpus = 8;
  uint64_t seed = 1;
  int64_t startMeanBytes = 4ll << 20;     // mean size at the first snapshot
  int64_t rampPeakBytes = 84ll << 20;     // mean size at the end of the ramp
  int64_t plateauMeanBytes = 128ll << 20; // the level the mean wanders around after it
  double rampFraction = 400.0 / 776.0;
  double compressionTail = 2.5;  // Pareto index of the compression ratio
};
Trace generateTrace(const TraceShape& shape);

}  // namespace phos::offload
