// SPDX-License-Identifier: Apache-2.0
#include "session/streams_and_events.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>
#include <string>
#include <vector>

#include "phos/common/log.h"
#include "session/session_image.h"

namespace phos::daemon {

using json = nlohmann::json;

namespace {

// A stream's attribute values as the driver reports them (the bytes of a
// zeroed union the driver filled, in hex), by attribute id.
// The priority is saved on its own; an attribute the driver will not report
// is no state the program could see.
json streamAttributes(const DriverTable& d, CUstream stream) {
  json attributes = json::object();
  for (CUstreamAttrID id : kStreamAttributes) {
    if (id == CU_LAUNCH_ATTRIBUTE_PRIORITY) continue;
    CUstreamAttrValue v{};
    if (PHOS_DRIVER(d, StreamGetAttribute)(stream, id, &v) != CUDA_SUCCESS) continue;
    attributes[std::to_string(static_cast<int>(id))] = hexBytes(&v, sizeof v);
  }
  return attributes;
}

// A restored stream given the attribute values it had: each that differs
// from the new stream's is set.
Status restoreAttributes(const DriverTable& d, CUstream stream, uint64_t sid, const json& saved) {
  for (const auto& [key, text] : saved.items()) {
    int number = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), number);
    const auto id = static_cast<CUstreamAttrID>(number);
    CUstreamAttrValue want{};
    if (ec != std::errc() || end != key.data() + key.size() || !isStreamAttribute(id) ||
        id == CU_LAUNCH_ATTRIBUTE_PRIORITY || !text.is_string() ||
        !parseHexBytes(text.get<std::string>(), &want, sizeof want)) {
      return makeError(Code::kDataLoss, "stream {}: attribute {} is malformed", hex(sid), key);
    }
    CUstreamAttrValue now{};
    if (PHOS_DRIVER(d, StreamGetAttribute)(stream, id, &now) == CUDA_SUCCESS &&
        std::memcmp(&now, &want, sizeof now) == 0) {
      continue;
    }
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(d, StreamSetAttribute)(stream, id, &want),
                     fmt::format("setting attribute {} of stream {} again", key, hex(sid))));
  }
  return Status::ok();
}

}  // namespace

const EventState* StreamsAndEvents::findEvent(uint64_t id) const {
  auto it = events_.find(id);
  return it == events_.end() ? nullptr : &it->second;
}

CUevent StreamsAndEvents::restoreMark(uint64_t context) const {
  auto it = restoreMarks_.find(context);
  return it == restoreMarks_.end() ? nullptr : it->second;
}

Result<CUstream> StreamsAndEvents::perThreadStream(const DriverTable& driver, uint64_t thread,
                                                   uint64_t context) {
  auto key = std::make_pair(thread, context);
  if (auto it = perThreadStreams_.find(key); it != perThreadStreams_.end()) return it->second;
  CUstream s = nullptr;
  // "The per-thread default stream is not a non-blocking stream and will
  // synchronize with the legacy default stream": a blocking stream (flags 0).
  CUresult r = PHOS_DRIVER(driver, StreamCreate)(&s, CU_STREAM_DEFAULT);
  if (r != CUDA_SUCCESS) {
    return makeError(Code::kResourceExhausted, "cannot create a per-thread stream (CUresult {})",
                     static_cast<int>(r));
  }
  perThreadStreams_[key] = s;
  return s;
}

void StreamsAndEvents::forgetContext(uint64_t context) {
  for (auto s = perThreadStreams_.begin(); s != perThreadStreams_.end();) {
    s = s->first.second == context ? perThreadStreams_.erase(s) : std::next(s);
  }
  restoreMarks_.erase(context);  // destroyed with the context
}

Status StreamsAndEvents::save(SessionScope& scope, json& state) const {
  const DriverTable& d = scope.driver;
  json streams = json::array();
  for (uint64_t id : scope.handles.ids(HandleType::kCUstream_st)) {
    auto* st = static_cast<CUstream>(scope.handles.resolve(HandleType::kCUstream_st, id));
    unsigned flags = 0;
    int priority = 0;
    PHOS_DRIVER(d, StreamGetFlags)(st, &flags);
    PHOS_DRIVER(d, StreamGetPriority)(st, &priority);
    streams.push_back({{"id", id},
                       {"context", scope.contextOf(id)},
                       {"flags", flags},
                       {"priority", priority},
                       {"attributes", streamAttributes(d, st)}});
  }
  state["streams"] = streams;
  return saveEvents(scope, state);
}

