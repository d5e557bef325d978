// SPDX-License-Identifier: Apache-2.0
// vgpu's libnvJitLink.so.13: the nvJitLink API of nvJitLink.h for the virtual GPU.
//
// Python clients (numba-cuda through cuda.core) link their kernels with
// nvJitLink and load the "cubin" it returns. NVIDIA's nvJitLink compiles to
// machine code, which vgpu cannot run (CUDA_ERROR_NO_BINARY_FOR_GPU). This
// library, found first when vgpu's directory leads LD_LIBRARY_PATH, links to
// PTX instead, and the linked "cubin" is that PTX text, which vgpu's (and
// NVIDIA's) cuModuleLoadData accept:
//   - PTX inputs (or a fatbin's PTX for the -arch asked) are kept as they are,
//     as vgpu's cuLink* does; one module, since PTX modules that reference each
//     other would need a real linker;
//   - LTO-IR (numba-cuda's default when nvJitLink is there) is linked by
//     NVIDIA's own libnvJitLink from the CUDA toolkit, with -lto -ptx: its
//     link-time optimization, PTX out. Without the toolkit's library, LTO-IR
//     is refused with a log naming what is missing;
//   - cubins and host objects are refused: vgpu runs PTX only.
#define NVJITLINK_NO_INLINE
#include <nvJitLink.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fatbin.h"
#include "phos/common/fatbin.h"

#define PHOS_NVJITLINK_API extern "C" __attribute__((visibility("default")))

struct nvJitLink {
  int arch = 0;  // -arch=sm_NN as NN
  std::vector<std::string> options;
  std::vector<std::string> ptx;
  struct Input {
    nvJitLinkInputType type;
    std::string bytes;
    std::string name;
  };
  std::vector<Input> lto;  // LTO-IR, linked by NVIDIA's nvJitLink
  std::string linked;      // the PTX and its NUL, after Complete
  std::string errorLog, infoLog;
};

