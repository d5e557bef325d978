// SPDX-License-Identifier: Apache-2.0
#include "graph.h"

#include <algorithm>
#include <map>
#include <set>

#include "cu_status.h"
#include "driver.h"

namespace phos::vgpu {

// --- Graph -------------------------------------------------------------------------

Result<std::shared_ptr<GraphNode>> Graph::add(NodeInfo info, Stream::Work work,
                                              std::vector<std::uint64_t> dependencies,
                                              std::shared_ptr<Graph> child) {
  std::lock_guard lock(mutex_);
  std::set<std::uint64_t> seen;
  for (std::uint64_t d : dependencies) {
    const bool inGraph =
        std::any_of(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n->id == d; });
    if (!inGraph) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "dependency 0x{:x} is not a node of this graph", d);
    }
    // "It is an error to specify a dependency more than once."
    if (!seen.insert(d).second) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "dependency 0x{:x} is named twice", d);
    }
  }
  auto node = std::make_shared<GraphNode>();
  node->id = newHandle(HandleKind::kGraphNode);
  node->info = std::move(info);
  node->work = std::move(work);
  node->dependencies = std::move(dependencies);
  node->child = std::move(child);
  nodes_.push_back(node);
  return node;
}

Status Graph::addDependency(std::uint64_t from, std::uint64_t to) {
  std::lock_guard lock(mutex_);
  auto find = [&](std::uint64_t id) {
    auto it =
        std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n->id == id; });
    return it == nodes_.end() ? nullptr : *it;
  };
  auto source = find(from);
  auto target = find(to);
  if (!source || !target) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "a dependency names a node of another graph");
  }
  if (from == to) return cuError(CUDA_ERROR_INVALID_VALUE, "a node cannot depend on itself");
  if (std::find(target->dependencies.begin(), target->dependencies.end(), from) !=
      target->dependencies.end()) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the dependency exists already");
  }
  target->dependencies.push_back(from);
  return Status::ok();
}

Status Graph::removeDependency(std::uint64_t from, std::uint64_t to) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n->id == to; });
  if (it == nodes_.end()) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "a dependency names a node of another graph");
  }
  auto& deps = (*it)->dependencies;
  auto edge = std::find(deps.begin(), deps.end(), from);
  if (edge == deps.end()) return cuError(CUDA_ERROR_INVALID_VALUE, "the dependency does not exist");
  deps.erase(edge);
  return Status::ok();
}

Status Graph::remove(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n->id == id; });
  if (it == nodes_.end()) return cuError(CUDA_ERROR_INVALID_VALUE, "not a node of this graph");
  nodes_.erase(it);
  for (auto& n : nodes_) std::erase(n->dependencies, id);
  return Status::ok();
}

std::vector<std::uint64_t> Graph::dependents(std::uint64_t id) const {
  std::lock_guard lock(mutex_);
  std::vector<std::uint64_t> out;
  for (const auto& n : nodes_) {
    if (std::find(n->dependencies.begin(), n->dependencies.end(), id) != n->dependencies.end()) {
      out.push_back(n->id);
    }
  }
  return out;
}

std::vector<std::shared_ptr<GraphNode>> Graph::nodes() const {
  std::lock_guard lock(mutex_);
  return nodes_;
}

std::shared_ptr<GraphNode> Graph::node(std::uint64_t id) const {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n->id == id; });
  return it == nodes_.end() ? nullptr : *it;
}

Result<std::vector<ExecStep>> Graph::executionOrder() const {
  const auto all = nodes();
  // Kahn's algorithm, in the order the nodes were added among those ready.
  std::map<std::uint64_t, std::size_t> waiting;
  std::map<std::uint64_t, std::vector<std::size_t>> dependents;
  for (std::size_t i = 0; i < all.size(); ++i) {
    waiting[all[i]->id] = all[i]->dependencies.size();
    for (std::uint64_t d : all[i]->dependencies) dependents[d].push_back(i);
  }
  std::vector<std::size_t> ready;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i]->dependencies.empty()) ready.push_back(i);
  }
  std::vector<ExecStep> steps;
  std::size_t done = 0;
  while (!ready.empty()) {
    std::sort(ready.begin(), ready.end(), std::greater<>());
    const std::size_t i = ready.back();
    ready.pop_back();
    ++done;
    const GraphNode& n = *all[i];
    if (n.child) {
      ASSIGN_OR_RETURN(auto inner, n.child->executionOrder());
      for (ExecStep& step : inner) {
        step.node = 0;          // not a node of the instantiated graph
        step.childNode = n.id;  // the outermost child graph node, for nested ones too
      }
      steps.insert(steps.end(), inner.begin(), inner.end());
    } else if (n.work || n.info.event != nullptr) {
      steps.push_back({n.id, n.info.type, n.work, n.info.event});
    }
    for (std::size_t j : dependents[n.id]) {
      if (--waiting[all[j]->id] == 0) ready.push_back(j);
    }
  }
  if (done != all.size()) {
    return cuError(CUDA_ERROR_INVALID_VALUE, "the graph's dependencies form a cycle");
  }
  return steps;
}

