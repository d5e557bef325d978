// SPDX-License-Identifier: Apache-2.0
// Server hooks for stream capture and CUDA graphs: captures run on the
// driver's own streams, so what a graph holds is the driver's; the session
// keeps which application thread began each capture and in which mode
// (stream_captures.h), since phosd serves every thread on one, and hands
// out graphs, executable graphs and nodes as handles (docs/remoting.md:
// "Stream capture and graphs").
#include <cuda.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "phos/common/launch_attributes.h"
#include "phos/common/log.h"
#include "phos/common/unique_fd.h"
#include "phos/cuda_api/server_hooks.h"
#include "remoting/kernel_params.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

bool validMode(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

uint32_t activeCaptures(ServerCall& c) {
  return static_cast<uint32_t>(c.session().captures().active());
}

void graphObjects(ServerCall& c, CUgraph graph, std::vector<void*>* out);

// A node and what it holds (a child graph node's graph and its nodes): the
// driver objects the application may hold handles of, gone with the node.
void nodeObjects(ServerCall& c, CUgraphNode node, std::vector<void*>* out) {
  const DriverTable& d = c.driverTable();
  CUgraphNodeType type{};
  CUgraph child = nullptr;
  if (PHOS_DRIVER(d, GraphNodeGetType)(node, &type) == CUDA_SUCCESS &&
      type == CU_GRAPH_NODE_TYPE_GRAPH &&
      PHOS_DRIVER(d, GraphChildGraphNodeGetGraph)(node, &child) == CUDA_SUCCESS) {
    graphObjects(c, child, out);
    out->push_back(child);
  }
  out->push_back(node);
}

// The nodes of `graph` and what they hold.
void graphObjects(ServerCall& c, CUgraph graph, std::vector<void*>* out) {
  size_t count = 0;
  if (PHOS_DRIVER(c.driverTable(), GraphGetNodes)(graph, nullptr, &count) != CUDA_SUCCESS ||
      count == 0) {
    return;
  }
  std::vector<CUgraphNode> nodes(count);
  if (PHOS_DRIVER(c.driverTable(), GraphGetNodes)(graph, nodes.data(), &count) != CUDA_SUCCESS) {
    return;
  }
  for (size_t i = 0; i < count; ++i) nodeObjects(c, nodes[i], out);
}

void forget(ServerCall& c, const std::vector<void*>& objects) {
  for (void* real : objects) c.session().handles().eraseReal(real);
}

// A node the driver answered with, as the handle the application gets.
CUgraphNode nodeHandle(ServerCall& c, CUgraphNode node) {
  if (node == nullptr) return nullptr;
  return reinterpret_cast<CUgraphNode>(
      c.exportHandle(HandleType::kCUgraphNode_st, CUDA_SUCCESS, node));
}

const CUgraphNode* orNull(std::span<const CUgraphNode> nodes) {
  return nodes.empty() ? nullptr : nodes.data();
}

bool owns(ServerCall& c, uint64_t address, uint64_t bytes) {
  return c.session().ownsRange(address, bytes);
}

// A copy node runs at every launch of its graph, long after the call: both
// its sides must be the session's memory (device, or pinned, which phosd
// maps at the application's addresses), never pageable memory or an array.
CUresult checkCopy(ServerCall& c, const char* entry, const CUDA_MEMCPY3D* m) {
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!SessionGraphs::copyOwned(*m, [&](uint64_t a, uint64_t n) { return owns(c, a, n); })) {
    log::get("daemon")->info(
        "session {}: {}: a side of the copy is not device or pinned memory of the session "
        "(pageable memory and arrays cannot be a graph's copy under PhOS)",
        c.session().id(), entry);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult checkSet(ServerCall& c, const char* entry, const CUDA_MEMSET_NODE_PARAMS* m) {
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!SessionGraphs::setOwned(*m, [&](uint64_t a, uint64_t n) { return owns(c, a, n); })) {
    log::get("daemon")->info(
        "session {}: {}: the rows set are not device or pinned memory of the session, or their "
        "element size is not 1, 2 or 4",
        c.session().id(), entry);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// A kernel node's parameters for the driver, from their wire form: the
// function resolved (or the library kernel and its context), the arguments
// checked against the kernel's signature. Lives until the driver copied them.
struct DriverKernelNode {
  CUDA_KERNEL_NODE_PARAMS params{};
  std::optional<KernelParams> args;

  // CUDA_SUCCESS, an error, or any result once the call was answered.
  CUresult decode(ServerCall& c, const ipc::KernelNode& wire) {
    if (!wire.present) return CUDA_ERROR_INVALID_VALUE;
    // The driver keeps kern and ctx (cuGraphKernelNodeGetParams answers
    // them) and runs the kernel only when there is no function.
    if ((wire.function != 0 && !c.resolveFunction(wire.function, &params.func)) ||
        !c.resolve(HandleType::kCUkern_st, wire.kernel, &params.kern) ||
        !c.resolve(HandleType::kCUctx_st, wire.context, &params.ctx)) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    CUfunction f = params.func;
    if (f == nullptr) {
      if (params.kern == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult r = PHOS_DRIVER(c.driverTable(), KernelGetFunction)(&f, params.kern);
          r != CUDA_SUCCESS) {
        return r;
      }
    }
    params.gridDimX = wire.gridDimX;
    params.gridDimY = wire.gridDimY;
    params.gridDimZ = wire.gridDimZ;
    params.blockDimX = wire.blockDimX;
    params.blockDimY = wire.blockDimY;
    params.blockDimZ = wire.blockDimZ;
    params.sharedMemBytes = wire.sharedMemBytes;
    args.emplace(wire.args);
    if (CUresult r = checkParams(c, f, *args); r != CUDA_SUCCESS) return r;
    params.kernelParams = args->kernelParams();
    params.extra = args->extraArgs();
    return CUDA_SUCCESS;
  }
};

// A host node's parameters for the driver: phosd's trampoline for the
// application's function, run through the session's host-call queue.
CUresult hostNode(ServerCall& c, const CUDA_HOST_NODE_PARAMS* p, CUDA_HOST_NODE_PARAMS* out,
                  std::string* queue = nullptr) {
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = c.session().graphHostNode(reinterpret_cast<uintptr_t>(p->fn),
                                        reinterpret_cast<uintptr_t>(p->userData), queue);
  if (!node.isOk()) {
    log::get("daemon")->warn("session {}: {}", c.session().id(), node.status().message());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *out = *node;
  return CUDA_SUCCESS;
}

// Every node of `graph` gets its handle (an executable graph's description
// names its nodes by them), then the graph is described with its nodes in order.
Result<nlohmann::json> describeForExec(ServerCall& c, CUgraph graph,
                                       std::vector<CUgraphNode>* order) {
  size_t count = 0;
  if (PHOS_DRIVER(c.driverTable(), GraphGetNodes)(graph, nullptr, &count) == CUDA_SUCCESS) {
    std::vector<CUgraphNode> nodes(count);
    if (count > 0 &&
        PHOS_DRIVER(c.driverTable(), GraphGetNodes)(graph, nodes.data(), &count) == CUDA_SUCCESS) {
      for (CUgraphNode n : nodes) c.exportHandle(HandleType::kCUgraphNode_st, CUDA_SUCCESS, n);
    }
  }
  Session& s = c.session();
  return s.graphs().describe(s.scope(), graph, order);
}

CUresult instantiated(ServerCall& c, CUresult r, CUgraphExec exec, Handle<CUgraph> graph,
                      unsigned long long flags, uint64_t* phGraphExec) {
  *phGraphExec = c.exportHandle(HandleType::kCUgraphExec_st, r, exec);
  if (r == CUDA_SUCCESS) {
    // The executable graph holds the graph's user-object references.
    c.session().userObjects().copied(graph.id, *phGraphExec);
    std::vector<CUgraphNode> order;
    auto description = describeForExec(c, graph.real, &order);
    c.session().graphs().noteExec(*phGraphExec, c.session().currentContext(), flags,
                                  std::move(description), std::move(order));
  }
  return r;
}

}  // namespace

CUresult cuStreamBeginCapture(ServerCall& c, Handle<CUstream> hStream, CUstreamCaptureMode mode,
                              uint32_t* captures) {
  if (!validMode(mode)) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_DRIVER(c.driverTable(), StreamBeginCapture_v2)(hStream.real, mode);
  if (r == CUDA_SUCCESS) c.session().captures().begin(hStream.real, c.header().thread, mode);
  *captures = activeCaptures(c);
  return r;
}

// The first revision took no mode: its captures are global.
CUresult cuStreamBeginCapture(ServerCall& c, Handle<CUstream> hStream, uint32_t* captures) {
  return cuStreamBeginCapture(c, hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, captures);
}

CUresult cuStreamEndCapture(ServerCall& c, Handle<CUstream> hStream, uint64_t* phGraph,
                            uint32_t* captures) {
  StreamCaptures& all = c.session().captures();
  *phGraph = 0;
  *captures = activeCaptures(c);
  // The driver saw every capture begun by phosd's one serving thread: the
  // thread rule is the session's to apply.
  if (const auto* capture = all.find(hStream.real);
      capture != nullptr && capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      capture->thread != c.header().thread) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  CUgraph graph = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), StreamEndCapture)(hStream.real, &graph);
  if (auto* capture = all.find(hStream.real)) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (PHOS_DRIVER(c.driverTable(), StreamIsCapturing)(hStream.real, &status) == CUDA_SUCCESS &&
        status == CU_STREAM_CAPTURE_STATUS_NONE) {
      // Ended. A failed end destroyed the graph cuStreamGetCaptureInfo may
      // have handed out.
      if (r != CUDA_SUCCESS) {
        if (capture->graph != nullptr && !capture->intoApplicationGraph) {
          c.session().handles().eraseReal(capture->graph);
        }
        for (CUgraphNode node : capture->nodes) c.session().handles().eraseReal(node);
      }
      all.end(hStream.real);
    }
  }
  *phGraph = c.exportHandle(HandleType::kCUgraph_st, r, graph);
  if (r == CUDA_SUCCESS) c.session().graphs().noteGraph(*phGraph, c.session().currentContext());
  *captures = activeCaptures(c);
  return r;
}

