// SPDX-License-Identifier: Apache-2.0
// Writes the ring fuzzer's seeds: well-formed requests of the calls clients
// make most, naming the prologue's objects by token, so that the fuzzer starts
// from requests that reach the driver instead of from random bytes.
//
//   make_ring_seeds DIR
#include <cuda.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "ring_requests.h"

using phos::cuda_api::EntryPointId;
using namespace phos::daemon::fuzz;
namespace ipc = phos::ipc;
namespace wire = phos::wire;

namespace {

std::vector<std::pair<std::string, RequestBuilder>> seeds() {
  const uint64_t ctx = token(kContext);
  const uint64_t dptr = token(kDevicePointer);
  const uint64_t stream = token(kStream);
  const uint64_t pinned = token(kPinned);
  std::vector<std::pair<std::string, RequestBuilder>> s;
  auto add = [&](std::string name, EntryPointId id, uint64_t context = token(kContext)) -> RequestBuilder& {
    s.emplace_back(std::move(name), RequestBuilder(id, context));
    return s.back().second;
  };
  add("init", EntryPointId::kCuInit, 0).u32(0);
  add("driver_version", EntryPointId::kCuDriverGetVersion, 0).u8(1);
  add("device_attribute", EntryPointId::kCuDeviceGetAttribute, 0).u8(1).u32(CU_DEVICE_ATTRIBUTE_WARP_SIZE).i32(0);
  add("device_name", EntryPointId::kCuDeviceGetName, 0).message(wire::cuDeviceGetName_Request{true, 64, 0});
  add("ctx_create", EntryPointId::kCuCtxCreate_v2, 0).message(wire::cuCtxCreate_v2_Request{true, 0, 0});
  add("ctx_destroy", EntryPointId::kCuCtxDestroy_v2).u64(ctx);
  add("ctx_destroy_victim", EntryPointId::kCuCtxDestroy_v2).u64(token(kVictimContext));
  add("primary_retain", EntryPointId::kCuDevicePrimaryCtxRetain, 0).message(wire::cuDevicePrimaryCtxRetain_Request{true, 0});
  add("primary_release", EntryPointId::kCuDevicePrimaryCtxRelease_v2, 0).i32(0);
  add("primary_state", EntryPointId::kCuDevicePrimaryCtxGetState, 0).message(wire::cuDevicePrimaryCtxGetState_Request{0, true, true});
  add("ctx_synchronize", EntryPointId::kCuCtxSynchronize);
  add("ctx_get_device", EntryPointId::kCuCtxGetDevice).u8(1);
  add("victim_context_current", EntryPointId::kCuCtxSynchronize, token(kVictimContext));
  add("mem_alloc", EntryPointId::kCuMemAlloc_v2).message(wire::cuMemAlloc_v2_Request{true, 4096});
  add("mem_alloc_pitch", EntryPointId::kCuMemAllocPitch_v2).message(wire::cuMemAllocPitch_v2_Request{true, true, 256, 16, 4});
  add("mem_free", EntryPointId::kCuMemFree_v2).u64(dptr);
  add("mem_free_victim", EntryPointId::kCuMemFree_v2).u64(token(kVictimPointer));
  add("mem_get_info", EntryPointId::kCuMemGetInfo_v2).u8(1).u8(1);
  add("mem_address_range", EntryPointId::kCuMemGetAddressRange_v2).u8(1).u8(1).u64(dptr);
  add("htod", EntryPointId::kCuMemcpyHtoD_v2).u64(dptr).u64(kAppScratch).u64(256);
  add("htod_victim", EntryPointId::kCuMemcpyHtoD_v2).u64(token(kVictimPointer)).u64(kAppScratch).u64(16);
  add("htod_pinned_async", EntryPointId::kCuMemcpyHtoDAsync_v2).u64(dptr).u64(pinned).u64(256).u64(stream);
  add("dtoh", EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(dptr).u64(256);
  add("dtoh_victim", EntryPointId::kCuMemcpyDtoH_v2).u64(kAppScratch).u64(token(kVictimPointer)).u64(16);
  add("dtoh_async", EntryPointId::kCuMemcpyDtoHAsync_v2).u64(kAppScratch).u64(dptr).u64(64).u64(stream);
  add("dtod", EntryPointId::kCuMemcpyDtoD_v2).u64(dptr).u64(dptr).u64(64);
  add("dtod_from_victim", EntryPointId::kCuMemcpyDtoD_v2).u64(dptr).u64(token(kVictimPointer)).u64(64);
  add("memcpy_host_to_host", EntryPointId::kCuMemcpy).u64(kAppScratch).u64(kAppScratch + 4096).u64(4096);
  add("memcpy_pinned", EntryPointId::kCuMemcpyAsync).u64(pinned).u64(dptr).u64(128).u64(stream);
  add("memset8", EntryPointId::kCuMemsetD8_v2).message(wire::cuMemsetD8_v2_Request{dptr, 7, 4096});
  add("memset32_async", EntryPointId::kCuMemsetD32Async).u64(dptr).u32(7).u64(1024).u64(stream);
  add("memset_victim", EntryPointId::kCuMemsetD16_v2).message(wire::cuMemsetD16_v2_Request{token(kVictimPointer), 0, 8});
  add("host_alloc", EntryPointId::kCuMemHostAlloc).u64(8192).u32(0);
  add("free_host", EntryPointId::kCuMemFreeHost).u64(pinned);
  add("host_device_pointer", EntryPointId::kCuMemHostGetDevicePointer_v2).message(wire::cuMemHostGetDevicePointer_v2_Request{true, pinned, 0});
  add("host_flags", EntryPointId::kCuMemHostGetFlags).message(wire::cuMemHostGetFlags_Request{true, pinned});
  add("module_load", EntryPointId::kCuModuleLoadData).message(wire::cuModuleLoadData_Request{true, {kAppPtx, kModulePtx.size()}});
  add("library_load", EntryPointId::kCuLibraryLoadData)
      .message(wire::cuLibraryLoadData_Request{true, {kAppPtx, kModulePtx.size()}, {}, 0});
  // JIT options with logs and outputs, and a link from the same PTX.
  const int32_t jitOptions[] = {CU_JIT_MAX_REGISTERS, CU_JIT_ERROR_LOG_BUFFER,
                                CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_WALL_TIME};
  const uint64_t jitValues[] = {32, 0, 256, 0};
  const ipc::JitOptions jit{ipc::Blob::of(jitOptions, sizeof(jitOptions)),
                            ipc::Blob::of(jitValues, sizeof(jitValues))};
  add("module_load_ex", EntryPointId::kCuModuleLoadDataEx)
      .message(wire::cuModuleLoadDataEx_Request{true, {kAppPtx, kModulePtx.size()}, jit});
  add("link_create", EntryPointId::kCuLinkCreate_v2)
      .message(wire::cuLinkCreate_v2_Request{jit, true});
  add("link_add_data", EntryPointId::kCuLinkAddData_v2)
      .message(wire::cuLinkAddData_v2_Request{
          1, CU_JIT_INPUT_PTX, kAppPtx, kModulePtx.size(), ipc::Text::of("fill.ptx"), {}});
  add("link_complete", EntryPointId::kCuLinkComplete)
      .message(wire::cuLinkComplete_Request{1, kAppScratch, 4096});
  add("module_unload", EntryPointId::kCuModuleUnload).u64(token(kModule));
  add("module_get_function", EntryPointId::kCuModuleGetFunction).u8(1).u64(token(kModule)).text("fill");
  add("module_get_global", EntryPointId::kCuModuleGetGlobal_v2).u8(1).u8(1).u64(token(kModule)).text("counter");
  add("func_get_name", EntryPointId::kCuFuncGetName).u8(1).u64(token(kFunction));
  add("func_attribute", EntryPointId::kCuFuncGetAttribute)
      .u8(1)
      .u32(CU_FUNC_ATTRIBUTE_NUM_REGS)
      .u64(token(kFunction));
  add("func_param_info", EntryPointId::kCuFuncGetParamInfo).u64(token(kFunction)).u64(0).u8(1).u8(1);
  const uint32_t n = 32;
  const uint64_t out = dptr;
  add("launch", EntryPointId::kCuLaunchKernel)
      .u64(token(kFunction))
      .u32(1).u32(1).u32(1).u32(32).u32(1).u32(1).u32(0)
      .u64(stream)
      .u32(2).blob(&out, 8).blob(&n, 4);
  const uint64_t victim = token(kVictimPointer);
  add("launch_victim", EntryPointId::kCuLaunchKernel)
      .u64(token(kFunction))
      .u32(1).u32(1).u32(1).u32(32).u32(1).u32(1).u32(0)
      .u64(0)
      .u32(2).blob(&victim, 8).blob(&n, 4);
  struct {
    uint64_t p;
    uint32_t n;
    uint32_t pad;
  } packed{dptr, n, 0};
  add("launch_extra", EntryPointId::kCuLaunchKernel_ptsz)
      .u64(token(kFunction))
      .u32(1).u32(1).u32(1).u32(32).u32(1).u32(1).u32(0)
      .u64(0)
      .u32(0xfffffffeu).blob(&packed, sizeof(packed));
  add("launch_ex", EntryPointId::kCuLaunchKernelEx)
      .message(ipc::LaunchConfig{1, 1, 1, 32, 1, 1, 0, stream, {}})
      .u64(token(kFunction))
      .u32(2).blob(&out, 8).blob(&n, 4);
  add("launch_cooperative", EntryPointId::kCuLaunchCooperativeKernel)
      .u64(token(kFunction))
      .u32(1).u32(1).u32(1).u32(32).u32(1).u32(1).u32(0)
      .u64(stream)
      .u32(2).blob(&out, 8).blob(&n, 4);
  add("stream_create", EntryPointId::kCuStreamCreate).u8(1).u32(0);
  add("stream_synchronize", EntryPointId::kCuStreamSynchronize).u64(stream);
  add("stream_query_per_thread", EntryPointId::kCuStreamQuery_ptsz).u64(0);
  add("stream_destroy", EntryPointId::kCuStreamDestroy_v2).u64(stream);
  add("stream_get_ctx", EntryPointId::kCuStreamGetCtx).u64(stream).u8(1);
  add("event_create", EntryPointId::kCuEventCreate).u8(1).u32(0);
  add("event_record", EntryPointId::kCuEventRecord).u64(token(kEvent)).u64(stream);
  add("event_synchronize", EntryPointId::kCuEventSynchronize).u64(token(kEvent));
  add("event_destroy", EntryPointId::kCuEventDestroy_v2).u64(token(kEvent));
  add("stream_wait_event", EntryPointId::kCuStreamWaitEvent).u64(stream).u64(token(kEvent)).u32(0);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_ring_seeds DIR\n");
    return 2;
  }
  int written = 0;
  for (const auto& [name, request] : seeds()) {
    std::ofstream out(std::string(argv[1]) + "/" + name + ".req", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(request.bytes().data()), static_cast<std::streamsize>(request.bytes().size()));
    if (!out) {
      std::fprintf(stderr, "make_ring_seeds: cannot write %s/%s.req\n", argv[1], name.c_str());
      return 1;
    }
    ++written;
  }
  std::printf("make_ring_seeds: %d seeds in %s\n", written, argv[1]);
  return 0;
}
