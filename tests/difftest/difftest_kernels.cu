// SPDX-License-Identifier: Apache-2.0
// Kernels of phos-difftest-job (tests/difftest/difftest_job.cpp), compiled by nvcc
// at build time into three module kinds (PTX text, a fatbin of SASS and
// zstd-compressed PTX, a PTX-only LZ4 fatbin). Integer arithmetic only, and no
// two threads write one word unless through an integer atomic (commutative): a
// launch computes the same bits on vgpu directly, under PhOS, and after any
// checkpoint and restore.
#include <cstddef>

extern "C" {

// Module globals, one copy per loaded module (every module and library instance
// of the job has its own): a restore must bring back their contents and, where
// the job took their address, put them at the same address.
__device__ unsigned int g_counter;      // launches of this module's kernels (atomicAdd)
__device__ unsigned int g_array[1024];  // updated by globals_step
__constant__ unsigned int c_table[256];  // written by the host (cuMemcpyHtoD to the global)
__device__ unsigned int* g_ptr;          // set by set_ptr, dereferenced by through_ptr
__device__ unsigned int g_ptr_words;     // how many words g_ptr may touch

__device__ __forceinline__ unsigned int mixWord(unsigned int v, unsigned int k, unsigned int i) {
  v ^= k * 0x9e3779b9u + i * 0x85ebca6bu;
  v *= 0xcc9e2d51u;
  v ^= v >> 15;
  v += c_table[(i + k) & 255u];
  return v;
}

__device__ __forceinline__ void countLaunch() {
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&g_counter, 1u);
}

// a[i] = hash(seed, i) for i < n.
__global__ void fill(unsigned int* a, unsigned int n, unsigned int seed) {
  countLaunch();
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned int v = seed ^ (i * 0x27d4eb2du);
    v ^= v >> 15;
    v *= 0x2c1b3c6du;
    a[i] = v ^ (v >> 12);
  }
}

// a[i] = f(a[i], k, i) for i < n.
__global__ void mix(unsigned int* a, unsigned int n, unsigned int k) {
  countLaunch();
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    a[i] = mixWord(a[i], k, i);
}

// dst[i] = f(dst[i] ^ rotl(src[i]), k) for i < n; dst and src are different buffers.
__global__ void combine(unsigned int* dst, const unsigned int* src, unsigned int n, unsigned int k) {
  countLaunch();
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned int s = src[i];
    dst[i] = mixWord(dst[i] ^ ((s << 7) | (s >> 25)), k, i);
  }
}

// The same as combine, its pointers inside a struct passed by value.
struct Pair {
  unsigned int* dst;
  const unsigned int* src;
  unsigned int n;
  unsigned int k;
  unsigned long long salt;
};
__global__ void combine_struct(Pair p) {
  countLaunch();
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x) {
    unsigned int s = p.src[i];
    p.dst[i] = mixWord(p.dst[i] ^ ((s << 7) | (s >> 25)) ^ static_cast<unsigned int>(p.salt >> 32), p.k, i);
  }
}

// A table of pointers in device memory, each entry naming a buffer of its own
// (or null): entry j's first min(n, words) words are updated through it. The
// kernel's arguments name only the table: speculation cannot see the buffers.
struct Entry {
  unsigned int* p;
  unsigned int words;
  unsigned int pad;
};
__global__ void gather(const Entry* table, unsigned int entries, unsigned int n, unsigned int k) {
  countLaunch();
  for (unsigned int j = 0; j < entries; ++j) {
    unsigned int* p = table[j].p;
    if (p == nullptr) continue;
    unsigned int m = table[j].words < n ? table[j].words : n;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x)
      p[i] = mixWord(p[i], k + j, i);
  }
}

// g_ptr and g_ptr_words are set by one kernel and used by another.
__global__ void set_ptr(unsigned int* p, unsigned int words) {
  countLaunch();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    g_ptr = p;
    g_ptr_words = words;
  }
}

__global__ void through_ptr(unsigned int n, unsigned int k) {
  countLaunch();
  unsigned int* p = g_ptr;
  if (p == nullptr) return;
  unsigned int m = g_ptr_words < n ? g_ptr_words : n;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x)
    p[i] = mixWord(p[i], k, i);
}

// g_array[i] = f(g_array[i], k) with the constant table.
__global__ void globals_step(unsigned int k) {
  countLaunch();
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < 1024u; i += gridDim.x * blockDim.x)
    g_array[i] = mixWord(g_array[i] + c_table[i & 255u], k, i);
}

// bins[src[i] & 63] += 1 for i < n: integer atomics, any order gives the same sums.
__global__ void histogram(const unsigned int* src, unsigned int n, unsigned int* bins) {
  countLaunch();
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&bins[src[i] & 63u], 1u + (src[i] >> 26));
}

// out[b] = the sum of block b's slice of src, through dynamic shared memory
// (blockDim.x words; the launch may ask for more, which is left unused).
__global__ void reduce_shared(const unsigned int* src, unsigned int n, unsigned int* out) {
  extern __shared__ unsigned int shared[];
  countLaunch();
  unsigned int sum = 0;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    sum += src[i] * (i | 1u);
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
}

// A 2D kernel over a pitched allocation: rows of `width` words, `pitch` bytes apart.
__global__ void pitched(unsigned int* base, size_t pitch, unsigned int width, unsigned int height,
                        unsigned int k) {
  countLaunch();
  for (unsigned int y = blockIdx.y; y < height; y += gridDim.y) {
    unsigned int* row = reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(base) + y * pitch);
    for (unsigned int x = blockIdx.x * blockDim.x + threadIdx.x; x < width; x += gridDim.x * blockDim.x)
      row[x] = mixWord(row[x], k + y, x);
  }
}

// dst[i] = f(dst[i] ^ texel (i mod w, i / w mod h), k) for i < n: a texture
// object over a CUDA array of 32-bit words, point-sampled at texel centres.
__global__ void tex_sample(unsigned int* dst, unsigned long long tex, unsigned int n,
                           unsigned int w, unsigned int h, unsigned int k) {
  countLaunch();
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const unsigned int t = tex2D<unsigned int>(tex, (i % w) + 0.5f, ((i / w) % h) + 0.5f);
    dst[i] = mixWord(dst[i] ^ t, k, i);
  }
}

// Every texel (x, y) of a w x h array = f(src[(y * w + x) mod n], k), through a
// surface object.
__global__ void surf_store(unsigned long long surf, const unsigned int* src, unsigned int n,
                           unsigned int w, unsigned int h, unsigned int k) {
  countLaunch();
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < w * h;
       i += gridDim.x * blockDim.x)
    surf2Dwrite(mixWord(src[i % n], k, i), surf, static_cast<int>((i % w) * 4u),
                static_cast<int>(i / w));
}

}  // extern "C"