std::shared_ptr<Graph> Graph::embedded(std::uint64_t id) const {
  for (const auto& n : nodes()) {
    if (!n->child) continue;
    if (n->child->id() == id) return n->child;
    if (auto inner = n->child->embedded(id)) return inner;
  }
  return nullptr;
}

std::shared_ptr<Graph> Graph::holderOf(std::uint64_t node) const {
  for (const auto& n : nodes()) {
    if (!n->child) continue;
    if (n->child->node(node)) return n->child;
    if (auto inner = n->child->holderOf(node)) return inner;
  }
  return nullptr;
}

// --- user-object references ---------------------------------------------------------

UserObjectRefs::~UserObjectRefs() {
  for (const auto& [object, count] : counts_) releaseUserObjectReferences(object, count);
}

void UserObjectRefs::add(std::uint64_t object, unsigned count) {
  std::lock_guard lock(mutex_);
  counts_[object] += count;
}

Status UserObjectRefs::release(std::uint64_t object, unsigned count) {
  {
    std::lock_guard lock(mutex_);
    auto it = counts_.find(object);
    if (it == counts_.end() || it->second < count) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "the graph owns {} references to user object 0x{:x}, not {}",
                      it == counts_.end() ? 0u : it->second, object, count);
    }
    it->second -= count;
    if (it->second == 0) counts_.erase(it);
  }
  releaseUserObjectReferences(object, count);
  return Status::ok();
}

std::map<std::uint64_t, unsigned> UserObjectRefs::counts() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

bool UserObjectRefs::empty() const {
  std::lock_guard lock(mutex_);
  return counts_.empty();
}

std::map<std::uint64_t, unsigned> Graph::allUserObjects() const {
  std::map<std::uint64_t, unsigned> all = userObjects_->counts();
  for (const auto& n : nodes()) {
    if (!n->child) continue;
    for (const auto& [object, count] : n->child->allUserObjects()) all[object] += count;
  }
  return all;
}

std::shared_ptr<Graph> Graph::clone(std::uint64_t id) const {
  auto copy = std::make_shared<Graph>(id);
  // "The clone owns the same references": new ones, released with it.
  for (const auto& [object, count] : userObjects_->counts()) {
    retainUserObjectReferences(object, count);
    copy->userObjects_->add(object, count);
  }
  std::map<std::uint64_t, std::uint64_t> renamed;
  for (const auto& n : nodes()) {
    auto c = std::make_shared<GraphNode>(*n);
    c->id = newHandle(HandleKind::kGraphNode);
    c->clonedFrom = n->id;
    renamed[n->id] = c->id;
    if (n->child) c->child = n->child->clone(newHandle(HandleKind::kGraph));
    copy->nodes_.push_back(std::move(c));
  }
  for (auto& c : copy->nodes_) {
    for (auto& d : c->dependencies) d = renamed.at(d);
  }
  return copy;
}

// --- GraphExec ---------------------------------------------------------------------

std::shared_ptr<UserObjectRefs> GraphExec::userObjects() const {
  std::lock_guard lock(mutex_);
  return userObjects_;
}

void GraphExec::setUserObjects(std::shared_ptr<UserObjectRefs> refs) {
  std::lock_guard lock(mutex_);
  userObjects_ = std::move(refs);
}

std::vector<ExecStep> GraphExec::steps() const {
  std::lock_guard lock(mutex_);
  return steps_;
}

