// SPDX-License-Identifier: Apache-2.0
// A Driver API program built the way its authors build it: the host code by
// the system compiler, linked with -lcuda (libcuda.so.1 is in its DT_NEEDED),
// the kernels by nvcc -fatbin into a file it loads with cuModuleLoad.
//   driver_api KERNELS.fatbin
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                   \
  do {                                                                                \
    CUresult r_ = (call);                                                             \
    if (r_ != CUDA_SUCCESS) {                                                         \
      const char* name_ = nullptr;                                                    \
      cuGetErrorName(r_, &name_);                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, name_ ? name_ : "?"); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s KERNELS.fatbin\n", argv[0]);
    return 2;
  }
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  CUmodule module;
  CHECK(cuModuleLoad(&module, argv[1]));
  CUfunction scaleAdd, square;
  CHECK(cuModuleGetFunction(&scaleAdd, module, "scale_add"));
  CHECK(cuModuleGetFunction(&square, module, "square"));

  const int n = 5000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = 0.5f * static_cast<float>(i % 97);
    y[i] = static_cast<float>(i % 13) - 6.0f;
  }
  CUdeviceptr dx, dy, dv;
  CHECK(cuMemAlloc(&dx, n * sizeof(float)));
  CHECK(cuMemAlloc(&dy, n * sizeof(float)));
  CHECK(cuMemAlloc(&dv, n * sizeof(unsigned)));
  CHECK(cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
  CHECK(cuMemcpyHtoD(dy, y.data(), n * sizeof(float)));
  CHECK(cuMemsetD32(dv, 3u, n));

  float a = 2.0f;
  int count = n;
  void* scaleArgs[] = {&dy, &dx, &a, &count};
  CHECK(cuLaunchKernel(scaleAdd, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, scaleArgs, nullptr));
  void* squareArgs[] = {&dv, &count};
  CHECK(cuLaunchKernel(square, 8, 1, 1, 64, 1, 1, 0, nullptr, squareArgs, nullptr));
  CHECK(cuCtxSynchronize());

  std::vector<float> got(n);
  std::vector<unsigned> v(n);
  CHECK(cuMemcpyDtoH(got.data(), dy, n * sizeof(float)));
  CHECK(cuMemcpyDtoH(v.data(), dv, n * sizeof(unsigned)));
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    if (got[i] != a * x[i] + y[i] || v[i] != 10u) ++wrong;
  }
  CHECK(cuMemFree(dx));
  CHECK(cuMemFree(dy));
  CHECK(cuMemFree(dv));
  CHECK(cuModuleUnload(module));
  CHECK(cuDevicePrimaryCtxRelease(device));
  if (wrong != 0) {
    std::printf("driver_api: %d wrong results\n", wrong);
    return 1;
  }
  std::printf("driver_api OK: y[4999]=%.3f v[0]=%u\n", static_cast<double>(got[n - 1]), v[0]);
  return 0;
}
