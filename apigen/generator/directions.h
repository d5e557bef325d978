// SPDX-License-Identifier: Apache-2.0
// Which way each parameter's data moves: inferred from the type, corrected by the override table.
#pragma once

#include <string>
#include <string_view>

#include "model.h"
#include "phos/common/status.h"

namespace phos::apigen {

struct DirectionStats {
  int pointers = 0;   // parameters of kind kPointer or kAddress
  int overridden = 0; // parameters whose direction came from the table
};

// Sets Param::direction for every parameter: values, handles, callbacks and
// untyped addresses (non-const void *) are inputs; a pointer to const is an
// input; any other pointer is an output. Then applies the overrides in the
// JSON file at `overridesPath` (none when empty), keyed by public name and
// parameter name (see docs/apigen.md). An override naming a function or
// parameter that does not exist fails: stale entries must not linger.
Result<DirectionStats> assignDirections(ApiModel& model, const std::string& overridesPath);

std::string_view directionName(Direction d);
std::string_view kindName(ParamKind k);

}  // namespace phos::apigen
