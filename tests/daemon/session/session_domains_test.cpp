// SPDX-License-Identifier: Apache-2.0
// The domains of a session's state, each saved into an image's state and
// rebuilt from it on vgpu, without a session, a ring or CRIU: contexts
// (SessionContexts), streams and events (StreamsAndEvents), device memory
// (DeviceMemory), modules (SessionModules) and linker states (LinkStates).
// What comes back must be what was saved; an image that names something this
// host cannot give is refused, naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "session/context_pool.h"
#include "session/device_memory.h"
#include "session/driver_table.h"
#include "session/handle_table.h"
#include "session/launch_validator.h"
#include "session/link_states.h"
#include "session/session_contexts.h"
#include "session/session_image.h"
#include "session/session_modules.h"
#include "session/streams_and_events.h"

namespace phos::daemon {
namespace {

using json = nlohmann::json;

class SessionDomains : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto d = DriverTable::load(PHOS_VGPU_DRIVER);
    ASSERT_TRUE(d.isOk()) << d.status().message();
    driver_ = *d;
    pool_ = new ContextPool(*driver_, 1);
  }

  void SetUp() override {
    ASSERT_NE(driver_, nullptr);
    auto real = pool_->take(0, 0);
    ASSERT_TRUE(real.isOk()) << real.status().message();
    context_ = handles_.exportHandle(HandleType::kCUctx_st, *real);
    contexts_.adopt(context_, {*real, 0, true});
    ASSERT_EQ(PHOS_DRIVER(d(), CtxSetCurrent)(*real), CUDA_SUCCESS);
  }
  void TearDown() override {
    for (const auto& [id, ctx] : contexts_) pool_->retire(ctx.real, ctx.device);
    PHOS_DRIVER(d(), CtxSetCurrent)(nullptr);
  }

  const DriverTable& d() const { return *driver_; }
  SessionScope scope() { return {d(), handles_, contexts_, context_}; }

  static DriverTable* driver_;
  static ContextPool* pool_;  // the driver and the pool stay for the process, as in phosd
  HandleTable handles_;
  SessionContexts contexts_;
  uint64_t context_ = 0;
};

DriverTable* SessionDomains::driver_ = nullptr;
ContextPool* SessionDomains::pool_ = nullptr;

TEST_F(SessionDomains, ContextsComeBackWithTheirLimitsReferencesAndDestroyedIds) {
  ASSERT_EQ(PHOS_DRIVER(d(), CtxSetLimit)(CU_LIMIT_PRINTF_FIFO_SIZE, 3u << 20), CUDA_SUCCESS);
  contexts_.primary(0) = {context_, 2, CU_CTX_SCHED_YIELD};
  // A second context, which the program destroyed with a stream in it.
  auto other = pool_->take(0, 0);
  ASSERT_TRUE(other.isOk());
  const uint64_t gone = handles_.exportHandle(HandleType::kCUctx_st, *other);
  contexts_.adopt(gone, {*other, 0, false});
  contexts_.noteObject(0x1234, gone);
  EXPECT_EQ(contexts_.remove(gone), std::vector<uint64_t>{0x1234});
  pool_->retire(*other, 0);
  EXPECT_TRUE(contexts_.destroyed(gone));

  json state;
  ASSERT_TRUE(contexts_.save(d(), state).isOk());
  SessionContexts back;
  HandleTable handles;
  std::vector<CUcontext> adopted;
  Status s = back.rebuild(d(), *pool_, handles, state, [&](CUcontext c) { adopted.push_back(c); });
  ASSERT_TRUE(s.isOk()) << s.message();
  ASSERT_EQ(back.size(), 1u);
  const SessionContext* c = back.find(context_);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->primary);
  EXPECT_EQ(handles.resolve(HandleType::kCUctx_st, context_), c->real);
  EXPECT_EQ(adopted, std::vector<CUcontext>{c->real});
  ASSERT_TRUE(back.makeCurrent(d(), context_).isOk());
  size_t fifo = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), CtxGetLimit)(&fifo, CU_LIMIT_PRINTF_FIFO_SIZE), CUDA_SUCCESS);
  EXPECT_EQ(fifo, 3u << 20);
  EXPECT_EQ(back.primary(0).id, context_);
  EXPECT_EQ(back.primary(0).refs, 2u);
  EXPECT_EQ(back.primary(0).flags, static_cast<unsigned>(CU_CTX_SCHED_YIELD));
  EXPECT_TRUE(back.destroyed(gone));
  for (const auto& [id, ctx] : back) pool_->retire(ctx.real, ctx.device);
}

