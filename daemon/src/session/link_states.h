// SPDX-License-Identifier: Apache-2.0
// The linker states a session's program holds (cuLinkCreate until
// cuLinkDestroy; remoting/linker.cpp serves them): a checkpoint saves each
// as the options it was created with and the inputs added to it, and a
// restore makes it again by adding them again, in order, and completing it
// if the program had (the image it got then lives in its own memory).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>

#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "session/driver_jit_options.h"
#include "session/driver_table.h"

namespace phos::daemon {

struct SessionScope;

class LinkStates {
 public:
  std::map<uint64_t, LinkState>& all() { return links_; }
  // Into `state["links"]`, each input a "link-input" blob.
  Status save(image::ImageWriter& writer, nlohmann::json& state) const;
  // From save()'s, under the ids the program holds.
  Status rebuild(SessionScope& scope, const image::ImageReader& reader,
                 const nlohmann::json& state);
  // Destroys every state (the session ends).
  void destroyAll(const DriverTable& driver);

 private:
  std::map<uint64_t, LinkState> links_;  // by id
};

}  // namespace phos::daemon
