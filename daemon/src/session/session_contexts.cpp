// SPDX-License-Identifier: Apache-2.0
#include "session/session_contexts.h"

#include <fmt/format.h>

#include <string>

#include "phos/common/log.h"
#include "session/context_pool.h"
#include "session/handle_table.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

const SessionContext* SessionContexts::find(uint64_t id) const {
  auto it = byId_.find(id);
  return it == byId_.end() ? nullptr : &it->second;
}

std::vector<uint64_t> SessionContexts::remove(uint64_t id) {
  std::vector<uint64_t> objects;
  for (auto h = objects_.begin(); h != objects_.end();) {
    if (h->second == id) {
      objects.push_back(h->first);
      h = objects_.erase(h);
    } else {
      ++h;
    }
  }
  auto it = byId_.find(id);
  if (it == byId_.end()) return objects;
  if (!it->second.primary) destroyed_.insert(id);
  byId_.erase(it);
  return objects;
}

CUcontext SessionContexts::on(int device, uint64_t preferred) const {
  if (const SessionContext* c = find(preferred); c != nullptr && c->device == device)
    return c->real;
  for (const auto& [vid, ctx] : byId_) {
    if (ctx.real != nullptr && ctx.device == device) return ctx.real;
  }
  return nullptr;
}

std::map<int, CUcontext> SessionContexts::byDevice() const {
  std::map<int, CUcontext> found;
  for (const auto& [vid, ctx] : byId_) {
    if (ctx.real != nullptr) found.try_emplace(ctx.device, ctx.real);
  }
  return found;
}

int SessionContexts::deviceOf(uint64_t id, int fallback) const {
  const SessionContext* c = find(id);
  return c != nullptr ? c->device : fallback;
}

uint64_t SessionContexts::ownerOf(uint64_t handle, uint64_t fallback) const {
  auto it = objects_.find(handle);
  return it != objects_.end() ? it->second : fallback;
}

Status SessionContexts::drain(const DriverTable& driver) const {
  Status first = Status::ok();
  for (const auto& [vid, ctx] : byId_) {
    if (ctx.real == nullptr) continue;
    CUresult r = PHOS_DRIVER(driver, CtxSetCurrent)(ctx.real);
    if (r == CUDA_SUCCESS) r = PHOS_DRIVER(driver, CtxSynchronize)();
    if (r != CUDA_SUCCESS && first.isOk()) {
      first =
          makeError(Code::kFailedPrecondition,
                    "context {} of the session failed (CUresult {}): its memory cannot be trusted",
                    hex(vid), static_cast<int>(r));
    }
  }
  return first;
}

Result<CUcontext> SessionContexts::real(uint64_t id) const {
  const SessionContext* c = find(id);
  if (c == nullptr) {
    return makeError(Code::kDataLoss, "the image names context {}, which it does not hold",
                     hex(id));
  }
  return c->real;
}

Status SessionContexts::makeCurrent(const DriverTable& driver, uint64_t id) const {
  ASSIGN_OR_RETURN(CUcontext context, real(id));
  return driverStatus(PHOS_DRIVER(driver, CtxSetCurrent)(context), "making a context current");
}

Status SessionContexts::save(const DriverTable& driver, json& state) const {
  json contexts = json::array();
  for (const auto& [vid, ctx] : byId_) {
    if (ctx.real == nullptr) continue;
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(driver, CtxSetCurrent)(ctx.real), "making a context current"));
    unsigned flags = 0;
    PHOS_DRIVER(driver, CtxGetFlags)(&flags);
    // Limits and cache preference the application may have set.
    json limits = json::object();
    for (CUlimit limit : kSettableLimits) {
      size_t value = 0;
      if (PHOS_DRIVER(driver, CtxGetLimit)(&value, limit) == CUDA_SUCCESS)
        limits[std::to_string(limit)] = value;
    }
    CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;
    PHOS_DRIVER(driver, CtxGetCacheConfig)(&cache);
    contexts.push_back({{"id", vid},
                        {"device", ctx.device},
                        {"primary", ctx.primary},
                        {"flags", flags},
                        {"limits", limits},
                        {"cache_config", static_cast<int>(cache)}});
  }
  state["contexts"] = contexts;
  json primaries = json::array();
  for (const auto& [device, p] : primaries_) {
    primaries.push_back({{"device", device}, {"id", p.id}, {"refs", p.refs}, {"flags", p.flags}});
  }
  state["primaries"] = primaries;
  state["destroyed_contexts"] = destroyed_;
  return Status::ok();
}

namespace {

// Sets again the limits of `saved` that differ from the fresh context's
// value: some cannot be set once the context ran work, and most were never
// changed. The context is current.
Status restoreLimits(const DriverTable& driver, const json& saved, uint64_t vid) {
  for (const auto& [limit, value] : saved.items()) {
    const CUlimit which = static_cast<CUlimit>(std::stoi(limit));
    size_t now = 0;
    if (PHOS_DRIVER(driver, CtxGetLimit)(&now, which) != CUDA_SUCCESS || now == value.get<size_t>())
      continue;
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(driver, CtxSetLimit)(which, value.get<size_t>()),
                     fmt::format("setting limit {} of context {} again", limit, hex(vid))));
    log::get("daemon")->debug(
        "restore: limit {} of context {} set to {} (the fresh context had {})", limit, hex(vid),
        value.get<size_t>(), now);
  }
  return Status::ok();
}

}  // namespace

Status SessionContexts::rebuild(const DriverTable& driver, ContextPool& pool, HandleTable& handles,
                                const json& state, const std::function<void(CUcontext)>& adopted) {
  for (const json& c : state.value("contexts", json::array())) {
    ASSIGN_OR_RETURN(uint64_t vid, field<uint64_t>(c, "id", "context"));
    ASSIGN_OR_RETURN(int device, field<int>(c, "device", "context"));
    if (device < 0 || device >= pool.deviceCount()) {
      return makeError(Code::kFailedPrecondition,
                       "the image's context {} is on device {}; this host has {}", hex(vid), device,
                       pool.deviceCount());
    }
    ASSIGN_OR_RETURN(CUcontext real, pool.take(device, c.value("flags", 0u)));
    byId_[vid] = {real, device, c.value("primary", false)};
    handles.bind(HandleType::kCUctx_st, vid, real);
    adopted(real);
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(driver, CtxSetCurrent)(real), "making a context current"));
    RETURN_IF_ERROR(restoreLimits(driver, c.value("limits", json::object()), vid));
    if (c.contains("cache_config")) {
      PHOS_DRIVER(driver, CtxSetCacheConfig)(static_cast<CUfunc_cache>(c.value("cache_config", 0)));
    }
  }
  for (const json& p : state.value("primaries", json::array())) {
    PrimaryContext& pc = primaries_[p.value("device", 0)];
    pc.id = p.value("id", uint64_t{0});
    pc.refs = p.value("refs", 0u);
    pc.flags = p.value("flags", 0u);
  }
  for (const json& c : state.value("destroyed_contexts", json::array()))
    destroyed_.insert(c.get<uint64_t>());
  return Status::ok();
}

}  // namespace phos::daemon
