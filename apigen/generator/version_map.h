// SPDX-License-Identifier: Apache-2.0
// Derives the cuGetProcAddress name/version map from cudaTypedefs.h's PFN typedefs.
#pragma once

#include "model.h"
#include "phos/common/status.h"

namespace phos::apigen {

// Binds every PFN_<name>_v<version>[_ptds|_ptsz] typedef to the exported symbol
// with the same ABI and fills model.procAddress and model.unversionedSymbols.
// Fails when a typedef matches no declared symbol: the header pair is then not
// one we understand, and a silently wrong map would hand out wrong ABIs.
Status buildProcAddressMap(ApiModel& model);

// "cuMemcpyHtoDAsync_v2_ptsz" -> "cuMemcpyHtoDAsync": the name cuGetProcAddress
// is asked for.
std::string publicNameOf(const std::string& symbol);
bool isPerThreadSymbol(const std::string& symbol);

}  // namespace phos::apigen
