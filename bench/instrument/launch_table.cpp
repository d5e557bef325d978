// SPDX-License-Identifier: Apache-2.0
// The launch table: how the accuracy harness launches every kernel of
// tests/corpus/*.cu, examples/mlp/mlp_kernels.cu and tests/corpus/misspeculation.cu.
#include "launch_table.h"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace phos::bench::speculation {
namespace {

template <typename T>
ArgSpec value(T v) {
  ArgSpec a;
  a.bytes.resize(sizeof(T));
  std::memcpy(a.bytes.data(), &v, sizeof(T));
  return a;
}
ArgSpec i32(int32_t v) {
  return value(v);
}
ArgSpec u32(uint32_t v) {
  return value(v);
}
ArgSpec i64(int64_t v) {
  return value(v);
}
ArgSpec u64(uint64_t v) {
  return value(v);
}
ArgSpec f32(float v) {
  return value(v);
}
ArgSpec f64(double v) {
  return value(v);
}
ArgSpec u8(uint8_t v) {
  return value(v);
}
ArgSpec u16(uint16_t v) {
  return value(v);
}  // half / bfloat16 bit patterns

ArgSpec ptr(uint32_t buffer, int64_t delta = 0) {
  ArgSpec a;
  a.bytes.resize(8);
  a.pointers.push_back({0, buffer, delta, 0});
  return a;
}

// A struct argument: `size` bytes, fields put at offsets.
class StructArg {
 public:
  explicit StructArg(size_t size) { arg_.bytes.resize(size); }
  template <typename T>
  StructArg& put(uint32_t offset, T v) {
    std::memcpy(arg_.bytes.data() + offset, &v, sizeof(T));
    return *this;
  }
  StructArg& pointer(uint32_t offset, uint32_t buffer, uint32_t highOffset = 0) {
    arg_.pointers.push_back({offset, buffer, 0, highOffset});
    return *this;
  }
  operator ArgSpec() const { return arg_; }  // NOLINT: reads as a table

