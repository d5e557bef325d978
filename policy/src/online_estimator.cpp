// SPDX-License-Identifier: Apache-2.0
// Online estimates of checkpoint stall and restore time.
#include "phos/policy/online_estimator.h"

#include <cmath>

namespace phos::policy {
namespace {

Status checkSample(double seconds, const char* what) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) {
    return makeError(Code::kInvalidArgument, "{} must be a finite number >= 0, got {}", what,
                     seconds);
  }
  return Status::ok();
}

}  // namespace

void EwmaMean::add(double sample) {
  value_ = value_ ? *value_ + weight_ * (sample - *value_) : sample;
  ++count_;
}

Result<OnlineIntervalEstimator> OnlineIntervalEstimator::create(const Config& config) {
  if (!(config.weight > 0 && config.weight <= 1)) {
    return makeError(Code::kInvalidArgument, "EWMA weight must be in (0, 1], got {}",
                     config.weight);
  }
  // Validate the configured part with placeholder measurements.
  RETURN_IF_ERROR(validate(SingleLevelModel{config.gpus, config.failuresPerGpuHour, 1.0, 0.0}));
  return OnlineIntervalEstimator(config);
}

Status OnlineIntervalEstimator::recordStall(double seconds) {
  RETURN_IF_ERROR(checkSample(seconds, "checkpoint stall"));
  stall_.add(seconds);
  return Status::ok();
}

Status OnlineIntervalEstimator::recordRestore(double seconds) {
  RETURN_IF_ERROR(checkSample(seconds, "restore time"));
  restore_.add(seconds);
  return Status::ok();
}

Result<SingleLevelModel> OnlineIntervalEstimator::model() const {
  if (!stall_.value() || !(*stall_.value() > 0)) {
    return makeError(Code::kFailedPrecondition,
                     "no positive checkpoint stall measured yet ({} samples)", stall_.count());
  }
  SingleLevelModel m{config_.gpus, config_.failuresPerGpuHour, *stall_.value(),
                     restore_.value().value_or(0.0)};
  RETURN_IF_ERROR(validate(m));
  return m;
}

Result<double> OnlineIntervalEstimator::checkpointsPerHour() const {
  ASSIGN_OR_RETURN(SingleLevelModel m, model());
  return optimalCheckpointsPerHour(m);
}

Result<double> OnlineIntervalEstimator::intervalSeconds() const {
  ASSIGN_OR_RETURN(double perHour, checkpointsPerHour());
  return 3600.0 / perHour;
}

Result<OnlineLevelEstimator> OnlineLevelEstimator::create(const std::vector<LevelConfig>& levels,
                                                          double weight) {
  if (!(weight > 0 && weight <= 1)) {
    return makeError(Code::kInvalidArgument, "EWMA weight must be in (0, 1], got {}", weight);
  }
  // Validate the configured part with placeholder measurements.
  std::vector<Level> placeholder;
  std::vector<Measured> measured;
  for (const auto& l : levels) {
    placeholder.push_back({l.name, 1.0, 0.0, l.failuresPerHour});
    measured.push_back({l, EwmaMean(weight), EwmaMean(weight)});
  }
  RETURN_IF_ERROR(validate(placeholder));
  return OnlineLevelEstimator(std::move(measured));
}

Result<size_t> OnlineLevelEstimator::find(std::string_view level) const {
  for (size_t i = 0; i < levels_.size(); ++i) {
    if (levels_[i].config.name == level) return i;
  }
  return makeError(Code::kNotFound, "no level named '{}'", level);
}

Status OnlineLevelEstimator::recordCheckpoint(std::string_view level, double seconds) {
  ASSIGN_OR_RETURN(size_t i, find(level));
  RETURN_IF_ERROR(checkSample(seconds, "checkpoint time"));
  levels_[i].checkpoint.add(seconds);
  return Status::ok();
}

Status OnlineLevelEstimator::recordRestore(std::string_view level, double seconds) {
  ASSIGN_OR_RETURN(size_t i, find(level));
  RETURN_IF_ERROR(checkSample(seconds, "restore time"));
  levels_[i].restore.add(seconds);
  return Status::ok();
}

Result<std::vector<Level>> OnlineLevelEstimator::levels() const {
  std::vector<Level> out;
  for (const auto& m : levels_) {
    auto c = m.checkpoint.value();
    if (!c || !(*c > 0)) {
      return makeError(Code::kFailedPrecondition,
                       "no positive checkpoint time measured yet for level '{}' ({} samples)",
                       m.config.name, m.checkpoint.count());
    }
    out.push_back({m.config.name, *c, m.restore.value().value_or(0.0), m.config.failuresPerHour});
  }
  return out;
}

Result<MultiLevelPlan> OnlineLevelEstimator::plan() const {
  ASSIGN_OR_RETURN(auto current, levels());
  return planMultiLevel(current);
}

}  // namespace phos::policy
