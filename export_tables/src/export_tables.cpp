// SPDX-License-Identifier: Apache-2.0
// NVIDIA's private export tables, as data: for each table its UUID, its slots
// (an array of function pointers; slot 0 holds the table's size in bytes,
// except in CONTEXT_LOCAL_STORAGE, which has none) and, behind them,
// functions written over the public Driver API. docs/cudart.md says what each
// slot does and how it was learned.
#include <pthread.h>
#include <unistd.h>

#include <array>
#include <initializer_list>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "phos/common/log.h"
#include "phos/export_tables/export_tables.h"

namespace phos::export_tables {
namespace {

using Slot = const void*;

template <typename Fn>
Slot slot(Fn* fn) {
  return reinterpret_cast<Slot>(fn);
}
Slot sizeSlot(std::size_t slots) { return reinterpret_cast<Slot>(slots * sizeof(Slot)); }

std::shared_ptr<spdlog::logger> logger() {
  static auto log = log::get("export_tables");
  return log;
}

// A slot the runtime has never been seen to call. A function rather than a
// null pointer: if it is called, it says which, and fails cleanly.
template <int kTable, int kSlot>
CUresult CUDAAPI unknownSlot() {
  static std::once_flag once;
  std::call_once(once, [] {
    logger()->warn("the CUDA runtime called slot {} of private table {}, which PhOS does not serve", kSlot, kTable);
  });
  return CUDA_ERROR_NOT_SUPPORTED;
}

enum TableIndex {
  kCudartInterface,
  kToolsTls,
  kToolsCallbacks,
  kContextStorage,
  kContextChecks,
  kIntegrity,
  kToolsContext
};

template <int kTable, std::size_t N, std::size_t... I>
std::array<Slot, N> unknownSlots(std::index_sequence<I...>) {
  return {slot(&unknownSlot<kTable, static_cast<int>(I)>)...};
}
template <int kTable, std::size_t N>
std::array<Slot, N> tableOf(std::initializer_list<std::pair<std::size_t, Slot>> known, bool sized = true) {
  auto t = unknownSlots<kTable, N>(std::make_index_sequence<N>{});
  if (sized) t[0] = sizeSlot(N);
  for (const auto& [index, fn] : known) t[index] = fn;
  return t;
}

// ---- CUDART_INTERFACE: modules and primary contexts ------------------------------
// [1] a module from the fatbin wrapper nvcc embeds (__fatBinC_Wrapper_t):
// what cuModuleLoadData does with it.
CUresult CUDAAPI moduleFromWrapper(CUmodule* module, const void* wrapper) {
  if (module == nullptr || wrapper == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuModuleLoadData(module, wrapper);
}

// [2] the device's primary context, retained for the runtime.
CUresult CUDAAPI primaryContext(CUcontext* context, CUdevice device) {
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuDevicePrimaryCtxRetain(context, device);
}

// [6] and [8]: as [1], with arguments whose meaning is not known; any but
// their zero values is refused rather than ignored.
CUresult CUDAAPI moduleFromWrapperExt1(CUmodule* module, const void* wrapper, void* a3, void* a4, unsigned a5) {
  if (a3 != nullptr || a4 != nullptr || a5 != 0) return CUDA_ERROR_NOT_SUPPORTED;
  return moduleFromWrapper(module, wrapper);
}
CUresult CUDAAPI moduleFromFatbinExt2(const void* fatbin, CUmodule* module, void* a3, void* a4, unsigned a5) {
  if (a3 != nullptr || a4 != nullptr || a5 != 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (module == nullptr || fatbin == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuModuleLoadData(module, fatbin);
}

// [7] takes a size and returns nothing the runtime looks at.
void CUDAAPI takeSize(std::size_t) {}

// [12] loads the driver's PTX compilers: the driver here needs none loaded.
CUresult CUDAAPI loadCompilers() { return CUDA_SUCCESS; }

// ---- TOOLS_TLS and TOOLS_RUNTIME_CALLBACK_HOOKS: tools (profilers, debuggers) ---------
// cudart 13.2 (PyTorch's) calls the hooks' [1] and [4] as it starts; what they
// take is not known. With no tool attached to the process these slots answer
// 0, as the other public implementations of the tables do, and cudart goes
// on. Not a failure: no tool is what PhOS offers.
CUresult CUDAAPI noToolAttached() { return CUDA_SUCCESS; }

// TOOLS_TLS [2]: the calling thread's current context, as cuCtxGetCurrent.
// cudart 13.2 calls it as it starts, and cuBLASLt keys its kernels by the
// context it answers: an answer left unwritten leaves cuBLASLt without a
// single kernel to offer (cublasLtMatmulAlgoGetHeuristic: not supported).
CUresult CUDAAPI threadContext(CUcontext* context) {
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuCtxGetCurrent(context);
}

// ---- TOOLS_CONTEXT: what a context is, for the libraries -----------------------------
// cuBLASLt asks [3] for a context's device and [4] for its unique id
// (cuCtxGetId's); both answered as NVIDIA's driver 580 does, probed on an H200
// (tests/gpu/export_table_probe.cpp). The driver serves 92 slots here; the
// others are not known to be called.
CUresult CUDAAPI contextDevice(CUcontext context, CUdevice* device) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuCtxGetDevice_v2(device, context);
}
CUresult CUDAAPI contextId(CUcontext context, unsigned long long* id) {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuCtxGetId(context, id);
}

// Two buffers the runtime keeps tool state in.
template <std::size_t N>
void CUDAAPI hookBuffer(void** buffer, std::size_t* size) {
  static std::array<std::uint8_t, N> storage{};
  if (buffer != nullptr) *buffer = storage.data();
  if (size != nullptr) *size = storage.size();
}

// ---- CONTEXT_LOCAL_STORAGE: the runtime's per-context state ---------------------------
using StorageDestructor = void(CUDAAPI*)(CUcontext context, void* key, void* value);
struct StoredValue {
  void* value = nullptr;
  StorageDestructor destructor = nullptr;
};

std::mutex& storageMutex() {
  static auto* m = new std::mutex();  // outlives static destruction: the runtime tears down late
  return *m;
}
std::map<CUcontext, std::map<void*, StoredValue>>& storage() {
  static auto* s = new std::map<CUcontext, std::map<void*, StoredValue>>();
  return *s;
}

// A null context is the calling thread's current one.
CUresult resolveContext(CUcontext* context) {
  if (*context != nullptr) return CUDA_SUCCESS;
  if (CUresult r = cuCtxGetCurrent(context); r != CUDA_SUCCESS) return r;
  return *context != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI storagePut(CUcontext context, void* key, void* value, StorageDestructor destructor) {
  if (CUresult r = resolveContext(&context); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(storageMutex());
  storage()[context][key] = {value, destructor};
  return CUDA_SUCCESS;
}

// Forgets a value; its owner frees it (the destructor is for a context that dies).
CUresult CUDAAPI storageDelete(CUcontext context, void* key) {
  if (CUresult r = resolveContext(&context); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(storageMutex());
  auto c = storage().find(context);
  if (c == storage().end() || c->second.erase(key) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI storageGet(void** value, CUcontext context, void* key) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = resolveContext(&context); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(storageMutex());
  auto c = storage().find(context);
  if (c == storage().end()) return CUDA_ERROR_INVALID_HANDLE;
  auto v = c->second.find(key);
  if (v == c->second.end()) return CUDA_ERROR_INVALID_HANDLE;
  *value = v->second.value;
  return CUDA_SUCCESS;
}

// ---- CONTEXT_CHECKS ------------------------------------------------------------------
// [2] reports flags of a context that are never observed set; [3] answers 0.
CUresult CUDAAPI contextCheck(CUcontext, std::uint32_t* flags, const void** detail) {
  if (flags != nullptr) *flags = 0;
  if (detail != nullptr) *detail = nullptr;
  return CUDA_SUCCESS;
}
std::uint32_t CUDAAPI contextCheckZero() { return 0; }

// ---- INTEGRITY_CHECK -------------------------------------------------------------------
CUresult CUDAAPI integrityCheck(std::uint32_t version, std::uint64_t unixSeconds, std::uint64_t out[2]);

const std::array<Slot, 13>& cudartInterface() {
  static const auto t = tableOf<kCudartInterface, 13>({{1, slot(&moduleFromWrapper)},
                                                       {2, slot(&primaryContext)},
                                                       {6, slot(&moduleFromWrapperExt1)},
                                                       {7, slot(&takeSize)},
                                                       {8, slot(&moduleFromFatbinExt2)},
                                                       {12, slot(&loadCompilers)}});
  return t;
}
const std::array<Slot, 3>& integrityTable() {
  static const auto t = tableOf<kIntegrity, 3>({{1, slot(&integrityCheck)}});
  return t;
}

// The runtime hashes what only this process knows (its pid, the calling
// thread, where these tables are) with what the driver says of itself and of
// each device, and compares with its own hash: the tables must be served in
// the application, and the devices must be those it sees.
CUresult CUDAAPI integrityCheck(std::uint32_t version, std::uint64_t unixSeconds, std::uint64_t out[2]) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Versions ending in 0 and 1 take fixed answers.
  if (version % 10 == 0 || version % 10 == 1) {
    out[0] = version % 10 == 0 ? 0x3341181C03CB675Cull : 0x1841181C03CB675Cull;
    out[1] = 0x8ED383AA1F4CD1E8ull;
    return CUDA_SUCCESS;
  }
  int driverVersion = 0;
  if (CUresult r = cuDriverGetVersion(&driverVersion); r != CUDA_SUCCESS) return r;
  struct {
    std::uint32_t driverVersion, version, process, thread;
    const void* cudartTable;
    const void* integrityTable;
    const void* function;
    std::uint64_t unixSeconds;
  } head{static_cast<std::uint32_t>(driverVersion),
         version,
         static_cast<std::uint32_t>(getpid()),
         static_cast<std::uint32_t>(pthread_self()),
         cudartInterface().data(),
         integrityTable().data(),
         integrityTable()[1],
         unixSeconds};
  static_assert(sizeof(head) == 48);
  std::vector<std::uint8_t> message(sizeof(head));
  std::memcpy(message.data(), &head, sizeof(head));
  int devices = 0;
  if (CUresult r = cuDeviceGetCount(&devices); r != CUDA_SUCCESS) return r;
  for (int d = 0; d < devices; ++d) {
    struct {
      CUuuid uuid;
      std::int32_t domain, bus, device;
    } id{};
    static_assert(sizeof(id) == 28);
    if (CUresult r = cuDeviceGetUuid_v2(&id.uuid, d); r != CUDA_SUCCESS) return r;
    for (auto [attribute, value] : {std::pair{CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, &id.domain},
                                    std::pair{CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, &id.bus},
                                    std::pair{CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, &id.device}}) {
      if (CUresult r = cuDeviceGetAttribute(value, attribute, d); r != CUDA_SUCCESS) return r;
    }
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&id);
    message.insert(message.end(), bytes, bytes + sizeof(id));
  }
  integrityHash(message, out);
  return CUDA_SUCCESS;
}

// ---- the tables by UUID ----------------------------------------------------------------
struct Table {
  CUuuid id;
  const char* name;
  const Slot* (*slots)();
};

constexpr CUuuid uuid(std::array<unsigned char, 16> b) {
  CUuuid u{};
  for (std::size_t i = 0; i < b.size(); ++i) u.bytes[i] = static_cast<char>(b[i]);
  return u;
}

const Table kTables[] = {
    {uuid({0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d,
           0xf9}),
     "CUDART_INTERFACE", [] { return cudartInterface().data(); }},
    {uuid({0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec,
           0xdc}),
     "TOOLS_TLS",
     [] {
       static const auto t = tableOf<kToolsTls, 4>(
           {{1, slot(&noToolAttached)}, {2, slot(&threadContext)}, {3, slot(&noToolAttached)}});
       return t.data();
     }},
    {uuid({0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a,
           0x66}),
     "TOOLS_RUNTIME_CALLBACK_HOOKS",
     [] {
       static const auto t = tableOf<kToolsCallbacks, 7>({{1, slot(&noToolAttached)},
                                                          {2, slot(&hookBuffer<1024>)},
                                                          {3, slot(&noToolAttached)},
                                                          {4, slot(&noToolAttached)},
                                                          {5, slot(&noToolAttached)},
                                                          {6, slot(&hookBuffer<14>)}});
       return t.data();
     }},
    {uuid({0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95,
           0x93}),
     "CONTEXT_LOCAL_STORAGE_V0301",
     [] {
       static const auto t = tableOf<kContextStorage, 4>(
           {{0, slot(&storagePut)}, {1, slot(&storageDelete)}, {2, slot(&storageGet)}}, false);
       return t.data();
     }},
    {uuid({0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa,
           0x7e}),
     "CONTEXT_CHECKS",
     [] {
       static const auto t = tableOf<kContextChecks, 4>({{2, slot(&contextCheck)}, {3, slot(&contextCheckZero)}});
       return t.data();
     }},
    {uuid({0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1,
           0xf2}),
     "INTEGRITY_CHECK", [] { return integrityTable().data(); }},
    {uuid({0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8,
           0xf2}),
     "TOOLS_CONTEXT",
     [] {
       // As long as the driver's (93 entries, the size included, in driver
       // 580; 95 in 595): a caller may check the size before it takes a slot.
       static const auto t =
           tableOf<kToolsContext, 95>({{3, slot(&contextDevice)}, {4, slot(&contextId)}});
       return t.data();
     }},
};

const Table* lookup(const CUuuid& id) {
  for (const Table& t : kTables) {
    if (std::memcmp(t.id.bytes, id.bytes, sizeof(id.bytes)) == 0) return &t;
  }
  return nullptr;
}

}  // namespace

const void* find(const CUuuid& id) {
  const Table* t = lookup(id);
  return t != nullptr ? t->slots() : nullptr;
}

const char* name(const CUuuid& id) {
  const Table* t = lookup(id);
  return t != nullptr ? t->name : nullptr;
}

std::string uuidText(const CUuuid& id) {
  std::string out;
  for (std::size_t i = 0; i < sizeof(id.bytes); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += fmt::format("{:02x}", static_cast<unsigned char>(id.bytes[i]));
  }
  return out;
}

void contextDestroyed(CUcontext context) {
  std::map<void*, StoredValue> values;
  {
    std::lock_guard lock(storageMutex());
    auto c = storage().find(context);
    if (c == storage().end()) return;
    values = std::move(c->second);
    storage().erase(c);
  }
  // Outside the lock: a destructor may call the tables again.
  for (const auto& [key, v] : values) {
    if (v.destructor != nullptr) v.destructor(context, key, v.value);
  }
}

}  // namespace phos::export_tables
