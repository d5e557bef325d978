// SPDX-License-Identifier: Apache-2.0
#include "session/session_graphs.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "phos/common/launch_attributes.h"
#include "phos/cuda_api/api_table.h"

namespace phos::daemon {

using json = nlohmann::json;

namespace {

// The session's id for the function a kernel node runs: a CUfunction the
// application was given, or the library kernel whose function it is in the
// current context.
Result<uint64_t> functionId(const SessionScope& scope, CUfunction f) {
  if (uint64_t id = scope.handles.idOf(f); HandleTable::typeOf(id) == HandleType::kCUfunc_st) {
    return id;
  }
  for (uint64_t id : scope.handles.ids(HandleType::kCUkern_st)) {
    auto k = static_cast<CUkernel>(scope.handles.resolve(HandleType::kCUkern_st, id));
    CUfunction of = nullptr;
    if (PHOS_DRIVER(scope.driver, KernelGetFunction)(&of, k) == CUDA_SUCCESS && of == f) return id;
  }
  return makeError(Code::kFailedPrecondition,
                   "a kernel node runs a function the application was not given");
}

// The function of `id` (save()'s) in the current context.
Result<CUfunction> functionOf(const SessionScope& scope, uint64_t id) {
  if (HandleTable::typeOf(id) == HandleType::kCUkern_st) {
    auto k = static_cast<CUkernel>(scope.handles.resolve(HandleType::kCUkern_st, id));
    CUfunction f = nullptr;
    if (k == nullptr || PHOS_DRIVER(scope.driver, KernelGetFunction)(&f, k) != CUDA_SUCCESS) {
      return makeError(Code::kDataLoss, "graph: kernel {} is not a library kernel of the session",
                       hex(id));
    }
    return f;
  }
  auto f = static_cast<CUfunction>(scope.handles.resolve(HandleType::kCUfunc_st, id));
  if (f == nullptr) {
    return makeError(Code::kDataLoss, "graph: function {} is not a function of the session",
                     hex(id));
  }
  return f;
}

}  // namespace

Result<uint64_t> SessionGraphs::functionIdOf(const SessionScope& scope, CUfunction f) {
  return functionId(scope, f);
}

Result<json> SessionGraphs::describeKernel(const SessionScope& scope,
                                           const CUDA_KERNEL_NODE_PARAMS& p) const {
  if (p.extra != nullptr) {
    return makeError(Code::kFailedPrecondition,
                     "a kernel node whose parameters are an `extra` buffer");
  }
  CUfunction f = p.func;
  if (f == nullptr && (p.kern == nullptr ||
                       PHOS_DRIVER(scope.driver, KernelGetFunction)(&f, p.kern) != CUDA_SUCCESS)) {
    return makeError(Code::kFailedPrecondition, "a kernel node of a kernel with no function");
  }
  json n = {{"type", static_cast<int>(CU_GRAPH_NODE_TYPE_KERNEL)}};
  // The driver keeps the kern and ctx it was given beside the function.
  if (p.func != nullptr) {
    ASSIGN_OR_RETURN(n["function"], functionId(scope, p.func));
  }
  if (p.kern != nullptr) {
    const uint64_t id = scope.handles.idOf(p.kern);
    if (HandleTable::typeOf(id) != HandleType::kCUkern_st) {
      return makeError(Code::kFailedPrecondition,
                       "a kernel node of a kernel the application was not given");
    }
    n["kernel"] = id;
  }
  if (p.ctx != nullptr) {
    const uint64_t id = scope.contexts.idOf(p.ctx);
    if (id == 0) {
      return makeError(Code::kFailedPrecondition,
                       "a kernel node of a context the session does not hold");
    }
    n["context"] = id;
  }
  json params = json::array();
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    if (PHOS_DRIVER(scope.driver, FuncGetParamInfo)(f, i, &offset, &size) != CUDA_SUCCESS) break;
    params.push_back(hexBytes(p.kernelParams[i], size));
  }
  n["grid"] = {p.gridDimX, p.gridDimY, p.gridDimZ};
  n["block"] = {p.blockDimX, p.blockDimY, p.blockDimZ};
  n["shared"] = p.sharedMemBytes;
  n["params"] = std::move(params);
  return n;
}