TEST_F(SessionDomains, AContextOnADeviceThisHostLacksIsRefusedNamingIt) {
  const json state = {{"contexts", json::array({{{"id", context_}, {"device", 7}}})}};
  SessionContexts back;
  HandleTable handles;
  Status s = back.rebuild(d(), *pool_, handles, state, [](CUcontext) {});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("is on device 7; this host has "), std::string::npos) << s.message();
  EXPECT_EQ(back.size(), 0u);
  Status current = back.makeCurrent(d(), 0x99);
  EXPECT_EQ(current.code(), Code::kDataLoss);
  EXPECT_NE(current.message().find("context 0x99"), std::string::npos) << current.message();
}

TEST_F(SessionDomains, StreamsAndEventsComeBackWithTheirFlagsPrioritiesAndTimes) {
  int least = 0, greatest = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), CtxGetStreamPriorityRange)(&least, &greatest), CUDA_SUCCESS);
  CUstream stream = nullptr;
  ASSERT_EQ(PHOS_DRIVER(d(), StreamCreateWithPriority)(&stream, CU_STREAM_NON_BLOCKING, greatest),
            CUDA_SUCCESS);
  const uint64_t streamId = handles_.exportHandle(HandleType::kCUstream_st, stream);
  contexts_.noteObject(streamId, context_);
  StreamsAndEvents saved;
  // Two recorded events and one that does no timing.
  std::vector<uint64_t> events;
  for (unsigned flags : {0u, 0u, static_cast<unsigned>(CU_EVENT_DISABLE_TIMING)}) {
    CUevent e = nullptr;
    ASSERT_EQ(PHOS_DRIVER(d(), EventCreate)(&e, flags), CUDA_SUCCESS);
    ASSERT_EQ(PHOS_DRIVER(d(), EventRecord)(e, stream), CUDA_SUCCESS);
    const uint64_t id = handles_.exportHandle(HandleType::kCUevent_st, e);
    contexts_.noteObject(id, context_);
    saved.event(id) = {flags, true, {}, {}};
    events.push_back(id);
    usleep(2000);
  }
  ASSERT_EQ(PHOS_DRIVER(d(), StreamSynchronize)(stream), CUDA_SUCCESS);

  SessionScope from = scope();
  json state;
  ASSERT_TRUE(saved.save(from, state).isOk());
  HandleTable handles;
  SessionScope to{d(), handles, contexts_, context_};
  StreamsAndEvents back;
  Status s = back.rebuild(to, state);
  ASSERT_TRUE(s.isOk()) << s.message();

  auto* rebuilt = static_cast<CUstream>(handles.resolve(HandleType::kCUstream_st, streamId));
  ASSERT_NE(rebuilt, nullptr);
  ASSERT_NE(rebuilt, stream);
  unsigned flags = 0;
  int priority = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), StreamGetFlags)(rebuilt, &flags), CUDA_SUCCESS);
  ASSERT_EQ(PHOS_DRIVER(d(), StreamGetPriority)(rebuilt, &priority), CUDA_SUCCESS);
  EXPECT_EQ(flags, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(priority, greatest);
  // Timed events: a time before the restore's mark, in the order they were
  // recorded, and the driver's interval between them exactly.
  const EventState* first = back.findEvent(events[0]);
  const EventState* second = back.findEvent(events[1]);
  const EventState* untimed = back.findEvent(events[2]);
  ASSERT_TRUE(first != nullptr && second != nullptr && untimed != nullptr);
  ASSERT_TRUE(first->restoredMs && second->restoredMs);
  EXPECT_LE(*second->restoredMs, 0.0);
  EXPECT_LT(*first->restoredMs, *second->restoredMs);
  float measured = 0;
  ASSERT_EQ(
      PHOS_DRIVER(d(), EventElapsedTime_v2)(
          &measured, static_cast<CUevent>(handles_.resolve(HandleType::kCUevent_st, events[0])),
          static_cast<CUevent>(handles_.resolve(HandleType::kCUevent_st, events[1]))),
      CUDA_SUCCESS);
  ASSERT_EQ(first->restoredIntervals.count(events[1]), 1u);
  EXPECT_EQ(first->restoredIntervals.at(events[1]), measured);
  EXPECT_EQ(second->restoredIntervals.at(events[0]), -measured);
  EXPECT_TRUE(untimed->recorded);
  EXPECT_FALSE(untimed->restoredMs.has_value());
  EXPECT_EQ(untimed->flags, static_cast<unsigned>(CU_EVENT_DISABLE_TIMING));
  EXPECT_NE(back.restoreMark(context_), nullptr);
  back.forgetContext(context_);
  EXPECT_EQ(back.restoreMark(context_), nullptr);
}

