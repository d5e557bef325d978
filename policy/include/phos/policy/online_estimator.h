// SPDX-License-Identifier: Apache-2.0
// Online estimates of checkpoint stall and restore time, and the interval they imply.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"
#include "phos/policy/multi_level.h"
#include "phos/policy/single_level.h"

namespace phos::policy {

// Exponentially weighted mean: each new sample moves the estimate by `weight`
// of its distance, so old measurements fade with a half-life of about
// ln 2 / weight samples. The first sample is taken as is.
class EwmaMean {
 public:
  explicit EwmaMean(double weight) : weight_(weight) {}
  void add(double sample);
  std::optional<double> value() const { return value_; }
  uint64_t count() const { return count_; }

 private:
  double weight_;
  std::optional<double> value_;
  uint64_t count_ = 0;
};

// Feeds measured checkpoint stalls (O) and restore times (R) into the PhOS paper's
// model; the failure rate and GPU count are the only configured inputs. O and R
// change with the working set, so the estimate follows them instead of averaging
// over the whole run.
class OnlineIntervalEstimator {
 public:
  struct Config {
    int gpus = 0;
    double failuresPerGpuHour = 0;
    double weight = 0.2;  // EWMA weight of a new sample, in (0, 1]
  };

  static Result<OnlineIntervalEstimator> create(const Config& config);

  // Both reject negative or non-finite samples; a stall of 0 is a valid
  // measurement (nothing to copy) but the interval needs a positive mean.
  Status recordStall(double seconds);
  Status recordRestore(double seconds);

  // The model with the current means (R = 0 until a restore has been measured).
  // FAILED_PRECONDITION until the mean stall is positive.
  Result<SingleLevelModel> model() const;
  Result<double> checkpointsPerHour() const;
  Result<double> intervalSeconds() const;

 private:
  explicit OnlineIntervalEstimator(const Config& config)
      : config_(config), stall_(config.weight), restore_(config.weight) {}

  Config config_;
  EwmaMean stall_;
  EwmaMean restore_;
};

// The same for the levels of a multi-level plan: the failure rate of each
// class is configured, each level's checkpoint and restore times are measured.
class OnlineLevelEstimator {
 public:
  struct LevelConfig {
    std::string name;
    double failuresPerHour = 0;
  };

  // Levels least durable first, as in planMultiLevel.
  static Result<OnlineLevelEstimator> create(const std::vector<LevelConfig>& levels,
                                             double weight = 0.2);

  // NOT_FOUND for a level that was not configured.
  Status recordCheckpoint(std::string_view level, double seconds);
  Status recordRestore(std::string_view level, double seconds);

  // The levels with the current means (R_i = 0 until measured);
  // FAILED_PRECONDITION, naming the level, until every level has a positive
  // mean checkpoint time.
  Result<std::vector<Level>> levels() const;
  Result<MultiLevelPlan> plan() const;

 private:
  struct Measured {
    LevelConfig config;
    EwmaMean checkpoint;
    EwmaMean restore;
  };
  explicit OnlineLevelEstimator(std::vector<Measured> levels) : levels_(std::move(levels)) {}
  Result<size_t> find(std::string_view level) const;

  std::vector<Measured> levels_;
};

}  // namespace phos::policy
