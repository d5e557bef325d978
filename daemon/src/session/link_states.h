// SPDX-License-Identifier: Apache-2.0
// The linker states a session's program holds (cuLinkCreate until
// cuLinkDestroy; remoting/linker.cpp serves them): a checkpoint saves each
// as the options it was created with and the inputs added to it, and a
// restore makes it again by adding them again, in order, and completing it
// if the program had (the image it got then lives in its own memory).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "session/driver_jit_options.h"
#include "session/driver_table.h"

namespace phos::daemon {

struct SessionScope;

// A linker state the program holds (cuLinkCreate until cuLinkDestroy): the
// driver writes the logs of the options it was created with until then.
struct LinkState {
  CUlinkState real = nullptr;
  uint64_t context = 0;  // current when it was made: the device it links for
  std::unique_ptr<DriverJitOptions> options;
  // What was added, in order: a restore makes the state again from it.
  struct Input {
    int32_t type = 0;  // CUjitInputType
    std::string name;
    std::vector<char> bytes;
    std::vector<std::pair<int32_t, uint64_t>> options;  // DriverJitOptions::given()
  };
  std::vector<Input> inputs;
  bool completed = false;
};

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