// A created stream's attributes (cuStreamSetAttribute) come back as the
// driver reported them at the checkpoint; an attribute the image garbled is
// refused, naming the stream.
TEST_F(SessionDomains, StreamAttributesComeBackAndGarbledOnesAreRefused) {
  CUstream stream = nullptr;
  ASSERT_EQ(PHOS_DRIVER(d(), StreamCreate)(&stream, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  CUdeviceptr window = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), MemAlloc_v2)(&window, 1 << 20), CUDA_SUCCESS);
  CUstreamAttrValue policy{}, sync{}, domain{};
  policy.accessPolicyWindow = {reinterpret_cast<void*>(window), 1 << 20, 0.25f,
                               CU_ACCESS_PROPERTY_PERSISTING, CU_ACCESS_PROPERTY_STREAMING};
  sync.syncPolicy = CU_SYNC_POLICY_YIELD;
  domain.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  for (auto [id, v] : {std::pair{CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &policy},
                       std::pair{CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &sync},
                       std::pair{CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &domain}}) {
    ASSERT_EQ(PHOS_DRIVER(d(), StreamSetAttribute)(stream, id, v), CUDA_SUCCESS) << id;
  }
  const uint64_t streamId = handles_.exportHandle(HandleType::kCUstream_st, stream);
  contexts_.noteObject(streamId, context_);
  json state;
  SessionScope from = scope();
  ASSERT_TRUE(StreamsAndEvents().save(from, state).isOk());

  HandleTable handles;
  SessionScope to{d(), handles, contexts_, context_};
  Status s = StreamsAndEvents().rebuild(to, state);
  ASSERT_TRUE(s.isOk()) << s.message();
  auto* rebuilt = static_cast<CUstream>(handles.resolve(HandleType::kCUstream_st, streamId));
  ASSERT_NE(rebuilt, nullptr);
  CUstreamAttrValue v{};
  ASSERT_EQ(
      PHOS_DRIVER(d(), StreamGetAttribute)(rebuilt, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v),
      CUDA_SUCCESS);
  EXPECT_EQ(v.accessPolicyWindow.base_ptr, reinterpret_cast<void*>(window));
  EXPECT_EQ(v.accessPolicyWindow.num_bytes, size_t{1} << 20);
  EXPECT_EQ(v.accessPolicyWindow.hitRatio, 0.25f);
  EXPECT_EQ(v.accessPolicyWindow.hitProp, CU_ACCESS_PROPERTY_PERSISTING);
  ASSERT_EQ(
      PHOS_DRIVER(d(), StreamGetAttribute)(rebuilt, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v),
      CUDA_SUCCESS);
  EXPECT_EQ(v.syncPolicy, CU_SYNC_POLICY_YIELD);
  ASSERT_EQ(PHOS_DRIVER(d(), StreamGetAttribute)(rebuilt, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &v),
            CUDA_SUCCESS);
  EXPECT_EQ(v.memSyncDomain, CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE);
  // Untouched attributes keep a new stream's defaults.
  ASSERT_EQ(
      PHOS_DRIVER(d(), StreamGetAttribute)(rebuilt, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP, &v),
      CUDA_SUCCESS);
  EXPECT_EQ(v.memSyncDomainMap.default_, 0);
  EXPECT_EQ(v.memSyncDomainMap.remote, 1);

  for (const char* garbled : {"zz", "0102"}) {
    json edited = state;
    edited["streams"][0]["attributes"]["3"] = garbled;
    HandleTable fresh;
    SessionScope again{d(), fresh, contexts_, context_};
    Status refused = StreamsAndEvents().rebuild(again, edited);
    EXPECT_FALSE(refused.isOk()) << garbled;
    EXPECT_NE(refused.message().find("stream " + hex(streamId) + ": attribute 3 is malformed"),
              std::string::npos)
        << refused.message();
  }
  // Ids that are no stream attribute, or no number: refused, never thrown.
  for (const char* key : {"7", "x", "3x", ""}) {
    json edited = state;
    edited["streams"][0]["attributes"][key] = edited["streams"][0]["attributes"]["3"];
    HandleTable fresh;
    SessionScope again{d(), fresh, contexts_, context_};
    Status refused = StreamsAndEvents().rebuild(again, edited);
    EXPECT_FALSE(refused.isOk()) << key;
    EXPECT_NE(refused.message().find("is malformed"), std::string::npos) << refused.message();
  }
  EXPECT_EQ(PHOS_DRIVER(d(), MemFree_v2)(window), CUDA_SUCCESS);
}

