// SPDX-License-Identifier: Apache-2.0
// vgpu's libnvrtc.so.13: NVIDIA's NVRTC, except that a compile for a real
// architecture yields PTX where it would yield a cubin.
//
// Programs written like NVIDIA's cuda-samples compile with NVRTC for the
// device's architecture (`--gpu-architecture=sm_80`) and load what
// nvrtcGetCUBIN returns. A real cubin is machine code, which vgpu cannot run
// (CUDA_ERROR_NO_BINARY_FOR_GPU). This library, found first when vgpu's
// directory leads LD_LIBRARY_PATH, forwards every NVRTC entry point to
// NVIDIA's libnvrtc.so.13 from the CUDA toolkit, with one change: when the
// options name a real architecture `sm_XX` (with its `a`/`f` suffix, in any
// spelling NVRTC accepts: `--gpu-architecture=sm_XX`, `-arch=sm_XX`, or the
// option and its value as two strings), the program is compiled for
// `compute_XX` instead, and nvrtcGetCUBINSize/nvrtcGetCUBIN return that PTX,
// NUL-terminated, which vgpu's (and NVIDIA's) cuModuleLoadData accept.
// nvrtcGetPTX returns the same PTX, as it would for the cubin's compile.
// Compiles for a virtual architecture (`compute_XX`), for LTO-IR (`-dlto`)
// or OptiX IR are forwarded untouched, so nvrtcGetCUBIN behaves as NVRTC
// documents for them.
//
// NVIDIA's library is $PHOS_VGPU_NVRTC when set, else the toolkit's found at
// build time (PHOS_VGPU_NVRTC_DEFAULT); it is loaded by absolute path with its
// own symbols first (RTLD_DEEPBIND), and a library that turns out to be this
// one is refused, so calls never come back here.
#include <nvrtc.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#define PHOS_NVRTC_API extern "C" __attribute__((visibility("default")))

