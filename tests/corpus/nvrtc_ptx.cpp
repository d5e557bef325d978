// SPDX-License-Identifier: Apache-2.0
// Build-time helper: compiles one CUDA source to PTX with NVRTC, as Python clients
// (cuda-bindings, cuda.core) do, so the corpus includes NVRTC's PTX.
//
// usage: nvrtc_ptx INPUT.cu OUTPUT.ptx [nvrtc options...]
#include <nvrtc.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

bool check(nvrtcResult r, const char* what) {
  if (r == NVRTC_SUCCESS) return true;
  std::fprintf(stderr, "nvrtc_ptx: %s: %s\n", what, nvrtcGetErrorString(r));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s INPUT.cu OUTPUT.ptx [options...]\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "nvrtc_ptx: cannot open %s\n", argv[1]);
    return 1;
  }
  std::stringstream src;
  src << in.rdbuf();
  std::string text = src.str();

  nvrtcProgram prog;
  if (!check(nvrtcCreateProgram(&prog, text.c_str(), argv[1], 0, nullptr, nullptr),
             "nvrtcCreateProgram")) {
    return 1;
  }
  std::vector<const char*> options(argv + 3, argv + argc);
  nvrtcResult compiled =
      nvrtcCompileProgram(prog, static_cast<int>(options.size()), options.data());
  size_t logSize = 0;
  nvrtcGetProgramLogSize(prog, &logSize);
  if (logSize > 1) {
    std::string log(logSize, '\0');
    nvrtcGetProgramLog(prog, log.data());
    std::fprintf(stderr, "%s\n", log.c_str());
  }
  if (!check(compiled, "nvrtcCompileProgram")) return 1;
  size_t ptxSize = 0;
  if (!check(nvrtcGetPTXSize(prog, &ptxSize), "nvrtcGetPTXSize")) return 1;
  std::string ptx(ptxSize, '\0');
  if (!check(nvrtcGetPTX(prog, ptx.data()), "nvrtcGetPTX")) return 1;
  nvrtcDestroyProgram(&prog);
  // The PTX string is NUL-terminated; the file is not.
  while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
  std::ofstream out(argv[2], std::ios::binary);
  out << ptx;
  return out ? 0 : 1;
}
