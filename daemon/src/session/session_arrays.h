// SPDX-License-Identifier: Apache-2.0
// SessionArrays: a session's CUDA arrays and the texture and surface objects
// its kernels read and write through (remoting/arrays.cpp serves the calls).
//
// An array is an object like a stream: the application holds a virtual id,
// and a checkpoint saves its descriptor and its texels, which are opaque on a
// GPU (copied out with cuMemcpy3D), at the cut, while every context is
// drained.
//
// A texture or surface object is different: it reaches kernels as a 64-bit
// value inside their arguments, where phosd cannot tell it from any other
// number. So the application holds the driver's own handle, and a restore
// makes the objects again in the order of their handles, in a fresh worker,
// expecting the driver to hand out the same values (descriptor slots: vgpu
// gives the lowest free one). Each is checked; one that comes back under
// another value fails the restore, naming it, rather than leave the kernels
// holding a handle that names nothing or another object.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "phos/common/status.h"
#include "phos/instrument/speculation.h"
#include "session/session_image.h"

namespace phos::image {
class ImageReader;
class ImageWriter;
}  // namespace phos::image

namespace phos::daemon {

// A texture or surface object as the application made it: its resource with
// the array as the application's id (or device memory at its address).
struct TextureRecord {
  uint64_t handle = 0;  // the driver's, which the application's kernels hold
  bool surface = false;
  uint64_t context = 0;
  CUDA_RESOURCE_DESC resource{};
  CUDA_TEXTURE_DESC texture{};
  std::optional<CUDA_RESOURCE_VIEW_DESC> view;
};

class SessionArrays {
 public:
  // An array the application created (its id) in `context`.
  void addArray(uint64_t id, uint64_t context) { arrays_[id] = context; }
  void forgetArray(uint64_t id) { arrays_.erase(id); }
  bool hasArray(uint64_t id) const { return arrays_.count(id) != 0; }

  void addObject(TextureRecord record);
  // False if the session has no such object.
  bool forgetObject(bool surface, uint64_t handle);
  const TextureRecord* findObject(bool surface, uint64_t handle) const;
  // The objects and arrays of a destroyed context.
  void forgetContext(uint64_t context);

  // The device memory the session's texture objects read (linear and
  // pitched resources): any launch may read it through a handle it holds.
  std::vector<instrument::Buffer> textureReads() const;

  // At a checkpoint, every context drained: each array's descriptor and
  // texels (a blob each), each object's description, into `state`
  // ("arrays", "texture_objects"); what cannot be saved into `lost`.
  Status save(const SessionScope& scope, image::ImageWriter& writer, nlohmann::json& state,
              nlohmann::json& lost) const;
  // At a restore, after device memory and contexts: the arrays under the ids
  // the application holds, with their texels, then the objects under the
  // handles its kernels hold. `owns(address, bytes)`: the range is the
  // session's device memory (a linear resource must be).
  Status rebuild(SessionScope& scope, const image::ImageReader& reader, const nlohmann::json& state,
                 const std::function<bool(uint64_t, uint64_t)>& owns);

 private:
  // One object of the image made again under `r.handle` in its context;
  // the slots below it that the driver hands out first go to `placeholders`.
  Status makeAgain(const SessionScope& scope, const TextureRecord& r,
                   const std::function<bool(uint64_t, uint64_t)>& owns,
                   std::vector<std::pair<bool, uint64_t>>& placeholders);

  std::map<uint64_t, uint64_t> arrays_;  // id -> context
  // By (surface, handle).
  std::map<std::pair<bool, uint64_t>, TextureRecord> objects_;
};

// The bytes of an array of `d`'s extent and format; nullopt for a format
// whose texels are not whole bytes per element (block compressed, planar).
std::optional<uint64_t> arrayBytes(const CUDA_ARRAY3D_DESCRIPTOR& d);

// A texture's or surface's resource as the driver takes it, in place: the
// application's array id made the driver's array (CUDA_ERROR_INVALID_HANDLE
// for an id that names no array in `handles`), linear and pitched memory
// checked with `owns(address, bytes)` (CUDA_ERROR_INVALID_VALUE when it is
// not the session's: a restore could not give it back), mipmapped arrays
// CUDA_ERROR_NOT_SUPPORTED. The hooks and the restore both use it.
CUresult driverResource(const HandleTable& handles, CUDA_RESOURCE_DESC& resource,
                        const std::function<bool(uint64_t, uint64_t)>& owns);

}  // namespace phos::daemon
