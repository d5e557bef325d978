// SPDX-License-Identifier: Apache-2.0
// The shim's side of stream capture (served by phosd's
// daemon/src/remoting/graphs.cpp): while a capture lasts, posted calls wait
// for their answer, since CUDA reports what a capture refuses at the call
// itself (an event wait across captures, the legacy stream beside a
// capture); and the node arrays cuStreamGetCaptureInfo returns, which CUDA
// keeps valid until the next call on the stream, are kept here per stream.
#include <cuda.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include "client_call.h"
#include "phos/cuda_api/client_hooks.h"

namespace phos::shim {
namespace {

struct CaptureNodes {
  std::vector<CUgraphNode> nodes;
  std::vector<CUgraphEdgeData> edges;
};

std::mutex nodesMutex;
std::map<CUstream, CaptureNodes>& nodesByStream() {
  static auto* nodes = new std::map<CUstream, CaptureNodes>;  // outlives every thread's last call
  return *nodes;
}

// Fills the program's pointers with the nodes and edge data phosd sent,
// copied into the stream's arrays (the previous ones of the stream go).
void keepNodes(CUstream stream, std::string_view dependencies, std::string_view edges,
               const CUgraphNode** dependenciesOut, const CUgraphEdgeData** edgeDataOut) {
  std::lock_guard lock(nodesMutex);
  CaptureNodes& kept = nodesByStream()[stream];
  kept.nodes.resize(dependencies.size() / sizeof(uint64_t));
  for (size_t i = 0; i < kept.nodes.size(); ++i) {
    uint64_t id = 0;
    std::memcpy(&id, dependencies.data() + i * sizeof(id), sizeof(id));
    kept.nodes[i] = reinterpret_cast<CUgraphNode>(static_cast<uintptr_t>(id));
  }
  kept.edges.resize(edges.size() / sizeof(CUgraphEdgeData));
  if (!kept.edges.empty()) {
    std::memcpy(kept.edges.data(), edges.data(), kept.edges.size() * sizeof(CUgraphEdgeData));
  }
  if (dependenciesOut != nullptr) {
    *dependenciesOut = kept.nodes.empty() ? nullptr : kept.nodes.data();
  }
  // No edge data means every edge is a default one: CUDA answers NULL then.
  if (edgeDataOut != nullptr) *edgeDataOut = kept.edges.empty() ? nullptr : kept.edges.data();
}

}  // namespace

namespace epilogue {

CUresult cuStreamBeginCapture(CUresult result, uint32_t captures, CUstream) {
  ClientCall::setCapturesActive(captures);
  return result;
}
CUresult cuStreamBeginCapture(CUresult result, uint32_t captures, CUstream, CUstreamCaptureMode) {
  ClientCall::setCapturesActive(captures);
  return result;
}

CUresult cuStreamEndCapture(CUresult result, uint32_t captures, CUstream, CUgraph* graph) {
  ClientCall::setCapturesActive(captures);
  // A failed end leaves no graph ("*phGraph is set to NULL").
  if (result != CUDA_SUCCESS && graph != nullptr) *graph = nullptr;
  return result;
}

CUresult cuStreamGetCaptureInfo(CUresult result, std::string_view, std::string_view, CUstream,
                                CUstreamCaptureStatus*, cuuint64_t*) {
  return result;
}
CUresult cuStreamGetCaptureInfo(CUresult result, std::string_view dependencies, std::string_view,
                                CUstream stream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                const CUgraphNode** dependenciesOut, size_t*) {
  if (result == CUDA_SUCCESS) keepNodes(stream, dependencies, {}, dependenciesOut, nullptr);
  return result;
}
CUresult cuStreamGetCaptureInfo(CUresult result, std::string_view dependencies,
                                std::string_view edges, CUstream stream, CUstreamCaptureStatus*,
                                cuuint64_t*, CUgraph*, const CUgraphNode** dependenciesOut,
                                const CUgraphEdgeData** edgeDataOut, size_t*) {
  if (result == CUDA_SUCCESS) keepNodes(stream, dependencies, edges, dependenciesOut, edgeDataOut);
  return result;
}

}  // namespace epilogue
}  // namespace phos::shim
