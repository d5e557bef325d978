// SPDX-License-Identifier: Apache-2.0
// Parses PTX text (as emitted by nvcc, NVRTC and clang) into the typed AST.
#pragma once

#include <cstddef>
#include <string_view>

#include "phos/common/status.h"
#include "phos/ptx/ast.h"

namespace phos::ptx {

// Bounds that keep hostile input from exhausting the stack or memory.
struct ParseLimits {
  size_t maxBlockDepth = 64;       // nested { } scopes in a function body
  size_t maxOperandDepth = 16;     // nested {..} vectors / initializers
  size_t maxInputBytes = size_t{1} << 30;
};

// Parses a whole module. On malformed input returns kInvalidArgument with a
// message "<source>:<line>:<column>: expected ..., found '...'".
Result<Module> parseModule(std::string_view text, std::string_view sourceName = "<ptx>",
                           const ParseLimits& limits = {});

// Parses a sequence of statements as they appear inside a function body (used by
// the instrumenter to build snippets from text, and by tests).
Result<std::vector<Statement>> parseStatements(std::string_view text,
                                               std::string_view sourceName = "<ptx>",
                                               const ParseLimits& limits = {});

}  // namespace phos::ptx
