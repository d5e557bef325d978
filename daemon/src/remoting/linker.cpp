// SPDX-License-Identifier: Apache-2.0
// Server hooks for the linker (cuLink*): the driver links in phosd, with the
// program's JIT options (their logs in phosd's buffers, returned with every
// call on the state); inputs are read from the application, and the linked
// image is written into a buffer the shim reserved in it (docs/remoting.md).
#include <cuda.h>

#include <memory>
#include <vector>

#include "phos/common/log.h"
#include "phos/cuda_api/api_table.h"
#include "phos/cuda_api/server_hooks.h"
#include "remoting/application_image.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

using cuda_api::EntryPointId;

// A driver without the linker (none that CUDA 13 supports) refuses it whole.
bool hasLinker(const DriverTable& d) {
  return d.has(EntryPointId::kCuLinkCreate_v2) && d.has(EntryPointId::kCuLinkAddData_v2) &&
         d.has(EntryPointId::kCuLinkComplete) && d.has(EntryPointId::kCuLinkDestroy);
}

LinkState* linkOf(ServerCall& c, const Handle<CUlinkState>& state) {
  auto it = c.session().links().find(state.id);
  return it == c.session().links().end() ? nullptr : &it->second;
}

CUresult addInput(ServerCall& c, const Handle<CUlinkState>& state, CUjitInputType type,
                  const std::vector<char>& input, size_t bytes, const char* name,
                  DriverJitOptions& options, ipc::JitOutputs* link) {
  LinkState* s = linkOf(c, state);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = PHOS_DRIVER(c.driverTable(), LinkAddData_v2)(
      s->real, type, const_cast<char*>(input.data()), bytes, name, options.count(),
      options.options(), options.values());
  *link = s->options->outputs();
  // Kept for a checkpoint: a restore adds it again.
  if (r == CUDA_SUCCESS) {
    s->inputs.push_back(
        {static_cast<int32_t>(type), name != nullptr ? name : "",
         std::vector<char>(input.begin(), input.begin() + static_cast<std::ptrdiff_t>(bytes)),
         options.given()});
  }
  return r;
}

}  // namespace

// The state keeps the options (the driver writes their logs until the state
// is destroyed); this call's reply has nothing to report yet.
CUresult cuLinkCreate(ServerCall& c, DriverJitOptions& options, uint64_t* stateOut) {
  if (!hasLinker(c.driverTable())) return CUDA_ERROR_NOT_SUPPORTED;
  if (stateOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto kept = std::make_unique<DriverJitOptions>(std::move(options));
  CUlinkState real = nullptr;
  CUresult r = PHOS_DRIVER(c.driverTable(), LinkCreate_v2)(kept->count(), kept->options(),
                                                           kept->values(), &real);
  if (r != CUDA_SUCCESS) return r;
  *stateOut = c.exportHandle(HandleType::kCUlinkState_st, r, real);
  LinkState& link = c.session().links()[*stateOut];
  link.real = real;
  link.context = c.session().currentContext();
  link.options = std::move(kept);
  return CUDA_SUCCESS;
}

CUresult cuLinkAddData(ServerCall& c, Handle<CUlinkState> state, CUjitInputType type, uint64_t data,
                       size_t size, const char* name, DriverJitOptions& options,
                       ipc::JitOutputs* link) {
  std::vector<char> input;
  if (CUresult r = readImage(c, {data, size}, &input); r != CUDA_SUCCESS) return r;
  return addInput(c, state, type, input, size, name, options, link);
}

// The shim read the file (phosd may not see the application's files).
CUresult cuLinkAddFile(ServerCall& c, Handle<CUlinkState> state, CUjitInputType type,
                       const ipc::ImageRef& path, DriverJitOptions& options,
                       ipc::JitOutputs* link) {
  std::vector<char> input;
  if (CUresult r = readImage(c, path, &input); r != CUDA_SUCCESS) return r;
  return addInput(c, state, type, input, path.bytes, nullptr, options, link);
}

// "cubinOut ... is owned by state": phosd copies it into the application,
// into the `capacity` bytes the shim reserved at `buffer`.
CUresult cuLinkComplete(ServerCall& c, Handle<CUlinkState> state, uint64_t buffer,
                        uint64_t capacity, uint64_t* bytes, ipc::JitOutputs* link) {
  LinkState* s = linkOf(c, state);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  void* image = nullptr;
  size_t size = 0;
  CUresult r = PHOS_DRIVER(c.driverTable(), LinkComplete)(s->real, &image, &size);
  *link = s->options->outputs();
  if (r != CUDA_SUCCESS) return r;
  if (image == nullptr || size > capacity) {
    log::get("daemon")->warn(
        "session {}: the linked image ({} bytes) is larger than the {} bytes the shim reserved",
        c.session().id(), size, capacity);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (Status st = c.session().writeApplication(buffer, image, size); !st.isOk()) {
    log::get("daemon")->warn("session {}: the linked image: {}", c.session().id(), st.message());
    return CUDA_ERROR_INVALID_VALUE;
  }
  *bytes = size;
  s->completed = true;
  return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(ServerCall& c, Handle<CUlinkState> state) {
  LinkState* s = linkOf(c, state);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = PHOS_DRIVER(c.driverTable(), LinkDestroy)(s->real);
  c.session().links().erase(state.id);
  c.session().handles().erase(state.id);
  return r;
}

}  // namespace phos::daemon::hooks
