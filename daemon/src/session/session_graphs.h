// SPDX-License-Identifier: Apache-2.0
// SessionGraphs: the application's CUDA graphs and executable graphs in a
// checkpoint (docs/checkpoint.md: graphs).
//
// A graph is the driver's (stream capture runs on phosd's streams), and the
// driver describes a graph node by node, but not an executable graph: each
// executable graph's description is taken from its graph when it is
// instantiated. A description lists the nodes in an order that keeps every
// edge (kernel nodes with the session's id of their function or library
// kernel and their parameters' bytes; copies, sets, empty nodes, event
// records and waits), with the ids the application holds for them. A
// restore adds the nodes to a new graph in that order and instantiates the
// executable graphs again, under the same ids. A node of another kind (a host
// function, a child graph, a memory node) cannot be described: a checkpoint of
// a session holding its graph fails, naming it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "phos/common/status.h"
#include "session/session_image.h"

namespace phos::daemon {

class SessionGraphs {
 public:
  // `graph`, as the driver holds it now, in context `context` (current).
  static Result<nlohmann::json> describe(const SessionScope& scope, CUgraph graph);

  // A graph (virtual id) was made in context `context`.
  void noteGraph(uint64_t id, uint64_t context) { graphContexts_[id] = context; }
  // Executable graph `id` was instantiated with `flags` in context `context`
  // from a graph of that description (or of one that cannot be described).
  void noteExec(uint64_t id, uint64_t context, unsigned long long flags,
                Result<nlohmann::json> description) {
    execs_[id] = Exec{context, flags, std::move(description)};
  }
  void forget(uint64_t id) {
    graphContexts_.erase(id);
    execs_.erase(id);
  }

  // Every live graph (described now) and executable graph into `state`
  // ("graphs"); what cannot be described goes to `lost` ({id, what}).
  void save(const SessionScope& scope, nlohmann::json& state, nlohmann::json& lost) const;
  // save()'s graphs made again under their ids; `makeCurrent` makes a
  // context (virtual id) current; `owns(address, bytes)` says whether a range
  // is the session's memory (device or pinned): the image is untrusted, and a
  // copy or set node may name nothing else.
  Status rebuild(const SessionScope& scope, const nlohmann::json& state,
                 const std::function<Status(uint64_t)>& makeCurrent,
                 const std::function<bool(uint64_t, uint64_t)>& owns);

 private:
  struct Exec {
    uint64_t context = 0;
    unsigned long long flags = 0;
    Result<nlohmann::json> description = nlohmann::json();
  };
  std::map<uint64_t, uint64_t> graphContexts_;  // graph id -> context id
  std::map<uint64_t, Exec> execs_;              // executable graph id -> what it was made from
};

}  // namespace phos::daemon