json SessionGraphs::describeCopy(const CUDA_MEMCPY3D& m) {
  return {{"type", static_cast<int>(CU_GRAPH_NODE_TYPE_MEMCPY)}, {"copy", hexBytes(&m, sizeof(m))}};
}

json SessionGraphs::describeSet(const CUDA_MEMSET_NODE_PARAMS& m) {
  return {{"type", static_cast<int>(CU_GRAPH_NODE_TYPE_MEMSET)}, {"set", hexBytes(&m, sizeof(m))}};
}

Result<json> SessionGraphs::describeHost(const CUDA_HOST_NODE_PARAMS& p) const {
  const PendingHostCall* call = applicationHostCall(p);
  if (call == nullptr) return makeError(Code::kInternal, "a host node of phosd's own");
  return json{{"type", static_cast<int>(CU_GRAPH_NODE_TYPE_HOST)},
              {"function", call->function},
              {"user_data", call->userData}};
}

Result<json> SessionGraphs::describeEvent(const SessionScope& scope, CUgraphNodeType type,
                                          CUevent e) {
  uint64_t id = scope.handles.idOf(e);
  if (HandleTable::typeOf(id) != HandleType::kCUevent_st) {
    return makeError(Code::kFailedPrecondition,
                     "an event node of an event the application destroyed");
  }
  return json{{"type", static_cast<int>(type)}, {"event", id}};
}

Result<json> SessionGraphs::describeChild(const SessionScope& scope, CUgraph child) const {
  ASSIGN_OR_RETURN(json nodes, describe(scope, child));
  return json{{"type", static_cast<int>(CU_GRAPH_NODE_TYPE_GRAPH)}, {"graph", std::move(nodes)}};
}

Result<json> SessionGraphs::describeNode(const SessionScope& scope, CUgraphNode node) const {
  const DriverTable& d = scope.driver;
  CUgraphNodeType type{};
  RETURN_IF_ERROR(
      driverStatus(PHOS_DRIVER(d, GraphNodeGetType)(node, &type), "cuGraphNodeGetType"));
  switch (type) {
    case CU_GRAPH_NODE_TYPE_EMPTY:
      return json{{"type", static_cast<int>(type)}};
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      CUDA_KERNEL_NODE_PARAMS p{};
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, GraphKernelNodeGetParams_v2)(node, &p),
                                   "cuGraphKernelNodeGetParams"));
      ASSIGN_OR_RETURN(json n, describeKernel(scope, p));
      // The attributes set on it (unset ones read as zero).
      for (CUkernelNodeAttrID attr : kKernelNodeAttributes) {
        CUkernelNodeAttrValue v{};
        if (PHOS_DRIVER(d, GraphKernelNodeGetAttribute)(node, attr, &v) != CUDA_SUCCESS) continue;
        const auto* bytes = reinterpret_cast<const unsigned char*>(&v);
        if (std::all_of(bytes, bytes + sizeof(v), [](unsigned char b) { return b == 0; })) continue;
        n["attributes"][std::to_string(static_cast<int>(attr))] = hexBytes(&v, sizeof(v));
      }
      return n;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      CUDA_MEMCPY3D m{};
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, GraphMemcpyNodeGetParams)(node, &m),
                                   "cuGraphMemcpyNodeGetParams"));
      if (m.srcMemoryType == CU_MEMORYTYPE_ARRAY || m.dstMemoryType == CU_MEMORYTYPE_ARRAY) {
        return makeError(Code::kFailedPrecondition, "a copy node of a CUDA array");
      }
      return describeCopy(m);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS m{};
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, GraphMemsetNodeGetParams)(node, &m),
                                   "cuGraphMemsetNodeGetParams"));
      return describeSet(m);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      CUDA_HOST_NODE_PARAMS h{};
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, GraphHostNodeGetParams)(node, &h),
                                   "cuGraphHostNodeGetParams"));
      return describeHost(h);
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      CUevent e = nullptr;
      CUresult r = type == CU_GRAPH_NODE_TYPE_EVENT_RECORD
                       ? PHOS_DRIVER(d, GraphEventRecordNodeGetEvent)(node, &e)
                       : PHOS_DRIVER(d, GraphEventWaitNodeGetEvent)(node, &e);
      RETURN_IF_ERROR(driverStatus(r, "the event of an event node"));
      return describeEvent(scope, type, e);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      CUgraph child = nullptr;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, GraphChildGraphNodeGetGraph)(node, &child),
                                   "cuGraphChildGraphNodeGetGraph"));
      // A restore makes the child graph again inside its node, under no id:
      // a handle the program holds of it would name nothing.
      if (scope.handles.idOf(child) != 0) {
        return makeError(Code::kFailedPrecondition,
                         "a child graph node whose graph the program holds a handle of");
      }
      return describeChild(scope, child);
    }
    default:
      return makeError(Code::kFailedPrecondition,
                       "a node of type {} (a memory, conditional or external node)",
                       static_cast<int>(type));
  }
}

