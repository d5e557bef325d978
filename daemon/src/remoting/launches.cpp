// SPDX-License-Identifier: Apache-2.0
// Server hooks for kernel launches: parameters checked against the kernel's
// signature before the driver reads them, and, while a protocol or
// `phos run --validate` needs it, the launch speculated and run as its
// validator twin (docs/speculation.md).
#include <cuda.h>

#include <cstring>
#include <span>
#include <vector>

#include "phos/cuda_api/api_table.h"
#include "phos/cuda_api/server_hooks.h"
#include "remoting/kernel_params.h"
#include "session/launch_validator.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

using cuda_api::EntryPointId;

// Counts a served launch; the first launch of a function also records its
// name, which `phos ps` lists.
void noteLaunch(ServerCall& c, uint64_t fid, CUfunction f) {
  Session& s = c.session();
  const char* name = nullptr;
  if (s.functionName(fid) == nullptr && c.driverTable().has(EntryPointId::kCuFuncGetName) &&
      PHOS_DRIVER(c.driverTable(), FuncGetName)(&name, f) == CUDA_SUCCESS && name != nullptr) {
    s.setFunctionName(fid, name);
  }
  s.noteLaunch(fid);
}

// Launches `f` through `launch`; while the session validates, its twin runs
// instead, checked against the buffers speculation expects it to touch
// (docs/speculation.md). Without a twin the original runs.
CUresult validatedLaunch(ServerCall& c, CUfunction f, KernelParams& params, CUstream stream,
                         const instrument::LaunchShape& shape, const LaunchValidator::LaunchFn& launch) {
  LaunchValidator& validator = c.session().validator();
  Session& session = c.session();
  const bool validating = validator.mode() != ValidationMode::kOff;
  if (!validating && !session.hasAccessGate()) return launch(f, params.kernelParams(), params.extraArgs());
  // Captured, the kernel does not run now: nothing to let through a gate,
  // and its twin must not become the graph's node. A graph's launch passes
  // the gate (graphs.cpp).
  if (c.capturing(stream)) return launch(f, params.kernelParams(), params.extraArgs());
  auto sets = validator.speculate(f, params.kernelParams(), params.extraBuffer(),
                                  [&](uint64_t address) { return session.bufferAt(address); }, &shape);
  CallAccess access{sets.reads, sets.writes, true, sets.incomplete,
                    !validating || !validator.hasTwin(f)};
  // Device memory behind the session's texture objects: the kernel may hold
  // any of their handles (session_arrays.h).
  for (const instrument::Buffer& b : session.arrays().textureReads()) access.reads.push_back(b);
  session.passGate(access);
  // A call that may touch anything passes a protocol's gate only once every
  // buffer is safe from it (copied, loaded): its twin would report what
  // speculation cannot name, and nothing needs checking.
  if (!validating) return launch(f, params.kernelParams(), params.extraArgs());
  if (session.hasAccessGate() && access.mayWriteAnything()) {
    validator.noteLaunch(false, sets.incomplete);
    return launch(f, params.kernelParams(), params.extraArgs());
  }
  CUresult r = validator.launchTwin(f, params.kernelParams(), params.extraBuffer(), stream, sets, launch);
  if (r == CUDA_SUCCESS) {
    validator.noteLaunch(true, sets.incomplete);
    return r;
  }
  // No twin, or the twin could not run (no device memory for its range
  // table or report, a launch the driver refused for the twin alone): the
  // original runs, unchecked, and the protocol treats it as writing
  // anything. A checkpoint never makes the application's launch fail; if
  // the launch itself is wrong, the original's answer says so.
  if (r != CUDA_ERROR_NOT_FOUND && session.hasAccessGate()) {
    CallAccess unchecked = access;
    unchecked.unchecked = true;
    session.passGate(unchecked);
  }
  validator.noteLaunch(false, sets.incomplete);
  return launch(f, params.kernelParams(), params.extraArgs());
}

