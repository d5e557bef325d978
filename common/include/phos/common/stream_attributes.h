// SPDX-License-Identifier: Apache-2.0
// The launch attributes cuda.h marks "valid for streams" (cuStreamSetAttribute),
// which vgpu keeps per stream and phosd passes to the driver and saves. None
// names an event or an application address; a launch's may (the programmatic
// and completion events).
#pragma once

#include <cuda.h>

namespace phos {

inline constexpr CUstreamAttrID kStreamAttributes[] = {
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
    CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY,
    CU_LAUNCH_ATTRIBUTE_PRIORITY,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
    CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING};

constexpr bool isStreamAttribute(CUstreamAttrID id) {
  for (CUstreamAttrID a : kStreamAttributes) {
    if (a == id) return true;
  }
  return false;
}

}  // namespace phos
