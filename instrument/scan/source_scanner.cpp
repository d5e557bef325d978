// SPDX-License-Identifier: Apache-2.0
// The source scanner: runs Clang's front end over .cu files (CUDA host mode, a built-in
// prelude instead of the CUDA headers) and turns every __global__ declaration into a
// DeclaredKernel. The only translation unit that includes libTooling's headers.
#include "source_scanner.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <clang/AST/ASTConsumer.h>
#include <clang/AST/ASTContext.h>
#include <clang/AST/Attr.h>
#include <clang/AST/DeclCXX.h>
#include <clang/AST/DeclTemplate.h>
#include <clang/AST/GlobalDecl.h>
#include <clang/AST/Mangle.h>
#include <clang/AST/RecordLayout.h>
#include <clang/AST/RecursiveASTVisitor.h>
#include <clang/Basic/DiagnosticLex.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/FrontendAction.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Sema/Sema.h>
#include <clang/Tooling/CompilationDatabase.h>
#include <clang/Tooling/Tooling.h>
#include <llvm/Support/raw_ostream.h>

#ifndef PHOS_CLANG_RESOURCE_DIR
#define PHOS_CLANG_RESOURCE_DIR "/usr/lib/llvm-14/lib/clang/14.0.6"
#endif
#ifndef PHOS_CLANG_DRIVER
#define PHOS_CLANG_DRIVER "/usr/lib/llvm-14/bin/clang++"
#endif

namespace phos::instrument::scan {
namespace {

namespace fs = std::filesystem;


// What nvcc makes visible without an #include (cuda_runtime.h and the crt headers),
// reduced to what kernel signatures and common kernel bodies need. Clang 14 cannot
// parse the CUDA 13 headers themselves. Types that appear in signatures keep nvcc's
// names, sizes and alignments: they decide mangled names and struct layouts. The rest
// (intrinsics, the runtime API) only keeps typical bodies free of errors; a body that
// still has errors costs nothing but a warning.
constexpr const char* kPrelude = R"cuda(
#define __CUDACC__ 1
#define __CUDACC_VER_MAJOR__ 12
#define __CUDACC_VER_MINOR__ 0
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __managed__ __attribute__((managed))
#define __forceinline__ __inline__ __attribute__((always_inline))
/* Empty, not __attribute__((noinline)): libstdc++ writes __attribute__((__noinline__)). */
#define __noinline__
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __maxnreg__(...)
#define __grid_constant__
#define __device_builtin__
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __attribute__((aligned(n)))
#define __CUDA_ALIGN__(n) __attribute__((aligned(n)))

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <climits>
#include <cmath>

#define PHOS_SCAN_VECTOR_TYPES_(name, T, a1, a2, a3, a4)                              \
  struct __attribute__((aligned(a1))) name##1 { T x; };                                \
  struct __attribute__((aligned(a2))) name##2 { T x, y; };                             \
  struct __attribute__((aligned(a3))) name##3 { T x, y, z; };                          \
  struct __attribute__((aligned(a4))) name##4 { T x, y, z, w; };                       \
  __host__ __device__ inline name##1 make_##name##1(T x) { return {x}; }               \
  __host__ __device__ inline name##2 make_##name##2(T x, T y) { return {x, y}; }       \
  __host__ __device__ inline name##3 make_##name##3(T x, T y, T z) { return {x, y, z}; } \
  __host__ __device__ inline name##4 make_##name##4(T x, T y, T z, T w) { return {x, y, z, w}; }
PHOS_SCAN_VECTOR_TYPES_(char, signed char, 1, 2, 1, 4)
PHOS_SCAN_VECTOR_TYPES_(uchar, unsigned char, 1, 2, 1, 4)
PHOS_SCAN_VECTOR_TYPES_(short, short, 2, 4, 2, 8)
PHOS_SCAN_VECTOR_TYPES_(ushort, unsigned short, 2, 4, 2, 8)
PHOS_SCAN_VECTOR_TYPES_(int, int, 4, 8, 4, 16)
PHOS_SCAN_VECTOR_TYPES_(uint, unsigned int, 4, 8, 4, 16)
PHOS_SCAN_VECTOR_TYPES_(long, long, 8, 16, 8, 16)
PHOS_SCAN_VECTOR_TYPES_(ulong, unsigned long, 8, 16, 8, 16)
PHOS_SCAN_VECTOR_TYPES_(longlong, long long, 8, 16, 8, 16)
PHOS_SCAN_VECTOR_TYPES_(ulonglong, unsigned long long, 8, 16, 8, 16)
PHOS_SCAN_VECTOR_TYPES_(float, float, 4, 8, 4, 16)
PHOS_SCAN_VECTOR_TYPES_(double, double, 8, 16, 8, 16)
#undef PHOS_SCAN_VECTOR_TYPES_

struct dim3 {
  unsigned x, y, z;
  __host__ __device__ constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1)
      : x(vx), y(vy), z(vz) {}
  __host__ __device__ constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  __host__ __device__ constexpr operator uint3() const { return uint3{x, y, z}; }
};
extern const __device__ uint3 threadIdx;
extern const __device__ uint3 blockIdx;
extern const __device__ dim3 blockDim;
extern const __device__ dim3 gridDim;
extern const __device__ int warpSize;

struct __attribute__((aligned(2))) __half {
  unsigned short __x;
  __half() = default;
  __host__ __device__ __half(float);
  __host__ __device__ __half(double);
  __host__ __device__ __half(int);
  __host__ __device__ operator float() const;
};
struct __attribute__((aligned(4))) __half2 {
  __half x, y;
  __half2() = default;
  __host__ __device__ __half2(__half, __half);
};
typedef __half half;
typedef __half2 half2;
struct __attribute__((aligned(2))) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __host__ __device__ __nv_bfloat16(float);
  __host__ __device__ __nv_bfloat16(double);
  __host__ __device__ operator float() const;
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  __host__ __device__ __nv_bfloat162(__nv_bfloat16, __nv_bfloat16);
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;
#define PHOS_SCAN_FP8_(name, storage, align)                      \
  struct __attribute__((aligned(align))) name {                    \
    storage __x;                                                   \
    name() = default;                                              \
    __host__ __device__ explicit name(float);                      \
    __host__ __device__ explicit name(float2);                     \
    __host__ __device__ explicit name(__half);                     \
    __host__ __device__ explicit name(__half2);                    \
    __host__ __device__ explicit operator float() const;           \
    __host__ __device__ explicit operator __half2() const;         \
  };
PHOS_SCAN_FP8_(__nv_fp8_e4m3, unsigned char, 1)
PHOS_SCAN_FP8_(__nv_fp8_e5m2, unsigned char, 1)
PHOS_SCAN_FP8_(__nv_fp8x2_e4m3, unsigned short, 2)
PHOS_SCAN_FP8_(__nv_fp8x2_e5m2, unsigned short, 2)
PHOS_SCAN_FP8_(__nv_fp8x4_e4m3, unsigned int, 4)
PHOS_SCAN_FP8_(__nv_fp8x4_e5m2, unsigned int, 4)
#undef PHOS_SCAN_FP8_

typedef unsigned long long cudaTextureObject_t;
typedef unsigned long long cudaSurfaceObject_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
enum cudaError { cudaSuccess = 0 };
typedef enum cudaError cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice, cudaMemcpyDefault
};