class DomainImage : public SessionDomains {
 protected:
  void SetUp() override {
    SessionDomains::SetUp();
    dir_ =
        std::filesystem::path(::testing::TempDir()) / ("phos-domains-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    SessionDomains::TearDown();
  }
  // `state` and the blobs that `copies` name (zeros), as an image to read.
  std::unique_ptr<image::ImageReader> commit(image::ImageWriter& writer,
                                             const std::vector<DeviceBuffer>& copies,
                                             const json& state) {
    for (const DeviceBuffer& b : copies) {
      std::vector<std::byte> zeros(b.bytes);
      EXPECT_TRUE(writer.writeBlob(b.blob, zeros).isOk());
    }
    writer.setState(state);
    EXPECT_TRUE(writer.commit().isOk());
    auto reader = image::ImageReader::open(dir_);
    EXPECT_TRUE(reader.isOk()) << reader.status().message();
    return reader.isOk() ? std::move(*reader) : nullptr;
  }
  std::filesystem::path dir_;
};

TEST_F(DomainImage, AllocationsComeBackAtTheirAddressesInTheJobsOrder) {
  constexpr uint64_t kSession = 5;
  DeviceMemory memory(d(), kSession);
  std::vector<CUdeviceptr> made;
  for (size_t bytes : {size_t{1} << 20, size_t{4096}}) {
    CUdeviceptr p = 0;
    ASSERT_EQ(memory.allocate(0, bytes, &p), CUDA_SUCCESS);
    memory.add({p, bytes, context_, nullptr, 0});
    made.push_back(p);
  }
  auto writer = image::ImageWriter::create(dir_);
  ASSERT_TRUE(writer.isOk());
  json state;
  std::vector<DeviceBuffer> copies;
  ASSERT_TRUE(memory.save(**writer, state, copies).isOk());
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(state["heaps"][0]["base"].get<uint64_t>(), DeviceHeap::windowBase(kSession, 0));
  auto reader = commit(**writer, copies, state);
  ASSERT_NE(reader, nullptr);
  memory.clear();  // the restored process's ranges must be free here

  DeviceMemory back(d(), kSession);
  SessionScope sc = scope();
  DeviceMemory::Restore restore(back, sc, *reader, state);
  ASSERT_TRUE(restore.reserveRanges().isOk());
  std::vector<uint64_t> orders;
  // The first allocation only, as before a module the job loaded second.
  Status s = restore.mapBefore(2, [&](const Allocation& a, size_t) {
    orders.push_back(a.order);
    return Status::ok();
  });
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(orders, std::vector<uint64_t>{1});
  ASSERT_TRUE(restore
                  .mapBefore(std::numeric_limits<uint64_t>::max(),
                             [&](const Allocation& a, size_t) {
                               orders.push_back(a.order);
                               return Status::ok();
                             })
                  .isOk());
  restore.finish();
  EXPECT_EQ(orders, (std::vector<uint64_t>{1, 2}));
  for (CUdeviceptr p : made) {
    const Allocation* a = back.find(p + 1);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->address, p);
  }
  // What the job makes next comes after in its order.
  CUdeviceptr next = 0;
  ASSERT_EQ(back.allocate(0, 4096, &next), CUDA_SUCCESS);
  back.add({next, 4096, context_, nullptr, 0});
  EXPECT_EQ(back.find(next)->order, 3u);
  back.clear();
}