namespace {

struct NvidiaNvrtc {
  void* handle = nullptr;
  std::string path;
  std::string why;  // why it is not loaded
  decltype(&nvrtcGetErrorString) getErrorString = nullptr;
  decltype(&nvrtcVersion) version = nullptr;
  decltype(&nvrtcGetNumSupportedArchs) getNumSupportedArchs = nullptr;
  decltype(&nvrtcGetSupportedArchs) getSupportedArchs = nullptr;
  decltype(&nvrtcCreateProgram) createProgram = nullptr;
  decltype(&nvrtcDestroyProgram) destroyProgram = nullptr;
  decltype(&nvrtcCompileProgram) compileProgram = nullptr;
  decltype(&nvrtcGetPTXSize) getPtxSize = nullptr;
  decltype(&nvrtcGetPTX) getPtx = nullptr;
  decltype(&nvrtcGetCUBINSize) getCubinSize = nullptr;
  decltype(&nvrtcGetCUBIN) getCubin = nullptr;
  decltype(&nvrtcGetLTOIRSize) getLtoirSize = nullptr;
  decltype(&nvrtcGetLTOIR) getLtoir = nullptr;
  decltype(&nvrtcGetOptiXIRSize) getOptixirSize = nullptr;
  decltype(&nvrtcGetOptiXIR) getOptixir = nullptr;
  decltype(&nvrtcGetProgramLogSize) getProgramLogSize = nullptr;
  decltype(&nvrtcGetProgramLog) getProgramLog = nullptr;
  decltype(&nvrtcAddNameExpression) addNameExpression = nullptr;
  decltype(&nvrtcGetLoweredName) getLoweredName = nullptr;
  decltype(&nvrtcGetPCHHeapSize) getPchHeapSize = nullptr;
  decltype(&nvrtcSetPCHHeapSize) setPchHeapSize = nullptr;
  decltype(&nvrtcGetPCHCreateStatus) getPchCreateStatus = nullptr;
  decltype(&nvrtcGetPCHHeapSizeRequired) getPchHeapSizeRequired = nullptr;
  decltype(&nvrtcSetFlowCallback) setFlowCallback = nullptr;
  void* cpEx = nullptr;  // __nvrtcCPEx, not declared in nvrtc.h
};

#ifndef PHOS_VGPU_NVRTC_DEFAULT
#define PHOS_VGPU_NVRTC_DEFAULT ""
#endif

const NvidiaNvrtc& nvidia() {
  static const NvidiaNvrtc nv = [] {
    NvidiaNvrtc n;
    const char* env = std::getenv("PHOS_VGPU_NVRTC");
    n.path = (env != nullptr && *env != '\0') ? env : PHOS_VGPU_NVRTC_DEFAULT;
    if (n.path.empty()) {
      n.why = "no NVIDIA libnvrtc.so.13 was found when vgpu was built; set PHOS_VGPU_NVRTC to it";
    } else if (n.path.front() != '/') {
      n.why = "PHOS_VGPU_NVRTC='" + n.path + "' is not an absolute path";
    } else {
      n.handle = dlopen(n.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (n.handle == nullptr) {
        const char* err = dlerror();
        n.why = "cannot load NVIDIA's NVRTC " + n.path + ": " + (err != nullptr ? err : "unknown error") +
                " (set PHOS_VGPU_NVRTC to its libnvrtc.so.13)";
      } else if (dlsym(n.handle, "phos_vgpu_nvrtc") != nullptr) {
        dlclose(n.handle);
        n.handle = nullptr;
        n.why = n.path + " is vgpu's own NVRTC, not NVIDIA's (set PHOS_VGPU_NVRTC to the toolkit's libnvrtc.so.13)";
      }
    }
    if (n.handle == nullptr) {
      std::fprintf(stderr, "vgpu NVRTC: %s\n", n.why.c_str());
      return n;
    }
    bool complete = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(n.handle, name));
      complete = complete && fn != nullptr;
    };
    get(n.getErrorString, "nvrtcGetErrorString");
    get(n.version, "nvrtcVersion");
    get(n.getNumSupportedArchs, "nvrtcGetNumSupportedArchs");
    get(n.getSupportedArchs, "nvrtcGetSupportedArchs");
    get(n.createProgram, "nvrtcCreateProgram");
    get(n.destroyProgram, "nvrtcDestroyProgram");
    get(n.compileProgram, "nvrtcCompileProgram");
    get(n.getPtxSize, "nvrtcGetPTXSize");
    get(n.getPtx, "nvrtcGetPTX");
    get(n.getCubinSize, "nvrtcGetCUBINSize");
    get(n.getCubin, "nvrtcGetCUBIN");
    get(n.getLtoirSize, "nvrtcGetLTOIRSize");
    get(n.getLtoir, "nvrtcGetLTOIR");
    get(n.getOptixirSize, "nvrtcGetOptiXIRSize");
    get(n.getOptixir, "nvrtcGetOptiXIR");
    get(n.getProgramLogSize, "nvrtcGetProgramLogSize");
    get(n.getProgramLog, "nvrtcGetProgramLog");
    get(n.addNameExpression, "nvrtcAddNameExpression");
    get(n.getLoweredName, "nvrtcGetLoweredName");
    get(n.getPchHeapSize, "nvrtcGetPCHHeapSize");
    get(n.setPchHeapSize, "nvrtcSetPCHHeapSize");
    get(n.getPchCreateStatus, "nvrtcGetPCHCreateStatus");
    get(n.getPchHeapSizeRequired, "nvrtcGetPCHHeapSizeRequired");
    get(n.setFlowCallback, "nvrtcSetFlowCallback");
    n.cpEx = dlsym(n.handle, "__nvrtcCPEx");  // optional: private to NVIDIA
    if (!complete) {
      n.why = n.path + " lacks entry points of NVRTC 13 (nvrtc.h)";
      std::fprintf(stderr, "vgpu NVRTC: %s\n", n.why.c_str());
      dlclose(n.handle);
      n.handle = nullptr;
    }
    return n;
  }();
  return nv;
}

bool loaded() { return nvidia().handle != nullptr; }

// Programs compiled for compute_XX in place of a requested sm_XX: their "cubin"
// is their PTX.
std::mutex& programsMutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<nvrtcProgram>& ptxAsCubin() {
  static std::set<nvrtcProgram> programs;
  return programs;
}
bool servesPtxAsCubin(nvrtcProgram prog) {
  std::lock_guard lock(programsMutex());
  return ptxAsCubin().count(prog) != 0;
}
void setServesPtxAsCubin(nvrtcProgram prog, bool on) {
  std::lock_guard lock(programsMutex());
  if (on) {
    ptxAsCubin().insert(prog);
  } else {
    ptxAsCubin().erase(prog);
  }
}

// The options with every real architecture `sm_XX...` turned into `compute_XX...`,
// and whether there was one. NVRTC takes `--gpu-architecture=A`, `-arch=A`, and
// `--gpu-architecture`/`-arch` followed by A as the next option.
struct RewrittenOptions {
  std::vector<std::string> options;
  bool realArchitecture = false;
};

