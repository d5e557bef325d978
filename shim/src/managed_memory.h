// SPDX-License-Identifier: Apache-2.0
// Managed memory in the shim. phosd serves cuMemAllocManaged as pinned memory
// mapped at the same address in both processes (client_hooks.cpp maps and
// unmaps it); what cuMemAdvise and cuMemPrefetchAsync say of it moves
// nothing, and is kept here, in the application, for cuMemRangeGetAttribute
// (managed_memory.cpp): a checkpoint of the process keeps it with the rest of
// its memory.
#pragma once

#include "phos/common/managed_advice.h"

namespace phos::shim::managed {

// The advice and prefetch locations of the session's managed memory.
ManagedAdvice& advice();

}  // namespace phos::shim::managed
