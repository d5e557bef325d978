// SPDX-License-Identifier: Apache-2.0
// Entry points: stream capture and CUDA graphs (driver/graph.h). The explicit
// graph API makes kernel, memset, memcpy and host nodes through the stream
// calls they stand for (Driver::addNodeByCapture), so a node is checked and
// runs exactly as that call on a stream would.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "entry.h"
#include "phos/common/graph_node_params.h"
#include "phos/common/launch_attributes.h"

using namespace phos;
using namespace phos::vgpu;
using phos::vgpu::api::call;
using phos::vgpu::api::handleOf;
using phos::vgpu::api::requireNonNull;

PHOS_CU_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream,
                                                             CUstreamCaptureMode mode);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(
    CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
    const CUgraphEdgeData* dependencyData, size_t numDependencies, CUstreamCaptureMode mode);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream,
                                                         CUstreamCaptureStatus* captureStatus);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_ptsz(
    CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out);
// CUDA 12's signature, which cuda.h 13 no longer declares (without this
// declaration the definition below would be a C++ function, and the weak
// NOT_SUPPORTED one would answer).
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream,
                                                          CUstreamCaptureStatus* captureStatus_out,
                                                          cuuint64_t* id_out, CUgraph* graph_out,
                                                          const CUgraphNode** dependencies_out,
                                                          size_t* numDependencies_out);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v2_ptsz(
    CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
    CUgraph* graph_out, const CUgraphNode** dependencies_out, size_t* numDependencies_out);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(
    CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
    CUgraph* graph_out, const CUgraphNode** dependencies_out, const CUgraphEdgeData** edgeData_out,
    size_t* numDependencies_out);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2_ptsz(
    CUstream hStream, CUgraphNode* dependencies, const CUgraphEdgeData* dependencyData,
    size_t numDependencies, unsigned int flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies_ptsz(CUstream hStream,
                                                                       CUgraphNode* dependencies,
                                                                       size_t numDependencies,
                                                                       unsigned int flags);
PHOS_CU_EXPORT CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream);
PHOS_CU_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* params);

namespace {

std::uint64_t idOf(const void* handle) {
  return reinterpret_cast<std::uintptr_t>(handle);
}

// --- capture -----------------------------------------------------------------------

CUresult beginCapture(const char* name, CUstream hStream, CUstreamCaptureMode mode,
                      bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    return d.beginCapture(ref, mode);
  });
}

CUresult beginCaptureToGraph(const char* name, CUstream hStream, CUgraph hGraph,
                             const CUgraphNode* dependencies, const CUgraphEdgeData* edges,
                             size_t count, CUstreamCaptureMode mode, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    if (hGraph == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "hGraph is null");
    if (count > 0 && dependencies == nullptr) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "numDependencies is not 0 but dependencies is null");
    }
    std::vector<std::uint64_t> deps;
    for (size_t i = 0; i < count; ++i) {
      if (edges != nullptr && (edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT ||
                               edges[i].from_port != 0 || edges[i].to_port != 0)) {
        return cuError(CUDA_ERROR_NOT_SUPPORTED,
                       "programmatic dependency edges are not supported by vgpu");
      }
      deps.push_back(idOf(dependencies[i]));
    }
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    return d.beginCapture(ref, mode, hGraph, std::move(deps));
  });
}

CUresult endCapture(const char* name, CUstream hStream, CUgraph* phGraph, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraph, "phGraph"));
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    // "phGraph: The captured graph" -- NULL when the capture failed.
    *phGraph = nullptr;
    ASSIGN_OR_RETURN(*phGraph, d.endCapture(ref));
    return Status::ok();
  });
}

// The capture sequence of a stream: its status, and with
// CU_STREAM_CAPTURE_STATUS_ACTIVE its id, graph and the stream's last nodes
// ("valid data (other than capture status) only if ... ACTIVE"; the other
// outputs are left as they were otherwise).
CUresult captureInfo(const char* name, CUstream hStream, bool perThread,
                     CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                     const CUgraphNode** dependencies, const CUgraphEdgeData** edges,
                     size_t* count) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(status, "captureStatus_out"));
    // Edge data asked for without dependencies is invalid.
    if (edges != nullptr && dependencies == nullptr) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "edgeData_out is given without dependencies_out");
    }
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    auto capture = ref.stream->capture();
    if (!capture) {
      *status = CU_STREAM_CAPTURE_STATUS_NONE;
      return Status::ok();
    }
    if (capture->invalidated()) {
      *status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      return Status::ok();
    }
    *status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (id != nullptr) *id = capture->id();
    if (graph != nullptr) *graph = handleOf<CUgraph>(capture->graph()->id());
    // The array stays valid "until the next API call to the stream or the
    // capture's end": kept per thread.
    thread_local std::vector<CUgraphNode> last;
    thread_local std::vector<CUgraphEdgeData> lastEdges;
    last.clear();
    for (std::uint64_t node : capture->frontier(*ref.stream)) {
      last.push_back(handleOf<CUgraphNode>(node));
    }
    lastEdges.assign(last.size(), CUgraphEdgeData{});
    if (dependencies != nullptr) *dependencies = last.empty() ? nullptr : last.data();
    if (edges != nullptr) *edges = last.empty() ? nullptr : lastEdges.data();
    if (count != nullptr) *count = last.size();
    return Status::ok();
  });
}

// --- nodes -------------------------------------------------------------------------

Result<std::vector<std::uint64_t>> dependenciesOf(const CUgraphNode* dependencies, size_t count) {
  if (count > 0 && dependencies == nullptr) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "numDependencies is not 0 but dependencies is null");
  }
  std::vector<std::uint64_t> out;
  for (size_t i = 0; i < count; ++i) out.push_back(idOf(dependencies[i]));
  return out;
}

// A node made by `launch` on a stream of `ctx` (the current context if null).
CUresult addNode(const char* name, CUgraphNode* phGraphNode, CUgraph hGraph,
                 const CUgraphNode* dependencies, size_t numDependencies, CUcontext ctx,
                 const std::function<CUresult(CUstream)>& launch) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraphNode, "phGraphNode"));
    ASSIGN_OR_RETURN(auto deps, dependenciesOf(dependencies, numDependencies));
    if (ctx != nullptr && cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS) {
      return cuError(CUDA_ERROR_INVALID_CONTEXT, "ctx is not a live context");
    }
    auto node = d.addNodeByCapture(hGraph, std::move(deps), launch);
    if (ctx != nullptr) {
      CUcontext popped = nullptr;
      (void)cuCtxPopCurrent_v2(&popped);
    }
    ASSIGN_OR_RETURN(*phGraphNode, std::move(node));
    return Status::ok();
  });
}