// The first revision: status and id only.
CUresult cuStreamGetCaptureInfo(ServerCall& c, Handle<CUstream> hStream,
                                CUstreamCaptureStatus* status, cuuint64_t* id, std::string*,
                                std::string*) {
  return PHOS_DRIVER(c.driverTable(), StreamGetCaptureInfo_v3)(hStream.real, status, id, nullptr,
                                                               nullptr, nullptr, nullptr);
}

// The capture's graph and its last nodes as handles; the nodes' ids and
// their edge data travel as bytes, which the shim keeps for the application.
CUresult cuStreamGetCaptureInfo(ServerCall& c, Handle<CUstream> hStream,
                                CUstreamCaptureStatus* status, cuuint64_t* id, uint64_t* graphOut,
                                size_t* count, std::string* dependencies, std::string* edges) {
  CUgraph graph = nullptr;
  const CUgraphNode* nodes = nullptr;
  const CUgraphEdgeData* edgeData = nullptr;
  size_t n = 0;
  // The graph and nodes are asked for always: the program may want the
  // array without its size, and the capture they belong to keeps them.
  CUresult r = PHOS_DRIVER(c.driverTable(), StreamGetCaptureInfo_v3)(hStream.real, status, id,
                                                                     &graph, &nodes, &edgeData, &n);
  if (r != CUDA_SUCCESS) return r;
  if (graphOut != nullptr) *graphOut = c.exportHandle(HandleType::kCUgraph_st, r, graph);
  // The capture (the stream asked may have joined it rather than begun it)
  // keeps what was handed out: a failed end destroys the graph and its nodes.
  for (auto& [origin, capture] : c.session().captures().byOrigin()) {
    if (graph == nullptr) break;
    if (capture.graph == nullptr) {
      CUstreamCaptureStatus originStatus{};
      CUgraph originGraph = nullptr;
      if (origin == hStream.real || (PHOS_DRIVER(c.driverTable(), StreamGetCaptureInfo_v3)(
                                         origin, &originStatus, nullptr, &originGraph, nullptr,
                                         nullptr, nullptr) == CUDA_SUCCESS &&
                                     originGraph == graph)) {
        capture.graph = graph;
      }
    }
    if (capture.graph == graph) {
      capture.nodes.insert(nodes, nodes + n);
      break;
    }
  }
  if (count != nullptr) *count = n;
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = c.exportHandle(HandleType::kCUgraphNode_st, r, nodes[i]);
  dependencies->assign(reinterpret_cast<const char*>(ids.data()), n * sizeof(uint64_t));
  if (edgeData != nullptr) {
    edges->assign(reinterpret_cast<const char*>(edgeData), n * sizeof(CUgraphEdgeData));
  }
  return r;
}

