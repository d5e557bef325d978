// SPDX-License-Identifier: Apache-2.0
// The kernels of driver_api.cpp, built on their own into a fatbin
// (nvcc -fatbin) that the host program loads with cuModuleLoad.
extern "C" __global__ void scale_add(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void square(unsigned* v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = v[i] * v[i] + 1u;
}