// cuGraphGetNodes and cuGraphGetRootNodes: "if nodes is NULL, the number of
// nodes is returned in numNodes. Otherwise, numNodes entries will be filled
// in. If numNodes is higher than the actual number of nodes, the remaining
// entries in nodes will be set to NULL, and the number of nodes actually
// obtained will be returned in numNodes."
Status listNodes(const std::vector<std::uint64_t>& ids, CUgraphNode* nodes, size_t* numNodes) {
  RETURN_IF_ERROR(requireNonNull(numNodes, "numNodes"));
  if (nodes != nullptr) {
    const size_t room = *numNodes;
    for (size_t i = 0; i < room; ++i) {
      nodes[i] = i < ids.size() ? handleOf<CUgraphNode>(ids[i]) : nullptr;
    }
    *numNodes = std::min(room, ids.size());
  } else {
    *numNodes = ids.size();
  }
  return Status::ok();
}

// cuGraphNodeGetDependencies and cuGraphNodeGetDependentNodes: as
// listNodes, with default edge data when asked for.
Status listEdges(const std::vector<std::uint64_t>& ids, CUgraphNode* nodes,
                 CUgraphEdgeData* edgeData, size_t* count) {
  if (edgeData != nullptr && nodes == nullptr) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "edgeData is given without the nodes array");
  }
  const size_t room = count != nullptr ? *count : 0;
  RETURN_IF_ERROR(listNodes(ids, nodes, count));
  if (edgeData != nullptr) {
    for (size_t i = 0; i < room; ++i) edgeData[i] = CUgraphEdgeData{};
  }
  return Status::ok();
}

CUresult updateCaptureDependencies(const char* name, CUstream hStream, CUgraphNode* dependencies,
                                   const CUgraphEdgeData* edges, size_t count, unsigned flags,
                                   bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES &&
        flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "flags 0x{:x} are invalid", flags);
    }
    ASSIGN_OR_RETURN(auto deps, dependenciesOf(dependencies, count));
    for (size_t i = 0; edges != nullptr && i < count; ++i) {
      if (edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT || edges[i].from_port != 0 ||
          edges[i].to_port != 0) {
        return cuError(CUDA_ERROR_NOT_SUPPORTED,
                       "programmatic dependency edges are not supported by vgpu");
      }
    }
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    auto capture = ref.stream->capture();
    if (!capture) return cuError(CUDA_ERROR_ILLEGAL_STATE, "the stream is not capturing");
    return capture->setFrontier(*ref.stream, deps, flags == CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  });
}

CUresult eventNodeEvent(const char* name, CUgraphNode hNode, CUevent* event_out,
                        CUgraphNodeType type) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(event_out, "event_out"));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    if (found.second->info.type != type) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "the node is of another type");
    }
    *event_out = found.second->info.event;
    return Status::ok();
  });
}

CUresult graphLaunch(const char* name, CUgraphExec hGraphExec, CUstream hStream, bool perThread) {
  return call(name, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, perThread));
    return d.launchGraph(hGraphExec, ref);
  });
}

// Flags cuGraphInstantiateWithFlags knows; device launches need a GPU's
// device-side graph launch, which vgpu does not have.
Status checkInstantiateFlags(unsigned long long flags) {
  constexpr unsigned long long kKnown =
      CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
      CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if ((flags & ~kKnown) != 0) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "instantiate flags 0x{:x} are invalid", flags);
  }
  if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) != 0) {
    return cuError(CUDA_ERROR_NOT_SUPPORTED,
                   "graphs launched from the device are not supported by vgpu");
  }
  return Status::ok();
}

}  // namespace

// --- stream capture --------------------------------------------------------------------

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return beginCapture(__func__, hStream, mode, false);
}
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return beginCapture(__func__, hStream, mode, true);
}
CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                             const CUgraphNode* dependencies,
                                             const CUgraphEdgeData* dependencyData,
                                             size_t numDependencies, CUstreamCaptureMode mode) {
  return beginCaptureToGraph(__func__, hStream, hGraph, dependencies, dependencyData,
                             numDependencies, mode, false);
}
CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                  const CUgraphNode* dependencies,
                                                  const CUgraphEdgeData* dependencyData,
                                                  size_t numDependencies,
                                                  CUstreamCaptureMode mode) {
  return beginCaptureToGraph(__func__, hStream, hGraph, dependencies, dependencyData,
                             numDependencies, mode, true);
}
CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return endCapture(__func__, hStream, phGraph, false);
}
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return endCapture(__func__, hStream, phGraph, true);
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return captureInfo(__func__, hStream, false, captureStatus, nullptr, nullptr, nullptr, nullptr,
                     nullptr);
}
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return captureInfo(__func__, hStream, true, captureStatus, nullptr, nullptr, nullptr, nullptr,
                     nullptr);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream,
                                           CUstreamCaptureStatus* captureStatus_out,
                                           cuuint64_t* id_out, CUgraph* graph_out,
                                           const CUgraphNode** dependencies_out,
                                           const CUgraphEdgeData** edgeData_out,
                                           size_t* numDependencies_out) {
  return captureInfo(__func__, hStream, false, captureStatus_out, id_out, graph_out,
                     dependencies_out, edgeData_out, numDependencies_out);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream,
                                                CUstreamCaptureStatus* captureStatus_out,
                                                cuuint64_t* id_out, CUgraph* graph_out,
                                                const CUgraphNode** dependencies_out,
                                                const CUgraphEdgeData** edgeData_out,
                                                size_t* numDependencies_out) {
  return captureInfo(__func__, hStream, true, captureStatus_out, id_out, graph_out,
                     dependencies_out, edgeData_out, numDependencies_out);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream,
                                           CUstreamCaptureStatus* captureStatus_out,
                                           cuuint64_t* id_out, CUgraph* graph_out,
                                           const CUgraphNode** dependencies_out,
                                           size_t* numDependencies_out) {
  return captureInfo(__func__, hStream, false, captureStatus_out, id_out, graph_out,
                     dependencies_out, nullptr, numDependencies_out);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream,
                                                CUstreamCaptureStatus* captureStatus_out,
                                                cuuint64_t* id_out, CUgraph* graph_out,
                                                const CUgraphNode** dependencies_out,
                                                size_t* numDependencies_out) {
  return captureInfo(__func__, hStream, true, captureStatus_out, id_out, graph_out,
                     dependencies_out, nullptr, numDependencies_out);
}
// The CUDA 10 ABI, status and id only (cuStreamGetCaptureInfo itself is in api_legacy.cpp).
CUresult CUDAAPI cuStreamGetCaptureInfo_ptsz(CUstream hStream,
                                             CUstreamCaptureStatus* captureStatus_out,
                                             cuuint64_t* id_out) {
  return captureInfo(__func__, hStream, true, captureStatus_out, id_out, nullptr, nullptr, nullptr,
                     nullptr);
}
CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2(CUstream hStream, CUgraphNode* dependencies,
                                                      const CUgraphEdgeData* dependencyData,
                                                      size_t numDependencies, unsigned int flags) {
  return updateCaptureDependencies(__func__, hStream, dependencies, dependencyData, numDependencies,
                                   flags, false);
}
CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2_ptsz(CUstream hStream,
                                                           CUgraphNode* dependencies,
                                                           const CUgraphEdgeData* dependencyData,
                                                           size_t numDependencies,
                                                           unsigned int flags) {
  return updateCaptureDependencies(__func__, hStream, dependencies, dependencyData, numDependencies,
                                   flags, true);
}
// CUDA 11.3's form, without edge data; the default-stream one is in api_legacy.cpp.
CUresult CUDAAPI cuStreamUpdateCaptureDependencies_ptsz(CUstream hStream, CUgraphNode* dependencies,
                                                        size_t numDependencies,
                                                        unsigned int flags) {
  return updateCaptureDependencies(__func__, hStream, dependencies, nullptr, numDependencies, flags,
                                   true);
}
CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  return call(__func__, [&](Driver&) -> Status {
    RETURN_IF_ERROR(requireNonNull(mode, "mode"));
    if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        *mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "capture mode {} is not a CUstreamCaptureMode",
                      static_cast<int>(*mode));
    }
    *mode = Driver::exchangeThreadCaptureMode(*mode);
    return Status::ok();
  });
}

