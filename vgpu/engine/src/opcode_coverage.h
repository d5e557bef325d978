// SPDX-License-Identifier: Apache-2.0
// What the engine does with each PTX opcode of the ISA (the parser's opcode
// table, phos/ptx/spellings.h): executes it, executes some of its forms (the
// others refused or faulting, named), faults naming it when a thread runs it
// (the module loads: its other kernels may run), or refuses the module at
// load. The interpreter names an opcode's note when it faults on it;
// tests/vgpu/engine/opcode_coverage_test.cpp checks every entry against
// what the engine does and renders the table of docs/vgpu-engine.md.
#pragma once

#include <span>
#include <string_view>

#include "phos/ptx/ast.h"

namespace phos::vgpu::engine {

enum class Coverage {
  kExecuted,       // executed; no form of it is known to be refused or to fault
  kSomeForms,      // the forms `note` says; the others refused at load or faulting when run
  kFaultsWhenRun,  // loads; a thread that runs it faults with CUDA_ERROR_ILLEGAL_INSTRUCTION naming
                   // it
  kRefusedAtLoad,  // the module is refused at load, naming the line
};

struct OpcodeCoverage {
  ptx::Opcode opcode;
  Coverage coverage;
  std::string_view note;  // the forms executed, or why not
};

// One entry per opcode, in the order of ptx::Opcode.
std::span<const OpcodeCoverage> opcodeCoverage();
const OpcodeCoverage& coverageOf(ptx::Opcode opcode);
std::string_view coverageName(Coverage coverage);

}  // namespace phos::vgpu::engine
