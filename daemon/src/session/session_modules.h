// SPDX-License-Identifier: Apache-2.0
// A session's modules and libraries with their globals, and the functions and
// kernels the application took from them. SessionModules keeps each module's
// image as the application gave it, saves every module-scope variable's bytes
// (each context's copy), and at a restore loads each module again in the
// job's order (Load) and finds its functions and kernels again with the
// attributes the program set (bindFunctions). docs/checkpoint.md says why
// the globals must come back at the same addresses.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "session/device_memory.h"
#include "session/driver_table.h"

namespace phos::daemon {

struct SessionScope;
class LaunchValidator;

// What re-creates a module or library at restore: its original image (as the
// application gave it) and the context it was loaded in (0 for a library,
// which belongs to no context).
struct ModuleRecord {
  bool library = false;
  std::vector<char> image;
  uint64_t context = 0;
  // DeviceMemory::takeOrder() when it was loaded (0: not yet numbered).
  uint64_t order = 0;
  // Its module-scope variables (moduleGlobalNames), listed once, before the
  // first checkpoint's pause (Session::listModuleGlobals): for a large module
  // that means parsing all its PTX. Null until then.
  std::shared_ptr<const std::vector<std::string>> globalNames;
  // The JIT options it was loaded with that shape its code
  // (DriverJitOptions::codeShaping): a restore loads it with them again.
  std::vector<std::pair<int32_t, uint64_t>> jitOptions;
};

class SessionModules {
 public:
  // Module or library `id` as the application loaded it (numbered already).
  void record(uint64_t id, ModuleRecord record) { records_[id] = std::move(record); }
  void forget(uint64_t id) { records_.erase(id); }
  size_t count() const { return records_.size(); }
  // The images of the modules whose globals are not listed yet (copies).
  std::vector<std::pair<uint64_t, std::vector<char>>> unlisted() const;
  // The list of module `id`'s globals, if the module is still loaded.
  void setGlobalNames(uint64_t id, std::shared_ptr<const std::vector<std::string>> names);
  // The program set an attribute of library kernel `kernel` used as a
  // function of context `context`: that function's own attributes are state
  // a checkpoint saves.
  void noteKernelFunction(uint64_t kernel, uint64_t context) {
    kernelFunctions_[kernel].insert(context);
  }
  // Forgets what died with context `context`.
  void forgetContext(uint64_t context);

  // Where a checkpoint puts what it saves of the modules.
  struct SaveTo {
    image::ImageWriter& writer;
    std::vector<DeviceBuffer>& copies;  // each global's bytes, after the allocations'
    const DeviceMemory& memory;         // to tell which globals the application took
    int deviceCount;
    nlohmann::json& lost;  // objects that cannot be saved, {"id", "what"}
  };
  // At a checkpoint (the contexts drained): every module and library with
  // its image and its globals, the modules of libraries, the functions and
  // kernels with their attributes, into `state` ("modules",
  // "library_modules", "functions", "kernels").
  Status save(SessionScope& scope, const SaveTo& to, nlohmann::json& state) const;

  // At a restore: the modules of `state` (save()'s), loaded again in the
  // job's order with their globals where they were, and then their
  // functions and kernels.
  class Load {
   public:
    // Bytes of the image to copy to the device once every module is loaded.
    struct Copy {
      uint64_t context;
      int device;
      size_t blob;
      CUdeviceptr address;
    };
    Load(SessionModules& modules, SessionScope& scope, const image::ImageReader& reader,
         LaunchValidator& validator, DeviceMemory& memory, std::vector<Copy>& copies);
    // Loads module `m` of the state's "modules" again; `before(order)` first
    // maps the allocations the job made before it.
    Status module(const nlohmann::json& m, const std::function<Status(uint64_t order)>& before);

   private:
    Status globals(const nlohmann::json& m, uint64_t mid, bool library, void* real,
                   uint64_t context);
    uint64_t holderOf(const nlohmann::json& g, bool library, uint64_t context) const;

    SessionModules& modules_;
    SessionScope& scope_;
    const DriverTable& d_;
    const image::ImageReader& reader_;
    LaunchValidator& validator_;
    DeviceMemory& memory_;
    std::vector<Copy>& copies_;
  };
  // After Load: the modules of libraries, the kernels and the functions of
  // `state`, bound to their ids, their attributes set again.
  Status bindFunctions(SessionScope& scope, const nlohmann::json& state, int deviceCount);

 private:
  class Saver;  // session_modules.cpp

  std::map<uint64_t, ModuleRecord> records_;  // by module or library id
  std::map<uint64_t, std::set<uint64_t>>
      kernelFunctions_;  // kernel id -> contexts (noteKernelFunction)
};

}  // namespace phos::daemon