 private:
  ArgSpec arg_;
};

BufferSpec buf(Fill fill, size_t count, double lo = -1.0, double hi = 1.0) {
  BufferSpec b;
  b.fill = fill;
  b.count = count;
  b.lo = lo;
  b.hi = hi;
  return b;
}
BufferSpec f32s(size_t n, double lo = -1.0, double hi = 1.0) {
  return buf(Fill::kF32, n, lo, hi);
}
BufferSpec f64s(size_t n, double lo = -1.0, double hi = 1.0) {
  return buf(Fill::kF64, n, lo, hi);
}
BufferSpec f16s(size_t n) {
  return buf(Fill::kF16, n);
}
BufferSpec bf16s(size_t n) {
  return buf(Fill::kBF16, n);
}
BufferSpec i32s(size_t n, double lo, double hi) {
  return buf(Fill::kI32, n, lo, hi);
}
BufferSpec u32s(size_t n, double lo, double hi) {
  return buf(Fill::kU32, n, lo, hi);
}
BufferSpec u64s(size_t n) {
  return buf(Fill::kU64, n);
}
BufferSpec u8s(size_t n, double lo = 0, double hi = 255) {
  return buf(Fill::kU8, n, lo, hi);
}
BufferSpec zeros(size_t bytes) {
  return buf(Fill::kZero, bytes);
}
BufferSpec text(std::string s) {
  BufferSpec b = buf(Fill::kText, s.size() + 1);
  b.text = std::move(s);
  return b;
}
// A buffer of `count` pointers, each to `target` + index * stride bytes.
BufferSpec pointerTable(size_t count, uint32_t target, int64_t stride = 0) {
  BufferSpec b = zeros(count * 8);
  for (size_t k = 0; k < count; ++k) {
    b.pointers.push_back(
        {static_cast<uint32_t>(k * 8), target, static_cast<int64_t>(k) * stride, 0});
  }
  return b;
}
BufferSpec aligned(BufferSpec b, uint32_t alignment) {
  b.alignment = alignment;
  return b;
}
BufferSpec nondeterministic(BufferSpec b) {
  b.nondeterministic = true;
  return b;
}

GlobalInit globalPointer(std::string name, uint32_t buffer) {
  GlobalInit g;
  g.name = std::move(name);
  g.bytes.resize(8);
  g.pointers.push_back({0, buffer, 0, 0});
  return g;
}
GlobalInit globalFloats(std::string name, std::vector<float> values) {
  GlobalInit g;
  g.name = std::move(name);
  g.bytes.resize(values.size() * sizeof(float));
  std::memcpy(g.bytes.data(), values.data(), g.bytes.size());
  return g;
}

// A numba array argument: meminfo, parent, nitems, itemsize, data, shape[ndim],
// strides[ndim], one parameter each (numba's data model for Array, C order).
void numbaArray(std::vector<ArgSpec>& args, uint32_t buffer, std::vector<int64_t> shape,
                int64_t itemsize) {
  int64_t items = 1;
  for (int64_t d : shape) items *= d;
  args.push_back(u64(0));
  args.push_back(u64(0));
  args.push_back(i64(items));
  args.push_back(i64(itemsize));
  args.push_back(ptr(buffer));
  for (int64_t d : shape) args.push_back(i64(d));
  int64_t stride = itemsize;
  std::vector<int64_t> strides(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    strides[k] = stride;
    stride *= shape[k];
  }
  for (int64_t st : strides) args.push_back(i64(st));
}

LaunchSpec launch(std::string kernel, Dim grid, Dim block, std::vector<BufferSpec> buffers,
                  std::vector<ArgSpec> args, uint32_t dynamicShared = 0) {
  LaunchSpec l;
  l.kernel = std::move(kernel);
  l.grid = grid;
  l.block = block;
  l.dynamicShared = dynamicShared;
  l.buffers = std::move(buffers);
  l.args = std::move(args);
  return l;
}
LaunchSpec deliberate(LaunchSpec l, std::string why, bool readOnly = false) {
  l.deliberate = true;
  l.deliberateReadOnly = readOnly;
  l.why = std::move(why);
  return l;
}
LaunchSpec withGlobals(LaunchSpec l, std::vector<GlobalInit> globals) {
  l.globals = std::move(globals);
  return l;
}

std::vector<LaunchSpec> buildTable() {
  std::vector<LaunchSpec> t;
  const float lr = 1e-3f;
  // ---- tests/corpus/saxpy.cu
  t.push_back(launch("saxpy", {4}, {256}, {f32s(1000), f32s(1000)},
                     {i32(1000), f32(1.75f), ptr(0), ptr(1)}));
  t.push_back(launch("saxpy_grid_stride", {2}, {128}, {f32s(3000), f32s(3000)},
                     {u64(3000), f32(-0.5f), ptr(0), ptr(1)}));
  t.push_back(launch("daxpy_unrolled", {1}, {256}, {f64s(1000), f64s(1000)},
                     {i32(1000), f64(0.3), ptr(0), ptr(1)}));
  t.push_back(launch("vector_add_float4", {2}, {128}, {f32s(1024), f32s(1024), f32s(1024)},
                     {ptr(0), ptr(1), ptr(2), i32(256)}));
  t.push_back(launch("fill_u8", {4}, {256}, {u8s(1000)}, {ptr(0), u8(7), u32(1000)}));
  // ---- tests/corpus/matmul.cu (M x K by K x N)
  t.push_back(launch("matmul_tiled<float, 16>", {3, 3}, {16, 16},
                     {f32s(40 * 24), f32s(24 * 36), f32s(40 * 36)},
                     {ptr(0), ptr(1), ptr(2), i32(40), i32(36), i32(24)}));
  t.push_back(launch("matmul_tiled<double, 8>", {2, 3}, {8, 8},
                     {f64s(20 * 10), f64s(10 * 12), f64s(20 * 12)},
                     {ptr(0), ptr(1), ptr(2), i32(20), i32(12), i32(10)}));
  t.push_back(launch("matmul_tiled<int, 16>", {2, 2}, {16, 16},
                     {i32s(400, -10, 10), i32s(400, -10, 10), i32s(400, 0, 0)},
                     {ptr(0), ptr(1), ptr(2), i32(20), i32(20), i32(20)}));
  t.push_back(launch("transpose", {2, 2}, {32, 8}, {f32s(40 * 36), f32s(40 * 36)},
                     {ptr(0), ptr(1), i32(40), i32(36)}));
  // ---- tests/corpus/reduce.cu
  t.push_back(launch("block_sum", {4}, {256}, {f32s(1000), f32s(1)}, {ptr(0), ptr(1), i32(1000)}));
  t.push_back(launch("vote_stats", {2}, {256}, {i32s(512, -5, 5), u32s(16, 0, 0), i32s(16, 0, 0)},
                     {ptr(0), ptr(1), ptr(2), i32(500)}));
  t.push_back(launch("cg_reduce", {4}, {256}, {i32s(1000, -100, 100), i32s(2, 0, 0)},
                     {ptr(0), ptr(1), i32(1000)}));
  // ---- tests/corpus/normalize.cu: 8 rows of 100 columns, one block per row
  t.push_back(launch("softmax_rows", {8}, {64}, {f32s(800), f32s(800)}, {ptr(0), ptr(1), i32(100)},
                     64 * 4));
  t.push_back(launch("layernorm", {8}, {64}, {f32s(800), f32s(100), f32s(100), f32s(800)},
                     {ptr(0), ptr(1), ptr(2), ptr(3), i32(100), f32(1e-5f)}, 2 * 64 * 4));
  t.push_back(
      launch("gelu_tanh", {4}, {256}, {f32s(1000), f32s(1000)}, {ptr(0), ptr(1), i32(1000)}));
  // ---- tests/corpus/adam.cu (second moments are non-negative)
  t.push_back(launch("adam_step<float>", {4}, {256},
                     {f32s(1000), f32s(1000), f32s(1000), f32s(1000, 0.0, 1.0)},
                     {ptr(0), ptr(1), ptr(2), ptr(3), f32(lr), f32(0.9f), f32(0.999f), f32(1e-8f),
                      f32(0.01f), i32(3), i64(1000)}));
  t.push_back(launch("adam_step<double>", {4}, {256},
                     {f64s(1000), f64s(1000), f64s(1000), f64s(1000, 0.0, 1.0)},
                     {ptr(0), ptr(1), ptr(2), ptr(3), f64(lr), f64(0.9), f64(0.999), f64(1e-8),
                      f64(0.01), i32(3), i64(1000)}));
  t.push_back(launch("sgd_momentum", {2}, {128}, {f32s(1000), f32s(1000), f32s(1000)},
                     {ptr(0), ptr(1), ptr(2), f32(0.01f), f32(0.9f), i32(1000)}));
  // ---- tests/corpus/atomics.cu
  t.push_back(
      launch("histogram", {2}, {128}, {u8s(2000), u32s(256, 0, 0)}, {ptr(0), ptr(1), i32(2000)}));
  t.push_back(launch("atomic_mix", {2}, {256}, {i32s(12, 0, 50), u64s(1), f32s(1), f64s(2)},
                     {ptr(0), ptr(1), ptr(2), ptr(3), i32(300)}));
  // Two blocks: the spin loop only runs for a single-block grid.
  t.push_back(launch("publish", {2}, {32}, {f32s(2)}, {ptr(0), f32(4.5f)}));
  // ---- tests/corpus/half_bf16.cu (0x3A00: half 0.75)
  t.push_back(launch("half_axpy", {4}, {256}, {f16s(1000), f16s(1000)},
                     {i32(1000), u16(0x3A00), ptr(0), ptr(1)}));
  t.push_back(launch("half2_ops", {2}, {256}, {f16s(1000), f16s(1000), f32s(500)},
                     {i32(500), ptr(0), ptr(1), ptr(2)}));
  t.push_back(launch("bf16_ops", {2}, {256}, {bf16s(500), bf16s(500), bf16s(1000), bf16s(1000)},
                     {i32(500), ptr(0), ptr(1), ptr(2), ptr(3), f32(0.75f)}));
  // ---- tests/corpus/misc.cu
  {
    // Buffers {const float* in; float* out; int64_t count; double scale;} and
    // Small {char tag; short s; int i;} as the PTX lays them out.
    LaunchSpec l =
        launch("struct_args", {2}, {256}, {f32s(500), f32s(500), text("corpus")},
               {StructArg(32).pointer(0, 0).pointer(8, 1).put<int64_t>(16, 500).put(24, 0.5),
                StructArg(8).put<char>(0, 'x').put<int16_t>(2, 3).put<int32_t>(4, 7), ptr(2)});
    l = withGlobals(std::move(l),
                    {globalFloats("c_coeffs", {1.0f, 0.5f, 0.25f, -0.125f, 0.1f, 0.2f, 0.3f, 0.4f,
                                               -0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 1.0f, 1.1f, 1.2f})});
    t.push_back(std::move(l));
  }
  t.push_back(launch("bit_ops", {2}, {256},
                     {u32s(500, 0, 4294967295.0), u64s(500), u64s(500), f64s(500)},
                     {ptr(0), ptr(1), ptr(2), ptr(3), i32(500)}));
  t.push_back(launch("clock_and_ids", {1}, {64},
                     {nondeterministic(buf(Fill::kZero, 64 * 8)), u32s(64, 0, 0)},
                     {ptr(0), ptr(1)}));
  t.push_back(launch("inline_asm_add", {1}, {64}, {i32s(64, -1000, 1000), i32s(64, 0, 0)},
                     {ptr(0), ptr(1)}));
  // ---- tests/corpus/warp_tensor.cu (the sm_80 builds; cluster_sum is sm_90 only)
  t.push_back(
      launch("wmma_16x16", {1}, {32}, {f16s(256), f16s(256), f32s(256)}, {ptr(0), ptr(1), ptr(2)}));
  t.push_back(
      launch("async_copy", {2}, {128}, {f32s(2048), f32s(2048)}, {ptr(0), ptr(1), i32(512)}));
  t.push_back(launch("warp_reduce_match", {2}, {256}, {u32s(500, 0, 1000), u32s(500, 0, 0)},
                     {ptr(0), ptr(1), i32(500)}));
  t.push_back(launch("fp8_convert", {2}, {256}, {f32s(500), u8s(500, 0, 0), f16s(1000)},
                     {ptr(0), ptr(1), ptr(2), i32(500)}));
  // ---- tests/corpus/clang_kernels.cu
  t.push_back(launch("clang_scale", {2}, {64}, {f32s(128), f32s(128)}, {ptr(0), ptr(1), i32(120)}));
  t.push_back(launch("clang_atomics", {2}, {64}, {i32s(3, 0, 0), u64s(1), f64s(1)},
                     {ptr(0), ptr(1), ptr(2)}));
  t.push_back(launch("clang_clamp", {1}, {256}, {f64s(200, -2.0, 2.0)}, {ptr(0), i64(200)}));
  // ---- tests/corpus/numba_kernels.py (arrays are 7 or 9 parameters each)
  {
    std::vector<ArgSpec> a;
    numbaArray(a, 0, {1000}, 4);
    a.push_back(f32(1.25f));
    numbaArray(a, 1, {1000}, 4);
    numbaArray(a, 2, {1000}, 4);
    t.push_back(launch("numba axpy", {4}, {256}, {f32s(1000), f32s(1000), f32s(1000)}, a));
  }
  {
    std::vector<ArgSpec> a;
    numbaArray(a, 0, {1000}, 4);
    numbaArray(a, 1, {1}, 4);
    t.push_back(launch("numba block_sum", {8}, {128}, {f32s(1000), f32s(1)}, a));
  }
  {
    std::vector<ArgSpec> a;
    numbaArray(a, 0, {20, 30}, 8);
    numbaArray(a, 1, {20, 30}, 8);
    a.push_back(f64(0.75));
    t.push_back(launch("numba math_2d", {2, 2}, {16, 16}, {f64s(600), f64s(600)}, a));
  }
  {
    std::vector<ArgSpec> a;
    numbaArray(a, 0, {1000}, 8);
    numbaArray(a, 1, {16}, 4);
    a.push_back(i32(1000));
    t.push_back(launch("numba histogram", {2}, {128}, {u64s(1000), i32s(16, 0, 0)}, a));
  }
  // ---- examples/mlp/mlp_kernels.cu: 16 rows, 20 features/hidden units, 10 classes
  t.push_back(launch("linear_forward", {2, 1}, {16, 16},
                     {f32s(16 * 20), f32s(20 * 24), f32s(24), f32s(16 * 24)},
                     {ptr(0), ptr(1), ptr(2), ptr(3), i32(16), i32(20), i32(24), i32(1)}));
  t.push_back(launch("softmax_xent", {1}, {32},
                     {f32s(16 * 10), i32s(16, 0, 9), f32s(16 * 10), f32s(16)},
                     {ptr(0), ptr(1), ptr(2), ptr(3), i32(16), i32(10)}));
  t.push_back(launch("mean_256", {1}, {256}, {f32s(1000), f32s(1)}, {ptr(0), ptr(1), i32(1000)}));
  t.push_back(launch("weight_grad", {1, 2}, {16, 16}, {f32s(16 * 20), f32s(16 * 10), f32s(20 * 10)},
                     {ptr(0), ptr(1), ptr(2), i32(16), i32(20), i32(10)}));
  t.push_back(launch("bias_grad", {1}, {32}, {f32s(16 * 10), f32s(10)},
                     {ptr(0), ptr(1), i32(16), i32(10)}));
  t.push_back(launch("hidden_grad", {2, 1}, {16, 16},
                     {f32s(16 * 10), f32s(20 * 10), f32s(16 * 20), f32s(16 * 20)},
                     {ptr(0), ptr(1), ptr(2), ptr(3), i32(16), i32(20), i32(10)}));
  t.push_back(launch("sgd_step", {4}, {256}, {f32s(1000), f32s(1000)},
                     {ptr(0), ptr(1), f32(0.01f), i32(1000)}));
  t.push_back(launch("state_update", {1}, {256}, {u32s(1024, 0, 4294967295.0), f32s(1), f32s(100)},
                     {ptr(0), ptr(1), ptr(2), i32(100), i32(1024), u32(5)}));
  // ---- tests/corpus/misspeculation.cu: every launch must be reported by the twin.
  // 256 floats = 1 KiB: buffers are multiples of 256 bytes, so they sit back to back.
  t.push_back(deliberate(launch("write_through_device_pointer", {1}, {256},
                                {pointerTable(1, 1), f32s(256)}, {ptr(0), i32(256)}),
                         "store through a pointer loaded from a device buffer"));
  t.push_back(deliberate(withGlobals(launch("write_through_global_pointer", {1}, {256},
                                            {f32s(256), f32s(256)}, {ptr(0), i32(256)}),
                                     {globalPointer("g_output", 1)}),
                         "store through a pointer held in a __device__ global (Rodinia)"));
  t.push_back(deliberate(withGlobals(launch("write_through_global_pointer_call", {1}, {256},
                                            {f32s(256), f32s(256)}, {ptr(0), i32(256)}),
                                     {globalPointer("g_output", 1)}),
                         "the same store inside a __noinline__ device function"));
  t.push_back(deliberate(
      launch("write_past_end", {2}, {256}, {f32s(256), f32s(256)}, {ptr(0), i32(256), i32(8)}),
      "8 stores past the end of the argument's buffer into the next allocation"));
  t.push_back(deliberate(launch("read_past_end", {1}, {256}, {f32s(256), f32s(256), f32s(256)},
                                {ptr(0), ptr(2), i32(256)}),
                         "a load one element past the end of the argument's buffer", true));
  t.push_back(
      deliberate(launch("atomic_through_pointer_table", {2}, {256},
                        {pointerTable(4, 1, 4), i32s(64, 0, 0)}, {ptr(0), i32(4), i32(500)}),
                 "atomicAdd at addresses loaded from a device buffer"));
  t.push_back(
      deliberate(launch("write_through_split_pointer", {1}, {256}, {f32s(256)},
                        {StructArg(16).put<int32_t>(0, 256).pointer(4, 0, 4).put(12, 0.25f)}),
                 "a pointer split into 32-bit halves at offset 4 of a struct argument"));
  t.push_back(deliberate(
      launch("write_past_end_offset", {1}, {256}, {f32s(256), f32s(256)}, {ptr(0), i32(256)}),
      "the overflow is in the store's immediate offset ([%rd+32])"));
  // `out` is 1000 bytes and the next buffer starts right after it (8-byte aligned).
  t.push_back(deliberate(launch("store_straddles_end", {1}, {64},
                                {f32s(250), aligned(f32s(256), 8)}, {ptr(0), i32(63)}),
                         "a 16-byte store that starts inside the buffer and ends 8 bytes past it"));
  t.push_back(deliberate(launch("global_array_overflow", {1}, {32}, {}, {i32(8)}),
                         "indexing past a __device__ array into the next module variable"));
  t.push_back(deliberate(launch("read_past_end_ldg", {1}, {256}, {f32s(256), f32s(256), f32s(256)},
                                {ptr(0), ptr(2), i32(256)}),
                         "a load past the end through ld.global.nc (__ldg)", true));
  // Not a mis-speculation: the threads past n form addresses in the next buffer
  // but their predicate is false, so nothing may be reported.
  t.push_back(launch("predicated_store", {2}, {256}, {f32s(256), f32s(256)}, {ptr(0), i32(256)}));
  t.push_back(
      deliberate(launch("predicated_store", {2}, {256}, {f32s(256), f32s(256)}, {ptr(0), i32(264)}),
                 "a predicated store (@p st.global) whose predicate holds past the end"));
  t.push_back(deliberate(launch("write_past_end_into_input", {2}, {256}, {f32s(256), f32s(256)},
                                {ptr(0), ptr(1), i32(256), i32(8)}),
                         "stores past the end of `out` into `in`, which is speculated read-only"));
  t.push_back(deliberate(
      launch("write_through_const_cast", {1}, {256}, {f32s(256)}, {ptr(0), i32(256)}),
      "a store through a const-declared pointer (const_cast after a trip through shared)"));
  t.push_back(deliberate(launch("write_through_function_pointer", {1}, {256},
                                {pointerTable(1, 1), f32s(256)}, {ptr(0), i32(256)}),
                         "a store in a device function called through a function pointer"));
  t.push_back(
      launch("generic_spaces", {2}, {256}, {f32s(500), f32s(500)}, {ptr(0), ptr(1), i32(500)}));
  return t;
}

}  // namespace

