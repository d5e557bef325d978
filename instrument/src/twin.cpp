// SPDX-License-Identifier: Apache-2.0
// buildTwinModule: runs the validator-twin passes (passes/) in order.
#include "phos/instrument/twin.h"

#include "passes/passes.h"

namespace phos::instrument {

Result<ptx::Module> buildTwinModule(const ptx::Module& module, const TwinOptions& options,
                                    TwinStats* stats) {
  if (module.addressSize != 64) {
    return makeError(Code::kInvalidArgument,
                     "validator twins need .address_size 64, the "
                     "module has {}",
                     module.addressSize);
  }
  passes::TwinContext context;
  context.original = &module;
  context.options = options;
  RETURN_IF_ERROR_CTX(passes::clone_twins::run(context), "clone_twins");
  RETURN_IF_ERROR_CTX(passes::check_accesses::run(context), "check_accesses");
  RETURN_IF_ERROR_CTX(passes::carry_validator_args::run(context), "carry_validator_args");
  RETURN_IF_ERROR_CTX(passes::load_validator_args::run(context), "load_validator_args");
  RETURN_IF_ERROR_CTX(passes::place_twins::run(context), "place_twins");
  if (stats) *stats = std::move(context.stats);
  return std::move(context.output);
}

}  // namespace phos::instrument
