// SPDX-License-Identifier: Apache-2.0
// The PhOS paper's single-level checkpoint frequency model.
#include "phos/policy/single_level.h"

#include <cmath>

namespace phos::policy {
namespace {

constexpr double kSecondsPerHour = 3600.0;

}  // namespace

Status validate(const SingleLevelModel& model) {
  if (model.gpus <= 0) {
    return makeError(Code::kInvalidArgument, "gpus must be at least 1, got {}", model.gpus);
  }
  // !(x > 0) also rejects NaN.
  if (!(model.failuresPerGpuHour > 0) || !std::isfinite(model.failuresPerGpuHour)) {
    return makeError(Code::kInvalidArgument,
                     "failures_per_gpu_hour must be a finite number > 0, got {}",
                     model.failuresPerGpuHour);
  }
  if (!(model.overheadSeconds > 0) || !std::isfinite(model.overheadSeconds)) {
    return makeError(Code::kInvalidArgument,
                     "checkpoint_overhead_seconds must be a finite number > 0 (a free "
                     "checkpoint has no optimal frequency), got {}",
                     model.overheadSeconds);
  }
  if (!(model.restoreSeconds >= 0) || !std::isfinite(model.restoreSeconds)) {
    return makeError(Code::kInvalidArgument,
                     "restore_seconds must be a finite number >= 0, got {}",
                     model.restoreSeconds);
  }
  return Status::ok();
}

Result<double> optimalCheckpointsPerHour(const SingleLevelModel& model) {
  RETURN_IF_ERROR(validate(model));
  const double overheadHours = model.overheadSeconds / kSecondsPerHour;
  return std::sqrt(model.gpus * model.failuresPerGpuHour / (2.0 * overheadHours));
}

Result<double> wastedFraction(const SingleLevelModel& model, double checkpointsPerHour) {
  RETURN_IF_ERROR(validate(model));
  if (!(checkpointsPerHour > 0) || !std::isfinite(checkpointsPerHour)) {
    return makeError(Code::kInvalidArgument,
                     "checkpoints per hour must be a finite number > 0, got {}",
                     checkpointsPerHour);
  }
  const double jobFailuresPerHour = model.gpus * model.failuresPerGpuHour;
  const double restoreHours = model.restoreSeconds / kSecondsPerHour;
  const double overheadHours = model.overheadSeconds / kSecondsPerHour;
  return jobFailuresPerHour * (restoreHours + 1.0 / (2.0 * checkpointsPerHour)) +
         overheadHours * checkpointsPerHour;
}

}  // namespace phos::policy