// --- graphs ------------------------------------------------------------------------------

CUresult CUDAAPI cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraph, "phGraph"));
    // "flags: Graph creation flags, must be 0".
    if (flags != 0) return cuError(CUDA_ERROR_INVALID_VALUE, "flags must be 0");
    ASSIGN_OR_RETURN(*phGraph, d.createGraph());
    return Status::ok();
  });
}
CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  return call(__func__, [&](Driver& d) { return d.destroyGraph(hGraph); });
}
CUresult CUDAAPI cuGraphClone(CUgraph* phGraphClone, CUgraph originalGraph) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraphClone, "phGraphClone"));
    ASSIGN_OR_RETURN(*phGraphClone, d.cloneGraph(originalGraph));
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                     const CUgraphNode* dependencies, size_t numDependencies) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraphNode, "phGraphNode"));
    ASSIGN_OR_RETURN(auto graph, d.graph(hGraph));
    ASSIGN_OR_RETURN(auto deps, dependenciesOf(dependencies, numDependencies));
    ASSIGN_OR_RETURN(auto node, graph->add(NodeInfo{}, nullptr, std::move(deps)));
    *phGraphNode = handleOf<CUgraphNode>(node->id);
    return Status::ok();
  });
}

namespace {

// What a kernel node runs: its launch on the stream it is captured from.
// "kern: Kernel to launch, will only be referenced if func is NULL"; its
// context then is ctx (the current one if NULL).
// `cooperative`: the node's CU_LAUNCH_ATTRIBUTE_COOPERATIVE.
std::function<CUresult(CUstream)> kernelLaunch(const CUDA_KERNEL_NODE_PARAMS* p,
                                               bool cooperative = false) {
  const CUfunction f = p->func != nullptr ? p->func : reinterpret_cast<CUfunction>(p->kern);
  return [p, f, cooperative](CUstream s) {
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attribute.value.cooperative = cooperative ? 1 : 0;
    CUlaunchConfig config{};
    config.gridDimX = p->gridDimX;
    config.gridDimY = p->gridDimY;
    config.gridDimZ = p->gridDimZ;
    config.blockDimX = p->blockDimX;
    config.blockDimY = p->blockDimY;
    config.blockDimZ = p->blockDimZ;
    config.sharedMemBytes = p->sharedMemBytes;
    config.hStream = s;
    config.attrs = &attribute;
    config.numAttrs = 1;
    return cuLaunchKernelEx(&config, f, p->kernelParams, p->extra);
  };
}
CUcontext kernelContext(const CUDA_KERNEL_NODE_PARAMS* p) {
  return p->func != nullptr ? nullptr : p->ctx;
}

std::function<CUresult(CUstream)> memsetLaunch(const CUDA_MEMSET_NODE_PARAMS* p) {
  return [p](CUstream s) -> CUresult {
    // "elementSize: Size of each element in bytes. Must be 1, 2, or 4."
    switch (p->elementSize) {
      case 1:
        return cuMemsetD2D8Async(p->dst, p->pitch, static_cast<unsigned char>(p->value), p->width,
                                 p->height, s);
      case 2:
        return cuMemsetD2D16Async(p->dst, p->pitch, static_cast<unsigned short>(p->value), p->width,
                                  p->height, s);
      case 4:
        return cuMemsetD2D32Async(p->dst, p->pitch, p->value, p->width, p->height, s);
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  };
}

std::function<CUresult(CUstream)> memcpyLaunch(const CUDA_MEMCPY3D* p) {
  return [p](CUstream s) { return cuMemcpy3DAsync_v2(p, s); };
}

std::function<CUresult(CUstream)> hostLaunch(const CUDA_HOST_NODE_PARAMS* p) {
  return [p](CUstream s) { return cuLaunchHostFunc(s, p->fn, p->userData); };
}

// `fn` with `ctx` current (the current context if null).
Status inContext(CUcontext ctx, const std::function<Status()>& fn) {
  if (ctx != nullptr && cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS) {
    return cuError(CUDA_ERROR_INVALID_CONTEXT, "ctx is not a live context");
  }
  Status status = fn();
  if (ctx != nullptr) {
    CUcontext popped = nullptr;
    (void)cuCtxPopCurrent_v2(&popped);
  }
  return status;
}

// The kern and ctx fields a kernel node's parameters were given, which
// cuGraphKernelNodeGetParams answers (the runtime names its kernels by them).
void keepKernelFields(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS* p) {
  (void)call("kernel node parameters", [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto found, d.graphNode(node));
    if (auto& kernel = found.second->info.kernel) {
      kernel->kern = p->kern;
      kernel->ctx = p->ctx;
    }
    return Status::ok();
  });
}

// A node's parameters set in its graph, or in executable graph `exec` only.
CUresult setNodeParams(const char* name, CUgraphExec exec, CUgraphNode node, CUgraphNodeType type,
                       CUcontext ctx, bool given, const std::function<CUresult(CUstream)>& launch) {
  if (!given) return CUDA_ERROR_INVALID_VALUE;
  return call(name, [&](Driver& d) {
    return inContext(ctx, [&] {
      return exec != nullptr ? d.setExecNodeWork(exec, node, type, launch)
                             : d.setNodeWork(node, type, launch);
    });
  });
}

}  // namespace

CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                         const CUgraphNode* dependencies, size_t numDependencies,
                                         const CUDA_KERNEL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = addNode(__func__, phGraphNode, hGraph, dependencies, numDependencies,
                       kernelContext(p), kernelLaunch(p));
  if (r == CUDA_SUCCESS) keepKernelFields(*phGraphNode, p);
  return r;
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                      const CUgraphNode* dependencies, size_t numDependencies,
                                      const CUDA_MEMSET_NODE_PARAMS* p, CUcontext ctx) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return addNode(__func__, phGraphNode, hGraph, dependencies, numDependencies, ctx,
                 memsetLaunch(p));
}

CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                      const CUgraphNode* dependencies, size_t numDependencies,
                                      const CUDA_MEMCPY3D* copyParams, CUcontext ctx) {
  if (copyParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return addNode(__func__, phGraphNode, hGraph, dependencies, numDependencies, ctx,
                 memcpyLaunch(copyParams));
}

CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                    const CUgraphNode* dependencies, size_t numDependencies,
                                    const CUDA_HOST_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return addNode(__func__, phGraphNode, hGraph, dependencies, numDependencies, nullptr,
                 hostLaunch(p));
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                          const CUgraphNode* dependencies, size_t numDependencies,
                                          CUgraph childGraph) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraphNode, "phGraphNode"));
    ASSIGN_OR_RETURN(auto deps, dependenciesOf(dependencies, numDependencies));
    ASSIGN_OR_RETURN(*phGraphNode, d.addChildGraphNode(hGraph, std::move(deps), childGraph));
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphAddDependencies_v2(CUgraph hGraph, const CUgraphNode* from,
                                           const CUgraphNode* to, const CUgraphEdgeData* edgeData,
                                           size_t numDependencies) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto graph, d.graph(hGraph));
    if (numDependencies > 0 && (from == nullptr || to == nullptr)) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "from or to is null");
    }
    for (size_t i = 0; i < numDependencies; ++i) {
      // Only the default edge type (full dependencies) is run by vgpu.
      if (edgeData != nullptr && (edgeData[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT ||
                                  edgeData[i].from_port != 0 || edgeData[i].to_port != 0)) {
        return cuError(CUDA_ERROR_NOT_SUPPORTED,
                       "programmatic dependency edges are not supported by vgpu");
      }
      RETURN_IF_ERROR(graph->addDependency(idOf(from[i]), idOf(to[i])));
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                           const CUgraphNode* dependencies, size_t numDependencies,
                                           CUevent event) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraphNode, "phGraphNode"));
    ASSIGN_OR_RETURN(auto deps, dependenciesOf(dependencies, numDependencies));
    ASSIGN_OR_RETURN(*phGraphNode, d.addEventNode(hGraph, std::move(deps), event,
                                                  CU_GRAPH_NODE_TYPE_EVENT_RECORD));
    return Status::ok();
  });
}
CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                         const CUgraphNode* dependencies, size_t numDependencies,
                                         CUevent event) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraphNode, "phGraphNode"));
    ASSIGN_OR_RETURN(auto deps, dependenciesOf(dependencies, numDependencies));
    ASSIGN_OR_RETURN(*phGraphNode,
                     d.addEventNode(hGraph, std::move(deps), event, CU_GRAPH_NODE_TYPE_WAIT_EVENT));
    return Status::ok();
  });
}
CUresult CUDAAPI cuGraphEventRecordNodeGetEvent(CUgraphNode hNode, CUevent* event_out) {
  return eventNodeEvent(__func__, hNode, event_out, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphEventWaitNodeGetEvent(CUgraphNode hNode, CUevent* event_out) {
  return eventNodeEvent(__func__, hNode, event_out, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

CUresult CUDAAPI cuGraphRemoveDependencies_v2(CUgraph hGraph, const CUgraphNode* from,
                                              const CUgraphNode* to,
                                              const CUgraphEdgeData* edgeData,
                                              size_t numDependencies) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto graph, d.graph(hGraph));
    if (numDependencies > 0 && (from == nullptr || to == nullptr)) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "from or to is null");
    }
    for (size_t i = 0; i < numDependencies; ++i) {
      if (edgeData != nullptr && (edgeData[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT ||
                                  edgeData[i].from_port != 0 || edgeData[i].to_port != 0)) {
        return cuError(CUDA_ERROR_INVALID_VALUE,
                       "no such programmatic edge exists (vgpu makes none)");
      }
      RETURN_IF_ERROR(graph->removeDependency(idOf(from[i]), idOf(to[i])));
    }
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode hNode) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    return found.first->remove(idOf(hNode));
  });
}

CUresult CUDAAPI cuGraphNodeGetDependencies_v2(CUgraphNode hNode, CUgraphNode* dependencies,
                                               CUgraphEdgeData* edgeData, size_t* numDependencies) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    return listEdges(found.second->dependencies, dependencies, edgeData, numDependencies);
  });
}

CUresult CUDAAPI cuGraphNodeGetDependentNodes_v2(CUgraphNode hNode, CUgraphNode* dependentNodes,
                                                 CUgraphEdgeData* edgeData,
                                                 size_t* numDependentNodes) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    return listEdges(found.first->dependents(idOf(hNode)), dependentNodes, edgeData,
                     numDependentNodes);
  });
}

