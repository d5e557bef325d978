// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for phosd's request decoders: every input is one request
// (CallHeader and arguments) as a client could write it into its ring, served
// by a fresh session on vgpu. The daemon must answer it without crashing or
// hanging, never touch memory of another session (a victim session's device
// memory is checked after every input), and leave nothing of an ended session
// registered with the driver.
//
// Each input gets a new session with the same prologue (a context, device
// memory, a module and its kernel, a stream, pinned memory, an event), so the
// ids a request names mean the same thing every time; seeds name them by the
// tokens of ring_requests.h. The application is a child process that only
// holds kAppBase..: phosd reads and writes it with process_vm_readv/writev as
// it would a real client, and a stray write cannot land in the fuzzer.
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "session/context_pool.h"
#include "session/driver_table.h"
#include "phos/common/ipc/call_ring.h"
#include "phos/cuda_api/api_table.h"
#include "ring_requests.h"
#include "session/server_call.h"
#include "session/session.h"

#ifndef PHOS_VGPU_DRIVER
#define PHOS_VGPU_DRIVER ""
#endif

namespace phos::daemon::fuzz {
namespace {

using cuda_api::EntryPointId;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "ring_fuzzer: %s\n", what);
  std::abort();
}

struct World {
  pid_t application = 0;
  DriverTable* driver = nullptr;
  std::unique_ptr<ContextPool> pool;
  ServerTable servers{};
  std::unique_ptr<Session> victim;
  uint64_t victimContext = 0;
  CUcontext victimReal = nullptr;
  CUdeviceptr victimPointer = 0;
  std::vector<std::byte> reply;
  uint64_t tokens[kTokenCount] = {};
  uint64_t nextSession = 1;
};
World* world = nullptr;

// The application: maps kAppBase (PTX text, read-only; scratch, read-write),
// then forks a child that keeps that memory and waits to be killed.
pid_t startApplication() {
  void* p = mmap(reinterpret_cast<void*>(kAppBase), kAppBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != reinterpret_cast<void*>(kAppBase)) die("cannot map the application's memory");
  std::memcpy(p, kModulePtx.data(), kModulePtx.size());
  mprotect(p, kAppScratch - kAppBase, PROT_READ);
  const pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    for (;;) pause();
  }
  // The fuzzer's own copy is not the application's: keep it out of reach.
  munmap(p, kAppBytes);
  return child;
}

// Serves `request` in `s`; the result and the u64 that follows it (the id or
// address a creating call returns).
struct Answer {
  CUresult result = CUDA_ERROR_UNKNOWN;
  uint64_t value = 0;
};
Answer serve(Session& s, const RequestBuilder& request, bool presenceBeforeValue = false) {
  auto reply = s.serveOne(request.span(), true, world->reply);
  ipc::Decoder d(reply);
  Answer a;
  a.result = static_cast<CUresult>(d.value<ipc::ReplyHeader>().result);
  if (presenceBeforeValue) (void)d.u8();
  a.value = d.u64();
  return a;
}

uint64_t must(const Answer& a, const char* what) {
  if (a.result != CUDA_SUCCESS) {
    std::fprintf(stderr, "ring_fuzzer: prologue %s failed with CUresult %d\n", what, static_cast<int>(a.result));
    std::abort();
  }
  return a.value;
}

std::unique_ptr<Session> newSession() {
  return std::make_unique<Session>(world->nextSession++, world->application, getuid(), *world->driver,
                                   *world->pool, world->servers, "/tmp");
}

