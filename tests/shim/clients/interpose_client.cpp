// SPDX-License-Identifier: Apache-2.0
// interpose_client: adds two vectors on the GPU, reaching the Driver API one of three ways
// (direct link, dlopen + dlsym, cuGetProcAddress_v2).
//
//   interpose_client direct|dlopen|procaddress [--hold]
//
// Prints "key value" lines the test reads: where each function came from,
// what cuGetProcAddress_v2 answered, and whether the kernel's sums are right.
// With --hold it then prints "ready" and waits for stdin to close, so the test
// can look at the session in `phos ps` while the process is alive.
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#ifndef PHOS_SHIM_KERNELS_PTX
#error "PHOS_SHIM_KERNELS_PTX must name the PTX of shim_kernels.cu"
#endif

namespace {

// The entry points the client uses, however they were found.
struct DriverApi {
  decltype(&::cuGetErrorName) getErrorName = nullptr;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) deviceGet = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primaryCtxRetain = nullptr;
  decltype(&::cuCtxSetCurrent) ctxSetCurrent = nullptr;
  decltype(&::cuModuleLoad) moduleLoad = nullptr;
  decltype(&::cuModuleGetFunction) moduleGetFunction = nullptr;
  decltype(&::cuMemAlloc) memAlloc = nullptr;
  decltype(&::cuMemFree) memFree = nullptr;
  decltype(&::cuMemcpyHtoD) memcpyHtoD = nullptr;
  decltype(&::cuMemcpyDtoH) memcpyDtoH = nullptr;
  decltype(&::cuLaunchKernel) launchKernel = nullptr;
  decltype(&::cuCtxSynchronize) ctxSynchronize = nullptr;
};