namespace {

std::mutex& handlesMutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<nvJitLink*>& handles() {
  static std::set<nvJitLink*> live;
  return live;
}
bool live(nvJitLinkHandle h) {
  std::lock_guard lock(handlesMutex());
  return h != nullptr && handles().count(h) != 0;
}

nvJitLinkResult fail(nvJitLinkHandle h, nvJitLinkResult result, const std::string& why) {
  h->errorLog += "vgpu nvJitLink: " + why + "\n";
  return result;
}

// Accepts every option NVIDIA's nvJitLink documents that only tunes code
// generation (vgpu runs the PTX as given); needs -arch=sm_NN.
nvJitLinkResult parseOptions(nvJitLink& h, uint32_t count, const char* const* options) {
  for (uint32_t i = 0; i < count; ++i) {
    const std::string o = options[i] != nullptr ? options[i] : "";
    h.options.push_back(o);
    if (o.rfind("-arch=sm_", 0) == 0 || o.rfind("-arch=compute_", 0) == 0) {
      const std::string digits = o.substr(o.find('_') + 1);
      h.arch = std::atoi(digits.c_str());
      if (h.arch < 50) return fail(&h, NVJITLINK_ERROR_UNRECOGNIZED_ARCH, "unrecognized " + o);
      continue;
    }
    static const char* const kTuning[] = {"-lto", "-maxrregcount=", "-O", "-g", "-lineinfo", "-ptx", "-time", "-verbose",
                                          "-split-compile", "-jump-table-density=", "-no-cache", "-kernels-used=",
                                          "-variables-used=", "-optimize-unused-variables", "-Xptxas", "-Xnvvm",
                                          "-ftz=", "-prec-div=", "-prec-sqrt=", "-fma=", "-suppress-stack-size-warning",
                                          "-Werror", "-Wall"};
    bool known = false;
    for (const char* prefix : kTuning) known = known || o.rfind(prefix, 0) == 0;
    if (!known) return fail(&h, NVJITLINK_ERROR_UNRECOGNIZED_OPTION, "unrecognized option " + o);
  }
  if (h.arch == 0) return fail(&h, NVJITLINK_ERROR_MISSING_ARCH, "-arch=sm_NN is required");
  return NVJITLINK_SUCCESS;
}

bool isPtx(const char* data, size_t size) {
  return std::string_view(data, strnlen(data, size)).find(".version") != std::string_view::npos;
}

// The first bytes of NVVM's LTO-IR ("\xedCN\x7f"), as numba-cuda's are.
constexpr uint32_t kLtoIrMagic = 0x7f4e43ed;

uint32_t magic(const void* data, size_t size) {
  uint32_t m = 0;
  if (size >= sizeof m) std::memcpy(&m, data, sizeof m);
  return m;
}

nvJitLinkResult addInput(nvJitLink& h, nvJitLinkInputType type, const void* data, size_t size, const char* name) {
  const std::string what = name != nullptr ? std::string(name) : std::string("an input");
  const auto* text = static_cast<const char*>(data);
  if (type == NVJITLINK_INPUT_ANY) {
    if (magic(data, size) == phos::fatbin::kMagic || magic(data, size) == phos::fatbin::kWrapperMagic) {
      type = NVJITLINK_INPUT_FATBIN;
    } else if (magic(data, size) == kLtoIrMagic) {
      type = NVJITLINK_INPUT_LTOIR;
    } else if (isPtx(text, size)) {
      type = NVJITLINK_INPUT_PTX;
    }
  }
  // vgpu's NVRTC (and this library) hand out PTX where a cubin is asked for;
  // given back as a cubin, it is PTX.
  if (type == NVJITLINK_INPUT_CUBIN && std::string_view(text, std::min<size_t>(size, 4)) != "\x7f" "ELF" &&
      isPtx(text, size)) {
    type = NVJITLINK_INPUT_PTX;
  }
  switch (type) {
    case NVJITLINK_INPUT_PTX:
      if (!isPtx(text, size)) return fail(&h, NVJITLINK_ERROR_INVALID_INPUT, what + " is not PTX (no .version)");
      h.ptx.emplace_back(text, strnlen(text, size));
      return NVJITLINK_SUCCESS;
    case NVJITLINK_INPUT_FATBIN: {
      auto ptx = phos::vgpu::extractPtx(data, h.arch);
      if (!ptx.isOk()) {
        return fail(&h, NVJITLINK_ERROR_INVALID_INPUT, what + ": no PTX for sm_" + std::to_string(h.arch) + ": " +
                                                           ptx.status().message());
      }
      h.ptx.push_back(std::move(*ptx));
      return NVJITLINK_SUCCESS;
    }
    case NVJITLINK_INPUT_LTOIR:
      h.lto.push_back({type, std::string(text, size), what});
      return NVJITLINK_SUCCESS;
    default:
      return fail(&h, NVJITLINK_ERROR_INVALID_INPUT,
                  what + " is machine code or a host object, which vgpu cannot link (it runs PTX)");
  }
}

// NVIDIA's libnvJitLink from the CUDA toolkit ($PHOS_VGPU_NVJITLINK alone when
// set, else $CUDA_HOME's, $CUDA_PATH's or /usr/local/cuda's), loaded by path with its own symbols
// first (RTLD_DEEPBIND: its calls must not land in this library).
struct NvidiaLinker {
  void* handle = nullptr;
  std::string path, why;
  decltype(&__nvJitLinkCreate_13_0) create = nullptr;
  decltype(&__nvJitLinkDestroy_13_0) destroy = nullptr;
  decltype(&__nvJitLinkAddData_13_0) addData = nullptr;
  decltype(&__nvJitLinkComplete_13_0) complete = nullptr;
  decltype(&__nvJitLinkGetLinkedPtxSize_13_0) ptxSize = nullptr;
  decltype(&__nvJitLinkGetLinkedPtx_13_0) ptx = nullptr;
  decltype(&__nvJitLinkGetErrorLogSize_13_0) errorLogSize = nullptr;
  decltype(&__nvJitLinkGetErrorLog_13_0) errorLog = nullptr;
};

const NvidiaLinker& nvidiaLinker() {
  static const NvidiaLinker linker = [] {
    NvidiaLinker l;
    std::vector<std::string> candidates;
    if (const char* p = std::getenv("PHOS_VGPU_NVJITLINK"); p != nullptr && *p != '\0') {
      candidates.emplace_back(p);  // that one only
    } else {
      for (const char* root : {static_cast<const char*>(std::getenv("CUDA_HOME")),
                               static_cast<const char*>(std::getenv("CUDA_PATH")), "/usr/local/cuda"}) {
        if (root == nullptr || *root == '\0') continue;
        for (const char* dir : {"/lib64/", "/lib/"}) candidates.push_back(std::string(root) + dir + "libnvJitLink.so.13");
      }
    }
    for (const std::string& path : candidates) {
      l.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (l.handle == nullptr) continue;
      if (dlsym(l.handle, "phos_vgpu_nvjitlink") != nullptr) {  // this library again
        dlclose(l.handle);
        l.handle = nullptr;
        continue;
      }
      l.path = path;
      break;
    }
    if (l.handle == nullptr) {
      l.why = "NVIDIA's libnvJitLink.so.13 was not found at " + (candidates.empty() ? std::string("-") : candidates.front()) +
              (candidates.size() > 1 ? " or " + std::to_string(candidates.size() - 1) + " other places" : "") +
              " (set PHOS_VGPU_NVJITLINK to it, or CUDA_HOME to the toolkit)";
      return l;
    }
    auto get = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(l.handle, name)); };
    get(l.create, "__nvJitLinkCreate_13_0");
    get(l.destroy, "__nvJitLinkDestroy_13_0");
    get(l.addData, "__nvJitLinkAddData_13_0");
    get(l.complete, "__nvJitLinkComplete_13_0");
    get(l.ptxSize, "__nvJitLinkGetLinkedPtxSize_13_0");
    get(l.ptx, "__nvJitLinkGetLinkedPtx_13_0");
    get(l.errorLogSize, "__nvJitLinkGetErrorLogSize_13_0");
    get(l.errorLog, "__nvJitLinkGetErrorLog_13_0");
    if (!l.create || !l.destroy || !l.addData || !l.complete || !l.ptxSize || !l.ptx || !l.errorLogSize ||
        !l.errorLog) {
      l.why = l.path + " lacks the nvJitLink 13.0 entry points";
      dlclose(l.handle);
      l.handle = nullptr;
    }
    return l;
  }();
  return linker;
}

