// SPDX-License-Identifier: Apache-2.0
// The executable form of a PTX module: registers as slots, branch targets and
// reconvergence points resolved, operands decoded; what the interpreter runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phos/ptx/ast.h"

namespace phos::vgpu::engine::detail {

inline constexpr int kWarpSize = 32;

// Generic-address windows. Global memory is addressed by the engine's own host
// addresses (user space, below 2^47); the per-CTA shared window and the per-thread
// local window sit above the canonical user range so they can never alias it.
inline constexpr uint64_t kSharedWindow = 0x0001'0000'0000'0000ull;
inline constexpr uint64_t kLocalWindow = 0x0002'0000'0000'0000ull;
inline constexpr uint64_t kFunctionWindow = 0x0003'0000'0000'0000ull;
inline constexpr uint64_t kWindowSize = 0x0000'0001'0000'0000ull;

enum class Special : uint8_t {
  kTid, kNtid, kCtaid, kNctaid, kLaneid, kWarpid, kNwarpid, kSmid, kNsmid, kGridid,
  kClock, kClockHi, kClock64, kGlobaltimer, kGlobaltimerLo, kGlobaltimerHi,
  kLanemaskEq, kLanemaskLe, kLanemaskLt, kLanemaskGe, kLanemaskGt,
  kDynamicSmemSize, kTotalSmemSize, kAggrSmemSize,
  kClusterCtaid, kClusterNctaid, kClusterCtarank, kClusterNctarank, kIsExplicitCluster,
  kClusterid, kNclusterid,
  kReservedSmemBegin, kReservedSmemEnd, kReservedSmemCap, kReservedSmem0, kReservedSmem1,
  kEnvreg,  // %envreg<32>: the register's number in Opnd::imm
};

// Shared memory the system reserves per CTA (cooperative groups keep barrier state
// there, addressed through %reserved_smem_offset_*). It lives at its own shared
// offset so that overrunning the user's shared memory still faults.
inline constexpr uint32_t kReservedSharedBytes = 1024;
inline constexpr uint64_t kReservedSharedOffset = 0x4000'0000ull;

// Where an address operand's base comes from.
enum class AddrBase : uint8_t {
  kRegister,     // [%rd1+off]: the register's value
  kAbsolute,     // [global_var+off], [shared_var+off], [imm]: a constant address
  kKernelParam,  // [kernel_param+off]: offset into the launch parameter buffer
  kFrameParam,   // [func_param+off] / call-sequence .param: offset into the frame's param area
  kLocalVar,     // [__local_depot0+off]: offset from the frame's local base
  kDynShared,    // [extern_shared+off]: offset from the dynamic shared base
};

enum class OpndKind : uint8_t {
  kNone,
  kReg,            // register slot
  kImm,            // immediate bits
  kSpecial,        // special register
  kAddr,           // memory address operand
  kVec,            // {a, b, ...}
  kSink,           // _
  kLocalAddr,      // symbol of a .local variable used as a value: frame local base + imm
  kDynSharedAddr,  // extern .shared symbol used as a value: dynamic shared base + imm
  kFrameParamAddr, // a .func's .param symbol used as a value
};

struct Opnd {
  OpndKind kind = OpndKind::kNone;
  bool negated = false;   // !%p
  Special special = Special::kTid;
  uint8_t component = 0;  // 0..2 for x, y, z
  AddrBase base = AddrBase::kAbsolute;
  uint32_t reg = 0;
  uint64_t imm = 0;       // kImm bits; kAddr: offset (or the absolute address)
  std::vector<Opnd> elems;  // kVec
};

struct Inst {
  ptx::Opcode op = ptx::Opcode::kNone;
  ptx::Modifiers m;
  ptx::Type type = ptx::Type::kNone;   // first type
  ptx::Type type2 = ptx::Type::kNone;  // last type (cvt source, mul.wide operands)
  int32_t guard = -1;                  // predicate slot, -1 when unguarded
  bool guardNegated = false;
  std::vector<Opnd> ops;
  uint32_t target = 0;    // bra: target pc
  uint32_t rpc = 0;       // bra: reconvergence pc (immediate post-dominator)
  int32_t callee = -1;    // call: function index
  // kPhosCheck: a call to PhOS's range check (phos/instrument/check_function.h),
  // run natively with the effects of its body.
  enum class Builtin : uint8_t { kNone, kVprintf, kAssertFail, kMalloc, kFree, kPhosCheck } builtin =
      Builtin::kNone;
  const ptx::Instruction* source = nullptr;  // for fault messages
  bool ignoreSrc = false;  // cp.async: the fourth operand is ignore-src (a predicate), not src-size
  // A cvt or cp form the interpreter cannot execute: executing it faults,
  // naming the form (the module still loads: its other code may run).
  bool unsupported = false;
};

// An instruction's opcode and modifiers as written ("cvt.rn.satfinite.e2m1x2.f32").
inline std::string spelledForm(const ptx::Instruction& in) {
  std::string text(ptx::name(in.opcode));
  for (const ptx::Mod& mod : in.mods) text += "." + ptx::modName(mod);
  return text;
}

struct Function {
  std::string name;
  bool isEntry = false;
  bool hasBody = true;
  std::vector<Inst> code;
  uint32_t regCount = 0;
  uint32_t localBytes = 0;   // this frame's .local depot (16-aligned)
  uint32_t paramBytes = 0;   // per-thread .param area: formals, returns, call sequences
  std::vector<uint32_t> formalOffsets;  // frame param offsets of the formal params
  std::vector<uint32_t> formalSizes;
  std::vector<uint32_t> returnOffsets;  // frame param offsets of the return params
  std::vector<uint32_t> returnSizes;
  uint32_t scopedSharedBytes = 0;  // .shared declared inside this kernel
};

struct ExecModule {
  std::vector<Function> functions;
  uint32_t moduleSharedBytes = 0;  // module-scope and .func-scope .shared
  std::shared_ptr<const ptx::Module> module;  // keeps Inst::source alive
};

}  // namespace phos::vgpu::engine::detail
