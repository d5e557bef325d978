// SPDX-License-Identifier: Apache-2.0
// session_client: a Driver API process the test drives line by line, to act out what two
// processes, a killed client or a killed phosd do to a session.
//
//   session_client            cuInit, device 0's primary context and the test
//                             kernels; prints "ready PID", then serves commands
//   session_client --init-only   prints "cuInit RESULT" and exits
//
// Commands (one per stdin line; addresses in hex) and their answers, each
// "COMMAND RESULT MILLISECONDS [VALUE]" where RESULT is a CUresult name and
// MILLISECONDS the wall time of the Driver API calls:
//   alloc BYTES                -> VALUE: the device pointer
//   hostalloc BYTES            cuMemHostAlloc -> VALUE: the pinned host pointer
//   set PTR BYTE COUNT         cuMemsetD8
//   write PTR BYTE COUNT       cuMemcpyHtoD of COUNT bytes of BYTE
//   read PTR COUNT             cuMemcpyDtoH -> VALUE: the byte (hex) if all are equal, else "mixed"
//   free PTR                   cuMemFree
//   dtod DST SRC COUNT         cuMemcpyDtoD
//   memcpy DST SRC COUNT       cuMemcpy (unified addressing: either side may be host memory)
//   copy_kernel SRC DST COUNT  launches copyBytes(SRC, DST, COUNT) then cuCtxSynchronize;
//                              RESULT is the launch's, VALUE the synchronize's
//   sync                       cuCtxSynchronize
//   stuck_sync                 launches the gate kernel with a gate that never opens, then
//                              cuCtxSynchronize: answers only if that call fails
#include <cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#ifndef PHOS_SHIM_KERNELS_PTX
#error "PHOS_SHIM_KERNELS_PTX must name the PTX of shim_kernels.cu"
#endif

namespace {

std::string name(CUresult r) {
  const char* text = nullptr;
  return cuGetErrorName(r, &text) == CUDA_SUCCESS ? text : std::to_string(static_cast<int>(r));
}

class Stopwatch {
 public:
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

void answer(const std::string& command, CUresult r, const Stopwatch& watch, const std::string& value = "") {
  std::printf("%s %s %.1f%s%s\n", command.c_str(), name(r).c_str(), watch.ms(), value.empty() ? "" : " ",
              value.c_str());
}

std::string hex(unsigned long long v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", v);
  return buf;
}

struct Kernels {
  CUfunction copyBytes = nullptr;
  CUfunction gate = nullptr;
};

void serve(std::istringstream& in, const std::string& command, const Kernels& kernels) {
  if (command == "alloc") {
    size_t bytes = 0;
    in >> bytes;
    CUdeviceptr p = 0;
    Stopwatch w;
    CUresult r = cuMemAlloc(&p, bytes);
    answer(command, r, w, hex(p));
  } else if (command == "hostalloc") {
    size_t bytes = 0;
    in >> bytes;
    void* p = nullptr;
    Stopwatch w;
    CUresult r = cuMemHostAlloc(&p, bytes, 0);
    answer(command, r, w, hex(reinterpret_cast<uintptr_t>(p)));
  } else if (command == "set" || command == "write") {
    CUdeviceptr p = 0;
    unsigned value = 0;
    size_t count = 0;
    in >> std::hex >> p >> value >> std::dec >> count;
    std::vector<unsigned char> data(count, static_cast<unsigned char>(value));
    Stopwatch w;
    CUresult r = command == "set" ? cuMemsetD8(p, static_cast<unsigned char>(value), count)
                                  : cuMemcpyHtoD(p, data.data(), count);
    answer(command, r, w);
  } else if (command == "read") {
    CUdeviceptr p = 0;
    size_t count = 0;
    in >> std::hex >> p >> std::dec >> count;
    // Filled with a value no test writes, so a failed copy cannot look like data.
    std::vector<unsigned char> data(count, 0xee);
    Stopwatch w;
    CUresult r = cuMemcpyDtoH(data.data(), p, count);
    std::string value = "mixed";
    bool uniform = true;
    for (unsigned char b : data) uniform = uniform && b == data[0];
    if (uniform && !data.empty()) value = hex(data[0]);
    answer(command, r, w, value);
  } else if (command == "free") {
    CUdeviceptr p = 0;
    in >> std::hex >> p;
    Stopwatch w;
    answer(command, cuMemFree(p), w);
  } else if (command == "dtod" || command == "memcpy") {
    CUdeviceptr dst = 0, src = 0;
    size_t count = 0;
    in >> std::hex >> dst >> src >> std::dec >> count;
    Stopwatch w;
    answer(command, command == "dtod" ? cuMemcpyDtoD(dst, src, count) : cuMemcpy(dst, src, count), w);
  } else if (command == "copy_kernel") {
    CUdeviceptr src = 0, dst = 0;
    int count = 0;
    in >> std::hex >> src >> dst >> std::dec >> count;
    void* params[] = {&src, &dst, &count};
    Stopwatch w;
    CUresult launched =
        cuLaunchKernel(kernels.copyBytes, (count + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr);
    CUresult synced = cuCtxSynchronize();
    answer(command, launched, w, name(synced));
  } else if (command == "stuck_sync") {
    void* gate = nullptr;
    CUdeviceptr open = 0;
    CUresult r = cuMemHostAlloc(&gate, 2 * sizeof(int), CU_MEMHOSTALLOC_DEVICEMAP);
    if (r == CUDA_SUCCESS) {
      static_cast<int*>(gate)[0] = 0;
      r = cuMemHostGetDevicePointer(&open, gate, 0);
    }
    CUdeviceptr done = open + sizeof(int);
    unsigned long long limit = ~0ull;
    void* params[] = {&open, &limit, &done};
    if (r == CUDA_SUCCESS) r = cuLaunchKernel(kernels.gate, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
    Stopwatch w;
    answer(command, r == CUDA_SUCCESS ? cuCtxSynchronize() : r, w);
  } else if (command == "sync") {
    Stopwatch w;
    answer(command, cuCtxSynchronize(), w);
  } else {
    std::printf("%s unknown-command\n", command.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc > 1 && std::string_view(argv[1]) == "--init-only") {
    std::printf("cuInit %s\n", name(cuInit(0)).c_str());
    return 0;
  }
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;
  Kernels kernels;
  auto setUp = [&](const char* what, CUresult r) {
    if (r != CUDA_SUCCESS) std::printf("setup_failed %s %s\n", what, name(r).c_str());
    return r == CUDA_SUCCESS;
  };
  if (!setUp("cuInit", cuInit(0)) || !setUp("cuDeviceGet", cuDeviceGet(&device, 0)) ||
      !setUp("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&context, device)) ||
      !setUp("cuCtxSetCurrent", cuCtxSetCurrent(context)) ||
      !setUp("cuModuleLoad", cuModuleLoad(&module, PHOS_SHIM_KERNELS_PTX)) ||
      !setUp("cuModuleGetFunction", cuModuleGetFunction(&kernels.copyBytes, module, "copyBytes")) ||
      !setUp("cuModuleGetFunction", cuModuleGetFunction(&kernels.gate, module, "gate"))) {
    return 1;
  }
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    if (!(in >> command)) continue;
    if (command == "exit") break;
    serve(in, command, kernels);
  }
  return 0;
}