// LTO-IR (and any PTX with it) linked by NVIDIA's nvJitLink into PTX.
nvJitLinkResult linkWithNvidia(nvJitLink& h) {
  const NvidiaLinker& nv = nvidiaLinker();
  if (nv.handle == nullptr) {
    return fail(&h, NVJITLINK_ERROR_INVALID_INPUT, h.lto.front().name + " is LTO-IR, which vgpu links with NVIDIA's "
                                                       "nvJitLink to PTX, but " + nv.why);
  }
  std::vector<std::string> options = h.options;
  auto missing = [&](const char* o) { return std::find(options.begin(), options.end(), o) == options.end(); };
  if (missing("-lto")) options.emplace_back("-lto");
  if (missing("-ptx")) options.emplace_back("-ptx");
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());
  nvJitLinkHandle linker = nullptr;
  nvJitLinkResult r = nv.create(&linker, static_cast<uint32_t>(argv.size()), argv.data());
  for (size_t i = 0; r == NVJITLINK_SUCCESS && i < h.lto.size(); ++i) {
    r = nv.addData(linker, h.lto[i].type, h.lto[i].bytes.data(), h.lto[i].bytes.size(), h.lto[i].name.c_str());
  }
  for (size_t i = 0; r == NVJITLINK_SUCCESS && i < h.ptx.size(); ++i) {
    r = nv.addData(linker, NVJITLINK_INPUT_PTX, h.ptx[i].c_str(), h.ptx[i].size() + 1, "ptx");
  }
  if (r == NVJITLINK_SUCCESS) r = nv.complete(linker);
  size_t size = 0;
  if (r == NVJITLINK_SUCCESS) r = nv.ptxSize(linker, &size);
  if (r == NVJITLINK_SUCCESS) {
    h.linked.assign(size, '\0');
    r = nv.ptx(linker, h.linked.data());
    if (!h.linked.empty() && h.linked.back() != '\0') h.linked.push_back('\0');
  }
  if (r != NVJITLINK_SUCCESS && linker != nullptr) {
    size_t logSize = 0;
    if (nv.errorLogSize(linker, &logSize) == NVJITLINK_SUCCESS && logSize > 1) {
      std::string log(logSize, '\0');
      if (nv.errorLog(linker, log.data()) == NVJITLINK_SUCCESS) h.errorLog += log.c_str();
    }
    h.linked.clear();
  }
  if (linker != nullptr) nv.destroy(&linker);
  if (r == NVJITLINK_SUCCESS) h.infoLog += "vgpu nvJitLink: LTO-IR linked to PTX by " + nv.path + "\n";
  return r;
}

