// SPDX-License-Identifier: Apache-2.0
// How to launch each kernel of the PTX corpus, the MLP example and the deliberate
// mis-speculation cases: geometry, buffers with valid deterministic contents, and
// the argument words, so the speculation accuracy harness can run them on vgpu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace phos::bench::speculation {

// What a buffer holds when the launch starts. Every kind fills the buffer
// from a counter-based generator seeded by the kernel name and buffer index,
// so every run (original, twin, repetition) starts from the same bytes.
enum class Fill : uint8_t {
  kZero,
  kF32,   // floats uniform in [lo, hi]
  kF64,   // doubles uniform in [lo, hi]
  kF16,   // IEEE half, uniform in [lo, hi]
  kBF16,  // bfloat16, uniform in [lo, hi]
  kI32,   // int32 uniform in [lo, hi] (indices in range)
  kU32,   // uint32 uniform in [lo, hi]
  kU64,   // uint64, any value
  kU8,    // bytes uniform in [lo, hi]
  kText,  // `text` followed by NUL bytes
};

// "At byte `offset`, the address of buffer `buffer` plus `delta`": how pointers
// get into argument words, into buffers (pointer tables) and into module globals.
struct PointerSlot {
  uint32_t offset = 0;
  uint32_t buffer = 0;
  int64_t delta = 0;
  // The pointer is stored as two 32-bit halves, the low one at `offset` and the
  // high one at `offset + highOffset` (a pointer split across struct members).
  uint32_t highOffset = 0;
};

struct BufferSpec {
  size_t count = 0;  // elements of the fill's type
  Fill fill = Fill::kZero;
  double lo = -1.0, hi = 1.0;
  std::string text;
  std::vector<PointerSlot> pointers;  // patched in after the fill
  // The kernel writes values here that legitimately differ from run to run
  // (clock64): the bit-for-bit comparison of twin and original skips it.
  bool nondeterministic = false;
  // Where the allocation starts: the next multiple of this after the previous
  // buffer. Below 256 it can start right at the previous buffer's end.
  uint32_t alignment = 256;
};

// One kernel parameter: its bytes (PTX parameter size; shorter is zero-padded)
// with pointer slots patched in.
struct ArgSpec {
  std::vector<std::byte> bytes;
  std::vector<PointerSlot> pointers;
};

// A module variable (__device__/__constant__) the host sets before the launch.
struct GlobalInit {
  std::string name;  // as in the PTX
  std::vector<std::byte> bytes;
  std::vector<PointerSlot> pointers;
};

struct Dim {
  uint32_t x = 1, y = 1, z = 1;
};

struct LaunchSpec {
  // The kernel's name without mangling and without its parameter list:
  // "saxpy", "matmul_tiled<float, 16>", "adam_step<double>".
  std::string kernel;
  Dim grid, block;
  uint32_t dynamicShared = 0;
  // Allocated in this order, back to back (each at the next multiple of its
  // alignment), so a write past the end of buffer k lands in buffer k + 1 when
  // buffer k's size is a multiple of the next one's alignment.
  std::vector<BufferSpec> buffers;
  std::vector<ArgSpec> args;
  std::vector<GlobalInit> globals;
  // A deliberate mis-speculation: the speculated sets must miss an access, and
  // both twins must report it (a missed write), or the restore twin (a missed read).
  bool deliberate = false;
  bool deliberateReadOnly = false;  // only a read is missed: restore twins report it
  std::string why;                  // for the table: what the case exercises
};

// Every launch the harness knows, in source order; a kernel may have several.
const std::vector<LaunchSpec>& launchTable();

// The launches of a kernel, by its unmangled name (see LaunchSpec::kernel).
std::vector<const LaunchSpec*> launchesFor(std::string_view kernel);

// Kernels of the corpus deliberately left out, with the reason (printed by the
// harness so a reader knows what the table does not cover).
struct SkippedKernel {
  std::string kernel;
  std::string reason;
};
const std::vector<SkippedKernel>& skippedKernels();

// The unmangled name a PTX entry is looked up by: the demangled C++ name without
// its return type and parameter list, or the name itself for extern "C" kernels.
std::string tableKey(std::string_view ptxName);

}  // namespace phos::bench::speculation