/* What clang's Sema looks up for a <<<...>>> launch (which one depends on the CUDA
   version it assumes). */
extern "C" int cudaConfigureCall(dim3, dim3, size_t = 0, cudaStream_t = 0);
extern "C" unsigned __cudaPushCallConfiguration(dim3, dim3, size_t = 0, cudaStream_t = 0);

extern "C" {
cudaError_t cudaMalloc(void**, size_t);
cudaError_t cudaMallocManaged(void**, size_t, unsigned = 1);
cudaError_t cudaMallocHost(void**, size_t);
cudaError_t cudaFree(void*);
cudaError_t cudaFreeHost(void*);
cudaError_t cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind);
cudaError_t cudaMemcpyAsync(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t = 0);
cudaError_t cudaMemset(void*, int, size_t);
cudaError_t cudaMemsetAsync(void*, int, size_t, cudaStream_t = 0);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char* cudaGetErrorString(cudaError_t);
cudaError_t cudaSetDevice(int);
cudaError_t cudaGetDevice(int*);
cudaError_t cudaStreamCreate(cudaStream_t*);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaEventCreate(cudaEvent_t*);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t);
cudaError_t cudaEventElapsedTime(float*, cudaEvent_t, cudaEvent_t);
cudaError_t cudaEventDestroy(cudaEvent_t);
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t);
}
template <class T> cudaError_t cudaMalloc(T** p, size_t n) { return ::cudaMalloc((void**)p, n); }
template <class T> cudaError_t cudaMallocManaged(T** p, size_t n, unsigned f = 1) {
  return ::cudaMallocManaged((void**)p, n, f);
}
template <class T> cudaError_t cudaMemcpyToSymbol(const T&, const void*, size_t, size_t = 0,
    cudaMemcpyKind = cudaMemcpyHostToDevice);
template <class T> cudaError_t cudaMemcpyFromSymbol(void*, const T&, size_t, size_t = 0,
    cudaMemcpyKind = cudaMemcpyDeviceToHost);

__device__ void __syncthreads(void);
__device__ int __syncthreads_count(int);
__device__ int __syncthreads_and(int);
__device__ int __syncthreads_or(int);
__device__ void __syncwarp(unsigned = 0xffffffffu);
__device__ void __threadfence(void);
__device__ void __threadfence_block(void);
__device__ void __threadfence_system(void);
__device__ void __nanosleep(unsigned);
__device__ long long clock64(void);
__device__ unsigned long long __globaltimer(void);
#define PHOS_SCAN_ATOMIC_(op) \
  template <class T, class U> __device__ T op(T*, U); \
  template <class T, class U> __device__ T op##_block(T*, U); \
  template <class T, class U> __device__ T op##_system(T*, U);