// Visits every member with its exported symbol and its public name (what
// cuGetProcAddress takes).
template <typename Visit>
void forEachEntry(DriverApi& api, Visit visit) {
  visit(api.getErrorName, "cuGetErrorName", "cuGetErrorName");
  visit(api.init, "cuInit", "cuInit");
  visit(api.deviceGet, "cuDeviceGet", "cuDeviceGet");
  visit(api.primaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
  visit(api.ctxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent");
  visit(api.moduleLoad, "cuModuleLoad", "cuModuleLoad");
  visit(api.moduleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction");
  visit(api.memAlloc, "cuMemAlloc_v2", "cuMemAlloc");
  visit(api.memFree, "cuMemFree_v2", "cuMemFree");
  visit(api.memcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
  visit(api.memcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
  visit(api.launchKernel, "cuLaunchKernel", "cuLaunchKernel");
  visit(api.ctxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize");
}

void linked(DriverApi& api) {
  api.getErrorName = &cuGetErrorName;
  api.init = &cuInit;
  api.deviceGet = &cuDeviceGet;
  api.primaryCtxRetain = &cuDevicePrimaryCtxRetain;
  api.ctxSetCurrent = &cuCtxSetCurrent;
  api.moduleLoad = &cuModuleLoad;
  api.moduleGetFunction = &cuModuleGetFunction;
  api.memAlloc = &cuMemAlloc;
  api.memFree = &cuMemFree;
  api.memcpyHtoD = &cuMemcpyHtoD;
  api.memcpyDtoH = &cuMemcpyDtoH;
  api.launchKernel = &cuLaunchKernel;
  api.ctxSynchronize = &cuCtxSynchronize;
}

struct Symbol {
  std::string library;
  std::string name;
};

Symbol symbolAt(const void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0) return {"?", "?"};
  return {info.dli_fname != nullptr ? info.dli_fname : "?", info.dli_sname != nullptr ? info.dli_sname : "?"};
}

std::string name(const DriverApi& api, CUresult r) {
  const char* text = nullptr;
  if (api.getErrorName == nullptr || api.getErrorName(r, &text) != CUDA_SUCCESS) return std::to_string(r);
  return text;
}

// Every function found where the test says it must be: one line per entry.
bool reportOrigins(DriverApi& api) {
  bool complete = true;
  forEachEntry(api, [&](auto& slot, const char* symbol, const char*) {
    Symbol s = symbolAt(reinterpret_cast<const void*>(slot));
    std::printf("origin %s %s %s\n", symbol, s.name.c_str(), s.library.c_str());
    if (slot == nullptr) complete = false;
  });
  return complete;
}

// cuGetProcAddress_v2's answers the test checks besides the lookups.
void probeProcAddress(decltype(&::cuGetProcAddress_v2) getProcAddress, DriverApi& api) {
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status{};
  CUresult r = getProcAddress("cuLaunchKernel", &pfn, CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                              &status);
  Symbol s = symbolAt(pfn);
  std::printf("per_thread %s %d %s %s\n", name(api, r).c_str(), static_cast<int>(status), s.name.c_str(),
              s.library.c_str());
  pfn = reinterpret_cast<void*>(0x1);
  r = getProcAddress("cuNoSuchEntryPoint", &pfn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  std::printf("unknown_symbol %s %d %s\n", name(api, r).c_str(), static_cast<int>(status),
              pfn == nullptr ? "null" : "not-null");
  r = getProcAddress("cuInit", &pfn, CUDA_VERSION + 1000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  std::printf("version_too_new %s\n", name(api, r).c_str());
}

bool resolve(std::string_view mode, DriverApi& api) {
  if (mode == "direct") {
    linked(api);
    return true;
  }
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  std::printf("dlopen %s\n", driver != nullptr ? "ok" : dlerror());
  if (driver == nullptr) return false;
  if (mode == "dlopen") {
    // Every name the driver goes by is answered the same way.
    bool same = true;
    for (const char* alias : {"libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.1"}) {
      same = same && dlopen(alias, RTLD_NOW | RTLD_LOCAL) == driver;
    }
    std::printf("dlopen_aliases %s\n", same ? "same" : "different");
    forEachEntry(api, [&](auto& slot, const char* symbol, const char*) {
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(driver, symbol));
    });
    return true;
  }
  if (mode != "procaddress") return false;
  // The ABI the members are declared with: cuda.h's, except that from CUDA
  // 13.0 on "cuCtxSynchronize" resolves to cuCtxSynchronize_v2(CUcontext).
  constexpr int kAbiVersion = 12000;
  // How the CUDA runtime finds the driver: one dlsym, then cuGetProcAddress.
  auto getProcAddress = reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(dlsym(driver, "cuGetProcAddress_v2"));
  if (getProcAddress == nullptr) return false;
  forEachEntry(api, [&](auto& slot, const char*, const char* publicName) {
    void* pfn = nullptr;
    CUdriverProcAddressQueryResult status{};
    if (getProcAddress(publicName, &pfn, kAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS &&
        status == CU_GET_PROC_ADDRESS_SUCCESS) {
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(pfn);
    }
  });
  probeProcAddress(getProcAddress, api);
  return true;
}

#define CHECK(call)                                                                \
  do {                                                                             \
    CUresult r_ = (call);                                                          \
    if (r_ != CUDA_SUCCESS) {                                                      \
      std::printf("failed %s %s\n", #call, name(api, r_).c_str());                 \
      return false;                                                                \
    }                                                                              \
  } while (0)

bool addVectors(const DriverApi& api) {
  constexpr int n = 1000;
  std::vector<float> a(n), b(n), c(n, -1.0f);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = static_cast<float>(3 * i + 1);
  }
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;
  CUfunction add = nullptr;
  CHECK(api.init(0));
  CHECK(api.deviceGet(&device, 0));
  CHECK(api.primaryCtxRetain(&context, device));
  CHECK(api.ctxSetCurrent(context));
  CHECK(api.moduleLoad(&module, PHOS_SHIM_KERNELS_PTX));
  CHECK(api.moduleGetFunction(&add, module, "addVectors"));
  const size_t bytes = n * sizeof(float);
  CUdeviceptr da = 0, db = 0, dc = 0;
  CHECK(api.memAlloc(&da, bytes));
  CHECK(api.memAlloc(&db, bytes));
  CHECK(api.memAlloc(&dc, bytes));
  CHECK(api.memcpyHtoD(da, a.data(), bytes));
  CHECK(api.memcpyHtoD(db, b.data(), bytes));
  int count = n;
  void* params[] = {&da, &db, &dc, &count};
  CHECK(api.launchKernel(add, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
  CHECK(api.ctxSynchronize());
  CHECK(api.memcpyDtoH(c.data(), dc, bytes));
  for (int i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i]) {
      std::printf("add_vectors wrong c[%d] = %g, expected %g\n", i, c[i], a[i] + b[i]);
      return false;
    }
  }
  std::printf("add_vectors ok\n");
  // Left allocated on purpose: `phos ps` shows them while --hold waits.
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: interpose_client direct|dlopen|procaddress [--hold]\n");
    return 2;
  }
  const std::string_view mode = argv[1];
  const bool hold = argc > 2 && std::string_view(argv[2]) == "--hold";
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("pid %d\n", static_cast<int>(getpid()));
  DriverApi api;
  if (!resolve(mode, api)) {
    std::printf("failed resolving the Driver API (%s)\n", argv[1]);
    return 1;
  }
  const bool complete = reportOrigins(api);
  if (!complete || !addVectors(api)) return 1;
  if (hold) {
    std::printf("ready\n");
    std::string line;
    while (std::getline(std::cin, line)) {
    }
  }
  return 0;
}
