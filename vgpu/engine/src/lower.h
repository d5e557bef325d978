// SPDX-License-Identifier: Apache-2.0
// Lowers a parsed PTX module into the engine's executable form.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "code.h"
#include "phos/common/status.h"
#include "phos/ptx/ast.h"

namespace phos::vgpu::engine::detail {

// `globalAddresses` maps every module-scope .global/.const variable to the device
// address the loader gave it. Fails with kNotSupported for valid PTX the engine
// cannot run and kInvalidArgument for references to undeclared names.
Result<std::unique_ptr<ExecModule>> lowerModule(
    std::shared_ptr<const ptx::Module> module,
    const std::unordered_map<std::string, uint64_t>& globalAddresses);

}  // namespace phos::vgpu::engine::detail
