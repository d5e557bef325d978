// SPDX-License-Identifier: Apache-2.0
// A session's arrays and texture and surface objects (session_arrays.h): what
// a checkpoint saves of them and how a restore makes them again.
#include "session/session_arrays.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <string>

#include "phos/image/reader.h"
#include "phos/image/writer.h"

namespace phos::daemon {

using json = nlohmann::json;

namespace {

// A restore makes placeholder objects to reach a handle the driver has not
// handed out yet (slots freed before the checkpoint); past this many it gives
// up: the driver does not hand out slots.
constexpr int kMaxPlaceholders = 4096;

uint64_t rowsOf(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return std::max<uint64_t>(d.Height, 1);
}
uint64_t depthOf(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  return std::max<uint64_t>(d.Depth, 1);
}

std::optional<uint64_t> elementBytes(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return std::nullopt;
  }
}

// A whole array to or from host memory, `rowBytes` bytes a row.
Status copyArray(const DriverTable& d, CUarray array, const CUDA_ARRAY3D_DESCRIPTOR& desc,
                 std::byte* host, bool toHost) {
  const uint64_t rowBytes = *arrayBytes(desc) / (rowsOf(desc) * depthOf(desc));
  CUDA_MEMCPY3D m{};
  if (toHost) {
    m.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    m.srcArray = array;
    m.dstMemoryType = CU_MEMORYTYPE_HOST;
    m.dstHost = host;
    m.dstPitch = rowBytes;
    m.dstHeight = rowsOf(desc);
  } else {
    m.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    m.dstArray = array;
    m.srcMemoryType = CU_MEMORYTYPE_HOST;
    m.srcHost = host;
    m.srcPitch = rowBytes;
    m.srcHeight = rowsOf(desc);
  }
  m.WidthInBytes = rowBytes;
  m.Height = rowsOf(desc);
  m.Depth = depthOf(desc);
  return driverStatus(PHOS_DRIVER(d, Memcpy3D_v2)(&m),
                      toHost ? "copying an array out" : "copying an array back");
}

CUresult createObject(const DriverTable& d, const TextureRecord& r,
                      const CUDA_RESOURCE_DESC& resource, unsigned long long* handle) {
  if (r.surface) return PHOS_DRIVER(d, SurfObjectCreate)(handle, &resource);
  return PHOS_DRIVER(d, TexObjectCreate)(handle, &resource, &r.texture,
                                         r.view ? &*r.view : nullptr);
}

CUresult destroyObject(const DriverTable& d, bool surface, uint64_t handle) {
  return surface ? PHOS_DRIVER(d, SurfObjectDestroy)(handle)
                 : PHOS_DRIVER(d, TexObjectDestroy)(handle);
}

template <typename T>
Status parseStruct(const json& entry, const char* name, const std::string& where, T* out) {
  ASSIGN_OR_RETURN(std::string text, field<std::string>(entry, name, where));
  if (!parseHexBytes(text, out, sizeof(T))) {
    return makeError(Code::kDataLoss, "{}: \"{}\" is not {} bytes of hex", where, name, sizeof(T));
  }
  return Status::ok();
}

}  // namespace

std::optional<uint64_t> arrayBytes(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  auto element = elementBytes(d.Format);
  if (!element || d.NumChannels == 0 || d.NumChannels > 4 || d.Width == 0) return std::nullopt;
  return *element * d.NumChannels * d.Width * rowsOf(d) * depthOf(d);
}