PHOS_SCAN_ATOMIC_(atomicAdd) PHOS_SCAN_ATOMIC_(atomicSub) PHOS_SCAN_ATOMIC_(atomicExch)
PHOS_SCAN_ATOMIC_(atomicMin) PHOS_SCAN_ATOMIC_(atomicMax) PHOS_SCAN_ATOMIC_(atomicInc)
PHOS_SCAN_ATOMIC_(atomicDec) PHOS_SCAN_ATOMIC_(atomicAnd) PHOS_SCAN_ATOMIC_(atomicOr)
PHOS_SCAN_ATOMIC_(atomicXor)
#undef PHOS_SCAN_ATOMIC_
template <class T, class U, class V> __device__ T atomicCAS(T*, U, V);
template <class T> __device__ T __shfl_sync(unsigned, T, int, int = 32);
template <class T> __device__ T __shfl_up_sync(unsigned, T, unsigned, int = 32);
template <class T> __device__ T __shfl_down_sync(unsigned, T, unsigned, int = 32);
template <class T> __device__ T __shfl_xor_sync(unsigned, T, int, int = 32);
__device__ unsigned __ballot_sync(unsigned, int);
__device__ int __all_sync(unsigned, int);
__device__ int __any_sync(unsigned, int);
__device__ unsigned __activemask(void);
template <class T> __device__ unsigned __match_any_sync(unsigned, T);
template <class T> __device__ unsigned __match_all_sync(unsigned, T, int*);
__device__ unsigned __reduce_add_sync(unsigned, unsigned);
__device__ unsigned __reduce_min_sync(unsigned, unsigned);
__device__ unsigned __reduce_max_sync(unsigned, unsigned);
__device__ unsigned __reduce_and_sync(unsigned, unsigned);
__device__ unsigned __reduce_or_sync(unsigned, unsigned);
__device__ unsigned __reduce_xor_sync(unsigned, unsigned);
template <class T> __device__ T __ldg(const T*);
template <class T> __device__ T __ldcg(const T*);
template <class T> __device__ T __ldca(const T*);
template <class T> __device__ T __ldcs(const T*);
template <class T> __device__ T __ldlu(const T*);
template <class T> __device__ T __ldcv(const T*);
template <class T> __device__ void __stcg(T*, T);
template <class T> __device__ void __stcs(T*, T);
template <class T> __device__ void __stwt(T*, T);
__device__ int __popc(unsigned);
__device__ int __popcll(unsigned long long);
__device__ int __clz(int);
__device__ int __clzll(long long);
__device__ int __ffs(int);
__device__ int __ffsll(long long);
__device__ unsigned __brev(unsigned);
__device__ unsigned long long __brevll(unsigned long long);
__device__ unsigned __fns(unsigned, unsigned, int);
__device__ unsigned __funnelshift_l(unsigned, unsigned, unsigned);
__device__ unsigned __funnelshift_r(unsigned, unsigned, unsigned);
__device__ unsigned __byte_perm(unsigned, unsigned, unsigned);
__device__ int __mulhi(int, int);
__device__ unsigned __umulhi(unsigned, unsigned);
__device__ long long __mul64hi(long long, long long);
__device__ unsigned long long __umul64hi(unsigned long long, unsigned long long);
__device__ unsigned __sad(int, int, unsigned);
__device__ unsigned __usad(unsigned, unsigned, unsigned);
__device__ float __fdividef(float, float);
__device__ float __expf(float);
__device__ float __logf(float);
__device__ float __sinf(float);
__device__ float __cosf(float);
__device__ float __powf(float, float);
__device__ float __saturatef(float);
__device__ float __fmaf_rn(float, float, float);
__device__ float __fadd_rn(float, float);
__device__ float __fmul_rn(float, float);
__device__ float __frcp_rn(float);
__device__ float __fsqrt_rn(float);
__device__ float __frsqrt_rn(float);
__device__ double __dsqrt_rn(double);
__host__ __device__ float rsqrtf(float);
__host__ __device__ double rsqrt(double);
__host__ __device__ float rcbrtf(float);
__host__ __device__ float erfinvf(float);
__host__ __device__ float normcdff(float);
__host__ __device__ float __int_as_float(int);
__host__ __device__ int __float_as_int(float);
__host__ __device__ float __uint_as_float(unsigned);
__host__ __device__ unsigned __float_as_uint(float);
__host__ __device__ long long __double_as_longlong(double);
__host__ __device__ double __longlong_as_double(long long);
__device__ int __float2int_rn(float);
__device__ int __float2int_rz(float);
__device__ unsigned __float2uint_rn(float);
__device__ float __int2float_rn(int);
__device__ int __double2hiint(double);
__device__ int __double2loint(double);
__device__ double __hiloint2double(int, int);
/* Host math (from <cmath>) cannot be called from a kernel: Clang's CUDA overload
   rules only see __device__ candidates there. */
#define PHOS_SCAN_MATH1_(fn) \
  __device__ double fn(double); __device__ float fn(float); __device__ float fn##f(float);
#define PHOS_SCAN_MATH2_(fn) \
  __device__ double fn(double, double); __device__ float fn(float, float); \
  __device__ float fn##f(float, float);
PHOS_SCAN_MATH1_(sqrt) PHOS_SCAN_MATH1_(cbrt) PHOS_SCAN_MATH1_(exp) PHOS_SCAN_MATH1_(exp2)
PHOS_SCAN_MATH1_(exp10) PHOS_SCAN_MATH1_(expm1) PHOS_SCAN_MATH1_(log) PHOS_SCAN_MATH1_(log2)
PHOS_SCAN_MATH1_(log10) PHOS_SCAN_MATH1_(log1p) PHOS_SCAN_MATH1_(sin) PHOS_SCAN_MATH1_(cos)
PHOS_SCAN_MATH1_(tan) PHOS_SCAN_MATH1_(asin) PHOS_SCAN_MATH1_(acos) PHOS_SCAN_MATH1_(atan)
PHOS_SCAN_MATH1_(sinh) PHOS_SCAN_MATH1_(cosh) PHOS_SCAN_MATH1_(tanh) PHOS_SCAN_MATH1_(asinh)
PHOS_SCAN_MATH1_(acosh) PHOS_SCAN_MATH1_(atanh) PHOS_SCAN_MATH1_(erf) PHOS_SCAN_MATH1_(erfc)
PHOS_SCAN_MATH1_(tgamma) PHOS_SCAN_MATH1_(lgamma) PHOS_SCAN_MATH1_(floor) PHOS_SCAN_MATH1_(ceil)
PHOS_SCAN_MATH1_(trunc) PHOS_SCAN_MATH1_(round) PHOS_SCAN_MATH1_(rint) PHOS_SCAN_MATH1_(nearbyint)
PHOS_SCAN_MATH1_(fabs)
PHOS_SCAN_MATH2_(pow) PHOS_SCAN_MATH2_(fmin) PHOS_SCAN_MATH2_(fmax) PHOS_SCAN_MATH2_(fmod)
PHOS_SCAN_MATH2_(atan2) PHOS_SCAN_MATH2_(hypot) PHOS_SCAN_MATH2_(copysign) PHOS_SCAN_MATH2_(fdim)
PHOS_SCAN_MATH2_(remainder)
#undef PHOS_SCAN_MATH1_
#undef PHOS_SCAN_MATH2_
__device__ double fma(double, double, double);
__device__ float fma(float, float, float);
__device__ float fmaf(float, float, float);
__device__ void sincosf(float, float*, float*);
__device__ void sincos(double, double*, double*);
__device__ bool isnan(float); __device__ bool isnan(double);
__device__ bool isinf(float); __device__ bool isinf(double);
__device__ bool isfinite(float); __device__ bool isfinite(double);
__device__ bool signbit(float); __device__ bool signbit(double);
__device__ int abs(int);
/* A C variadic __device__ declaration is an error in clang 14; a pack is not. */
template <class... A> __device__ int printf(const char*, A...);
__device__ void* malloc(size_t);
__device__ void free(void*);
__device__ void* memcpy(void*, const void*, size_t);
__device__ void* memset(void*, int, size_t);
__device__ long long llabs(long long);
__host__ __device__ int min(int, int);
__host__ __device__ unsigned min(unsigned, unsigned);
__host__ __device__ long long min(long long, long long);
__host__ __device__ float min(float, float);
__host__ __device__ double min(double, double);
__host__ __device__ int max(int, int);
__host__ __device__ unsigned max(unsigned, unsigned);
__host__ __device__ long long max(long long, long long);
__host__ __device__ float max(float, float);
__host__ __device__ double max(double, double);