RewrittenOptions rewriteArchitecture(int numOptions, const char* const* options) {
  RewrittenOptions out;
  bool noMachineCode = false;  // LTO-IR or OptiX IR: neither PTX nor a cubin is made
  bool valueNext = false;
  for (int i = 0; i < numOptions; ++i) {
    std::string o = options[i] != nullptr ? options[i] : "";
    if (o == "-dlto" || o == "--dlink-time-opt" || o == "-optix-ir" || o == "--optix-ir") noMachineCode = true;
    std::size_t valueAt = std::string::npos;
    if (valueNext) {
      valueAt = 0;
    } else if (o.rfind("--gpu-architecture=", 0) == 0 || o.rfind("-arch=", 0) == 0) {
      valueAt = o.find('=') + 1;
    }
    valueNext = (o == "--gpu-architecture" || o == "-arch");
    if (valueAt != std::string::npos && o.compare(valueAt, 3, "sm_") == 0) {
      o.replace(valueAt, 2, "compute");
      out.realArchitecture = true;
    }
    out.options.push_back(std::move(o));
  }
  if (noMachineCode) {  // forwarded as given
    out.options.assign(options, options + numOptions);
    out.realArchitecture = false;
  }
  return out;
}

}  // namespace

PHOS_NVRTC_API const char* nvrtcGetErrorString(nvrtcResult result) {
  if (loaded()) return nvidia().getErrorString(result);
  // Without NVIDIA's library, its names (nvrtc.h) so that callers can still report.
  switch (result) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    case NVRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE";
    case NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION: return "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION";
    case NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION: return "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION";
    case NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID: return "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID";
    case NVRTC_ERROR_INTERNAL_ERROR: return "NVRTC_ERROR_INTERNAL_ERROR";
    case NVRTC_ERROR_TIME_FILE_WRITE_FAILED: return "NVRTC_ERROR_TIME_FILE_WRITE_FAILED";
    case NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED: return "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED";
    case NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED: return "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED";
    case NVRTC_ERROR_PCH_CREATE: return "NVRTC_ERROR_PCH_CREATE";
    case NVRTC_ERROR_CANCELLED: return "NVRTC_ERROR_CANCELLED";
    case NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED: return "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED";
  }
  return "NVRTC_ERROR unknown";
}

// Without NVIDIA's library every entry point fails as NVRTC does internally
// (the reason went to stderr once, when the library was looked for).
#define PHOS_NVRTC_FORWARD(member, ...) \
  return loaded() ? nvidia().member(__VA_ARGS__) : NVRTC_ERROR_INTERNAL_ERROR

PHOS_NVRTC_API nvrtcResult nvrtcVersion(int* major, int* minor) { PHOS_NVRTC_FORWARD(version, major, minor); }
PHOS_NVRTC_API nvrtcResult nvrtcGetNumSupportedArchs(int* numArchs) {
  PHOS_NVRTC_FORWARD(getNumSupportedArchs, numArchs);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetSupportedArchs(int* supportedArchs) {
  PHOS_NVRTC_FORWARD(getSupportedArchs, supportedArchs);
}
PHOS_NVRTC_API nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int numHeaders,
                                              const char* const* headers, const char* const* includeNames) {
  PHOS_NVRTC_FORWARD(createProgram, prog, src, name, numHeaders, headers, includeNames);
}

PHOS_NVRTC_API nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
  if (!loaded()) return NVRTC_ERROR_INTERNAL_ERROR;
  if (prog != nullptr) setServesPtxAsCubin(*prog, false);
  return nvidia().destroyProgram(prog);
}

PHOS_NVRTC_API nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char* const* options) {
  if (!loaded()) return NVRTC_ERROR_INTERNAL_ERROR;
  if (numOptions <= 0 || options == nullptr) {  // NVRTC's own checks and default target
    setServesPtxAsCubin(prog, false);
    return nvidia().compileProgram(prog, numOptions, options);
  }
  RewrittenOptions rewritten = rewriteArchitecture(numOptions, options);
  std::vector<const char*> argv;
  argv.reserve(rewritten.options.size());
  for (const std::string& o : rewritten.options) argv.push_back(o.c_str());
  const nvrtcResult r = nvidia().compileProgram(prog, static_cast<int>(argv.size()), argv.data());
  setServesPtxAsCubin(prog, r == NVRTC_SUCCESS && rewritten.realArchitecture);
  return r;
}

PHOS_NVRTC_API nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t* ptxSizeRet) {
  PHOS_NVRTC_FORWARD(getPtxSize, prog, ptxSizeRet);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char* ptx) { PHOS_NVRTC_FORWARD(getPtx, prog, ptx); }

// For a compile whose sm_XX became compute_XX, the "cubin" is the PTX (its size
// counts the terminating NUL, as nvrtcGetPTXSize's does).
PHOS_NVRTC_API nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* cubinSizeRet) {
  if (!loaded()) return NVRTC_ERROR_INTERNAL_ERROR;
  if (servesPtxAsCubin(prog)) return nvidia().getPtxSize(prog, cubinSizeRet);
  return nvidia().getCubinSize(prog, cubinSizeRet);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin) {
  if (!loaded()) return NVRTC_ERROR_INTERNAL_ERROR;
  if (servesPtxAsCubin(prog)) return nvidia().getPtx(prog, cubin);
  return nvidia().getCubin(prog, cubin);
}