// Kept per application thread; the serving thread takes the calling
// thread's mode before every call (StreamCaptures::applyServingMode).
CUresult cuThreadExchangeStreamCaptureMode(ServerCall& c, CUstreamCaptureMode* mode) {
  if (mode == nullptr || !validMode(*mode)) return CUDA_ERROR_INVALID_VALUE;
  *mode = c.session().captures().exchangeMode(c.header().thread, *mode);
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCaptureToGraph(ServerCall& c, Handle<CUstream> hStream,
                                     Handle<CUgraph> hGraph,
                                     std::span<const CUgraphNode> dependencies,
                                     std::span<const CUgraphEdgeData> dependencyData,
                                     size_t numDependencies, CUstreamCaptureMode mode,
                                     uint32_t* captures) {
  *captures = activeCaptures(c);
  if (!validMode(mode)) return CUDA_ERROR_INVALID_VALUE;
  if (!dependencyData.empty() && dependencyData.size() != numDependencies) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = PHOS_DRIVER(c.driverTable(), StreamBeginCaptureToGraph)(
      hStream.real, hGraph.real, orNull(dependencies),
      dependencyData.empty() ? nullptr : dependencyData.data(), numDependencies, mode);
  if (r == CUDA_SUCCESS) {
    c.session().captures().begin(hStream.real, c.header().thread, mode, hGraph.real);
  }
  *captures = activeCaptures(c);
  return r;
}

CUresult cuGraphCreate(ServerCall& c, uint64_t* phGraph, unsigned int flags) {
  CUgraph graph = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphCreate)(&graph, flags);
  *phGraph = c.exportHandle(HandleType::kCUgraph_st, r, graph);
  if (r == CUDA_SUCCESS) c.session().graphs().noteGraph(*phGraph, c.session().currentContext());
  return r;
}