Result<json> SessionGraphs::describe(const SessionScope& scope, CUgraph graph,
                                     std::vector<CUgraphNode>* ordered) const {
  const DriverTable& d = scope.driver;
  size_t count = 0;
  RETURN_IF_ERROR(
      driverStatus(PHOS_DRIVER(d, GraphGetNodes)(graph, nullptr, &count), "cuGraphGetNodes"));
  std::vector<CUgraphNode> nodes(count);
  if (count > 0) {
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, GraphGetNodes)(graph, nodes.data(), &count),
                                 "cuGraphGetNodes"));
  }
  size_t edges = 0;
  RETURN_IF_ERROR(
      driverStatus(PHOS_DRIVER(d, GraphGetEdges_v2)(graph, nullptr, nullptr, nullptr, &edges),
                   "cuGraphGetEdges"));
  std::vector<CUgraphNode> from(edges), to(edges);
  std::vector<CUgraphEdgeData> data(edges);
  if (edges > 0) {
    RETURN_IF_ERROR(driverStatus(
        PHOS_DRIVER(d, GraphGetEdges_v2)(graph, from.data(), to.data(), data.data(), &edges),
        "cuGraphGetEdges"));
  }
  std::unordered_map<CUgraphNode, size_t> indexOf;
  for (size_t i = 0; i < count; ++i) indexOf[nodes[i]] = i;
  auto index = [&](CUgraphNode n) {
    auto it = indexOf.find(n);
    return it == indexOf.end() ? count : it->second;
  };
  std::vector<std::vector<size_t>> deps(count), next(count);
  std::vector<size_t> waiting(count, 0);
  for (size_t e = 0; e < edges; ++e) {
    const CUgraphEdgeData& ed = data[e];
    if (ed.type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT || ed.from_port != 0 || ed.to_port != 0) {
      return makeError(Code::kFailedPrecondition,
                       "an edge with ports or a programmatic dependency");
    }
    const size_t f = index(from[e]), t = index(to[e]);
    if (f >= count || t >= count) {
      return makeError(Code::kInternal, "an edge names a node the graph does not list");
    }
    deps[t].push_back(f);
    next[f].push_back(t);
    ++waiting[t];
  }
  // Kahn's order: every node after the nodes it depends on.
  std::vector<size_t> order;
  std::deque<size_t> ready;
  for (size_t i = 0; i < count; ++i) {
    if (waiting[i] == 0) ready.push_back(i);
  }
  std::vector<size_t> position(count);
  while (!ready.empty()) {
    const size_t i = ready.front();
    ready.pop_front();
    position[i] = order.size();
    order.push_back(i);
    for (size_t t : next[i]) {
      if (--waiting[t] == 0) ready.push_back(t);
    }
  }
  if (order.size() != count) return makeError(Code::kInternal, "the graph's edges make a cycle");
  json out = json::array();
  for (size_t i : order) {
    auto node = describeNode(scope, nodes[i]);
    if (!node.isOk()) return node.status();
    json after = json::array();
    for (size_t f : deps[i]) after.push_back(position[f]);
    (*node)["after"] = std::move(after);
    (*node)["id"] = scope.handles.idOf(nodes[i]);
    out.push_back(std::move(*node));
    if (ordered != nullptr) ordered->push_back(nodes[i]);
  }
  return out;
}

void SessionGraphs::noteExec(uint64_t id, uint64_t context, unsigned long long flags,
                             Result<json> description, std::vector<CUgraphNode> nodes) {
  Exec exec{context, flags, std::move(description), std::move(nodes), {}, nullptr};
  if (exec.description.isOk()) {
    for (const json& n : *exec.description) exec.ids.push_back(n.value("id", uint64_t{0}));
  }
  exec.ids.resize(exec.nodes.size());
  execs_[id] = std::move(exec);
}