PHOS_NVRTC_API nvrtcResult nvrtcGetLTOIRSize(nvrtcProgram prog, size_t* LTOIRSizeRet) {
  PHOS_NVRTC_FORWARD(getLtoirSize, prog, LTOIRSizeRet);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetLTOIR(nvrtcProgram prog, char* LTOIR) { PHOS_NVRTC_FORWARD(getLtoir, prog, LTOIR); }
PHOS_NVRTC_API nvrtcResult nvrtcGetOptiXIRSize(nvrtcProgram prog, size_t* optixirSizeRet) {
  PHOS_NVRTC_FORWARD(getOptixirSize, prog, optixirSizeRet);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetOptiXIR(nvrtcProgram prog, char* optixir) {
  PHOS_NVRTC_FORWARD(getOptixir, prog, optixir);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* logSizeRet) {
  PHOS_NVRTC_FORWARD(getProgramLogSize, prog, logSizeRet);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) {
  PHOS_NVRTC_FORWARD(getProgramLog, prog, log);
}
PHOS_NVRTC_API nvrtcResult nvrtcAddNameExpression(nvrtcProgram prog, const char* const name_expression) {
  PHOS_NVRTC_FORWARD(addNameExpression, prog, name_expression);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetLoweredName(nvrtcProgram prog, const char* const name_expression,
                                               const char** lowered_name) {
  PHOS_NVRTC_FORWARD(getLoweredName, prog, name_expression, lowered_name);
}
PHOS_NVRTC_API nvrtcResult nvrtcGetPCHHeapSize(size_t* ret) { PHOS_NVRTC_FORWARD(getPchHeapSize, ret); }
PHOS_NVRTC_API nvrtcResult nvrtcSetPCHHeapSize(size_t size) { PHOS_NVRTC_FORWARD(setPchHeapSize, size); }
PHOS_NVRTC_API nvrtcResult nvrtcGetPCHCreateStatus(nvrtcProgram prog) { PHOS_NVRTC_FORWARD(getPchCreateStatus, prog); }
PHOS_NVRTC_API nvrtcResult nvrtcGetPCHHeapSizeRequired(nvrtcProgram prog, size_t* size) {
  PHOS_NVRTC_FORWARD(getPchHeapSizeRequired, prog, size);
}
PHOS_NVRTC_API nvrtcResult nvrtcSetFlowCallback(nvrtcProgram prog, int (*callback)(void*, void*), void* payload) {
  PHOS_NVRTC_FORWARD(setFlowCallback, prog, callback, payload);
}

// Tells this library apart from NVIDIA's when looking for the latter.
PHOS_NVRTC_API int phos_vgpu_nvrtc() { return 1; }

// __nvrtcCPEx is exported by NVIDIA's libnvrtc.so.13 but declared nowhere, so
// its arguments are unknown: it is forwarded by a trampoline that finds
// NVIDIA's function and jumps to it with the argument registers (integer,
// vector, and %al for variadic calls) and the stack as the caller left them.
extern "C" __attribute__((visibility("hidden"), used)) void* phos_vgpu_nvrtc_cpex_target() {
  return loaded() ? nvidia().cpEx : nullptr;
}
#if defined(__x86_64__)
asm(R"(
    .text
    .globl __nvrtcCPEx
    .type __nvrtcCPEx, @function
__nvrtcCPEx:
    pushq %rdi
    pushq %rsi
    pushq %rdx
    pushq %rcx
    pushq %r8
    pushq %r9
    pushq %rax
    subq $128, %rsp
    movdqu %xmm0, 0(%rsp)
    movdqu %xmm1, 16(%rsp)
    movdqu %xmm2, 32(%rsp)
    movdqu %xmm3, 48(%rsp)
    movdqu %xmm4, 64(%rsp)
    movdqu %xmm5, 80(%rsp)
    movdqu %xmm6, 96(%rsp)
    movdqu %xmm7, 112(%rsp)
    call phos_vgpu_nvrtc_cpex_target
    movq %rax, %r11
    movdqu 0(%rsp), %xmm0
    movdqu 16(%rsp), %xmm1
    movdqu 32(%rsp), %xmm2
    movdqu 48(%rsp), %xmm3
    movdqu 64(%rsp), %xmm4
    movdqu 80(%rsp), %xmm5
    movdqu 96(%rsp), %xmm6
    movdqu 112(%rsp), %xmm7
    addq $128, %rsp
    popq %rax
    popq %r9
    popq %r8
    popq %rcx
    popq %rdx
    popq %rsi
    popq %rdi
    testq %r11, %r11
    jz 1f
    jmp *%r11
1:
    movl $11, %eax
    ret
    .size __nvrtcCPEx, .-__nvrtcCPEx
)");
#endif
