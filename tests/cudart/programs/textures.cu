// SPDX-License-Identifier: Apache-2.0
// CUDA arrays, texture objects and surface objects as image codes use them.
// The first part is the algorithm of NVIDIA's simpleTexture sample: rotate an
// image through a texture object with normalized coordinates, wrap addressing
// and linear filtering, and compare with a CPU reference. Then point sampling
// (exact), surfaces written and read by kernels, a gather, a 3D texture,
// 8-bit texels read as normalized floats, and tex1Dfetch on linear memory.
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"

constexpr int W = 64, H = 48;

// The rotation without contraction into FMAs, so the CPU computes the same coordinates.
__device__ __host__ inline void rotated(int x, int y, float c, float s, float* tu, float* tv) {
#ifdef __CUDA_ARCH__
  float u = __fsub_rn(__fdiv_rn((float)x, (float)W), 0.5f),
        v = __fsub_rn(__fdiv_rn((float)y, (float)H), 0.5f);
  *tu = __fadd_rn(__fsub_rn(__fmul_rn(u, c), __fmul_rn(v, s)), 0.5f);
  *tv = __fadd_rn(__fadd_rn(__fmul_rn(v, c), __fmul_rn(u, s)), 0.5f);
#else
  volatile float u = (float)x / (float)W - 0.5f, v = (float)y / (float)H - 0.5f;
  volatile float uc = u * c, vs = v * s, vc = v * c, us = u * s;
  volatile float a = uc - vs, b = vc + us;
  *tu = a + 0.5f;
  *tv = b + 0.5f;
#endif
}

__global__ void rotate(float* out, cudaTextureObject_t tex, float c, float s) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= W || y >= H) return;
  float tu, tv;
  rotated(x, y, c, s, &tu, &tv);
  out[y * W + x] = tex2D<float>(tex, tu, tv);
}

__global__ void paint(cudaSurfaceObject_t surf) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= W || y >= H) return;
  surf2Dwrite(make_uchar4(x, y, x ^ y, 255), surf, x * 4, y);
}

__global__ void readBack(uint4* out, cudaSurfaceObject_t surf, cudaTextureObject_t tex) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= W || y >= H) return;
  uchar4 a;
  surf2Dread(&a, surf, x * 4, y);
  uchar4 b = tex2D<uchar4>(tex, x + 0.5f, y + 0.5f);
  // Out of the surface: .zero reads zeros, .clamp the nearest texel.
  uchar4 z = surf2Dread<uchar4>(surf, (W + 3) * 4, y, cudaBoundaryModeZero);
  uchar4 c = surf2Dread<uchar4>(surf, (W + 3) * 4, y, cudaBoundaryModeClamp);
  out[y * W + x] = make_uint4(a.x | a.y << 8 | a.z << 16, b.x | b.y << 8 | b.z << 16,
                              z.x | z.w << 8, c.x | c.y << 8 | c.w << 16);
}

__global__ void misc(float* out, int4* gathered, cudaTextureObject_t gatherTex,
                     cudaTextureObject_t volume, cudaTextureObject_t bytes,
                     cudaTextureObject_t linear) {
  int i = threadIdx.x;
  gathered[i] = tex2Dgather<int4>(gatherTex, i + 1.0f, 2.0f, 0);
  out[i] = tex3D<float>(volume, i % 4 + 0.5f, i / 4 % 3 + 0.5f, i % 2 + 0.5f);
  out[32 + i] = tex1D<float>(bytes, i / 32.0f);
  out[64 + i] = tex1Dfetch<float>(linear, i * 3 - 4);
}

float wrapTexel(const std::vector<float>& img, long x, long y) {
  x = ((x % W) + W) % W;
  y = ((y % H) + H) % H;
  return img[y * W + x];
}

// Linear filtering as the hardware does it: weights with 8 fractional bits, a
// fraction halfway between two rounded up (an H200's, tests/gpu/texture_weights.cu).
float bilinear(const std::vector<float>& img, float u, float v) {
  double x = u * (double)W - 0.5, y = v * (double)H - 0.5;
  long i = (long)std::floor(x), j = (long)std::floor(y);
  float a = (float)(std::floor((x - std::floor(x)) * 256.0 + 0.5) / 256.0);
  float b = (float)(std::floor((y - std::floor(y)) * 256.0 + 0.5) / 256.0);
  return (1 - a) * (1 - b) * wrapTexel(img, i, j) + a * (1 - b) * wrapTexel(img, i + 1, j) +
         (1 - a) * b * wrapTexel(img, i, j + 1) + a * b * wrapTexel(img, i + 1, j + 1);
}

