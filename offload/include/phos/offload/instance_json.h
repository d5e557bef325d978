// SPDX-License-Identifier: Apache-2.0
// Reading offload instances from JSON and writing scheduler outcomes as JSON (the `phos offload-plan` format).
#pragma once

#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "phos/offload/problem.h"
#include "phos/offload/schedulers.h"

namespace phos::offload {

// {"chunk_bytes": 1048576, "host_bandwidth": 12e9,
//  "gpus": [{"checkpoint_bytes": n, "free_bytes": n, "egress_limit"?: b, "ingress_limit"?: b}],
//  "links": [{"a": 0, "b": 3, "bandwidth": 48e9}]}
// Any problem (malformed text, missing field, wrong type, negative value,
// unknown GPU) is kInvalidArgument with a message naming the field.
Result<Instance> parseInstanceJson(std::string_view text);

nlohmann::json instanceToJson(const Instance& instance);

// {"blocking_seconds": t, "solve_seconds": s,
//  "transfers": [{"from": 0, "to": 3 | "host", "bytes": n}]}
nlohmann::json outcomeToJson(const Outcome& outcome);

// {"baseline": {...}, "greedy": {...}, "flow": {...}, "exact": {...}}
nlohmann::json outcomesToJson(const std::vector<Outcome>& outcomes);

}  // namespace phos::offload