nvJitLinkResult copyOut(const std::string& bytes, void* out) {
  if (out == nullptr) return NVJITLINK_ERROR_NULL_INPUT;
  std::memcpy(out, bytes.data(), bytes.size());
  return NVJITLINK_SUCCESS;
}

}  // namespace

PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkCreate_13_0(nvJitLinkHandle* handle, uint32_t numOptions,
                                                          const char* const* options) {
  if (handle == nullptr || (numOptions > 0 && options == nullptr)) return NVJITLINK_ERROR_NULL_INPUT;
  auto* h = new nvJitLink;
  const nvJitLinkResult r = parseOptions(*h, numOptions, options);
  {
    std::lock_guard lock(handlesMutex());
    handles().insert(h);
  }
  // As NVIDIA's: the handle is made even when an option is refused, so that
  // its error log can be read.
  *handle = h;
  return r;
}

PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkDestroy_13_0(nvJitLinkHandle* handle) {
  if (handle == nullptr || !live(*handle)) return NVJITLINK_ERROR_INVALID_INPUT;
  {
    std::lock_guard lock(handlesMutex());
    handles().erase(*handle);
  }
  delete *handle;
  *handle = nullptr;
  return NVJITLINK_SUCCESS;
}

PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkAddData_13_0(nvJitLinkHandle handle, nvJitLinkInputType inputType,
                                                           const void* data, size_t size, const char* name) {
  if (!live(handle)) return NVJITLINK_ERROR_INVALID_INPUT;
  if (data == nullptr || size == 0) return fail(handle, NVJITLINK_ERROR_NULL_INPUT, "no data");
  return addInput(*handle, inputType, data, size, name);
}

PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkAddFile_13_0(nvJitLinkHandle handle, nvJitLinkInputType inputType,
                                                           const char* fileName) {
  if (!live(handle)) return NVJITLINK_ERROR_INVALID_INPUT;
  if (fileName == nullptr) return fail(handle, NVJITLINK_ERROR_NULL_INPUT, "no file name");
  std::ifstream file(fileName, std::ios::binary);
  if (!file) return fail(handle, NVJITLINK_ERROR_INVALID_INPUT, std::string("cannot read ") + fileName);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.empty()) return fail(handle, NVJITLINK_ERROR_INVALID_INPUT, std::string(fileName) + " is empty");
  return addInput(*handle, inputType, bytes.data(), bytes.size(), fileName);
}

PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkComplete_13_0(nvJitLinkHandle handle) {
  if (!live(handle)) return NVJITLINK_ERROR_INVALID_INPUT;
  if (!handle->lto.empty()) return linkWithNvidia(*handle);
  if (handle->ptx.empty()) return fail(handle, NVJITLINK_ERROR_INVALID_INPUT, "nothing was added to the link");
  if (handle->ptx.size() > 1) {
    return fail(handle, NVJITLINK_ERROR_INVALID_INPUT,
                "linking " + std::to_string(handle->ptx.size()) + " PTX modules together is not supported by vgpu");
  }
  handle->linked = handle->ptx.front();
  handle->linked.push_back('\0');
  handle->infoLog += "vgpu nvJitLink: the linked image is the PTX, which vgpu runs\n";
  return NVJITLINK_SUCCESS;
}

PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkGetLinkedCubinSize_13_0(nvJitLinkHandle handle, size_t* size) {
  if (!live(handle) || handle->linked.empty()) return NVJITLINK_ERROR_INVALID_INPUT;
  if (size == nullptr) return NVJITLINK_ERROR_NULL_INPUT;
  *size = handle->linked.size();
  return NVJITLINK_SUCCESS;
}
PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkGetLinkedCubin_13_0(nvJitLinkHandle handle, void* cubin) {
  if (!live(handle) || handle->linked.empty()) return NVJITLINK_ERROR_INVALID_INPUT;
  return copyOut(handle->linked, cubin);
}
PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkGetLinkedPtxSize_13_0(nvJitLinkHandle handle, size_t* size) {
  return __nvJitLinkGetLinkedCubinSize_13_0(handle, size);
}
PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkGetLinkedPtx_13_0(nvJitLinkHandle handle, char* ptx) {
  return __nvJitLinkGetLinkedCubin_13_0(handle, ptx);
}
PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkGetErrorLogSize_13_0(nvJitLinkHandle handle, size_t* size) {
  if (!live(handle)) return NVJITLINK_ERROR_INVALID_INPUT;
  if (size == nullptr) return NVJITLINK_ERROR_NULL_INPUT;
  *size = handle->errorLog.size() + 1;
  return NVJITLINK_SUCCESS;
}
PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkGetErrorLog_13_0(nvJitLinkHandle handle, char* log) {
  if (!live(handle)) return NVJITLINK_ERROR_INVALID_INPUT;
  return copyOut(handle->errorLog + '\0', log);
}
PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkGetInfoLogSize_13_0(nvJitLinkHandle handle, size_t* size) {
  if (!live(handle)) return NVJITLINK_ERROR_INVALID_INPUT;
  if (size == nullptr) return NVJITLINK_ERROR_NULL_INPUT;
  *size = handle->infoLog.size() + 1;
  return NVJITLINK_SUCCESS;
}
PHOS_NVJITLINK_API nvJitLinkResult __nvJitLinkGetInfoLog_13_0(nvJitLinkHandle handle, char* log) {
  if (!live(handle)) return NVJITLINK_ERROR_INVALID_INPUT;
  return copyOut(handle->infoLog + '\0', log);
}

// The unversioned names (what dlsym users such as cuda.bindings look up).
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkCreate(nvJitLinkHandle* handle, uint32_t numOptions,
                                                   const char** options) {
  return __nvJitLinkCreate_13_0(handle, numOptions, options);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkDestroy(nvJitLinkHandle* handle) { return __nvJitLinkDestroy_13_0(handle); }
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkAddData(nvJitLinkHandle handle, nvJitLinkInputType inputType,
                                                    const void* data, size_t size, const char* name) {
  return __nvJitLinkAddData_13_0(handle, inputType, data, size, name);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkAddFile(nvJitLinkHandle handle, nvJitLinkInputType inputType,
                                                    const char* fileName) {
  return __nvJitLinkAddFile_13_0(handle, inputType, fileName);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkComplete(nvJitLinkHandle handle) { return __nvJitLinkComplete_13_0(handle); }
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkGetLinkedCubinSize(nvJitLinkHandle handle, size_t* size) {
  return __nvJitLinkGetLinkedCubinSize_13_0(handle, size);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkGetLinkedCubin(nvJitLinkHandle handle, void* cubin) {
  return __nvJitLinkGetLinkedCubin_13_0(handle, cubin);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkGetLinkedPtxSize(nvJitLinkHandle handle, size_t* size) {
  return __nvJitLinkGetLinkedPtxSize_13_0(handle, size);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkGetLinkedPtx(nvJitLinkHandle handle, char* ptx) {
  return __nvJitLinkGetLinkedPtx_13_0(handle, ptx);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkGetErrorLogSize(nvJitLinkHandle handle, size_t* size) {
  return __nvJitLinkGetErrorLogSize_13_0(handle, size);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkGetErrorLog(nvJitLinkHandle handle, char* log) {
  return __nvJitLinkGetErrorLog_13_0(handle, log);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkGetInfoLogSize(nvJitLinkHandle handle, size_t* size) {
  return __nvJitLinkGetInfoLogSize_13_0(handle, size);
}
PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkGetInfoLog(nvJitLinkHandle handle, char* log) {
  return __nvJitLinkGetInfoLog_13_0(handle, log);
}
// Tells this library apart from NVIDIA's when looking for the latter.
PHOS_NVJITLINK_API int phos_vgpu_nvjitlink() { return 1; }

PHOS_NVJITLINK_API nvJitLinkResult nvJitLinkVersion(unsigned int* major, unsigned int* minor) {
  if (major == nullptr || minor == nullptr) return NVJITLINK_ERROR_INVALID_INPUT;
  *major = 13;
  *minor = 0;
  return NVJITLINK_SUCCESS;
}