CUresult driverResource(const HandleTable& handles, CUDA_RESOURCE_DESC& resource,
                        const std::function<bool(uint64_t, uint64_t)>& owns) {
  switch (resource.resType) {
    case CU_RESOURCE_TYPE_ARRAY: {
      const auto id = reinterpret_cast<uint64_t>(resource.res.array.hArray);
      resource.res.array.hArray =
          static_cast<CUarray>(handles.resolve(HandleType::kCUarray_st, id));
      return resource.res.array.hArray == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_LINEAR:
      return owns(resource.res.linear.devPtr, resource.res.linear.sizeInBytes)
                 ? CUDA_SUCCESS
                 : CUDA_ERROR_INVALID_VALUE;
    case CU_RESOURCE_TYPE_PITCH2D: {
      const auto& p = resource.res.pitch2D;
      // Both at most 2^32 (the driver's limits are far lower): no overflow.
      if (p.pitchInBytes > (1ull << 32) || p.height > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
      return owns(p.devPtr, uint64_t{p.pitchInBytes} * p.height) ? CUDA_SUCCESS
                                                                 : CUDA_ERROR_INVALID_VALUE;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

void SessionArrays::addObject(TextureRecord record) {
  const std::pair key{record.surface, record.handle};
  objects_[key] = std::move(record);
}

bool SessionArrays::forgetObject(bool surface, uint64_t handle) {
  return objects_.erase({surface, handle}) != 0;
}

const TextureRecord* SessionArrays::findObject(bool surface, uint64_t handle) const {
  auto it = objects_.find({surface, handle});
  return it == objects_.end() ? nullptr : &it->second;
}

void SessionArrays::forgetContext(uint64_t context) {
  std::erase_if(arrays_, [&](const auto& a) { return a.second == context; });
  std::erase_if(objects_, [&](const auto& o) { return o.second.context == context; });
}

std::vector<instrument::Buffer> SessionArrays::textureReads() const {
  std::vector<instrument::Buffer> out;
  for (const auto& [key, o] : objects_) {
    if (o.resource.resType == CU_RESOURCE_TYPE_LINEAR) {
      out.push_back({o.resource.res.linear.devPtr, o.resource.res.linear.sizeInBytes});
    } else if (o.resource.resType == CU_RESOURCE_TYPE_PITCH2D) {
      const auto& p = o.resource.res.pitch2D;
      out.push_back({p.devPtr, uint64_t{p.pitchInBytes} * p.height});
    }
  }
  return out;
}

Status SessionArrays::save(const SessionScope& scope, image::ImageWriter& writer, json& state,
                           json& lost) const {
  const DriverTable& d = scope.driver;
  json arrays = json::array();
  for (const auto& [id, context] : arrays_) {
    auto* real = static_cast<CUarray>(scope.handles.resolve(HandleType::kCUarray_st, id));
    if (real == nullptr) continue;
    RETURN_IF_ERROR(scope.contexts.makeCurrent(d, context));
    CUDA_ARRAY3D_DESCRIPTOR desc{};
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, Array3DGetDescriptor_v2)(&desc, real),
                                 "cuArray3DGetDescriptor"));
    const std::optional<uint64_t> bytes = arrayBytes(desc);
    constexpr unsigned kServedFlags = CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST |
                                      CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_TEXTURE_GATHER |
                                      CUDA_ARRAY3D_COLOR_ATTACHMENT;
    if (!bytes || (desc.Flags & ~kServedFlags) != 0) {
      lost.push_back({{"id", id},
                      {"what", fmt::format("an array of format {:#x} with flags {:#x}, which the "
                                           "engine does not save",
                                           static_cast<unsigned>(desc.Format), desc.Flags)}});
      continue;
    }
    std::vector<std::byte> texels(*bytes);
    RETURN_IF_ERROR(copyArray(d, real, desc, texels.data(), true));
    const std::string name = fmt::format("array/{}", hex(id));
    ASSIGN_OR_RETURN(size_t blob, writer.addBlob(name, "array", texels.size(), {{"array", id}}));
    RETURN_IF_ERROR(writer.writeBlob(blob, texels));
    arrays.push_back({{"id", id},
                      {"context", context},
                      {"width", desc.Width},
                      {"height", desc.Height},
                      {"depth", desc.Depth},
                      {"format", static_cast<unsigned>(desc.Format)},
                      {"channels", desc.NumChannels},
                      {"flags", desc.Flags},
                      {"bytes", texels.size()},
                      {"blob", name}});
  }
  json objects = json::array();
  for (const auto& [key, o] : objects_) {
    if (o.resource.resType == CU_RESOURCE_TYPE_ARRAY &&
        !hasArray(reinterpret_cast<uint64_t>(o.resource.res.array.hArray))) {
      lost.push_back({{"id", o.handle},
                      {"what", fmt::format("a {} object over an array the program destroyed",
                                           o.surface ? "surface" : "texture")}});
      continue;
    }
    objects.push_back({{"handle", o.handle},
                       {"surface", o.surface},
                       {"context", o.context},
                       {"resource", hexBytes(&o.resource, sizeof(o.resource))},
                       {"texture", hexBytes(&o.texture, sizeof(o.texture))},
                       {"view", o.view ? json(hexBytes(&*o.view, sizeof(*o.view))) : json()}});
  }
  state["arrays"] = std::move(arrays);
  state["texture_objects"] = std::move(objects);
  return Status::ok();
}

Status SessionArrays::rebuild(SessionScope& scope, const image::ImageReader& reader,
                              const json& state,
                              const std::function<bool(uint64_t, uint64_t)>& owns) {
  const DriverTable& d = scope.driver;
  for (const json& a : state.value("arrays", json::array())) {
    const std::string where = "an array of the image";
    ASSIGN_OR_RETURN(uint64_t id, field<uint64_t>(a, "id", where));
    ASSIGN_OR_RETURN(uint64_t context, field<uint64_t>(a, "context", where));
    if (HandleTable::typeOf(id) != HandleType::kCUarray_st) {
      return makeError(Code::kDataLoss, "{}: {} is not an array's id", where, hex(id));
    }
    CUDA_ARRAY3D_DESCRIPTOR desc{};
    ASSIGN_OR_RETURN(desc.Width, field<size_t>(a, "width", where));
    ASSIGN_OR_RETURN(desc.Height, field<size_t>(a, "height", where));
    ASSIGN_OR_RETURN(desc.Depth, field<size_t>(a, "depth", where));
    ASSIGN_OR_RETURN(unsigned format, field<unsigned>(a, "format", where));
    desc.Format = static_cast<CUarray_format>(format);
    ASSIGN_OR_RETURN(desc.NumChannels, field<unsigned>(a, "channels", where));
    ASSIGN_OR_RETURN(desc.Flags, field<unsigned>(a, "flags", where));
    const std::optional<uint64_t> bytes = arrayBytes(desc);
    ASSIGN_OR_RETURN(size_t blob, blobOf(reader, a, where));
    if (!bytes || reader.manifest().blobs[blob].size != *bytes) {
      return makeError(Code::kDataLoss, "{} ({}): its texels do not fit its descriptor", where,
                       hex(id));
    }
    RETURN_IF_ERROR(scope.contexts.makeCurrent(d, context));
    CUarray real = nullptr;
    RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(d, Array3DCreate_v2)(&real, &desc),
                                 fmt::format("making array {} again", hex(id))));
    scope.handles.bind(HandleType::kCUarray_st, id, real);
    scope.contexts.noteObject(id, context);
    arrays_[id] = context;
    std::vector<std::byte> texels(*bytes);
    RETURN_IF_ERROR(reader.read(blob, 0, texels));
    RETURN_IF_ERROR(copyArray(d, real, desc, texels.data(), false));
  }

  // The objects in the order of their handles, each in its context, with
  // placeholders for slots the job had freed; then the placeholders go.
  std::vector<TextureRecord> records;
  for (const json& o : state.value("texture_objects", json::array())) {
    const std::string where = "a texture or surface object of the image";
    TextureRecord r;
    ASSIGN_OR_RETURN(r.handle, field<uint64_t>(o, "handle", where));
    ASSIGN_OR_RETURN(r.surface, field<bool>(o, "surface", where));
    ASSIGN_OR_RETURN(r.context, field<uint64_t>(o, "context", where));
    RETURN_IF_ERROR(parseStruct(o, "resource", where, &r.resource));
    RETURN_IF_ERROR(parseStruct(o, "texture", where, &r.texture));
    if (o.contains("view") && !o["view"].is_null()) {
      r.view.emplace();
      RETURN_IF_ERROR(parseStruct(o, "view", where, &*r.view));
    }
    records.push_back(r);
  }
  std::sort(records.begin(), records.end(),
            [](const TextureRecord& a, const TextureRecord& b) { return a.handle < b.handle; });
  std::vector<std::pair<bool, uint64_t>> placeholders;
  Status made = Status::ok();
  for (const TextureRecord& r : records) {
    made = makeAgain(scope, r, owns, placeholders);
    if (!made.isOk()) break;
    addObject(r);
  }
  for (const auto& [surface, handle] : placeholders) (void)destroyObject(d, surface, handle);
  return made;
}

