// SPDX-License-Identifier: Apache-2.0
// CUDA graphs on vgpu (docs/vgpu.md, "Graphs and stream capture").
//
// A graph node keeps what a stream would have run for the call that made it:
// the Stream::Work a launch, copy, memset or host function submits, with the
// same checks at the call. An executable graph is its graph's nodes in an order
// that keeps every dependency (child graphs inlined); launching it enqueues
// them on the stream in that order, which is one of the orders the graph
// allows (event nodes record or wait for their event on that stream). Stream capture builds a graph
// from the work submitted to the streams of a capture sequence: each new node depends on what its
// stream's last nodes were, and an event recorded in the capture carries its stream's last nodes to
// the streams that wait for it (which join the capture).
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "phos/common/status.h"
#include "stream.h"

namespace phos::vgpu {

// What cuGraphKernelNodeGetParams answers for a kernel node.
struct KernelNodeInfo {
  CUfunction function = nullptr;  // what was launched: a function, or a library kernel
  CUkernel kern = nullptr;        // the parameters' kern and ctx, as the application gave them
  CUcontext ctx = nullptr;
  std::array<unsigned, 3> grid = {1, 1, 1};
  std::array<unsigned, 3> block = {1, 1, 1};
  unsigned sharedMemBytes = 0;
  std::vector<std::byte> params;     // the parameter buffer
  std::vector<std::size_t> offsets;  // each parameter's offset in it
  // cuGraphKernelNodeSetAttribute's values, by CUlaunchAttributeID; a
  // captured cooperative launch has CU_LAUNCH_ATTRIBUTE_COOPERATIVE set. The
  // node's work launches cooperatively when that one is non-zero.
  std::map<int, CUlaunchAttributeValue> attributes;
  bool cooperative() const {
    auto it = attributes.find(CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
    return it != attributes.end() && it->second.cooperative != 0;
  }
};

// What a submitted piece of work is, for the node capture makes of it.
struct NodeInfo {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  std::optional<KernelNodeInfo> kernel;
  CUevent event = nullptr;  // event record and wait nodes: recorded or waited for at each launch
  std::optional<CUDA_MEMCPY3D> memcpy;            // what cuGraphMemcpyNodeGetParams answers
  std::optional<CUDA_MEMSET_NODE_PARAMS> memset;  // what cuGraphMemsetNodeGetParams answers
  std::optional<CUDA_HOST_NODE_PARAMS> host;      // what cuGraphHostNodeGetParams answers
};

// One step of an executable graph: a node's work, or an event it records or
// waits for on the launch stream.
struct ExecStep {
  std::uint64_t node = 0;  // the node of the instantiated graph (0: inlined from a child graph)
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  Stream::Work work;
  CUevent event = nullptr;
  bool enabled = true;  // cuGraphNodeSetEnabled: a disabled step runs as an empty node
  // Inlined from a child graph: the child graph node of the instantiated graph it came from.
  std::uint64_t childNode = 0;
};

class Graph;

// References to user objects (cuUserObjectCreate) that a graph or an
// executable graph owns. They are released when it goes; an executable
// graph's go once the launches holding them have run, since each launch
// holds them too.
class UserObjectRefs {
 public:
  UserObjectRefs() = default;
  UserObjectRefs(const UserObjectRefs&) = delete;
  UserObjectRefs& operator=(const UserObjectRefs&) = delete;
  ~UserObjectRefs();
  // Takes `count` references the caller retained (or moved) for this owner.
  void add(std::uint64_t object, unsigned count);
  // Releases `count` of them; INVALID_VALUE if it holds fewer.
  Status release(std::uint64_t object, unsigned count);
  std::map<std::uint64_t, unsigned> counts() const;
  bool empty() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::uint64_t, unsigned> counts_;
};

// The driver's user objects, for the owners above (driver.cpp): `count` more
// references to `object`, and `count` fewer (its destructor queued at none).
void retainUserObjectReferences(std::uint64_t object, unsigned count);
void releaseUserObjectReferences(std::uint64_t object, unsigned count);

struct GraphNode {
  std::uint64_t id = 0;  // the CUgraphNode handle
  NodeInfo info;
  Stream::Work work;                        // null: nothing to run
  std::vector<std::uint64_t> dependencies;  // nodes of the same graph
  std::shared_ptr<Graph> child;             // CU_GRAPH_NODE_TYPE_GRAPH: a copy of the child graph
  std::uint64_t clonedFrom = 0;  // the node of the graph this one's graph was cloned from
};

class Graph {
 public:
  explicit Graph(std::uint64_t id) : id_(id) {}
  std::uint64_t id() const { return id_; }

  // Adds a node after `dependencies` (nodes of this graph, each named once),
  // with a new handle.
  Result<std::shared_ptr<GraphNode>> add(NodeInfo info, Stream::Work work,
                                         std::vector<std::uint64_t> dependencies,
                                         std::shared_ptr<Graph> child = nullptr);
  Status addDependency(std::uint64_t from, std::uint64_t to);
  Status removeDependency(std::uint64_t from, std::uint64_t to);
  // Removes the node and every edge to or from it.
  Status remove(std::uint64_t id);
  std::vector<std::shared_ptr<GraphNode>> nodes() const;
  std::shared_ptr<GraphNode> node(std::uint64_t id) const;
  // The nodes in an order that keeps every dependency, child graphs inlined:
  // what a launch of the executable graph runs.
  Result<std::vector<ExecStep>> executionOrder() const;
  // The nodes that depend on `id`.
  std::vector<std::uint64_t> dependents(std::uint64_t id) const;
  // A copy with new node handles: cuGraphClone, child graphs.
  std::shared_ptr<Graph> clone(std::uint64_t id) const;
  // The child graph `id` embedded in a node of this graph or of its child
  // graphs (cuGraphChildGraphNodeGetGraph hands it out), and the graph
  // among those that holds node `id`.
  std::shared_ptr<Graph> embedded(std::uint64_t id) const;
  std::shared_ptr<Graph> holderOf(std::uint64_t node) const;
  // The user-object references this graph owns (cuGraphRetainUserObject),
  // and those of this graph and every child graph in it, added up: what an
  // executable graph made of it owns.
  UserObjectRefs& userObjects() { return *userObjects_; }
  std::map<std::uint64_t, unsigned> allUserObjects() const;