// The driver cannot describe an executable graph: its graph is described
// now, for a checkpoint to make it again (an executable graph outlives its
// graph, and keeps what the graph held when it was instantiated).
CUresult cuGraphInstantiateWithFlags(ServerCall& c, uint64_t* phGraphExec, Handle<CUgraph> hGraph,
                                     unsigned long long flags) {
  CUgraphExec exec = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphInstantiateWithFlags)(&exec, hGraph.real, flags);
  return instantiated(c, r, exec, hGraph, flags, phGraphExec);
}

// The upload stream and the error node are handles; a restore instantiates
// with the flags alone (the upload was done).
CUresult cuGraphInstantiateWithParams(ServerCall& c, uint64_t* phGraphExec, Handle<CUgraph> hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  *phGraphExec = 0;
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_GRAPH_INSTANTIATE_PARAMS p = *params;
  const auto upload = reinterpret_cast<uintptr_t>(params->hUploadStream);
  if (!c.resolveStream(upload, c.perThreadEntry(), &p.hUploadStream)) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  CUgraphExec exec = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphInstantiateWithParams)(&exec, hGraph.real, &p);
  params->result_out = p.result_out;
  params->hErrNode_out = nodeHandle(c, p.hErrNode_out);
  return instantiated(c, r, exec, hGraph, p.flags & ~CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD,
                      phGraphExec);
}

CUresult cuGraphDestroy(ServerCall& c, Handle<CUgraph> hGraph) {
  std::vector<void*> objects;
  graphObjects(c, hGraph.real, &objects);
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphDestroy)(hGraph.real);
  if (r == CUDA_SUCCESS) {
    forget(c, objects);
    c.session().forgetHandle(hGraph.id);
  }
  return r;
}

CUresult cuGraphExecDestroy(ServerCall& c, Handle<CUgraphExec> hGraphExec) {
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphExecDestroy)(hGraphExec.real);
  if (r == CUDA_SUCCESS) c.session().forgetHandle(hGraphExec.id);
  return r;
}

// What a graph's kernels read and write is not speculated: during a
// protocol's window the launch passes its gate as a kernel that may write
// anything (docs/checkpoint.md), and under validation it counts as a launch
// without a twin.
CUresult cuGraphLaunch(ServerCall& c, Handle<CUgraphExec> hGraphExec, Handle<CUstream> hStream) {
  Session& s = c.session();
  CallAccess access;
  access.kernel = true;
  access.incomplete = true;
  access.unchecked = true;
  s.passGate(access);
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphLaunch)(hGraphExec.real, hStream.real);
  if (r == CUDA_SUCCESS && s.validator().mode() != ValidationMode::kOff) {
    s.validator().noteLaunch(false, true);
  }
  return r;
}

// ---- the explicit graph API --------------------------------------------------------
// Nodes are session handles; a node's parameters reach the driver as they
// would from the application, their handles translated and the memory they
// name checked to be the session's. What an executable graph is set to is
// kept in its description (session_graphs.h), for a checkpoint to make it again.