__host__ __device__ __half __float2half(float);
__host__ __device__ __half __float2half_rn(float);
__host__ __device__ float __half2float(__half);
__host__ __device__ __half2 __float2half2_rn(float);
__host__ __device__ __half2 __floats2half2_rn(float, float);
__host__ __device__ __half2 __halves2half2(__half, __half);
__host__ __device__ float2 __half22float2(__half2);
__device__ __half __low2half(__half2);
__device__ __half __high2half(__half2);
__host__ __device__ __nv_bfloat16 __float2bfloat16(float);
__host__ __device__ __nv_bfloat16 __float2bfloat16_rn(float);
__host__ __device__ float __bfloat162float(__nv_bfloat16);
__host__ __device__ __nv_bfloat162 __floats2bfloat162_rn(float, float);
__host__ __device__ float2 __bfloat1622float2(__nv_bfloat162);
#define PHOS_SCAN_HALF_OPS_(H, H2)                                                    \
  __device__ H __hadd(H, H); __device__ H __hsub(H, H); __device__ H __hmul(H, H);      \
  __device__ H __hdiv(H, H); __device__ H __hfma(H, H, H); __device__ H __hneg(H);      \
  __device__ H __hmax(H, H); __device__ H __hmin(H, H); __device__ H __habs(H);         \
  __device__ bool __hisnan(H); __device__ bool __hlt(H, H); __device__ bool __hgt(H, H); \
  __device__ bool __heq(H, H); __device__ bool __hle(H, H); __device__ bool __hge(H, H); \
  __device__ H hsqrt(H); __device__ H hexp(H); __device__ H hlog(H); __device__ H hrsqrt(H); \
  __device__ H2 __hadd2(H2, H2); __device__ H2 __hsub2(H2, H2); __device__ H2 __hmul2(H2, H2); \
  __device__ H2 __hfma2(H2, H2, H2); __device__ H2 __hneg2(H2); __device__ H2 __hmax2(H2, H2); \
  __device__ H2 __hmin2(H2, H2); __device__ H2 h2sqrt(H2); __device__ H2 h2exp(H2);   \
  __device__ H operator+(H, H); __device__ H operator-(H, H); __device__ H operator*(H, H); \
  __device__ H operator/(H, H); __device__ H2 operator+(H2, H2); __device__ H2 operator*(H2, H2);
PHOS_SCAN_HALF_OPS_(__half, __half2)
PHOS_SCAN_HALF_OPS_(__nv_bfloat16, __nv_bfloat162)
#undef PHOS_SCAN_HALF_OPS_
)cuda";

// Headers nvcc finds in the toolkit, written to a temporary include directory searched
// before the system ones (Debian's CUDA packages put the real, clang-14-incompatible
// headers in /usr/local/include). Each stub declares what its header would name in a
// kernel signature or at namespace scope; the rest is in the prelude or not needed.
struct StubHeader {
  const char* name;
  const char* text;
};
constexpr StubHeader kStubHeaders[] = {
    {"cuda_runtime.h", ""},
    {"cuda_runtime_api.h", ""},
    {"device_launch_parameters.h", ""},
    {"device_functions.h", ""},
    {"vector_types.h", ""},
    {"vector_functions.h", ""},
    {"math_constants.h", ""},
    {"cuda_fp16.h", ""},
    {"cuda_bf16.h", ""},
    {"cuda_fp8.h", ""},
    {"cuda_pipeline.h", ""},
    {"sm_60_atomic_functions.h", ""},
    {"cuda.h", "typedef unsigned long long CUdeviceptr;\ntypedef int CUresult;\n"},
    {"curand_kernel.h",
     "struct curandStateXORWOW;\ntypedef struct curandStateXORWOW curandState_t;\n"
     "typedef curandState_t curandState;\n"
     "struct curandStatePhilox4_32_10;\n"
     "typedef struct curandStatePhilox4_32_10 curandStatePhilox4_32_10_t;\n"},
    {"mma.h",
     "namespace nvcuda { namespace wmma {\n"
     "struct matrix_a; struct matrix_b; struct accumulator; struct row_major; struct col_major;\n"
     "enum layout_t { mem_row_major, mem_col_major };\n"
     "template <class U, int M, int N, int K, class T, class L = void> struct fragment {\n"
     "  T x[8]; };\n"
     "template <class F, class T> __device__ void fill_fragment(F&, T);\n"
     "template <class F, class T> __device__ void load_matrix_sync(F&, const T*, unsigned);\n"
     "template <class F, class T> __device__ void load_matrix_sync(F&, const T*, unsigned, "
     "layout_t);\n"
     "template <class D, class A, class B, class C> __device__ void mma_sync(D&, const A&, "
     "const B&, const C&);\n"
     "template <class T, class F> __device__ void store_matrix_sync(T*, const F&, unsigned, "
     "layout_t);\n"
     "} }\n"},
    {"cooperative_groups.h",
     "namespace cooperative_groups {\n"
     "struct thread_group {\n"
     "  __device__ void sync() const; __device__ unsigned size() const;\n"
     "  __device__ unsigned thread_rank() const; __device__ unsigned long long num_threads() "
     "const; };\n"
     "struct thread_block : thread_group {\n"
     "  __device__ dim3 group_index() const; __device__ dim3 thread_index() const;\n"
     "  __device__ dim3 dim_threads() const; };\n"
     "struct grid_group : thread_group { __device__ bool is_valid() const; };\n"
     "struct cluster_group : thread_group {\n"
     "  __device__ unsigned block_rank() const;\n"
     "  template <class T> __device__ T* map_shared_rank(T*, unsigned) const; };\n"
     "template <unsigned N, class P = void> struct thread_block_tile : thread_group {\n"
     "  template <class T> __device__ T shfl(T, int) const;\n"
     "  template <class T> __device__ T shfl_down(T, unsigned) const;\n"
     "  template <class T> __device__ T shfl_xor(T, unsigned) const;\n"
     "  __device__ unsigned meta_group_rank() const; };\n"
     "__device__ thread_block this_thread_block();\n"
     "__device__ grid_group this_grid();\n"
     "__device__ cluster_group this_cluster();\n"
     "template <unsigned N, class P> __device__ thread_block_tile<N> tiled_partition(const P&);\n"
     "template <class T> struct plus { __device__ T operator()(T, T) const; };\n"
     "template <class T> struct less { __device__ T operator()(T, T) const; };\n"
     "template <class T> struct greater { __device__ T operator()(T, T) const; };\n"
     "template <class T> struct bit_and { __device__ T operator()(T, T) const; };\n"
     "template <class T> struct bit_or { __device__ T operator()(T, T) const; };\n"
     "template <class T> struct bit_xor { __device__ T operator()(T, T) const; };\n"
     "template <class G, class T, class Op> __device__ T reduce(const G&, T, Op);\n"
     "template <class G, class T, class Op> __device__ T inclusive_scan(const G&, T, Op);\n"
     "template <class G, class T, class Op> __device__ T exclusive_scan(const G&, T, Op);\n"
     "}\n"},
    {"cooperative_groups/reduce.h", "#include <cooperative_groups.h>\n"},
    {"cooperative_groups/scan.h", "#include <cooperative_groups.h>\n"},
    {"cooperative_groups/memcpy_async.h", "#include <cooperative_groups.h>\n"},
    {"cuda/pipeline",
     "namespace cuda {\n"
     "enum thread_scope { thread_scope_system, thread_scope_device, thread_scope_block,\n"
     "                    thread_scope_thread };\n"
     "template <thread_scope S> struct pipeline {\n"
     "  __device__ void producer_acquire(); __device__ void producer_commit();\n"
     "  __device__ void consumer_wait(); __device__ void consumer_release(); };\n"
     "__device__ pipeline<thread_scope_thread> make_pipeline();\n"
     "template <class P> __device__ void memcpy_async(void*, const void*, size_t, P&);\n"
     "}\n"},
    {"cuda/barrier", ""},
};