TEST_F(DomainImage, AnAllocationOnADeviceWhoseRangeTheImageLacksIsRefused) {
  DeviceMemory memory(d(), 6);
  CUdeviceptr p = 0;
  ASSERT_EQ(memory.allocate(0, 4096, &p), CUDA_SUCCESS);
  memory.add({p, 4096, context_, nullptr, 0});
  auto writer = image::ImageWriter::create(dir_);
  ASSERT_TRUE(writer.isOk());
  json state;
  std::vector<DeviceBuffer> copies;
  ASSERT_TRUE(memory.save(**writer, state, copies).isOk());
  auto reader = commit(**writer, copies, state);
  ASSERT_NE(reader, nullptr);
  memory.clear();
  state["heaps"] = json::array();  // a hand-edited image
  DeviceMemory back(d(), 6);
  SessionScope sc = scope();
  DeviceMemory::Restore restore(back, sc, *reader, state);
  ASSERT_TRUE(restore.reserveRanges().isOk());
  Status s = restore.mapBefore(std::numeric_limits<uint64_t>::max(),
                               [](const Allocation&, size_t) { return Status::ok(); });
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), Code::kDataLoss);
  EXPECT_NE(s.message().find("whose range the image does not name"), std::string::npos)
      << s.message();
  EXPECT_EQ(back.find(p), nullptr);
}

// A module with a global the program changed and a function whose attribute
// it set: saved, unloaded, and loaded again with the global at its address
// holding its bytes and the function's attribute set again.
constexpr char kCounterPtx[] = R"(
.version 8.0
.target sm_80
.address_size 64
.global .align 4 .u32 counter = 7;
.visible .entry bump()
{
  .reg .u32 %r<2>;
  ld.global.u32 %r0, [counter];
  add.u32 %r1, %r0, 1;
  st.global.u32 [counter], %r1;
  ret;
}
)";

