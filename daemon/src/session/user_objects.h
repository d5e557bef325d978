// SPDX-License-Identifier: Apache-2.0
// UserObjects: the CUDA user objects of a session (cuUserObjectCreate), whose
// destructor is a function of the application, and who holds references to
// them: the application, graphs and executable graphs.
//
// The driver keeps the counts and tells no one, so phosd keeps them too, from
// the calls it serves: the application's (create, retain, release), a
// graph's (cuGraphRetainUserObject, moved from the application or not,
// cuGraphReleaseUserObject, copied by cuGraphClone, dropped by
// cuGraphDestroy), an executable graph's (the graph's at instantiation,
// dropped with it). When the last reference goes, the driver calls phosd's
// destructor, which runs the application's in the application through the
// session's host-call queue, as host functions run.
//
// A checkpoint saves each object with its counts; a restore creates it with
// all of them, moves each graph's share to that graph, and holds the
// executable graphs' share itself, releasing it when the executable graph is
// destroyed (the restored executable graphs were instantiated without it).
// References phosd cannot follow (a child graph node holding another graph's
// references, an executable graph updated or changed from a graph with
// references) fail the checkpoint, naming the object.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "phos/common/status.h"
#include "session/host_calls.h"
#include "session/session_image.h"

namespace phos::daemon {

class UserObjects {
 public:
  struct Object {
    uint64_t function = 0;  // the application's destructor and its argument
    uint64_t userData = 0;
    uint64_t applicationRefs = 0;
  };
  // The driver's destructor of every user object: `data` is a PendingHostCall
  // (the session's queue, the application's function and argument), freed here.
  static void CUDA_CB destructor(void* data);

  void created(uint64_t id, uint64_t function, uint64_t userData, unsigned refs) {
    objects_[id] = Object{function, userData, refs};
  }
  Object* find(uint64_t id);
  // The application's references (an object no one holds any more leaves
  // `handles`: the driver destroys it).
  void retained(uint64_t id, unsigned count);
  void released(HandleTable& handles, uint64_t id, unsigned count);
  // A graph's references; `moved`: taken from the application's.
  void graphRetained(uint64_t graph, uint64_t id, unsigned count, bool moved);
  void graphReleased(HandleTable& handles, uint64_t graph, uint64_t id, unsigned count);
  // cuGraphClone, and an instantiation: what `from` holds, `to` holds too.
  void copied(uint64_t from, uint64_t to);
  // A child graph node added to `graph` (the driver clones the child, with
  // its references), or an executable graph changed from `graph`: whatever
  // `from` holds is now held where phosd cannot follow.
  void untracked(uint64_t holder, uint64_t from);
  // A graph or executable graph destroyed: its references go with it (and,
  // for one restored, those phosd holds for it: released through `d`).
  void holderGone(const DriverTable& d, HandleTable& handles, uint64_t holder);

  // At a checkpoint: every object with its counts into `state`
  // ("user_objects"); what cannot be saved into `lost`.
  void save(nlohmann::json& state, nlohmann::json& lost) const;
  // At a restore, after the graphs and executable graphs: every object under
  // its id, with its references given back to them.
  Status rebuild(const SessionScope& scope, const nlohmann::json& state,
                 const std::shared_ptr<HostCallChannel>& channel);

 private:
  // Forgets objects no one holds a reference to any more (the driver has
  // run their destructors, or will).
  void dropUnreferenced(HandleTable& handles);

  std::map<uint64_t, Object> objects_;
  // Graph or executable graph id -> object id -> references.
  std::map<uint64_t, std::map<uint64_t, uint64_t>> holders_;
  // Holders whose references phosd cannot follow.
  std::set<uint64_t> untracked_;
  // Executable graphs of a restore: object id -> references phosd holds.
  std::map<uint64_t, std::map<uint64_t, uint64_t>> heldForExecs_;
};

}  // namespace phos::daemon