// The same objects in every session, created through the decoders themselves.
void prologue(Session& s, uint64_t* tokens) {
  const uint64_t ctx = must(serve(s, RequestBuilder(EntryPointId::kCuDevicePrimaryCtxRetain, 0).message(wire::cuDevicePrimaryCtxRetain_Request{true, 0}), true), "retain");
  tokens[kContext] = ctx;
  tokens[kDevicePointer] =
      must(serve(s, RequestBuilder(EntryPointId::kCuMemAlloc_v2, ctx).message(wire::cuMemAlloc_v2_Request{true, kDeviceBytes}), true), "cuMemAlloc");
  const uint64_t module = must(
      serve(s, RequestBuilder(EntryPointId::kCuModuleLoadData, ctx).message(wire::cuModuleLoadData_Request{true, {kAppPtx, kModulePtx.size()}}), true),
      "cuModuleLoadData");
  tokens[kModule] = module;
  tokens[kFunction] =
      must(serve(s, RequestBuilder(EntryPointId::kCuModuleGetFunction, ctx).u8(1).u64(module).text("fill"), true),
           "cuModuleGetFunction");
  tokens[kStream] = must(serve(s, RequestBuilder(EntryPointId::kCuStreamCreate, ctx).u8(1).u32(0), true),
                         "cuStreamCreate");
  tokens[kPinned] =
      must(serve(s, RequestBuilder(EntryPointId::kCuMemHostAlloc, ctx).u64(4096).u32(0)), "cuMemHostAlloc");
  tokens[kEvent] = must(serve(s, RequestBuilder(EntryPointId::kCuEventCreate, ctx).u8(1).u32(0), true),
                        "cuEventCreate");
}

void initialize() {
  // Quiet: the daemon logs every malformed request it refuses.
  setenv("PHOS_LOG", "off", 1);
  setenv("PHOS_VGPU_BANDWIDTH_SCALE", "0", 1);
  world = new World();
  world->application = startApplication();
  const char* path = std::getenv("PHOS_DRIVER");
  auto driver = DriverTable::load(path != nullptr ? path : PHOS_VGPU_DRIVER);
  if (!driver.isOk()) die("cannot load vgpu (set PHOS_DRIVER to its libcuda.so.1)");
  world->driver = *driver;
  world->pool = std::make_unique<ContextPool>(*world->driver, 1);
  generated::installGenerated(world->servers);
  world->reply.resize(ipc::CallRing::payloadCapacity(ipc::RingGeometry{}));

  // Another client's memory, filled with a pattern that must survive every input.
  world->victim = newSession();
  Session& v = *world->victim;
  world->victimContext =
      must(serve(v, RequestBuilder(EntryPointId::kCuDevicePrimaryCtxRetain, 0).message(wire::cuDevicePrimaryCtxRetain_Request{true, 0}), true), "victim retain");
  world->victimPointer = must(
      serve(v, RequestBuilder(EntryPointId::kCuMemAlloc_v2, world->victimContext).message(wire::cuMemAlloc_v2_Request{true, kVictimBytes}), true), "victim alloc");
  const uint64_t r = serve(v, RequestBuilder(EntryPointId::kCuMemsetD8_v2, world->victimContext)
                                  .message(wire::cuMemsetD8_v2_Request{world->victimPointer, kVictimFill, kVictimBytes}))
                         .result;
  if (r != CUDA_SUCCESS) die("victim memset failed");
  world->victimReal = v.contexts().find(world->victimContext)->real;
  world->tokens[kVictimPointer] = world->victimPointer;
  world->tokens[kVictimContext] = world->victimContext;
  // The victim's context is not current on this thread for the sessions to come.
  PHOS_DRIVER(*world->driver, CtxSetCurrent)(nullptr);
}

