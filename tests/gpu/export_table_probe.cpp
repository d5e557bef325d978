// SPDX-License-Identifier: Apache-2.0
// What the driver's private tables answer about contexts, set against the
// public Driver API's answers (docs/cudart.md, "How cudart reaches the
// driver"). Run directly on a GPU it says what NVIDIA's driver does; under
// `phos run` or on vgpu, what PhOS serves: scripts/gpu-check runs it both ways
// and compares the lines.
//
//   export-table-probe        (prints one "name: value" line per fact)
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct Driver {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  template <typename Fn>
  Fn* get(const char* name) {
    void* f = lib != nullptr ? dlsym(lib, name) : nullptr;
    if (f == nullptr) {
      std::printf("error: libcuda.so.1 has no %s\n", name);
      std::exit(1);
    }
    return reinterpret_cast<Fn*>(f);
  }
};

CUuuid uuid(const char* hex) {
  CUuuid u{};
  for (int i = 0; i < 16; ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    u.bytes[i] = static_cast<char>(v);
  }
  return u;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::printf("error: %s returned %d\n", what, r);
    std::exit(1);
  }
}

}  // namespace

int main() {
  Driver d;
  auto cuInit = d.get<CUresult(unsigned)>("cuInit");
  auto getTable = d.get<CUresult(const void**, const CUuuid*)>("cuGetExportTable");
  auto ctxCreate = d.get<CUresult(CUcontext*, unsigned, CUdevice)>("cuCtxCreate_v2");
  auto ctxDestroy = d.get<CUresult(CUcontext)>("cuCtxDestroy_v2");
  auto ctxGetCurrent = d.get<CUresult(CUcontext*)>("cuCtxGetCurrent");
  auto ctxSetCurrent = d.get<CUresult(CUcontext)>("cuCtxSetCurrent");
  auto ctxGetId = d.get<CUresult(CUcontext, unsigned long long*)>("cuCtxGetId");
  auto ctxGetDevice = d.get<CUresult(CUdevice*)>("cuCtxGetDevice");
  check(cuInit(0), "cuInit");
  CUcontext a = nullptr, b = nullptr;
  check(ctxCreate(&a, 0, 0), "cuCtxCreate (first)");
  check(ctxCreate(&b, 0, 0), "cuCtxCreate (second)");
  check(ctxSetCurrent(a), "cuCtxSetCurrent");
  CUdevice device = -1;
  check(ctxGetDevice(&device), "cuCtxGetDevice");
  unsigned long long idA = 0, idB = 0;
  check(ctxGetId(a, &idA), "cuCtxGetId");
  check(ctxGetId(b, &idB), "cuCtxGetId");

  // The tables cuBLASLt asks for. PhOS serves the first two; the driver's
  // answer for the others goes to stderr (PhOS refuses them, and cuBLASLt goes on).
  for (const char* t : {"42d85a8123f6cb478298f6e78a3aecdc", "21318c60971432488ca641ff7324c8f2",
                        "f8cff95121468b4eb9e2fb469e7c0dd9", "69a28e9f24498b47b030c5da330ea4e9"}) {
    const void* table = nullptr;
    CUuuid id = uuid(t);
    CUresult r = getTable(&table, &id);
    const bool served = t[0] == '4' || t[0] == '2';
    std::fprintf(served ? stdout : stderr, "table %.8s: %s\n", t,
                 r == CUDA_SUCCESS ? "found" : ("refused " + std::to_string(r)).c_str());
  }
  const void* tlsTable = nullptr;
  const void* contextTable = nullptr;
  CUuuid tlsId = uuid("42d85a8123f6cb478298f6e78a3aecdc"),
         contextId = uuid("21318c60971432488ca641ff7324c8f2");
  if (getTable(&tlsTable, &tlsId) == CUDA_SUCCESS) {
    auto slots = static_cast<const void* const*>(tlsTable);
    // [2], taken to write the calling thread's context.
    CUcontext got = reinterpret_cast<CUcontext>(0x1);
    CUresult r = reinterpret_cast<CUresult (*)(CUcontext*)>(slots[2])(&got);
    std::printf("TOOLS_TLS[2](&context): %d, %s\n", r,
                got == a         ? "the current context"
                : got == nullptr ? "null"
                                 : "another value");
  }
  if (getTable(&contextTable, &contextId) == CUDA_SUCCESS) {
    auto slots = static_cast<const void* const*>(contextTable);
    std::fprintf(stderr, "TOOLS_CONTEXT: %zu bytes\n", reinterpret_cast<std::size_t>(slots[0]));
    // [4], taken to be cuCtxGetId.
    for (CUcontext c : {a, b}) {
      unsigned long long got = 0;
      CUresult r =
          reinterpret_cast<CUresult (*)(CUcontext, unsigned long long*)>(slots[4])(c, &got);
      std::printf("TOOLS_CONTEXT[4](context, &id): %d, %s\n", r,
                  got == (c == a ? idA : idB) ? "cuCtxGetId's id" : "another value");
    }
    // [3]: the context's device. (With its arguments the other way round,
    // NVIDIA's driver 580 faults.)
    CUdevice got = -7;
    CUresult r = reinterpret_cast<CUresult (*)(CUcontext, CUdevice*)>(slots[3])(a, &got);
    std::printf("TOOLS_CONTEXT[3](context, &device): %d, %s\n", r,
                got == device ? "the context's device"
                : got == -7   ? "nothing written"
                              : "another value");
  }
  CUcontext current = nullptr;
  check(ctxGetCurrent(&current), "cuCtxGetCurrent");
  std::printf("the current context stayed: %s\n", current == a ? "yes" : "no");
  check(ctxDestroy(b), "cuCtxDestroy");
  check(ctxDestroy(a), "cuCtxDestroy");
  std::printf("OK\n");
  return 0;
}