namespace {

// The step of `node` in `steps`, if it is one of `type` (of any type without one).
template <typename Steps>  // std::vector<ExecStep>, const or not
Result<decltype(&std::declval<Steps&>()[0])> stepOf(Steps& steps, std::uint64_t node,
                                                    std::optional<CUgraphNodeType> type) {
  auto it = std::find_if(steps.begin(), steps.end(),
                         [&](const ExecStep& s) { return node != 0 && s.node == node; });
  if (it == steps.end() || (type && it->type != *type)) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                    "0x{:x} is not a node{} of the graph this was instantiated from", node,
                    type ? fmt::format(" of type {}", static_cast<int>(*type)) : "");
  }
  return &*it;
}

}  // namespace

Status GraphExec::replaceWork(std::uint64_t node, CUgraphNodeType type, Stream::Work work) {
  std::lock_guard lock(mutex_);
  ASSIGN_OR_RETURN(ExecStep * step, stepOf(steps_, node, type));
  step->work = std::move(work);
  return Status::ok();
}

Status GraphExec::replaceEvent(std::uint64_t node, CUgraphNodeType type, CUevent event) {
  std::lock_guard lock(mutex_);
  ASSIGN_OR_RETURN(ExecStep * step, stepOf(steps_, node, type));
  step->event = event;
  return Status::ok();
}

Status GraphExec::setEnabled(std::uint64_t node, bool enabled) {
  std::lock_guard lock(mutex_);
  ASSIGN_OR_RETURN(ExecStep * step, stepOf(steps_, node, std::nullopt));
  // "Currently only kernel, memset and memcpy nodes are supported."
  if (step->type != CU_GRAPH_NODE_TYPE_KERNEL && step->type != CU_GRAPH_NODE_TYPE_MEMSET &&
      step->type != CU_GRAPH_NODE_TYPE_MEMCPY) {
    return cuError(CUDA_ERROR_INVALID_VALUE,
                   "only kernel, memset and memcpy nodes are enabled or disabled");
  }
  step->enabled = enabled;
  return Status::ok();
}

Result<bool> GraphExec::enabled(std::uint64_t node) const {
  std::lock_guard lock(mutex_);
  ASSIGN_OR_RETURN(const ExecStep* step, stepOf(steps_, node, std::nullopt));
  return step->enabled;
}

Result<CUgraphExecUpdateResult> GraphExec::update(const std::vector<ExecStep>& steps) {
  std::lock_guard lock(mutex_);
  if (steps.size() != steps_.size()) return CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].type != steps_[i].type) return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {
    steps_[i].work = steps[i].work;
    steps_[i].event = steps[i].event;
  }
  return CU_GRAPH_EXEC_UPDATE_SUCCESS;
}

Status GraphExec::updateChild(std::uint64_t node, const std::vector<ExecStep>& steps) {
  std::lock_guard lock(mutex_);
  std::vector<ExecStep*> mine;
  for (ExecStep& step : steps_) {
    if (step.childNode == node) mine.push_back(&step);
  }
  // "The topology of childGraph, as well as the node insertion order, must
  // match that of the graph contained in hNode."
  if (mine.size() != steps.size()) {
    return cuErrorf(CUDA_ERROR_INVALID_VALUE, "the graph has {} nodes that run, the child graph {}",
                    steps.size(), mine.size());
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].type != mine[i]->type) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE,
                      "node {} of the graph is of type {}, the child graph's {}", i,
                      static_cast<int>(steps[i].type), static_cast<int>(mine[i]->type));
    }
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {
    mine[i]->work = steps[i].work;
    mine[i]->event = steps[i].event;
  }
  return Status::ok();
}

StreamDependency GraphExec::lastLaunch() const {
  std::lock_guard lock(mutex_);
  return last_;
}

void GraphExec::setLastLaunch(StreamDependency end) {
  std::lock_guard lock(mutex_);
  last_ = std::move(end);
}

// --- CaptureSequence ---------------------------------------------------------------

CaptureSequence::CaptureSequence(std::uint64_t id, CUstreamCaptureMode mode,
                                 std::shared_ptr<Graph> graph, std::shared_ptr<Stream> origin,
                                 bool ownsGraph)
    : id_(id),
      mode_(mode),
      thread_(std::this_thread::get_id()),
      graph_(std::move(graph)),
      origin_(origin),
      ownsGraph_(ownsGraph) {
  joined_.push_back({std::move(origin), {}});
}

