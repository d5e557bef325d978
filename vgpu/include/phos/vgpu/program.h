// SPDX-License-Identifier: Apache-2.0
// The seam between vgpu's driver and a PTX execution engine: loading PTX and launching kernels.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "phos/common/status.h"

// How the driver and an engine cooperate:
//
//   1. The engine registers a ProgramLoader with the driver (see export_table.h).
//   2. cuModuleLoadData & co. extract the PTX text (from a fatbin, a file or the
//      caller's buffer) and call ProgramLoader::load(ptx, memory). The loader parses
//      the PTX, allocates every __device__/__constant__ global through `memory`
//      (device memory of the loading context, freed when the module is unloaded),
//      writes the globals' initializers through it, and returns a Program.
//   3. cuModuleGetFunction/cuFuncGetParamInfo/cuModuleGetGlobal read
//      Program::functions() and Program::globals(); nothing else is asked of the
//      engine until a launch.
//   4. cuLaunchKernel validates the launch, packs the parameter buffer with the
//      layout of FunctionInfo::params, and, when the launch reaches the head of its
//      stream (on a driver worker thread), calls Program::launch(). Launches of one
//      Program may run concurrently from different streams.
//
// With no loader registered, module loading fails with CUDA_ERROR_NOT_SUPPORTED.
namespace phos::vgpu {

// One kernel parameter as PTX declares it: where it lives in the parameter buffer
// (cuFuncGetParamInfo reports exactly these numbers).
struct ParamInfo {
  std::size_t offset = 0;
  std::size_t size = 0;
};

// One .entry of the module.
struct FunctionInfo {
  std::string name;                 // as in PTX (mangled for C++ kernels)
  std::vector<ParamInfo> params;    // in declaration order
  std::size_t paramBufferSize = 0;  // offset + size of the last parameter, rounded as PTX lays it out
  std::size_t staticSharedBytes = 0;
  std::size_t localBytesPerThread = 0;
  int registersPerThread = 32;      // reported by cuFuncGetAttribute(NUM_REGS)
  int maxThreadsPerBlock = 1024;    // .maxntid product when present
  // .reqnctapercluster: the cluster shape every launch of the kernel has (its
  // CTAs run together and share memory); all 0 when the kernel sets none.
  std::array<std::uint32_t, 3> requiredCluster{0, 0, 0};
};

// One module-scope variable in the global or constant state space, allocated by
// the loader in device memory. Variables that are not .visible are listed too:
// cuModuleGetGlobal must find them.
struct GlobalInfo {
  std::string name;
  std::uint64_t address = 0;
  std::size_t size = 0;
  bool managed = false;  // a __managed__ variable (cuLibraryGetManaged)
};

// Device memory of the context a module is loaded into, for the loader.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Allocates the module variable `name`: `bytes` (> 0) aligned to `alignment`
  // (a power of two <= 4096); `managed`: in managed memory (a __managed__
  // variable). The allocation belongs to the module and is released when it
  // is unloaded.
  virtual Result<std::uint64_t> allocate(std::string_view name, std::size_t bytes,
                                         std::size_t alignment, bool managed) = 0;
  // Copies host bytes to an address inside an allocation of this context.
  virtual Status write(std::uint64_t address, std::span<const std::byte> bytes) = 0;
  // The CUdevice ordinal and its compute capability (major * 10 + minor).
  virtual int device() const = 0;
  virtual int computeCapability() const = 0;
};

// The memory a kernel of a context may touch: its own allocations, mapped host
// memory, VMM mappings its device was granted access to, and allocations of peer
// contexts it enabled peer access to. O(log n) in the number of allocations.
class AddressChecker {
 public:
  virtual ~AddressChecker() = default;
  virtual bool isAccessible(std::uint64_t address, std::size_t size) const = 0;
};

