// SPDX-License-Identifier: Apache-2.0
// The generic graph node entry points (cuGraphAddNode, cuGraphNodeSetParams,
// cuGraphExecNodeSetParams: a CUgraphNodeParams, a union of every node
// kind) in terms of the per-kind ones, which say what each kind means. vgpu
// answers them so, and so does libphos.so, whose per-kind calls are remoted:
// one definition of the mapping for both.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <vector>

namespace phos::graph_node_params {

namespace detail {

// "reserved0 ... Must be zero", "reserved2 ... Must be zero".
inline bool reservedZero(const CUgraphNodeParams& p) {
  return p.reserved0[0] == 0 && p.reserved0[1] == 0 && p.reserved0[2] == 0 && p.reserved2 == 0;
}

inline CUDA_KERNEL_NODE_PARAMS kernelOf(const CUDA_KERNEL_NODE_PARAMS_v3& k) {
  CUDA_KERNEL_NODE_PARAMS out{};
  out.func = k.func;
  out.gridDimX = k.gridDimX;
  out.gridDimY = k.gridDimY;
  out.gridDimZ = k.gridDimZ;
  out.blockDimX = k.blockDimX;
  out.blockDimY = k.blockDimY;
  out.blockDimZ = k.blockDimZ;
  out.sharedMemBytes = k.sharedMemBytes;
  out.kernelParams = k.kernelParams;
  out.extra = k.extra;
  out.kern = k.kern;
  out.ctx = k.ctx;
  return out;
}

inline CUDA_MEMSET_NODE_PARAMS memsetOf(const CUDA_MEMSET_NODE_PARAMS_v2& m) {
  CUDA_MEMSET_NODE_PARAMS out{};
  out.dst = m.dst;
  out.pitch = m.pitch;
  out.value = m.value;
  out.elementSize = m.elementSize;
  out.width = m.width;
  out.height = m.height;
  return out;
}

}  // namespace detail

// cuGraphAddNode_v2 through `Api`'s per-kind entry points (static members
// with cuda.h's signatures). Edge data other than the default is given to
// cuGraphAddDependencies_v2 after the node is made. Kinds without a per-kind
// entry point here (memory, conditional, external and batch memory
// operation nodes) are CUDA_ERROR_NOT_SUPPORTED, as is a child graph whose
// ownership moves to the node.
template <typename Api>
CUresult addNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                 const CUgraphEdgeData* edgeData, size_t numDependencies,
                 const CUgraphNodeParams* p) {
  if (phGraphNode == nullptr || p == nullptr || !detail::reservedZero(*p)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (numDependencies > 0 && dependencies == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // With edge data, the edges are added once the node is.
  const CUgraphNode* deps = edgeData == nullptr ? dependencies : nullptr;
  const size_t count = edgeData == nullptr ? numDependencies : 0;
  CUgraphNode node = nullptr;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_EMPTY:
      r = Api::addEmpty(&node, hGraph, deps, count);
      break;
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const CUDA_KERNEL_NODE_PARAMS k = detail::kernelOf(p->kernel);
      r = Api::addKernel(&node, hGraph, deps, count, &k);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      if (p->memcpy.flags != 0 || p->memcpy.reserved != 0) return CUDA_ERROR_INVALID_VALUE;
      r = Api::addMemcpy(&node, hGraph, deps, count, &p->memcpy.copyParams, p->memcpy.copyCtx);
      break;
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS m = detail::memsetOf(p->memset);
      r = Api::addMemset(&node, hGraph, deps, count, &m, p->memset.ctx);
      break;
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      const CUDA_HOST_NODE_PARAMS h{p->host.fn, p->host.userData};
      r = Api::addHost(&node, hGraph, deps, count, &h);
      break;
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) {
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      r = Api::addChildGraph(&node, hGraph, deps, count, p->graph.graph);
      break;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      r = Api::addEventRecord(&node, hGraph, deps, count, p->eventRecord.event);
      break;
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      r = Api::addEventWait(&node, hGraph, deps, count, p->eventWait.event);
      break;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (r != CUDA_SUCCESS) return r;
  if (edgeData != nullptr && numDependencies > 0) {
    const std::vector<CUgraphNode> to(numDependencies, node);
    r = Api::addDependencies(hGraph, dependencies, to.data(), edgeData, numDependencies);
    if (r != CUDA_SUCCESS) {
      (void)Api::destroyNode(node);
      return r;
    }
  }
  *phGraphNode = node;
  return CUDA_SUCCESS;
}

// cuGraphNodeSetParams (`exec` null) or cuGraphExecNodeSetParams (the node
// in executable graph `exec` only), through `Api`'s per-kind setters. The
// node's kind is the driver's to check against the parameters'.
template <typename Api>
CUresult setParams(CUgraphExec exec, CUgraphNode hNode, const CUgraphNodeParams* p) {
  if (p == nullptr || !detail::reservedZero(*p)) return CUDA_ERROR_INVALID_VALUE;
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const CUDA_KERNEL_NODE_PARAMS k = detail::kernelOf(p->kernel);
      return exec != nullptr ? Api::execSetKernel(exec, hNode, &k) : Api::setKernel(hNode, &k);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      if (p->memcpy.flags != 0 || p->memcpy.reserved != 0) return CUDA_ERROR_INVALID_VALUE;
      return exec != nullptr
                 ? Api::execSetMemcpy(exec, hNode, &p->memcpy.copyParams, p->memcpy.copyCtx)
                 : Api::setMemcpy(hNode, &p->memcpy.copyParams);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS m = detail::memsetOf(p->memset);
      return exec != nullptr ? Api::execSetMemset(exec, hNode, &m, p->memset.ctx)
                             : Api::setMemset(hNode, &m);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      const CUDA_HOST_NODE_PARAMS h{p->host.fn, p->host.userData};
      return exec != nullptr ? Api::execSetHost(exec, hNode, &h) : Api::setHost(hNode, &h);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
      // A child graph node's graph changes only in an executable graph.
      if (exec == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      return Api::execSetChildGraph(exec, hNode, p->graph.graph);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return exec != nullptr ? Api::execSetEventRecord(exec, hNode, p->eventRecord.event)
                             : Api::setEventRecord(hNode, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return exec != nullptr ? Api::execSetEventWait(exec, hNode, p->eventWait.event)
                             : Api::setEventWait(hNode, p->eventWait.event);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// The per-kind entry points as this process exports them (cuda.h's
// symbols, resolved in the process that includes this: vgpu's own, or the
// shim's, which remote them).
struct ExportedApi {
  static constexpr auto addEmpty = &::cuGraphAddEmptyNode;
  static constexpr auto addKernel = &::cuGraphAddKernelNode_v2;
  static constexpr auto addMemcpy = &::cuGraphAddMemcpyNode;
  static constexpr auto addMemset = &::cuGraphAddMemsetNode;
  static constexpr auto addHost = &::cuGraphAddHostNode;
  static constexpr auto addChildGraph = &::cuGraphAddChildGraphNode;
  static constexpr auto addEventRecord = &::cuGraphAddEventRecordNode;
  static constexpr auto addEventWait = &::cuGraphAddEventWaitNode;
  static constexpr auto addDependencies = &::cuGraphAddDependencies_v2;
  static constexpr auto destroyNode = &::cuGraphDestroyNode;
  static constexpr auto setKernel = &::cuGraphKernelNodeSetParams_v2;
  static constexpr auto setMemcpy = &::cuGraphMemcpyNodeSetParams;
  static constexpr auto setMemset = &::cuGraphMemsetNodeSetParams;
  static constexpr auto setHost = &::cuGraphHostNodeSetParams;
  static constexpr auto setEventRecord = &::cuGraphEventRecordNodeSetEvent;
  static constexpr auto setEventWait = &::cuGraphEventWaitNodeSetEvent;
  static constexpr auto execSetKernel = &::cuGraphExecKernelNodeSetParams_v2;
  static constexpr auto execSetMemcpy = &::cuGraphExecMemcpyNodeSetParams;
  static constexpr auto execSetMemset = &::cuGraphExecMemsetNodeSetParams;
  static constexpr auto execSetHost = &::cuGraphExecHostNodeSetParams;
  static constexpr auto execSetChildGraph = &::cuGraphExecChildGraphNodeSetParams;
  static constexpr auto execSetEventRecord = &::cuGraphExecEventRecordNodeSetEvent;
  static constexpr auto execSetEventWait = &::cuGraphExecEventWaitNodeSetEvent;
};

}  // namespace phos::graph_node_params
