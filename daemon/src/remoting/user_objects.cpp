// SPDX-License-Identifier: Apache-2.0
// Server hooks for user objects: the driver's object runs phosd's destructor,
// which runs the application's through the session's host-call queue; the
// session counts every reference (session/user_objects.h).
#include <cuda.h>

#include <memory>
#include <span>

#include "phos/common/log.h"
#include "phos/cuda_api/server_hooks.h"
#include "session/host_calls.h"
#include "session/session.h"

namespace phos::daemon::hooks {

namespace {

// The driver's object of the application's id; null for an id that names no
// object the session knows (destroyed with its last reference, or never one).
Handle<CUuserObject> userObject(ServerCall& c, CUuserObject id) {
  const auto value = reinterpret_cast<uint64_t>(id);
  return {value, static_cast<CUuserObject>(
                     c.session().handles().resolve(HandleType::kCUuserObject_st, value))};
}

}  // namespace

CUresult cuUserObjectCreate(ServerCall& c, uint64_t* object, uint64_t ptr, uint64_t destroy,
                            unsigned int initialRefcount, unsigned int flags, std::string* queue) {
  // "flags: Currently it is required to pass CU_USER_OBJECT_NO_DESTRUCTOR_SYNC".
  if (object == nullptr || destroy == 0 || initialRefcount == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto channel = c.session().hostCalls();
  if (!channel.isOk()) {
    log::get("daemon")->warn("session {}: {}", c.session().id(), channel.status().message());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *queue = (*channel)->path();
  auto pending = std::make_unique<PendingHostCall>();
  pending->channel = *channel;
  pending->function = destroy;
  pending->userData = ptr;
  CUuserObject real = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), UserObjectCreate)(
      &real, pending.get(), UserObjects::destructor, initialRefcount, flags);
  if (r != CUDA_SUCCESS) return r;
  (void)pending.release();  // the driver's now: freed by the destructor
  *object = c.exportHandle(HandleType::kCUuserObject_st, r, real);
  c.session().userObjects().created(*object, destroy, ptr, initialRefcount);
  return r;
}

// "CUDA_ERROR_INVALID_VALUE" for an object that is gone, as for the others.
CUresult cuUserObjectRetain(ServerCall& c, CUuserObject id, unsigned int count) {
  const Handle<CUuserObject> object = userObject(c, id);
  if (object.real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_DRIVER(c.driverTable(), UserObjectRetain)(object.real, count);
  if (r == CUDA_SUCCESS) c.session().userObjects().retained(object.id, count);
  return r;
}

CUresult cuUserObjectRelease(ServerCall& c, CUuserObject id, unsigned int count) {
  const Handle<CUuserObject> object = userObject(c, id);
  if (object.real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_DRIVER(c.driverTable(), UserObjectRelease)(object.real, count);
  if (r == CUDA_SUCCESS) {
    c.session().userObjects().released(c.session().handles(), object.id, count);
  }
  return r;
}

CUresult cuGraphRetainUserObject(ServerCall& c, Handle<CUgraph> graph, CUuserObject id,
                                 unsigned int count, unsigned int flags) {
  const Handle<CUuserObject> object = userObject(c, id);
  if (object.real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r =
      PHOS_DRIVER(c.driverTable(), GraphRetainUserObject)(graph.real, object.real, count, flags);
  if (r == CUDA_SUCCESS) {
    c.session().userObjects().graphRetained(graph.id, object.id, count,
                                            (flags & CU_GRAPH_USER_OBJECT_MOVE) != 0);
  }
  return r;
}

CUresult cuGraphReleaseUserObject(ServerCall& c, Handle<CUgraph> graph, CUuserObject id,
                                  unsigned int count) {
  const Handle<CUuserObject> object = userObject(c, id);
  if (object.real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphReleaseUserObject)(graph.real, object.real, count);
  if (r == CUDA_SUCCESS) {
    c.session().userObjects().graphReleased(c.session().handles(), graph.id, object.id, count);
  }
  return r;
}

// The node holds a clone of the child graph, with the child's references.
CUresult cuGraphAddChildGraphNode(ServerCall& c, uint64_t* node, Handle<CUgraph> graph,
                                  std::span<const CUgraphNode> dependencies, size_t numDependencies,
                                  Handle<CUgraph> childGraph) {
  CUgraphNode real = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), GraphAddChildGraphNode)(
      node != nullptr ? &real : nullptr, graph.real,
      dependencies.empty() ? nullptr : dependencies.data(), numDependencies, childGraph.real);
  if (node != nullptr) *node = c.exportHandle(HandleType::kCUgraphNode_st, r, real);
  if (r == CUDA_SUCCESS) c.session().userObjects().untracked(graph.id, childGraph.id);
  return r;
}

}  // namespace phos::daemon::hooks