using WarnFn = std::function<void(std::string_view)>;

// Counts Clang's errors per file and keeps the first, so that a file whose kernel
// bodies do not parse costs one warning line instead of pages of diagnostics;
// `echo` (verbose) still prints every diagnostic.
class DiagnosticTally : public clang::DiagnosticConsumer {
 public:
  explicit DiagnosticTally(clang::DiagnosticConsumer* echo) : echo_(echo) {}

  void BeginSourceFile(const clang::LangOptions& langOpts,
                       const clang::Preprocessor* pp) override {
    if (echo_ != nullptr) echo_->BeginSourceFile(langOpts, pp);
  }
  void EndSourceFile() override {
    if (echo_ != nullptr) echo_->EndSourceFile();
  }
  void HandleDiagnostic(clang::DiagnosticsEngine::Level level,
                        const clang::Diagnostic& info) override {
    clang::DiagnosticConsumer::HandleDiagnostic(level, info);
    if (level >= clang::DiagnosticsEngine::Error && firstError_.empty()) {
      llvm::SmallString<160> text;
      info.FormatDiagnostic(text);
      std::string where;
      if (info.getLocation().isValid() && info.hasSourceManager()) {
        clang::PresumedLoc loc = info.getSourceManager().getPresumedLoc(info.getLocation());
        if (loc.isValid()) {
          where = std::string(loc.getFilename()) + ":" + std::to_string(loc.getLine()) + ":" +
                  std::to_string(loc.getColumn()) + ": ";
        }
      }
      firstError_ = where + std::string(text.str());
    }
    if (echo_ != nullptr) echo_->HandleDiagnostic(level, info);
  }

  void reset() {
    clear();
    firstError_.clear();
  }
  const std::string& firstError() const { return firstError_; }

 private:
  clang::DiagnosticConsumer* echo_;
  std::string firstError_;
};

// What one translation unit gave.
struct FileScan {
  bool parsed = false;
  unsigned errors = 0;
  std::string firstError;
  std::vector<DeclaredKernel> kernels;
};

// Walks one translation unit; every __global__ function (and every specialization of
// a __global__ template) becomes a DeclaredKernel.
class KernelCollector : public clang::RecursiveASTVisitor<KernelCollector> {
 public:
  KernelCollector(clang::ASTContext& ctx, clang::Sema& sema, FileScan& out, const WarnFn& warn)
      : ctx_(ctx),
        sema_(sema),
        out_(out),
        warn_(warn),
        mangler_(ctx.createMangleContext()),
        policy_(ctx.getLangOpts()) {
    policy_.SuppressTagKeyword = true;
    policy_.AnonymousTagLocations = false;
  }

  bool VisitFunctionDecl(clang::FunctionDecl* fd) {
    if (!fd->hasAttr<clang::CUDAGlobalAttr>()) return true;
    // The template pattern and its specializations: VisitFunctionTemplateDecl.
    if (fd->getDescribedFunctionTemplate() != nullptr || fd->getPrimaryTemplate() != nullptr) {
      return true;
    }
    if (fd->isDependentContext()) return true;
    record(fd);
    return true;
  }

  bool VisitFunctionTemplateDecl(clang::FunctionTemplateDecl* td) {
    if (!td->getTemplatedDecl()->hasAttr<clang::CUDAGlobalAttr>()) return true;
    // Explicit instantiations, explicit specializations and the implicit instantiations
    // a launch or an address-of created: each is a kernel of its own in the PTX.
    for (clang::FunctionDecl* spec : td->specializations()) {
      if (spec->isDependentContext()) continue;
      record(spec);
    }
    return true;
  }

 private:
  // The .entry name in nvcc's PTX. In host compilation clang's default reference to
  // a kernel is its launch stub (__device_stub__ prefix); the device-side name is the
  // plain Itanium mangling, which nvcc uses too.
  std::string ptxName(const clang::FunctionDecl* fd) {
    if (!mangler_->shouldMangleDeclName(fd)) return fd->getNameAsString();
    std::string name;
    llvm::raw_string_ostream os(name);
    mangler_->mangleName(clang::GlobalDecl(fd, clang::KernelReferenceKind::Kernel), os);
    os.flush();
    return name;
  }