CUresult cuGraphAddKernelNode(ServerCall& c, uint64_t* phGraphNode, Handle<CUgraph> hGraph,
                              std::span<const CUgraphNode> dependencies, size_t numDependencies,
                              const ipc::KernelNode& nodeParams) {
  *phGraphNode = 0;
  DriverKernelNode k;
  if (CUresult r = k.decode(c, nodeParams); r != CUDA_SUCCESS) return r;
  CUgraphNode node = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphAddKernelNode_v2)(
      &node, hGraph.real, orNull(dependencies), numDependencies, &k.params);
  *phGraphNode = c.exportHandle(HandleType::kCUgraphNode_st, r, node);
  return r;
}

CUresult cuGraphKernelNodeSetParams(ServerCall& c, Handle<CUgraphNode> hNode,
                                    const ipc::KernelNode& nodeParams) {
  DriverKernelNode k;
  if (CUresult r = k.decode(c, nodeParams); r != CUDA_SUCCESS) return r;
  return PHOS_DRIVER(c.driverTable(), GraphKernelNodeSetParams_v2)(hNode.real, &k.params);
}

// The function as the handle the application was given (a library kernel's
// id for its function), the arguments as bytes the shim keeps for the node.
CUresult cuGraphKernelNodeGetParams(ServerCall& c, Handle<CUgraphNode> hNode, std::string* node) {
  CUDA_KERNEL_NODE_PARAMS p{};
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphKernelNodeGetParams_v2)(hNode.real, &p);
  if (r != CUDA_SUCCESS) return r;
  CUfunction f = p.func;
  if (f == nullptr && p.kern != nullptr) {
    if (CUresult k = PHOS_DRIVER(c.driverTable(), KernelGetFunction)(&f, p.kern);
        k != CUDA_SUCCESS) {
      return k;
    }
  }
  ipc::KernelNodeParams out;
  if (p.func != nullptr) {
    auto id = SessionGraphs::functionIdOf(c.session().scope(), p.func);
    if (!id.isOk()) return CUDA_ERROR_INVALID_VALUE;
    out.handles[0] = *id;
  }
  out.handles[1] = c.session().handles().idOf(p.kern);
  out.handles[2] = c.session().contexts().idOf(p.ctx);
  const unsigned geometry[] = {p.gridDimX,  p.gridDimY,  p.gridDimZ,      p.blockDimX,
                               p.blockDimY, p.blockDimZ, p.sharedMemBytes};
  std::copy(std::begin(geometry), std::end(geometry), out.geometry);
  for (size_t i = 0; p.kernelParams != nullptr; ++i) {
    size_t offset = 0, size = 0;
    if (PHOS_DRIVER(c.driverTable(), FuncGetParamInfo)(f, i, &offset, &size) != CUDA_SUCCESS) break;
    out.args.emplace_back(static_cast<const char*>(p.kernelParams[i]), size);
  }
  *node = out.pack();
  return CUDA_SUCCESS;
}

CUresult cuGraphExecKernelNodeSetParams(ServerCall& c, Handle<CUgraphExec> hGraphExec,
                                        Handle<CUgraphNode> hNode,
                                        const ipc::KernelNode& nodeParams) {
  DriverKernelNode k;
  if (CUresult r = k.decode(c, nodeParams); r != CUDA_SUCCESS) return r;
  SessionGraphs& graphs = c.session().graphs();
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphExecKernelNodeSetParams_v2)(
      hGraphExec.real, graphs.execNode(hGraphExec.id, hNode.id, hNode.real), &k.params);
  if (r == CUDA_SUCCESS) {
    graphs.setExecNode(hGraphExec.id, hNode.id, hNode.real,
                       graphs.describeKernel(c.session().scope(), k.params));
  }
  return r;
}

CUresult cuGraphAddMemcpyNode(ServerCall& c, uint64_t* phGraphNode, Handle<CUgraph> hGraph,
                              std::span<const CUgraphNode> dependencies, size_t numDependencies,
                              const CUDA_MEMCPY3D* copyParams, Handle<CUcontext> ctx) {
  *phGraphNode = 0;
  if (CUresult r = checkCopy(c, "cuGraphAddMemcpyNode", copyParams); r != CUDA_SUCCESS) return r;
  CUgraphNode node = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphAddMemcpyNode)(
      &node, hGraph.real, orNull(dependencies), numDependencies, copyParams, ctx.real);
  *phGraphNode = c.exportHandle(HandleType::kCUgraphNode_st, r, node);
  return r;
}

CUresult cuGraphMemcpyNodeSetParams(ServerCall& c, Handle<CUgraphNode> hNode,
                                    const CUDA_MEMCPY3D* nodeParams) {
  if (CUresult r = checkCopy(c, "cuGraphMemcpyNodeSetParams", nodeParams); r != CUDA_SUCCESS) {
    return r;
  }
  return PHOS_DRIVER(c.driverTable(), GraphMemcpyNodeSetParams)(hNode.real, nodeParams);
}