// After a session ends, the other session's memory is intact and nothing of
// the ended one is left registered with the driver.
// `kernelRan`: the request launched a kernel. Sessions sharing this process
// share its VMM mappings, so such a kernel may reach the other session's
// memory here; phosd serves each session in a process of its own, where it
// cannot (tests/python/test_shim_sessions.py). Only the decoders' own copies
// are checked then.
void checkAfterSession(uint64_t pinned, bool kernelRan) {
  const DriverTable& d = *world->driver;
  std::vector<uint8_t> bytes(kVictimBytes);
  if (PHOS_DRIVER(d, CtxSetCurrent)(world->victimReal) != CUDA_SUCCESS ||
      PHOS_DRIVER(d, MemcpyDtoH_v2)(bytes.data(), world->victimPointer, bytes.size()) != CUDA_SUCCESS) {
    die("the other session's memory is gone");
  }
  CUdeviceptr mapped = 0;
  if (PHOS_DRIVER(d, MemHostGetDevicePointer_v2)(&mapped, reinterpret_cast<void*>(pinned), 0) == CUDA_SUCCESS) {
    die("the ended session's pinned memory is still registered with the driver");
  }
  if (kernelRan) {
    // What the kernel may have written is put back, for the next input's check.
    if (PHOS_DRIVER(d, MemsetD8_v2)(world->victimPointer, kVictimFill, kVictimBytes) != CUDA_SUCCESS ||
        PHOS_DRIVER(d, CtxSynchronize)() != CUDA_SUCCESS) {
      die("cannot refill the other session's memory");
    }
    PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
    return;
  }
  PHOS_DRIVER(d, CtxSetCurrent)(nullptr);
  for (uint8_t b : bytes) {
    if (b != kVictimFill) die("the other session's memory was written");
  }
}

// A kernel's running time is not a decoding defect: grids that would keep
// vgpu's CPU interpreter busy for long are not run (they are not refused by
// phosd, which a real GPU runs quickly).
bool isLaunch(std::span<const std::byte> request) {
  if (request.size() < sizeof(ipc::CallHeader)) return false;
  ipc::CallHeader h;
  std::memcpy(&h, request.data(), sizeof(h));
  switch (static_cast<EntryPointId>(h.entry)) {
    case EntryPointId::kCuLaunchKernel:
    case EntryPointId::kCuLaunchKernel_ptsz:
    case EntryPointId::kCuLaunchCooperativeKernel:
    case EntryPointId::kCuLaunchCooperativeKernel_ptsz:
    case EntryPointId::kCuLaunchKernelEx:
    case EntryPointId::kCuLaunchKernelEx_ptsz:
      return true;
    default:
      return false;
  }
}

bool tooManyThreads(std::span<const std::byte> request) {
  if (!isLaunch(request) || request.size() < sizeof(ipc::CallHeader) + 8 + 6 * 4) return false;
  ipc::CallHeader h;
  std::memcpy(&h, request.data(), sizeof(h));
  uint32_t dims[6];
  std::memcpy(dims, request.data() + sizeof(h) + 8, sizeof(dims));
  // A zero dimension is no thread at all; otherwise the product, stopping
  // past the limit (at most 4096 * 2^32 before it stops: no overflow).
  for (uint32_t v : dims) {
    if (v == 0) return false;
  }
  uint64_t threads = 1;
  for (uint32_t v : dims) {
    threads *= v;
    if (threads > 4096) return true;
  }
  return false;
}

}  // namespace
}  // namespace phos::daemon::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace phos::daemon::fuzz;
  if (world == nullptr) initialize();
  std::vector<std::byte> request(reinterpret_cast<const std::byte*>(data),
                                 reinterpret_cast<const std::byte*>(data) + size);
  if (tooManyThreads(request)) return -1;

  auto session = newSession();
  uint64_t tokens[kTokenCount];
  std::memcpy(tokens, world->tokens, sizeof(tokens));
  prologue(*session, tokens);
  for (size_t i = 0; i + 8 <= request.size(); ++i) {
    uint64_t v;
    std::memcpy(&v, request.data() + i, 8);
    if (v > kTokenBase && v < kTokenBase + kTokenCount) std::memcpy(request.data() + i, &tokens[v - kTokenBase], 8);
  }
  phos::ipc::CallHeader header;
  header.flags = phos::ipc::kCallExpectsReply;
  if (request.size() >= sizeof(header)) std::memcpy(&header, request.data(), sizeof(header));
  const bool expectsReply = (header.flags & phos::ipc::kCallExpectsReply) != 0;
  auto reply = session->serveOne(request, expectsReply, world->reply);
  // Every request is answered, malformed or not.
  if (reply.size() < sizeof(phos::ipc::ReplyHeader)) die("a request got no reply");
  session.reset();
  checkAfterSession(tokens[kPinned], isLaunch(request));
  return 0;
}
