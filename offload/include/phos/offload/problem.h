// SPDX-License-Identifier: Apache-2.0
// The peer-offload problem: an instance in bytes and its chunk-level form that every scheduler works on.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "phos/common/status.h"

namespace phos::offload {

// One GPU at the moment of a checkpoint, as the caller describes it.
struct GpuState {
  int64_t checkpointBytes = 0;  // bytes to checkpoint (or dirty/CoW-pending bytes)
  int64_t freeBytes = 0;        // device memory available for staging them
  // NVSwitch systems: total peer (NVLink) bandwidth out of / into this GPU,
  // shared by all its peer transfers. Unset: each link is independent.
  std::optional<double> egressLimit;
  std::optional<double> ingressLimit;
};

// A symmetric peer link; NVLink is full duplex, so each direction has `bandwidth`.
struct Link {
  int a = 0;
  int b = 0;
  double bandwidth = 0;  // bytes per second, per direction
};

struct Instance {
  int64_t chunkBytes = 4 << 20;
  double hostBandwidth = 0;  // bytes per second of each GPU's own link to host memory
  std::vector<GpuState> gpus;
  std::vector<Link> links;
};

// Limits that keep every scheduler's time and memory bounded: the
// bandwidth matrix is n x n, and the paper's flow algorithm moves one chunk
// per iteration.
inline constexpr int kMaxGpus = 1024;
inline constexpr int64_t kMaxMovedChunks = int64_t{1} << 20;

// Checks the instance and names the first problem found (kInvalidArgument).
Status validate(const Instance& instance);

// The instance in chunks (see docs/offload.md, "Model"): a checkpoint of
// ckpt bytes is ceil(ckpt/c) chunks, free memory of f bytes is floor(f/c)
// chunk slots, a sender must move `remainder` chunks and a receiver can take
// `spare` chunks. Bandwidths are per direction; 0 means "no link"/"no limit".
struct Problem {
  int64_t chunkBytes = 0;
  double hostBandwidth = 0;
  std::vector<int64_t> checkpointBytes;
  std::vector<int64_t> freeBytes;
  std::vector<int64_t> remainder;  // chunks a GPU must move off itself
  std::vector<int64_t> spare;      // chunk slots a GPU can lend to peers
  // Bytes by which the sender's moved chunks fall short of remainder*c: only
  // non-zero when the shorter last chunk travels, i.e. the GPU has no slot.
  std::vector<int64_t> tailShortfall;
  std::vector<double> egressLimit;   // 0: unlimited
  std::vector<double> ingressLimit;  // 0: unlimited
  std::vector<std::vector<double>> bandwidth;  // [from][to], 0: no link

  int gpuCount() const { return static_cast<int>(remainder.size()); }
  int64_t totalRemainder() const;
};

// Validates the instance and converts it; an instance whose senders would
// move more than kMaxMovedChunks chunks in total is refused (kInvalidArgument).
Result<Problem> makeProblem(const Instance& instance);

}  // namespace phos::offload
