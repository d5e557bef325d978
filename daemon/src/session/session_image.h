// SPDX-License-Identifier: Apache-2.0
// What a session's objects look like in an image's state: the helpers that
// Session::describe (session_save.cpp) and Session::rebuildFrom
// (session_rebuild.cpp) share with the engine. The state is JSON from the
// manifest, which its writer controls: every field read names what is missing.
#pragma once

#include <cuda.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "session/driver_table.h"
#include "session/handle_table.h"
#include "session/session_contexts.h"

namespace phos::daemon {

inline std::string hex(uint64_t v) {
  return fmt::format("{:#x}", v);
}

// `bytes` bytes at `p` as lowercase hex, two digits each (a driver value
// saved as it is, such as a stream attribute's union).
inline std::string hexBytes(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  return fmt::format("{:02x}", fmt::join(b, b + bytes, ""));
}
// hexBytes()'s text back into `bytes` bytes at `out`; false if it is not
// exactly that many.
inline bool parseHexBytes(std::string_view text, void* out, size_t bytes) {
  if (text.size() != 2 * bytes) return false;
  auto* o = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < bytes; ++i) {
    auto [end, ec] = std::from_chars(text.data() + 2 * i, text.data() + 2 * i + 2, o[i], 16);
    if (ec != std::errc() || end != text.data() + 2 * i + 2) return false;
  }
  return true;
}

// What a domain of a session's state (its contexts, memory, modules, streams
// and events, pinned memory) works with when it saves itself into an image's
// state or rebuilds itself from one: the driver, the handles the application
// holds, and the session's contexts, in one of which every object lives.
struct SessionScope {
  const DriverTable& driver;
  HandleTable& handles;
  SessionContexts& contexts;
  uint64_t currentContext = 0;  // the context of an object whose own is not known
  uint64_t contextOf(uint64_t handle) const { return contexts.ownerOf(handle, currentContext); }
};

// The context limits an application can set (cuCtxSetLimit); the others can
// only be queried.
inline constexpr CUlimit kSettableLimits[] = {CU_LIMIT_STACK_SIZE,
                                              CU_LIMIT_PRINTF_FIFO_SIZE,
                                              CU_LIMIT_MALLOC_HEAP_SIZE,
                                              CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
                                              CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
                                              CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
                                              CU_LIMIT_PERSISTING_L2_CACHE_SIZE};

// A field of the image's state, of type T; kDataLoss naming it and `where`
// when it is missing or of another type.
template <typename T>
Result<T> field(const nlohmann::json& object, const char* name, const std::string& where) {
  if (!object.is_object() || !object.contains(name)) {
    return makeError(Code::kDataLoss, "{}: \"{}\" is missing", where, name);
  }
  try {
    return object.at(name).get<T>();
  } catch (const nlohmann::json::exception&) {
    return makeError(Code::kDataLoss, "{}: \"{}\" has the wrong type", where, name);
  }
}

// The blob `entry` names (its "blob" field), which the image must hold.
inline Result<size_t> blobOf(const image::ImageReader& reader, const nlohmann::json& entry,
                             const std::string& where) {
  ASSIGN_OR_RETURN(std::string name, field<std::string>(entry, "blob", where));
  auto blob = reader.findBlob(name);
  if (!blob) return makeError(Code::kDataLoss, "{}: blob {} is not in the image", where, name);
  return *blob;
}

// Function attributes a program may set (cuFuncSetAttribute,
// cuKernelSetAttribute), by the name an image stores them under. A checkpoint
// reads each back from the driver; a restore sets the ones that differ from a
// freshly loaded function's. (Cache configuration is a preference the driver
// gives no way to read, and does not change what a kernel computes.)
inline constexpr std::pair<const char*, CUfunction_attribute> kSettableFunctionAttributes[] = {
    {"max_dynamic_shared_size_bytes", CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES},
    {"preferred_shared_memory_carveout", CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT},
    {"required_cluster_width", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH},
    {"required_cluster_height", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT},
    {"required_cluster_depth", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH},
    {"non_portable_cluster_size_allowed", CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED},
    {"cluster_scheduling_policy_preference",
     CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE},
};

// `read(attribute, &value)` for every settable attribute, as an object of
// the ones the driver answers.
template <typename Read>
nlohmann::json settableAttributes(Read read) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, attribute] : kSettableFunctionAttributes) {
    int value = 0;
    if (read(attribute, &value) == CUDA_SUCCESS) out[name] = value;
  }
  return out;
}

// Sets again, through `read` and `write`, every saved attribute whose value
// differs from the driver's now; fails naming the first it cannot set.
template <typename Read, typename Write>
Status restoreAttributes(const nlohmann::json& saved, std::string_view what, Read read,
                         Write write) {
  for (const auto& [name, attribute] : kSettableFunctionAttributes) {
    if (!saved.contains(name) || !saved[name].is_number_integer()) continue;
    const int want = saved[name].template get<int>();
    int now = 0;
    if (read(attribute, &now) == CUDA_SUCCESS && now == want) continue;
    if (CUresult r = write(attribute, want); r != CUDA_SUCCESS) {
      return makeError(Code::kFailedPrecondition,
                       "{}: attribute {} cannot be set to {} again (CUresult {})", what, name, want,
                       static_cast<int>(r));
    }
  }
  return Status::ok();
}

}  // namespace phos::daemon
