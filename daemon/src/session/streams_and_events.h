// SPDX-License-Identifier: Apache-2.0
// A session's streams and events beyond the driver's objects: what it knows
// of each event (the driver has no query for an event's flags, nor for
// whether it was recorded), the marks that restored events' times are
// measured from, and the per-thread default streams. StreamsAndEvents saves
// the session's streams and events into a checkpoint's state and rebuilds
// them under the ids the application holds (docs/checkpoint.md: events).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "phos/common/launch_attributes.h"
#include "phos/common/status.h"
#include "session/driver_table.h"

namespace phos::daemon {

struct SessionScope;

// What a session knows of an event beyond the driver's object: its flags (a
// restore creates it again with them), and whether and when it was recorded,
// so that a restored program's cuEventElapsedTime between events recorded
// before the checkpoint gives their interval, and across the checkpoint a
// time, never an error.
struct EventState {
  unsigned flags = 0;
  bool recorded = false;  // cuEventRecord* ran on it
  // Recorded before the checkpoint this session was restored from, and not
  // since: when, in milliseconds after the restore's mark of its context
  // (<= 0; the time the process was frozen counts as none).
  std::optional<double> restoredMs;
  // Restored too: the driver's own cuEventElapsedTime from this event to
  // other restored events, as measured before the checkpoint (exact, where
  // the difference of two times could round differently).
  std::map<uint64_t, float> restoredIntervals;
};

class StreamsAndEvents {
 public:
  EventState& event(uint64_t id) { return events_[id]; }
  const EventState* findEvent(uint64_t id) const;
  // An event the application destroyed, or that died with its context.
  void forgetEvent(uint64_t id) { events_.erase(id); }
  // The event a restore recorded in context `context` when the session came
  // back (the time origin of restored events' times), or null.
  CUevent restoreMark(uint64_t context) const;

  // The per-thread default stream of application thread `thread` in context
  // `context`, which is current (created on first use).
  Result<CUstream> perThreadStream(const DriverTable& driver, uint64_t thread, uint64_t context);
  // Every per-thread default stream the session made.
  std::vector<CUstream> perThreadStreams() const {
    std::vector<CUstream> out;
    for (const auto& [key, stream] : perThreadStreams_) out.push_back(stream);
    return out;
  }
  // Forgets what died with context `context`: its per-thread streams and
  // its restore mark.
  void forgetContext(uint64_t context);

  // The application changed attributes of a default stream (`stream`: 0,
  // CU_STREAM_LEGACY or CU_STREAM_PER_THREAD) as `what` says ("attribute 3
  // set on a default stream"): checkpoints save created streams' attributes
  // only, so they refuse, naming it (unsavedAttributes).
  void noteDefaultStreamAttributes(uint64_t stream, std::string what) {
    defaultStreamAttributes_[stream] = std::move(what);
  }
  // Each default stream whose attributes a checkpoint cannot save, by the
  // application's handle, with the last change.
  const std::map<uint64_t, std::string>& unsavedAttributes() const {
    return defaultStreamAttributes_;
  }
  // Whether `stream` (the application's handle) is a default stream.
  static bool isDefaultStream(uint64_t stream) {
    return stream == 0 || stream == reinterpret_cast<uint64_t>(CU_STREAM_LEGACY) ||
           stream == reinterpret_cast<uint64_t>(CU_STREAM_PER_THREAD);
  }

  // At a checkpoint, the contexts drained: every stream of the scope's
  // handles with its flags, priority and attributes, and every event with its flags and,
  // recorded, its time before a mark recorded now in its context (with the
  // driver's own intervals between pairs of them, for a program with few),
  // into `state` ("streams", "events").
  Status save(SessionScope& scope, nlohmann::json& state) const;
  // At a restore, the contexts rebuilt: the streams and events of `state`
  // (save()'s) created again under their ids, and a mark recorded in each
  // context, from which restored events' times count.
  Status rebuild(SessionScope& scope, const nlohmann::json& state);

 private:
  Status saveEvents(SessionScope& scope, nlohmann::json& state) const;
  // The driver's intervals between pairs of timed events of `events`.
  void saveIntervals(SessionScope& scope, nlohmann::json& events) const;

  std::map<uint64_t, EventState> events_;     // by event id
  std::map<uint64_t, CUevent> restoreMarks_;  // by context id (restored sessions)
  std::map<std::pair<uint64_t, uint64_t>, CUstream> perThreadStreams_;  // by (thread, context)
  std::map<uint64_t, std::string> defaultStreamAttributes_;  // by the application's handle
};

}  // namespace phos::daemon
