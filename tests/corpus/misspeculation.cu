// SPDX-License-Identifier: Apache-2.0
// Corpus: kernels built so that speculation from the launch's parameter words cannot
// name a memory they access, which the validator twins must catch, and two controls
// (generic and predicated accesses) on which they must report nothing (issue 8).
#include <cstdint>

// The pointer the kernel writes through lives in device memory: the parameter
// points at a table of pointers, not at the buffer that is written.
extern "C" __global__ void write_through_device_pointer(float* const* table, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float* out = table[0];
  if (i < n) out[i] = 2.0f * i;
}

// Rodinia-style: the output buffer is reached through a __device__ global the
// host set with cudaMemcpyToSymbol before the launch.
__device__ float* g_output;

extern "C" __global__ void write_through_global_pointer(const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) g_output[i] = in[i] * 3.0f;
}

// The same through a call, so the access is in a .func and not in the entry.
__device__ __noinline__ void storeScaled(float* base, int i, float v) { base[i] = v * 0.5f; }

extern "C" __global__ void write_through_global_pointer_call(const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) storeScaled(g_output, i, in[i]);
}

// An off-by-`extra` loop bound: the last `extra` elements land in whatever
// allocation follows `out` (the harness places a buffer no argument names there).
extern "C" __global__ void write_past_end(float* out, int n, int extra) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n + extra) out[i] = 1.0f + i;
}

// Reads one element past the end of `in`: only the restore twin, which checks
// loads, must report it; the checkpoint twin checks writes only.
extern "C" __global__ void read_past_end(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + in[i + 1];
}

// Atomics whose target addresses come from an array in device memory (a
// work-list of counters, as graph kernels keep).
extern "C" __global__ void atomic_through_pointer_table(int* const* counters, int slots, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(counters[i % slots], 1 + (i & 3));
}

// A pointer split into 32-bit halves at offset 4 of a struct argument: no aligned
// 8-byte word of the parameter buffer holds it, so word matching cannot find it.
struct SplitPointer {
  int32_t count;
  uint32_t low;
  uint32_t high;
  float value;
};

extern "C" __global__ void write_through_split_pointer(SplitPointer p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float* out = reinterpret_cast<float*>((static_cast<uint64_t>(p.high) << 32) | p.low);
  if (i < p.count) out[i] = p.value + i;
}

// The overflow is folded into the store's immediate offset (st.global [%rd+32]):
// a check that ignores the offset sees an address inside `out`.
extern "C" __global__ void write_past_end_offset(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float* p = out + i;
  if (i < n) p[8] = 0.5f * i;
}

// The last 16-byte store starts inside `out` and ends in the next allocation: a
// check of the first byte only does not see it.
extern "C" __global__ void store_straddles_end(float4* out, int n4) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) out[i] = make_float4(i, i + 1, i + 2, i + 3);
}

// Indexing past a __device__ array into the variable after it: speculation names
// g_small (the kernel uses it), not g_next.
__device__ int g_small[4];
__device__ int g_next[4];

extern "C" __global__ void global_array_overflow(int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) g_small[i] = 10 + i;
}

// A read past the end through the non-coherent path (ld.global.nc): restore
// twins must check it like any other load.
extern "C" __global__ void read_past_end_ldg(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __ldg(&in[i]) + __ldg(&in[i + 1]);
}

// A predicated store (@p st.global): threads whose predicate is false form
// addresses past the end that they never use. With n within the buffer nothing
// may be reported; with n past it, the stores that do happen must be.
extern "C" __global__ void predicated_store(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = 1.0f + i;
  asm volatile("{\n\t.reg .pred p;\n\tsetp.lt.s32 p, %0, %1;\n\t@p st.global.f32 [%2], %3;\n\t}"
               :
               : "r"(i), "r"(n), "l"(out + i), "f"(v)
               : "memory");
}

// Past the end of `out` is `in`, which the kernel only reads: the stores land in
// a range the twin's table has, but read-only. The access bits must be checked,
// not only whether some range contains the address.
extern "C" __global__ void write_past_end_into_input(float* out, const float* in, int n, int extra) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n + extra) out[i] = 2.0f * in[i % n];
}

// A C++ kernel (mangled name: `in` is declared const) that writes through `in`
// after the pointer went through shared memory: the PTX analysis loses it, the
// declared const narrows it to read-only, and the kernel casts the const away.
__global__ void write_through_const_cast(const float* in, int n) {
  __shared__ const float* slot;
  if (threadIdx.x == 0) slot = in;
  __syncthreads();
  float* w = const_cast<float*>(slot);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) w[i] = 4.0f * i;
}

// Not a mis-speculation: generic stores and loads (in a .func that cannot know the
// space) that reach shared and local memory as well as global. Only the global
// ones may be checked against the ranges; a report here is a false alarm.
__device__ __noinline__ void storeGeneric(float* p, int i, float v) { p[i] = v; }
__device__ __noinline__ float loadGeneric(const float* p, int i) { return p[i]; }

extern "C" __global__ void generic_spaces(const float* in, float* out, int n) {
  __shared__ float tile[256];
  float local[4];
  int t = threadIdx.x;
  int i = blockIdx.x * blockDim.x + t;
  storeGeneric(tile, t, i < n ? loadGeneric(in, i) : 0.0f);
  storeGeneric(local, t & 3, 2.0f * t);
  __syncthreads();
  if (i < n) storeGeneric(out, i, loadGeneric(tile, (t + 1) & 255) + loadGeneric(local, t & 3));
}

// A store inside a device function called through a function pointer: the
// generator cannot give that call a twin, so it lists the kernel as unchecked
// (TwinStats::kernelsWithUncheckedCalls) and phosd falls back to stop-the-world
// for it. The target buffer comes from a pointer table, so speculation misses it.
typedef void (*StoreFn)(float*, int, float);
__device__ __noinline__ void storeViaPointer(float* p, int i, float v) { p[i] = v + 0.25f; }
__device__ StoreFn g_store = storeViaPointer;

extern "C" __global__ void write_through_function_pointer(float* const* table, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) g_store(table[0], i, 1.0f * i);
}