  std::string where(const clang::Decl* d) const {
    clang::PresumedLoc loc = ctx_.getSourceManager().getPresumedLoc(d->getLocation());
    if (!loc.isValid()) return "";
    return std::string(loc.getFilename()) + ":" + std::to_string(loc.getLine());
  }

  std::string spell(clang::QualType type) const {
    return type.getUnqualifiedType().getAsString(policy_);
  }

  void record(clang::FunctionDecl* fd) {
    if (!fd->hasAttr<clang::CUDAGlobalAttr>()) return;
    std::string display = fd->getQualifiedNameAsString();
    if (fd->isInvalidDecl()) {
      warn_("skipped kernel '" + display + "' (" + where(fd) +
            "): its declaration has errors (an unknown parameter type?)");
      return;
    }
    std::string name = ptxName(fd);
    if (!seen_.insert(name).second) return;
    if (!fd->isExternallyVisible()) {
      warn_("kernel '" + display + "' (" + where(fd) +
            ") has internal linkage: nvcc gives it a name private to its file, which '" +
            name + "' may not match");
    }
    DeclaredKernel kernel;
    kernel.name = name;
    for (unsigned i = 0; i < fd->getNumParams(); ++i) {
      const clang::ParmVarDecl* param = fd->getParamDecl(i);
      DeclaredParam declared;
      declared.ordinal = i;
      declared.type = spell(param->getType());
      std::string problem;
      collectPointers(param->getType(), 0, declared, 0, param->getLocation(), problem);
      if (!problem.empty()) {
        warn_("skipped kernel '" + display + "' (" + where(fd) + "): parameter " +
              std::to_string(i) + " (" + declared.type + "): " + problem);
        return;
      }
      kernel.params.push_back(std::move(declared));
    }
    out_.kernels.push_back(std::move(kernel));
  }

  // Records every pointer reachable by value inside `type` (placed at `offset` in the
  // parameter): the pointer itself, pointer members of structs and their bases, and
  // elements of arrays, recursively. Sets `problem` when a layout is unknowable.
  void collectPointers(clang::QualType type, uint64_t offset, DeclaredParam& out, int depth,
                       clang::SourceLocation loc, std::string& problem) {
    if (!problem.empty()) return;
    if (depth > 64) {
      problem = "types nest too deeply";
      return;
    }
    clang::QualType canonical = type.getCanonicalType();
    if (const auto* pointer = canonical->getAs<clang::PointerType>()) {
      // A function pointer holds a code address, never a buffer speculation tracks.
      if (pointer->getPointeeType()->isFunctionType()) return;
      auto key = static_cast<uint32_t>(offset);
      out.pointers[key] = spell(type);
      out.pointeeConst[key] = pointer->getPointeeType().isConstQualified();
      return;
    }
    if (canonical->isReferenceType()) {
      problem = "a reference parameter (CUDA passes kernel arguments by value)";
      return;
    }
    if (const clang::ConstantArrayType* array = ctx_.getAsConstantArrayType(type)) {
      clang::QualType element = array->getElementType();
      if (!element->isPointerType() && !element->isRecordType() && !element->isArrayType()) {
        return;
      }
      if (!sema_.isCompleteType(loc, element)) {
        problem = "incomplete element type " + spell(element);
        return;
      }
      uint64_t count = array->getSize().getZExtValue();
      uint64_t size = static_cast<uint64_t>(ctx_.getTypeSizeInChars(element).getQuantity());
      // Kernel parameters are at most 32 KiB (CUDA 12.1+); anything larger is not one.
      if (count * size > 32768) {
        problem = "an array larger than the 32 KiB kernel parameter limit";
        return;
      }
      for (uint64_t i = 0; i < count; ++i) {
        collectPointers(element, offset + i * size, out, depth + 1, loc, problem);
      }
      return;
    }
    if (canonical->isRecordType()) {
      // Completing the type instantiates a class template a declaration-only kernel
      // names but nothing else instantiated.
      if (!sema_.isCompleteType(loc, canonical)) {
        problem = "incomplete type " + spell(type);
        return;
      }
      const clang::RecordDecl* record = canonical->getAsRecordDecl()->getDefinition();
      if (record == nullptr || record->isInvalidDecl()) {
        problem = "invalid type " + spell(type);
        return;
      }
      const clang::ASTRecordLayout& layout = ctx_.getASTRecordLayout(record);
      if (const auto* cxx = llvm::dyn_cast<clang::CXXRecordDecl>(record)) {
        for (const clang::CXXBaseSpecifier& base : cxx->bases()) {
          if (base.isVirtual()) {
            problem = "a virtual base class";
            return;
          }
          const clang::CXXRecordDecl* baseDecl = base.getType()->getAsCXXRecordDecl();
          if (baseDecl == nullptr) continue;
          auto baseOffset = static_cast<uint64_t>(layout.getBaseClassOffset(baseDecl).getQuantity());
          collectPointers(base.getType(), offset + baseOffset, out, depth + 1, loc, problem);
        }
      }
      for (const clang::FieldDecl* field : record->fields()) {
        if (field->isBitField()) continue;
        uint64_t bits = layout.getFieldOffset(field->getFieldIndex());
        collectPointers(field->getType(), offset + bits / 8, out, depth + 1, loc, problem);
      }
    }
  }

  clang::ASTContext& ctx_;
  clang::Sema& sema_;
  FileScan& out_;
  const WarnFn& warn_;
  std::unique_ptr<clang::MangleContext> mangler_;
  clang::PrintingPolicy policy_;
  std::set<std::string> seen_;
};

class KernelConsumer : public clang::ASTConsumer {
 public:
  KernelConsumer(clang::CompilerInstance& ci, FileScan& out, DiagnosticTally& tally,
                 const WarnFn& warn)
      : ci_(ci), out_(out), tally_(tally), warn_(warn) {}

