// SPDX-License-Identifier: Apache-2.0
// SessionGraphs: the application's CUDA graphs and executable graphs in a
// checkpoint (docs/checkpoint.md: graphs).
//
// A graph is the driver's (stream capture and the explicit API run on
// phosd's driver), and the driver describes a graph node by node, but not an
// executable graph: each executable graph's description is taken from its
// graph when it is instantiated, and kept up to date as the application
// changes it (cuGraphExec*SetParams, cuGraphNodeSetEnabled, cuGraphExecUpdate).
// A description lists the nodes in an order that keeps every edge (kernel
// nodes with the session's id of their function or library kernel and their
// parameters' bytes and the launch attributes set on them, such as a captured
// cooperative launch's; copies, sets, empty nodes, event records and waits, the
// application's host functions), with the ids the application holds for
// them; a child graph node holds its graph's description. A restore adds
// the nodes to a new graph in that order and instantiates the executable
// graphs again, under the same ids. A node of another kind (a memory or
// conditional node), or a child graph the program holds a handle of, cannot
// be described: a checkpoint of a session holding its graph fails, naming it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "phos/common/status.h"
#include "session/host_calls.h"
#include "session/session_image.h"

namespace phos::daemon {

class SessionGraphs {
 public:
  // `graph`, as the driver holds it now (its context current); `order`, if
  // given, receives its nodes in the description's order.
  Result<nlohmann::json> describe(const SessionScope& scope, CUgraph graph,
                                  std::vector<CUgraphNode>* order = nullptr) const;
  // One node's parameters as describe() writes them.
  Result<nlohmann::json> describeKernel(const SessionScope& scope,
                                        const CUDA_KERNEL_NODE_PARAMS& params) const;
  // A child graph node of graph `child`'s nodes.
  Result<nlohmann::json> describeChild(const SessionScope& scope, CUgraph child) const;
  static nlohmann::json describeCopy(const CUDA_MEMCPY3D& params);
  static nlohmann::json describeSet(const CUDA_MEMSET_NODE_PARAMS& params);
  Result<nlohmann::json> describeHost(const CUDA_HOST_NODE_PARAMS& params) const;
  static Result<nlohmann::json> describeEvent(const SessionScope& scope, CUgraphNodeType type,
                                              CUevent event);

  // The session's id for the function a kernel node runs: a CUfunction the
  // application was given, or the library kernel whose function it is.
  static Result<uint64_t> functionIdOf(const SessionScope& scope, CUfunction f);

  // A graph (virtual id) was made in context `context`.
  void noteGraph(uint64_t id, uint64_t context) { graphContexts_[id] = context; }
  // Executable graph `id` was instantiated with `flags` in context `context`
  // from a graph of that description (or of one that cannot be described),
  // whose nodes were `nodes` in the description's order.
  void noteExec(uint64_t id, uint64_t context, unsigned long long flags,
                Result<nlohmann::json> description, std::vector<CUgraphNode> nodes);
  // Its graph was updated in place (cuGraphExecUpdate) from a graph of that
  // description, whose nodes the update paired with its own in order: the
  // application goes on naming them by the nodes it instantiated from.
  void updateExec(uint64_t id, Result<nlohmann::json> description);
  // Node `node` (the application's id, and what it resolves to) of
  // executable graph `exec` now has the parameters `params` describes (a
  // failure: the executable graph cannot be described any more).
  void setExecNode(uint64_t exec, uint64_t node, CUgraphNode real, Result<nlohmann::json> params);
  void setExecNodeEnabled(uint64_t exec, uint64_t node, CUgraphNode real, bool enabled);
  // The driver's node that executable graph `exec` knows as the
  // application's `node`: a restored executable graph was made from a graph
  // of its own.
  CUgraphNode execNode(uint64_t exec, uint64_t node, CUgraphNode real) const;
  void forget(uint64_t id, const DriverTable& driver);

  // A host function node's parameters for the driver: phosd's trampoline,
  // which has the application run `function(userData)` through `channel`
  // each time the node runs; kept as long as the session (a cloned or
  // instantiated graph holds the same parameters).
  CUDA_HOST_NODE_PARAMS hostNode(std::shared_ptr<HostCallChannel> channel, uint64_t function,
                                 uint64_t userData);
  // The application's function and data behind a host node's parameters;
  // nullptr if they are not hostNode()'s.
  const PendingHostCall* applicationHostCall(const CUDA_HOST_NODE_PARAMS& params) const;

  // Every live graph (described now) and executable graph into `state`
  // ("graphs"); what cannot be described goes to `lost` ({id, what}).
  void save(const SessionScope& scope, nlohmann::json& state, nlohmann::json& lost) const;
  // save()'s graphs made again under their ids; `makeCurrent` makes a
  // context (virtual id) current; `owns(address, bytes)` says whether a range
  // is the session's memory (device or pinned): the image is untrusted, and a
  // copy or set node may name nothing else; `channel` runs host functions.
  Status rebuild(const SessionScope& scope, const nlohmann::json& state,
                 const std::function<Status(uint64_t)>& makeCurrent,
                 const std::function<bool(uint64_t, uint64_t)>& owns,
                 const std::function<Result<std::shared_ptr<HostCallChannel>>()>& channel);

  // Whether a copy or set node names only the session's memory.
  static bool copyOwned(const CUDA_MEMCPY3D& m,
                        const std::function<bool(uint64_t, uint64_t)>& owns);
  static bool setOwned(const CUDA_MEMSET_NODE_PARAMS& m,
                       const std::function<bool(uint64_t, uint64_t)>& owns);

 private:
  struct Exec {
    uint64_t context = 0;
    unsigned long long flags = 0;
    Result<nlohmann::json> description = nlohmann::json();
    std::vector<CUgraphNode> nodes;  // the driver's nodes it was made from, in description order
    std::vector<uint64_t> ids;       // the application's ids of them (0: none)
    CUgraph restoredFrom = nullptr;  // a restore's graph, whose nodes those are
  };
  // The place of the application's node in executable graph `exec`'s description.
  std::optional<size_t> execIndex(uint64_t exec, uint64_t node, CUgraphNode real) const;
  Result<nlohmann::json> describeNode(const SessionScope& scope, CUgraphNode node) const;
  // A description's nodes added to `graph`, in order; the nodes made.
  // `depth`: how many child graphs hold `graph` (an image's nesting is
  // bounded, as the untrusted input it is).
  Result<std::vector<CUgraphNode>> addNodes(
      const SessionScope& scope, CUgraph graph, const nlohmann::json& nodes,
      const std::string& where, const std::function<bool(uint64_t, uint64_t)>& owns,
      const std::function<Result<std::shared_ptr<HostCallChannel>>()>& channel, int depth);
  Result<CUgraphNode> addNode(
      const SessionScope& scope, CUgraph graph, const nlohmann::json& n,
      const std::vector<CUgraphNode>& after, const std::string& where,
      const std::function<bool(uint64_t, uint64_t)>& owns,
      const std::function<Result<std::shared_ptr<HostCallChannel>>()>& channel, int depth);

  std::map<uint64_t, uint64_t> graphContexts_;  // graph id -> context id
  std::map<uint64_t, Exec> execs_;              // executable graph id -> what it was made from
  std::map<const void*, std::unique_ptr<PendingHostCall>> hostCalls_;  // by the trampoline's data
};

}  // namespace phos::daemon