Status SessionArrays::makeAgain(const SessionScope& scope, const TextureRecord& r,
                                const std::function<bool(uint64_t, uint64_t)>& owns,
                                std::vector<std::pair<bool, uint64_t>>& placeholders) {
  const DriverTable& d = scope.driver;
  const char* kind = r.surface ? "surface" : "texture";
  CUDA_RESOURCE_DESC resource = r.resource;
  switch (driverResource(scope.handles, resource, owns)) {
    case CUDA_SUCCESS:
      break;
    case CUDA_ERROR_INVALID_HANDLE:
      return makeError(Code::kDataLoss, "{} object {}: its array {} is not in the image", kind,
                       hex(r.handle), hex(reinterpret_cast<uint64_t>(r.resource.res.array.hArray)));
    case CUDA_ERROR_INVALID_VALUE:
      return makeError(Code::kDataLoss, "{} object {}: its memory is not the session's", kind,
                       hex(r.handle));
    default:
      return makeError(Code::kDataLoss, "{} object {}: resource type {} is not served", kind,
                       hex(r.handle), static_cast<int>(r.resource.resType));
  }
  RETURN_IF_ERROR(scope.contexts.makeCurrent(d, r.context));
  for (;;) {
    unsigned long long got = 0;
    RETURN_IF_ERROR(driverStatus(createObject(d, r, resource, &got),
                                 fmt::format("making {} object {} again", kind, hex(r.handle))));
    if (got == r.handle) return Status::ok();
    if (got > r.handle || placeholders.size() >= kMaxPlaceholders) {
      (void)destroyObject(d, r.surface, got);
      return makeError(Code::kFailedPrecondition,
                       "{} object {} came back as {}: this driver hands out other handles than "
                       "the one the job ran on, and its kernels hold the old ones",
                       kind, hex(r.handle), hex(got));
    }
    placeholders.push_back({r.surface, got});
  }
}

}  // namespace phos::daemon
