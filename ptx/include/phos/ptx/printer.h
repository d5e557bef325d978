// SPDX-License-Identifier: Apache-2.0
// Writes the PTX AST back as text that ptxas accepts and that parses to an equal AST.
#pragma once

#include <string>

#include "phos/ptx/ast.h"

namespace phos::ptx {

std::string print(const Module& module);
std::string print(const Function& function);
std::string print(const Instruction& instruction);  // "add.s32 %r1, %r2, 4;"
std::string print(const Operand& operand);
std::string print(const VarDecl& decl);            // without the trailing ';'

}  // namespace phos::ptx