CUresult cuGraphExecMemcpyNodeSetParams(ServerCall& c, Handle<CUgraphExec> hGraphExec,
                                        Handle<CUgraphNode> hNode, const CUDA_MEMCPY3D* copyParams,
                                        Handle<CUcontext> ctx) {
  if (CUresult r = checkCopy(c, "cuGraphExecMemcpyNodeSetParams", copyParams); r != CUDA_SUCCESS) {
    return r;
  }
  SessionGraphs& graphs = c.session().graphs();
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphExecMemcpyNodeSetParams)(
      hGraphExec.real, graphs.execNode(hGraphExec.id, hNode.id, hNode.real), copyParams, ctx.real);
  if (r == CUDA_SUCCESS) {
    graphs.setExecNode(hGraphExec.id, hNode.id, hNode.real,
                       SessionGraphs::describeCopy(*copyParams));
  }
  return r;
}

CUresult cuGraphAddMemsetNode(ServerCall& c, uint64_t* phGraphNode, Handle<CUgraph> hGraph,
                              std::span<const CUgraphNode> dependencies, size_t numDependencies,
                              const CUDA_MEMSET_NODE_PARAMS* memsetParams, Handle<CUcontext> ctx) {
  *phGraphNode = 0;
  if (CUresult r = checkSet(c, "cuGraphAddMemsetNode", memsetParams); r != CUDA_SUCCESS) return r;
  CUgraphNode node = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphAddMemsetNode)(
      &node, hGraph.real, orNull(dependencies), numDependencies, memsetParams, ctx.real);
  *phGraphNode = c.exportHandle(HandleType::kCUgraphNode_st, r, node);
  return r;
}

CUresult cuGraphMemsetNodeSetParams(ServerCall& c, Handle<CUgraphNode> hNode,
                                    const CUDA_MEMSET_NODE_PARAMS* nodeParams) {
  if (CUresult r = checkSet(c, "cuGraphMemsetNodeSetParams", nodeParams); r != CUDA_SUCCESS) {
    return r;
  }
  return PHOS_DRIVER(c.driverTable(), GraphMemsetNodeSetParams)(hNode.real, nodeParams);
}

CUresult cuGraphExecMemsetNodeSetParams(ServerCall& c, Handle<CUgraphExec> hGraphExec,
                                        Handle<CUgraphNode> hNode,
                                        const CUDA_MEMSET_NODE_PARAMS* memsetParams,
                                        Handle<CUcontext> ctx) {
  if (CUresult r = checkSet(c, "cuGraphExecMemsetNodeSetParams", memsetParams); r != CUDA_SUCCESS) {
    return r;
  }
  SessionGraphs& graphs = c.session().graphs();
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphExecMemsetNodeSetParams)(
      hGraphExec.real, graphs.execNode(hGraphExec.id, hNode.id, hNode.real), memsetParams,
      ctx.real);
  if (r == CUDA_SUCCESS) {
    graphs.setExecNode(hGraphExec.id, hNode.id, hNode.real,
                       SessionGraphs::describeSet(*memsetParams));
  }
  return r;
}

CUresult cuGraphAddHostNode(ServerCall& c, uint64_t* phGraphNode, Handle<CUgraph> hGraph,
                            std::span<const CUgraphNode> dependencies, size_t numDependencies,
                            const CUDA_HOST_NODE_PARAMS* nodeParams, std::string* queue) {
  *phGraphNode = 0;
  CUDA_HOST_NODE_PARAMS p{};
  if (CUresult r = hostNode(c, nodeParams, &p, queue); r != CUDA_SUCCESS) return r;
  CUgraphNode node = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphAddHostNode)(
      &node, hGraph.real, orNull(dependencies), numDependencies, &p);
  *phGraphNode = c.exportHandle(HandleType::kCUgraphNode_st, r, node);
  return r;
}

CUresult cuGraphHostNodeGetParams(ServerCall& c, Handle<CUgraphNode> hNode,
                                  CUDA_HOST_NODE_PARAMS* nodeParams) {
  if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_HOST_NODE_PARAMS p{};
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphHostNodeGetParams)(hNode.real, &p);
  if (r != CUDA_SUCCESS) return r;
  const PendingHostCall* call = c.session().graphs().applicationHostCall(p);
  if (call == nullptr) return CUDA_ERROR_INVALID_VALUE;
  nodeParams->fn = reinterpret_cast<CUhostFn>(call->function);
  nodeParams->userData = reinterpret_cast<void*>(call->userData);
  return CUDA_SUCCESS;
}

