// SPDX-License-Identifier: Apache-2.0
#include "session/link_states.h"

#include <fmt/format.h>

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "session/session_image.h"

namespace phos::daemon {
namespace {

using json = nlohmann::json;
using Pairs = std::vector<std::pair<int32_t, uint64_t>>;

Result<Pairs> pairsOf(const json& j, const char* what, uint64_t id) {
  try {
    return j.get<Pairs>();
  } catch (const json::exception& e) {
    return makeError(Code::kDataLoss, "the {} of linker state {} are malformed: {}", what, hex(id),
                     e.what());
  }
}

}  // namespace

Status LinkStates::save(image::ImageWriter& writer, json& state) const {
  json links = json::array();
  for (const auto& [id, link] : links_) {
    json inputs = json::array();
    for (size_t i = 0; i < link.inputs.size(); ++i) {
      const LinkState::Input& in = link.inputs[i];
      std::string name = fmt::format("link/{}/{}", hex(id), i);
      ASSIGN_OR_RETURN(size_t blob,
                       writer.addBlob(name, "link-input", in.bytes.size(), {{"link", id}}));
      RETURN_IF_ERROR(writer.writeBlob(blob, std::as_bytes(std::span(in.bytes))));
      inputs.push_back(
          {{"type", in.type}, {"name", in.name}, {"blob", name}, {"options", in.options}});
    }
    links.push_back({{"id", id},
                     {"context", link.context},
                     {"options", link.options->given()},
                     {"inputs", std::move(inputs)},
                     {"completed", link.completed}});
  }
  state["links"] = std::move(links);
  return Status::ok();
}

Status LinkStates::rebuild(SessionScope& scope, const image::ImageReader& reader,
                           const json& state) {
  const DriverTable& d = scope.driver;
  for (const json& l : state.value("links", json::array())) {
    const uint64_t id = l.value("id", uint64_t{0});
    if (id == 0) return makeError(Code::kDataLoss, "a linker state of the image has no id");
    // A link compiles for the device of the context current when it was made.
    RETURN_IF_ERROR(scope.contexts.makeCurrent(d, l.value("context", uint64_t{0})));
    ASSIGN_OR_RETURN(Pairs given, pairsOf(l.value("options", json::array()), "options", id));
    LinkState link;
    link.context = l.value("context", uint64_t{0});
    link.options = std::make_unique<DriverJitOptions>();
    if (!link.options->set(given))
      return makeError(Code::kDataLoss, "linker state {}: options phosd refuses", hex(id));
    RETURN_IF_ERROR(
        driverStatus(PHOS_DRIVER(d, LinkCreate_v2)(link.options->count(), link.options->options(),
                                                   link.options->values(), &link.real),
                     fmt::format("making linker state {} again", hex(id))));
    links_[id] = std::move(link);  // destroyed with the others if what follows fails
    LinkState& made = links_[id];
    scope.handles.bind(HandleType::kCUlinkState_st, id, made.real);
    for (const json& in : l.value("inputs", json::array())) {
      auto blob = reader.findBlob(in.value("blob", std::string()));
      if (!blob)
        return makeError(Code::kDataLoss, "an input of linker state {} is missing", hex(id));
      LinkState::Input input{in.value("type", 0),
                             in.value("name", std::string()),
                             std::vector<char>(reader.manifest().blobs[*blob].size + 1, '\0'),
                             {}};
      RETURN_IF_ERROR(reader.read(
          *blob, 0, std::as_writable_bytes(std::span(input.bytes).first(input.bytes.size() - 1))));
      ASSIGN_OR_RETURN(input.options,
                       pairsOf(in.value("options", json::array()), "input options", id));
      DriverJitOptions options;
      if (!options.set(input.options)) {
        return makeError(Code::kDataLoss, "an input of linker state {}: options phosd refuses",
                         hex(id));
      }
      RETURN_IF_ERROR(driverStatus(
          PHOS_DRIVER(d, LinkAddData_v2)(made.real, static_cast<CUjitInputType>(input.type),
                                         input.bytes.data(), input.bytes.size() - 1,
                                         input.name.empty() ? nullptr : input.name.c_str(),
                                         options.count(), options.options(), options.values()),
          fmt::format("adding an input to linker state {} again", hex(id))));
      input.bytes.pop_back();
      made.inputs.push_back(std::move(input));
    }
    if (l.value("completed", false)) {
      void* image = nullptr;
      size_t size = 0;
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, LinkComplete)(made.real, &image, &size),
                                   fmt::format("completing linker state {} again", hex(id))));
      made.completed = true;
    }
  }
  return Status::ok();
}

void LinkStates::destroyAll(const DriverTable& driver) {
  for (auto& [id, link] : links_) PHOS_DRIVER(driver, LinkDestroy)(link.real);
  links_.clear();
}

}  // namespace phos::daemon
