// SPDX-License-Identifier: Apache-2.0
// State kept in a CUDA array, read through a texture object and written back
// through a surface object, as image and simulation codes keep theirs: each
// step samples the image shifted (normalized coordinates, wrap, point
// filtering), adds a field read through a texture object over linear memory
// (tex1Dfetch), stores the result into the array with surf2Dwrite and mixes
// it into the field. The image goes in with cudaMemcpy2DToArray and comes
// back each step with cudaMemcpy2DFromArray (pageable memory on both sides).
// A texture object made and destroyed first leaves a free slot before the
// ones the kernels use. Each step prints checksums of the image and the
// field; the last line says whether the CPU's replay of every step agrees.
// Every operation is exact in float (power-of-two scales, halves), so the
// CPU's replay is bit for bit.
//   texture_train [--steps N] [--sleep-ms MS] [--dangling]
// --dangling: also keeps a texture object over a second array it frees
// (never sampled): a checkpoint cannot make that object again.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kW = 64, kH = 32, kN = kW * kH;

__global__ void sample(cudaTextureObject_t image, cudaTextureObject_t field, float* next, int sx,
                       int sy, float k) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= kW || y >= kH) return;
  const float u = (x + sx + 0.5f) / kW, v = (y + sy + 0.5f) / kH;
  next[y * kW + x] =
      tex2D<float>(image, u, v) * 0.5f + tex1Dfetch<float>(field, y * kW + x) * 0.25f + k;
}

__global__ void store(cudaSurfaceObject_t image, const float* next) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= kW || y >= kH) return;
  surf2Dwrite(next[y * kW + x], image, x * static_cast<int>(sizeof(float)), y);
}

__global__ void mix(float* field, const float* next) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kN) field[i] = field[i] * 0.5f + next[i] * 0.25f;
}

// The CPU's replay of one step.
static void replay(std::vector<float>& image, std::vector<float>& field, int sx, int sy, float k) {
  std::vector<float> next(kN);
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < kW; ++x) {
      const float texel = image[((y + sy) % kH) * kW + (x + sx) % kW];
      next[y * kW + x] = texel * 0.5f + field[y * kW + x] * 0.25f + k;
    }
  }
  image = next;
  for (int i = 0; i < kN; ++i) field[i] = field[i] * 0.5f + next[i] * 0.25f;
}

int main(int argc, char** argv) {
  int steps = 8, sleepMs = 0;
  bool dangling = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dangling") == 0) dangling = true;
    if (i + 1 >= argc) continue;
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::stoi(argv[i + 1]);
  }
  std::vector<float> image(kN), field(kN);
  for (int i = 0; i < kN; ++i) {
    image[i] = static_cast<float>((i * 37) % 101);
    field[i] = static_cast<float>((i * 11) % 23);
  }

  cudaChannelFormatDesc format = cudaCreateChannelDesc<float>();
  cudaArray_t array = nullptr;
  CHECK(cudaMallocArray(&array, &format, kW, kH, cudaArraySurfaceLoadStore));
  CHECK(cudaMemcpy2DToArray(array, 0, 0, image.data(), kW * sizeof(float), kW * sizeof(float), kH,
                            cudaMemcpyHostToDevice));
  float *fieldDev = nullptr, *next = nullptr;
  CHECK(cudaMalloc(&fieldDev, kN * sizeof(float)));
  CHECK(cudaMalloc(&next, kN * sizeof(float)));
  CHECK(cudaMemcpy(fieldDev, field.data(), kN * sizeof(float), cudaMemcpyHostToDevice));

  cudaResourceDesc arrayRes{};
  arrayRes.resType = cudaResourceTypeArray;
  arrayRes.res.array.array = array;
  cudaTextureDesc wrap{};
  wrap.addressMode[0] = wrap.addressMode[1] = cudaAddressModeWrap;
  wrap.filterMode = cudaFilterModePoint;
  wrap.readMode = cudaReadModeElementType;
  wrap.normalizedCoords = 1;
  // A slot made free before the objects the kernels hold.
  cudaTextureObject_t freed = 0, imageTex = 0, fieldTex = 0;
  CHECK(cudaCreateTextureObject(&freed, &arrayRes, &wrap, nullptr));
  CHECK(cudaCreateTextureObject(&imageTex, &arrayRes, &wrap, nullptr));
  cudaResourceDesc linearRes{};
  linearRes.resType = cudaResourceTypeLinear;
  linearRes.res.linear.devPtr = fieldDev;
  linearRes.res.linear.desc = format;
  linearRes.res.linear.sizeInBytes = kN * sizeof(float);
  cudaTextureDesc fetch{};
  fetch.readMode = cudaReadModeElementType;
  CHECK(cudaCreateTextureObject(&fieldTex, &linearRes, &fetch, nullptr));
  cudaSurfaceObject_t surface = 0;
  CHECK(cudaCreateSurfaceObject(&surface, &arrayRes));
  CHECK(cudaDestroyTextureObject(freed));
  if (dangling) {
    cudaArray_t gone = nullptr;
    CHECK(cudaMallocArray(&gone, &format, kW, kH));
    cudaResourceDesc goneRes = arrayRes;
    goneRes.res.array.array = gone;
    cudaTextureObject_t left = 0;
    CHECK(cudaCreateTextureObject(&left, &goneRes, &wrap, nullptr));
    CHECK(cudaFreeArray(gone));
  }

  std::vector<float> imageRef = image, fieldRef = field;
  const dim3 block(16, 8), grid(kW / 16, kH / 8);
  for (int s = 0; s < steps; ++s) {
    const int sx = 3 + s % 5, sy = 1 + s % 3;
    const float k = static_cast<float>(s % 7);
    sample<<<grid, block>>>(imageTex, fieldTex, next, sx, sy, k);
    store<<<grid, block>>>(surface, next);
    mix<<<(kN + 127) / 128, 128>>>(fieldDev, next);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy2DFromArray(image.data(), kW * sizeof(float), array, 0, 0, kW * sizeof(float),
                                kH, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(field.data(), fieldDev, kN * sizeof(float), cudaMemcpyDeviceToHost));
    replay(imageRef, fieldRef, sx, sy, k);
    std::printf("step %d image %016llx field %016llx\n", s,
                checksum(image.data(), kN * sizeof(float)),
                checksum(field.data(), kN * sizeof(float)));
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  const bool same = image == imageRef && field == fieldRef;
  std::printf("texture_train %s\n", same ? "OK" : "MISMATCH with the CPU");
  CHECK(cudaDestroySurfaceObject(surface));
  CHECK(cudaDestroyTextureObject(fieldTex));
  CHECK(cudaDestroyTextureObject(imageTex));
  CHECK(cudaFreeArray(array));
  CHECK(cudaFree(next));
  CHECK(cudaFree(fieldDev));
  return same ? 0 : 1;
}
