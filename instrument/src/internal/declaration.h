// SPDX-License-Identifier: Apache-2.0
// Shared by use_analysis.cpp and signature.cpp: declared C++ types applied to an
// analysed signature, whether they come from the demangled name or a source scan.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "phos/instrument/signature.h"

namespace phos::instrument::detail {

// Sets declaredType/declaredConst from `declared` and recomputes each word's
// access from what the PTX saw; adds `source` to signature.sources.
Status applyDeclaredTypes(KernelSignature& signature, const DeclaredKernel& declared,
                          SignatureSource source);

// The parameters of a demangled C++ function name ("k(float const*, int)"),
// each with its pointer facts, or nullopt when the list cannot be split.
std::optional<DeclaredKernel> declarationFromDemangled(std::string_view ptxName,
                                                       std::string_view demangled);

// Whether a C++ pointer type ("float const*", "const float *") points to const;
// nullopt when the type is not a pointer at its top level.
std::optional<bool> pointeeIsConst(std::string_view type);

// The access speculation uses for a word: what the PTX saw, widened for a value
// the analysis lost track of unless the declared type says it is only read.
Access effectiveAccess(Access observed, bool escapes, bool declaredConst);

}  // namespace phos::instrument::detail