void SessionGraphs::updateExec(uint64_t id, Result<json> description) {
  auto it = execs_.find(id);
  if (it == execs_.end()) return;
  Exec& exec = it->second;
  if (description.isOk()) {
    if (description->size() != exec.nodes.size()) {
      description = makeError(Code::kInternal, "an update that changed the graph's shape");
    } else {
      // The update paired the graphs' nodes in order, and the application
      // goes on naming them by the nodes it instantiated from.
      for (size_t i = 0; i < description->size(); ++i) (*description)[i]["id"] = exec.ids[i];
    }
  }
  exec.description = std::move(description);
}

std::optional<size_t> SessionGraphs::execIndex(uint64_t id, uint64_t node, CUgraphNode real) const {
  auto it = execs_.find(id);
  if (it == execs_.end()) return std::nullopt;
  const Exec& exec = it->second;
  for (size_t i = 0; node != 0 && i < exec.ids.size(); ++i) {
    if (exec.ids[i] == node) return i;
  }
  // A restored executable graph's nodes are its own graph's, never the program's.
  for (size_t i = 0; exec.restoredFrom == nullptr && i < exec.nodes.size(); ++i) {
    if (exec.nodes[i] == real) return i;
  }
  return std::nullopt;
}

CUgraphNode SessionGraphs::execNode(uint64_t id, uint64_t node, CUgraphNode real) const {
  auto it = execs_.find(id);
  if (it == execs_.end() || it->second.restoredFrom == nullptr) return real;
  auto index = execIndex(id, node, real);
  return index ? it->second.nodes[*index] : real;
}

void SessionGraphs::setExecNode(uint64_t id, uint64_t node, CUgraphNode real, Result<json> params) {
  auto it = execs_.find(id);
  if (it == execs_.end() || !it->second.description.isOk()) return;
  Exec& exec = it->second;
  auto index = execIndex(id, node, real);
  if (!params.isOk() || !index) {
    exec.description = !params.isOk() ? params.status()
                                      : makeError(Code::kFailedPrecondition,
                                                  "a node set by a handle PhOS cannot place");
    return;
  }
  json& n = (*exec.description)[*index];
  json kept = {{"after", n["after"]}, {"id", n["id"]}};
  if (n.contains("enabled")) kept["enabled"] = n["enabled"];
  n = std::move(*params);
  n.update(kept);
}

void SessionGraphs::setExecNodeEnabled(uint64_t id, uint64_t node, CUgraphNode real, bool enabled) {
  auto it = execs_.find(id);
  if (it == execs_.end() || !it->second.description.isOk()) return;
  auto index = execIndex(id, node, real);
  if (!index) {
    it->second.description =
        makeError(Code::kFailedPrecondition, "a node enabled by a handle PhOS cannot place");
    return;
  }
  json& n = (*it->second.description)[*index];
  if (enabled) {
    n.erase("enabled");
  } else {
    n["enabled"] = false;
  }
}

void SessionGraphs::forget(uint64_t id, const DriverTable& driver) {
  graphContexts_.erase(id);
  auto it = execs_.find(id);
  if (it == execs_.end()) return;
  if (it->second.restoredFrom != nullptr) {
    PHOS_DRIVER(driver, GraphDestroy)(it->second.restoredFrom);
  }
  execs_.erase(it);
}

CUDA_HOST_NODE_PARAMS SessionGraphs::hostNode(std::shared_ptr<HostCallChannel> channel,
                                              uint64_t function, uint64_t userData) {
  auto call =
      std::make_unique<PendingHostCall>(PendingHostCall{std::move(channel), function, userData, 0});
  CUDA_HOST_NODE_PARAMS p{runHostNode, call.get()};
  hostCalls_[call.get()] = std::move(call);
  return p;
}

const PendingHostCall* SessionGraphs::applicationHostCall(const CUDA_HOST_NODE_PARAMS& p) const {
  if (p.fn != runHostNode) return nullptr;
  auto it = hostCalls_.find(p.userData);
  return it == hostCalls_.end() ? nullptr : it->second.get();
}

