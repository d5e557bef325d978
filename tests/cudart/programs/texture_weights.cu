// SPDX-License-Identifier: Apache-2.0
// The weights of linear texture filtering, read off the device: a texture of
// two texels (0 and 1, then 0 and 1000) sampled between their centres at 1025
// coordinates, unnormalized and normalized. Each output line is a run of
// coordinates k (x = 0.5 + k / 1024 texels) that gave the same value, and that
// value. On a GPU it shows the hardware's filter; texture_weights.h200.txt is
// what an H200 printed (driver 580), which vgpu must print too
// (vgpu/engine/src/texture_sampling.cpp; tests/python/test_cudart_programs.py).
//   nvcc -o texture_weights texture_weights.cu && ./texture_weights
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

constexpr int kSamples = 1025;

__global__ void sample(float* out, cudaTextureObject_t tex, float scale) {
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < kSamples) out[k] = tex1D<float>(tex, (0.5f + k / 1024.0f) * scale);
}

int main() {
  for (float high : {1.0f, 1000.0f}) {
    for (int normalized = 0; normalized < 2; ++normalized) {
      cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
      cudaArray_t array;
      CHECK(cudaMallocArray(&array, &desc, 2, 0));
      const float texels[2] = {0.0f, high};
      CHECK(cudaMemcpy2DToArray(array, 0, 0, texels, sizeof(texels), sizeof(texels), 1,
                                cudaMemcpyHostToDevice));
      cudaResourceDesc res{};
      res.resType = cudaResourceTypeArray;
      res.res.array.array = array;
      cudaTextureDesc td{};
      td.addressMode[0] = cudaAddressModeClamp;
      td.filterMode = cudaFilterModeLinear;
      td.readMode = cudaReadModeElementType;
      td.normalizedCoords = normalized;
      cudaTextureObject_t tex;
      CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
      float* d;
      CHECK(cudaMalloc(&d, kSamples * sizeof(float)));
      sample<<<(kSamples + 255) / 256, 256>>>(d, tex, normalized ? 0.5f : 1.0f);
      CHECK(cudaGetLastError());
      std::vector<float> out(kSamples);
      CHECK(cudaMemcpy(out.data(), d, kSamples * sizeof(float), cudaMemcpyDeviceToHost));
      std::printf("texels 0 and %g, %s coordinates:\n", high,
                  normalized ? "normalized" : "unnormalized");
      for (int k = 0; k < kSamples;) {
        int end = k;
        while (end + 1 < kSamples && out[end + 1] == out[k]) ++end;
        std::printf("  k %d..%d: %.9g (%a)\n", k, end, out[k], out[k]);
        k = end + 1;
      }
      CHECK(cudaDestroyTextureObject(tex));
      CHECK(cudaFreeArray(array));
      CHECK(cudaFree(d));
    }
  }
  return 0;
}
