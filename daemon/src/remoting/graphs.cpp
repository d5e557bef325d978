// SPDX-License-Identifier: Apache-2.0
// Server hooks for stream capture and CUDA graphs: captures run on the
// driver's own streams, so what a graph holds is the driver's; the session
// keeps which application thread began each capture and in which mode
// (stream_captures.h), since phosd serves every thread on one, and hands
// out graphs, executable graphs and nodes as handles (docs/remoting.md:
// "Stream capture and graphs").
#include <cuda.h>

#include <string>
#include <vector>

#include "phos/cuda_api/server_hooks.h"
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

// Forgets the node handles of `graph`, which is about to be destroyed.
void forgetNodes(ServerCall& c, CUgraph graph) {
  size_t count = 0;
  if (PHOS_DRIVER(c.driverTable(), GraphGetNodes)(graph, nullptr, &count) != CUDA_SUCCESS ||
      count == 0) {
    return;
  }
  std::vector<CUgraphNode> nodes(count);
  if (PHOS_DRIVER(c.driverTable(), GraphGetNodes)(graph, nodes.data(), &count) != CUDA_SUCCESS) {
    return;
  }
  for (size_t i = 0; i < count; ++i) c.session().handles().eraseReal(nodes[i]);
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
        if (capture->graph != nullptr) c.session().handles().eraseReal(capture->graph);
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
  *phGraphExec = c.exportHandle(HandleType::kCUgraphExec_st, r, exec);
  if (r == CUDA_SUCCESS) {
    Session& s = c.session();
    s.graphs().noteExec(*phGraphExec, s.currentContext(), flags,
                        SessionGraphs::describe(s.scope(), hGraph.real));
  }
  return r;
}

CUresult cuGraphDestroy(ServerCall& c, Handle<CUgraph> hGraph) {
  forgetNodes(c, hGraph.real);
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphDestroy)(hGraph.real);
  if (r == CUDA_SUCCESS) c.session().forgetHandle(hGraph.id);
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

}  // namespace phos::daemon::hooks
