// SPDX-License-Identifier: Apache-2.0
// Server hooks for stream memory operations (cuStreamWaitValue32,
// cuStreamWriteValue32, their 64-bit forms and cuStreamBatchMemOp) and for
// the synchronizations that may wait behind one of their waits, which the
// session answers later instead of blocking its serving thread
// (session/stream_waits.h; docs/remoting.md, "Stream memory operations").
#include <cuda.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "phos/cuda_api/server_hooks.h"
#include "session/session.h"

namespace phos::daemon::hooks {
namespace {

using cuda_api::EntryPointId;

bool isWait(const CUstreamBatchMemOpParams& op) {
  return op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ||
         op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64;
}

// An operation's word must be the session's memory (device or pinned, not
// managed): the driver would wait on or write any address of phosd.
// Operations without an address, and ones the driver will refuse, pass as
// they are.
bool checkAddress(ServerCall& c, const CUstreamBatchMemOpParams& op, CallAccess& access) {
  uint64_t bytes = 0;
  CUdeviceptr address = 0;
  switch (op.operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      bytes = op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8;
      address = op.waitValue.address;
      access.reads.push_back({address, bytes});
      break;
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
      bytes = op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8;
      address = op.writeValue.address;
      access.writes.push_back({address, bytes});
      break;
    default:
      return true;
  }
  // "cannot be used with managed memory", which is pinned memory in phosd.
  const PinnedRange* range = c.session().findPinned(address);
  if (range != nullptr && range->managed) return false;
  return c.session().ownsRange(address, bytes);
}

// Checks `ops`, gates them, runs `enqueue` (the driver's call) and, if the
// batch waits, tracks it until its stream is past it.
CUresult memoryOps(ServerCall& c, Handle<CUstream> stream,
                   std::span<const CUstreamBatchMemOpParams> ops,
                   const std::function<CUresult()>& enqueue) {
  if (!c.driverTable().has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  CallAccess access{.overwrites = true};  // every write sets its whole word
  for (const CUstreamBatchMemOpParams& op : ops) {
    if (!checkAddress(c, op, access)) return CUDA_ERROR_INVALID_VALUE;
  }
  // Captured, the batch would become a graph's batch memory operation node,
  // which phosd does not serve.
  if (auto refused = c.refuseInCapture(stream.real)) return *refused;
  Session& s = c.session();
  s.passGate(access);
  if (CUresult r = enqueue(); r != CUDA_SUCCESS) return r;
  const auto wait = std::find_if(ops.begin(), ops.end(), isWait);
  if (wait == ops.end()) return CUDA_SUCCESS;
  // The mark is an event of the stream's context, which may not be the
  // current one.
  const DriverTable& d = c.driverTable();
  CUcontext context = nullptr;
  if (CUresult r = PHOS_DRIVER(d, StreamGetCtx)(stream.real, &context); r != CUDA_SUCCESS) return r;
  const bool elsewhere = context != s.currentRealContext();
  if (elsewhere) PHOS_DRIVER(d, CtxSetCurrent)(context);
  const bool wide = wait->operation == CU_STREAM_MEM_OP_WAIT_VALUE_64;
  const CUresult r =
      s.streamWaits().add(d, stream.real,
                          {.stream = stream.id,
                           .context = s.contexts().idOf(context),
                           .address = wait->waitValue.address,
                           .value = wide ? wait->waitValue.value64 : wait->waitValue.value,
                           .wide = wide,
                           .condition = wait->waitValue.flags & 3u});
  if (elsewhere) PHOS_DRIVER(d, CtxSetCurrent)(s.currentRealContext());
  return r;
}

template <typename Word>
CUresult oneOp(ServerCall& c, Handle<CUstream> stream, CUdeviceptr addr, Word value, unsigned flags,
               bool wait) {
  constexpr bool kWide = sizeof(Word) == 8;
  CUstreamBatchMemOpParams op{};
  if (wait) {
    op.waitValue.operation =
        kWide ? CU_STREAM_MEM_OP_WAIT_VALUE_64 : CU_STREAM_MEM_OP_WAIT_VALUE_32;
    op.waitValue.address = addr;
    op.waitValue.flags = flags;
    if constexpr (kWide) {
      op.waitValue.value64 = value;
    } else {
      op.waitValue.value = value;
    }
  } else {
    op.writeValue.operation =
        kWide ? CU_STREAM_MEM_OP_WRITE_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = addr;
  }
  // Every revision and variant of the four has the same signature.
  using Fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, Word, unsigned);
  return memoryOps(c, stream, {&op, 1},
                   [&] { return c.driver<Fn>(c.entry())(stream.real, addr, value, flags); });
}

// The stream or event `id` names now, or null if the application destroyed
// it meanwhile (a deferred call is served again later, by id).
CUstream liveStream(Session& s, uint64_t id, CUstream real) {
  const auto legacy = reinterpret_cast<uint64_t>(CU_STREAM_LEGACY);
  const auto perThread = reinterpret_cast<uint64_t>(CU_STREAM_PER_THREAD);
  if (id == 0 || id == legacy || id == perThread) return real;
  return static_cast<CUstream>(s.handles().resolve(HandleType::kCUstream_st, id));
}

// Whether a synchronization must wait for its work: only while a stream
// memory wait may hold it (anything else ends by itself, and is waited for
// on the serving thread as before). Never during a capture, where querying a
// stream would invalidate it.
bool mayWaitBehindStreamWait(ServerCall& c) {
  return c.session().captures().active() == 0 && c.session().streamWaits().pending(c.driverTable());
}

// A context has no query: its synchronization is answered later while a
// stream memory wait of its own streams is left, then `synchronize` runs.
CUresult synchronizeContext(ServerCall& c, uint64_t context,
                            const std::function<CUresult()>& synchronize) {
  Session& s = c.session();
  if (s.captures().active() == 0 && s.streamWaits().pendingIn(c.driverTable(), context)) {
    c.defer([&s, context] { return !s.streamWaits().pendingIn(s.driver(), context); });
    return CUDA_SUCCESS;
  }
  return synchronize();
}

}  // namespace

CUresult cuStreamWaitValue32(ServerCall& c, Handle<CUstream> stream, CUdeviceptr addr,
                             cuuint32_t value, unsigned int flags) {
  return oneOp(c, stream, addr, value, flags, true);
}

CUresult cuStreamWaitValue64(ServerCall& c, Handle<CUstream> stream, CUdeviceptr addr,
                             cuuint64_t value, unsigned int flags) {
  return oneOp(c, stream, addr, value, flags, true);
}

CUresult cuStreamWriteValue32(ServerCall& c, Handle<CUstream> stream, CUdeviceptr addr,
                              cuuint32_t value, unsigned int flags) {
  return oneOp(c, stream, addr, value, flags, false);
}

CUresult cuStreamWriteValue64(ServerCall& c, Handle<CUstream> stream, CUdeviceptr addr,
                              cuuint64_t value, unsigned int flags) {
  return oneOp(c, stream, addr, value, flags, false);
}

CUresult cuStreamBatchMemOp(ServerCall& c, Handle<CUstream> stream, unsigned int count,
                            std::span<const CUstreamBatchMemOpParams> paramArray,
                            unsigned int flags) {
  if (paramArray.size() != count) return CUDA_ERROR_INVALID_VALUE;
  using Fn = CUresult(CUDAAPI*)(CUstream, unsigned, CUstreamBatchMemOpParams*, unsigned);
  std::vector<CUstreamBatchMemOpParams> ops(paramArray.begin(), paramArray.end());
  return memoryOps(c, stream, paramArray, [&] {
    return c.driver<Fn>(c.entry())(stream.real, count, ops.empty() ? nullptr : ops.data(), flags);
  });
}

CUresult cuStreamSynchronize(ServerCall& c, Handle<CUstream> hStream) {
  const DriverTable& d = c.driverTable();
  if (!d.has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  if (mayWaitBehindStreamWait(c) &&
      PHOS_DRIVER(d, StreamQuery)(hStream.real) == CUDA_ERROR_NOT_READY) {
    c.defer([&s = c.session(), &d, id = hStream.id, real = hStream.real] {
      CUstream live = liveStream(s, id, real);
      return (id != 0 && live == nullptr) ||
             PHOS_DRIVER(d, StreamQuery)(live) != CUDA_ERROR_NOT_READY;
    });
    return CUDA_SUCCESS;
  }
  return c.driver<decltype(&::cuStreamSynchronize)>(c.entry())(hStream.real);
}

CUresult cuEventSynchronize(ServerCall& c, Handle<CUevent> hEvent) {
  const DriverTable& d = c.driverTable();
  if (mayWaitBehindStreamWait(c) &&
      PHOS_DRIVER(d, EventQuery)(hEvent.real) == CUDA_ERROR_NOT_READY) {
    c.defer([&s = c.session(), &d, id = hEvent.id] {
      auto live = static_cast<CUevent>(s.handles().resolve(HandleType::kCUevent_st, id));
      return live == nullptr || PHOS_DRIVER(d, EventQuery)(live) != CUDA_ERROR_NOT_READY;
    });
    return CUDA_SUCCESS;
  }
  return PHOS_DRIVER(d, EventSynchronize)(hEvent.real);
}

CUresult cuCtxSynchronize(ServerCall& c) {
  return synchronizeContext(c, c.session().currentContext(),
                            [&] { return PHOS_DRIVER(c.driverTable(), CtxSynchronize)(); });
}

CUresult cuCtxSynchronize(ServerCall& c, Handle<CUcontext> ctx) {
  if (!c.driverTable().has(c.entry())) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t context = ctx.id != 0 ? ctx.id : c.session().currentContext();
  return synchronizeContext(
      c, context, [&] { return PHOS_DRIVER(c.driverTable(), CtxSynchronize_v2)(ctx.real); });
}

}  // namespace phos::daemon::hooks