Status CaptureSequence::add(const Stream& stream, const NodeInfo& info, Stream::Work work) {
  std::lock_guard lock(mutex_);
  // Another thread ended the capture while this call was being made.
  if (ended_) {
    return cuError(CUDA_ERROR_ILLEGAL_STATE, "the stream's capture ended during the call");
  }
  if (invalidated_) {
    return cuError(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                   "the stream's capture was invalidated by an earlier call");
  }
  auto it = std::find_if(joined_.begin(), joined_.end(),
                         [&](const Joined& j) { return j.stream.get() == &stream; });
  if (it == joined_.end()) {
    return cuError(CUDA_ERROR_ILLEGAL_STATE, "the stream is not part of this capture");
  }
  ASSIGN_OR_RETURN(auto node, graph_->add(info, std::move(work), it->frontier));
  it->frontier = {node->id};
  return Status::ok();
}

Status CaptureSequence::setFrontier(const Stream& stream, const std::vector<std::uint64_t>& nodes,
                                    bool add) {
  std::lock_guard lock(mutex_);
  if (invalidated_) {
    return cuError(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                   "the stream's capture was invalidated by an earlier call");
  }
  for (std::uint64_t n : nodes) {
    if (!graph_->node(n)) {
      return cuErrorf(CUDA_ERROR_INVALID_VALUE, "0x{:x} is not a node of the capture's graph", n);
    }
  }
  auto it = std::find_if(joined_.begin(), joined_.end(),
                         [&](const Joined& j) { return j.stream.get() == &stream; });
  if (it == joined_.end()) {
    return cuError(CUDA_ERROR_ILLEGAL_STATE, "the stream is not part of this capture");
  }
  if (!add) it->frontier.clear();
  for (std::uint64_t n : nodes) {
    if (std::find(it->frontier.begin(), it->frontier.end(), n) == it->frontier.end()) {
      it->frontier.push_back(n);
    }
  }
  return Status::ok();
}

std::vector<std::uint64_t> CaptureSequence::frontier(const Stream& stream) const {
  std::lock_guard lock(mutex_);
  for (const Joined& j : joined_) {
    if (j.stream.get() == &stream) return j.frontier;
  }
  return {};
}

void CaptureSequence::join(const std::shared_ptr<Stream>& stream,
                           const std::vector<std::uint64_t>& nodes) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(joined_.begin(), joined_.end(),
                         [&](const Joined& j) { return j.stream == stream; });
  if (it == joined_.end()) {
    joined_.push_back({stream, nodes});
    return;
  }
  for (std::uint64_t n : nodes) {
    if (std::find(it->frontier.begin(), it->frontier.end(), n) == it->frontier.end()) {
      it->frontier.push_back(n);
    }
  }
}

bool CaptureSequence::active() const {
  std::lock_guard lock(mutex_);
  return !ended_;
}

void CaptureSequence::invalidate() {
  std::lock_guard lock(mutex_);
  invalidated_ = true;
}

bool CaptureSequence::invalidated() const {
  std::lock_guard lock(mutex_);
  return invalidated_;
}

Result<std::shared_ptr<Graph>> CaptureSequence::end() {
  std::lock_guard lock(mutex_);
  ended_ = true;
  for (const Joined& j : joined_) j.stream->setCapture(nullptr);
  if (invalidated_) {
    return cuError(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                   "the capture was invalidated by a call it could not take");
  }
  // Every other stream's last nodes must be behind the origin's: "the capture
  // must be joined back to the origin stream".
  std::set<std::uint64_t> behind;
  std::vector<std::uint64_t> todo = joined_.front().frontier;
  while (!todo.empty()) {
    const std::uint64_t id = todo.back();
    todo.pop_back();
    if (!behind.insert(id).second) continue;
    if (auto n = graph_->node(id)) {
      todo.insert(todo.end(), n->dependencies.begin(), n->dependencies.end());
    }
  }
  for (std::size_t i = 1; i < joined_.size(); ++i) {
    for (std::uint64_t id : joined_[i].frontier) {
      if (!behind.contains(id)) {
        return cuError(
            CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            "a stream that joined the capture was not joined back into the origin stream");
      }
    }
  }
  return graph_;
}

}  // namespace phos::vgpu