// "from and to may both be NULL, in which case this function only returns
// the number of edges in numEdges. Otherwise, numEdges entries will be
// filled in. If numEdges is higher than the actual number of edges, the
// remaining entries in from and to will be set to NULL."
CUresult CUDAAPI cuGraphGetEdges_v2(CUgraph hGraph, CUgraphNode* from, CUgraphNode* to,
                                    CUgraphEdgeData* edgeData, size_t* numEdges) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(numEdges, "numEdges"));
    if ((from == nullptr) != (to == nullptr) || (edgeData != nullptr && from == nullptr)) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "from and to must both be given or both be NULL");
    }
    ASSIGN_OR_RETURN(auto graph, d.graph(hGraph));
    std::vector<std::pair<std::uint64_t, std::uint64_t>> edges;
    for (const auto& n : graph->nodes()) {
      for (std::uint64_t dep : n->dependencies) edges.emplace_back(dep, n->id);
    }
    if (from == nullptr) {
      *numEdges = edges.size();
      return Status::ok();
    }
    const size_t room = *numEdges;
    for (size_t i = 0; i < room; ++i) {
      from[i] = i < edges.size() ? handleOf<CUgraphNode>(edges[i].first) : nullptr;
      to[i] = i < edges.size() ? handleOf<CUgraphNode>(edges[i].second) : nullptr;
      if (edgeData != nullptr) edgeData[i] = CUgraphEdgeData{};
    }
    *numEdges = std::min(room, edges.size());
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto graph, d.graph(hGraph));
    std::vector<std::uint64_t> ids;
    for (const auto& n : graph->nodes()) ids.push_back(n->id);
    return listNodes(ids, nodes, numNodes);
  });
}

CUresult CUDAAPI cuGraphGetRootNodes(CUgraph hGraph, CUgraphNode* rootNodes, size_t* numRootNodes) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto graph, d.graph(hGraph));
    std::vector<std::uint64_t> ids;
    for (const auto& n : graph->nodes()) {
      if (n->dependencies.empty()) ids.push_back(n->id);
    }
    return listNodes(ids, rootNodes, numRootNodes);
  });
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(type, "type"));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    *type = found.second->info.type;
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                               CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(nodeParams, "nodeParams"));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    auto& kernel = found.second->info.kernel;
    if (!kernel) return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a kernel node");
    // kernelParams points into the node's own copy of the arguments.
    thread_local std::vector<void*> pointers;
    pointers.clear();
    for (std::size_t offset : kernel->offsets) pointers.push_back(kernel->params.data() + offset);
    *nodeParams = CUDA_KERNEL_NODE_PARAMS{};
    // A node made from a library kernel ("kern ... referenced if func is
    // NULL") has no function; kern and ctx are as the application gave them.
    if (kindOf(idOf(kernel->function)) != HandleKind::kKernel) nodeParams->func = kernel->function;
    nodeParams->kern = kernel->kern;
    nodeParams->ctx = kernel->ctx;
    nodeParams->gridDimX = kernel->grid[0];
    nodeParams->gridDimY = kernel->grid[1];
    nodeParams->gridDimZ = kernel->grid[2];
    nodeParams->blockDimX = kernel->block[0];
    nodeParams->blockDimY = kernel->block[1];
    nodeParams->blockDimZ = kernel->block[2];
    nodeParams->sharedMemBytes = kernel->sharedMemBytes;
    nodeParams->kernelParams = pointers.empty() ? nullptr : pointers.data();
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode hNode, CUDA_MEMCPY3D* nodeParams) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(nodeParams, "nodeParams"));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    const auto& memcpy = found.second->info.memcpy;
    if (!memcpy) return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a memcpy node");
    *nodeParams = *memcpy;
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode hNode,
                                            CUDA_MEMSET_NODE_PARAMS* nodeParams) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(nodeParams, "nodeParams"));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    const auto& memset = found.second->info.memset;
    if (!memset) return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a memset node");
    *nodeParams = *memset;
    return Status::ok();
  });
}

// --- executable graphs ----------------------------------------------------------------

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                             unsigned long long flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraphExec, "phGraphExec"));
    RETURN_IF_ERROR(checkInstantiateFlags(flags));
    ASSIGN_OR_RETURN(*phGraphExec, d.instantiate(hGraph, flags));
    return Status::ok();
  });
}

namespace {
CUresult instantiateWithParams(const char* name, CUgraphExec* phGraphExec, CUgraph hGraph,
                               CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return call(name, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraphExec, "phGraphExec"));
    RETURN_IF_ERROR(requireNonNull(params, "instantiateParams"));
    params->hErrNode_out = nullptr;
    params->result_out = CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE;
    RETURN_IF_ERROR(checkInstantiateFlags(params->flags));
    ASSIGN_OR_RETURN(*phGraphExec, d.instantiate(hGraph, params->flags));
    params->result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return Status::ok();
  });
}
}  // namespace

CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiateWithParams(__func__, phGraphExec, hGraph, params);
}
CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiateWithParams(__func__, phGraphExec, hGraph, params);
}
// "Returns the flags that were passed to instantiation for the given executable graph."
CUresult CUDAAPI cuGraphExecGetFlags(CUgraphExec hGraphExec, cuuint64_t* flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(flags, "flags"));
    ASSIGN_OR_RETURN(auto exec, d.graphExec(hGraphExec));
    *flags = exec->flags();
    return Status::ok();
  });
}

// --- node parameters, in a graph or an executable graph ---------------------------------
// "All nodeParams fields may change"; set in an executable graph, only its
// later launches run the new work, and its graph keeps its own.

namespace {

// Whether kernel node `node` launches cooperatively (its attribute).
bool nodeCooperative(CUgraphNode node) {
  bool cooperative = false;
  (void)call("kernel node attributes", [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto found, d.graphNode(node));
    if (const auto& kernel = found.second->info.kernel) cooperative = kernel->cooperative();
    return Status::ok();
  });
  return cooperative;
}

}  // namespace

CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode hNode,
                                               const CUDA_KERNEL_NODE_PARAMS* p) {
  CUresult r = setNodeParams(__func__, nullptr, hNode, CU_GRAPH_NODE_TYPE_KERNEL,
                             p != nullptr ? kernelContext(p) : nullptr, p != nullptr,
                             p != nullptr ? kernelLaunch(p, nodeCooperative(hNode)) : nullptr);
  if (r == CUDA_SUCCESS) keepKernelFields(hNode, p);
  return r;
}
CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                   const CUDA_KERNEL_NODE_PARAMS* p) {
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return setNodeParams(__func__, hGraphExec, hNode, CU_GRAPH_NODE_TYPE_KERNEL,
                       p != nullptr ? kernelContext(p) : nullptr, p != nullptr,
                       p != nullptr ? kernelLaunch(p, nodeCooperative(hNode)) : nullptr);
}

