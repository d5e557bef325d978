// SPDX-License-Identifier: Apache-2.0
// A session's user objects and their references (user_objects.h).
#include "session/user_objects.h"

#include <fmt/format.h>

#include <string>

namespace phos::daemon {

using json = nlohmann::json;

void CUDA_CB UserObjects::destructor(void* data) {
  std::unique_ptr<PendingHostCall> call(static_cast<PendingHostCall*>(data));
  call->channel->run(ipc::kHostFunction, call->function, call->userData, 0, CUDA_SUCCESS);
}

UserObjects::Object* UserObjects::find(uint64_t id) {
  auto it = objects_.find(id);
  return it == objects_.end() ? nullptr : &it->second;
}

void UserObjects::retained(uint64_t id, unsigned count) {
  if (Object* o = find(id)) o->applicationRefs += count;
}

void UserObjects::released(HandleTable& handles, uint64_t id, unsigned count) {
  if (Object* o = find(id)) o->applicationRefs -= std::min<uint64_t>(o->applicationRefs, count);
  dropUnreferenced(handles);
}

void UserObjects::graphRetained(uint64_t graph, uint64_t id, unsigned count, bool moved) {
  Object* o = find(id);
  if (o == nullptr) return;
  holders_[graph][id] += count;
  if (moved) o->applicationRefs -= std::min<uint64_t>(o->applicationRefs, count);
}

void UserObjects::graphReleased(HandleTable& handles, uint64_t graph, uint64_t id, unsigned count) {
  auto holder = holders_.find(graph);
  if (holder != holders_.end()) {
    auto it = holder->second.find(id);
    if (it != holder->second.end()) {
      it->second -= std::min<uint64_t>(it->second, count);
      if (it->second == 0) holder->second.erase(it);
    }
  }
  dropUnreferenced(handles);
}

void UserObjects::copied(uint64_t from, uint64_t to) {
  auto it = holders_.find(from);
  if (it != holders_.end() && !it->second.empty()) holders_[to] = it->second;
  if (untracked_.count(from) != 0) untracked_.insert(to);
}

void UserObjects::untracked(uint64_t holder, uint64_t from) {
  auto it = holders_.find(from);
  if ((it != holders_.end() && !it->second.empty()) || untracked_.count(from) != 0) {
    untracked_.insert(holder);
  }
}

void UserObjects::holderGone(const DriverTable& d, HandleTable& handles, uint64_t holder) {
  if (holders_.erase(holder) == 0 && untracked_.count(holder) == 0) return;
  untracked_.erase(holder);
  // The references phosd holds for a restored executable graph go with it.
  if (auto held = heldForExecs_.find(holder); held != heldForExecs_.end()) {
    for (const auto& [id, count] : held->second) {
      auto* real = static_cast<CUuserObject>(handles.resolve(HandleType::kCUuserObject_st, id));
      if (real != nullptr) {
        (void)PHOS_DRIVER(d, UserObjectRelease)(real, static_cast<unsigned>(count));
      }
    }
    heldForExecs_.erase(held);
  }
  dropUnreferenced(handles);
}

void UserObjects::dropUnreferenced(HandleTable& handles) {
  for (auto it = objects_.begin(); it != objects_.end();) {
    uint64_t refs = it->second.applicationRefs;
    for (const auto& [holder, counts] : holders_) {
      if (auto c = counts.find(it->first); c != counts.end()) refs += c->second;
    }
    if (refs != 0) {
      ++it;
      continue;
    }
    handles.erase(it->first);
    it = objects_.erase(it);
  }
}

void UserObjects::save(json& state, json& lost) const {
  json out = json::array();
  for (const auto& [id, o] : objects_) {
    json holders = json::array();
    for (const auto& [holder, counts] : holders_) {
      if (auto c = counts.find(id); c != counts.end()) {
        holders.push_back({{"holder", holder}, {"refs", c->second}});
      }
    }
    out.push_back({{"id", id},
                   {"function", o.function},
                   {"user_data", o.userData},
                   {"application_refs", o.applicationRefs},
                   {"holders", std::move(holders)}});
  }
  if (!objects_.empty()) {
    for (uint64_t holder : untracked_) {
      lost.push_back(
          {{"id", holder},
           {"what",
            "a graph or executable graph holding user objects' references through a child "
            "graph node or an update, which phosd does not follow"}});
    }
  }
  state["user_objects"] = std::move(out);
}

Status UserObjects::rebuild(const SessionScope& scope, const json& state,
                            const std::shared_ptr<HostCallChannel>& channel) {
  const DriverTable& d = scope.driver;
  for (const json& o : state.value("user_objects", json::array())) {
    const std::string where = "a user object of the image";
    ASSIGN_OR_RETURN(uint64_t id, field<uint64_t>(o, "id", where));
    if (HandleTable::typeOf(id) != HandleType::kCUuserObject_st) {
      return makeError(Code::kDataLoss, "{}: {} is not a user object's id", where, hex(id));
    }
    Object object;
    ASSIGN_OR_RETURN(object.function, field<uint64_t>(o, "function", where));
    ASSIGN_OR_RETURN(object.userData, field<uint64_t>(o, "user_data", where));
    ASSIGN_OR_RETURN(object.applicationRefs, field<uint64_t>(o, "application_refs", where));
    ASSIGN_OR_RETURN(json holders, field<json>(o, "holders", where));
    if (!holders.is_array()) {
      return makeError(Code::kDataLoss, "{}: \"holders\" is not a list", where);
    }
    uint64_t total = object.applicationRefs;
    std::map<uint64_t, uint64_t> shares;
    for (const json& h : holders) {
      ASSIGN_OR_RETURN(uint64_t holder, field<uint64_t>(h, "holder", where));
      ASSIGN_OR_RETURN(uint64_t refs, field<uint64_t>(h, "refs", where));
      const HandleType type = HandleTable::typeOf(holder);
      if ((type != HandleType::kCUgraph_st && type != HandleType::kCUgraphExec_st) ||
          scope.handles.resolve(type, holder) == nullptr || refs == 0) {
        return makeError(Code::kDataLoss, "{} ({}): holder {} is no graph of the session", where,
                         hex(id), hex(holder));
      }
      shares[holder] = refs;
      total += refs;
    }
    if (total == 0 || total > (1u << 30) || object.function == 0) {
      return makeError(Code::kDataLoss, "{} ({}): {} references and destructor {}", where, hex(id),
                       total, hex(object.function));
    }
    auto pending = std::make_unique<PendingHostCall>();
    pending->channel = channel;
    pending->function = object.function;
    pending->userData = object.userData;
    CUuserObject real = nullptr;
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, UserObjectCreate)(
                                     &real, pending.get(), destructor, static_cast<unsigned>(total),
                                     CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
                                 fmt::format("making user object {} again", hex(id))));
    (void)pending.release();  // the driver's now: freed by destructor()
    scope.handles.bind(HandleType::kCUuserObject_st, id, real);
    objects_[id] = object;
    for (const auto& [holder, refs] : shares) {
      holders_[holder][id] = refs;
      if (HandleTable::typeOf(holder) == HandleType::kCUgraphExec_st) {
        heldForExecs_[holder][id] = refs;
        continue;
      }
      auto* graph = static_cast<CUgraph>(scope.handles.resolve(HandleType::kCUgraph_st, holder));
      RETURN_IF_ERROR(driverStatus(
          PHOS_DRIVER(d, GraphRetainUserObject)(graph, real, static_cast<unsigned>(refs),
                                                CU_GRAPH_USER_OBJECT_MOVE),
          fmt::format("giving graph {} its references to user object {}", hex(holder), hex(id))));
    }
  }
  return Status::ok();
}

}  // namespace phos::daemon
