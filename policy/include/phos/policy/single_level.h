// SPDX-License-Identifier: Apache-2.0
// The PhOS paper's single-level model (appendix A.1): optimal checkpoint frequency.
#pragma once

#include "phos/common/status.h"

namespace phos::policy {

// A job of `gpus` GPUs that all stop and roll back together when any one fails.
// Times are in seconds because that is how PhOS measures them; rates are per hour
// because that is how the paper (and fleet reports) state them.
struct SingleLevelModel {
  int gpus = 0;
  double failuresPerGpuHour = 0;  // F: failures of one GPU per hour
  double overheadSeconds = 0;     // O: the application's stall per checkpoint
  double restoreSeconds = 0;      // R: wall time from a failure until the job runs again
};

// Rejects values for which the model means nothing (no GPUs, a free checkpoint, ...).
// The message names the offending field.
Status validate(const SingleLevelModel& model);

// f* = sqrt(N F / (2 O)) checkpoints per hour (O in hours). Equal to Young's
// interval sqrt(2 O M) with the job's mean time between failures M = 1 / (N F).
Result<double> optimalCheckpointsPerHour(const SingleLevelModel& model);

// Fraction of the job's GPU time that is wasted at `checkpointsPerHour`:
// N F (R + 1/(2f)) + O f, with R and O in hours. This is the appendix's total
// divided by N T, with the restore counted on all N GPUs (see docs/policy.md for
// why that differs from the paper's printed formula by the factor N on R).
Result<double> wastedFraction(const SingleLevelModel& model, double checkpointsPerHour);

}  // namespace phos::policy