// --- kernel node attributes ----------------------------------------------------------------
// The launch attributes a kernel node may carry. Scheduling hints are kept and
// answered (they change nothing on a CPU); the cooperative attribute changes
// how the node launches; clusters of more than one block are not supported.

namespace {

Status checkNodeAttribute(CUkernelNodeAttrID attr, const CUkernelNodeAttrValue* value) {
  if (!isKernelNodeAttribute(attr)) {
    return cuErrorf(CUDA_ERROR_NOT_SUPPORTED, "kernel node attribute {} is not supported by vgpu",
                    static_cast<int>(attr));
  }
  if (attr == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION && value != nullptr &&
      std::uint64_t{value->clusterDim.x} * value->clusterDim.y * value->clusterDim.z > 1) {
    return cuError(CUDA_ERROR_NOT_SUPPORTED, "thread block clusters are not supported by vgpu");
  }
  return Status::ok();
}

// Makes kernel node `node`'s work again, launched cooperatively or not, with
// its parameters as they are, and gives it `attributes`.
Status setNodeAttributes(Driver& d, CUgraphNode node,
                         std::map<int, CUlaunchAttributeValue> attributes) {
  ASSIGN_OR_RETURN(auto found, d.graphNode(node));
  if (!found.second->info.kernel) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a kernel node");
  }
  KernelNodeInfo kernel = *found.second->info.kernel;
  // A priority is clamped to cuCtxGetStreamPriorityRange's [-5, 0], as a
  // stream's is: NVIDIA's driver answers 0 for a node given 1 (an H200).
  if (auto it = attributes.find(CU_LAUNCH_ATTRIBUTE_PRIORITY); it != attributes.end()) {
    it->second.priority = std::clamp(it->second.priority, -5, 0);
  }
  bool cooperative = false;
  if (auto it = attributes.find(CU_LAUNCH_ATTRIBUTE_COOPERATIVE); it != attributes.end()) {
    cooperative = it->second.cooperative != 0;
  }
  if (cooperative != kernel.cooperative()) {
    std::vector<void*> pointers;
    for (std::size_t offset : kernel.offsets) pointers.push_back(kernel.params.data() + offset);
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = kernel.function;
    p.gridDimX = kernel.grid[0];
    p.gridDimY = kernel.grid[1];
    p.gridDimZ = kernel.grid[2];
    p.blockDimX = kernel.block[0];
    p.blockDimY = kernel.block[1];
    p.blockDimZ = kernel.block[2];
    p.sharedMemBytes = kernel.sharedMemBytes;
    p.kernelParams = pointers.empty() ? nullptr : pointers.data();
    const bool library = kindOf(idOf(kernel.function)) == HandleKind::kKernel;
    RETURN_IF_ERROR(inContext(library ? kernel.ctx : nullptr, [&] {
      return d.setNodeWork(node, CU_GRAPH_NODE_TYPE_KERNEL, kernelLaunch(&p, cooperative));
    }));
    ASSIGN_OR_RETURN(found, d.graphNode(node));
    found.second->info.kernel->kern = kernel.kern;
    found.second->info.kernel->ctx = kernel.ctx;
  }
  found.second->info.kernel->attributes = std::move(attributes);
  return Status::ok();
}

}  // namespace

CUresult CUDAAPI cuGraphKernelNodeGetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                               CUkernelNodeAttrValue* value_out) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value_out, "value_out"));
    RETURN_IF_ERROR(checkNodeAttribute(attr, nullptr));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    const auto& kernel = found.second->info.kernel;
    if (!kernel) return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a kernel node");
    auto it = kernel->attributes.find(attr);
    *value_out = it != kernel->attributes.end() ? it->second : CUkernelNodeAttrValue{};
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphKernelNodeSetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                               const CUkernelNodeAttrValue* value) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(value, "value"));
    RETURN_IF_ERROR(checkNodeAttribute(attr, value));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    if (!found.second->info.kernel) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a kernel node");
    }
    auto attributes = found.second->info.kernel->attributes;
    attributes[attr] = *value;
    return setNodeAttributes(d, hNode, std::move(attributes));
  });
}

CUresult CUDAAPI cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto from, d.graphNode(src));
    if (!from.second->info.kernel) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "src is not a kernel node");
    }
    return setNodeAttributes(d, dst, from.second->info.kernel->attributes);
  });
}
CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode hNode, const CUDA_MEMCPY3D* p) {
  return setNodeParams(__func__, nullptr, hNode, CU_GRAPH_NODE_TYPE_MEMCPY, nullptr, p != nullptr,
                       memcpyLaunch(p));
}
CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                const CUDA_MEMCPY3D* p, CUcontext ctx) {
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return setNodeParams(__func__, hGraphExec, hNode, CU_GRAPH_NODE_TYPE_MEMCPY, ctx, p != nullptr,
                       memcpyLaunch(p));
}
CUresult CUDAAPI cuGraphMemsetNodeSetParams(CUgraphNode hNode, const CUDA_MEMSET_NODE_PARAMS* p) {
  return setNodeParams(__func__, nullptr, hNode, CU_GRAPH_NODE_TYPE_MEMSET, nullptr, p != nullptr,
                       memsetLaunch(p));
}
CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                const CUDA_MEMSET_NODE_PARAMS* p, CUcontext ctx) {
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return setNodeParams(__func__, hGraphExec, hNode, CU_GRAPH_NODE_TYPE_MEMSET, ctx, p != nullptr,
                       memsetLaunch(p));
}
CUresult CUDAAPI cuGraphHostNodeSetParams(CUgraphNode hNode, const CUDA_HOST_NODE_PARAMS* p) {
  return setNodeParams(__func__, nullptr, hNode, CU_GRAPH_NODE_TYPE_HOST, nullptr, p != nullptr,
                       hostLaunch(p));
}
CUresult CUDAAPI cuGraphExecHostNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                              const CUDA_HOST_NODE_PARAMS* p) {
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return setNodeParams(__func__, hGraphExec, hNode, CU_GRAPH_NODE_TYPE_HOST, nullptr, p != nullptr,
                       hostLaunch(p));
}
CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode hNode, CUDA_HOST_NODE_PARAMS* nodeParams) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(nodeParams, "nodeParams"));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    const auto& host = found.second->info.host;
    if (!host) return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a host node");
    *nodeParams = *host;
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphEventRecordNodeSetEvent(CUgraphNode hNode, CUevent event) {
  return call(__func__, [&](Driver& d) {
    return d.setNodeEvent(hNode, CU_GRAPH_NODE_TYPE_EVENT_RECORD, event);
  });
}
CUresult CUDAAPI cuGraphEventWaitNodeSetEvent(CUgraphNode hNode, CUevent event) {
  return call(__func__, [&](Driver& d) {
    return d.setNodeEvent(hNode, CU_GRAPH_NODE_TYPE_WAIT_EVENT, event);
  });
}
CUresult CUDAAPI cuGraphExecEventRecordNodeSetEvent(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                    CUevent event) {
  return call(__func__, [&](Driver& d) {
    return d.setExecNodeEvent(hGraphExec, hNode, CU_GRAPH_NODE_TYPE_EVENT_RECORD, event);
  });
}
CUresult CUDAAPI cuGraphExecEventWaitNodeSetEvent(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                  CUevent event) {
  return call(__func__, [&](Driver& d) {
    return d.setExecNodeEvent(hGraphExec, hNode, CU_GRAPH_NODE_TYPE_WAIT_EVENT, event);
  });
}

CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec hGraphExec, CUgraphNode hNode,
                                       unsigned int isEnabled) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(auto exec, d.graphExec(hGraphExec));
    return exec->setEnabled(idOf(hNode), isEnabled != 0);
  });
}
CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec hGraphExec, CUgraphNode hNode,
                                       unsigned int* isEnabled) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(isEnabled, "isEnabled"));
    ASSIGN_OR_RETURN(auto exec, d.graphExec(hGraphExec));
    ASSIGN_OR_RETURN(bool enabled, exec->enabled(idOf(hNode)));
    *isEnabled = enabled ? 1 : 0;
    return Status::ok();
  });
}

// The executable graph takes `hGraph`'s parameters, node for node in the
// order both graphs run in, if `hGraph` has its shape; otherwise
// CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, and resultInfo says why. Nodes keep
// whether they are enabled.
CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                      CUgraphExecUpdateResultInfo* resultInfo) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(resultInfo, "resultInfo"));
    *resultInfo = CUgraphExecUpdateResultInfo{};
    ASSIGN_OR_RETURN(CUgraphExecUpdateResult result, d.updateGraphExec(hGraphExec, hGraph));
    resultInfo->result = result;
    if (result != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
      return cuErrorf(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
                      "the graph's shape is not the executable graph's (result {})",
                      static_cast<int>(result));
    }
    return Status::ok();
  });
}

// The generic node entry points, through the per-kind ones
// (phos/common/graph_node_params.h).
CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                   const CUgraphNode* dependencies,
                                   const CUgraphEdgeData* dependencyData, size_t numDependencies,
                                   CUgraphNodeParams* nodeParams) {
  return graph_node_params::addNode<graph_node_params::ExportedApi>(
      phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams);
}
CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams* nodeParams) {
  return graph_node_params::setParams<graph_node_params::ExportedApi>(nullptr, hNode, nodeParams);
}
CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                          CUgraphNodeParams* nodeParams) {
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return graph_node_params::setParams<graph_node_params::ExportedApi>(hGraphExec, hNode,
                                                                      nodeParams);
}

CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                    CUgraph childGraph) {
  return call(__func__,
              [&](Driver& d) { return d.updateChildGraphNode(hGraphExec, hNode, childGraph); });
}

// "This call does not clone the graph. Changes to the graph will be
// reflected in the node, and the node retains ownership of the graph."
CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph* phGraph) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phGraph, "phGraph"));
    ASSIGN_OR_RETURN(auto found, d.graphNode(hNode));
    if (!found.second->child) {
      return cuError(CUDA_ERROR_INVALID_VALUE, "the node is not a child graph node");
    }
    *phGraph = handleOf<CUgraph>(found.second->child->id());
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* phNode, CUgraphNode hOriginalNode,
                                        CUgraph hClonedGraph) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(phNode, "phNode"));
    ASSIGN_OR_RETURN(*phNode, d.findInClone(hOriginalNode, hClonedGraph));
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  return call(__func__, [&](Driver& d) { return d.destroyGraphExec(hGraphExec); });
}
CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return graphLaunch(__func__, hGraphExec, hStream, false);
}
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return graphLaunch(__func__, hGraphExec, hStream, true);
}
// Uploading prepares a GPU's launch; vgpu has nothing to prepare, but the
// stream and graph must be live.
CUresult CUDAAPI cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, false));
    (void)ref;
    if (hGraphExec == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "hGraphExec is null");
    return Status::ok();
  });
}
CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return call(__func__, [&](Driver& d) -> Status {
    ASSIGN_OR_RETURN(StreamRef ref, d.stream(hStream, true));
    (void)ref;
    if (hGraphExec == nullptr) return cuError(CUDA_ERROR_INVALID_VALUE, "hGraphExec is null");
    return Status::ok();
  });
}

// --- cuGraphDebugDotPrint ------------------------------------------------------------------------
// The graph in Graphviz's DOT language: a cluster per graph (child graphs
// nested in their node's), a node per graph node labelled with its type and,
// as the flags ask, its parameters and handle, and an edge per dependency.

namespace {

const char* nodeTypeName(CUgraphNodeType type) {
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return "KERNEL";
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return "MEMCPY";
    case CU_GRAPH_NODE_TYPE_MEMSET:
      return "MEMSET";
    case CU_GRAPH_NODE_TYPE_HOST:
      return "HOST";
    case CU_GRAPH_NODE_TYPE_GRAPH:
      return "GRAPH";
    case CU_GRAPH_NODE_TYPE_EMPTY:
      return "EMPTY";
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return "WAIT_EVENT";
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return "EVENT_RECORD";
    default:
      return "OTHER";
  }
}

bool wants(unsigned flags, unsigned flag) {
  return (flags & (flag | CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)) != 0;
}