void SessionGraphs::save(const SessionScope& scope, json& state, json& lost) const {
  json graphs = json::array();
  for (uint64_t id : scope.handles.ids(HandleType::kCUgraph_st)) {
    auto context = graphContexts_.find(id);
    const uint64_t ctx = context != graphContexts_.end() ? context->second : scope.currentContext;
    if (ctx != 0) (void)scope.contexts.makeCurrent(scope.driver, ctx);
    auto graph = static_cast<CUgraph>(scope.handles.resolve(HandleType::kCUgraph_st, id));
    auto described = describe(scope, graph);
    if (!described.isOk()) {
      lost.push_back(
          {{"id", id}, {"what", "a CUDA graph holding " + described.status().message()}});
      continue;
    }
    graphs.push_back(
        {{"kind", "graph"}, {"id", id}, {"context", ctx}, {"nodes", std::move(*described)}});
  }
  for (const auto& [id, exec] : execs_) {
    if (scope.handles.resolve(HandleType::kCUgraphExec_st, id) == nullptr) continue;
    if (!exec.description.isOk()) {
      lost.push_back(
          {{"id", id},
           {"what", "an executable CUDA graph holding " + exec.description.status().message()}});
      continue;
    }
    graphs.push_back({{"kind", "exec"},
                      {"id", id},
                      {"context", exec.context},
                      {"flags", exec.flags},
                      {"nodes", *exec.description}});
  }
  state["graphs"] = std::move(graphs);
}

namespace {

using Owns = std::function<bool(uint64_t, uint64_t)>;
using Channel = std::function<Result<std::shared_ptr<HostCallChannel>>()>;

// a * b + c, false if it overflows 64 bits.
bool mulAdd(uint64_t a, uint64_t b, uint64_t c, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out) && !__builtin_add_overflow(*out, c, out);
}

// The bytes a side of a 3D copy spans: `bytes` from `first`; false if they
// overflow. Its first row is (z, y), its last (z + Depth - 1, y + Height - 1).
bool copySpan(uint64_t base, uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height,
              const CUDA_MEMCPY3D& m, uint64_t* first, uint64_t* bytes) {
  if (m.WidthInBytes == 0 || m.Height == 0 || m.Depth == 0) return false;
  uint64_t row = 0, lastRow = 0, start = 0, end = 0;
  if (!mulAdd(z, height, y, &row) || !mulAdd(m.Depth - 1, height, m.Height - 1, &lastRow) ||
      __builtin_add_overflow(lastRow, row, &lastRow)) {
    return false;
  }
  if (!mulAdd(row, pitch, x, &start) || !mulAdd(lastRow, pitch, x, &end) ||
      __builtin_add_overflow(end, m.WidthInBytes, &end)) {
    return false;
  }
  if (__builtin_add_overflow(start, base, first) || __builtin_add_overflow(end, base, &end)) {
    return false;
  }
  *bytes = end - *first;
  return true;
}

// Both sides of a copy node are the session's memory.
}  // namespace

bool SessionGraphs::copyOwned(const CUDA_MEMCPY3D& m, const Owns& owns) {
  auto side = [&](CUmemorytype type, const void* host, CUdeviceptr device, uint64_t x, uint64_t y,
                  uint64_t z, uint64_t pitch, uint64_t height) {
    if (type != CU_MEMORYTYPE_HOST && type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED) {
      return false;
    }
    const uint64_t base = type == CU_MEMORYTYPE_HOST ? reinterpret_cast<uint64_t>(host) : device;
    uint64_t first = 0, bytes = 0;
    return copySpan(base, x, y, z, pitch, height, m, &first, &bytes) && owns(first, bytes);
  };
  return side(m.srcMemoryType, m.srcHost, m.srcDevice, m.srcXInBytes, m.srcY, m.srcZ, m.srcPitch,
              m.srcHeight) &&
         side(m.dstMemoryType, m.dstHost, m.dstDevice, m.dstXInBytes, m.dstY, m.dstZ, m.dstPitch,
              m.dstHeight);
}

// A set node's rows lie in the session's memory.
bool SessionGraphs::setOwned(const CUDA_MEMSET_NODE_PARAMS& m, const Owns& owns) {
  if ((m.elementSize != 1 && m.elementSize != 2 && m.elementSize != 4) || m.width == 0 ||
      m.height == 0) {
    return false;
  }
  uint64_t rows = 0, bytes = 0, end = 0;
  return mulAdd(m.pitch, m.height - 1, 0, &rows) && mulAdd(m.width, m.elementSize, rows, &bytes) &&
         !__builtin_add_overflow(m.dst, bytes, &end) && owns(m.dst, bytes);
}