namespace {

// Events recorded in a context (CU_EVENT_DEFAULT, recorded and completed)
// at the checkpoint, from which the saved events' times count back; made on
// first use, destroyed with the set.
class CheckpointMarks {
 public:
  CheckpointMarks(const DriverTable& driver, const SessionContexts& contexts)
      : d_(driver), contexts_(contexts) {}
  ~CheckpointMarks() {
    for (const auto& [context, mark] : marks_) {
      if (mark != nullptr) PHOS_DRIVER(d_, EventDestroy_v2)(mark);
    }
  }
  CheckpointMarks(const CheckpointMarks&) = delete;
  CheckpointMarks& operator=(const CheckpointMarks&) = delete;

  // The mark of `context`; null where none could be recorded.
  CUevent of(uint64_t context) {
    auto it = marks_.find(context);
    if (it != marks_.end()) return it->second;
    CUevent mark = nullptr;
    const SessionContext* ctx = contexts_.find(context);
    if (ctx == nullptr || ctx->real == nullptr ||
        PHOS_DRIVER(d_, CtxSetCurrent)(ctx->real) != CUDA_SUCCESS ||
        PHOS_DRIVER(d_, EventCreate)(&mark, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
      return marks_[context] = nullptr;
    }
    if (PHOS_DRIVER(d_, EventRecord)(mark, nullptr) != CUDA_SUCCESS ||
        PHOS_DRIVER(d_, EventSynchronize)(mark) != CUDA_SUCCESS) {
      PHOS_DRIVER(d_, EventDestroy_v2)(mark);
      mark = nullptr;
    }
    return marks_[context] = mark;
  }

 private:
  const DriverTable& d_;
  const SessionContexts& contexts_;
  std::map<uint64_t, CUevent> marks_;  // by context
};

}  // namespace

// Events: flags, and for one recorded (all work has drained: it has
// completed) when, as milliseconds before a mark recorded now in its
// context, so that a restore can answer cuEventElapsedTime between it and
// any other event (docs/checkpoint.md).
Status StreamsAndEvents::saveEvents(SessionScope& scope, json& state) const {
  const DriverTable& d = scope.driver;
  json events = json::array();
  CheckpointMarks marks(d, scope.contexts);
  for (uint64_t id : scope.handles.ids(HandleType::kCUevent_st)) {
    const EventState* e = findEvent(id);
    const uint64_t context = scope.contextOf(id);
    json entry = {{"id", id},
                  {"context", context},
                  {"flags", e != nullptr ? e->flags : 0u},
                  {"recorded", e != nullptr && e->recorded}};
    if (e != nullptr && e->recorded && (e->flags & CU_EVENT_DISABLE_TIMING) == 0) {
      CUevent mark = marks.of(context);
      float before = 0;
      if (mark == nullptr)
        return makeError(Code::kInternal, "cannot time event {} against its context", hex(id));
      if (e->restoredMs) {
        // Restored and not recorded since: its saved time, moved to this mark.
        CUevent restored = restoreMark(context);
        if (restored == nullptr ||
            PHOS_DRIVER(d, EventElapsedTime_v2)(&before, restored, mark) != CUDA_SUCCESS) {
          return makeError(Code::kInternal, "cannot time event {} (restored) against its context",
                           hex(id));
        }
        entry["time_ms"] = *e->restoredMs - before;
      } else {
        auto* real = static_cast<CUevent>(scope.handles.resolve(HandleType::kCUevent_st, id));
        CUresult r = PHOS_DRIVER(d, EventElapsedTime_v2)(&before, real, mark);
        if (r == CUDA_SUCCESS) {
          entry["time_ms"] = -static_cast<double>(before);
        } else {
          // The driver gives it no time (its record failed, say): neither
          // will the restore, which answers as the driver does for an event
          // never recorded.
          log::get("daemon")->info("event {} has no time (CUresult {})", hex(id),
                                   static_cast<int>(r));
        }
      }
    }
    events.push_back(entry);
  }
  saveIntervals(scope, events);
  state["events"] = events;
  return Status::ok();
}

// For a program with few timed events, the driver's own interval between
// each pair, which the restore answers exactly.
void StreamsAndEvents::saveIntervals(SessionScope& scope, json& events) const {
  constexpr size_t kMaxTimedPairs = 64;
  std::vector<json*> timed;
  for (json& e : events) {
    if (e.contains("time_ms")) timed.push_back(&e);
  }
  if (timed.size() > kMaxTimedPairs) return;
  for (size_t i = 0; i < timed.size(); ++i) {
    const uint64_t a = (*timed[i])["id"].get<uint64_t>();
    const EventState* ea = findEvent(a);
    json intervals = json::object();
    for (size_t j = i + 1; j < timed.size(); ++j) {
      const uint64_t b = (*timed[j])["id"].get<uint64_t>();
      const EventState* eb = findEvent(b);
      float ms = 0;
      if (ea->restoredMs && eb->restoredMs) {
        auto saved = ea->restoredIntervals.find(b);
        if (saved == ea->restoredIntervals.end()) continue;  // the times' difference answers
        ms = saved->second;
      } else if (!ea->restoredMs && !eb->restoredMs) {
        auto* ra = static_cast<CUevent>(scope.handles.resolve(HandleType::kCUevent_st, a));
        auto* rb = static_cast<CUevent>(scope.handles.resolve(HandleType::kCUevent_st, b));
        if (PHOS_DRIVER(scope.driver, EventElapsedTime_v2)(&ms, ra, rb) != CUDA_SUCCESS) continue;
      } else {
        continue;
      }
      intervals[std::to_string(b)] = ms;
    }
    if (!intervals.empty()) (*timed[i])["intervals"] = intervals;
  }
}

Status StreamsAndEvents::rebuild(SessionScope& scope, const json& state) {
  const DriverTable& d = scope.driver;
  for (const json& x : state.value("streams", json::array())) {
    ASSIGN_OR_RETURN(uint64_t sid, field<uint64_t>(x, "id", "stream"));
    const uint64_t context = x.value("context", uint64_t{0});
    RETURN_IF_ERROR(scope.contexts.makeCurrent(d, context));
    CUstream stream = nullptr;
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, StreamCreateWithPriority)(
                                     &stream, x.value("flags", 0u), x.value("priority", 0)),
                                 fmt::format("creating stream {} again", hex(sid))));
    scope.handles.bind(HandleType::kCUstream_st, sid, stream);
    scope.contexts.noteObject(sid, context);
    RETURN_IF_ERROR(restoreAttributes(d, stream, sid, x.value("attributes", json::object())));
  }
  for (const json& x : state.value("events", json::array())) {
    ASSIGN_OR_RETURN(uint64_t eid, field<uint64_t>(x, "id", "event"));
    const uint64_t context = x.value("context", uint64_t{0});
    const unsigned flags = x.value("flags", 0u);
    RETURN_IF_ERROR(scope.contexts.makeCurrent(d, context));
    CUevent event = nullptr;
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, EventCreate)(&event, flags),
                                 fmt::format("creating event {} again", hex(eid))));
    scope.handles.bind(HandleType::kCUevent_st, eid, event);
    scope.contexts.noteObject(eid, context);
    EventState& e = events_[eid];
    e.flags = flags;
    e.recorded = x.value("recorded", false);
    if (x.contains("time_ms")) e.restoredMs = x["time_ms"].get<double>();
    const json intervals = x.value("intervals", json::object());
    for (const auto& [other, ms] : intervals.items())
      e.restoredIntervals[std::stoull(other)] = ms.get<float>();
  }
  // Intervals are saved once per pair: the other direction is the negation.
  for (auto& [eid, e] : events_) {
    for (const auto& [other, ms] : e.restoredIntervals) {
      auto peer = events_.find(other);
      if (peer != events_.end()) peer->second.restoredIntervals.try_emplace(eid, -ms);
    }
  }
  // The origin of restored events' times in each context: a mark recorded
  // now (kept until the context goes).
  for (const auto& [vid, ctx] : scope.contexts) {
    if (ctx.real == nullptr) continue;
    RETURN_IF_ERROR(scope.contexts.makeCurrent(d, vid));
    CUevent mark = nullptr;
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, EventCreate)(&mark, CU_EVENT_DEFAULT),
                                 "creating a restore mark"));
    restoreMarks_[vid] = mark;
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(d, EventRecord)(mark, nullptr), "recording a restore mark"));
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(d, EventSynchronize)(mark), "recording a restore mark"));
  }
  return Status::ok();
}

}  // namespace phos::daemon