template <typename Launch>
CUresult launchChecked(ServerCall& c, Handle<CUfunction> f, CUstream stream, const instrument::LaunchShape& shape,
                       const ipc::KernelArgs& args, Launch&& driverLaunch) {
  if (f.real == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  KernelParams params(args);
  if (CUresult r = checkParams(c, f.real, params); r != CUDA_SUCCESS) return r;
  CUresult r = validatedLaunch(c, f.real, params, stream, shape, driverLaunch);
  if (r == CUDA_SUCCESS) noteLaunch(c, f.id, f.real);
  return r;
}

// A CUlaunchConfig for the driver from its wire form (cuLaunchKernelEx and
// the cluster occupancy queries): the stream resolved, the attributes copied.
struct DriverLaunchConfig {
  CUlaunchConfig config{};
  std::vector<CUlaunchAttribute> attrs;

  CUresult decode(ServerCall& c, const ipc::LaunchConfig& wire) {
    if (wire.attributes.size() % sizeof(CUlaunchAttribute) != 0 ||
        !wire.attributes.copyTo(&attrs, wire.attributes.size() / sizeof(CUlaunchAttribute))) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    for (const auto& a : attrs) {
      // Attributes naming events would carry the application's virtual event ids.
      if (a.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT || a.id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) {
        return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
    config.gridDimX = wire.gridDimX;
    config.gridDimY = wire.gridDimY;
    config.gridDimZ = wire.gridDimZ;
    config.blockDimX = wire.blockDimX;
    config.blockDimY = wire.blockDimY;
    config.blockDimZ = wire.blockDimZ;
    config.sharedMemBytes = wire.sharedMemBytes;
    if (!c.resolveStream(wire.stream, c.perThreadEntry(), &config.hStream)) return CUDA_ERROR_INVALID_HANDLE;
    config.attrs = attrs.empty() ? nullptr : attrs.data();
    config.numAttrs = static_cast<unsigned>(attrs.size());
    return CUDA_SUCCESS;
  }
};

}  // namespace

CUresult cuLaunchKernel(ServerCall& c, Handle<CUfunction> f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared, Handle<CUstream> stream,
                        const ipc::KernelArgs& kernelParams) {
  return launchChecked(c, f, stream.real, {{gx, gy, gz}, {bx, by, bz}}, kernelParams,
                       [&](CUfunction fn, void** params, void** extra) {
    return PHOS_DRIVER(c.driverTable(), LaunchKernel)(fn, gx, gy, gz, bx, by, bz, shared, stream.real, params, extra);
  });
}

CUresult cuLaunchCooperativeKernel(ServerCall& c, Handle<CUfunction> f, unsigned int gx, unsigned int gy,
                                   unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                                   unsigned int shared, Handle<CUstream> stream, const ipc::KernelArgs& kernelParams) {
  return launchChecked(c, f, stream.real, {{gx, gy, gz}, {bx, by, bz}}, kernelParams,
                       [&](CUfunction fn, void** params, void**) {
    return PHOS_DRIVER(c.driverTable(), LaunchCooperativeKernel)(fn, gx, gy, gz, bx, by, bz, shared, stream.real,
                                                                 params);
  });
}

CUresult cuLaunchKernelEx(ServerCall& c, const ipc::LaunchConfig& wire, Handle<CUfunction> f,
                          const ipc::KernelArgs& kernelParams) {
  DriverLaunchConfig config;
  if (CUresult r = config.decode(c, wire); r != CUDA_SUCCESS) return r;
  if (!c.driverTable().has(EntryPointId::kCuLaunchKernelEx)) return CUDA_ERROR_NOT_SUPPORTED;
  const CUlaunchConfig& l = config.config;
  const instrument::LaunchShape shape{{l.gridDimX, l.gridDimY, l.gridDimZ}, {l.blockDimX, l.blockDimY, l.blockDimZ}};
  return launchChecked(c, f, l.hStream, shape, kernelParams, [&](CUfunction fn, void** params, void** extra) {
    return PHOS_DRIVER(c.driverTable(), LaunchKernelEx)(&config.config, fn, params, extra);
  });
}

CUresult cuOccupancyMaxActiveClusters(ServerCall& c, int* numClusters, Handle<CUfunction> f,
                                      const ipc::LaunchConfig& wire) {
  DriverLaunchConfig config;
  if (CUresult r = config.decode(c, wire); r != CUDA_SUCCESS) return r;
  if (!c.driverTable().has(EntryPointId::kCuOccupancyMaxActiveClusters)) return CUDA_ERROR_NOT_SUPPORTED;
  return PHOS_DRIVER(c.driverTable(), OccupancyMaxActiveClusters)(numClusters, f.real, &config.config);
}

CUresult cuOccupancyMaxPotentialClusterSize(ServerCall& c, int* clusterSize, Handle<CUfunction> f,
                                            const ipc::LaunchConfig& wire) {
  DriverLaunchConfig config;
  if (CUresult r = config.decode(c, wire); r != CUDA_SUCCESS) return r;
  if (!c.driverTable().has(EntryPointId::kCuOccupancyMaxPotentialClusterSize)) return CUDA_ERROR_NOT_SUPPORTED;
  return PHOS_DRIVER(c.driverTable(), OccupancyMaxPotentialClusterSize)(clusterSize, f.real, &config.config);
}

}  // namespace phos::daemon::hooks