// One described node added to `graph` after `after`.
Result<CUgraphNode> SessionGraphs::addNode(const SessionScope& scope, CUgraph graph, const json& n,
                                           const std::vector<CUgraphNode>& after,
                                           const std::string& where, const Owns& owns,
                                           const Channel& channel, int depth) {
  const DriverTable& d = scope.driver;
  ASSIGN_OR_RETURN(int type, field<int>(n, "type", where));
  CUgraphNode node = nullptr;
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  const CUgraphNode* deps = after.empty() ? nullptr : after.data();
  CUcontext ctx = nullptr;
  (void)PHOS_DRIVER(d, CtxGetCurrent)(&ctx);
  switch (type) {
    case CU_GRAPH_NODE_TYPE_EMPTY:
      r = PHOS_DRIVER(d, GraphAddEmptyNode)(&node, graph, deps, after.size());
      break;
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      CUDA_KERNEL_NODE_PARAMS p{};
      if (n.contains("function")) {
        ASSIGN_OR_RETURN(uint64_t fid, field<uint64_t>(n, "function", where));
        ASSIGN_OR_RETURN(p.func, functionOf(scope, fid));
      }
      if (n.contains("kernel")) {
        ASSIGN_OR_RETURN(uint64_t kid, field<uint64_t>(n, "kernel", where));
        p.kern = static_cast<CUkernel>(scope.handles.resolve(HandleType::kCUkern_st, kid));
        if (p.kern == nullptr) {
          return makeError(Code::kDataLoss, "{}: kernel {} is not a library kernel of the session",
                           where, hex(kid));
        }
      }
      if (n.contains("context")) {
        ASSIGN_OR_RETURN(uint64_t cid, field<uint64_t>(n, "context", where));
        ASSIGN_OR_RETURN(p.ctx, scope.contexts.real(cid));
      }
      CUfunction f = p.func;
      if (f == nullptr &&
          (p.kern == nullptr || PHOS_DRIVER(d, KernelGetFunction)(&f, p.kern) != CUDA_SUCCESS)) {
        return makeError(Code::kDataLoss, "{}: a kernel node with no function or kernel", where);
      }
      ASSIGN_OR_RETURN(auto grid, (field<std::vector<unsigned>>(n, "grid", where)));
      ASSIGN_OR_RETURN(auto block, (field<std::vector<unsigned>>(n, "block", where)));
      ASSIGN_OR_RETURN(unsigned shared, field<unsigned>(n, "shared", where));
      ASSIGN_OR_RETURN(auto texts, (field<std::vector<std::string>>(n, "params", where)));
      if (grid.size() != 3 || block.size() != 3) {
        return makeError(Code::kDataLoss, "{}: grid or block is not 3 numbers", where);
      }
      // Exactly the kernel's parameters, each of its size.
      std::vector<std::vector<unsigned char>> bytes;
      for (size_t i = 0;; ++i) {
        size_t offset = 0, size = 0;
        if (PHOS_DRIVER(d, FuncGetParamInfo)(f, i, &offset, &size) != CUDA_SUCCESS) break;
        if (i >= texts.size()) {
          return makeError(Code::kDataLoss, "{}: fewer parameters than the kernel's", where);
        }
        bytes.emplace_back(size);
        if (!parseHexBytes(texts[i], bytes.back().data(), size)) {
          return makeError(Code::kDataLoss, "{}: parameter {} is not {} bytes", where, i, size);
        }
      }
      if (bytes.size() != texts.size()) {
        return makeError(Code::kDataLoss, "{}: more parameters than the kernel's", where);
      }
      std::vector<void*> pointers;
      for (auto& b : bytes) pointers.push_back(b.data());
      p.gridDimX = grid[0];
      p.gridDimY = grid[1];
      p.gridDimZ = grid[2];
      p.blockDimX = block[0];
      p.blockDimY = block[1];
      p.blockDimZ = block[2];
      p.sharedMemBytes = shared;
      p.kernelParams = pointers.empty() ? nullptr : pointers.data();
      r = PHOS_DRIVER(d, GraphAddKernelNode_v2)(&node, graph, deps, after.size(), &p);
      const json attributes = n.contains("attributes") ? n["attributes"] : json::object();
      if (!attributes.is_object()) {
        return makeError(Code::kDataLoss, "{}: garbled kernel node attributes", where);
      }
      for (const auto& [key, text] : attributes.items()) {
        if (r != CUDA_SUCCESS) break;
        const int id = std::atoi(key.c_str());
        const auto attr = static_cast<CUkernelNodeAttrID>(id);
        CUkernelNodeAttrValue v{};
        if (std::to_string(id) != key || !isKernelNodeAttribute(attr) || !text.is_string() ||
            !parseHexBytes(text.get<std::string>(), &v, sizeof(v))) {
          return makeError(Code::kDataLoss, "{}: a garbled kernel node attribute {}", where, key);
        }
        r = PHOS_DRIVER(d, GraphKernelNodeSetAttribute)(node, attr, &v);
      }
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      ASSIGN_OR_RETURN(std::string text, field<std::string>(n, "copy", where));
      CUDA_MEMCPY3D m{};
      if (!parseHexBytes(text, &m, sizeof(m))) {
        return makeError(Code::kDataLoss, "{}: a garbled copy", where);
      }
      if (!copyOwned(m, owns)) {
        return makeError(Code::kDataLoss, "{}: a copy of memory that is not the session's", where);
      }
      r = PHOS_DRIVER(d, GraphAddMemcpyNode)(&node, graph, deps, after.size(), &m, ctx);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      ASSIGN_OR_RETURN(std::string text, field<std::string>(n, "set", where));
      CUDA_MEMSET_NODE_PARAMS m{};
      if (!parseHexBytes(text, &m, sizeof(m))) {
        return makeError(Code::kDataLoss, "{}: a garbled set", where);
      }
      if (!setOwned(m, owns)) {
        return makeError(Code::kDataLoss, "{}: a set of memory that is not the session's", where);
      }
      r = PHOS_DRIVER(d, GraphAddMemsetNode)(&node, graph, deps, after.size(), &m, ctx);
      break;
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      ASSIGN_OR_RETURN(uint64_t eid, field<uint64_t>(n, "event", where));
      auto e = static_cast<CUevent>(scope.handles.resolve(HandleType::kCUevent_st, eid));
      if (e == nullptr) {
        return makeError(Code::kDataLoss, "{}: event {} is not an event of the session", where,
                         hex(eid));
      }
      r = type == CU_GRAPH_NODE_TYPE_EVENT_RECORD
              ? PHOS_DRIVER(d, GraphAddEventRecordNode)(&node, graph, deps, after.size(), e)
              : PHOS_DRIVER(d, GraphAddEventWaitNode)(&node, graph, deps, after.size(), e);
      break;
    }
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      // Made in a graph of its own, which the node clones.
      ASSIGN_OR_RETURN(json inner, field<json>(n, "graph", where));
      constexpr int kMaxChildDepth = 64;
      if (depth >= kMaxChildDepth) {
        return makeError(Code::kDataLoss, "{}: child graphs nested deeper than {}", where,
                         kMaxChildDepth);
      }
      CUgraph child = nullptr;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, GraphCreate)(&child, 0), where));
      auto made = addNodes(scope, child, inner, where + ", child graph", owns, channel, depth + 1);
      if (made.isOk()) {
        r = PHOS_DRIVER(d, GraphAddChildGraphNode)(&node, graph, deps, after.size(), child);
      }
      PHOS_DRIVER(d, GraphDestroy)(child);
      if (!made.isOk()) return made.status();
      break;
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      ASSIGN_OR_RETURN(uint64_t function, field<uint64_t>(n, "function", where));
      ASSIGN_OR_RETURN(uint64_t userData, field<uint64_t>(n, "user_data", where));
      if (function == 0) return makeError(Code::kDataLoss, "{}: a host node of no function", where);
      // The function is the application's, run in the application.
      ASSIGN_OR_RETURN(auto calls, channel());
      const CUDA_HOST_NODE_PARAMS p = hostNode(std::move(calls), function, userData);
      r = PHOS_DRIVER(d, GraphAddHostNode)(&node, graph, deps, after.size(), &p);
      break;
    }
    default:
      return makeError(Code::kDataLoss, "{}: node type {} is not one a checkpoint saves", where,
                       type);
  }
  RETURN_IF_ERROR(driverStatus(r, where));
  return node;
}

