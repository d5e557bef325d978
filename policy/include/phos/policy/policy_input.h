// SPDX-License-Identifier: Apache-2.0
// The JSON input and output of `phos policy`, and the computation between them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"
#include "phos/policy/multi_level.h"
#include "phos/policy/single_level.h"

namespace phos::policy {

struct PolicyInput {
  SingleLevelModel single;
  std::vector<Level> levels;
};

// Parses and validates the input document. Every error is INVALID_ARGUMENT with
// a message naming the field (JSON syntax errors give the byte offset).
Result<PolicyInput> parsePolicyInput(std::string_view text);

// Reads and parses the file at `path`. NOT_FOUND when it does not exist,
// INVALID_ARGUMENT when it cannot be read or parsed; the message starts with
// the path.
Result<PolicyInput> loadPolicyInput(const std::string& path);

struct PolicyOutput {
  double checkpointsPerHour = 0;
  double wastedFraction = 0;
  MultiLevelPlan plan;
};

// FAILED_PRECONDITION when failures are too frequent for the models to mean
// anything (the single-level waste reaches 1, or the multi-level model has no
// steady state).
Result<PolicyOutput> computePolicy(const PolicyInput& input);

// The output document, pretty-printed.
std::string renderPolicyOutput(const PolicyInput& input, const PolicyOutput& output);

}  // namespace phos::policy