CUresult cuGraphHostNodeSetParams(ServerCall& c, Handle<CUgraphNode> hNode,
                                  const CUDA_HOST_NODE_PARAMS* nodeParams) {
  CUDA_HOST_NODE_PARAMS p{};
  if (CUresult r = hostNode(c, nodeParams, &p); r != CUDA_SUCCESS) return r;
  return PHOS_DRIVER(c.driverTable(), GraphHostNodeSetParams)(hNode.real, &p);
}

CUresult cuGraphExecHostNodeSetParams(ServerCall& c, Handle<CUgraphExec> hGraphExec,
                                      Handle<CUgraphNode> hNode,
                                      const CUDA_HOST_NODE_PARAMS* nodeParams) {
  CUDA_HOST_NODE_PARAMS p{};
  if (CUresult r = hostNode(c, nodeParams, &p); r != CUDA_SUCCESS) return r;
  SessionGraphs& graphs = c.session().graphs();
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphExecHostNodeSetParams)(
      hGraphExec.real, graphs.execNode(hGraphExec.id, hNode.id, hNode.real), &p);
  if (r == CUDA_SUCCESS) {
    graphs.setExecNode(hGraphExec.id, hNode.id, hNode.real, graphs.describeHost(p));
  }
  return r;
}

template <typename SetEvent>
CUresult execEventNode(ServerCall& c, Handle<CUgraphExec> exec, Handle<CUgraphNode> node,
                       Handle<CUevent> event, CUgraphNodeType type, SetEvent&& set) {
  SessionGraphs& graphs = c.session().graphs();
  CUresult r = set(exec.real, graphs.execNode(exec.id, node.id, node.real), event.real);
  if (r == CUDA_SUCCESS) {
    graphs.setExecNode(exec.id, node.id, node.real,
                       SessionGraphs::describeEvent(c.session().scope(), type, event.real));
  }
  return r;
}

CUresult cuGraphExecEventRecordNodeSetEvent(ServerCall& c, Handle<CUgraphExec> hGraphExec,
                                            Handle<CUgraphNode> hNode, Handle<CUevent> event) {
  return execEventNode(c, hGraphExec, hNode, event, CU_GRAPH_NODE_TYPE_EVENT_RECORD,
                       PHOS_DRIVER(c.driverTable(), GraphExecEventRecordNodeSetEvent));
}

CUresult cuGraphExecEventWaitNodeSetEvent(ServerCall& c, Handle<CUgraphExec> hGraphExec,
                                          Handle<CUgraphNode> hNode, Handle<CUevent> event) {
  return execEventNode(c, hGraphExec, hNode, event, CU_GRAPH_NODE_TYPE_WAIT_EVENT,
                       PHOS_DRIVER(c.driverTable(), GraphExecEventWaitNodeSetEvent));
}

CUresult cuGraphExecChildGraphNodeSetParams(ServerCall& c, Handle<CUgraphExec> hGraphExec,
                                            Handle<CUgraphNode> hNode, Handle<CUgraph> childGraph) {
  SessionGraphs& graphs = c.session().graphs();
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphExecChildGraphNodeSetParams)(
      hGraphExec.real, graphs.execNode(hGraphExec.id, hNode.id, hNode.real), childGraph.real);
  if (r == CUDA_SUCCESS) {
    graphs.setExecNode(hGraphExec.id, hNode.id, hNode.real,
                       graphs.describeChild(c.session().scope(), childGraph.real));
    c.session().userObjects().untracked(hGraphExec.id, childGraph.id);
  }
  return r;
}