  void HandleTranslationUnit(clang::ASTContext& ctx) override {
    KernelCollector collector(ctx, ci_.getSema(), out_, warn_);
    collector.TraverseDecl(ctx.getTranslationUnitDecl());
    out_.parsed = true;
    out_.errors = tally_.getNumErrors();
    out_.firstError = tally_.firstError();
  }

 private:
  clang::CompilerInstance& ci_;
  FileScan& out_;
  DiagnosticTally& tally_;
  const WarnFn& warn_;
};

class KernelScanAction : public clang::ASTFrontendAction {
 public:
  KernelScanAction(std::map<std::string, FileScan>& results, DiagnosticTally& tally,
                   const WarnFn& warn)
      : results_(results), tally_(tally), warn_(warn) {}

 protected:
  bool BeginSourceFileAction(clang::CompilerInstance& ci) override {
    // Not "N errors generated": the tally reports errors once, as a warning.
    ci.getDiagnosticOpts().ShowCarets = false;
    // A header that is not found is fatal by default, and after a fatal error Clang
    // stops instantiating templates: let it be an ordinary error so the rest of the
    // file (and its template kernels) is still seen.
    ci.getDiagnostics().setSeverity(clang::diag::err_pp_file_not_found,
                                    clang::diag::Severity::Error, clang::SourceLocation());
    return true;
  }

  std::unique_ptr<clang::ASTConsumer> CreateASTConsumer(clang::CompilerInstance& ci,
                                                        llvm::StringRef file) override {
    tally_.reset();
    return std::make_unique<KernelConsumer>(ci, results_[file.str()], tally_, warn_);
  }

 private:
  std::map<std::string, FileScan>& results_;
  DiagnosticTally& tally_;
  const WarnFn& warn_;
};

class KernelScanFactory : public clang::tooling::FrontendActionFactory {
 public:
  KernelScanFactory(std::map<std::string, FileScan>& results, DiagnosticTally& tally,
                    const WarnFn& warn)
      : results_(results), tally_(tally), warn_(warn) {}

  std::unique_ptr<clang::FrontendAction> create() override {
    return std::make_unique<KernelScanAction>(results_, tally_, warn_);
  }

 private:
  std::map<std::string, FileScan>& results_;
  DiagnosticTally& tally_;
  const WarnFn& warn_;
};

bool isCudaToolkitInclude(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "cuda_runtime.h", ec);
}

// The flags of a project compile command that matter to parsing: include paths,
// macros, forced includes and the language standard. nvcc's own flags (-arch,
// -Xcompiler, --expt-relaxed-constexpr ...) mean nothing to clang and are dropped.
std::vector<std::string> projectFlags(const clang::tooling::CompileCommand& command,
                                      const WarnFn& warn) {
  std::vector<std::string> flags;
  auto absolute = [&](const std::string& dir) {
    fs::path p(dir);
    return p.is_absolute() ? p.string() : (fs::path(command.Directory) / p).lexically_normal().string();
  };
  auto addInclude = [&](const std::string& option, const std::string& dir) {
    std::string path = absolute(dir);
    if (isCudaToolkitInclude(path)) return;  // clang 14 cannot parse them; the stubs stand in
    flags.push_back(option);
    flags.push_back(path);
  };
  const std::vector<std::string>& args = command.CommandLine;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto next = [&]() -> std::string { return i + 1 < args.size() ? args[++i] : std::string(); };
    auto valueAfter = [&](std::string_view prefix) { return a.substr(prefix.size()); };
    if (a == "-I" || a == "--include-path") {
      addInclude("-I", next());
    } else if (a == "-isystem" || a == "--system-include") {
      addInclude("-isystem", next());
    } else if (a == "-iquote") {
      addInclude("-iquote", next());
    } else if (a.rfind("--include-path=", 0) == 0) {
      addInclude("-I", valueAfter("--include-path="));
    } else if (a.rfind("-isystem=", 0) == 0) {
      addInclude("-isystem", valueAfter("-isystem="));
    } else if (a.rfind("-isystem", 0) == 0) {
      addInclude("-isystem", valueAfter("-isystem"));
    } else if (a.rfind("-iquote", 0) == 0) {
      addInclude("-iquote", valueAfter("-iquote"));
    } else if (a.rfind("-I", 0) == 0) {
      addInclude("-I", valueAfter("-I"));
    } else if (a == "-D" || a == "--define-macro") {
      flags.push_back("-D" + next());
    } else if (a.rfind("--define-macro=", 0) == 0) {
      flags.push_back("-D" + valueAfter("--define-macro="));
    } else if (a.rfind("-D", 0) == 0 || a.rfind("-U", 0) == 0) {
      flags.push_back(a);
    } else if (a == "-U") {
      flags.push_back("-U" + next());
    } else if (a == "-include" || a == "--pre-include") {
      flags.push_back("-include");
      flags.push_back(absolute(next()));
    } else if (a.rfind("-std=", 0) == 0 || a.rfind("--std=", 0) == 0 || a == "--std" ||
               a == "-std") {
      std::string value = a.find('=') != std::string::npos ? a.substr(a.find('=') + 1) : next();
      if (value.rfind("c++", 0) == 0 || value.rfind("gnu++", 0) == 0) {
        flags.push_back("-std=" + value);
      } else {
        warn("ignoring -std=" + value + " from the compile command of " + command.Filename);
      }
    }
  }
  return flags;
}

// One clang command per file: our fixed CUDA host-only set, then the caller's and
// the project's flags.
class ScanCompilationDatabase : public clang::tooling::CompilationDatabase {
 public:
  ScanCompilationDatabase(const ScanOptions& options,
                          const clang::tooling::CompilationDatabase* project,
                          const fs::path& stubRoot, const WarnFn& warn)
      : options_(options),
        project_(project),
        preludePath_((stubRoot / "prelude.cuh").string()),
        stubDir_((stubRoot / "include").string()),
        warn_(warn) {}

