// SPDX-License-Identifier: Apache-2.0
// Server hooks for CUDA arrays and texture and surface objects: arrays are
// the session's objects under virtual ids; texture and surface objects keep
// the driver's handles, which kernels read from their arguments, and are
// recorded for a restore to make again (session/session_arrays.h). Copies of
// arrays are in copies.cpp.
#include <cuda.h>

#include "phos/common/log.h"
#include "phos/cuda_api/server_hooks.h"
#include "session/session.h"
#include "session/session_arrays.h"

namespace phos::daemon::hooks {
namespace {

CUresult createArray(ServerCall& c, uint64_t* handle, CUresult r, CUarray real) {
  if (r != CUDA_SUCCESS) return r;
  *handle = c.exportHandle(HandleType::kCUarray_st, r, real);
  c.session().arrays().addArray(*handle, c.session().currentContext());
  return r;
}

CUresult createObject(ServerCall& c, bool surface, unsigned long long* handle,
                      const CUDA_RESOURCE_DESC* resource, const CUDA_TEXTURE_DESC* texture,
                      const CUDA_RESOURCE_VIEW_DESC* view) {
  if (handle == nullptr || resource == nullptr || (!surface && texture == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUDA_RESOURCE_DESC driverSide = *resource;
  Session& s = c.session();
  auto owns = [&](uint64_t p, uint64_t bytes) { return bytes == 0 || s.ownsRange(p, bytes); };
  if (CUresult r = driverResource(s.handles(), driverSide, owns); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_NOT_SUPPORTED) {
      log::get("daemon")->info("session {}: mipmapped arrays are not served", s.id());
    }
    return r;
  }
  const DriverTable& d = c.driverTable();
  CUresult r = surface ? PHOS_DRIVER(d, SurfObjectCreate)(handle, &driverSide)
                       : PHOS_DRIVER(d, TexObjectCreate)(handle, &driverSide, texture, view);
  if (r != CUDA_SUCCESS) return r;
  TextureRecord record;
  record.handle = *handle;
  record.surface = surface;
  record.context = c.session().currentContext();
  record.resource = *resource;
  if (texture != nullptr) record.texture = *texture;
  if (view != nullptr) record.view = *view;
  c.session().arrays().addObject(record);
  return r;
}

CUresult destroyObject(ServerCall& c, bool surface, uint64_t handle) {
  // Only the session's own: a value it never had names nothing of it.
  if (c.session().arrays().findObject(surface, handle) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const DriverTable& d = c.driverTable();
  CUresult r = surface ? PHOS_DRIVER(d, SurfObjectDestroy)(handle)
                       : PHOS_DRIVER(d, TexObjectDestroy)(handle);
  if (r == CUDA_SUCCESS) c.session().arrays().forgetObject(surface, handle);
  return r;
}

// The driver's description, with the array as the application knows it.
CUresult resourceOf(ServerCall& c, bool surface, CUDA_RESOURCE_DESC* out, uint64_t handle) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (c.session().arrays().findObject(surface, handle) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const DriverTable& d = c.driverTable();
  CUresult r = surface ? PHOS_DRIVER(d, SurfObjectGetResourceDesc)(out, handle)
                       : PHOS_DRIVER(d, TexObjectGetResourceDesc)(out, handle);
  if (r == CUDA_SUCCESS && out->resType == CU_RESOURCE_TYPE_ARRAY) {
    out->res.array.hArray =
        reinterpret_cast<CUarray>(c.session().handles().idOf(out->res.array.hArray));
  }
  return r;
}

}  // namespace

CUresult cuArrayCreate(ServerCall& c, uint64_t* handle, const CUDA_ARRAY_DESCRIPTOR* descriptor) {
  if (handle == nullptr || descriptor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUarray real = nullptr;
  const CUresult r = PHOS_DRIVER(c.driverTable(), ArrayCreate_v2)(&real, descriptor);
  return createArray(c, handle, r, real);
}

CUresult cuArray3DCreate(ServerCall& c, uint64_t* handle,
                         const CUDA_ARRAY3D_DESCRIPTOR* descriptor) {
  if (handle == nullptr || descriptor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Sparse arrays are mapped with cuMemMapArrayAsync, which is not served.
  if ((descriptor->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0) {
    log::get("daemon")->info("session {}: sparse arrays are not served", c.session().id());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUarray real = nullptr;
  const CUresult r = PHOS_DRIVER(c.driverTable(), Array3DCreate_v2)(&real, descriptor);
  return createArray(c, handle, r, real);
}

CUresult cuArrayDestroy(ServerCall& c, Handle<CUarray> array) {
  CUresult r = PHOS_DRIVER(c.driverTable(), ArrayDestroy)(array.real);
  if (r == CUDA_SUCCESS) {
    c.session().arrays().forgetArray(array.id);
    c.session().forgetHandle(array.id);
  }
  return r;
}

CUresult cuTexObjectCreate(ServerCall& c, CUtexObject* handle, const CUDA_RESOURCE_DESC* resource,
                           const CUDA_TEXTURE_DESC* texture, const CUDA_RESOURCE_VIEW_DESC* view) {
  return createObject(c, false, handle, resource, texture, view);
}

CUresult cuTexObjectDestroy(ServerCall& c, CUtexObject handle) {
  return destroyObject(c, false, handle);
}

CUresult cuTexObjectGetResourceDesc(ServerCall& c, CUDA_RESOURCE_DESC* out, CUtexObject handle) {
  return resourceOf(c, false, out, handle);
}

CUresult cuSurfObjectCreate(ServerCall& c, CUsurfObject* handle,
                            const CUDA_RESOURCE_DESC* resource) {
  return createObject(c, true, handle, resource, nullptr, nullptr);
}

CUresult cuSurfObjectDestroy(ServerCall& c, CUsurfObject handle) {
  return destroyObject(c, true, handle);
}

CUresult cuSurfObjectGetResourceDesc(ServerCall& c, CUDA_RESOURCE_DESC* out, CUsurfObject handle) {
  return resourceOf(c, true, out, handle);
}

}  // namespace phos::daemon::hooks
