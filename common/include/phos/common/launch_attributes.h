// SPDX-License-Identifier: Apache-2.0
// The launch attributes (CUlaunchAttributeID) that streams and kernel nodes
// keep, each list in one place for vgpu, which keeps them, and phosd, which
// passes them to the driver and saves them.
#pragma once

#include <cuda.h>

namespace phos {

// The attributes cuda.h marks "valid for streams" (cuStreamSetAttribute).
// None names an event or an application address; a launch's may (the
// programmatic and completion events).
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

// The kernel node attributes (cuGraphKernelNodeSetAttribute) served: those
// that name no handle (the programmatic and completion events do, and the
// device-updatable node's is the driver's own). vgpu keeps them on the node,
// phosd saves them with it.
inline constexpr CUkernelNodeAttrID kKernelNodeAttributes[] = {
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
    CU_LAUNCH_ATTRIBUTE_PRIORITY,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
    CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT};

constexpr bool isKernelNodeAttribute(CUkernelNodeAttrID id) {
  for (CUkernelNodeAttrID a : kKernelNodeAttributes) {
    if (a == id) return true;
  }
  return false;
}

}  // namespace phos