// Where device-side printf output goes (the driver writes it to stdout).
class PrintfSink {
 public:
  virtual ~PrintfSink() = default;
  virtual void write(std::string_view text) = 0;
  // A failed device assertion's message: NVIDIA's driver prints it to the
  // process's stderr, and so does this unless a sink says otherwise.
  virtual void writeError(std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
};

struct Dim3 {
  std::uint32_t x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  std::uint32_t dynamicSharedBytes = 0;
  // A cooperative launch (cuLaunchCooperativeKernel, CU_LAUNCH_ATTRIBUTE_COOPERATIVE):
  // every block is resident at once and the grid has a sync workspace, so a
  // grid-wide barrier (cooperative groups' grid.sync()) completes.
  bool cooperative = false;
};

// Half-open byte range [begin, end).
struct ByteRange {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

// The global/constant memory one launch touched, as absolute addresses, sorted and
// coalesced: every byte a load (or an atomic) read, every byte a store (or an
// atomic) wrote. Shared, local and parameter memory are not included.
struct AccessRecord {
  std::vector<ByteRange> reads;
  std::vector<ByteRange> writes;
  bool recorded = false;  // set by a Program that filled the record
};

// A texture or surface object as a kernel sees it (cuTexObjectCreate,
// cuSurfObjectCreate): its texels, their format and the sampler state. Texels
// lie row after row, `pitch` bytes apart, and `slicePitch` bytes between the
// 2D slices of a 3D resource, at `address` in the context's device memory.
struct TextureView {
  enum class Channel : std::uint8_t { kUnsigned, kSigned, kFloat, kHalf };
  enum class Address : std::uint8_t { kWrap, kClamp, kMirror, kBorder };
  std::uint64_t address = 0;
  int dimensions = 1;                              // 1, 2 or 3
  std::uint64_t width = 0, height = 1, depth = 1;  // in texels
  std::uint64_t pitch = 0, slicePitch = 0;         // in bytes
  Channel channel = Channel::kFloat;
  unsigned channelBytes = 4;    // 1, 2 or 4
  unsigned channels = 1;        // 1, 2 or 4
  bool linearResource = false;  // CU_RESOURCE_TYPE_LINEAR: tex1Dfetch only, no sampling
  // Sampler state (textures only).
  std::array<Address, 3> addressMode{Address::kWrap, Address::kWrap, Address::kWrap};
  bool linearFilter = false;
  bool normalizedCoordinates = false;
  bool readAsInteger = false;  // CU_TRSF_READ_AS_INTEGER: no conversion to [0, 1] or [-1, 1]
  std::array<float, 4> borderColor{0, 0, 0, 0};
  std::uint64_t texelBytes() const { return std::uint64_t{channelBytes} * channels; }
};

// The texture and surface objects of a launch's context, by handle.
class TextureTable {
 public:
  virtual ~TextureTable() = default;
  virtual std::optional<TextureView> texture(std::uint64_t handle) const = 0;
  virtual std::optional<TextureView> surface(std::uint64_t handle) const = 0;
};

// Everything a launch may use besides its program and parameters.
struct LaunchContext {
  const AddressChecker* memory = nullptr;  // never null during launch()
  PrintfSink* printf = nullptr;            // never null during launch()
  int device = 0;
  // When set, the Program records what the launch reads and writes into it (also
  // when it faults: the accesses made before the fault) and sets `recorded`. A
  // Program that cannot record leaves it untouched.
  AccessRecord* accesses = nullptr;
  // The texture and surface objects tex/tld4/txq/suld/sust/suq name; null:
  // none exist (every handle is invalid).
  const TextureTable* textures = nullptr;
};

// Faults a kernel can raise; each maps to the CUresult of the same name and, as
// on a GPU, makes the context unusable (every later call returns that error).
enum class KernelFault {
  kIllegalAddress,      // CUDA_ERROR_ILLEGAL_ADDRESS
  kMisalignedAddress,   // CUDA_ERROR_MISALIGNED_ADDRESS
  kIllegalInstruction,  // CUDA_ERROR_ILLEGAL_INSTRUCTION
  kAssert,              // CUDA_ERROR_ASSERT (device-side assert: __assertfail)
  kLaunchFailed,        // CUDA_ERROR_LAUNCH_FAILED (trap, barrier deadlock, anything else)
};

// The Status a Program::launch returns for a fault; the message says what and
// where ("st.global.u32 to 0x7f00 in saxpy, thread (3,0,0) of block (1,0,0)").
// The driver recognises the CUresult name this puts at the start of the message.
inline Status kernelFaultStatus(KernelFault fault, std::string_view message) {
  const char* name = "CUDA_ERROR_LAUNCH_FAILED";
  switch (fault) {
    case KernelFault::kIllegalAddress: name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case KernelFault::kMisalignedAddress: name = "CUDA_ERROR_MISALIGNED_ADDRESS"; break;
    case KernelFault::kIllegalInstruction: name = "CUDA_ERROR_ILLEGAL_INSTRUCTION"; break;
    case KernelFault::kAssert: name = "CUDA_ERROR_ASSERT"; break;
    case KernelFault::kLaunchFailed: break;
  }
  return Status(Code::kFailedPrecondition, fmt::format("{}: {}", name, message));
}

// A loaded module.
class Program {
 public:
  virtual ~Program() = default;
  virtual const std::vector<FunctionInfo>& functions() const = 0;
  virtual const std::vector<GlobalInfo>& globals() const = 0;
  // Runs functions()[function] to completion. `params` holds exactly
  // functions()[function].paramBufferSize bytes laid out as its ParamInfo say.
  // Returns OK, kernelFaultStatus(...) for a fault, or another error (treated as
  // CUDA_ERROR_LAUNCH_FAILED).
  virtual Status launch(std::size_t function, const LaunchConfig& config,
                        std::span<const std::byte> params, const LaunchContext& context) = 0;
};

class ProgramLoader {
 public:
  virtual ~ProgramLoader() = default;
  // `ptx` is the module's PTX text (no terminating NUL). Errors: kInvalidArgument
  // for malformed PTX (CUDA_ERROR_INVALID_PTX), kNotSupported for valid PTX the
  // engine cannot run (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), kResourceExhausted
  // when globals do not fit (CUDA_ERROR_OUT_OF_MEMORY).
  virtual Result<std::unique_ptr<Program>> load(std::string_view ptx, DeviceMemory& memory) = 0;
};

}  // namespace phos::vgpu