Result<std::vector<CUgraphNode>> SessionGraphs::addNodes(const SessionScope& scope, CUgraph graph,
                                                         const json& nodes,
                                                         const std::string& where, const Owns& owns,
                                                         const Channel& channel, int depth) {
  if (!nodes.is_array()) return makeError(Code::kDataLoss, "{}: \"nodes\" is not a list", where);
  std::vector<CUgraphNode> made;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string at = fmt::format("{}, node {}", where, i);
    ASSIGN_OR_RETURN(auto after, field<std::vector<size_t>>(nodes[i], "after", at));
    std::vector<CUgraphNode> deps;
    for (size_t a : after) {
      if (a >= made.size()) {
        return makeError(Code::kDataLoss, "{}: it comes after node {}, not made before it", at, a);
      }
      deps.push_back(made[a]);
    }
    ASSIGN_OR_RETURN(CUgraphNode node,
                     addNode(scope, graph, nodes[i], deps, at, owns, channel, depth));
    made.push_back(node);
  }
  return made;
}

Status SessionGraphs::rebuild(const SessionScope& scope, const json& state,
                              const std::function<Status(uint64_t)>& makeCurrent, const Owns& owns,
                              const Channel& channel) {
  const DriverTable& d = scope.driver;
  for (const json& g : state.value("graphs", json::array())) {
    ASSIGN_OR_RETURN(std::string kind, field<std::string>(g, "kind", "graph"));
    ASSIGN_OR_RETURN(uint64_t id, field<uint64_t>(g, "id", "graph"));
    const std::string where = fmt::format("graph {}", hex(id));
    const HandleType type = kind == "exec" ? HandleType::kCUgraphExec_st : HandleType::kCUgraph_st;
    if ((kind != "graph" && kind != "exec") || HandleTable::typeOf(id) != type) {
      return makeError(Code::kDataLoss, "{}: \"{}\" is not a graph's or executable graph's kind",
                       where, kind);
    }
    ASSIGN_OR_RETURN(uint64_t context, field<uint64_t>(g, "context", where));
    ASSIGN_OR_RETURN(json nodes, field<json>(g, "nodes", where));
    if (context != 0) RETURN_IF_ERROR(makeCurrent(context));
    CUgraph graph = nullptr;
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, GraphCreate)(&graph, 0), where));
    auto built = addNodes(scope, graph, nodes, where, owns, channel, 0);
    if (!built.isOk()) {
      PHOS_DRIVER(d, GraphDestroy)(graph);
      return built.status();
    }
    const std::vector<CUgraphNode>& made = *built;
    // The node ids the application holds are of its graphs' nodes.
    for (size_t i = 0; kind == "graph" && i < nodes.size(); ++i) {
      if (uint64_t nid = nodes[i].value("id", uint64_t{0}); nid != 0) {
        scope.handles.bind(HandleType::kCUgraphNode_st, nid, made[i]);
      }
    }
    if (kind == "graph") {
      scope.handles.bind(HandleType::kCUgraph_st, id, graph);
      noteGraph(id, context);
      continue;
    }
    ASSIGN_OR_RETURN(unsigned long long flags, field<unsigned long long>(g, "flags", where));
    CUgraphExec exec = nullptr;
    CUresult r = PHOS_DRIVER(d, GraphInstantiateWithFlags)(&exec, graph, flags);
    for (size_t i = 0; r == CUDA_SUCCESS && i < nodes.size(); ++i) {
      if (!nodes[i].value("enabled", true)) {
        r = PHOS_DRIVER(d, GraphNodeSetEnabled)(exec, made[i], 0);
      }
    }
    if (r != CUDA_SUCCESS) {
      if (exec != nullptr) PHOS_DRIVER(d, GraphExecDestroy)(exec);
      PHOS_DRIVER(d, GraphDestroy)(graph);
      return driverStatus(r, where);
    }
    scope.handles.bind(HandleType::kCUgraphExec_st, id, exec);
    noteExec(id, context, flags, nodes, made);
    // The graph stays: the executable graph's nodes, which the application
    // names when it sets their parameters, are its nodes.
    execs_[id].restoredFrom = graph;
  }
  return Status::ok();
}

}  // namespace phos::daemon