const std::vector<LaunchSpec>& launchTable() {
  static const std::vector<LaunchSpec> table = buildTable();
  return table;
}

std::vector<const LaunchSpec*> launchesFor(std::string_view kernel) {
  std::vector<const LaunchSpec*> out;
  for (const LaunchSpec& l : launchTable()) {
    if (l.kernel == kernel) out.push_back(&l);
  }
  return out;
}

const std::vector<SkippedKernel>& skippedKernels() {
  static const std::vector<SkippedKernel> skipped = {
      {"cluster_sum",
       "sm_90 thread-block clusters (__cluster_dims__, distributed shared "
       "memory): only in the sm_90+ builds, which vgpu does not run"},
  };
  return skipped;
}

std::string tableKey(std::string_view ptxName) {
  std::string name(ptxName);
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), &std::free);
  if (status != 0 || !d) return name;
  std::string s(d.get());
  // numba: "__main__::axpy[abi:v1][abi:...](Array<float, 1, A, mutable, aligned>, ...)".
  if (s.rfind("__main__::", 0) == 0) {
    std::string ident = s.substr(10);
    return "numba " + ident.substr(0, ident.find_first_of("[("));
  }
  // Drop the parameter list: the last top-level "(...)".
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  // Template instances carry their return type: "void matmul_tiled<float, 16>".
  int angle = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++angle;
    if (s[i] == '>') --angle;
    if (s[i] == ' ' && angle == 0) {
      s = s.substr(i + 1);
      break;
    }
  }
  return s;
}

}  // namespace phos::bench::speculation
