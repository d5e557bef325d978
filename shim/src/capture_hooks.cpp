// SPDX-License-Identifier: Apache-2.0
// The shim's side of stream capture (served by phosd's
// daemon/src/remoting/graphs.cpp): while a capture lasts, posted calls wait
// for their answer, since CUDA reports what a capture refuses at the call
// itself (an event wait across captures, the legacy stream beside a
// capture); and the node arrays cuStreamGetCaptureInfo returns, which CUDA
// keeps valid until the next call on the stream, are kept here per stream.
// Likewise the arguments of a kernel node's parameters
// (cuGraphKernelNodeGetParams), kept per node.
#include <cuda.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include "client_call.h"
#include "phos/common/ipc/wire_codec.h"
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

// A kernel node's arguments as cuGraphKernelNodeGetParams returns them, each
// in a string of its own (its storage 8-byte aligned at least, or 16 for
// the 16 bytes and more that vector types take).
struct NodeArguments {
  std::vector<std::string> values;
  std::vector<void*> pointers;
};

std::mutex argumentsMutex;
std::map<CUgraphNode, NodeArguments>& argumentsByNode() {
  static auto* arguments = new std::map<CUgraphNode, NodeArguments>;
  return *arguments;
}

// phosd's answer into the application's structure; the arguments stay
// valid until the node's parameters are asked again.
template <typename Params>
CUresult kernelNodeParams(CUresult result, std::string_view packed, CUgraphNode node, Params* out) {
  if (result != CUDA_SUCCESS || out == nullptr) return result;
  ipc::KernelNodeParams p;
  if (!p.unpack(packed)) return CUDA_ERROR_INVALID_VALUE;
  *out = Params{};
  out->func = reinterpret_cast<CUfunction>(static_cast<uintptr_t>(p.handles[0]));
  if constexpr (requires { out->kern; }) {
    out->kern = reinterpret_cast<CUkernel>(static_cast<uintptr_t>(p.handles[1]));
    out->ctx = reinterpret_cast<CUcontext>(static_cast<uintptr_t>(p.handles[2]));
  }
  out->gridDimX = p.geometry[0];
  out->gridDimY = p.geometry[1];
  out->gridDimZ = p.geometry[2];
  out->blockDimX = p.geometry[3];
  out->blockDimY = p.geometry[4];
  out->blockDimZ = p.geometry[5];
  out->sharedMemBytes = p.geometry[6];
  std::lock_guard lock(argumentsMutex);
  NodeArguments& kept = argumentsByNode()[node];
  kept.values = std::move(p.args);
  kept.pointers.clear();
  for (std::string& v : kept.values) kept.pointers.push_back(v.data());
  out->kernelParams = kept.pointers.empty() ? nullptr : kept.pointers.data();
  return CUDA_SUCCESS;
}

}  // namespace

namespace epilogue {

CUresult cuGraphKernelNodeGetParams(CUresult result, std::string_view node, CUgraphNode hNode,
                                    CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  return kernelNodeParams(result, node, hNode, nodeParams);
}
CUresult cuGraphKernelNodeGetParams(CUresult result, std::string_view node, CUgraphNode hNode,
                                    CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  return kernelNodeParams(result, node, hNode, nodeParams);
}

CUresult cuStreamBeginCaptureToGraph(CUresult result, uint32_t captures, CUstream, CUgraph,
                                     const CUgraphNode*, const CUgraphEdgeData*, size_t,
                                     CUstreamCaptureMode) {
  ClientCall::setCapturesActive(captures);
  return result;
}

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