 private:
  const std::uint64_t id_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<GraphNode>> nodes_;
  std::shared_ptr<UserObjectRefs> userObjects_ = std::make_shared<UserObjectRefs>();
};

class GraphExec {
 public:
  GraphExec(std::uint64_t id, std::vector<ExecStep> steps, unsigned long long flags = 0)
      : id_(id), flags_(flags), steps_(std::move(steps)) {}
  std::uint64_t id() const { return id_; }
  // The flags it was instantiated with (cuGraphExecGetFlags).
  unsigned long long flags() const { return flags_; }
  std::vector<ExecStep> steps() const;
  // cuGraphExec*NodeSetParams: the node's new work (a node of `type`), for
  // the launches to come.
  Status replaceWork(std::uint64_t node, CUgraphNodeType type, Stream::Work work);
  // cuGraphExecEvent*NodeSetEvent.
  Status replaceEvent(std::uint64_t node, CUgraphNodeType type, CUevent event);
  // cuGraphNodeSetEnabled and cuGraphNodeGetEnabled: kernel, memset and copy nodes.
  Status setEnabled(std::uint64_t node, bool enabled);
  Result<bool> enabled(std::uint64_t node) const;
  // cuGraphExecUpdate: the steps of a graph of the same shape (as many steps,
  // of the same types, in the same order) take the place of these, which
  // keep their nodes and whether they are enabled; otherwise what differs.
  Result<CUgraphExecUpdateResult> update(const std::vector<ExecStep>& steps);
  // cuGraphExecChildGraphNodeSetParams: the steps inlined from child graph
  // node `node` take the work of `steps`, a graph of the same shape's.
  Status updateChild(std::uint64_t node, const std::vector<ExecStep>& steps);
  // "Each launch is ordered behind ... any previous launches of hGraphExec":
  // where the last launch ended.
  StreamDependency lastLaunch() const;
  void setLastLaunch(StreamDependency end);
  // The user-object references it owns: its graph's when instantiated or
  // updated from it. Each launch holds them until it has run.
  std::shared_ptr<UserObjectRefs> userObjects() const;
  void setUserObjects(std::shared_ptr<UserObjectRefs> refs);

 private:
  const std::uint64_t id_;
  const unsigned long long flags_;
  mutable std::mutex mutex_;
  std::vector<ExecStep> steps_;
  StreamDependency last_;
  std::shared_ptr<UserObjectRefs> userObjects_ = std::make_shared<UserObjectRefs>();
};

// One stream capture sequence, from cuStreamBeginCapture on its origin stream
// to cuStreamEndCapture there; the streams that joined it share it.
class CaptureSequence {
 public:
  // `ownsGraph`: the graph was made for the capture (not the application's,
  // which cuStreamBeginCaptureToGraph captures into).
  CaptureSequence(std::uint64_t id, CUstreamCaptureMode mode, std::shared_ptr<Graph> graph,
                  std::shared_ptr<Stream> origin, bool ownsGraph = true);
  bool ownsGraph() const { return ownsGraph_; }
  std::uint64_t id() const { return id_; }
  CUstreamCaptureMode mode() const { return mode_; }
  std::thread::id thread() const { return thread_; }
  const std::shared_ptr<Graph>& graph() const { return graph_; }
  const Stream* origin() const { return origin_.get(); }

  // The work a capturing stream is given becomes a node after the stream's
  // last nodes. INVALIDATED if the sequence was.
  Status add(const Stream& stream, const NodeInfo& info, Stream::Work work);
  // cuStreamUpdateCaptureDependencies: the stream's last nodes replaced by
  // (or, `add`, extended with) `nodes` of the capture's graph.
  Status setFrontier(const Stream& stream, const std::vector<std::uint64_t>& nodes, bool add);
  // The stream's last nodes: what an event recorded on it stands for.
  std::vector<std::uint64_t> frontier(const Stream& stream) const;
  // `stream` waits for `nodes` (an event recorded in this capture); a stream
  // new to the capture joins it with them (the caller sets its capture).
  void join(const std::shared_ptr<Stream>& stream, const std::vector<std::uint64_t>& nodes);
  bool active() const;
  // A call that the capture cannot take ends it in error: cuStreamEndCapture
  // then answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
  void invalidate();
  bool invalidated() const;
  // Ends the capture for every stream that joined it; the graph, or why not
  // (invalidated; a stream that did not join back into the origin stream).
  Result<std::shared_ptr<Graph>> end();

 private:
  const std::uint64_t id_;
  const CUstreamCaptureMode mode_;
  const std::thread::id thread_;
  const std::shared_ptr<Graph> graph_;
  const std::shared_ptr<Stream> origin_;
  const bool ownsGraph_;
  mutable std::mutex mutex_;
  bool ended_ = false;
  bool invalidated_ = false;
  struct Joined {
    std::shared_ptr<Stream> stream;
    std::vector<std::uint64_t> frontier;
  };
  std::vector<Joined> joined_;  // the origin first
};

}  // namespace phos::vgpu