std::string nodeLabel(const GraphNode& n, unsigned flags) {
  std::string label = nodeTypeName(n.info.type);
  if (wants(flags, CU_GRAPH_DEBUG_DOT_FLAGS_HANDLES)) {
    label += fmt::format("\\nhandle 0x{:x}", n.id);
  }
  if (n.info.kernel) {
    const KernelNodeInfo& k = *n.info.kernel;
    const char* name = nullptr;
    if (::cuFuncGetName(&name, k.function) != CUDA_SUCCESS || name == nullptr) name = "?";
    label += fmt::format("\\n{}", name);
    if (wants(flags, CU_GRAPH_DEBUG_DOT_FLAGS_KERNEL_NODE_PARAMS)) {
      label +=
          fmt::format("\\ngrid ({}, {}, {}) block ({}, {}, {}) shared {} B\\n{} parameter bytes",
                      k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
                      k.sharedMemBytes, k.params.size());
    }
    if (wants(flags, CU_GRAPH_DEBUG_DOT_FLAGS_KERNEL_NODE_ATTRIBUTES) && k.cooperative()) {
      label += "\\ncooperative";
    }
  }
  if (n.info.memcpy && wants(flags, CU_GRAPH_DEBUG_DOT_FLAGS_MEMCPY_NODE_PARAMS)) {
    const CUDA_MEMCPY3D& m = *n.info.memcpy;
    label += fmt::format("\\n{} x {} x {} bytes", m.WidthInBytes, m.Height, m.Depth);
  }
  if (n.info.memset && wants(flags, CU_GRAPH_DEBUG_DOT_FLAGS_MEMSET_NODE_PARAMS)) {
    const CUDA_MEMSET_NODE_PARAMS& m = *n.info.memset;
    label += fmt::format("\\n0x{:x}: value 0x{:x}, {} x {} elements of {} bytes, pitch {}", m.dst,
                         m.value, m.width, m.height, m.elementSize, m.pitch);
  }
  if (n.info.host && wants(flags, CU_GRAPH_DEBUG_DOT_FLAGS_HOST_NODE_PARAMS)) {
    label += fmt::format("\\nfn {} userData {}", reinterpret_cast<const void*>(n.info.host->fn),
                         n.info.host->userData);
  }
  if (n.info.event != nullptr && wants(flags, CU_GRAPH_DEBUG_DOT_FLAGS_EVENT_NODE_PARAMS)) {
    label += fmt::format("\\nevent {}", static_cast<const void*>(n.info.event));
  }
  return label;
}

void writeGraph(std::string& out, const Graph& g, unsigned flags, int depth) {
  const std::string indent(static_cast<std::size_t>(depth) * 2, ' ');
  out += fmt::format("{}subgraph cluster_graph_{:x} {{\n{}  label=\"graph 0x{:x}\";\n", indent,
                     g.id(), indent, g.id());
  for (const auto& n : g.nodes()) {
    out += fmt::format("{}  \"node_{:x}\" [shape=box, label=\"{}\"];\n", indent, n->id,
                       nodeLabel(*n, flags));
    if (n->child) writeGraph(out, *n->child, flags, depth + 1);
  }
  for (const auto& n : g.nodes()) {
    for (std::uint64_t from : n->dependencies) {
      out += fmt::format("{}  \"node_{:x}\" -> \"node_{:x}\";\n", indent, from, n->id);
    }
    // A child graph node runs its graph: an edge to each of its roots.
    if (n->child) {
      for (const auto& c : n->child->nodes()) {
        if (c->dependencies.empty()) {
          out += fmt::format("{}  \"node_{:x}\" -> \"node_{:x}\" [style=dashed];\n", indent, n->id,
                             c->id);
        }
      }
    }
  }
  out += indent + "}\n";
}

}  // namespace

CUresult CUDAAPI cuGraphDebugDotPrint(CUgraph hGraph, const char* path, unsigned int flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(path, "path"));
    ASSIGN_OR_RETURN(auto graph, d.graph(hGraph));
    std::string dot = "digraph dot {\n  compound=true;\n";
    writeGraph(dot, *graph, flags, 1);
    dot += "}\n";
    std::FILE* file = std::fopen(path, "w");
    if (file == nullptr) {
      return cuErrorf(CUDA_ERROR_OPERATING_SYSTEM, "cannot write {}: {}", path,
                      std::strerror(errno));
    }
    const bool written = std::fwrite(dot.data(), 1, dot.size(), file) == dot.size();
    if (std::fclose(file) != 0 || !written) {
      return cuErrorf(CUDA_ERROR_OPERATING_SYSTEM, "cannot write {}: {}", path,
                      std::strerror(errno));
    }
    return Status::ok();
  });
}

// --- user objects ---------------------------------------------------------------------------
// Reference-counted destructors that graphs can own (driver/graph.h):
// "Destructor callbacks ... are executed by a shared internal thread."

namespace {

Status referenceCount(unsigned count) {
  if (count == 0 || count > static_cast<unsigned>(INT_MAX)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "a reference count must be between 1 and INT_MAX, not {}", count);
  }
  return Status::ok();
}

std::uint64_t userObjectId(CUuserObject object) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(object));
}

}  // namespace

CUresult CUDAAPI cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy,
                                    unsigned int initialRefcount, unsigned int flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(requireNonNull(object_out, "object_out"));
    RETURN_IF_ERROR(requireNonNull(reinterpret_cast<const void*>(destroy), "destroy"));
    RETURN_IF_ERROR(referenceCount(initialRefcount));
    if (flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "flags must be CU_USER_OBJECT_NO_DESTRUCTOR_SYNC, not {}", flags);
    }
    ASSIGN_OR_RETURN(std::uint64_t id, d.createUserObject(ptr, destroy, initialRefcount));
    *object_out = handleOf<CUuserObject>(id);
    return Status::ok();
  });
}

CUresult CUDAAPI cuUserObjectRetain(CUuserObject object, unsigned int count) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(referenceCount(count));
    return d.retainUserObject(userObjectId(object), count);
  });
}

CUresult CUDAAPI cuUserObjectRelease(CUuserObject object, unsigned int count) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(referenceCount(count));
    return d.releaseUserObject(userObjectId(object), count);
  });
}

CUresult CUDAAPI cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                                         unsigned int flags) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(referenceCount(count));
    if (flags != 0 && flags != CU_GRAPH_USER_OBJECT_MOVE) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "flags must be 0 or CU_GRAPH_USER_OBJECT_MOVE, not {}", flags);
    }
    ASSIGN_OR_RETURN(auto g, d.graph(graph));
    // Moved references are the caller's already (retaining none checks that
    // the object is live); others are new.
    RETURN_IF_ERROR(
        d.retainUserObject(userObjectId(object), flags == CU_GRAPH_USER_OBJECT_MOVE ? 0 : count));
    g->userObjects().add(userObjectId(object), count);
    return Status::ok();
  });
}

CUresult CUDAAPI cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count) {
  return call(__func__, [&](Driver& d) -> Status {
    RETURN_IF_ERROR(referenceCount(count));
    ASSIGN_OR_RETURN(auto g, d.graph(graph));
    return g->userObjects().release(userObjectId(object), count);
  });
}