TEST_F(DomainImage, ModulesComeBackWithTheirGlobalsBytesAndFunctionAttributes) {
  std::vector<char> ptx(std::begin(kCounterPtx), std::end(kCounterPtx));  // with its NUL
  CUmodule mod = nullptr;
  std::shared_ptr<const PreparedModule> prepared;
  ASSERT_EQ(loadModule(d(), ptx, &mod, &prepared), CUDA_SUCCESS);
  const uint64_t moduleId = handles_.exportHandle(HandleType::kCUmod_st, mod);
  contexts_.noteObject(moduleId, context_);
  SessionModules modules;
  modules.record(moduleId, {false, ptx, context_, 1});
  CUfunction fn = nullptr;
  ASSERT_EQ(PHOS_DRIVER(d(), ModuleGetFunction)(&fn, mod, "bump"), CUDA_SUCCESS);
  const uint64_t functionId = handles_.exportHandle(HandleType::kCUfunc_st, fn);
  contexts_.noteObject(functionId, context_);
  ASSERT_EQ(
      PHOS_DRIVER(d(), FuncSetAttribute)(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024),
      CUDA_SUCCESS);
  CUdeviceptr counter = 0;
  size_t bytes = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), ModuleGetGlobal_v2)(&counter, &bytes, mod, "counter"), CUDA_SUCCESS);
  ASSERT_EQ(bytes, 4u);
  const uint32_t changed = 42;
  ASSERT_EQ(PHOS_DRIVER(d(), MemcpyHtoD_v2)(counter, &changed, 4), CUDA_SUCCESS);

  auto writer = image::ImageWriter::create(dir_);
  ASSERT_TRUE(writer.isOk());
  json state, lost = json::array();
  std::vector<DeviceBuffer> copies;
  DeviceMemory memory(d(), 7);
  SessionScope from = scope();
  Status saved = modules.save(from, {**writer, copies, memory, 1, lost}, state);
  ASSERT_TRUE(saved.isOk()) << saved.message();
  EXPECT_TRUE(lost.empty()) << lost.dump();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].address, counter);
  ASSERT_EQ(state["modules"].size(), 1u);
  EXPECT_EQ(state["modules"][0]["globals"][0]["name"], "counter");
  ASSERT_EQ(state["functions"].size(), 1u);
  // The global's bytes into its blob, as the engine's copy does.
  std::vector<std::byte> held(4);
  ASSERT_EQ(PHOS_DRIVER(d(), MemcpyDtoH_v2)(held.data(), counter, 4), CUDA_SUCCESS);
  ASSERT_TRUE((*writer)->writeBlob(copies[0].blob, held).isOk());
  writer.value()->setState(state);
  ASSERT_TRUE((*writer)->commit().isOk());
  auto reader = image::ImageReader::open(dir_);
  ASSERT_TRUE(reader.isOk()) << reader.status().message();
  ASSERT_EQ(PHOS_DRIVER(d(), ModuleUnload)(mod), CUDA_SUCCESS);

  HandleTable handles;
  SessionScope to{d(), handles, contexts_, context_};
  SessionModules back;
  LaunchValidator validator(d());
  DeviceMemory backMemory(d(), 7);
  std::vector<SessionModules::Load::Copy> toCopy;
  SessionModules::Load load(back, to, **reader, validator, backMemory, toCopy);
  std::vector<uint64_t> asked;
  Status loaded = load.module(state["modules"][0], [&](uint64_t order) {
    asked.push_back(order);
    return Status::ok();
  });
  ASSERT_TRUE(loaded.isOk()) << loaded.message();
  EXPECT_EQ(asked, std::vector<uint64_t>{1});  // the allocations made before it come first
  ASSERT_EQ(toCopy.size(), 1u);
  EXPECT_EQ(toCopy[0].address, counter);
  std::vector<std::byte> bytesBack(4);
  ASSERT_TRUE((*reader)->read(toCopy[0].blob, 0, bytesBack).isOk());
  ASSERT_EQ(PHOS_DRIVER(d(), MemcpyHtoD_v2)(toCopy[0].address, bytesBack.data(), 4), CUDA_SUCCESS);
  Status bound = back.bindFunctions(to, state, 1);
  ASSERT_TRUE(bound.isOk()) << bound.message();

  auto* again = static_cast<CUmodule>(handles.resolve(HandleType::kCUmod_st, moduleId));
  ASSERT_NE(again, nullptr);
  CUdeviceptr where = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), ModuleGetGlobal_v2)(&where, &bytes, again, "counter"), CUDA_SUCCESS);
  EXPECT_EQ(where, counter);
  uint32_t value = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), MemcpyDtoH_v2)(&value, where, 4), CUDA_SUCCESS);
  EXPECT_EQ(value, 42u);
  auto* fnAgain = static_cast<CUfunction>(handles.resolve(HandleType::kCUfunc_st, functionId));
  ASSERT_NE(fnAgain, nullptr);
  int shared = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), FuncGetAttribute)(
                &shared, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fnAgain),
            CUDA_SUCCESS);
  EXPECT_EQ(shared, 1024);
  // And the restored kernel runs on the restored global.
  ASSERT_EQ(PHOS_DRIVER(d(), LaunchKernel)(fnAgain, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  ASSERT_EQ(PHOS_DRIVER(d(), CtxSynchronize)(), CUDA_SUCCESS);
  ASSERT_EQ(PHOS_DRIVER(d(), MemcpyDtoH_v2)(&value, where, 4), CUDA_SUCCESS);
  EXPECT_EQ(value, 43u);
  validator.release(nullptr);
  PHOS_DRIVER(d(), ModuleUnload)(again);
}

// A linker state with an input, saved and made again under its id: it
// completes to the same image. An image whose links are hand-edited (options
// that are not a list, an option that would be an address, an input whose
// blob is gone) is refused, naming the state.
TEST_F(DomainImage, LinkStatesComeBackWithTheirInputsAndBadOnesAreRefused) {
  LinkState link;
  link.context = context_;
  link.options = std::make_unique<DriverJitOptions>();
  ASSERT_TRUE(
      link.options->set({{CU_JIT_ERROR_LOG_BUFFER, 0}, {CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, 256}}));
  ASSERT_EQ(PHOS_DRIVER(d(), LinkCreate_v2)(link.options->count(), link.options->options(),
                                            link.options->values(), &link.real),
            CUDA_SUCCESS);
  const std::string ptx = kCounterPtx;
  ASSERT_EQ(
      PHOS_DRIVER(d(), LinkAddData_v2)(link.real, CU_JIT_INPUT_PTX, const_cast<char*>(ptx.c_str()),
                                       ptx.size() + 1, "counter.ptx", 0, nullptr, nullptr),
      CUDA_SUCCESS);
  link.inputs.push_back(
      {CU_JIT_INPUT_PTX, "counter.ptx", std::vector<char>(ptx.begin(), ptx.end()), {}});
  const uint64_t id = handles_.exportHandle(HandleType::kCUlinkState_st, link.real);
  LinkStates links;
  links.all()[id] = std::move(link);
  auto writer = image::ImageWriter::create(dir_);
  ASSERT_TRUE(writer.isOk());
  json state;
  ASSERT_TRUE(links.save(**writer, state).isOk());
  auto reader = commit(**writer, {}, state);
  ASSERT_NE(reader, nullptr);
  links.destroyAll(d());

  SessionScope sc = scope();
  LinkStates back;
  ASSERT_TRUE(back.rebuild(sc, *reader, state).isOk());
  ASSERT_EQ(back.all().count(id), 1U);
  LinkState& made = back.all()[id];
  EXPECT_EQ(handles_.resolve(HandleType::kCUlinkState_st, id), static_cast<void*>(made.real));
  ASSERT_EQ(made.inputs.size(), 1U);
  EXPECT_EQ(std::string(made.inputs[0].bytes.begin(), made.inputs[0].bytes.end()), ptx);
  void* image = nullptr;
  size_t size = 0;
  ASSERT_EQ(PHOS_DRIVER(d(), LinkComplete)(made.real, &image, &size), CUDA_SUCCESS);
  EXPECT_EQ(std::string(static_cast<const char*>(image)), ptx);
  back.destroyAll(d());

  auto refused = [&](json edited, const char* what) {
    LinkStates again;
    Status st = again.rebuild(sc, *reader, edited);
    EXPECT_FALSE(st.isOk()) << what;
    EXPECT_EQ(st.code(), Code::kDataLoss) << what;
    EXPECT_NE(st.message().find("linker state"), std::string::npos) << what << ": " << st.message();
    again.destroyAll(d());
  };
  json notAList = state;
  notAList["links"][0]["options"] = "fast";
  refused(notAList, "options that are not a list");
  json address = state;
  address["links"][0]["options"] = json::array({json::array({CU_JIT_GLOBAL_SYMBOL_NAMES, 4096})});
  refused(address, "an option whose value is an address");
  json gone = state;
  gone["links"][0]["inputs"][0]["blob"] = "link/none";
  refused(gone, "an input whose blob is gone");
}

}  // namespace
}  // namespace phos::daemon
