// SPDX-License-Identifier: Apache-2.0
// Warp-level mma.sync with ldmatrix (sm_80), in inline PTX as CUTLASS-style
// code writes it: A (16 x K, row-major) and B (K x 8) staged in shared memory,
// loaded into fragments with ldmatrix (B both n-major, and k-major through
// .trans), multiplied 16 (or 8) columns of K at a time, and D written back
// from the accumulator fragment by the PTX ISA's element positions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// D (16 x 8, f32, row-major) = A (16 x k, row-major) x B, B given n-major
// (bt[n * k + kk]); `trans`: B is staged k-major and loaded with .trans.
template <typename T, bool Bf16>
__device__ void mma16816(const T* a, const T* bt, float* d, int k, bool trans) {
  __shared__ alignas(16) T sa[16 * 16];
  __shared__ alignas(16) T sb[8 * 16];
  const int t = threadIdx.x;
  float acc[4] = {0, 0, 0, 0};
  for (int kk = 0; kk < k; kk += 16) {
    for (int i = t; i < 256; i += 32) sa[i] = a[(i / 16) * k + kk + i % 16];
    for (int i = t; i < 128; i += 32) {
      const int n = i / 16, kq = i % 16;
      if (trans) sb[kq * 8 + n] = bt[n * k + kk + kq];  // k-major: row kq holds 8 n's
      else sb[i] = bt[n * k + kk + kq];                 // n-major: row n holds 16 k's
    }
    __syncwarp();
    unsigned a0, a1, a2, a3, b0, b1;
    const unsigned aaddr = static_cast<unsigned>(__cvta_generic_to_shared(&sa[(t % 16) * 16 + (t / 16) * 8]));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(aaddr));
    if (trans) {
      const unsigned baddr = static_cast<unsigned>(__cvta_generic_to_shared(&sb[(t % 16) * 8]));
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(baddr));
    } else {
      const unsigned baddr = static_cast<unsigned>(__cvta_generic_to_shared(&sb[(t % 8) * 16 + ((t / 8) % 2) * 8]));
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(baddr));
    }
    if (Bf16) {
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                   "{%8, %9}, {%0, %1, %2, %3};"
                   : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                   "{%8, %9}, {%0, %1, %2, %3};"
                   : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    __syncwarp();
  }
  const int g = t / 4, tig = t % 4;
  d[g * 8 + 2 * tig] = acc[0];
  d[g * 8 + 2 * tig + 1] = acc[1];
  d[(g + 8) * 8 + 2 * tig] = acc[2];
  d[(g + 8) * 8 + 2 * tig + 1] = acc[3];
}

extern "C" __global__ void mma_f16(const half* a, const half* bt, float* d, int k, int trans) {
  mma16816<half, false>(a, bt, d, k, trans != 0);
}
extern "C" __global__ void mma_bf16(const __nv_bfloat16* a, const __nv_bfloat16* bt, float* d, int k, int trans) {
  mma16816<__nv_bfloat16, true>(a, bt, d, k, trans != 0);
}

// m16n8k8 with an f16 accumulator, fragments loaded by the ISA's element
// positions from global memory: A 16 x 8 row-major, B n-major 8 x 8, C and D
// 16 x 8 row-major.
extern "C" __global__ void mma_m16n8k8_f16(const half* a, const half* bt, const half* c, half* d) {
  const int t = threadIdx.x, g = t / 4, tig = t % 4;
  auto pack = [](half lo, half hi) {
    return static_cast<unsigned>(__half_as_ushort(lo)) | (static_cast<unsigned>(__half_as_ushort(hi)) << 16);
  };
  const unsigned a0 = pack(a[g * 8 + 2 * tig], a[g * 8 + 2 * tig + 1]);
  const unsigned a1 = pack(a[(g + 8) * 8 + 2 * tig], a[(g + 8) * 8 + 2 * tig + 1]);
  const unsigned b0 = pack(bt[g * 8 + 2 * tig], bt[g * 8 + 2 * tig + 1]);
  unsigned c0 = pack(c[g * 8 + 2 * tig], c[g * 8 + 2 * tig + 1]);
  unsigned c1 = pack(c[(g + 8) * 8 + 2 * tig], c[(g + 8) * 8 + 2 * tig + 1]);
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0, %1}, {%2, %3}, {%4}, {%0, %1};"
               : "+r"(c0), "+r"(c1) : "r"(a0), "r"(a1), "r"(b0));
  d[g * 8 + 2 * tig] = __ushort_as_half(static_cast<unsigned short>(c0));
  d[g * 8 + 2 * tig + 1] = __ushort_as_half(static_cast<unsigned short>(c0 >> 16));
  d[(g + 8) * 8 + 2 * tig] = __ushort_as_half(static_cast<unsigned short>(c1));
  d[(g + 8) * 8 + 2 * tig + 1] = __ushort_as_half(static_cast<unsigned short>(c1 >> 16));
}