  std::vector<clang::tooling::CompileCommand> getCompileCommands(
      llvm::StringRef file) const override {
    std::vector<std::string> args = {
        PHOS_CLANG_DRIVER, "-x", "cuda", "--cuda-host-only", "-nocudainc", "-nocudalib",
        "-Wno-unknown-cuda-version", "-std=c++17", "-fsyntax-only", "-w", "-ferror-limit=0",
        "-resource-dir=" PHOS_CLANG_RESOURCE_DIR, "-include", preludePath_};
    for (const std::string& dir : options_.includeDirs) {
      args.push_back("-I" + fs::absolute(dir).string());
    }
    for (const std::string& define : options_.defines) args.push_back("-D" + define);
    if (project_ != nullptr) {
      std::vector<clang::tooling::CompileCommand> commands = project_->getCompileCommands(file);
      if (commands.empty()) {
        warn_(file.str() + " is not in compile_commands.json: scanning it with -I/-D only");
      } else {
        for (std::string& flag : projectFlags(commands.front(), warn_)) {
          args.push_back(std::move(flag));
        }
      }
    }
    args.push_back("-isystem");
    args.push_back(stubDir_);
    args.insert(args.end(), options_.extraArgs.begin(), options_.extraArgs.end());
    args.push_back(file.str());
    std::string dir = fs::path(file.str()).parent_path().string();
    return {clang::tooling::CompileCommand(dir, file, std::move(args), "")};
  }

 private:
  const ScanOptions& options_;
  const clang::tooling::CompilationDatabase* project_;
  std::string preludePath_;
  std::string stubDir_;
  const WarnFn& warn_;
};

// The prelude and the stub headers on disk for the length of one scan. Clang's
// in-memory file system serves -include'd files but not -isystem directories.
class StubTree {
 public:
  ~StubTree() {
    if (!root_.empty()) {
      std::error_code ec;
      fs::remove_all(root_, ec);
    }
  }
  Status create() {
    std::error_code ec;
    std::string pattern = (fs::temp_directory_path(ec) / "phos-scan-XXXXXX").string();
    if (ec) pattern = "/tmp/phos-scan-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      return errnoError(errno, "cannot create a temporary directory " + pattern);
    }
    root_ = pattern;
    RETURN_IF_ERROR(write(root_ / "prelude.cuh", kPrelude));
    for (const StubHeader& stub : kStubHeaders) {
      RETURN_IF_ERROR(
          write(root_ / "include" / stub.name, "#pragma once\n" + std::string(stub.text)));
    }
    return Status::ok();
  }
  const fs::path& root() const { return root_; }

 private:
  static Status write(const fs::path& path, std::string_view text) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    std::ofstream out(path, std::ios::binary);
    out << text;
    if (!out) return errnoError(errno, "cannot write " + path.string());
    return Status::ok();
  }

  fs::path root_;
};

}  // namespace

Result<std::vector<DeclaredKernel>> scanSources(const std::vector<std::string>& files,
                                                const ScanOptions& options) {
  WarnFn warn = options.onWarning ? options.onWarning : [](std::string_view message) {
    std::fprintf(stderr, "phos-instrument scan: warning: %.*s\n", static_cast<int>(message.size()),
                 message.data());
  };
  if (files.empty()) return Status(Code::kInvalidArgument, "no source files given");
  std::vector<std::string> paths;
  for (const std::string& file : files) {
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      return makeError(Code::kNotFound, "no such source file: {}", file);
    }
    paths.push_back(fs::absolute(file).lexically_normal().string());
  }
  for (const std::string& dir : options.includeDirs) {
    if (isCudaToolkitInclude(dir)) {
      warn("-I " + dir + " is the CUDA toolkit's include directory, which clang 14 cannot " +
           "parse; the built-in stand-ins for its headers are used after it");
    }
  }

  std::unique_ptr<clang::tooling::CompilationDatabase> project;
  if (!options.compileCommandsDir.empty()) {
    std::string error;
    project = clang::tooling::CompilationDatabase::loadFromDirectory(options.compileCommandsDir,
                                                                     error);
    if (project == nullptr) {
      return makeError(Code::kInvalidArgument, "cannot load compile_commands.json from {}: {}",
                       options.compileCommandsDir, error);
    }
  }
  StubTree stubs;
  RETURN_IF_ERROR(stubs.create());
  ScanCompilationDatabase database(options, project.get(), stubs.root(), warn);

  clang::tooling::ClangTool tool(database, paths);
  tool.setPrintErrorMessage(false);

  llvm::IntrusiveRefCntPtr<clang::DiagnosticOptions> diagOptions(new clang::DiagnosticOptions());
  std::unique_ptr<clang::TextDiagnosticPrinter> printer;
  if (options.verbose) {
    printer = std::make_unique<clang::TextDiagnosticPrinter>(llvm::errs(), diagOptions.get());
  }
  DiagnosticTally tally(printer.get());
  tool.setDiagnosticConsumer(&tally);

  std::map<std::string, FileScan> results;
  KernelScanFactory factory(results, tally, warn);
  // The return value says whether any file had errors; which files could be parsed
  // at all is in `results`, and body errors are not a failure here.
  (void)tool.run(&factory);

  std::vector<DeclaredKernel> kernels;
  std::map<std::string, size_t> byName;
  for (size_t i = 0; i < paths.size(); ++i) {
    auto it = results.find(paths[i]);
    if (it == results.end() || !it->second.parsed) {
      return makeError(Code::kFailedPrecondition,
                       "clang could not parse {} (run with -v to see its messages)", files[i]);
    }
    const FileScan& scan = it->second;
    if (scan.errors > 0) {
      warn(files[i] + ": " + std::to_string(scan.errors) + " error(s) while parsing, first: " +
           scan.firstError + "; signatures were still taken from the declarations" +
           (options.verbose ? "" : " (-v prints every diagnostic)"));
    }
    if (scan.kernels.empty()) warn(files[i] + ": no __global__ functions");
    for (const DeclaredKernel& kernel : scan.kernels) {
      auto [known, inserted] = byName.emplace(kernel.name, kernels.size());
      if (inserted) {
        kernels.push_back(kernel);
      } else if (!(kernels[known->second] == kernel)) {
        warn("kernel '" + kernel.name + "' is declared differently in " + files[i] +
             " than in an earlier file; keeping the first");
      }
    }
  }
  return kernels;
}

}  // namespace phos::instrument::scan