// Kernel node attributes: those a checkpoint saves (values without handles).
CUresult cuGraphKernelNodeGetAttribute(ServerCall& c, Handle<CUgraphNode> hNode,
                                       CUkernelNodeAttrID attr, CUkernelNodeAttrValue* value_out) {
  if (!isKernelNodeAttribute(attr)) {
    log::get("daemon")->info(
        "session {}: cuGraphKernelNodeGetAttribute: attribute {} is not served", c.session().id(),
        static_cast<int>(attr));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return PHOS_DRIVER(c.driverTable(), GraphKernelNodeGetAttribute)(hNode.real, attr, value_out);
}

CUresult cuGraphKernelNodeSetAttribute(ServerCall& c, Handle<CUgraphNode> hNode,
                                       CUkernelNodeAttrID attr,
                                       const CUkernelNodeAttrValue* value) {
  if (!isKernelNodeAttribute(attr)) {
    log::get("daemon")->info(
        "session {}: cuGraphKernelNodeSetAttribute: attribute {} is not served", c.session().id(),
        static_cast<int>(attr));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return PHOS_DRIVER(c.driverTable(), GraphKernelNodeSetAttribute)(hNode.real, attr, value);
}

CUresult cuGraphNodeSetEnabled(ServerCall& c, Handle<CUgraphExec> hGraphExec,
                               Handle<CUgraphNode> hNode, unsigned int isEnabled) {
  SessionGraphs& graphs = c.session().graphs();
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphNodeSetEnabled)(
      hGraphExec.real, graphs.execNode(hGraphExec.id, hNode.id, hNode.real), isEnabled);
  if (r == CUDA_SUCCESS) {
    graphs.setExecNodeEnabled(hGraphExec.id, hNode.id, hNode.real, isEnabled != 0);
  }
  return r;
}

// On success the executable graph holds what `hGraph` holds, paired node for node.
CUresult cuGraphExecUpdate(ServerCall& c, Handle<CUgraphExec> hGraphExec, Handle<CUgraph> hGraph,
                           CUgraphExecUpdateResultInfo* resultInfo) {
  if (resultInfo == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUgraphExecUpdateResultInfo info{};
  CUresult r =
      PHOS_DRIVER(c.driverTable(), GraphExecUpdate_v2)(hGraphExec.real, hGraph.real, &info);
  resultInfo->result = info.result;
  resultInfo->errorNode = nodeHandle(c, info.errorNode);
  resultInfo->errorFromNode = nodeHandle(c, info.errorFromNode);
  if (r == CUDA_SUCCESS) {
    Session& s = c.session();
    s.graphs().updateExec(hGraphExec.id, s.graphs().describe(s.scope(), hGraph.real));
    s.userObjects().untracked(hGraphExec.id, hGraph.id);
  }
  return r;
}

CUresult cuGraphExecUpdate(ServerCall& c, Handle<CUgraphExec> hGraphExec, Handle<CUgraph> hGraph,
                           uint64_t* hErrorNode_out, CUgraphExecUpdateResult* updateResult_out) {
  if (hErrorNode_out == nullptr || updateResult_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUgraphExecUpdateResultInfo info{};
  CUresult r = cuGraphExecUpdate(c, hGraphExec, hGraph, &info);
  *hErrorNode_out = reinterpret_cast<uintptr_t>(info.errorNode);
  *updateResult_out = info.result;
  return r;
}

CUresult cuGraphDestroyNode(ServerCall& c, Handle<CUgraphNode> hNode) {
  std::vector<void*> objects;
  nodeObjects(c, hNode.real, &objects);  // asked while the node is there
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphDestroyNode)(hNode.real);
  if (r == CUDA_SUCCESS) forget(c, objects);
  return r;
}

CUresult cuGraphClone(ServerCall& c, uint64_t* phGraphClone, Handle<CUgraph> originalGraph) {
  CUgraph clone = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphClone)(&clone, originalGraph.real);
  *phGraphClone = c.exportHandle(HandleType::kCUgraph_st, r, clone);
  if (r == CUDA_SUCCESS) {
    c.session().graphs().noteGraph(*phGraphClone, c.session().currentContext());
    // "The clone owns the same references" to user objects.
    c.session().userObjects().copied(originalGraph.id, *phGraphClone);
  }
  return r;
}

// The driver writes the DOT file as phosd's process, so not where the
// application names it: into a file of the session's own (named after its
// ring, removed with it), created here first so that nothing else stands at
// that name, then given to the session's user. The shim copies it where the
// application asked and removes it (its epilogue).
CUresult cuGraphDebugDotPrint(ServerCall& c, Handle<CUgraph> hGraph, unsigned int flags,
                              std::string* dot) {
  Session& s = c.session();
  const std::string path = s.ringPath() + "-dot";
  (void)unlink(path.c_str());
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    log::get("daemon")->warn("session {}: cannot create {}: {}", s.id(), path,
                             std::strerror(errno));
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphDebugDotPrint)(hGraph.real, path.c_str(), flags);
  if (r == CUDA_SUCCESS && fchown(fd.get(), s.uid(), static_cast<gid_t>(-1)) != 0 &&
      geteuid() == 0) {
    r = CUDA_ERROR_OPERATING_SYSTEM;
  }
  if (r != CUDA_SUCCESS) {
    (void)unlink(path.c_str());
    return r;
  }
  *dot = path;
  return CUDA_SUCCESS;
}

}  // namespace phos::daemon::hooks