int main() {
  std::vector<float> img(W * H);
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) img[y * W + x] = (float)((x * 7 + y * 13) % 32) / 31.0f;
  }
  cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
  cudaArray_t array;
  CHECK(cudaMallocArray(&array, &fdesc, W, H));
  CHECK(cudaMemcpy2DToArray(array, 0, 0, img.data(), W * sizeof(float), W * sizeof(float), H,
                            cudaMemcpyHostToDevice));
  cudaResourceDesc res{};
  res.resType = cudaResourceTypeArray;
  res.res.array.array = array;
  cudaTextureDesc td{};
  td.addressMode[0] = td.addressMode[1] = cudaAddressModeWrap;
  td.filterMode = cudaFilterModeLinear;
  td.readMode = cudaReadModeElementType;
  td.normalizedCoords = 1;
  cudaTextureObject_t tex;
  CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
  td.filterMode = cudaFilterModePoint;
  cudaTextureObject_t pointTex;
  CHECK(cudaCreateTextureObject(&pointTex, &res, &td, nullptr));

  float* dOut;
  CHECK(cudaMalloc(&dOut, W * H * sizeof(float)));
  const float angle = 0.5f, c = std::cos(angle), s = std::sin(angle);
  dim3 block(8, 8), grid(W / 8, H / 8);
  std::vector<float> out(W * H);
  int bad = 0;
  double worst = 0;
  for (int pass = 0; pass < 2; ++pass) {
    rotate<<<grid, block>>>(dOut, pass == 0 ? tex : pointTex, c, s);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out.data(), dOut, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; ++y) {
      for (int x = 0; x < W; ++x) {
        float tu, tv;
        rotated(x, y, c, s, &tu, &tv);
        float want;
        if (pass == 0) {
          want = bilinear(img, tu, tv);
        } else {
          want = wrapTexel(img, (long)std::floor(tu * (double)W), (long)std::floor(tv * (double)H));
        }
        double e = std::fabs(out[y * W + x] - want);
        worst = e > worst ? e : worst;
        // Point sampling is exact; linear filtering agrees to float rounding.
        if (pass == 1 ? e != 0 : e > 1e-5) ++bad;
      }
    }
  }
  std::printf("rotate: %d bad texels, worst error %.2e, checksum %016llx\n", bad, worst,
              checksum(out.data(), out.size() * sizeof(float)));

  // Surfaces: painted by one kernel, read by another through a surface and a texture.
  cudaChannelFormatDesc u4 = cudaCreateChannelDesc<uchar4>();
  cudaArray_t canvas;
  CHECK(cudaMallocArray(&canvas, &u4, W, H, cudaArraySurfaceLoadStore));
  res.res.array.array = canvas;
  cudaSurfaceObject_t surf;
  CHECK(cudaCreateSurfaceObject(&surf, &res));
  cudaTextureDesc raw{};
  raw.addressMode[0] = raw.addressMode[1] = cudaAddressModeClamp;
  raw.filterMode = cudaFilterModePoint;
  raw.readMode = cudaReadModeElementType;
  cudaTextureObject_t canvasTex;
  CHECK(cudaCreateTextureObject(&canvasTex, &res, &raw, nullptr));
  paint<<<grid, block>>>(surf);
  uint4* dBack;
  CHECK(cudaMalloc(&dBack, W * H * sizeof(uint4)));
  readBack<<<grid, block>>>(dBack, surf, canvasTex);
  CHECK(cudaGetLastError());
  std::vector<uint4> back(W * H);
  CHECK(cudaMemcpy(back.data(), dBack, back.size() * sizeof(uint4), cudaMemcpyDeviceToHost));
  std::vector<uchar4> pixels(W * H);
  CHECK(
      cudaMemcpy2DFromArray(pixels.data(), W * 4, canvas, 0, 0, W * 4, H, cudaMemcpyDeviceToHost));
  int surfBad = 0;
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) {
      unsigned want = x | y << 8 | (x ^ y) << 16;
      const uint4& b = back[y * W + x];
      const uchar4& p = pixels[y * W + x];
      unsigned last = (W - 1) | y << 8 | 255u << 16;
      if (b.x != want || b.y != want || b.z != 0 || b.w != last || p.x != x || p.y != y ||
          p.w != 255)
        ++surfBad;
    }
  }
  std::printf("surfaces: %d bad pixels\n", surfBad);

  // A gather from an int texture, a 3D float texture, bytes read as normalized
  // floats, and tex1Dfetch from linear memory.
  int cells[4 * 4];
  for (int i = 0; i < 16; ++i) cells[i] = i * 10;
  cudaChannelFormatDesc idesc = cudaCreateChannelDesc<int>();
  cudaArray_t gatherArray;
  CHECK(cudaMallocArray(&gatherArray, &idesc, 4, 4));
  CHECK(cudaMemcpy2DToArray(gatherArray, 0, 0, cells, 16, 16, 4, cudaMemcpyHostToDevice));
  res.res.array.array = gatherArray;
  cudaTextureObject_t gatherTex;
  CHECK(cudaCreateTextureObject(&gatherTex, &res, &raw, nullptr));

  float vol[4 * 3 * 2];
  for (int i = 0; i < 24; ++i) vol[i] = i * 0.25f;
  cudaArray_t volume;
  CHECK(cudaMalloc3DArray(&volume, &fdesc, make_cudaExtent(4, 3, 2)));
  cudaMemcpy3DParms p{};
  p.srcPtr = make_cudaPitchedPtr(vol, 4 * sizeof(float), 4, 3);
  p.dstArray = volume;
  p.extent = make_cudaExtent(4, 3, 2);
  p.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&p));
  res.res.array.array = volume;
  cudaTextureObject_t volumeTex;
  CHECK(cudaCreateTextureObject(&volumeTex, &res, &raw, nullptr));

  unsigned char ramp[32];
  for (int i = 0; i < 32; ++i) ramp[i] = (unsigned char)(i * 8);
  cudaChannelFormatDesc bdesc = cudaCreateChannelDesc<unsigned char>();
  cudaArray_t bytes;
  CHECK(cudaMallocArray(&bytes, &bdesc, 32));
  CHECK(cudaMemcpy2DToArray(bytes, 0, 0, ramp, 32, 32, 1, cudaMemcpyHostToDevice));
  res.res.array.array = bytes;
  cudaTextureDesc norm = raw;
  norm.readMode = cudaReadModeNormalizedFloat;
  norm.normalizedCoords = 1;
  cudaTextureObject_t bytesTex;
  CHECK(cudaCreateTextureObject(&bytesTex, &res, &norm, nullptr));

  float line[40];
  for (int i = 0; i < 40; ++i) line[i] = i + 0.5f;
  float* dLine;
  CHECK(cudaMalloc(&dLine, sizeof(line)));
  CHECK(cudaMemcpy(dLine, line, sizeof(line), cudaMemcpyHostToDevice));
  cudaResourceDesc lres{};
  lres.resType = cudaResourceTypeLinear;
  lres.res.linear.devPtr = dLine;
  lres.res.linear.desc = fdesc;
  lres.res.linear.sizeInBytes = sizeof(line);
  cudaTextureObject_t lineTex;
  CHECK(cudaCreateTextureObject(&lineTex, &lres, &raw, nullptr));

  float* dMisc;
  int4* dGathered;
  CHECK(cudaMalloc(&dMisc, 96 * sizeof(float)));
  CHECK(cudaMalloc(&dGathered, 32 * sizeof(int4)));
  misc<<<1, 32>>>(dMisc, dGathered, gatherTex, volumeTex, bytesTex, lineTex);
  CHECK(cudaGetLastError());
  float m[96];
  int4 g[32];
  CHECK(cudaMemcpy(m, dMisc, sizeof(m), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(g, dGathered, sizeof(g), cudaMemcpyDeviceToHost));
  int miscBad = 0;
  auto cell = [&](int x, int y) {
    x = x < 0 ? 0 : x > 3 ? 3 : x;
    y = y < 0 ? 0 : y > 3 ? 3 : y;
    return cells[y * 4 + x];
  };
  for (int i = 0; i < 32; ++i) {
    // (i + 1, 2) unnormalized: texels i and i+1 of columns, rows 1 and 2; clamped.
    int x0 = i, y0 = 1;
    int4 want{cell(x0, y0 + 1), cell(x0 + 1, y0 + 1), cell(x0 + 1, y0), cell(x0, y0)};
    if (g[i].x != want.x || g[i].y != want.y || g[i].z != want.z || g[i].w != want.w) ++miscBad;
    if (m[i] != vol[(i % 2) * 12 + (i / 4 % 3) * 4 + i % 4]) ++miscBad;
    if (std::fabs(m[32 + i] - ramp[i] / 255.0f) > 1e-7f) ++miscBad;
    int j = i * 3 - 4;
    if (m[64 + i] != (j >= 0 && j < 40 ? line[j] : 0.0f)) ++miscBad;
  }
  std::printf("gather, 3D, normalized bytes, tex1Dfetch: %d bad values\n", miscBad);

  CHECK(cudaDestroyTextureObject(tex));
  CHECK(cudaDestroyTextureObject(pointTex));
  CHECK(cudaDestroyTextureObject(canvasTex));
  CHECK(cudaDestroyTextureObject(gatherTex));
  CHECK(cudaDestroyTextureObject(volumeTex));
  CHECK(cudaDestroyTextureObject(bytesTex));
  CHECK(cudaDestroyTextureObject(lineTex));
  CHECK(cudaDestroySurfaceObject(surf));
  CHECK(cudaFreeArray(array));
  CHECK(cudaFreeArray(canvas));
  CHECK(cudaFreeArray(gatherArray));
  CHECK(cudaFreeArray(volume));
  CHECK(cudaFreeArray(bytes));
  const bool ok = bad == 0 && surfBad == 0 && miscBad == 0;
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
